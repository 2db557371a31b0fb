"""BatchProxy: forward a request's validated calls to the provider as ONE JSON-RPC batch, and say
which of them succeeded.

One upstream batch rather than a call per item: one HTTP round trip to the provider whatever the
batch's size (providers bill a batch as its calls, so it costs them nothing more), and the
provider's own answer decides each call. The provider hears each call under its index as id (a
client may reuse or omit ids); each answer goes back under the client's own id. A call succeeded
when its answer has a ``result`` and no ``error``, exactly as on the per-method route; a call the
provider left unanswered failed. A failure of the whole exchange (timeout, unreachable, a bad
status, an answer that is not a JSON-RPC batch) fails every call.

How much of a partly failed batch is answered is the payment method's to say (:class:`Policy`):
paid in one payment, nothing is released unless every call succeeded (502 naming the failed
calls, so nothing is settled); on credit, every result is returned and only the calls answered
are taken.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from gateway.batch.endpoint import Batch
from gateway.errors import ErrorCode, GatewayError
from gateway.handlers.jsonrpc import JsonRpcError, JsonRpcProxy, JsonRpcRequest
from gateway.outbound.metrics import ErrorKind
from gateway.telemetry.redact import scrub
from gateway.web.asgi import JSON_CONTENT_TYPE, Receive, Scope, Send, send_bytes

BATCH_SCOPE_KEY: Final = "x402gw.batch"
"""Where the access layer leaves the request's :class:`BatchCall` for the handler."""


class Policy(enum.Enum):
    ALL_OR_NOTHING = "all_or_nothing"
    """One payment for the whole batch: released only when every call succeeded."""
    EACH = "each"
    """Each call paid for itself (credit): every result returned, the answered ones taken."""


@dataclass(slots=True)
class BatchCall:
    """One request's batch, as the access layer, the payment method and the handler share it."""

    batch: Batch
    policy: Policy = Policy.ALL_OR_NOTHING
    answered: list[bool] = field(default_factory=list)
    """Per call, whether the provider answered it (filled by the handler)."""

    @property
    def failed(self) -> list[int]:
        return [i for i, ok in enumerate(self.answered) if not ok]

    @property
    def answered_credit(self) -> int:
        """What the answered calls cost on credit: all that may be taken."""
        prices = self.batch.credit_prices
        return sum(price for price, ok in zip(prices, self.answered, strict=False) if ok)


class Reply(msgspec.Struct):
    """One answer of the provider's batch: only what decides success and the result itself."""

    id: Any = None
    result: msgspec.Raw = msgspec.Raw(b"")
    error: JsonRpcError | None = None


class Answered(msgspec.Struct, omit_defaults=True):
    jsonrpc: str
    id: Any
    result: msgspec.Raw | None = None
    error: JsonRpcError | None = None


_replies = msgspec.json.Decoder(list[Reply])
_encode = msgspec.json.Encoder().encode
NOT_ANSWERED = JsonRpcError(code=-32603, message="the provider did not answer this call; nothing was charged")


class BatchProxy:
    """The endpoint's handler: one upstream batch, each call's answer under the client's id."""

    def __init__(self, proxy: JsonRpcProxy) -> None:
        self.proxy = proxy
        """Its provider: the URL, client and error handling of the per-method handler."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        call: BatchCall = scope[BATCH_SCOPE_KEY]
        calls = call.batch.calls
        upstream = [
            JsonRpcRequest(jsonrpc="2.0", id=c.index, method=c.method, params=c.params) for c in calls
        ]
        raw = await self.proxy.post(_encode(upstream))
        replies = self._replies(raw, len(calls))
        answers: list[Answered] = []
        for c in calls:
            reply = replies.get(c.index)
            ok = reply is not None and reply.error is None and bool(reply.result)
            call.answered.append(ok)
            if reply is not None and ok:
                answers.append(Answered("2.0", c.id, result=reply.result))
            else:
                error = reply.error if reply is not None and reply.error is not None else NOT_ANSWERED
                public = JsonRpcError(
                    code=error.code, message=scrub(error.message or "", self.proxy.secrets)[:200]
                )
                answers.append(Answered("2.0", c.id, error=public))
        failed = call.failed
        if failed:
            self.proxy.client.failed(ErrorKind.RPC_ERROR)
        if failed and (call.policy is Policy.ALL_OR_NOTHING or len(failed) == len(calls)):
            raise GatewayError(
                ErrorCode.UPSTREAM_ERROR,
                f"the provider failed call(s) {', '.join(map(str, failed))}; nothing was charged",
                {"failed": [{"index": i, "rpcError": msgspec.to_builtins(answers[i].error)} for i in failed]},
            )
        body = _encode(answers[0] if call.batch.single else answers)
        await send_bytes(send, 200, body, (JSON_CONTENT_TYPE,))

    def _replies(self, raw: bytes, expected: int) -> dict[int, Reply]:
        """The provider's answers by the index they name; a body that is no batch fails them all."""
        try:
            replies = _replies.decode(raw)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
            self.proxy.client.failed(ErrorKind.INVALID_ANSWER)
            raise GatewayError(
                ErrorCode.UPSTREAM_ERROR, "provider answered with no JSON-RPC batch; nothing was charged"
            ) from exc
        return {r.id: r for r in replies if type(r.id) is int and 0 <= r.id < expected}
