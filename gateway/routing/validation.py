"""Request validation compiled once from the JSON Schemas in routes.yaml.

The catalog publishes the same schemas as ``inputSchema``, so the rules a client reads are the
rules the gateway enforces. Only a documented subset of JSON Schema is accepted; anything else
is a load error naming its YAML location (see :func:`check_schema`). A few ``x-`` keywords cover
what plain JSON Schema cannot say about query strings and pairs of fields:

* ``x-comma-list: {items, minItems, maxItems}`` on a string: a comma-separated list.
* ``x-combined-count: {fields, min, max}`` on an object: the summed length of list fields.
* ``x-not-less-than: {later: earlier}`` on an object: ``later >= earlier`` when both are given.
* ``x-named-params: {order: [names]}`` on JSON-RPC ``params``: the value may be given named (an
  object, or an array holding that one object) or positional (an array in ``order``; a ``null``
  leaves its parameter out; an empty ``order`` takes the named form only). Either form becomes
  the named object before the other rules run, so both forms are held to the same rules and
  forwarded the same way. ``aliases: {old: new}``
  renames a parameter's other documented name (given both ways, the request is refused).

A ``default`` on an object's property fills it in when the request leaves it out (for example a
page size), so the upstream sees the value the catalog publishes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qsl

import msgspec

Validator = Callable[[Any, str], Any]
"""Validate (and for query strings coerce) ``value`` found at ``where``; return the value."""

ANNOTATIONS = {"description", "title", "examples", "default", "format", "deprecated"}
KEYWORDS = ANNOTATIONS | {
    "type", "properties", "required", "additionalProperties", "enum", "const", "minimum",
    "maximum", "minLength", "maxLength", "pattern", "items", "prefixItems", "minItems",
    "maxItems", "oneOf", "anyOf", "x-comma-list", "x-combined-count", "x-not-less-than",
    "x-named-params",
}  # fmt: skip
TYPES = {"object", "array", "string", "integer", "number", "boolean", "null"}
_INT_TEXT = re.compile(r"^-?(0|[1-9][0-9]{0,17})$")


class InvalidInput(ValueError):
    """A request value breaks its schema; ``where`` names the parameter for the 400."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}" if where else message)
        self.where = where


class SchemaError(ValueError):
    """A schema in routes.yaml uses something the validator does not support."""


def check_schema(schema: Any, where: str) -> None:
    """Raise :class:`SchemaError` naming ``where`` when ``schema`` leaves the supported subset."""
    if not isinstance(schema, dict):
        raise SchemaError(f"{where}: a schema must be a mapping, got {_shown(schema)}")
    unknown = set(schema) - KEYWORDS
    if unknown:
        raise SchemaError(f"{where}: unsupported schema keyword(s) {sorted(unknown)}")
    types = schema.get("type")
    for t in types if isinstance(types, list) else [types] if types else []:
        if t not in TYPES:
            raise SchemaError(f"{where}.type: unknown type {t!r}")
    if "pattern" in schema:
        try:
            re.compile(schema["pattern"])
        except (re.error, TypeError) as exc:
            raise SchemaError(f"{where}.pattern: {exc}") from exc
    _check_bounds(schema, where)
    if "enum" in schema and not isinstance(schema["enum"], list):
        raise SchemaError(f"{where}.enum: must be a list, got {_shown(schema['enum'])}")
    properties = schema.get("properties") or {}
    if not isinstance(properties, dict):
        raise SchemaError(f"{where}.properties: must map names to schemas")
    for name, sub in properties.items():
        check_schema(sub, f"{where}.properties.{name}")
    for key in ("items",):
        if key in schema:
            check_schema(schema[key], f"{where}.{key}")
    extra = schema.get("additionalProperties", True)
    if isinstance(extra, dict):
        check_schema(extra, f"{where}.additionalProperties")
    elif not isinstance(extra, bool):
        raise SchemaError(f"{where}.additionalProperties: must be true, false or a schema")
    for i, sub in enumerate(schema.get("prefixItems") or []):
        check_schema(sub, f"{where}.prefixItems[{i}]")
    for key in ("oneOf", "anyOf"):
        # Only groups of required names are enforced (see _check_groups); anything else would be
        # published in the catalog but silently not enforced.
        for i, sub in enumerate(schema.get(key) or []):
            group = sub.get("required") if isinstance(sub, dict) else None
            if (
                set(sub) - ANNOTATIONS - {"required"}
                or not isinstance(group, list)
                or not group
                or not all(isinstance(n, str) for n in group)
            ):
                raise SchemaError(f"{where}.{key}[{i}]: only {{required: [names]}} groups are supported")
    order = schema.get("x-not-less-than")
    if order is not None and not (
        isinstance(order, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in order.items())
    ):
        raise SchemaError(f"{where}.x-not-less-than: must map a property name to another")
    if "x-comma-list" in schema:
        spec = schema["x-comma-list"]
        if not isinstance(spec, dict) or "items" not in spec:
            raise SchemaError(f"{where}.x-comma-list: needs an items schema")
        _check_bounds(spec, f"{where}.x-comma-list")
        check_schema(spec["items"], f"{where}.x-comma-list.items")
    combined = schema.get("x-combined-count")
    if combined is not None and not (
        isinstance(combined, dict)
        and isinstance(combined.get("fields"), list)
        and all(isinstance(combined.get(k, 0), int) for k in ("min", "max"))
    ):
        raise SchemaError(f"{where}.x-combined-count: needs fields, min and max")
    if "required" in schema and not isinstance(schema["required"], list):
        raise SchemaError(f"{where}.required: must be a list, got {_shown(schema['required'])}")
    if "x-named-params" in schema:
        _check_named_params(schema, where)


