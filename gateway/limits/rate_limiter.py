"""The gateway's rate-limit decisions, shared by every middleware that enforces a limit.

Two kinds, by what an overshoot would cost:

* the per-IP challenge limit (402 answers, which cost nothing but CPU) is decided in the process
  and synchronised with the store in the background (:mod:`gateway.limits.synced`): no store
  round trip per 402, and a stated bound on overshoot across replicas. A 402 the client answers
  with an admitted credential is handed back, so only unanswered ones (and refusals) add up;
* the limits of a route (an upstream key's quota, a wallet's allowance) are exact: atomic GCRA
  decisions in the shared store, all of a request's buckets in one round trip, at the point the
  caller's flow defines (the paid path charges them together with its payment look-up).

A request is charged its own buckets (its wallet, its IP) first and the shared ones (a paid scope,
the asset-data key) last, so a client over its own limit never spends what others share. Guards
sit between the two: budgets of refusals, checked before a payment may cost the facilitator a
verify and charged only when the facilitator refused it (see :class:`BucketPlan`). An own bucket
that is a share of a shared one (``RateLimitSpec.share_of``) binds only while another client was
refused by that budget within its period: alone, a client may use all of it; under contention
each wallet and each IP gets its share, so a flood of throwaway wallets cannot starve the rest.

Over a limit raises 429 ``rate_limited`` with ``Retry-After``; a store outage on an exact limit
raises ``StoreUnavailable`` (503 ``store_unavailable``, converted once in ``gateway.web.failures``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import msgspec

from gateway.background import cancel_and_wait
from gateway.config import IpNetwork
from gateway.errors import ErrorCode, GatewayError
from gateway.limits.synced import SyncedWindowLimit
from gateway.routing.routes import RateLimitSpec
from gateway.store import Bucket, RateDecision, Share, Store, StoreUnavailable, keys
from gateway.store.limits import check_then_limit
from gateway.web.asgi import Scope
from gateway.web.clientip import IPV6_PREFIX_LENGTH, client_ip, client_subject

CHALLENGE_SCOPE = "challenge:ip"
REFUSED_IP_SCOPE = "payments-refused:ip"
REFUSED_PAYER_SCOPE = "payments-refused:payer"


def _subject(spec: RateLimitSpec, wallet: str | None, ip: str | None) -> str | None:
    """The tag of the client a per-wallet or per-IP spec counts (None: a per-scope budget)."""
    if spec.per == "wallet":
        return keys.wallet_tag(f"{wallet}")
    if spec.per == "ip":
        return keys.ip_tag(f"{ip}")
    return None


def _bucket(
    spec: RateLimitSpec, wallet: str | None, ip: str | None, budgets: Mapping[str, str], guard: bool
) -> Bucket:
    """The store bucket of ``spec`` for this client. A share of one of the request's shared
    budgets binds only while others wait for it, and lives on the budget's slot (decided with it
    in one step); a client's own bucket lives on its slot, a budget on its own."""
    share = None
    if spec.share_of is not None and spec.share_of in budgets:
        share = Share(budgets[spec.share_of], keys.rate_contention(spec.scope, spec.share_of))
    key = keys.rate_bucket(spec.scope, _subject(spec, wallet, ip), None if share is None else spec.share_of)
    return Bucket(
        key,
        spec.limit,
        spec.period_ms,
        guard=guard,
        share=share,
        shared=spec.per == "scope" or share is not None,
    )


@dataclass(frozen=True, slots=True)
class Limited:
    """A bucket refused the request: ``error`` is its 429 (with ``Retry-After``), to render."""

    error: GatewayError


@dataclass(frozen=True, slots=True)
class BucketPlan:
    """The buckets one request is charged, in the order they are charged: its own (its wallet,
    its IP), then the guards, then the shared ones (a scope, an upstream key). A request refused
    by its own bucket or a guard therefore spends nothing that other clients share."""

    specs: tuple[RateLimitSpec, ...]
    buckets: tuple[Bucket, ...]

    @property
    def shared(self) -> tuple[Bucket, ...]:
        """What the request spent of budgets other clients share: handed back when it turns out
        not to be owed (the facilitator refused the payment)."""
        return tuple(b for s, b in zip(self.specs, self.buckets, strict=True) if s.per == "scope")

    @property
    def refusal_debts(self) -> tuple[Bucket, ...]:
        """The guards, charged for real: what a refused payment costs its IP and its payer."""
        return tuple(msgspec.structs.replace(b, guard=False) for b in self.buckets if b.guard)

    def refusal(self, decisions: Sequence[RateDecision]) -> Limited | None:
        """The 429 of the first refused decision (``decisions`` follow the buckets), if any."""
        for spec, decision in zip(self.specs, decisions, strict=False):
            if not decision.allowed:
                return Limited(rate_limited(spec.scope, spec.limit, spec.period_ms, decision))
        return None


