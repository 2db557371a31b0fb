"""routes.yaml -> validated, expanded :class:`RouteSpec` list.

Everything an operator may change per route (path, price, limits, schemas, the method
allowlist) lives in the YAML; this module only expands templates and checks them. Every error
names its YAML location, e.g. ``routes[3].access``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from gateway.config import CDP_FACILITATOR_URL, UPSTREAM_ENV, Settings
from gateway.validation import SchemaError, check_schema

Access = Literal["public", "exact", "siwx", "internal"]
ACCESS_MODES: tuple[str, ...] = ("public", "exact", "siwx", "internal")
HANDLERS = {
    "health", "catalog", "metrics", "openapi", "jsonrpc", "tokens",
    "facilitator_supported", "facilitator_verify", "facilitator_settle",
}  # fmt: skip
HTTP_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}
INPUT_LOCATIONS = {"path", "query", "body"}
PLACEHOLDERS = ("cluster", "provider", "method")
ROUTE_KEYS = {
    "name", "path", "method", "access", "handler", "group", "upstream", "upstream_path", "operation",
    "price", "rate_limits", "input", "output", "description", "listed", "replay_cap_bytes",
    "forward_params",
}  # fmt: skip
METHOD_KEYS = {"description", "params", "output", "forward_params"}
DEFAULT_REPLAY_CAP_BYTES = 1024 * 1024


class RoutesError(ValueError):
    """routes.yaml is invalid; the message names the YAML location."""


class RateLimitSpec(msgspec.Struct, frozen=True):
    """``limit`` requests per ``period_ms`` in the bucket ``scope`` (plus the wallet when per=wallet)."""

    scope: str
    limit: int
    period_ms: int
    per: Literal["scope", "wallet"] = "scope"


class RouteSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    path: str
    method: str
    access: Access
    handler: str
    group: str
    description: str
    upstream: str | None = None
    upstream_path: str | None = None
    operation: str | None = None
    price_micro_usdc: int | None = None
    rate_limits: tuple[RateLimitSpec, ...] = ()
    input: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    output: dict[str, Any] | None = None
    listed: bool = True
    replay_cap_bytes: int = DEFAULT_REPLAY_CAP_BYTES
    forward_params: Literal["as_is", "named"] = "as_is"

    @property
    def has_path_params(self) -> bool:
        return "{" in self.path


def named_limits(settings: Settings) -> dict[str, tuple[int, int]]:
    """Rate limits routes.yaml may name, from the environment: name -> (limit, period_ms)."""
    return {
        "rpc": (settings.rate_limit_rpc_rps, 1000),
        "das": (settings.rate_limit_das_rps, 1000),
        "tokens": (settings.rate_limit_tokens_per_minute, 60_000),
        "challenge": (settings.rate_limit_challenge_per_minute, 60_000),
        "wallet": (settings.rate_limit_wallet_rps, 1000),
    }


def load_routes(path: Path, limits: Mapping[str, tuple[int, int]]) -> list[RouteSpec]:
    """Read, expand and validate the route table at ``path``."""
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise RoutesError(f"{path.name}: cannot read YAML: {exc}") from exc
    return parse_routes(doc, limits)


def parse_routes(doc: Any, limits: Mapping[str, tuple[int, int]]) -> list[RouteSpec]:
    """Expand and validate an already-parsed route table document."""
    if not isinstance(doc, dict):
        raise RoutesError("routes.yaml: the top level must be a mapping")
    pricing = doc.get("pricing") or {}
    located: list[tuple[str, RouteSpec]] = []
    for i, raw in enumerate(doc.get("routes") or []):
        located.append((f"routes[{i}]", _route(raw, f"routes[{i}]", pricing, limits)))
    for i, template in enumerate(doc.get("templates") or []):
        located.extend(_expand(template, f"templates[{i}]", pricing, limits))
    routes = [route for _, route in located]
    _check_unique(routes, [where for where, _ in located])
    return routes


def _expand(
    template: Any, where: str, pricing: Mapping[str, Any], limits: Mapping[str, tuple[int, int]]
) -> list[tuple[str, RouteSpec]]:
    if not isinstance(template, dict):
        raise RoutesError(f"{where}: a template must be a mapping")
    methods = template.get("methods")
    matrices = template.get("expand")
    if not isinstance(methods, dict) or not methods:
        raise RoutesError(f"{where}.methods: a template needs a non-empty mapping of methods")
    if not isinstance(matrices, list) or not matrices:
        raise RoutesError(f"{where}.expand: a template needs a list of matrices")
    body = {k: v for k, v in template.items() if k not in ("methods", "expand")}
    routes: list[tuple[str, RouteSpec]] = []
    for m, matrix in enumerate(matrices):
        if not isinstance(matrix, dict) or set(matrix) - {"cluster", "provider"}:
            raise RoutesError(f"{where}.expand[{m}]: a matrix maps cluster and provider to lists")
        axes = [[(k, v) for v in (vals if isinstance(vals, list) else [vals])] for k, vals in matrix.items()]
        for combo in itertools.product(*axes):
            for method, method_spec in methods.items():
                values = dict(combo, method=method)
                raw = _fill(body, values)
                raw.update(
                    _method_fields(_fill(method_spec or {}, values), method, f"{where}.methods.{method}")
                )
                at = f"{where}[{'/'.join(values.values())}]"
                routes.append((at, _route(raw, at, pricing, limits)))
    return routes


def _method_fields(spec: Any, method: str, where: str) -> dict[str, Any]:
    """A template method's description and params schema -> route fields (JSON-RPC body schema)."""
    if not isinstance(spec, dict):
        raise RoutesError(f"{where}: must be a mapping")
    unknown = set(spec) - METHOD_KEYS
    if unknown:
        raise RoutesError(f"{where}: unknown field(s) {sorted(unknown)} (known: {sorted(METHOD_KEYS)})")
    fields: dict[str, Any] = {"description": spec.get("description", method)}
    params = spec.get("params", {"type": "array"})
    fields["input"] = {
        "body": {
            "type": "object",
            "additionalProperties": False,
            "required": ["params"],
            "properties": {
                "jsonrpc": {"type": "string", "const": "2.0"},
                "id": {"type": ["string", "integer", "null"]},
                "method": {"type": "string", "const": method},
                "params": params,
            },
        }
    }
    fields["output"] = spec.get("output") or {
        "type": "object",
        "required": ["jsonrpc", "result"],
        "properties": {"jsonrpc": {"const": "2.0"}, "id": {}, "result": {}},
    }
    if "forward_params" in spec:
        fields["forward_params"] = spec["forward_params"]
    return fields


