"""routes.yaml -> validated, expanded :class:`RouteSpec` list.

Everything an operator may change per route (path, price, limits, schemas, the method
allowlist) lives in the YAML; this module only expands templates and checks them. Every error
names its file, line and YAML location, e.g. ``routes.yaml:212: routes[3] (tokens.search).access``,
and every problem of the table is reported at once.
"""

from __future__ import annotations

import difflib
import itertools
import logging
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from gateway.config import GATEWAY_VARIABLES, UPSTREAM_VARIABLE, Settings
from gateway.routing import yaml_document
from gateway.routing.settlement_cost import lamports_covered
from gateway.routing.validation import InvalidInput, SchemaError, check_schema, compile_schema
from gateway.routing.vocabulary import (
    ACCESS_MODES,
    CREDIT_METHOD,
    HANDLERS,
    PAYMENT_METHODS,
    SERVICE_GROUP,
    Handler,
    is_provider_group,
)
from gateway.telemetry.logs import log_event

HTTP_METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}
INPUT_LOCATIONS = {"path", "query", "body"}
ROUTE_KEYS = {
    "name", "path", "method", "access", "accepts", "handler", "group", "upstream", "upstream_path",
    "operation", "price", "rate_limits", "input", "output", "description", "listed", "replay_cap_bytes",
    "credit_price",
}  # fmt: skip
METHOD_KEYS = {"description", "params", "example", "output"}
DEFAULT_REPLAY_CAP_BYTES = 1024 * 1024


TOP_LEVEL_KEYS = {"version", "pricing", "upstreams", "routes", "templates"}
"""Keys of the route table itself; ``x-`` keys (YAML anchors such as ``x-schemas``) are free."""
SUPPORTED_VERSIONS = (1,)
PRICING_KEYS = {"unit", "micro_usdc_per_unit", "units"}
PRICING_SETTINGS = {"settlement_fee_micro_usdc", "sol_price_usd"}
"""Keys of the pricing block that are not schedules."""


class RoutesError(ValueError):
    """The route table is invalid: every problem, each naming the file and its YAML location."""

    def __init__(self, problems: list[str] | str) -> None:
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        super().__init__("\n".join(self.problems))


class RateLimitSpec(msgspec.Struct, frozen=True):
    """``limit`` requests per ``period_ms`` in the bucket ``scope``: the whole scope's, or each
    wallet's (per=wallet) or each client IP's (per=ip) own."""

    scope: str
    limit: int
    period_ms: int
    per: Literal["scope", "wallet", "ip"] = "scope"
    share_of: str | None = None
    """A per-wallet or per-IP limit that is a share of this whole-scope limit of the same route:
    it binds only while other clients wait for that budget (refused by it within its period),
    so a client alone may use all of it (``gateway.store.base.Share``)."""


class InternalSettlement(msgspec.Struct, frozen=True):
    """What the route table states for the settlements our own fee payer broadcasts (the
    internal facilitator): the settlement fee its prices carry, and the SOL price that fee was
    derived at (None: not stated, so start-up has nothing to compare the compute caps with)."""

    fee_micro_usdc: int = 0
    sol_price_usd: Decimal | None = None

    @property
    def fee_lamports(self) -> int | None:
        """The lamports of Solana fee the settlement fee pays for at the stated SOL price."""
        if self.sol_price_usd is None:
            return None
        return lamports_covered(self.fee_micro_usdc, self.sol_price_usd)


