"""The seam every way of paying plugs into: a payment method bound to one route.

A method knows three things: how to challenge (its part of the route's 402), how to check a
credential (to an :class:`Admitted` grant, or the value saying why not), and how to finish once
the upstream answered (settle, take, deliver once) or let go when it failed. The one access
layer (``middleware.paid_access.PaidAccess``) finds the method whose credential header a request
carries, renders what the method decided and, between ``check`` and ``finish``, calls the
handler; it decides nothing itself, and the grant never leaves it.

A route lists the methods it accepts (routes.yaml ``accepts``), first its primary: the primary
renders the 402 and the other methods add their extensions to it. A method is registered as
one object (:class:`gateway.methods.registry.PaymentMethod`: its description and its binder) with
:func:`gateway.methods.registry.register`; the loader, catalog, OpenAPI document, CORS, metrics
and CLI read its description.

A method with nothing to collect (sign-in-with-x at $0.00) answers :class:`Passed`: the handler
then answers the client directly, with no buffering and nothing to finish.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from gateway.limits.rate_limiter import Limited
from gateway.methods.results import Conflict, InProgress, Refused, Replay, Settled
from gateway.routing.validation import ValidatedInput
from gateway.routing.vocabulary import AccessMode
from gateway.x402.siwx import VerifiedSignIn

Grant = TypeVar("Grant")
BodyReader = Callable[[], Awaitable[bytes]]


@dataclass(frozen=True, slots=True)
class Asked:
    """What was asked, as a challenge or a check may need it."""

    path: str
    """The path as the client sent it (percent-encoded): what a signed resource names."""
    query: bytes = b""
    """The raw query string (a sign-in's terms are given in it)."""
    path_params: Mapping[str, str] = field(default_factory=dict)


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
    query: bytes = b""
    path_params: Mapping[str, str] = field(default_factory=dict)

    @property
    def asked(self) -> Asked:
        return Asked(self.path, self.query, self.path_params)


@dataclass(frozen=True, slots=True)
class Admitted(Generic[Grant]):
    """The credential is good: call the upstream, then finish with ``grant``."""

    grant: Grant
    body: Any
    """The validated JSON body."""
    amount: str | None = None
    """What the request costs its payer, in micro-USDC (for the log line and revenue)."""


@dataclass(frozen=True, slots=True)
class Passed:
    """Admitted with nothing to collect (a sign-in at $0.00): the handler answers the client
    directly, as it will; nothing is buffered, finished or abandoned."""

    input: ValidatedInput
    outcome: str
    sign_in: VerifiedSignIn | None = None


@dataclass(frozen=True, slots=True)
class Finished:
    """The request was answered without the upstream (a pending settlement reconciled)."""

    settled: Settled
    amount: str | None = None


@dataclass(frozen=True, slots=True)
class Checked(Generic[Grant]):
    """What checking a credential came to, and who it was about (the payer, once the credential
    named one). Everything else is an outage or a bug, and raises."""

    decision: Admitted[Grant] | Passed | Finished | Refused | Replay | InProgress | Conflict | Limited
    payer: str | None = None
    wallet: str | None = None
    """Who signed in, where that is all a credential says (nothing is paid)."""
    limit_counted: bool = False
    """A ``Limited`` answer is free for the client, so it counts against the client IP's
    challenge limit too (a sign-in over a limit: throwaway keys sign in for nothing)."""


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

    async def challenge(self, asked: Asked, error: str | None, extensions: Mapping[str, Any]) -> Offer:
        """The route's 402 for ``asked`` (``error``: why a credential was refused), with other
        methods' ``extensions`` added."""
        ...

    async def extensions(self, asked: Asked) -> Mapping[str, Any]:
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
