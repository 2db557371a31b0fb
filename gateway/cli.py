"""x402-gateway: sell Solana RPC, DAS and asset data per request over x402.

Configuration problems are printed as one message without a traceback, and never a secret.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Sequence

from gateway.config import ConfigError, Settings, read_settings, startup_notes
from gateway.redact import redact_url
from gateway.routes import (
    RateLimitSpec,
    RoutePlan,
    RoutesError,
    RouteSpec,
    load_routes,
    named_limits,
    route_plan,
)


def _load(env: dict[str, str]) -> tuple[Settings, list[RouteSpec], list[str]]:
    """Settings, the routes to serve and the start-up notes; :class:`ConfigError` lists every
    problem of the environment and every required variable a served route group lacks."""
    settings, problems = read_settings(env)
    plan = RoutePlan(mounted=[], warnings=[], problems=[])
    if settings.routes_file.is_file():
        try:
            plan = route_plan(load_routes(settings.routes_file, named_limits(settings)), settings)
        except RoutesError as exc:  # reported with the environment's problems, all at once
            problems = [*problems, *exc.problems]
    if problems or plan.problems:
        raise ConfigError([*problems, *plan.problems])
    return settings, plan.mounted, [*startup_notes(settings), *plan.warnings]


def _store_kind(settings: Settings) -> str:
    url = settings.store_url.reveal()
    if not url or url.startswith("memory://"):
        return "memory (one process only)"
    return f"{url.split(':', 1)[0]} at {redact_url(url)}"


def report(settings: Settings, notes: Sequence[str]) -> str:
    """The configuration report of ``check`` (and start-up), secrets redacted."""
    fac = settings.facilitator_url
    lines = [
        f"base URL:     {settings.base_url}",
        f"store:        {_store_kind(settings)}",
        f"facilitator:  {fac if fac == 'internal' else redact_url(fac)}",
        f"payTo:        {settings.pay_to or '(unset)'}",
        f"USDC mint:    {settings.usdc_mint}",
        "upstreams:    "
        + (
            ", ".join(f"{n}={redact_url(u.reveal())}" for n, u in sorted(settings.upstreams.items()))
            or "(none)"
        ),
    ]
    lines += [f"note:         {n}" for n in notes]
    return "\n".join(lines)


def route_table(routes: Sequence[RouteSpec]) -> str:
    """One line per route; LIMITS lists every rate limit in full (count per period)."""
    rows = [("METHOD", "ACCESS", "PRICE(uUSDC)", "LIMITS", "PATH")]
    for r in routes:
        limits = ",".join(_limit_text(x) for x in r.rate_limits) or "-"
        price = str(r.price_micro_usdc) if r.price_micro_usdc is not None else "-"
        rows.append((r.method, r.access, price, limits, r.path))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return "\n".join(
        f"{m:<{widths[0]}}  {a:<{widths[1]}}  {p:>{widths[2]}}  {lim:<{widths[3]}}  {path}"
        for m, a, p, lim, path in rows
    )


def _limit_text(spec: RateLimitSpec) -> str:
    period = f"{spec.period_ms // 1000}s" if spec.period_ms % 1000 == 0 else f"{spec.period_ms}ms"
    return f"{spec.scope}{'/wallet' if spec.per == 'wallet' else ''}={spec.limit}/{period}"


def cmd_check(args: argparse.Namespace) -> int:
    try:
        settings, mounted, notes = _load(dict(os.environ))
    except (ConfigError, RoutesError) as exc:
        print(exc, file=sys.stderr)
        return 1
    print(report(settings, notes))
    print()
    print(route_table(mounted))
    return 0


def cmd_routes(args: argparse.Namespace) -> int:
    """The whole table as routes.yaml expands it; needs no environment (named limits at their
    defaults unless set)."""
    settings, problems = read_settings(dict(os.environ))
    file_problems = [p for p in problems if p.startswith("ROUTES_FILE")]
    if file_problems:
        print(ConfigError(file_problems), file=sys.stderr)
        return 1
    try:
        routes = load_routes(settings.routes_file, named_limits(settings))
    except RoutesError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(route_table(routes))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    env = dict(os.environ)
    if args.port is not None:
        env["PORT"] = os.environ["PORT"] = str(args.port)
    try:
        settings, _, _ = _load(env)
    except (ConfigError, RoutesError) as exc:
        print(exc, file=sys.stderr)
        return 1
    store = settings.store_url.reveal()
    if args.workers > 1 and (not store or store.startswith("memory://")):
        print(
            "refusing --workers > 1 on the in-memory store: replay protection and rate limits would not "
            "hold across processes; set STATE_STORE_REST_URL to Redis or Upstash",
            file=sys.stderr,
        )
        return 1
    if args.workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="x402-gateway-metrics-")
    from hypercorn.config import Config
    from hypercorn.run import run

    config = Config()
    config.application_path = "gateway.entry:app_from_env()"
    config.bind = [f"{args.host}:{settings.port}"]
    config.workers = args.workers
    config.graceful_timeout = args.graceful_timeout
    config.accesslog = None
    config.errorlog = "-"
    config.keep_alive_timeout = 75
    return int(run(config))


def cmd_sandbox(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.sandbox import run_sandbox

    port = args.port if args.port is not None else int(os.environ.get("PORT") or 8080)
    try:
        return asyncio.run(run_sandbox(port, host=args.host))
    except KeyboardInterrupt:
        return 0
    except (ConfigError, RoutesError, OSError, TimeoutError) as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return 1


def cmd_pay(args: argparse.Namespace) -> int:
    import asyncio

    from gateway.payclient import run_pay

    return asyncio.run(
        run_pay(args.method, args.url, keypair_file=args.keypair, data=args.data, rpc_url=args.rpc)
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="x402-gateway",
        description=__doc__,
        epilog="Configuration comes from environment variables (see the README); "
        "`x402-gateway check` shows what is set.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    serve = sub.add_parser(
        "serve",
        help="run the gateway under hypercorn",
        description="Run the gateway under hypercorn. Start-up stops, listing every problem, when "
        "a variable is malformed or a served route group (ROUTE_GROUPS) lacks a required one.",
    )
    serve.add_argument("--host", default="0.0.0.0", help="address to listen on (default: %(default)s)")
    serve.add_argument("--port", type=int, default=None, help="TCP port (default: $PORT or 8080)")
    serve.add_argument(
        "--workers",
        type=int,
        default=1,
        help="worker processes; more than 1 needs a shared STATE_STORE_REST_URL (default: %(default)s)",
    )
    serve.add_argument(
        "--graceful-timeout",
        type=float,
        default=20.0,
        metavar="SECONDS",
        help="seconds in-flight requests get to finish on SIGTERM (default: %(default)s)",
    )
    serve.set_defaults(func=cmd_serve)
    check = sub.add_parser(
        "check",
        help="validate the configuration and print the served route table",
        description="Print the configuration report (secrets redacted) and the routes serve would "
        "mount; exit 1 listing every problem, as serve would.",
    )
    check.set_defaults(func=cmd_check)
    routes = sub.add_parser(
        "routes",
        help="print the whole expanded routes.yaml table (no environment needed)",
        description="Print every route of ROUTES_FILE (default: the packaged routes.yaml) with its "
        "access mode, price in micro-USDC and rate limits (count per period).",
    )
    routes.set_defaults(func=cmd_routes)
    sandbox = sub.add_parser("sandbox", help="run the gateway offline: local chain, sample upstreams")
    sandbox.add_argument("--host", default="127.0.0.1")
    sandbox.add_argument("--port", type=int, default=None, help="default: $PORT or 8080")
    sandbox.set_defaults(func=cmd_sandbox)
    pay = sub.add_parser("pay", help="call a URL, answering x402 challenges (exact Solana, SIWX)")
    pay.add_argument("method", help="HTTP method, e.g. GET or POST")
    pay.add_argument("url")
    pay.add_argument("--data", default=None, help="JSON request body")
    pay.add_argument("--keypair", required=True, help="solana-keygen JSON file (or base58 64-byte key)")
    pay.add_argument("--rpc", default=None, help="Solana RPC URL (default: $SOLANA_RPC_URL or mainnet)")
    pay.set_defaults(func=cmd_pay)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