class RouteSpec(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    path: str
    method: str
    access: str
    """A key of :data:`gateway.routing.vocabulary.ACCESS_MODES` (the loader refuses any other):
    ``public`` or ``internal``, or the first of the payment methods it accepts (whose 402 the
    route answers)."""
    handler: str
    """A key of :data:`gateway.routing.vocabulary.HANDLERS` (the loader refuses any other)."""
    group: str
    description: str
    upstream: str | None = None
    upstream_variable: str | None = None
    """The environment variable holding the upstream's URL (routes.yaml ``upstreams`` block)."""
    upstream_path: str | None = None
    operation: str | None = None
    provider_price_micro_usdc: int | None = None
    """Exact routes: the provider part of the price (units x the schedule's rate, or a literal);
    the facilitator that settles adds its settlement fee (:func:`gateway.routing.pricing.route_price`)."""
    credit_price_micro_usdc: int | None = None
    """What a call takes from prepaid credit when routes.yaml sets it (``credit_price``); unset,
    its provider part (:func:`credit_price`)."""
    rate_limits: tuple[RateLimitSpec, ...] = ()
    input: dict[str, dict[str, Any]] = msgspec.field(default_factory=dict)
    output: dict[str, Any] | None = None
    listed: bool = True
    replay_cap_bytes: int = DEFAULT_REPLAY_CAP_BYTES
    internal_settlement: InternalSettlement = msgspec.field(default_factory=InternalSettlement)
    """The table's terms for settling through the internal facilitator (one per table)."""
    accepts: tuple[str, ...] = ()
    """The payment methods it accepts (routes.yaml ``accepts``), first the one whose 402 it
    answers; a route built in code without them accepts its access mode alone."""

    @property
    def payment_methods(self) -> tuple[str, ...]:
        """The payment methods it lists (none for a public or internal route); which of them it
        takes under a configuration: :func:`accepted`."""
        if self.accepts:
            return self.accepts
        return (self.access,) if self.access in PAYMENT_METHODS else ()

    @property
    def has_path_params(self) -> bool:
        return "{" in self.path

    @property
    def paid(self) -> bool:
        """Sold for USDC through a facilitator (its access mode says so)."""
        return ACCESS_MODES[self.access].paid


def named_limits(settings: Settings) -> dict[str, tuple[int, int]]:
    """Rate limits routes.yaml may name, from the environment: name -> (limit, period_ms).

    A payer's own limit on a paid scope defaults to the scope's limit, so one honest client may
    use all of an idle scope; one wallet's or one IP's share of the asset-data key is a
    percentage of its budget that binds only while others wait for the key (routes.yaml
    ``share_of``), so a client alone may use all of it and a flood of throwaway wallets from one
    IP still leaves the rest to others; a sign-in-only route without such a budget (the credit
    balance) has its own per-IP and per-wallet limits."""
    wallet = settings.rate_limit_wallet_rps
    tokens = settings.rate_limit_tokens_per_minute
    share = max(1, math.ceil(tokens * settings.rate_limit_tokens_share_percent / 100))
    return {
        "rpc": (settings.rate_limit_rpc_rps, 1000),
        "das": (settings.rate_limit_das_rps, 1000),
        "tokens": (tokens, 60_000),
        "challenge": (settings.rate_limit_challenge_per_minute, 60_000),
        "rpc_wallet": (wallet or settings.rate_limit_rpc_rps, 1000),
        "das_wallet": (wallet or settings.rate_limit_das_rps, 1000),
        "tokens_share": (share, 60_000),
        "sign_in_ip": (settings.rate_limit_sign_in_ip_per_minute, 60_000),
        "sign_in_wallet": (settings.rate_limit_sign_in_wallet_per_minute, 60_000),
    }


def load_routes(path: Path, limits: Mapping[str, tuple[int, int]]) -> list[RouteSpec]:
    """Read, expand and validate the route table at ``path``; errors name the file."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except IsADirectoryError:
        raise RoutesError(f"{source}: is a directory, not a route table file") from None
    except FileNotFoundError:
        raise RoutesError(f"{source}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise RoutesError(f"{source}: cannot read: {exc}") from None
    try:
        doc, root = yaml_document.parse(text)
    except yaml.YAMLError as exc:
        syntax = _yaml_syntax(exc)
        raise RoutesError(f"{source}:{syntax}" if syntax[0].isdigit() else f"{source}: {syntax}") from None
    return parse_routes(doc, limits, source, YamlLines(root))


def _yaml_syntax(exc: yaml.YAMLError) -> str:
    """``L:C: <problem>`` (line and column, 1-based as editors count) for a YAML syntax error."""
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    context = getattr(exc, "context", None)
    what = f"{context}, {problem}" if context else problem
    if mark is None:
        return f"YAML syntax error: {what}"
    return f"{mark.line + 1}:{mark.column + 1}: YAML syntax error: {what}"


_LOCATION_NOISE = re.compile(r" \([^)]*\)|\[[^\]]*/[^\]]*\]")  # "(route name)", "[cluster/provider/method]"
_LOCATION_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


class YamlLines:
    """The line of every key and list item of a YAML text, to point a problem at its place."""

    def __init__(self, root: yaml.Node | None) -> None:
        self.lines: dict[tuple[str, ...], int] = {}
        if root is not None:
            self._walk(root, (), 0)

    def _walk(self, node: yaml.Node, path: tuple[str, ...], depth: int) -> None:
        if depth > 64:
            return
        if isinstance(node, yaml.MappingNode):
            children = [(str(k.value), v, k) for k, v in node.value if isinstance(k, yaml.ScalarNode)]
        elif isinstance(node, yaml.SequenceNode):
            children = [(str(i), item, item) for i, item in enumerate(node.value)]
        else:
            return
        for step, value, marked in children:
            self.lines.setdefault((*path, step), marked.start_mark.line + 1)
            self._walk(value, (*path, step), depth + 1)

    def line(self, where: str) -> int | None:
        """The line of ``where`` (e.g. ``routes[3] (name).access``), or of its nearest parent."""
        steps = [key or index for key, index in _LOCATION_STEP.findall(_LOCATION_NOISE.sub("", where))]
        while steps:
            found = self.lines.get(tuple(steps))
            if found is not None:
                return found
            steps.pop()
        return None


class _Problems:
    """Every problem of one table, each prefixed with the source file (and line, when known)."""

    def __init__(self, source: str, lines: YamlLines | None) -> None:
        self.source = source
        self.lines = lines
        self.items: list[str] = []
        self.found: list[tuple[str, str, str]] = []
        """(where, message, key) of every item, for :func:`_expand` to merge one cause's repeats."""
        self._lines: list[int | None] = []

    def add(self, where: str, message: str, key: str = "") -> None:
        """``key``: the (unknown) key below ``where`` whose line the problem points at."""
        place = f"{where}.{key}" if key else where
        line = self.lines.line(place) if self.lines is not None and where else None
        at = f"{self.source}:{line}" if line is not None else self.source
        self.items.append(f"{at}: {where}: {message}" if where else f"{at}: {message}")
        self.found.append((where, message, key))
        self._lines.append(line)

    def said_once(self) -> list[str]:
        """The items, a problem of one line said once: a YAML anchor (``&top_up``) merged into
        several routes would repeat it for each; the one line names every route it reaches."""
        places: dict[tuple[int, str], list[str]] = {}
        for (where, message, _), line in zip(self.found, self._lines, strict=True):
            if line is not None and where:
                places.setdefault((line, message), []).append(where)
        out: list[str] = []
        for item, (where, message, _), line in zip(self.items, self.found, self._lines, strict=True):
            shared = places.get((line, message), []) if line is not None else []
            if len(shared) < 2:
                out.append(item)
            elif shared[0] == where:
                out.append(f"{self.source}:{line}: {', '.join(shared)}: {message}")
        return out

    def apart(self) -> _Problems:
        """A fresh list for the same file, whose problems the caller merges back."""
        return _Problems(self.source, self.lines)


def did_you_mean(word: object, known: Iterable[str]) -> str:
    """`` (did you mean 'access'?)`` when ``word`` is a likely misspelling of one of ``known``."""
    close = difflib.get_close_matches(str(word), list(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_keys(unknown: Iterable[object], known: Iterable[str]) -> str:
    """``unknown field(s) ['acess'] (did you mean 'access'?)``: each misspelling with its key."""
    names = sorted(map(str, unknown))
    known = list(known)
    hints = [(name, close[0]) for name in names if (close := difflib.get_close_matches(name, known, n=1))]
    if not hints:
        return f"unknown field(s) {names}"
    if len(names) == 1:
        return f"unknown field(s) {names} (did you mean {hints[0][1]!r}?)"
    meant = ", ".join(f"{right!r} for {wrong!r}" for wrong, right in hints)
    return f"unknown field(s) {names} (did you mean {meant}?)"


def parse_routes(
    doc: Any,
    limits: Mapping[str, tuple[int, int]],
    source: str = "routes.yaml",
    lines: YamlLines | None = None,
) -> list[RouteSpec]:
    """Expand and validate an already-parsed route table; :class:`RoutesError` lists every problem
    (with its line when ``lines`` of the source text are given)."""
    problems = _Problems(source, lines)
    if doc is None:
        raise RoutesError(f"{source}: the file is empty (expected version, pricing, routes, templates)")
    if not isinstance(doc, dict):
        raise RoutesError(f"{source}: the top level must be a mapping, got {_kind(doc)}")
    for key in doc:
        if not (isinstance(key, str) and (key in TOP_LEVEL_KEYS or key.startswith("x-"))):
            problems.add(
                str(key),
                f"unknown top-level key{did_you_mean(key, TOP_LEVEL_KEYS)} "
                f"(known: {', '.join(sorted(TOP_LEVEL_KEYS))}, or x-...)",
            )
    version = doc.get("version", 1)
    if isinstance(version, bool) or version not in SUPPORTED_VERSIONS:
        problems.add("version", f"unsupported version {version!r} (this gateway reads version 1)")
    table = _Table(
        pricing=_pricing(doc.get("pricing"), problems),
        upstreams=_upstreams(doc.get("upstreams"), problems),
        limits=limits,
    )
    located: list[tuple[str, RouteSpec]] = []
    for i, raw in enumerate(_list(doc, "routes", problems)):
        route = _route(raw, f"routes[{i}]", table, problems)
        if route is not None:
            located.append((f"routes[{i}]", route))
    for i, template in enumerate(_list(doc, "templates", problems)):
        located.extend(_expand(template, f"templates[{i}]", table, problems))
    _check_unique(located, problems)
    _check_catalog_filter(located, problems)
    if problems.items:
        raise RoutesError(problems.said_once())
    if table.deprecated:
        log_event(
            f"{source}: {len(table.deprecated)} route(s) name a payment method as access; read as "
            f"accepts (first: {table.deprecated[0]}); write accepts: [...] instead",
            logging.WARNING,
        )
    return [route for _, route in located]


def _kind(value: Any) -> str:
    """How a YAML value reads to an operator: ``the text 'ten'``, ``a list``, ``a mapping``."""
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, int | float):
        return f"the number {value}"
    if value is None:
        return "nothing (null)"
    return (
        "a list"
        if isinstance(value, list)
        else "a mapping"
        if isinstance(value, dict)
        else type(value).__name__
    )


def _list(doc: Mapping[str, Any], key: str, problems: _Problems) -> list[Any]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        problems.add(key, f"must be a list, got {_kind(value)}")
        return []
    return value


def _number(value: Any) -> Decimal | None:
    """A YAML number or numeric text as a Decimal; None for anything else (booleans included)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def _pricing(raw: Any, problems: _Problems) -> dict[str, Any]:
    """The pricing block, each value checked; a schedule with a bad value maps to None (reported
    once here, not again by every route priced from it)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.add("pricing", f"must be a mapping of schedules, got {_kind(raw)}")
        return {}
    pricing: dict[str, Any] = {}
    sol_price = raw.get("sol_price_usd")
    if sol_price is not None:
        if (_number(sol_price) or 0) <= 0:
            problems.add("pricing.sol_price_usd", f"must be a positive number, got {_kind(sol_price)}")
        else:
            pricing["sol_price_usd"] = _number(sol_price)
    fee = raw.get("settlement_fee_micro_usdc", 0)
    if isinstance(fee, bool) or not isinstance(fee, int) or fee < 0:
        where = "pricing.settlement_fee_micro_usdc"
        problems.add(where, f"must be a whole number of micro-USDC >= 0, got {_kind(fee)}")
    else:
        pricing["settlement_fee_micro_usdc"] = fee
    for name, schedule in raw.items():
        if name in PRICING_SETTINGS:
            continue
        where = f"pricing.{name}"
        if not isinstance(schedule, dict):
            problems.add(
                where, f"must be a mapping with micro_usdc_per_unit and units, got {_kind(schedule)}"
            )
            pricing[name] = None
            continue
        before = len(problems.items)
        unknown = sorted(set(schedule) - PRICING_KEYS)
        if unknown:
            problems.add(where, f"{unknown_keys(unknown, PRICING_KEYS)} (known: {sorted(PRICING_KEYS)})")
        per_unit = schedule.get("micro_usdc_per_unit")
        if _number(per_unit) is None or (_number(per_unit) or 0) <= 0:
            problems.add(f"{where}.micro_usdc_per_unit", f"must be a positive number, got {_kind(per_unit)}")
        units = schedule.get("units")
        if not isinstance(units, dict):
            problems.add(f"{where}.units", f"must map method names to numbers of units, got {_kind(units)}")
        else:
            for method, count in units.items():
                if isinstance(count, bool) or not isinstance(count, int | float) or count <= 0:
                    problems.add(f"{where}.units.{method}", f"must be a positive number, got {_kind(count)}")
        pricing[name] = schedule if len(problems.items) == before else None
    return pricing


class _Table(msgspec.Struct, frozen=True):
    """What every route of one table is checked against: its pricing, upstreams and named limits."""

    pricing: dict[str, Any]
    upstreams: dict[str, str]
    limits: Mapping[str, tuple[int, int]]
    deprecated: list[str] = msgspec.field(default_factory=list)
    """Where a route names a payment method as its ``access`` (read as its ``accepts``)."""

    @property
    def internal_settlement(self) -> InternalSettlement:
        return InternalSettlement(
            fee_micro_usdc=self.pricing.get("settlement_fee_micro_usdc", 0),
            sol_price_usd=self.pricing.get("sol_price_usd"),
        )


def _upstreams(raw: Any, problems: _Problems) -> dict[str, str]:
    """The ``upstreams`` block: upstream name -> the environment variable holding its URL."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.add("upstreams", f"must map upstream names to variable names, got {_kind(raw)}")
        return {}
    upstreams: dict[str, str] = {}
    for name, variable in raw.items():
        where = f"upstreams.{name}"
        if not isinstance(variable, str) or not UPSTREAM_VARIABLE.fullmatch(variable):
            problems.add(where, f"must name an environment variable (A-Z, 0-9, _), got {_kind(variable)}")
        elif variable in GATEWAY_VARIABLES:
            problems.add(where, f"{variable} is a setting of the gateway, not an upstream URL")
        else:
            upstreams[str(name)] = variable
    return upstreams


def _expand(template: Any, where: str, table: _Table, problems: _Problems) -> list[tuple[str, RouteSpec]]:
    if not isinstance(template, dict):
        problems.add(where, f"a template must be a mapping, got {_kind(template)}")
        return []
    methods = template.get("methods")
    matrices = template.get("expand")
    ok = True
    if not isinstance(methods, dict) or not methods:
        problems.add(f"{where}.methods", "a template needs a non-empty mapping of methods")
        ok = False
    if not isinstance(matrices, list) or not matrices:
        problems.add(f"{where}.expand", "a template needs a list of matrices")
        ok = False
    if not ok:
        return []
    assert isinstance(methods, dict) and isinstance(matrices, list)
    fields: dict[str, dict[str, Any]] = {}
    for method, method_spec in methods.items():
        found = _method_fields(method_spec or {}, method, f"{where}.methods.{method}", problems)
        if found is not None:
            fields[method] = found
    body = {k: v for k, v in template.items() if k not in ("methods", "expand")}
    routes: list[tuple[str, RouteSpec]] = []
    expanded: list[_Expanded] = []
    for m, matrix in enumerate(matrices):
        if not isinstance(matrix, dict) or set(matrix) - {"cluster", "provider"}:
            problems.add(f"{where}.expand[{m}]", "a matrix maps cluster and provider to lists")
            continue
        axes = [[(k, v) for v in (vals if isinstance(vals, list) else [vals])] for k, vals in matrix.items()]
        for combo in itertools.product(*axes):
            for method, method_fields in fields.items():
                values = dict(combo, method=method)
                raw = _fill(body, values)
                raw.update(_fill(method_fields, values))
                at = f"{where}[{'/'.join(values.values())}]"
                own = problems.apart()
                route = _route(raw, at, table, own)
                expanded.append(_Expanded(at, str(raw.get("name")), values, own.found))
                if route is not None:
                    routes.append((at, route))
    name = template.get("name")
    _merge_causes(expanded, f"{where} ({name})" if isinstance(name, str) else where, problems)
    return routes


_HINTS = re.compile(r" \([^()]*\)")


class _Expanded(msgspec.Struct, frozen=True):
    """One route a template expanded to: its location, name and problems (where, message)."""

    at: str
    name: str
    values: dict[str, str]
    """The template's placeholders as this route filled them (cluster, provider, method)."""
    found: list[tuple[str, str, str]]

    def cause(self, message: str) -> str:
        """``message`` as the template says it: each filled value back to its placeholder, the
        parenthesized hints (which quote the filled values) left out."""
        for key, value in self.values.items():
            message = message.replace(value, "{" + key + "}")
        return _HINTS.sub("", message)

    def field(self, where: str) -> str:
        """``where`` without this route's own location: ``.handler``, ``.input.body...``."""
        rest = where[len(self.at) :]
        return rest.removeprefix(f" ({self.name})")


def _merge_causes(expanded: list[_Expanded], template: str, problems: _Problems) -> None:
    """Add each problem of a template's routes once per cause (same field, same message), at the
    template when several routes share it, with how many of its routes it affects: one typo in a
    template is one line, not one per route expanded from it."""
    causes: dict[tuple[str, str], list[tuple[_Expanded, str, str, str]]] = {}
    for route in expanded:
        for where, message, key in route.found:
            cause = (route.field(where), route.cause(message))
            causes.setdefault(cause, []).append((route, where, message, key))
    for (field, _), found in causes.items():
        route, where, message, key = found[0]
        if len(found) == 1:
            problems.add(where, message, key)
            continue
        share = (
            f"all {len(expanded)} routes of the template"
            if len(found) == len(expanded)
            else f"{len(found)} of the template's {len(expanded)} routes"
        )
        example = "" if all(said == message for _, _, said, _ in found) else f", e.g. {route.name}"
        problems.add(f"{template}{field}", f"{message} [affects {share}{example}]", key)


def _method_fields(spec: Any, method: str, where: str, problems: _Problems) -> dict[str, Any] | None:
    """A template method's description, params schema and example -> route fields (JSON-RPC body
    schema, whose ``examples`` hold the one call built from the method's ``example`` params).

    The body is open: fields other than jsonrpc, id, method and params are ignored (the proxy
    builds the upstream request from these four alone), as JSON-RPC clients add their own. The
    example defaults to no params, right for a method that takes none; the loader refuses it
    where the schema does (see :func:`_check_body_examples`).
    """
    if not isinstance(spec, dict):
        problems.add(where, f"must be a mapping, got {_kind(spec)}")
        return None
    unknown = set(spec) - METHOD_KEYS
    if unknown:
        problems.add(where, f"{unknown_keys(unknown, METHOD_KEYS)} (known: {sorted(METHOD_KEYS)})")
        return None
    fields: dict[str, Any] = {"description": spec.get("description", method)}
    params = spec.get("params", {"type": "array"})
    example = {"jsonrpc": "2.0", "id": 1, "method": method, "params": spec.get("example", [])}
    fields["input"] = {
        "body": {
            "type": "object",
            "required": ["params"],
            "properties": {
                "jsonrpc": {"const": "2.0"},
                "id": {"type": ["string", "integer", "null"]},
                "method": {"const": method},
                "params": params,
            },
            "examples": [example],
        }
    }
    fields["output"] = spec.get("output") or {
        "type": "object",
        "required": ["jsonrpc", "result"],
        "properties": {"jsonrpc": {"const": "2.0"}, "id": {}, "result": {}},
    }
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


def _route(raw: Any, where: str, table: _Table, problems: _Problems) -> RouteSpec | None:
    """One route, or None after adding every problem it has to ``problems``."""
    if not isinstance(raw, dict):
        problems.add(where, f"a route must be a mapping, got {_kind(raw)}")
        return None
    before = len(problems.items)
    unknown = set(raw) - ROUTE_KEYS
    if unknown:
        problems.add(where, unknown_keys(unknown, ROUTE_KEYS), str(sorted(map(str, unknown))[0]))
    # a misspelt key (``acess:``) is one cause: its "did you mean" says the right key is missing
    meant = {close[0] for key in unknown if (close := difflib.get_close_matches(str(key), ROUTE_KEYS, n=1))}
    for key in ("name", "path", "method", "access", "handler"):
        if key == "access" and ("accepts" in raw or "accepts" in meant):
            continue  # a paid or sign-in route lists its methods instead
        if (not isinstance(raw.get(key), str) or not raw[key]) and not (key in meant and key not in raw):
            problems.add(f"{where}.{key}", f"required text, got {_kind(raw.get(key))}")
    if len(problems.items) > before:
        return None
    name = raw["name"]
    where = f"{where} ({name})"

    def bad(field: str, message: str) -> None:
        problems.add(f"{where}.{field}", message)

    if not raw["path"].startswith("/"):
        bad("path", f"must start with /, got {raw['path'][:60]!r}")
    method = raw["method"].upper()
    if method not in HTTP_METHODS:
        bad("method", f"{raw['method']!r} is not one of {sorted(HTTP_METHODS)}")
    handler = HANDLERS.get(raw["handler"])
    accepts = _accepts(raw, where, handler, table, problems)
    access = accepts[0] if accepts else str(raw.get("access") or "")
    routable = [name for name, mode in ACCESS_MODES.items() if not mode.beside_only]
    if handler is None:
        hint = did_you_mean(raw["handler"], HANDLERS)
        bad("handler", f"unknown handler {raw['handler']!r}{hint} (known: {', '.join(sorted(HANDLERS))})")
    upstream = raw.get("upstream")
    if upstream is not None and upstream not in table.upstreams:
        bad(
            "upstream",
            f"unknown upstream {upstream!r}{did_you_mean(upstream, table.upstreams)} "
            f"(declare it under upstreams; known: {sorted(table.upstreams)})",
        )
    if handler is not None and handler.needs_upstream and upstream is None:
        bad("upstream", f"a {raw['handler']} route needs an upstream")
    pricing = table.pricing
    price = _price(raw.get("price"), f"{where}.price", pricing, problems)
    paid = access in routable and ACCESS_MODES[access].paid
    known = access in routable  # else its one cause is said at access or accepts
    if paid and raw.get("price") is None:
        bad("price", "an exact route needs a price")
    if known and not paid and raw.get("price") is not None:
        bad("price", "only exact routes carry a price")
    credit = _price(raw.get("credit_price"), f"{where}.credit_price", pricing, problems)
    sells_credit = handler is not None and handler.sells_credit
    if raw.get("credit_price") is not None and (not paid or sells_credit):
        bad("credit_price", "only a paid route that does not sell credit has a credit price")
    elif raw.get("credit_price") is not None and CREDIT_METHOD not in accepts:
        bad("credit_price", f"the route does not accept credit: add {CREDIT_METHOD} to its accepts")
    if CREDIT_METHOD in accepts and (not paid or sells_credit):
        bad("accepts", f"{CREDIT_METHOD} is accepted only on a paid route that does not sell credit")
    if sells_credit and (not paid or not isinstance(raw.get("price"), int)):
        bad("price", "a top-up is an exact route whose price is a literal number of micro-USDC")
    listed = raw.get("listed", True)
    if not isinstance(listed, bool):  # bool("false") is True: a typo must not publish a route
        bad("listed", f"must be true or false, got {_kind(listed)}")
    replay_cap = raw.get("replay_cap_bytes", DEFAULT_REPLAY_CAP_BYTES)
    if isinstance(replay_cap, bool) or not isinstance(replay_cap, int) or replay_cap < 0:
        bad("replay_cap_bytes", f"must be a whole number of bytes >= 0, got {_kind(replay_cap)}")
    for key in ("group", "description", "upstream_path", "operation"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            bad(key, f"must be text, got {_kind(raw[key])}")
    input_schemas = raw.get("input") or {}
    if not isinstance(input_schemas, dict) or set(input_schemas) - INPUT_LOCATIONS:
        bad("input", "maps path, query or body to a JSON Schema")
        input_schemas = {}
    schemas = [(f"{where}.input.{loc}", schema) for loc, schema in input_schemas.items()]
    if raw.get("output") is not None:
        schemas.append((f"{where}.output", raw["output"]))
    for at, schema in schemas:
        try:
            check_schema(schema, at)
        except SchemaError as exc:  # its message starts with the location it was given
            location, _, message = str(exc).partition(": ")
            problems.add(location, message)
    if len(problems.items) == before and isinstance(input_schemas.get("body"), dict):
        _check_body_examples(input_schemas["body"], paid, f"{where}.input.body", problems)
    rate_limits = _rate_limits(raw.get("rate_limits"), f"{where}.rate_limits", access, table.limits, problems)
    if len(problems.items) > before:
        return None
    return RouteSpec(
        name=name,
        path=raw["path"],
        method=method,
        access=access,
        handler=raw["handler"],
        group=str(raw.get("group") or SERVICE_GROUP),
        description=str(raw.get("description") or name),
        upstream=upstream,
        upstream_variable=table.upstreams.get(upstream) if upstream is not None else None,
        upstream_path=raw.get("upstream_path"),
        operation=raw.get("operation"),
        provider_price_micro_usdc=price,
        credit_price_micro_usdc=credit,
        accepts=accepts,
        internal_settlement=table.internal_settlement,
        rate_limits=rate_limits,
        input=input_schemas,
        output=raw.get("output"),
        listed=listed,
        replay_cap_bytes=replay_cap,
    )


UNPAID_ACCESS = ("public", "internal")
"""What ``access`` names: a route nobody pays for. A paid or sign-in route lists ``accepts``."""


def _accepts(
    raw: dict[str, Any], where: str, handler: Handler | None, table: _Table, problems: _Problems
) -> tuple[str, ...]:
    """The payment methods a route accepts: its ``accepts`` list, checked; or, from a table that
    names a payment method as its ``access`` (the form before ``accepts``), that method with credit
    beside a paid route that does not sell credit, as such a table always meant (a deprecation
    the loader logs). Empty for a public or internal route."""
    methods = [name for name, mode in PAYMENT_METHODS.items() if not mode.beside_only]
    if "accepts" not in raw:
        access = raw.get("access")
        if not isinstance(access, str) or not access or access in UNPAID_ACCESS:
            return ()
        if access not in methods:
            known = [name for name, mode in ACCESS_MODES.items() if not mode.beside_only]
            problems.add(f"{where}.access", f"{access!r} is not one of {known}{did_you_mean(access, known)}")
            return ()
        beside = ACCESS_MODES[access].paid and not (handler is not None and handler.sells_credit)
        accepts = (access, CREDIT_METHOD) if beside else (access,)
        table.deprecated.append(f"{where}: access: {access} -> accepts: [{', '.join(accepts)}]")
        return accepts
    given = raw["accepts"]
    if "access" in raw:
        problems.add(
            f"{where}.access", "give access (public or internal) or accepts (payment methods), not both"
        )
    if not isinstance(given, list) or not given or not all(isinstance(m, str) for m in given):
        problems.add(f"{where}.accepts", f"a non-empty list of payment methods, got {_kind(given)}")
        return ()
    unknown = [m for m in given if m not in PAYMENT_METHODS]
    for name in unknown:
        known = list(PAYMENT_METHODS)
        hint = did_you_mean(name, known) or (
            " (public and internal routes say so with access:)" if name in UNPAID_ACCESS else ""
        )
        problems.add(f"{where}.accepts", f"unknown payment method {name!r}{hint} (known: {', '.join(known)})")
    if len(set(given)) != len(given):
        problems.add(f"{where}.accepts", "names a payment method twice")
    if unknown or len(set(given)) != len(given):
        return ()
    if given[0] not in methods:
        problems.add(
            f"{where}.accepts",
            f"{given[0]} is accepted only beside another method; list one of {methods} first",
        )
        return ()
    return tuple(given)


def _check_body_examples(schema: Mapping[str, Any], paid: bool, where: str, problems: _Problems) -> None:
    """Every ``examples`` entry of a body schema must pass the schema: the catalog, the OpenAPI
    document and, for a paid route, the 402's ``bazaar`` extension (whose ``info`` is the first
    entry, or an empty object without one) show it as a call to copy, and a Bazaar indexer drops
    a listing whose example its own schema refuses."""
    examples = schema.get("examples")
    if examples is not None and (not isinstance(examples, list) or not examples):
        problems.add(f"{where}.examples", f"must be a non-empty list of bodies, got {_kind(examples)}")
        return
    hint = "a template method gives its params as `example`, a route its bodies as input.body.examples"
    validate = compile_schema(schema)
    if not examples:
        if paid:
            try:
                validate({}, "body")
            except InvalidInput as exc:
                problems.add(
                    f"{where}.examples",
                    f"a paid route's Bazaar listing needs an example call its schema accepts ({exc}); {hint}",
                )
        return
    for i, example in enumerate(examples):
        try:
            validate(example, "body")
        except InvalidInput as exc:
            problems.add(f"{where}.examples[{i}]", f"the schema refuses its own example ({exc}); {hint}")


def _check_catalog_filter(located: list[tuple[str, RouteSpec]], problems: _Problems) -> None:
    """A catalog route that lists its ``provider`` filter values lists exactly the provider groups
    of the table, so a provider added to the table is never refused by the catalog's own schema."""
    groups = provider_groups(route for _, route in located)
    for where, route in located:
        provider = ((route.input.get("query") or {}).get("properties") or {}).get("provider")
        values = provider.get("enum") if isinstance(provider, dict) else None
        if route.handler == "catalog" and isinstance(values, list) and sorted(map(str, values)) != groups:
            problems.add(
                f"{where} ({route.name}).input.query.properties.provider.enum",
                f"lists {', '.join(map(str, values))} but the provider groups of the table are "
                f"{', '.join(groups) or 'none'}: list exactly those",
            )


def _price(raw: Any, where: str, pricing: Mapping[str, Any], problems: _Problems) -> int | None:
    """The provider part of a price: integer micro-USDC, or {pricing, unit}: ceil(units *
    per-unit price). The settlement fee is the settling facilitator's, added per facilitator."""
    if raw is None:
        return None
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw <= 0:
            problems.add(where, f"must be a positive number of micro-USDC, got {raw}")
            return None
        return raw
    if (
        not isinstance(raw, dict)
        or set(raw) != {"pricing", "unit"}
        or not all(isinstance(v, str) for v in raw.values())
    ):
        problems.add(
            where, f"an integer of micro-USDC or {{pricing: <schedule>, unit: <name>}}, got {_kind(raw)}"
        )
        return None
    if raw["pricing"] in pricing and pricing[raw["pricing"]] is None:
        return None  # the schedule's own problem is already reported
    schedule = pricing.get(raw["pricing"])
    if not isinstance(schedule, dict):
        problems.add(f"{where}.pricing", f"no valid pricing schedule {raw['pricing']!r}")
        return None
    units = (schedule.get("units") or {}).get(raw["unit"])
    if units is None:
        problems.add(f"{where}.unit", f"schedule {raw['pricing']!r} has no units for {raw['unit']!r}")
        return None
    per_unit = Decimal(str(schedule["micro_usdc_per_unit"]))
    return math.ceil(Decimal(str(units)) * per_unit)


def _rate_limits(
    raw: Any, where: str, access: str, limits: Mapping[str, tuple[int, int]], problems: _Problems
) -> tuple[RateLimitSpec, ...]:
    mode = ACCESS_MODES.get(access)
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        problems.add(where, f"must be a list, got {_kind(raw)}")
        return ()
    enforced = mode.rate_limit_per if mode is not None else ()
    out: list[RateLimitSpec] = []
    places: list[str] = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("scope"), str):
            problems.add(at, "needs a scope")
            continue
        unknown = sorted(set(item) - {"scope", "limit", "period_seconds", "per", "share_of"})
        if unknown:
            known = ("limit", "per", "period_seconds", "scope", "share_of")
            problems.add(at, f"{unknown_keys(unknown, known)} (known: {', '.join(known)})")
            continue
        limit = item.get("limit")
        if isinstance(limit, str):
            if limit not in limits:
                problems.add(
                    f"{at}.limit",
                    f"unknown named limit {limit!r}{did_you_mean(limit, limits)} (known: {sorted(limits)})",
                )
                continue
            count, period_ms = limits[limit]
        elif _positive(limit) and isinstance(limit, int) and _positive(item.get("period_seconds")):
            count, period_ms = limit, int(item["period_seconds"] * 1000)
        else:
            problems.add(
                f"{at}.limit",
                "a named limit or a positive integer with period_seconds (a positive number), "
                f"got limit {_kind(limit)} and period_seconds {_kind(item.get('period_seconds'))}",
            )
            continue
        per = item.get("per", "scope")
        if per not in ("scope", "wallet", "ip"):
            problems.add(f"{at}.per", f"must be scope, wallet or ip, got {_kind(per)}")
            continue
        if per not in enforced:
            problems.add(
                at,
                f"a per-{per} limit cannot be enforced on {access} routes"
                if enforced
                else f"{access} routes run no rate limiter: remove their rate_limits",
            )
            continue
        share_of = item.get("share_of")
        if share_of is not None and not (isinstance(share_of, str) and per != "scope"):
            problems.add(f"{at}.share_of", "a per-wallet or per-IP limit's share_of names a scope")
            continue
        out.append(RateLimitSpec(item["scope"], count, period_ms, per, share_of))
        places.append(at)
    budgets = {spec.scope for spec in out if spec.per == "scope"}
    for at, spec in zip(places, out, strict=True):
        if spec.share_of is not None and spec.share_of not in budgets:
            problems.add(f"{at}.share_of", f"{spec.share_of!r} is no per-scope limit of this route")
    required = mode.required_per if mode is not None else ()
    missing = [per for per in required if all(spec.per != per for spec in out)]
    if missing and len(out) == len(raw):
        wanted = " and ".join(f"a per-{per}" for per in required)
        problems.add(
            where,
            f"a {access} route is free to call, so it needs {wanted} limit "
            f"(missing: {', '.join(missing)}; e.g. the named limits sign_in_ip, sign_in_wallet)",
        )
    return tuple(out)


def _positive(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def _check_unique(located: list[tuple[str, RouteSpec]], problems: _Problems) -> None:
    """No two routes share a name or a method and path; the error names both YAML locations."""
    names: dict[str, str] = {}
    paths: dict[tuple[str, str], str] = {}
    for where, route in located:
        if route.name in names:
            problems.add(
                f"{where}.name", f"duplicate route name {route.name!r} (first at {names[route.name]})"
            )
        key = (route.path, route.method)
        if key in paths:
            problems.add(
                f"{where}.path", f"duplicate route {route.method} {route.path} (first at {paths[key]})"
            )
        names.setdefault(route.name, where)
        paths.setdefault(key, where)


def provider_groups(routes: Iterable[RouteSpec]) -> list[str]:
    """The groups of ``routes`` an operator can switch off, sorted: every one but the service and
    internal groups. routes.yaml is their only declaration."""
    return sorted({r.group for r in routes if is_provider_group(r.group)})


def credit_price(route: RouteSpec) -> int | None:
    """What a call of ``route`` takes from prepaid credit: its own ``credit_price``, else its price
    without the settlement fee (no transaction is made). None where credit is not accepted."""
    if route.provider_price_micro_usdc is None or HANDLERS[route.handler].sells_credit:
        return None
    own = route.credit_price_micro_usdc
    return own if own is not None else route.provider_price_micro_usdc


def accepted(route: RouteSpec, credits_on: bool) -> tuple[str, ...]:
    """The ways of paying ``route`` takes, first the one whose 402 it answers: the methods it
    lists, credit only while credit is on (``CREDITS_ENABLED``) and where a call has a credit
    price."""
    takes_credit = credits_on and credit_price(route) is not None
    return tuple(m for m in route.payment_methods if m != CREDIT_METHOD or takes_credit)


def payment_methods(route: RouteSpec, settings: Settings) -> tuple[str, ...]:
    """The ways of paying ``route`` takes under ``settings`` (:func:`accepted`)."""
    return accepted(route, settings.credits_enabled)


def published(routes: Iterable[RouteSpec]) -> list[RouteSpec]:
    """The routes the catalog and the OpenAPI document describe: listed, of a published access mode."""
    return [r for r in routes if r.listed and ACCESS_MODES[r.access].published]


def sells_anything(routes: list[RouteSpec]) -> bool:
    """True when a paid or sign-in route is among ``routes``."""
    return any(ACCESS_MODES[r.access].sells for r in routes)
