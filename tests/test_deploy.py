"""deploy/ agrees with the code: every file parses, the Kubernetes manifests pass the API schemas,
every variable is one the gateway reads, every secret comes from a secret store, every metric
exists, and the routes ConfigMap is the repository's routes.yaml."""

from __future__ import annotations

import copy
import fnmatch
import functools
import importlib.resources
import importlib.util
import ipaddress
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import base58
import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from solders.keypair import Keypair

from gateway.config import (
    GATEWAY_VARIABLES,
    PACKAGED_ROUTES_FILE,
    ConfigError,
    Settings,
    load_settings,
    upstream_variables,
)
from gateway.ledger import metrics as ledger_metrics
from gateway.methods.credit import metrics as credit_metrics
from gateway.outbound import metrics as upstream_metrics
from gateway.routing.routes import named_limits, parse_routes
from gateway.telemetry import metrics, readiness
from tests.support.gateway_process import serve
from tests.support.gateway_server import SERVICE_ONLY_ENV
from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
ROUTES_YAML = ROOT / "routes.yaml"
ENV_VARS = (*GATEWAY_VARIABLES, *dict.fromkeys(upstream_variables(PACKAGED_ROUTES_FILE).values()))
"""Every variable the gateway reads with the packaged route table: the README's Configuration
table, and what the deploy/ manifests are held to."""

# The oldest Kubernetes we support (autoscaling/v2 and policy/v1 are GA well before it) and the
# newest the installed kubernetes-validate knows.
K8S_VERSIONS = sorted({"1.30.0", kubernetes_validate.latest_version()})

# Variables that hold a key: never a literal, never a ConfigMap.
SECRET_VARS = frozenset(
    {
        *(var for var in upstream_variables(ROUTES_YAML).values() if var.startswith("PROVIDER_")),
        "ASSET_API_KEY",
        "FACILITATOR_API_KEY_SECRET",
        "INTERNAL_SETTLEMENT_SECRET",
        "FACILITATOR_WALLET_BASE58",
        "STATE_STORE_REST_TOKEN",
        "SIWX_SECRET",
    }
)
# URLs that may carry a password or an API key (Settings keeps them as Secret): a Kubernetes
# Secret too; in compose, any credential in them is interpolated.
CREDENTIAL_URL_VARS = frozenset(
    {"STATE_STORE_REST_URL", "LEDGER_DATABASE_URL", "SOLANA_MAINNET_RPC_URL", "SOLANA_DEVNET_RPC_URL"}
)
SECRET_STORE_VARS = SECRET_VARS | CREDENTIAL_URL_VARS
# The passwords of compose's own Redis and PostgreSQL (deploy/.env).
COMPOSE_PASSWORDS = frozenset({"REDIS_PASSWORD", "POSTGRES_PASSWORD"})

# The named rate limits routes.yaml refers to, at their defaults.
LIMITS = named_limits(Settings(base_url="https://gateway.example.com"))

# Values that satisfy load_settings for the variables a deployment must supply itself.
DUMMY_SECRETS = {"STATE_STORE_REST_URL": "redis://redis:6379/0", "SIWX_SECRET": "s" * 32}
BASE_ENV = {
    "GATEWAY_BASE_URL": "https://gateway.example.com",
    "ROUTES_FILE": str(ROUTES_YAML),
    **DUMMY_SECRETS,
}

TEXT_SUFFIXES = (".yaml", ".yml", ".json", ".conf", ".example", "Dockerfile", ".md")


def _deploy_files(*suffixes: str) -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.is_file() and p.name.endswith(suffixes))


def _yaml_docs(path: Path) -> list[Any]:
    """The documents of ``path``, each call its own copy: the parse of a text is kept, as the
    manifests are read again by nearly every test (the routes ConfigMap holds all of routes.yaml)."""
    return copy.deepcopy(_parsed_yaml(path.read_text(encoding="utf-8")))


@functools.cache
def _parsed_yaml(text: str) -> list[Any]:
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def _k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    return [
        (path.name, doc)
        for path in sorted(K8S.glob("*.yaml"))
        for doc in _yaml_docs(path)
        if doc.get("kind") != "Kustomization"
    ]


