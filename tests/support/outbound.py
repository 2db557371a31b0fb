"""The whole gateway in-process, its third parties answered by ASGI apps through the transport seam.

``create_app(..., outbound=UpstreamClient(AsgiTransport({...})))`` sends every server-side
call (providers, the asset-data API, the external facilitator, the internal facilitator's
Solana node, the readiness probes) to an app registered for its host: real statuses, headers
and bytes, no socket. :class:`ThirdParty` is such an app: it records every request and
answers from a script (a status, a body, a delay, or nothing at all). :func:`inprocess_gateway`
builds and starts the app (its lifespan) and :meth:`InProcessGateway.request` calls it as a
server would hand it a request.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.applications import Starlette

from gateway.app import create_app
from gateway.config import Settings, load_settings
from gateway.outbound.asgi import AsgiTransport
from gateway.outbound.client import UpstreamClient
from gateway.sandbox.chain import LiteSvmRpcServer
from gateway.web.asgi import Receive, Scope, Send
from gateway.x402.types import (
    SOLANA_MAINNET,
    SettleResponse,
    SupportedKind,
    SupportedResponse,
    VerifyResponse,
)
from tests.support.gateway_server import routes_of
from tests.support.inprocess import Answer, call

BASE_URL = "https://gateway.test"


@dataclass(frozen=True)
class Seen:
    """One request as the third party received it."""

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    """What a third party answers: ``hang`` never answers (the caller's timeout ends it),
    ``broken`` breaks off after the first bytes of its body."""

    status: int = 200
    body: bytes = b"{}"
    content_type: str = "application/json"
    location: str | None = None
    hang: bool = False
    broken: bool = False

    @classmethod
    def of(cls, value: Any, status: int = 200) -> Reply:
        return cls(status, msgspec.json.encode(value))


@dataclass
class ThirdParty:
    """An ASGI app that records each request and answers it: from the replies queued for its
    path (:meth:`then`), else from ``answer``."""

    answer: Callable[[Seen], Reply] = lambda seen: Reply()
    seen: list[Seen] = field(default_factory=list)
    queued: dict[str, list[Reply]] = field(default_factory=dict)

    def then(self, path: str, *replies: Reply) -> None:
        self.queued.setdefault(path, []).extend(replies)

    def paths(self) -> list[str]:
        return [s.path for s in self.seen]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        seen = Seen(scope["method"], scope["path"], scope["query_string"].decode(), headers, b"".join(chunks))
        self.seen.append(seen)
        queued = self.queued.get(seen.path)
        reply = queued.pop(0) if queued else self.answer(seen)
        if reply.hang:
            await asyncio.Event().wait()
        headers_out = [(b"content-type", reply.content_type.encode())]
        if reply.location is not None:
            headers_out.append((b"location", reply.location.encode()))
        await send({"type": "http.response.start", "status": reply.status, "headers": headers_out})
        if reply.broken:
            await send({"type": "http.response.body", "body": reply.body[:1], "more_body": True})
            raise ConnectionResetError("the third party broke off its answer")
        await send({"type": "http.response.body", "body": reply.body})


def facilitator(fee_payer: str) -> ThirdParty:
    """An external facilitator's HTTP API: ``/supported`` names ``fee_payer``, every verify is
    valid and every settle succeeds (transaction ``tx-<n>``) unless a reply is queued."""

    def answer(seen: Seen) -> Reply:
        name = seen.path.rsplit("/", 1)[-1]
        if name == "supported":
            kind = SupportedKind(
                x402Version=2, scheme="exact", network=SOLANA_MAINNET, extra={"feePayer": fee_payer}
            )
            return Reply.of(SupportedResponse(kinds=[kind]))
        if name == "verify":
            return Reply.of(VerifyResponse(isValid=True))
        settled = sum(1 for s in party.seen if s.path.endswith("/settle"))
        return Reply.of(SettleResponse(success=True, network=SOLANA_MAINNET, transaction=f"tx-{settled}"))

    party = ThirdParty(answer)
    return party


def solana_node(chain: LiteSvmRpcServer) -> ThirdParty:
    """A Solana node: JSON-RPC over ``chain``'s LiteSVM (its ``handle``, not its socket)."""
    return ThirdParty(lambda seen: Reply.of(chain.handle(seen.json())))


def settled_through(party: ThirdParty) -> list[Seen]:
    """The settle requests a facilitator received."""
    return [s for s in party.seen if s.path.endswith("/settle")]


@dataclass
class InProcessGateway:
    app: Starlette
    settings: Settings
    transport: AsgiTransport

    @property
    def services(self) -> Any:
        return self.app.state.services

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> Answer:
        data = b"" if body is None else msgspec.json.encode(body)
        all_headers = dict(headers or {})
        if body is not None:
            all_headers.setdefault("content-type", "application/json")
        all_headers["content-length"] = str(len(data))
        return await call(self.app, method, path, headers=all_headers, body=data, query=query.encode())


@asynccontextmanager
async def inprocess_gateway(
    env: Mapping[str, str], parties: Mapping[str, ThirdParty]
) -> AsyncIterator[InProcessGateway]:
    """The gateway for ``env`` (on the in-process store), each host of ``parties`` answered by
    its app through the outbound seam, started and stopped by its own lifespan."""
    settings = load_settings({"GATEWAY_BASE_URL": BASE_URL, "LOG_LEVEL": "WARNING", **env})
    transport = AsgiTransport(parties)
    outbound = UpstreamClient(transport, timeout_s=settings.upstream_timeout_s)
    app = create_app(settings, routes_of(settings), outbound=outbound)
    async with app.router.lifespan_context(app):
        yield InProcessGateway(app, settings, transport)
