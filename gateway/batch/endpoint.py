"""One payable JSON-RPC endpoint per provider, cluster and kind (``.../rpc``, ``.../das``): a single
call or a batch of the methods routes.yaml prices there, each held to its own method's rules.

The endpoint is derived from the per-method routes the table mounts (same provider, cluster,
upstream, limits and methods of payment), so it sells nothing the table does not price. A request
is parsed, every call validated by its method's body schema and priced by its method, all before
any store, bucket or facilitator is touched: an unknown or unpriced method, an empty or oversized
batch or a malformed call is a 400 naming the call's index. What it costs is then a route of its
own, priced for this request (:meth:`BatchEndpoint.priced`): the payment methods bind to that
route exactly as to a per-method one, so a batch is paid, verified, limited and settled by the
same code.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import msgspec

from gateway.routing.routes import RouteSpec, credit_price
from gateway.routing.validation import InvalidInput, Validator, compile_schema
from gateway.routing.vocabulary import PAYMENT_METHODS

BATCH_HANDLER = "jsonrpc"
"""The per-method handler whose routes an endpoint gathers (and the handler its priced route names)."""


@dataclass(frozen=True, slots=True)
class Call:
    """One JSON-RPC call of a request, validated by its method's route."""

    index: int
    route: RouteSpec
    method: str
    id: Any
    """The client's id, answered back as given (the provider hears the call's index instead)."""
    params: Any
    """As validated (DAS params in their named form, as the per-method route forwards them)."""


@dataclass(frozen=True, slots=True)
class Batch:
    """A request's calls and what they cost."""

    calls: tuple[Call, ...]
    single: bool
    """The body was one call, not an array: it is answered as one response, not a list."""
    provider_price: int
    """The sum of the calls' provider parts (a payment adds one settlement fee)."""
    credit_prices: tuple[int, ...]
    """Each call's credit price."""

    @property
    def key(self) -> tuple[str, ...]:
        """What decides its price, limits and terms: the methods it calls, in a fixed order."""
        return tuple(sorted(call.method for call in self.calls))

    @property
    def credit_price(self) -> int:
        """What the batch holds of prepaid credit: the sum of its calls' credit prices."""
        return sum(self.credit_prices)


