"""Readiness: whether this replica can serve now, for an orchestrator's readiness probe.

Two parts can stop it: the shared store (every paid and sign-in request needs it) and, when it
sells paid routes, the facilitator (verify and settle). ``/healthz`` asks neither (liveness must
not restart a replica for an outage elsewhere); ``/readyz`` asks both.

The facilitators' questions (:func:`facilitator_probes`) are live, never answered from a
cache; the failover probes with the same ones. Each part is asked at most once per its time to
live, whatever the probe rate, and concurrent probes share one question, so a probe storm never
reaches the facilitator. A question is cut off at its timeout, so the probe answers within the
orchestrator's own timeout. Only fixed words leave the process (``ok``, ``unavailable``,
``timeout``); the reason (which never holds a URL or key) goes to the log when a part changes
state.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from gateway.facilitators.http import Facilitator, FacilitatorUnavailable, HttpFacilitator
from gateway.facilitators.local import RPC_UPSTREAM_NAMES
from gateway.outbound.client import UpstreamClient
from gateway.outbound.solana_rpc import SolanaRpc, SolanaRpcError
from gateway.store import Store
from gateway.telemetry.logs import log_event
from gateway.x402.types import SOLANA_MAINNET

OK: Final = "ok"
UNAVAILABLE: Final = "unavailable"
TIMEOUT: Final = "timeout"

STORE_TTL_S: Final = 1.0
"""The store answers a ping in a millisecond: ask it (almost) every probe."""
FACILITATOR_TTL_S: Final = 5.0
"""The facilitator is a third party (or a Solana node): ask it at most this often."""
CHECK_TIMEOUT_S: Final = 2.0
"""Below the Kubernetes probe's ``timeoutSeconds`` (deploy/k8s/deployment.yaml)."""

Problem = str | None
"""None when the part answered, else why not (for the log only)."""
Question = Callable[[], Awaitable[Problem]]


class CachedCheck:
    """One part's state, asked at most every ``ttl_s`` seconds and for at most ``timeout_s``."""

    def __init__(
        self,
        name: str,
        question: Question,
        *,
        ttl_s: float,
        timeout_s: float = CHECK_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self._question = question
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._state = OK
        self._expires = 0.0
        self._lock = asyncio.Lock()

    async def state(self) -> str:
        """``ok``, ``unavailable`` or ``timeout``, asked again only once the last answer expired."""
        if self._clock() < self._expires:
            return self._state
        async with self._lock:
            if self._clock() < self._expires:
                return self._state
            try:
                async with asyncio.timeout(self._timeout_s):
                    problem = await self._question()
                state = OK if problem is None else UNAVAILABLE
            except TimeoutError:
                state, problem = TIMEOUT, f"no answer within {self._timeout_s:g}s"
            if state != self._state:
                level = logging.INFO if state == OK else logging.WARNING
                log_event("readiness changed", level, check=self.name, state=state, problem=problem)
            self._state = state
            self._expires = self._clock() + self._ttl_s
            return state


class Readiness:
    """The checks of one app; :meth:`states` asks them all at once."""

    def __init__(self, checks: Sequence[CachedCheck]) -> None:
        self.checks = list(checks)

    async def states(self) -> dict[str, str]:
        """Each check's name and state, asked concurrently."""
        states = await asyncio.gather(*(check.state() for check in self.checks))
        return {check.name: state for check, state in zip(self.checks, states, strict=True)}


def store_question(store: Store) -> Question:
    async def ask() -> Problem:
        return None if await store.ping() else "the store did not answer a ping"

    return ask


def facilitator_question(facilitator: HttpFacilitator) -> Question:
    """The external facilitator answers ``/supported`` now (its cached answer would hide an outage)."""

    async def ask() -> Problem:
        try:
            await facilitator.ask_supported()
        except FacilitatorUnavailable as exc:  # its message carries the redacted URL only
            return str(exc)
        return None

    return ask


def node_question(rpc: SolanaRpc) -> Question:
    """The internal facilitator's Solana node answers ``getHealth`` with ``ok``."""

    async def ask() -> Problem:
        try:
            health = await rpc.call("getHealth", [], str)
        except SolanaRpcError as exc:  # names the method, never the URL
            return str(exc)
        return None if health == "ok" else f"getHealth: {health[:64]}"

    return ask


@dataclass(frozen=True, slots=True)
class FacilitatorProbes:
    """One live question per facilitator (by name), asked past any cache: the readiness probe
    asks them, and the failover (:class:`~gateway.facilitators.health.FacilitatorHealth`)
    probes with them, so both see an outage when it is one, and a recovery only once the
    facilitator answers again."""

    questions: Mapping[str, Question]


def facilitator_probes(
    facilitators: Mapping[str, Facilitator], *, node_url: str, outbound: UpstreamClient
) -> FacilitatorProbes:
    """An external facilitator answers ``/supported`` now; the internal one is as alive as its
    mainnet node (``node_url``), which answers ``getHealth`` over ``outbound`` (the process's
    one client: the probe opens no pool of its own)."""
    questions: dict[str, Question] = {}
    for name, facilitator in facilitators.items():
        if isinstance(facilitator, HttpFacilitator):
            questions[name] = facilitator_question(facilitator)
        else:
            upstream = RPC_UPSTREAM_NAMES[SOLANA_MAINNET]
            rpc = SolanaRpc(node_url, outbound, timeout_s=CHECK_TIMEOUT_S, upstream=upstream)
            questions[name] = node_question(rpc)
    return FacilitatorProbes(questions)


def build_readiness(store: Store, probes: FacilitatorProbes, *, sells_paid_routes: bool) -> Readiness:
    """The store always; the facilitators only when paid routes are served (a gateway selling only
    sign-in routes never asks them), ready while any of them answers (the others are failed over)."""
    checks = [CachedCheck("store", store_question(store), ttl_s=STORE_TTL_S)]
    questions = list(probes.questions.values()) if sells_paid_routes else []
    if questions:
        checks.append(CachedCheck("facilitator", any_answers(questions), ttl_s=FACILITATOR_TTL_S))
    return Readiness(checks)


def any_answers(questions: Sequence[Question]) -> Question:
    """Fine while one of ``questions`` is; else the first one's problem."""

    async def ask() -> Problem:
        problems = await asyncio.gather(*(question() for question in questions))
        return None if any(problem is None for problem in problems) else problems[0]

    return ask