def _check_named_params(schema: Mapping[str, Any], where: str) -> None:
    spec = schema["x-named-params"]
    order = spec.get("order") if isinstance(spec, dict) else None
    if not isinstance(order, list) or not all(isinstance(n, str) for n in order):
        raise SchemaError(
            f"{where}.x-named-params: needs order, a list of parameter names (empty: named only)"
        )
    properties = schema.get("properties") or {}
    unknown = [n for n in order if n not in properties]
    if unknown:
        raise SchemaError(f"{where}.x-named-params.order: {unknown} are not properties of this schema")
    aliases = spec.get("aliases", {})
    if not isinstance(aliases, dict) or not all(
        isinstance(old, str) and new in properties for old, new in aliases.items()
    ):
        raise SchemaError(f"{where}.x-named-params.aliases: must map other names to properties")


def _shown(value: Any) -> str:
    """A YAML value as the operator wrote it: text quoted, lists and mappings by kind."""
    if isinstance(value, str):
        return f"the text {value[:40]!r}"
    if isinstance(value, list | dict):
        return "a list" if isinstance(value, list) else "a mapping"
    return repr(value)


def _check_bounds(schema: Mapping[str, Any], where: str) -> None:
    """Numeric keywords must be numbers, or a request would fail with a TypeError (500)."""
    for key in ("minimum", "maximum"):
        value = schema.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise SchemaError(f"{where}.{key}: must be a number, got {_shown(value)}")
    for key in ("minLength", "maxLength", "minItems", "maxItems"):
        value = schema.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise SchemaError(f"{where}.{key}: must be a non-negative integer, got {_shown(value)}")


def _type_ok(value: Any, expected: str) -> bool:
    if expected == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if expected == "number":
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    return {
        "object": dict,
        "array": list,
        "string": str,
        "boolean": bool,
        "null": type(None),
    }[expected] is type(value)


def _join(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def compile_schema(schema: Mapping[str, Any], *, from_query: bool = False) -> Validator:
    """Build a validator for ``schema``; ``from_query`` coerces integer text as query strings need."""
    checks: list[Callable[[Any, str], Any]] = []
    if "x-named-params" in schema:
        spec = schema["x-named-params"]
        checks.append(_named_params(list(spec["order"]), dict(spec.get("aliases") or {})))
    types = schema.get("type")
    type_list: list[str] = types if isinstance(types, list) else [types] if types else []

    if type_list:
        names = " or ".join(type_list)

        def check_type(value: Any, where: str) -> Any:
            if from_query and isinstance(value, str) and "integer" in type_list and _INT_TEXT.match(value):
                value = int(value)
            if not any(_type_ok(value, t) for t in type_list):
                raise InvalidInput(where, f"must be {'an' if names[0] in 'aeiou' else 'a'} {names}")
            return value

        checks.append(check_type)
    if "const" in schema:
        const = schema["const"]

        def check_const(value: Any, where: str) -> Any:
            if value != const:
                raise InvalidInput(where, f"must be {const!r}")
            return value

        checks.append(check_const)
    if "enum" in schema:
        allowed = list(schema["enum"])
        shown = ", ".join(str(a) for a in allowed)

        def check_enum(value: Any, where: str) -> Any:
            if value not in allowed:
                raise InvalidInput(where, f"must be one of {shown}")
            return value

        checks.append(check_enum)
    checks.extend(_number_checks(schema))
    checks.extend(_string_checks(schema, from_query))
    checks.extend(_array_checks(schema, from_query))
    checks.extend(_object_checks(schema, from_query))

    def validate(value: Any, where: str) -> Any:
        for check in checks:
            value = check(value, where)
        return value

    return validate


def _named_params(order: list[str], aliases: dict[str, str]) -> Validator:
    """JSON-RPC params in either form -> the named object (see the module docstring)."""
    shown = ", ".join(order)

    def to_named(value: Any, where: str) -> Any:
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], dict):
            value = value[0]
        if isinstance(value, list):
            if not order:
                raise InvalidInput(where, "takes named parameters only: an object, or an array holding one")
            if len(value) > len(order):
                raise InvalidInput(where, f"takes at most {len(order)} positional parameters ({shown})")
            return {name: item for name, item in zip(order, value, strict=False) if item is not None}
        if isinstance(value, dict) and aliases.keys() & value.keys():
            value = dict(value)
            for old, new in aliases.items():
                if old in value:
                    if new in value:
                        raise InvalidInput(_join(where, old), f"give {new} or {old}, not both")
                    value[new] = value.pop(old)
        return value

    return to_named