class RateLimiter:
    """Exact limits through the store; the challenge limit (if any) decided locally."""

    def __init__(
        self,
        store: Store,
        challenge_limit: SyncedWindowLimit | None = None,
        trusted_proxies: Sequence[IpNetwork] = (),
        refused_per_minute: int | None = None,
        ipv6_prefix_length: int = IPV6_PREFIX_LENGTH,
    ) -> None:
        self.store = store
        self.challenge_limit = challenge_limit
        self.trusted_proxies = tuple(trusted_proxies)
        self.ipv6_prefix_length = ipv6_prefix_length
        self.refusal_guards: tuple[RateLimitSpec, ...] = (
            ()
            if refused_per_minute is None
            else (
                RateLimitSpec(REFUSED_IP_SCOPE, refused_per_minute, 60_000, per="ip"),
                RateLimitSpec(REFUSED_PAYER_SCOPE, refused_per_minute, 60_000, per="wallet"),
            )
        )
        """Checked before a payment costs a verify; charged when the facilitator refuses one."""
        self._sync: asyncio.Task[None] | None = None

    def client_ip(self, scope: Scope) -> str:
        """The client as every per-IP limit and guard keys it: an IPv6 client by its prefix."""
        return client_subject(client_ip(scope, self.trusted_proxies), self.ipv6_prefix_length)

    async def challenge(self, scope: Scope, *, probe: bool = False) -> None:
        """Count one 402 challenge against the client's IP (no store round trip); a ``probe``
        (a sign-in that found no credit to spend) is handed back with the client's next
        admitted credential, beside that credential's own 402."""
        limit = self.challenge_limit
        if limit is None:
            return
        decision = limit.acquire(self.client_ip(scope), probe=probe)
        if not decision.allowed:
            raise rate_limited(limit.scope, limit.limit, limit.period_ms, decision)

    def answered(self, scope: Scope) -> None:
        """The client answered a 402 with a credential the gateway admitted (a payment, a
        sign-in on credit): that 402 was not an unpaid challenge, so its count is handed back
        (never below zero, never more than was counted: :meth:`SyncedWindowLimit.release`)."""
        if self.challenge_limit is not None:
            self.challenge_limit.release(self.client_ip(scope))

    def plan(
        self,
        specs: Sequence[RateLimitSpec],
        *,
        wallet: str | None = None,
        ip: str | None = None,
        guards: Sequence[RateLimitSpec] = (),
    ) -> BucketPlan:
        """The store buckets of ``specs`` (a per-wallet or per-IP spec counts that client's own
        requests, a per-scope one everybody's) and of the ``guards``, own ones first."""
        own = [spec for spec in specs if spec.per != "scope"]
        shared = [spec for spec in specs if spec.per == "scope"]
        ordered = (*own, *guards, *shared)
        first, last = len(own), len(own) + len(guards)
        budgets = {spec.scope: keys.rate_bucket(spec.scope) for spec in shared}
        buckets = tuple(
            _bucket(spec, wallet, ip, budgets, guard=first <= i < last) for i, spec in enumerate(ordered)
        )
        return BucketPlan(ordered, buckets)

    async def charge(self, specs: Sequence[RateLimitSpec]) -> None:
        """Exact decisions for ``specs``' buckets in one atomic store round trip, in order and
        stopping at the first refusal, so a refused request spends no later bucket; raises the
        429, or ``StoreUnavailable``."""
        if specs:
            plan = self.plan(specs)
            limited = plan.refusal((await check_then_limit(self.store, [], plan.buckets)).decisions)
            if limited is not None:
                raise limited.error

    def start(self) -> None:
        """Start sharing the challenge counts with the other processes (inside the event loop)."""
        if self.challenge_limit is not None and self._sync is None:
            self._sync = asyncio.create_task(self.challenge_limit.run(), name="challenge-limit-sync")

    async def stop(self) -> None:
        """Stop the background sync after one last exchange of counts."""
        if self._sync is None:
            return
        task, self._sync = self._sync, None
        await cancel_and_wait(task)
        if self.challenge_limit is not None:
            with contextlib.suppress(StoreUnavailable):
                await self.challenge_limit.sync()


def rate_limited(scope: str, limit: int, period_ms: int, decision: RateDecision) -> GatewayError:
    retry_after = max(1, math.ceil(decision.retry_after_ms / 1000))
    return GatewayError(
        ErrorCode.RATE_LIMITED,
        f"rate limit exceeded for {scope}, retry after {retry_after} s",
        {"scope": scope, "limit": limit, "periodSeconds": period_ms / 1000},
        headers={"Retry-After": str(retry_after)},
    )