class BatchEndpoint:
    """The ``/rpc`` (or ``/das``) endpoint of one provider and cluster: its methods' routes."""

    def __init__(self, routes: Sequence[RouteSpec], max_items: int) -> None:
        assert routes, "an endpoint needs at least one priced method"
        first = routes[0]
        self.path = first.path.rsplit("/", 1)[0]
        self.name = first.name.rsplit(".", 1)[0]
        self.max_items = max_items
        self.methods: dict[str, tuple[RouteSpec, Validator]] = {
            route.operation or "": (route, compile_schema(route.input.get("body") or {})) for route in routes
        }
        self.template = msgspec.structs.replace(
            first,
            name=self.name,
            path=self.path,
            operation=None,
            description=(
                f"JSON-RPC endpoint of {first.group} ({self.path}): one call or a batch of up to "
                f"{max_items} of {', '.join(sorted(self.methods))}; a batch costs the sum of its "
                "calls' provider parts plus one settlement fee."
            ),
            input={"body": self._discovery_schema()},
            output=None,
            rate_limits=(),
        )

    def _discovery_schema(self) -> dict[str, Any]:
        """The body as the 402's discovery extension (``bazaar``) shows it: one call or a batch,
        each method's provider part, and an example batch. Its only rule is the body's type:
        each call is held to its own method's rules when the body is parsed."""
        routes = [self.methods[name][0] for name in sorted(self.methods)]
        prices = ", ".join(f"{r.operation} {r.provider_price_micro_usdc}" for r in routes)
        examples = [
            {**r.input["body"]["examples"][0], "id": i}
            for i, r in enumerate(routes[:2])
            if (r.input.get("body") or {}).get("examples")
        ]
        schema: dict[str, Any] = {
            "type": ["object", "array"],
            "description": (
                f"One JSON-RPC call or a batch of at most {self.max_items}, each held to its method's "
                f"own route's rules. Provider part per call, in micro-USDC: {prices}; a request adds "
                "one settlement fee."
            ),
        }
        if examples:
            schema["examples"] = [examples]
        return schema

    @property
    def routes(self) -> list[RouteSpec]:
        """The per-method routes it serves, by method name."""
        return [self.methods[name][0] for name in sorted(self.methods)]

    def parse(self, raw: bytes) -> Batch:
        """The request's calls, each validated by its method; ``InvalidInput`` (400) names the
        first call that is not one this endpoint sells, or breaks its method's rules."""
        if not raw.strip():
            raise InvalidInput("body", "a JSON-RPC call or a batch of them is required")
        try:
            value = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise InvalidInput("body", "is not valid JSON") from exc
        except RecursionError:
            raise InvalidInput("body", "is nested too deeply") from None
        single = isinstance(value, dict)
        items = [value] if single else value
        if not isinstance(items, list):
            raise InvalidInput("body", "must be a JSON-RPC call (an object) or a batch of them (an array)")
        if not items:
            raise InvalidInput("body", "an empty batch: it must hold at least one call")
        if len(items) > self.max_items:
            raise InvalidInput("body", f"a batch holds at most {self.max_items} calls, got {len(items)}")
        calls = tuple(
            self._call(index, item, "" if single else f"body[{index}]") for index, item in enumerate(items)
        )
        return Batch(
            calls,
            single,
            sum(call.route.provider_price_micro_usdc or 0 for call in calls),
            tuple(credit_price(call.route) or 0 for call in calls),
        )

    def _call(self, index: int, item: Any, where: str) -> Call:
        """Call ``index`` of the body, found at ``where`` (empty for a lone call, whose fields
        are named as on the per-method route)."""
        if not isinstance(item, dict):
            raise InvalidInput(where, "must be a JSON-RPC call (an object)")
        method = item.get("method")
        at_method = _at(where, "method")
        if not isinstance(method, str):
            raise InvalidInput(at_method, "is required: the name of a method sold here")
        found = self.methods.get(method)
        if found is None:
            sold = ", ".join(sorted(self.methods))
            raise InvalidInput(at_method, f"{method[:64]!r} is not a method priced here (priced: {sold})")
        route, validate = found
        if "params" in item:
            item = {**item, "params": _without_nulls(item["params"])}
        try:
            body = validate(item, "")
        except InvalidInput as exc:
            inner = exc.where
            message = str(exc).removeprefix(f"{inner}: ") if inner else str(exc)
            raise InvalidInput(_at(where, inner), message) from None
        return Call(index, route, method, body.get("id"), body.get("params", []))

    def priced(self, batch: Batch) -> RouteSpec:
        """The route this request is: the endpoint priced at the sum of its calls' provider parts
        (the facilitator adds one settlement fee) and their credit prices, whose limits count every
        call (each call's limits once per call), so a batch of n spends n requests of each bucket."""
        counts = Counter(batch.key)
        shown = ", ".join(f"{method} x{n}" if n > 1 else method for method, n in counts.items())
        return msgspec.structs.replace(
            self.template,
            description=(
                f"{len(batch.calls)} JSON-RPC call(s) to {self.path} ({shown}): the sum of their "
                f"provider parts ({batch.provider_price} micro-USDC) plus one settlement fee."
            ),
            provider_price_micro_usdc=batch.provider_price,
            credit_price_micro_usdc=batch.credit_price,
            rate_limits=tuple(spec for call in batch.calls for spec in call.route.rate_limits),
            replay_cap_bytes=sum(call.route.replay_cap_bytes for call in batch.calls),
        )


def _without_nulls(params: Any) -> Any:
    """``params`` with the optional fields its config objects give as ``null`` left out, as
    Solana's RPC reads them (Solana SDKs send unset options as ``null``, e.g. solana-py's
    ``minContextSlot``), so each call meets its method's rules as its client meant it."""
    if isinstance(params, dict):
        return {key: value for key, value in params.items() if value is not None}
    if isinstance(params, list):
        return [_without_nulls(p) if isinstance(p, dict) else p for p in params]
    return params


def _at(where: str, inner: str) -> str:
    """``inner`` (a field of a call) inside the call at ``where``."""
    if where and inner:
        return f"{where}{inner}" if inner.startswith("[") else f"{where}.{inner}"
    return where or inner


def _endpoint_key(route: RouteSpec) -> str:
    return route.path.rsplit("/", 1)[0]


def batch_endpoints(routes: Iterable[RouteSpec], max_items: int) -> list[BatchEndpoint]:
    """One endpoint per parent path of the paid JSON-RPC routes mounted (``.../rpc/{method}`` ->
    ``.../rpc``); each route's path ends in its method, and its siblings share its terms."""
    paid = sorted(
        (r for r in routes if r.handler == BATCH_HANDLER and r.access in PAYMENT_METHODS and r.operation),
        key=_endpoint_key,
    )
    return [BatchEndpoint(list(group), max_items) for _, group in groupby(paid, key=_endpoint_key)]