def _number_checks(schema: Mapping[str, Any]) -> list[Validator]:
    checks: list[Validator] = []
    low, high = schema.get("minimum"), schema.get("maximum")
    if low is None and high is None:
        return checks

    def check_range(value: Any, where: str) -> Any:
        if isinstance(value, int | float) and not isinstance(value, bool):
            if low is not None and value < low:
                raise InvalidInput(where, _range_message(low, high))
            if high is not None and value > high:
                raise InvalidInput(where, _range_message(low, high))
        return value

    checks.append(check_range)
    return checks


def _range_message(low: Any, high: Any) -> str:
    if low is not None and high is not None:
        return f"must be between {low} and {high}"
    return f"must be >= {low}" if low is not None else f"must be <= {high}"


def _compile_pattern(pattern: str) -> re.Pattern[str]:
    """A JSON Schema pattern as ECMA-262 reads it: a final ``$`` is the end of the text. (Python's
    ``$`` also matches before a trailing newline, which would let ``"id\\n"`` through.)"""
    if pattern.endswith("$") and not pattern.endswith("\\$"):
        pattern = pattern[:-1] + r"\Z"
    return re.compile(pattern)


def _string_checks(schema: Mapping[str, Any], from_query: bool) -> list[Validator]:
    checks: list[Validator] = []
    min_len, max_len = schema.get("minLength"), schema.get("maxLength")
    pattern = _compile_pattern(schema["pattern"]) if "pattern" in schema else None
    described = schema.get("description")
    bad_format = f"must be a {described}" if described else "has an invalid format"
    if min_len is not None or max_len is not None or pattern is not None:

        def check_text(value: Any, where: str) -> Any:
            if isinstance(value, str):
                if min_len is not None and len(value) < min_len:
                    raise InvalidInput(
                        where, "must not be empty" if min_len == 1 else f"min length {min_len}"
                    )
                if max_len is not None and len(value) > max_len:
                    raise InvalidInput(where, f"must be at most {max_len} characters")
                if pattern is not None and not pattern.search(value):
                    raise InvalidInput(where, bad_format)
            return value

        checks.append(check_text)
    if "x-comma-list" in schema:
        spec = schema["x-comma-list"]
        item = compile_schema(spec["items"], from_query=True)
        min_items, max_items = spec.get("minItems", 1), spec.get("maxItems")

        def check_list(value: Any, where: str) -> Any:
            if not isinstance(value, str):
                return value
            parts = value.split(",")
            if any(p == "" for p in parts):
                raise InvalidInput(where, "must be a comma-separated list without empty items")
            if len(parts) < min_items or (max_items is not None and len(parts) > max_items):
                raise InvalidInput(where, f"must list {min_items} to {max_items} items")
            return [item(p, f"{where}[{i}]") for i, p in enumerate(parts)]

        checks.append(check_list)
    return checks


def _array_checks(schema: Mapping[str, Any], from_query: bool) -> list[Validator]:
    checks: list[Validator] = []
    min_items, max_items = schema.get("minItems"), schema.get("maxItems")
    prefix = [compile_schema(s, from_query=from_query) for s in schema.get("prefixItems") or []]
    rest = compile_schema(schema["items"], from_query=from_query) if "items" in schema else None
    if min_items is None and max_items is None and not prefix and rest is None:
        return checks

    def check_array(value: Any, where: str) -> Any:
        if not isinstance(value, list):
            return value
        if min_items is not None and len(value) < min_items:
            raise InvalidInput(where, f"must have at least {min_items} item(s)")
        if max_items is not None and len(value) > max_items:
            raise InvalidInput(where, f"must have at most {max_items} item(s)")
        out = list(value)
        for i, item in enumerate(out):
            check = prefix[i] if i < len(prefix) else rest
            if check is not None:
                out[i] = check(item, _join(where, i))
        return out

    checks.append(check_array)
    return checks


