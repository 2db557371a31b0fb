"""The seam every way of paying plugs into: a payment method bound to one route.

A method knows three things: how to challenge (its part of the route's 402), how to check a
credential (to an :class:`Admitted` grant, or the value saying why not), and how to finish once
the upstream answered (settle, take, deliver once) or let go when it failed. The one access
layer (``middleware.paid_access.PaidAccess``) finds the method whose credential header a request
carries, renders what the method decided and, between ``check`` and ``finish``, calls the
handler; it decides nothing itself, and the grant never leaves it.

A route's access mode names its primary method (routes.yaml ``access``); the primary renders the
402 and the other methods a route accepts add their extensions to it. A method is registered by
one entry of :data:`gateway.routing.vocabulary.PAYMENT_METHODS`, whose ``binder`` names the function
that binds it to a route; the loader, catalog, OpenAPI document, metrics and CLI read the rest
of that entry.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

from gateway.limits.rate_limiter import Limited
from gateway.methods.results import Conflict, InProgress, Refused, Replay, Settled
from gateway.routing.routes import RouteSpec
from gateway.routing.vocabulary import ACCESS_MODES, AccessMode

if TYPE_CHECKING:
    from gateway.services import Services

Grant = TypeVar("Grant")
BodyReader = Callable[[], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class Incoming:
    """What a method may know of a request that carries its credential."""

    credential: str
    """The credential header's value."""
    path: str
    """The path as the client sent it (percent-encoded): what a signed resource names."""
    client_ip: str
    read_body: BodyReader
    """Reads the body (bounded); call it once, only after the credential decoded."""
    header: str = ""
    """The (lower-case) header that carried the credential, for a method that reads several."""


@dataclass(frozen=True, slots=True)
class Admitted(Generic[Grant]):
    """The credential is good: call the upstream, then finish with ``grant``."""

    grant: Grant
    body: Any
    """The validated JSON body."""
    amount: str | None = None
    """What the request costs its payer, in micro-USDC (for the log line and revenue)."""


@dataclass(frozen=True, slots=True)
class Finished:
    """The request was answered without the upstream (a pending settlement reconciled)."""

    settled: Settled
    amount: str | None = None


@dataclass(frozen=True, slots=True)
class Checked(Generic[Grant]):
    """What checking a credential came to, and who it was about (the payer, once the credential
    named one). Everything else is an outage or a bug, and raises."""

    decision: Admitted[Grant] | Finished | Refused | Replay | InProgress | Conflict | Limited
    payer: str | None = None


@dataclass(frozen=True, slots=True)
class Offer:
    """A 402 as sent: its JSON body and complete ASGI headers."""

    body: bytes
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)


class RouteMethod(Protocol[Grant]):
    """One way of paying, bound to one route."""

    @property
    def credential_headers(self) -> tuple[bytes, ...]:
        """Lower-case header names whose presence selects this method."""
        ...

    async def challenge(self, path: str, error: str | None, extensions: Mapping[str, Any]) -> Offer:
        """The route's 402 for a request of ``path`` (``error``: why a credential was refused),
        with other methods' ``extensions`` added."""
        ...

    async def extensions(self, path: str) -> Mapping[str, Any]:
        """What this method adds to the primary method's 402 (fresh per challenge if need be)."""
        ...

    async def check(self, incoming: Incoming) -> Checked[Grant]:
        """Decide whether the credential admits the request. Invalid input raises
        ``InvalidInput`` (400); outages raise (503)."""
        ...

    async def finish(self, grant: Grant, answer: Answer) -> Settled:
        """The upstream answered 200 with ``answer``: collect, and say what it came to."""
        ...

    async def abandon(self, grant: Grant) -> None:
        """The upstream failed: nothing is collected."""
        ...


@dataclass(frozen=True, slots=True)
class Answer:
    """The handler's successful answer, buffered until the method finished."""

    body: bytes
    content_type: str


def credential_headers(mode: AccessMode) -> tuple[bytes, ...]:
    """The request headers (lower-case) that carry a credential of ``mode``, as it declares them."""
    return tuple(credential.header.lower().encode() for credential in mode.credentials)


Binder = Callable[[RouteSpec, "Services"], RouteMethod[Any]]


def binder(access: str) -> Binder:
    """The function that binds the payment method ``access`` to a route (its registered
    ``module:function``); resolved by name, so the vocabulary stays free of the methods."""
    target = ACCESS_MODES[access].binder
    if target is None:
        raise LookupError(f"access mode {access!r} is not a payment method")
    module, _, name = target.partition(":")
    found: Binder = getattr(importlib.import_module(module), name)
    return found
