"""A payment method bound to one request's priced batch (:meth:`BatchEndpoint.priced`), and what
it lets the handler release of a batch whose provider failed some calls.

Every decision is the wrapped method's own (challenge, check, finish, abandon): a batch is paid,
replayed, guarded and settled by the very code of a per-method route. The wrapper adds one thing
per method: how much of a partly failed batch may be answered (:class:`~gateway.batch.proxy.Policy`).
One payment covers a whole batch, so it is all or nothing; credit holds each call's price, so the
calls answered are taken and the failed ones released: the take is of the answered calls' credit
(one store step that also drops the hold, freeing the rest), and a session's cap gets the failed
calls' share back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gateway.batch.proxy import BatchCall, Policy
from gateway.methods.credit.book import CreditHold
from gateway.methods.credit.method import CreditMethod
from gateway.methods.results import Refused, Settled
from gateway.methods.seam import Answer, Asked, Checked, Incoming, Offer, RouteMethod
from gateway.routing.vocabulary import CREDIT_METHOD
from gateway.store import StoreUnavailable
from gateway.telemetry.logs import log_event


class BatchMethod:
    """``inner`` as a batch's method: it tells the batch its policy once it checks a credential."""

    def __init__(self, inner: RouteMethod[Any], call: BatchCall, policy: Policy) -> None:
        self.inner = inner
        self.call = call
        self.policy = policy

    @property
    def credential_headers(self) -> tuple[bytes, ...]:
        return self.inner.credential_headers

    async def challenge(self, asked: Asked, error: str | None, extensions: Mapping[str, Any]) -> Offer:
        return await self.inner.challenge(asked, error, extensions)

    async def extensions(self, asked: Asked) -> Mapping[str, Any]:
        return await self.inner.extensions(asked)

    async def check(self, incoming: Incoming) -> Checked[Any]:
        self.call.policy = self.policy
        return await self.inner.check(incoming)

    async def finish(self, grant: Any, answer: Answer) -> Settled:
        return await self.inner.finish(grant, answer)

    async def abandon(self, grant: Any) -> None:
        await self.inner.abandon(grant)


class BatchCredit(BatchMethod):
    """Credit for a batch: the answered calls' credit is taken, the failed calls' released."""

    def __init__(self, inner: CreditMethod, call: BatchCall) -> None:
        super().__init__(inner, call, Policy.EACH)
        self.credit = inner

    async def finish(self, grant: CreditHold, answer: Answer) -> Settled:
        taken = self.call.answered_credit
        if taken >= grant.amount:
            return await self.credit.finish(grant, answer)
        settled = await self.credit.finish(dataclasses.replace(grant, amount=taken), answer)
        if grant.session and not isinstance(settled, Refused):
            released = dataclasses.replace(grant, amount=grant.amount - taken)
            try:
                await self.credit.sessions.refund(released)
            except StoreUnavailable:  # the hold is gone with the take: only the cap keeps the share
                log_event(
                    "batch's failed calls left on the session's cap: store unavailable", wallet=grant.wallet
                )
        return settled


def batch_method(name: str, method: RouteMethod[Any], call: BatchCall) -> BatchMethod:
    """``method`` (registered as ``name``) as this request's batch method."""
    if name == CREDIT_METHOD and isinstance(method, CreditMethod):
        return BatchCredit(method, call)
    return BatchMethod(method, call, Policy.ALL_OR_NOTHING)