def _k8s(kind: str, name: str | None = None) -> dict[str, Any]:
    found = [doc for _, doc in _k8s_docs() if doc["kind"] == kind and name in (None, doc["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _container() -> dict[str, Any]:
    containers = _k8s("Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    container: dict[str, Any] = containers[0]
    return container


def _compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text(encoding="utf-8"))
    return doc


def _env_example() -> dict[str, str]:
    pairs = {}
    for line in (DEPLOY / ".env.example").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f".env.example: {line!r} is not KEY=value"
            pairs[key.strip()] = value.strip()
    return pairs


COMPOSE_FILLED = {"REDIS_PASSWORD": "p" * 32, "POSTGRES_PASSWORD": "q" * 32, "SIWX_SECRET": "s" * 32}
"""What an operator must fill in of .env.example before compose starts."""


def _check_settings(env: Mapping[str, str]) -> Settings:
    try:
        return load_settings(env)
    except ConfigError as exc:
        pytest.fail(str(exc))


# --- compose interpolation (${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?message}, $$) ------
# A default may itself interpolate (${LEDGER_DATABASE_URL:-postgresql://...${POSTGRES_PASSWORD:?...}...}).

_INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")
"""One flat ``${...}`` expression (no nested default)."""
_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATORS = (":-", ":?", "-", "?")


def _interpolate(value: str, env: Mapping[str, str], *, lenient: bool = False) -> str:
    """``value`` as compose interpolates it from ``env``; ``lenient``: an unset required
    variable reads as empty instead of stopping (to see what a value holds literally)."""
    out, i = [], 0
    while i < len(value):
        if value.startswith("$$", i):
            out.append("$")
            i += 2
        elif value.startswith("${", i):
            end = _closing_brace(value, i + 2)
            out.append(_substitute(value[i + 2 : end], env, lenient))
            i = end + 1
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


def _closing_brace(value: str, start: int) -> int:
    depth = 0
    for j in range(start, len(value)):
        if value.startswith("${", j):
            depth += 1
        elif value[j] == "}":
            if depth == 0:
                return j
            depth -= 1
    raise ValueError(f"unclosed ${{ in {value!r}")


def _substitute(expression: str, env: Mapping[str, str], lenient: bool) -> str:
    name = _VARIABLE.match(expression)
    assert name, f"not a variable: ${{{expression}}}"
    rest = expression[name.end() :]
    op = next((o for o in _OPERATORS if rest.startswith(o)), None)
    assert op or not rest, f"unknown interpolation: ${{{expression}}}"
    arg = rest[len(op or "") :]
    current = env.get(name[0])
    unset = current is None or (op is not None and op.startswith(":") and current == "")
    if op in (":-", "-"):
        return _interpolate(arg, env, lenient=lenient) if unset else str(current)
    if op in (":?", "?") and unset:
        if lenient:
            return ""
        raise KeyError(f"{name[0]} is required: {arg}")
    return current or ""


def _interpolated_names(text: str) -> set[str]:
    """Every variable ``text`` interpolates, nested defaults included."""
    return set(re.findall(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)", text))


def _interpolated_defaults(value: str) -> str:
    return _interpolate(value, {})


# --- every file parses ----------------------------------------------------------------------


@pytest.mark.parametrize("path", _deploy_files(".yaml", ".yml"), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_yaml_file_in_deploy_parses(path: Path) -> None:
    assert _yaml_docs(path), f"{path} is empty"


@pytest.mark.parametrize("path", _deploy_files(".json"), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_every_json_file_in_deploy_parses(path: Path) -> None:
    assert json.loads(path.read_text(encoding="utf-8"))


def test_env_example_is_key_value_lines_with_no_secret_filled_in() -> None:
    example = _env_example()
    assert {"REDIS_PASSWORD", "POSTGRES_PASSWORD", "SIWX_SECRET", "LEDGER_DATABASE_URL"} <= set(example)
    filled = {key for key in example.keys() & (SECRET_STORE_VARS | COMPOSE_PASSWORDS) if example[key]}
    assert not filled, f".env.example must leave secrets empty: {sorted(filled)}"


# --- the variables the gateway knows --------------------------------------------------------


class _RecordingEnv(dict[str, str]):
    def __init__(self) -> None:
        super().__init__()
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)


def test_env_vars_names_exactly_the_variables_load_settings_reads() -> None:
    env = _RecordingEnv()
    with pytest.raises(ConfigError):  # GATEWAY_BASE_URL is missing; everything is read first
        load_settings(env)
    assert env.read == set(ENV_VARS)
    assert len(ENV_VARS) == len(set(ENV_VARS))


def test_readme_configuration_table_documents_exactly_env_vars() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    documented = {
        name
        for line in table.splitlines()
        if line.startswith("| `")
        for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1])
    }
    assert documented == set(ENV_VARS)


def test_secret_variables_are_gateway_variables() -> None:
    assert set(ENV_VARS) >= SECRET_STORE_VARS


# --- Kubernetes -----------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize(
    ("name", "doc"), _k8s_docs(), ids=lambda v: v if isinstance(v, str) else v.get("kind", "?")
)
def test_kubernetes_manifest_passes_the_api_schema(name: str, doc: dict[str, Any], version: str) -> None:
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{name} ({doc['kind']}) at {'.'.join(map(str, exc.path))}: {exc.message}")


def test_kustomization_applies_every_manifest_except_the_secret_template() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text(encoding="utf-8"))
    manifests = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", "secret.example.yaml"}
    assert sorted(kustomization["resources"]) == sorted(manifests)


def test_deployment_runs_two_replicas_with_probes_resources_and_a_locked_down_container() -> None:
    deployment = _k8s("Deployment")
    pod = deployment["spec"]["template"]
    container = _container()
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    port_names = {p["name"]: p["containerPort"] for p in container["ports"]}
    # Liveness asks only the process; readiness also the store and the facilitator.
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        get = container[probe]["httpGet"]
        assert get["path"] == path, probe
        assert get["port"] in port_names or get["port"] in port_names.values()
    # The readiness checks give up before the probe does.
    assert container["readinessProbe"]["timeoutSeconds"] > readiness.CHECK_TIMEOUT_S
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(container["resources"][kind])
    pod_security = pod["spec"]["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] != 0
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    # The read-only root needs a writable /tmp for prometheus-client's multiprocess directory.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port_names["http"]
    assert annotations["prometheus.io/path"] == "/metrics"


def test_probes_and_scrape_path_are_routes_of_the_route_table() -> None:
    paths = {route.handler: route.path for route in parse_routes(_routes_doc(), LIMITS)}
    assert paths["health"] == _container()["livenessProbe"]["httpGet"]["path"]
    assert paths["ready"] == _container()["readinessProbe"]["httpGet"]["path"]
    assert (
        paths["metrics"]
        == _k8s("Deployment")["spec"]["template"]["metadata"]["annotations"]["prometheus.io/path"]
    )


def test_service_hpa_and_pdb_target_the_deployments_pods() -> None:
    deployment = _k8s("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    service = _k8s("Service", "x402-gateway")
    assert service["spec"]["selector"].items() <= labels.items()
    port_names = {p["name"] for p in _container()["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    hpa = _k8s("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
    pdb = _k8s("PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < hpa["spec"]["minReplicas"]


def test_deployment_sets_only_gateway_variables_and_every_secret_from_the_secret() -> None:
    container = _container()
    secret_name = _k8s("Secret", "x402-gateway")["metadata"]["name"]
    config_name = _k8s("ConfigMap", "x402-gateway-config")["metadata"]["name"]
    assert container["envFrom"] == [{"configMapRef": {"name": config_name}}]
    from_secret = {}
    for entry in container["env"]:
        name = entry["name"]
        assert name in ENV_VARS, f"{name} is not a variable the gateway reads"
        if name in SECRET_STORE_VARS:
            assert "value" not in entry, f"{name} is a secret: use secretKeyRef, not a literal"
            ref = entry["valueFrom"]["secretKeyRef"]
            assert ref["name"] == secret_name
            from_secret[name] = ref
        else:
            assert "value" in entry or "configMapKeyRef" in entry.get("valueFrom", {})
    assert set(from_secret) == SECRET_STORE_VARS
    assert all(ref["key"] == name for name, ref in from_secret.items())
    # Replicas cannot run without a shared store and one sign-in secret.
    assert from_secret["STATE_STORE_REST_URL"].get("optional") is False
    assert from_secret["SIWX_SECRET"].get("optional") is False
    # The shipped deployment runs with a ledger (an empty value in the Secret runs without one).
    assert from_secret["LEDGER_DATABASE_URL"].get("optional") is False


def test_configmap_holds_only_non_secret_gateway_variables_that_load() -> None:
    data = _k8s("ConfigMap", "x402-gateway-config")["data"]
    assert set(data) <= set(ENV_VARS), f"unknown variables: {sorted(set(data) - set(ENV_VARS))}"
    assert not set(data) & SECRET_STORE_VARS, "a secret variable sits in the ConfigMap"
    _check_settings({**data, **DUMMY_SECRETS, "ROUTES_FILE": str(ROUTES_YAML)})


def test_secret_template_lists_the_referenced_keys_without_values() -> None:
    secret = _k8s("Secret", "x402-gateway")
    values = {**secret.get("data", {}), **secret.get("stringData", {})}
    assert set(values) == SECRET_STORE_VARS
    assert all(value == "" for value in values.values()), "the Secret template must hold no value"


def _routes_doc() -> Any:
    return yaml.safe_load(ROUTES_YAML.read_text(encoding="utf-8"))


def _render_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "render_routes_configmap", K8S / "render_routes_configmap.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_routes_configmap_is_generated_from_the_repositorys_routes_yaml() -> None:
    routes_text = ROUTES_YAML.read_text(encoding="utf-8")
    manifest = (K8S / "routes-configmap.yaml").read_text(encoding="utf-8")
    assert manifest == _render_module().render(routes_text), (
        "deploy/k8s/routes-configmap.yaml is stale: run python deploy/k8s/render_routes_configmap.py"
    )
    embedded = _k8s("ConfigMap", "x402-gateway-routes")["data"]["routes.yaml"]
    assert embedded == routes_text
    assert parse_routes(yaml.safe_load(embedded), LIMITS) == parse_routes(_routes_doc(), LIMITS)


def test_routes_file_points_at_the_mounted_routes_configmap() -> None:
    container = _container()
    routes_file = next(e["value"] for e in container["env"] if e["name"] == "ROUTES_FILE")
    volumes = {v["name"]: v for v in _k8s("Deployment")["spec"]["template"]["spec"]["volumes"]}
    for mount in container["volumeMounts"]:
        configmap = volumes[mount["name"]].get("configMap")
        if configmap and configmap["name"] == "x402-gateway-routes":
            items = {item["path"]: item["key"] for item in configmap["items"]}
            relative = routes_file.removeprefix(mount["mountPath"].rstrip("/") + "/")
            assert items.get(relative) == "routes.yaml"
            assert mount.get("readOnly") is True
            assert "subPath" not in mount
            return
    pytest.fail("the routes ConfigMap is not mounted")


def _redis_flags(argv: list[str]) -> dict[str, str]:
    """The ``--name value`` options of a redis-server command line."""
    return {argv[i][2:]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}


STORE_KEEPS_EVERY_WRITE = {"appendonly": "yes", "appendfsync": "everysec", "maxmemory-policy": "noeviction"}
"""Customers' prepaid credit lives in the store: every write is appended to a file synced each
second, and no key is ever evicted to make room."""


def test_kubernetes_redis_keeps_every_write_on_a_persistent_volume() -> None:
    redis = _k8s("StatefulSet", "x402-gateway-redis")
    pod = redis["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    args = container["args"]
    assert args[0] == "redis-server"
    flags = _redis_flags(args)
    assert STORE_KEEPS_EVERY_WRITE.items() <= flags.items()
    assert redis["spec"]["replicas"] == 1  # one writer
    # The data directory is a volume claimed from a template: it outlives the pod.
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    claims = {t["metadata"]["name"]: t for t in redis["spec"]["volumeClaimTemplates"]}
    assert mounts[flags["dir"]] in claims
    assert claims[mounts[flags["dir"]]]["spec"]["resources"]["requests"]["storage"]
    assert not {v["name"] for v in pod["spec"].get("volumes", [])} & set(claims)
    # The password comes from its own Secret, whose template holds no value.
    env = {e["name"]: e for e in container["env"]}
    assert "value" not in env["REDISCLI_AUTH"]
    ref = env["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"]
    assert args[args.index("--requirepass") + 1] == "$(REDISCLI_AUTH)"
    assert _k8s("Secret", ref["name"])["stringData"] == {ref["key"]: ""}
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_kubernetes_redis_is_reached_by_its_service_and_only_by_the_gateway() -> None:
    redis = _k8s("StatefulSet", "x402-gateway-redis")
    labels = redis["spec"]["template"]["metadata"]["labels"]
    assert redis["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = _k8s("Service", redis["spec"]["serviceName"])
    assert service["spec"]["selector"].items() <= labels.items()
    (container,) = redis["spec"]["template"]["spec"]["containers"]
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= {p["name"] for p in container["ports"]}
    gateway_labels = _k8s("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= gateway_labels.items()
    policy = _k8s("NetworkPolicy", "x402-gateway-redis")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"].items() <= gateway_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]


# --- the ledger of record: PostgreSQL beside Redis -------------------------------------------


def _postgres_env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container["env"]}


def test_kubernetes_postgres_keeps_the_ledger_on_a_persistent_volume() -> None:
    postgres = _k8s("StatefulSet", "x402-gateway-postgres")
    pod = postgres["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert re.fullmatch(r"postgres:\d+-alpine", container["image"])  # official, one major
    assert postgres["spec"]["replicas"] == 1  # one server: a second volume is a second ledger
    env = _postgres_env(container)
    # The data directory sits inside a volume claimed from a template: it outlives the pod.
    pgdata = env["PGDATA"]["value"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    claims = {t["metadata"]["name"]: t for t in postgres["spec"]["volumeClaimTemplates"]}
    [(data_mount, claim)] = [(path, name) for path, name in mounts.items() if name in claims]
    assert pgdata.startswith(data_mount.rstrip("/") + "/"), "initdb refuses the volume's root (lost+found)"
    assert claims[claim]["spec"]["resources"]["requests"]["storage"]
    assert not {v["name"] for v in pod["spec"].get("volumes", [])} & set(claims)
    # The read-only root leaves it only volumes to write: every other mount is an emptyDir.
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert {"/var/run/postgresql", "/tmp"} <= set(mounts)
    assert all("emptyDir" in volumes[name] for path, name in mounts.items() if name != claim)
    # The password comes from its own Secret, whose template holds no value.
    assert "value" not in env["POSTGRES_PASSWORD"]
    ref = env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"]
    assert ref["optional"] is False
    assert _k8s("Secret", ref["name"])["stringData"] == {ref["key"]: ""}
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    # Ready only once it accepts connections over TCP (the first-start init listens on its socket).
    for probe in ("readinessProbe", "livenessProbe"):
        command = " ".join(container[probe]["exec"]["command"])
        assert "pg_isready" in command and "-h 127.0.0.1" in command, probe


def test_kubernetes_postgres_is_reached_by_its_service_and_only_by_the_gateway() -> None:
    postgres = _k8s("StatefulSet", "x402-gateway-postgres")
    labels = postgres["spec"]["template"]["metadata"]["labels"]
    assert postgres["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = _k8s("Service", postgres["spec"]["serviceName"])
    assert service["spec"]["selector"].items() <= labels.items()
    (container,) = postgres["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    gateway_labels = _k8s("Deployment")["spec"]["template"]["metadata"]["labels"]
    assert not service["spec"]["selector"].items() <= gateway_labels.items()
    assert not _k8s("Service", "x402-gateway")["spec"]["selector"].items() <= labels.items()
    policy = _k8s("NetworkPolicy", "x402-gateway-postgres")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= labels.items()
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"].items() <= gateway_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    # The URL the comments tell the operator to put in the gateway's Secret names this Service,
    # its port, user and database (the password a placeholder).
    env = {e["name"]: e.get("value") for e in container["env"]}
    (port,) = service["spec"]["ports"]
    host = f"{service['metadata']['name']}:{port['port']}"
    url = f"postgresql://{env['POSTGRES_USER']}:<>@{host}/{env['POSTGRES_DB']}"
    for path in (K8S / "secret.example.yaml", K8S / "postgres.yaml"):
        assert url in re.sub(r"<[^>]*>", "<>", path.read_text(encoding="utf-8")), path


def test_the_gateway_waits_for_the_ledger_named_by_its_secret() -> None:
    """A gateway with a ledger does not start without it: its pod waits for PostgreSQL to accept
    connections, on the URL of the same Secret key the gateway reads, and skips the wait when
    that key is empty (no ledger)."""
    pod = _k8s("Deployment")["spec"]["template"]["spec"]
    gateway_ref = next(e for e in _container()["env"] if e["name"] == "LEDGER_DATABASE_URL")["valueFrom"]
    (init,) = pod["initContainers"]
    (postgres,) = _k8s("StatefulSet", "x402-gateway-postgres")["spec"]["template"]["spec"]["containers"]
    assert init["image"] == postgres["image"]  # its pg_isready, one image to pull
    (entry,) = init["env"]
    assert entry == {"name": "LEDGER_DATABASE_URL", "valueFrom": gateway_ref}
    script = init["command"][-1]
    assert init["command"][:2] == ["sh", "-c"]
    assert 'pg_isready -q -t 3 -d "$LEDGER_DATABASE_URL"' in script  # -q: the URL is never printed
    assert script.startswith('if [ -n "$LEDGER_DATABASE_URL" ]; then until ')
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    assert init["securityContext"]["capabilities"]["drop"] == ["ALL"]
    for kind in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(init["resources"][kind])


@pytest.mark.skipif(shutil.which("sh") is None, reason="no POSIX shell")
def test_the_gateways_wait_for_the_ledger_runs_in_a_shell_until_postgres_answers(tmp_path: Path) -> None:
    """The init container's script, run by sh with a stand-in pg_isready that fails twice: it
    keeps asking, and returns once the server answers; with no ledger it asks nothing."""
    (init,) = _k8s("Deployment")["spec"]["template"]["spec"]["initContainers"]
    calls = tmp_path / "calls"
    fake = tmp_path / "pg_isready"
    fake.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n[ "$(wc -l < {calls})" -ge 3 ]\n', encoding="utf-8")
    fake.chmod(0o755)
    script = init["command"][-1].replace("sleep 2", "sleep 0")
    env = {"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    url = "postgresql://ledger:pw@x402-gateway-postgres:5432/ledger"
    for ledger, asked in ((url, [f"-q -t 3 -d {url}"] * 3), ("", [])):
        calls.write_text("", encoding="utf-8")
        run = {**env, "LEDGER_DATABASE_URL": ledger}
        done = subprocess.run(["sh", "-c", script], env=run, timeout=30, check=False)
        assert done.returncode == 0
        assert calls.read_text(encoding="utf-8").splitlines() == asked


# --- compose --------------------------------------------------------------------------------


def test_compose_file_matches_the_compose_specification() -> None:
    pytest.importorskip("check_jsonschema")
    vendored = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads(vendored.joinpath("compose-spec.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    errors = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(_compose())]
    assert not errors, "\n".join(errors)


def _gateway_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose["services"].items()
        if service.get("build", {}).get("dockerfile") == "deploy/Dockerfile"
        or service.get("image") == compose["services"]["gateway"]["image"]
    }


def test_compose_runs_redis_two_gateway_replicas_and_a_proxy_with_healthchecks() -> None:
    compose = _compose()
    services = compose["services"]
    assert {"redis", "gateway", "proxy"} <= set(services)
    gateways = _gateway_services(compose)
    assert sum(s.get("deploy", {}).get("replicas", 1) for s in gateways.values()) >= 2
    for name, service in services.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"
    for name, service in gateways.items():
        assert "/readyz" in " ".join(service["healthcheck"]["test"])  # readiness, shown by `ps`
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        assert "ports" not in service, f"{name} must be reached through the proxy only"
        assert "container_name" not in service
    # The proxy never waits on readiness: a facilitator briefly away must not keep it down.
    assert services["proxy"]["depends_on"]["gateway"]["condition"] == "service_started"
    build = services["gateway"]["build"]
    assert (DEPLOY / build["context"] / build["dockerfile"]).is_file()


def test_compose_postgres_keeps_the_ledger_on_a_named_volume_behind_a_healthcheck() -> None:
    compose = _compose()
    postgres = compose["services"]["postgres"]
    assert re.fullmatch(r"postgres:\d+-alpine", postgres["image"])
    environment = postgres["environment"]
    assert re.fullmatch(r"\$\{POSTGRES_PASSWORD:\?[^}]+\}", environment["POSTGRES_PASSWORD"])
    # The image's data directory (PGDATA) is a named volume, not the container's layer.
    mounts = {v.split(":")[1]: v.split(":")[0] for v in postgres["volumes"]}
    assert mounts["/var/lib/postgresql/data"] in compose["volumes"]
    # Healthy once it accepts connections on TCP, as the user and database the gateway uses.
    test = " ".join(postgres["healthcheck"]["test"])
    assert "pg_isready" in test and "-h 127.0.0.1" in test
    assert '-U "$$POSTGRES_USER"' in test and '-d "$$POSTGRES_DB"' in test
    # It shares no network with the proxy and the outside.
    assert not set(postgres["networks"]) & set(compose["services"]["proxy"]["networks"])
    assert all(compose["networks"][n].get("internal") for n in postgres["networks"])


def test_compose_gateways_write_the_ledger_to_compose_postgres_unless_deploy_env_names_another() -> None:
    compose = _compose()
    postgres = compose["services"]["postgres"]["environment"]
    for name, service in _gateway_services(compose).items():
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy", name
        assert set(compose["services"]["postgres"]["networks"]) & set(service["networks"]), name
        value = service["environment"]["LEDGER_DATABASE_URL"]
        # The default: compose's PostgreSQL, with the password deploy/.env sets.
        url = urlsplit(_interpolate(value, COMPOSE_FILLED))
        assert (url.scheme, url.hostname, url.port) == ("postgresql", "postgres", 5432)
        assert url.username == postgres["POSTGRES_USER"]
        assert url.password == COMPOSE_FILLED["POSTGRES_PASSWORD"]
        assert url.path == f"/{postgres['POSTGRES_DB']}"
        # Left empty in deploy/.env, the default holds; filled in, it wins.
        assert _interpolate(value, {**COMPOSE_FILLED, "LEDGER_DATABASE_URL": ""}) == url.geturl()
        managed = "postgresql://ledger:secret@db.example.com:5432/ledger?sslmode=require"
        assert _interpolate(value, {**COMPOSE_FILLED, "LEDGER_DATABASE_URL": managed}) == managed
        # Without a password compose stops and names it.
        with pytest.raises(KeyError, match="POSTGRES_PASSWORD"):
            _interpolate(value, {})


def test_compose_mounts_files_that_exist() -> None:
    for name, service in _compose()["services"].items():
        for volume in service.get("volumes", []):
            source = _interpolated_defaults(volume).split(":", 1)[0]
            if source.startswith("."):
                assert (DEPLOY / source).exists(), f"{name} mounts missing {source}"


def test_compose_redis_keeps_every_write_on_a_named_volume() -> None:
    compose = _compose()
    redis = compose["services"]["redis"]
    flags = _redis_flags(shlex.split(redis["command"][-1]))
    assert STORE_KEEPS_EVERY_WRITE.items() <= flags.items()
    mounts = {v.split(":")[1]: v.split(":")[0] for v in redis["volumes"]}
    assert mounts[flags["dir"]] in compose["volumes"]  # a named volume, not the container's layer


def test_compose_gateways_set_only_gateway_variables_and_interpolate_every_secret() -> None:
    for name, service in _gateway_services(_compose()).items():
        environment = service["environment"]
        assert isinstance(environment, dict)
        assert set(environment) <= set(ENV_VARS), f"{name}: {sorted(set(environment) - set(ENV_VARS))}"
        assert {"STATE_STORE_REST_URL", "SIWX_SECRET", "TRUSTED_PROXIES"} <= set(environment)
        assert "env_file" not in service, "list the variables so they can be checked"
        for var, value in environment.items():
            value = str(value)
            if var in SECRET_VARS:
                whole = _INTERPOLATION.fullmatch(value)
                assert whole and whole["name"] == var, f"{var} must be exactly ${{{var}...}}"
                assert whole["op"] in (None, ":?", "?") or not whole["arg"], f"{var} has a default"
            elif var in CREDENTIAL_URL_VARS:
                literal = urlsplit(_interpolate(value, {}, lenient=True))
                assert not literal.password and not literal.query, f"{var} holds a literal credential"
        # Required secrets stop compose when unset.
        assert re.fullmatch(r"\$\{SIWX_SECRET:\?[^}]+\}", environment["SIWX_SECRET"])
        assert "${REDIS_PASSWORD:?" in environment["STATE_STORE_REST_URL"]


# Settings a deployment cannot change, and why; every other variable of ENV_VARS is settable in
# compose (through deploy/.env), in .env.example, and in Kubernetes (ConfigMap or Secret).
COMPOSE_FIXED = {
    "PORT": "the command's --port is what nginx and Prometheus reach",
    "STATE_STORE_REST_TOKEN": "compose's store is its own Redis (REDIS_PASSWORD), not Upstash",
}
K8S_FIXED = {"PORT": "the command's --port is what the probes, the Service and the scrape reach"}


def test_compose_lets_deploy_env_set_every_setting_of_the_gateway() -> None:
    environment = _compose()["services"]["gateway"]["environment"]
    example = _env_example()
    assert set(COMPOSE_FIXED) <= set(ENV_VARS)
    for var in ENV_VARS:
        if var in COMPOSE_FIXED:
            assert var not in environment, f"{var} is set though {COMPOSE_FIXED[var]}"
            continue
        assert var in environment, f"compose.yaml does not pass {var} to the gateway"
        # Set from deploy/.env: the value interpolates variables .env.example lists.
        names = _interpolated_names(str(environment[var]))
        assert names, f"compose.yaml fixes {var}: deploy/.env cannot change it"
        assert names <= set(example), f"{var}: .env.example lacks {sorted(names - set(example))}"
    # A filled-in deploy/.env reaches the gateway unchanged.
    chosen = {"CREDITS_ENABLED": "true", "CREDIT_LAPSE_DAYS": "30", "RATE_LIMIT_WALLET_RPS": "3"}
    env = {**example, **COMPOSE_FILLED, **chosen}
    passed = {k: _interpolate(str(v), env) for k, v in environment.items()}
    assert chosen.items() <= passed.items()


def test_env_example_lists_only_what_compose_reads() -> None:
    text = (DEPLOY / "compose.yaml").read_text(encoding="utf-8")
    read = _interpolated_names(text)
    assert set(_env_example()) <= read, f"unused: {sorted(set(_env_example()) - read)}"


def test_kubernetes_can_set_every_setting_of_the_gateway() -> None:
    data = _k8s("ConfigMap", "x402-gateway-config")["data"]
    env = {entry["name"] for entry in _container()["env"]}
    for var in ENV_VARS:
        if var in K8S_FIXED:
            assert var not in data and var not in env, f"{var} is set though {K8S_FIXED[var]}"
        else:
            assert var in data or var in env, f"neither the ConfigMap nor the Deployment sets {var}"


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)")
@pytest.mark.parametrize(
    ("check", "file"), [("config", "prometheus.yml"), ("rules", "prometheus-alerts.yml")]
)
def test_promtool_accepts_the_shipped_prometheus_files(check: str, file: str) -> None:
    """As an operator runs it from the repository root, on deploy/ as shipped."""
    assert PROMTOOL
    done = subprocess.run(
        [PROMTOOL, "check", check, str((DEPLOY / file).relative_to(ROOT))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_compose_gateway_environment_with_the_example_values_loads() -> None:
    compose = _compose()
    env = {**_env_example(), **COMPOSE_FILLED}
    environment = {
        k: _interpolate(str(v), env) for k, v in compose["services"]["gateway"]["environment"].items()
    }
    settings = _check_settings({**environment, "ROUTES_FILE": str(ROUTES_YAML)})
    assert settings.store_url.reveal().startswith("redis://")
    assert urlsplit(settings.store_url.reveal()).hostname == "redis"
    assert urlsplit(settings.ledger_url.reveal()).hostname == "postgres"
    with pytest.raises(KeyError, match="REDIS_PASSWORD"):
        _interpolate(compose["services"]["gateway"]["environment"]["STATE_STORE_REST_URL"], {})


def test_compose_trusts_x_forwarded_for_only_from_the_proxys_own_address() -> None:
    compose = _compose()
    services = compose["services"]
    proxy_networks = services["proxy"]["networks"]
    assert len(proxy_networks) == 1
    (edge,) = proxy_networks
    (ipam,) = compose["networks"][edge]["ipam"]["config"]
    trusted = services["gateway"]["environment"]["TRUSTED_PROXIES"]
    assert trusted == proxy_networks[edge]["ipv4_address"], "TRUSTED_PROXIES names the proxy's address"
    for env in ({}, _env_example()):
        subnet = ipaddress.ip_network(_interpolate(ipam["subnet"], env))
        dynamic = ipaddress.ip_network(_interpolate(ipam["ip_range"], env))
        settings = _check_settings({**BASE_ENV, "TRUSTED_PROXIES": _interpolate(trusted, env)})
        (proxy,) = settings.trusted_proxies
        # One address, the proxy's: no neighbour on the edge network may speak for a client.
        assert proxy.num_addresses == 1
        assert proxy.network_address in subnet
        assert dynamic.network_address in subnet and dynamic.broadcast_address in subnet
        # Docker hands the replicas addresses from the dynamic range only: never the proxy's.
        assert proxy.network_address not in dynamic
    assert edge in services["gateway"]["networks"]
    # Redis shares no network with the proxy and the outside.
    assert not set(services["redis"]["networks"]) & set(proxy_networks)
    assert all(compose["networks"][n].get("internal") for n in services["redis"]["networks"])


def test_no_deploy_default_trusts_more_than_single_addresses() -> None:
    """A trusted subnet lets any neighbour in it append its own X-Forwarded-For hops: the
    shipped defaults trust the compose proxy's one address, and nothing in Kubernetes."""
    environment = _compose()["services"]["gateway"]["environment"]
    trusted = _interpolated_defaults(environment["TRUSTED_PROXIES"])
    compose = _check_settings({**BASE_ENV, "TRUSTED_PROXIES": trusted})
    data = _k8s("ConfigMap", "x402-gateway-config")["data"]
    kubernetes = _check_settings({**data, **DUMMY_SECRETS, "ROUTES_FILE": str(ROUTES_YAML)})
    assert [n.num_addresses for n in compose.trusted_proxies] == [1]
    assert kubernetes.trusted_proxies == ()
    assert kubernetes.client_ipv6_prefix_length == compose.client_ipv6_prefix_length == 64


def test_nginx_forwards_the_client_address_to_the_gateway_replicas() -> None:
    conf = (DEPLOY / "nginx.conf").read_text(encoding="utf-8")
    assert re.search(r"proxy_set_header\s+X-Forwarded-For\s+\$proxy_add_x_forwarded_for;", conf)
    upstream = re.search(r"upstream\s+(\w+)\s*\{(.*?)\}", conf, re.S)
    assert upstream
    assert re.search(rf"proxy_pass\s+http://{upstream[1]};", conf)
    command = _compose()["services"]["gateway"]["command"]
    port = command[command.index("--port") + 1]
    assert re.search(rf"server\s+gateway:{port}\b", upstream[2])
    # A paid POST must never be replayed to a second replica.
    assert not re.search(r"^\s*proxy_next_upstream\s[^;]*non_idempotent", conf, re.M)
    mounted = _compose()["services"]["proxy"]["volumes"]
    assert any(v.startswith("./nginx.conf:") for v in mounted)


# --- the internal facilitator stays off the public listeners --------------------------------

_NGINX_LOCATION = re.compile(r"location\s+(=|\^~|~\*?)?\s*(\S+)\s*\{(.*?)\n\s*\}", re.S)


def _nginx_conf() -> str:
    return (DEPLOY / "nginx.conf").read_text(encoding="utf-8")


def _nginx_proxies(conf: str, path: str) -> bool:
    """Whether nginx's location choice for the (normalised) ``path`` is a proxy_pass."""
    locations = [(m[1] or "", m[2], m[3]) for m in _NGINX_LOCATION.finditer(conf)]
    assert not [loc for loc in locations if loc[0].startswith("~")], "regex locations: update this test"
    exact = [body for kind, where, body in locations if kind == "=" and where == path]
    prefixes = [(where, body) for kind, where, body in locations if kind != "=" and path.startswith(where)]
    body = exact[0] if exact else max(prefixes, key=lambda item: len(item[0]))[1]
    return "proxy_pass" in body


def _ingress_routes(path: str) -> bool:
    """Whether the Ingress sends ``path`` to the gateway (Kubernetes Exact / Prefix semantics)."""
    segments = [s for s in path.split("/") if s]
    for rule in _k8s("Ingress")["spec"]["rules"]:
        for entry in rule["http"]["paths"]:
            wanted = [s for s in entry["path"].split("/") if s]
            if entry["pathType"] == "Exact" and entry["path"] == path:
                return True
            if entry["pathType"] == "Prefix" and segments[: len(wanted)] == wanted:
                return True
    return False


OPERATOR_ONLY = ("metrics", "ready")
"""Public routes (no payment) that only the operator's own systems ask: Prometheus, the kubelet."""


def _route_paths() -> list[tuple[str, bool]]:
    """Every route path (parameters filled in) and whether the public may reach it."""
    return [
        (
            re.sub(r"\{[^}]+\}", "x", route.path),
            route.access != "internal" and route.handler not in OPERATOR_ONLY,
        )
        for route in parse_routes(_routes_doc(), LIMITS)
    ]


def test_nginx_proxies_every_public_route_and_never_the_internal_facilitator() -> None:
    conf = _nginx_conf()
    routes = _route_paths()
    assert any(path.startswith("/api/internal/facilitator/") for path, _ in routes)
    for path, public in routes:
        assert _nginx_proxies(conf, path) is public, path
    for path in ("/api/internal/facilitator/verify/", "/api/internal", "/api/", "/metrics", "/"):
        assert not _nginx_proxies(conf, path), path


def test_nginx_reuses_idle_connections_only_while_the_gateway_keeps_them() -> None:
    upstream = re.search(r"upstream\s+\w+\s*\{(.*?)\}", _nginx_conf(), re.S)
    assert upstream
    keepalive = re.search(r"keepalive_timeout\s+(\d+)s;", upstream[1])
    assert keepalive and int(keepalive[1]) < Settings(base_url="https://x").client_header_timeout_s


def test_the_ingress_routes_every_public_route_and_never_the_internal_facilitator() -> None:
    ingress = _k8s("Ingress")
    service = _k8s("Service", "x402-gateway")
    port_names = {p["name"] for p in service["spec"]["ports"]}
    for rule in ingress["spec"]["rules"]:
        for entry in rule["http"]["paths"]:
            assert entry["backend"]["service"]["name"] == service["metadata"]["name"]
            assert entry["backend"]["service"]["port"]["name"] in port_names
    assert "defaultBackend" not in ingress["spec"]
    assert service["spec"]["type"] == "ClusterIP"  # reachable only inside the cluster
    for path, public in _route_paths():
        assert _ingress_routes(path) is public, path


def test_deploy_readme_says_where_the_internal_facilitator_is_reached() -> None:
    text = (DEPLOY / "README.md").read_text(encoding="utf-8")
    assert "/api/internal/facilitator" in text
    assert "x-gateway-internal-secret" in text


NGINX = shutil.which("nginx")


def _loopback_nginx_conf(tmp: Path, listen: int, gateway_port: int) -> Path:
    """deploy/nginx.conf with loopback addresses for its listener and upstream, in a main config
    that runs one foreground process writing only under ``tmp``."""
    site = _nginx_conf()
    site = re.sub(r"^resolver .*$", "", site, flags=re.M)
    site = re.sub(r"server gateway:\d+ [^;]*;", f"server 127.0.0.1:{gateway_port};", site)
    site = site.replace("listen 80;", f"listen 127.0.0.1:{listen};")
    (tmp / "site.conf").write_text(site, encoding="utf-8")
    temp = "".join(
        f" {kind}_temp_path {tmp / kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    main = tmp / "nginx.conf"
    main.write_text(
        f"daemon off; master_process off; pid {tmp / 'nginx.pid'}; error_log {tmp / 'error.log'};\n"
        f"events {{}}\nhttp {{ access_log off;{temp} include {tmp / 'site.conf'}; }}\n",
        encoding="utf-8",
    )
    return main


def _raw_get(
    port: int, target: str, method: str = "GET", headers: Mapping[str, str] = {}
) -> tuple[int, bytes]:
    """One request with ``target`` sent byte for byte (no client-side normalisation)."""
    lines = [f"{method} {target} HTTP/1.1", f"host: 127.0.0.1:{port}", "connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.skipif(NGINX is None, reason="nginx is not installed")
def test_the_shipped_nginx_config_keeps_the_internal_facilitator_off_the_public_port(tmp_path: Path) -> None:
    assert NGINX is not None
    secret = "deploy-internal-secret-0123456789abcdef"
    wallet = base58.b58encode(bytes(Keypair())).decode()
    env = {
        **SERVICE_ONLY_ENV,
        "INTERNAL_SETTLEMENT_SECRET": secret,
        "FACILITATOR_WALLET_BASE58": wallet,
        "LOG_LEVEL": "WARNING",
    }
    internal = {"x-gateway-internal-secret": secret}
    with serve(env) as gateway:
        listen = free_port()
        conf = _loopback_nginx_conf(tmp_path, listen, gateway.port)
        checked = subprocess.run([NGINX, "-t", "-c", str(conf), "-e", str(tmp_path / "error.log")],
                                 capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        assert checked.returncode == 0, checked.stderr
        proxy = subprocess.Popen([NGINX, "-c", str(conf), "-e", str(tmp_path / "error.log")])
        try:
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", listen), timeout=1).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline, (tmp_path / "error.log").read_text()
                    time.sleep(0.05)
            # Directly, with the secret, the facilitator answers (the secret check stays) ...
            assert _raw_get(gateway.port, "/api/internal/facilitator/supported", headers=internal)[0] == 200
            assert _raw_get(gateway.port, "/api/internal/facilitator/supported")[0] == 401
            # ... through the public listener, never, however the path is spelled.
            for method, target in [
                ("GET", "/readyz"),
                ("GET", "/api/internal/facilitator/supported"),
                ("HEAD", "/api/internal/facilitator/supported"),
                ("OPTIONS", "/api/internal/facilitator/supported"),
                ("POST", "/api/internal/facilitator/verify"),
                ("GET", "//api/internal/facilitator/supported"),
                ("GET", "/api/internal/facilitator/supported/"),
                ("GET", "/api%2Finternal%2Ffacilitator%2Fsupported"),
                ("GET", "/api/internal/./facilitator/supported"),
                ("GET", "/v1/../api/internal/facilitator/supported"),
                ("GET", "/v1/%2e%2e/api/internal/facilitator/supported"),
                ("GET", "/v1/x%2F..%2F..%2Fapi/internal/facilitator/supported"),
                ("GET", "/metrics"),
            ]:
                status, body = _raw_get(listen, target, method, internal)
                assert status == 404, (method, target, status, body)
                assert b"feePayer" not in body and b"kinds" not in body
            assert _raw_get(listen, "/healthz")[0] == 200
            status, body = _raw_get(listen, "/v1/catalog")
            assert status == 200 and b"feePayer" not in body
        finally:
            proxy.terminate()
            proxy.wait(timeout=10)


# --- Dockerfile -----------------------------------------------------------------------------


def _dockerfile() -> list[tuple[str, str]]:
    text = (DEPLOY / "Dockerfile").read_text(encoding="utf-8")
    logical = re.sub(
        r"\\\n", " ", "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    )
    lines = [line.strip() for line in logical.splitlines() if line.strip()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_dockerfile_builds_on_slim_python_and_installs_without_the_test_extra() -> None:
    instructions = _dockerfile()
    bases = [arg.split()[0] for op, arg in instructions if op == "FROM"]
    assert bases
    for base in bases:
        assert re.fullmatch(
            r"python:3\.(1[1-9]|[2-9][0-9])(\.[0-9]+)?-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", base
        )
    installs = _pip_installs(_build_stage())
    assert installs, "the build stage installs nothing with pip"
    for args in installs:
        assert "." in args, args  # the package itself, without the test extra
        assert not [a for a in args if "[" in a], args
        # The tests' pins: every runtime dependency at the version the suite ran with.
        assert _constraint_files(args) == ["constraints.txt"], args
    assert ("EXPOSE", "8080") in instructions


def _build_stage() -> list[tuple[str, str]]:
    """The instructions of the first stage (the one that installs), without its FROM."""
    instructions = _dockerfile()
    starts = [i for i, (op, _) in enumerate(instructions) if op == "FROM"]
    end = starts[1] if len(starts) > 1 else len(instructions)
    return instructions[starts[0] + 1 : end]


def _pip_installs(stage: list[tuple[str, str]]) -> list[list[str]]:
    """The arguments after ``pip install`` of every such command in the stage's RUN lines."""
    found = []
    for op, arg in stage:
        if op != "RUN":
            continue
        for command in re.split(r"&&|;", arg):
            words = shlex.split(command)
            for i in range(len(words) - 1):
                if words[i].endswith("pip") and words[i + 1] == "install":
                    found.append(words[i + 2 :])
    return found


def _constraint_files(args: list[str]) -> list[str]:
    files = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-c", "--constraint")]
    return files + [a.split("=", 1)[1] for a in args if a.startswith("--constraint=")]


def _dockerignored(relative: str) -> bool:
    """Whether the root .dockerignore leaves ``relative`` out of the build context."""
    lines = (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    assert not [p for p in patterns if p.startswith("!")], "exceptions in .dockerignore: update this test"
    parts = relative.split("/")
    for pattern in patterns:
        if pattern.startswith("**/"):
            if any(fnmatch.fnmatch("/".join(parts[i:]), pattern[3:]) for i in range(len(parts))):
                return True
        elif any(fnmatch.fnmatch("/".join(parts[: i + 1]), pattern) for i in range(len(parts))):
            return True
    return False


def _copy_build_context(stage: list[tuple[str, str]], workdir: Path) -> None:
    """Do the stage's COPY instructions from the repository root into ``workdir``, as the builder
    would: .dockerignore applies, a directory's contents land in the destination."""
    for op, arg in stage:
        if op != "COPY":
            continue
        *sources, dest = shlex.split(arg)
        assert not [s for s in sources if s.startswith("--")], f"COPY {arg}: flags, update this test"
        target = (workdir / dest).resolve()
        for source in sources:
            assert not _dockerignored(source), f"COPY {source}: .dockerignore leaves it out of the context"
            path = ROOT / source
            assert path.exists(), f"COPY {source}: no such file"
            if path.is_dir():

                def ignore(folder: str, names: list[str], base: Path = path, name: str = source) -> list[str]:
                    here = Path(folder).relative_to(base)
                    return [n for n in names if _dockerignored(str(Path(name) / here / n))]

                shutil.copytree(path, target, symlinks=True, ignore=ignore, dirs_exist_ok=True)
            else:
                into = target / path.name if dest.endswith("/") or len(sources) > 1 else target
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, into)


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[_canonical(name)] = version
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_images_install_steps_in_a_fresh_venv_land_exactly_the_pins(tmp_path: Path) -> None:
    """No container engine here: the build stage's COPY and pip steps, run as written (its venv
    path swapped for a fresh one, pip's local cache allowed) must install every runtime
    dependency at its constraints.txt pin, consistently, with a working console script."""
    stage = _build_stage()
    workdirs = [arg for op, arg in stage if op == "WORKDIR"]
    runs = [arg for op, arg in stage if op == "RUN"]
    venv_dirs = {m for run in runs for m in re.findall(r"-m venv (\S+)", run)}
    assert len(venv_dirs) == 1, runs
    (image_venv,) = venv_dirs
    src, venv = tmp_path / "src", tmp_path / "venv"
    src.mkdir()
    _copy_build_context(stage, src)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_NO_CACHE_DIR", "VIRTUAL_ENV", "PYTHONPATH")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    installs = [run for run in runs if f"{image_venv}/bin/" in run]
    assert installs and any("pip install" in run for run in installs), runs
    for run in installs:
        done = subprocess.run(
            ["sh", "-c", run.replace(image_venv, str(venv))],
            cwd=src,
            env=env,
            capture_output=True,
            text=True,
            timeout=840,
            check=False,
        )
        assert done.returncode == 0, f"RUN {run}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert workdirs, "the build stage has no WORKDIR: COPY targets would be the root"

    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    checked = subprocess.run([*pip, "check"], capture_output=True, text=True, timeout=120, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    listed = subprocess.run(
        [*pip, "list", "--format=json"], capture_output=True, text=True, timeout=120, check=True
    )
    installed = {_canonical(d["name"]): d["version"] for d in json.loads(listed.stdout)}
    tooling = {"pip", "setuptools", "wheel", "x402-gateway"}
    pins = _pins()
    unpinned = sorted(set(installed) - tooling - set(pins))
    assert not unpinned, f"installed but not pinned in constraints.txt: {unpinned}"
    off = {name: (v, pins[name]) for name, v in installed.items() if name in pins and v != pins[name]}
    assert not off, f"installed (version, pin): {off}"
    for args in (["--help"], ["check", "--help"]):
        ran = subprocess.run(
            [str(venv / "bin" / "x402-gateway"), *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert ran.returncode == 0 and "usage" in ran.stdout.lower(), ran.stderr


def test_deploy_readme_names_the_builders_that_keep_the_healthcheck_and_compose_v2() -> None:
    text = (DEPLOY / "README.md").read_text(encoding="utf-8")
    assert "--format docker" in text and "buildah" in text and "podman" in text
    assert "Compose v2" in text and "docker compose -f deploy/compose.yaml" in text
    assert "`docker-compose` 1.x" in text


def test_dockerfile_runs_as_a_non_root_user_before_cmd() -> None:
    instructions = _dockerfile()
    final = instructions[max(i for i, (op, _) in enumerate(instructions) if op == "FROM") :]
    ops = [op for op, _ in final]
    users = [arg for op, arg in final if op == "USER"]
    assert users, "the runtime stage sets no USER"
    assert users[-1].split(":")[0] not in ("root", "0")
    assert ops.index("USER") < ops.index("CMD")
    cmd = json.loads(dict(final)["CMD"])
    assert cmd[:2] == ["x402-gateway", "serve"]
    assert cmd[cmd.index("--host") + 1] == "0.0.0.0"


def test_dockerfile_healthcheck_fetches_healthz_with_python() -> None:
    healthcheck = dict(_dockerfile())["HEALTHCHECK"]
    options, _, command = healthcheck.partition("CMD")
    assert "--interval" in options
    assert json.loads(command)[0] == "python"
    assert "/healthz" in command
    assert "urllib" in healthcheck
    assert "curl" not in healthcheck


def test_dockerfile_bakes_in_no_secret() -> None:
    instructions = _dockerfile()
    env_names = set()
    for op, arg in instructions:
        if op in ("ENV", "ARG"):
            env_names |= {item.split("=", 1)[0] for item in shlex.split(arg)}
    assert not env_names & (SECRET_STORE_VARS | COMPOSE_PASSWORDS)
    assert "PYTHONUNBUFFERED=1" in " ".join(arg for op, arg in instructions if op == "ENV")
    copied = " ".join(arg for op, arg in instructions if op in ("COPY", "ADD"))
    assert ".env" not in copied
    dockerignore = (ROOT / ".dockerignore").read_text(encoding="utf-8").split()
    assert "**/.env" in dockerignore


def _secret_like_tokens(text: str) -> Iterator[str]:
    for token in re.findall(r"[A-Za-z0-9+/=]{32,}", text):
        if re.fullmatch(r"[0-9a-f]{32,}", token) or all(
            re.search(c, token) for c in ("[a-z]", "[A-Z]", "[0-9]")
        ):
            yield token
    yield from re.findall(r"-----BEGIN [A-Z ]*PRIVATE KEY-----", text)


@pytest.mark.parametrize(
    "path",
    [p for p in _deploy_files(*TEXT_SUFFIXES) if p.name != "routes-configmap.yaml"]
    + [ROOT / ".dockerignore"],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_deploy_file_holds_no_key_material(path: Path) -> None:
    assert not list(_secret_like_tokens(path.read_text(encoding="utf-8")))


# --- Prometheus and Grafana -----------------------------------------------------------------


def _exported_series(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    upstream_metrics.upstream_meter("asset_api").failed(
        upstream_metrics.ErrorKind.TIMEOUT
    )  # as the app would
    text = metrics.render({("route", "paid"): 1}).decode()
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created")}
    names = set()
    for family in text_string_to_metric_families(text):
        if family.name.startswith("x402_"):
            names |= {family.name + s for s in suffixes.get(family.type, ("",))}
            if family.type == "histogram":  # the family's own name, as README and prose use it
                names.add(family.name)
    return names


def _grafana() -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(
        (DEPLOY / "grafana" / "x402-gateway.json").read_text(encoding="utf-8")
    )
    return dashboard


def _panel_exprs() -> list[str]:
    return [t["expr"] for p in _grafana()["panels"] for t in p.get("targets", [])]


@pytest.mark.parametrize(
    "path",
    [
        DEPLOY / "grafana" / "x402-gateway.json",
        DEPLOY / "prometheus.yml",
        DEPLOY / "prometheus-alerts.yml",
        ROOT / "README.md",
    ],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_every_metric_named_is_one_the_gateway_exports(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    exported = _exported_series(monkeypatch)
    assert {"x402_requests_total", "x402_request_duration_seconds_bucket", "x402_usage_total"} <= exported
    assert {"x402_upstream_duration_seconds_bucket", "x402_upstream_errors_total"} <= exported
    named = set(re.findall(r"\bx402_[a-z0-9_]+", path.read_text(encoding="utf-8")))
    assert named <= exported, f"unknown metrics: {sorted(named - exported)}"


def test_dashboard_shows_routes_statuses_latency_quantiles_and_payments() -> None:
    dashboard = _grafana()
    exprs = _panel_exprs()
    joined = "\n".join(exprs)
    assert "sum by (route) (rate(x402_requests_total" in joined
    assert "sum by (status) (rate(x402_requests_total" in joined
    assert 'status="402"' in joined and 'status="429"' in joined
    for quantile in ("0.5", "0.99"):
        assert f"histogram_quantile({quantile}, sum by (le" in joined
    assert "x402_payments_total" in joined and "x402_usage_total" in joined
    # The upstreams, by their route-table names: latency quantiles and errors by kind.
    assert (
        "histogram_quantile(0.99, sum by (le, upstream) (rate(x402_upstream_duration_seconds_bucket" in joined
    )
    assert "sum by (upstream, kind) (rate(x402_upstream_errors_total" in joined
    assert "sum by (route) (increase(x402_revenue_micro_usdc_total" in joined  # revenue per route
    assert any("x402_revenue_micro_usdc_total" in e and e.endswith("[1h])) / 1e6") for e in exprs)  # per hour
    # x402_usage_total is the shared store's total, reported alike by every replica: max over the
    # replicas first, never a sum.
    for expr in exprs:
        for found in re.finditer(r"(rate|increase)\(x402_usage_total", expr):
            assert re.search(r"max by \([^)]*\) \($", expr[: found.start()]), expr
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert all(
        t["datasource"]["uid"] == "${datasource}" for p in dashboard["panels"] for t in p.get("targets", [])
    )
    assert any(
        v["name"] == "datasource" and v["type"] == "datasource" for v in dashboard["templating"]["list"]
    )


def test_the_failed_payments_panel_counts_only_failures() -> None:
    """A sign-in probing for credit that finds none (``no_credit``) is no failed payment: the
    panel names only outcomes the usage counts as failed, and never a probe, a challenge or a
    replay."""
    (panel,) = [p for p in _grafana()["panels"] if p.get("title") == "Failed payments by route"]
    (expr,) = [t["expr"] for t in panel["targets"]]
    named = set(re.search(r'x402_payments_total\{outcome=~"([^"]+)"', expr).group(1).split("|"))  # type: ignore[union-attr]
    failures = {outcome.value for outcome, usage in metrics.USAGE_OF.items() if usage == "failed"}
    assert named == {"rejected", "settle_failed", "upstream_failed"}
    assert named <= failures
    assert not named & {"no_credit", "challenged", "replayed", "credit_spent", "paid"}
    assert metrics.USAGE_OF[metrics.Outcome.CREDIT_UNCOVERED] == "unpaid"


def _credit_series() -> set[str]:
    """The series of every counter in gateway/methods/credit/metrics.py."""
    counters = [c for c in vars(credit_metrics).values() if isinstance(c, credit_metrics.Counter)]
    return {f"{family.name}_total" for counter in counters for family in counter.describe()}


def test_dashboard_shows_credit_sold_spent_per_route_and_lapsed_beside_revenue() -> None:
    exprs = _panel_exprs()
    joined = "\n".join(exprs)
    credit = _credit_series()
    assert {
        "x402_credit_sold_micro_usdc_total",
        "x402_credit_spent_micro_usdc_total",
        "x402_credit_lapsed_micro_usdc_total",
    } <= credit
    # Every credit series the dashboard queries is one gateway/methods/credit/metrics.py counts, and it
    # shows every one of them.
    named = set(re.findall(r"\bx402_credit_[a-z0-9_]+", joined))
    assert named == credit
    assert "sum by (route) (increase(x402_credit_spent_micro_usdc_total" in joined
    # Credit sold, spent and lapsed in one panel with settled revenue, in USDC.
    panels = [[t["expr"] for t in p.get("targets", [])] for p in _grafana()["panels"]]
    beside = [e for e in panels if all(s in " ".join(e) for s in (*credit, "x402_revenue_micro_usdc_total"))]
    assert beside and all(expr.endswith("/ 1e6") for expr in beside[0])
    assert any(p["type"] == "row" and "credit" in p["title"].lower() for p in _grafana()["panels"])


def _ledger_series() -> dict[str, str]:
    """The series of every metric in gateway/ledger/metrics.py (histograms by their buckets), and
    each one's type."""
    suffix = {"counter": "_total", "histogram": "_bucket", "gauge": ""}
    return {
        family.name + suffix[family.type]: family.type
        for collector in vars(ledger_metrics).values()
        if isinstance(collector, (ledger_metrics.Counter, ledger_metrics.Gauge, ledger_metrics.Histogram))
        for family in collector.describe()
    }


def _alert(name: str) -> dict[str, Any]:
    rules = yaml.safe_load((DEPLOY / "prometheus-alerts.yml").read_text(encoding="utf-8"))
    [rule] = [r for g in rules["groups"] for r in g["rules"] if r["alert"] == name]
    return rule  # type: ignore[no-any-return]


def test_dashboard_shows_every_ledger_metric_and_alerts_on_write_errors_and_lag() -> None:
    panels = {p["title"]: p for p in _grafana()["panels"]}
    joined = "\n".join(_panel_exprs())
    series = _ledger_series()
    assert set(series) == {
        "x402_ledger_write_seconds_bucket",
        "x402_ledger_write_errors_total",
        "x402_ledger_backlog_entries",
        "x402_ledger_lag_seconds",
        "x402_ledger_entries_dropped_total",
    }
    # The dashboard queries every ledger series gateway/ledger/metrics.py exports, and no other.
    assert set(re.findall(r"\bx402_ledger_[a-z0-9_]+", joined)) == set(series)
    assert any(p["type"] == "row" and "ledger" in p["title"].lower() for p in panels.values())
    for quantile in ("0.5", "0.99"):
        assert f"histogram_quantile({quantile}, sum by (le) (rate(x402_ledger_write_seconds_bucket" in joined
    # Counters only inside a rate or an increase over a range, never raw.
    for name, kind in series.items():
        if kind == "counter":
            assert set(re.findall(rf"(\w+)\({name}\[", joined)) <= {"rate", "increase"}, name
            assert joined.count(name) == len(re.findall(rf"\({name}\[", joined)), name
    # Write errors alert at the first one; the lag alert fires past 60 s, where its panel turns red.
    errors = _alert("X402LedgerWriteErrors")
    assert re.fullmatch(
        r"sum\(increase\(x402_ledger_write_errors_total\[\d+m\]\)\) > 0", errors["expr"].strip()
    )
    assert errors["labels"]["severity"] == "critical"
    lag = _alert("X402LedgerLagging")
    threshold = re.fullmatch(r"max by \(instance\) \(x402_ledger_lag_seconds\) > (\d+)", lag["expr"].strip())
    assert threshold and int(threshold[1]) == 60
    assert "$labels.instance" in lag["annotations"]["summary"]
    steps = panels["Ledger lag"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["color"] == "red" and steps[-1]["value"] == int(threshold[1])
    assert [t["expr"] for t in panels["Ledger lag"]["targets"]] == ["max(x402_ledger_lag_seconds)"]
    assert "x402_ledger_entries_dropped_total" in _alert("X402LedgerEntriesDropped")["expr"]


def test_prometheus_scrapes_each_gateway_replica_at_the_metrics_path() -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text(encoding="utf-8"))
    (job,) = [j for j in config["scrape_configs"] if j["job_name"] == "x402-gateway"]
    assert job.get("metrics_path", "/metrics") == "/metrics"
    command = _compose()["services"]["gateway"]["command"]
    (sd,) = job["dns_sd_configs"]
    assert sd["names"] == ["gateway"] and str(sd["port"]) == command[command.index("--port") + 1]
    # Rule files are relative to prometheus.yml: found beside it in deploy/ (promtool) and in the
    # container, where compose mounts both into /etc/prometheus.
    mounts = _compose()["services"]["prometheus"]["volumes"]
    assert "./prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts
    for rule_file in config["rule_files"]:
        assert not rule_file.startswith("/"), f"{rule_file}: absolute, so promtool cannot find it in deploy/"
        assert (DEPLOY / rule_file).is_file()
        assert f"./{rule_file}:/etc/prometheus/{rule_file}:ro" in mounts
    rules = yaml.safe_load((DEPLOY / "prometheus-alerts.yml").read_text(encoding="utf-8"))
    for group in rules["groups"]:
        for rule in group["rules"]:
            assert rule["alert"] and rule["expr"] and rule["annotations"]["summary"]


def test_dashboard_shows_the_fee_payer_balance_and_its_fees_on_landed_and_failed_settlements() -> None:
    panels = {p["title"]: p for p in _grafana()["panels"]}
    joined = "\n".join(_panel_exprs())
    assert "min(x402_fee_payer_balance_lamports) / 1e9" in joined  # SOL, the lowest replica's reading
    assert "sum by (outcome) (increase(x402_fee_payer_fees_lamports_total[1h])) / 1e9" in joined
    assert "sum by (reason) (rate(x402_settlements_held_back_total" in joined
    assert any(p["type"] == "row" and "fee payer" in p["title"].lower() for p in panels.values())
    # The balance turns red where the alert fires.
    rules = yaml.safe_load((DEPLOY / "prometheus-alerts.yml").read_text(encoding="utf-8"))
    [low] = [r for g in rules["groups"] for r in g["rules"] if r["alert"] == "X402FeePayerBalanceLow"]
    threshold = re.fullmatch(r"min\(x402_fee_payer_balance_lamports\) < (\d+)", low["expr"].strip())
    assert threshold
    alert_lamports = int(threshold[1])
    steps = panels["Fee payer balance"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[0]["color"] == "red" and steps[1]["value"] * 1e9 == alert_lamports


def test_every_dashboard_panel_queries_series_a_served_gateway_exposes() -> None:
    """Read from the /metrics of a real gateway whose internal facilitator has a fee payer."""
    env = {
        **SERVICE_ONLY_ENV,
        "INTERNAL_SETTLEMENT_SECRET": "deploy-internal-secret-0123456789abcdef",
        "FACILITATOR_WALLET_BASE58": base58.b58encode(bytes(Keypair())).decode(),
        "LOG_LEVEL": "WARNING",
    }
    with serve(env) as gateway, urllib.request.urlopen(f"{gateway.url}/metrics", timeout=10) as resp:
        body = resp.read()
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    served = {
        family.name + suffix
        for family in text_string_to_metric_families(body.decode())
        for suffix in suffixes.get(family.type, ("",))
    }
    for panel in _grafana()["panels"]:
        for target in panel.get("targets", []):
            named = set(re.findall(r"\bx402_[a-z0-9_]+", target["expr"]))
            assert named, f"{panel['title']}: a query of no gateway series"
            assert named <= served, f"{panel['title']}: {sorted(named - served)} not in /metrics"