def _object_checks(schema: Mapping[str, Any], from_query: bool) -> list[Validator]:
    checks: list[Validator] = []
    props = {k: compile_schema(v, from_query=from_query) for k, v in (schema.get("properties") or {}).items()}
    required: list[str] = list(schema.get("required") or [])
    extra = schema.get("additionalProperties", True)
    closed = extra is False
    extra_check = compile_schema(extra, from_query=from_query) if isinstance(extra, dict) else None
    one_of = [list(s.get("required") or []) for s in schema.get("oneOf") or []]
    any_of = [list(s.get("required") or []) for s in schema.get("anyOf") or []]
    combined = schema.get("x-combined-count")
    order: dict[str, str] = dict(schema.get("x-not-less-than") or {})
    defaults = {
        k: v["default"]
        for k, v in (schema.get("properties") or {}).items()
        if isinstance(v, dict) and "default" in v
    }
    if not (props or required or closed or extra_check or one_of or any_of or combined or order):
        return checks

    def check_object(value: Any, where: str) -> Any:
        if not isinstance(value, dict):
            return value
        if defaults:
            value = {**defaults, **value}
        for name in required:
            if name not in value:
                raise InvalidInput(_join(where, name), "is required")
        if closed:
            for name in value:
                if name not in props:
                    raise InvalidInput(_join(where, name), "is not a known parameter")
        out = dict(value)
        if extra_check is not None:
            for name in out:
                if name not in props:
                    out[name] = extra_check(out[name], _join(where, name))
        for name, check in props.items():
            if name in out:
                out[name] = check(out[name], _join(where, name))
        _check_groups(out, where, one_of, any_of)
        if combined:
            total = sum(len(out[f]) for f in combined["fields"] if isinstance(out.get(f), list))
            if not combined.get("min", 0) <= total <= combined.get("max", total):
                fields = " plus ".join(combined["fields"])
                raise InvalidInput(
                    _join(where, combined["fields"][0]),
                    f"{fields} must hold {combined.get('min', 0)} to {combined.get('max')} ids combined",
                )
        for later, earlier in order.items():
            if later in out and earlier in out and out[later] < out[earlier]:
                raise InvalidInput(_join(where, later), f"must be >= {earlier}")
        return out

    checks.append(check_object)
    return checks


def _check_groups(
    value: dict[str, Any], where: str, one_of: list[list[str]], any_of: list[list[str]]
) -> None:
    if one_of:
        matched = sum(all(n in value for n in group) for group in one_of)
        if matched != 1:
            names = " or ".join("+".join(g) for g in one_of)
            raise InvalidInput(_join(where, one_of[0][0]), f"exactly one of {names} must be given")
    if any_of and not any(all(n in value for n in group) for group in any_of):
        names = " or ".join("+".join(g) for g in any_of)
        raise InvalidInput(_join(where, any_of[0][0]), f"at least one of {names} must be given")


class ValidatedInput(msgspec.Struct, frozen=True):
    """A request after its route's validator: handlers use this, never the raw request again."""

    path: dict[str, Any]
    query: dict[str, Any]
    body: Any = None


class RequestValidator:
    """One route's input rules, compiled once: path params, query string and JSON body."""

    def __init__(self, schemas: Mapping[str, Mapping[str, Any]]) -> None:
        self._path = compile_schema(schemas["path"], from_query=True) if "path" in schemas else None
        self._query = compile_schema(schemas["query"], from_query=True) if "query" in schemas else None
        self._body = compile_schema(schemas["body"]) if "body" in schemas else None
        self.has_body = self._body is not None

    def path(self, params: Mapping[str, str]) -> dict[str, Any]:
        if self._path is None:
            return dict(params)
        result: dict[str, Any] = self._path(dict(params), "")
        return result

    def query(self, raw: bytes) -> dict[str, Any]:
        """Parse ``raw`` strictly (a parameter given twice is refused) and validate it."""
        if self._query is None:
            return {}
        values: dict[str, str] = {}
        for key, value in parse_qsl(raw.decode("latin-1"), keep_blank_values=True):
            if key in values:
                raise InvalidInput(key, "is given more than once")
            values[key] = value
        result: dict[str, Any] = self._query(values, "")
        return result

    def body(self, raw: bytes) -> Any:
        """Decode ``raw`` as JSON and validate it; no body schema means no body is read."""
        if self._body is None:
            return None
        if not raw.strip():
            raise InvalidInput("body", "a JSON body is required")
        try:
            value = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise InvalidInput("body", "is not valid JSON") from exc
        except RecursionError:  # msgspec's nesting limit, reached well within the body size limit
            raise InvalidInput("body", "is nested too deeply") from None
        return self._body(value, "")