def _fill(value: Any, values: Mapping[str, str]) -> Any:
    """Replace {cluster}/{provider}/{method} in every string; other braces (regexes) stay."""
    if isinstance(value, str):
        for key, sub in values.items():
            value = value.replace("{" + key + "}", sub)
        return value
    if isinstance(value, dict):
        return {k: _fill(v, values) for k, v in value.items()}
    if isinstance(value, list):
        return [_fill(v, values) for v in value]
    return value


def _route(
    raw: Any, where: str, pricing: Mapping[str, Any], limits: Mapping[str, tuple[int, int]]
) -> RouteSpec:
    if not isinstance(raw, dict):
        raise RoutesError(f"{where}: a route must be a mapping")
    unknown = set(raw) - ROUTE_KEYS
    if unknown:
        raise RoutesError(f"{where}: unknown field(s) {sorted(unknown)}")
    for key in ("name", "path", "method", "access", "handler"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise RoutesError(f"{where}.{key}: required string")
    name = raw["name"]
    where = f"{where} ({name})"
    if not raw["path"].startswith("/"):
        raise RoutesError(f"{where}.path: must start with /")
    method = raw["method"].upper()
    if method not in HTTP_METHODS:
        raise RoutesError(f"{where}.method: {raw['method']!r} is not one of {sorted(HTTP_METHODS)}")
    access = raw["access"]
    if access not in ACCESS_MODES:
        raise RoutesError(f"{where}.access: {access!r} is not one of {list(ACCESS_MODES)}")
    if raw["handler"] not in HANDLERS:
        raise RoutesError(f"{where}.handler: unknown handler {raw['handler']!r}")
    upstream = raw.get("upstream")
    if upstream is not None and upstream not in UPSTREAM_ENV:
        raise RoutesError(f"{where}.upstream: unknown upstream {upstream!r} (known: {sorted(UPSTREAM_ENV)})")
    if raw["handler"] in ("jsonrpc", "tokens") and upstream is None:
        raise RoutesError(f"{where}.upstream: a {raw['handler']} route needs an upstream")
    price = _price(raw.get("price"), f"{where}.price", pricing)
    if access == "exact" and price is None:
        raise RoutesError(f"{where}.price: an exact route needs a price")
    if access != "exact" and price is not None:
        raise RoutesError(f"{where}.price: only exact routes carry a price")
    forward_params = raw.get("forward_params", "as_is")
    if forward_params not in ("as_is", "named"):
        raise RoutesError(f"{where}.forward_params: must be as_is or named")
    listed = raw.get("listed", True)
    if not isinstance(listed, bool):  # bool("false") is True: a typo must not publish a route
        raise RoutesError(f"{where}.listed: must be true or false")
    input_schemas = raw.get("input") or {}
    if not isinstance(input_schemas, dict) or set(input_schemas) - INPUT_LOCATIONS:
        raise RoutesError(f"{where}.input: maps path, query or body to a JSON Schema")
    try:
        for location, schema in input_schemas.items():
            check_schema(schema, f"{where}.input.{location}")
        if raw.get("output") is not None:
            check_schema(raw["output"], f"{where}.output")
    except SchemaError as exc:
        raise RoutesError(str(exc)) from exc
    rate_limits = _rate_limits(raw.get("rate_limits"), f"{where}.rate_limits", limits)
    try:
        return RouteSpec(
            name=name,
            path=raw["path"],
            method=method,
            access=access,
            handler=raw["handler"],
            group=str(raw.get("group") or "service"),
            description=str(raw.get("description") or name),
            upstream=upstream,
            upstream_path=raw.get("upstream_path"),
            operation=raw.get("operation"),
            price_micro_usdc=price,
            rate_limits=rate_limits,
            input=input_schemas,
            output=raw.get("output"),
            listed=listed,
            replay_cap_bytes=int(raw.get("replay_cap_bytes", DEFAULT_REPLAY_CAP_BYTES)),
            forward_params=forward_params,
        )
    except (TypeError, ValueError, msgspec.ValidationError) as exc:
        raise RoutesError(f"{where}: {exc}") from exc


def _price(raw: Any, where: str, pricing: Mapping[str, Any]) -> int | None:
    """Integer micro-USDC, or {pricing, unit}: ceil(units * per-unit price + settlement fee)."""
    if raw is None:
        return None
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw <= 0:
            raise RoutesError(f"{where}: must be a positive number of micro-USDC")
        return raw
    if not isinstance(raw, dict) or set(raw) != {"pricing", "unit"}:
        raise RoutesError(f"{where}: an integer of micro-USDC or {{pricing: <schedule>, unit: <name>}}")
    schedule = pricing.get(raw["pricing"])
    if not isinstance(schedule, dict):
        raise RoutesError(f"{where}.pricing: no pricing schedule {raw['pricing']!r}")
    units = (schedule.get("units") or {}).get(raw["unit"])
    if not isinstance(units, int) or units <= 0:
        raise RoutesError(f"{where}.unit: schedule {raw['pricing']!r} has no units for {raw['unit']!r}")
    try:
        per_unit = Decimal(str(schedule["micro_usdc_per_unit"]))
        fee = Decimal(str(pricing.get("settlement_fee_micro_usdc", 0)))
    except (KeyError, InvalidOperation) as exc:
        raise RoutesError(
            f"{where}: schedule {raw['pricing']!r} needs a numeric micro_usdc_per_unit"
        ) from exc
    return math.ceil(units * per_unit + fee)


def _rate_limits(raw: Any, where: str, limits: Mapping[str, tuple[int, int]]) -> tuple[RateLimitSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise RoutesError(f"{where}: must be a list")
    out: list[RateLimitSpec] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("scope"), str):
            raise RoutesError(f"{at}: needs a scope")
        limit = item.get("limit")
        if isinstance(limit, str):
            if limit not in limits:
                raise RoutesError(f"{at}.limit: unknown named limit {limit!r} (known: {sorted(limits)})")
            count, period_ms = limits[limit]
        elif _positive(limit) and isinstance(limit, int) and _positive(item.get("period_seconds")):
            count, period_ms = limit, int(item["period_seconds"] * 1000)
        else:
            raise RoutesError(f"{at}.limit: a named limit or a positive integer with period_seconds")
        per = item.get("per", "scope")
        if per not in ("scope", "wallet"):
            raise RoutesError(f"{at}.per: must be scope or wallet")
        out.append(RateLimitSpec(scope=item["scope"], limit=count, period_ms=period_ms, per=per))
    return tuple(out)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _check_unique(routes: list[RouteSpec], locations: list[str]) -> None:
    """No two routes share a name or a method and path; the error names both YAML locations."""
    names: dict[str, str] = {}
    paths: dict[tuple[str, str], str] = {}
    for route, where in zip(routes, locations, strict=True):
        if route.name in names:
            raise RoutesError(
                f"{where}.name: duplicate route name {route.name!r} (first at {names[route.name]})"
            )
        key = (route.path, route.method)
        if key in paths:
            raise RoutesError(
                f"{where}.path: duplicate route {route.method} {route.path} (first at {paths[key]})"
            )
        names[route.name] = where
        paths[key] = where


def unmounted_reason(route: RouteSpec, settings: Settings) -> str | None:
    """Why ``route`` cannot be served with this configuration, or None when it can."""
    if route.upstream is not None and not settings.upstream_url(route.upstream):
        return f"{UPSTREAM_ENV[route.upstream]} unset"
    if route.handler == "tokens" and not settings.asset_api_key:
        return "ASSET_API_KEY unset"
    if route.access == "exact":
        if not settings.pay_to:
            return "X402_PAY_TO_WALLET unset"
        if settings.uses_internal_facilitator and not settings.facilitator_wallet:
            return "FACILITATOR_URL=internal but FACILITATOR_WALLET_BASE58 unset"
        if settings.facilitator_url == CDP_FACILITATOR_URL and not (
            settings.facilitator_api_key_id and settings.facilitator_api_key_secret
        ):
            return "FACILITATOR_API_KEY_ID or FACILITATOR_API_KEY_SECRET unset"
    return None


def plan_routes(routes: list[RouteSpec], settings: Settings) -> tuple[list[RouteSpec], list[str]]:
    """Split into the routes to mount and one start-up line per reason others are left out."""
    mounted: list[RouteSpec] = []
    skipped: dict[str, list[RouteSpec]] = {}
    for route in routes:
        reason = unmounted_reason(route, settings)
        if reason is None:
            mounted.append(route)
        else:
            skipped.setdefault(reason, []).append(route)
    notes = []
    for reason, group in skipped.items():
        groups = sorted({r.group for r in group})
        notes.append(f"not mounted: {len(group)} route(s) of {', '.join(groups)} ({reason})")
    mounted.sort(key=lambda r: r.has_path_params)
    return mounted, notes
