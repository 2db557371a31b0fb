"""Serve an ASGI app exactly as ``x402-gateway serve`` serves the gateway (gateway/cli.py).

``python -m bench.serve MODULE:FACTORY() --port PORT [--workers 1]``: the same hypercorn
``Config`` fields (worker class, workers, keep-alive, graceful timeout, no access log), so a
baseline differs from the gateway only in the application.
"""

from __future__ import annotations

import argparse
import sys

from hypercorn.config import Config
from hypercorn.run import run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("app", help="application path, e.g. bench.apps:ceiling_app()")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    config = Config()
    config.application_path = args.app
    config.bind = [f"{args.host}:{args.port}"]
    config.workers = args.workers
    config.graceful_timeout = 20.0
    config.accesslog = None
    config.errorlog = "-"
    config.keep_alive_timeout = 75
    return int(run(config))


if __name__ == "__main__":
    sys.exit(main())
