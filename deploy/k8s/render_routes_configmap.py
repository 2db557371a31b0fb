"""Write deploy/k8s/routes-configmap.yaml from the repository's routes.yaml (the one source).

    python deploy/k8s/render_routes_configmap.py          # rewrite the ConfigMap
    python deploy/k8s/render_routes_configmap.py --check  # exit 1 if it is stale

tests/test_deploy.py fails while the ConfigMap differs from routes.yaml.
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROUTES = HERE.parent.parent / "routes.yaml"
TARGET = HERE / "routes-configmap.yaml"

HEADER = """\
# GENERATED from routes.yaml by deploy/k8s/render_routes_configmap.py: do not edit by hand.
# The gateway reads ROUTES_FILE once at start-up: after a change, re-render, apply and
#   kubectl rollout restart deployment/x402-gateway
apiVersion: v1
kind: ConfigMap
metadata:
  name: x402-gateway-routes
  labels:
    app.kubernetes.io/name: x402-gateway
    app.kubernetes.io/component: gateway
data:
  routes.yaml: """


def render(routes_text: str) -> str:
    """The ConfigMap manifest whose ``data["routes.yaml"]`` is exactly ``routes_text``."""
    if not routes_text or routes_text[0] in " \t\n":
        raise ValueError("routes.yaml must start with a non-blank line to embed as a literal block")
    stripped = routes_text.rstrip("\n")
    trailing = len(routes_text) - len(stripped)
    chomp = {0: "|-", 1: "|"}.get(trailing, "|+")
    lines = ["    " + line if line.strip() else line for line in stripped.split("\n")]
    manifest = HEADER + chomp + "\n" + "\n".join(lines) + "\n" + "\n" * max(trailing - 1, 0)
    if yaml.safe_load(manifest)["data"]["routes.yaml"] != routes_text:
        raise ValueError("routes.yaml does not round-trip through a YAML literal block")
    return manifest


def main(argv: list[str]) -> int:
    manifest = render(ROUTES.read_text(encoding="utf-8"))
    if "--check" in argv:
        current = TARGET.read_text(encoding="utf-8") if TARGET.exists() else ""
        if current != manifest:
            print(f"{TARGET} is stale: run python {Path(__file__).as_posix()}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(manifest, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
