"""The request log: a JSON line per request, but plain 402 challenges counted per route instead.

A challenge is the cheapest answer the gateway gives and the one a client can ask for thousands
of times a second: a line each cost about 15% of that path's throughput. With
``LOG_CHALLENGES=summary`` (the default) each process writes one ``challenges`` line per route
every minute (and at shutdown) with the count since its previous one; ``all`` writes a line per
challenge, ``off`` none (``x402_payments_total`` counts them either way). Every other request
keeps its own line: payments, refused payments and sign-ins, sign-ins, errors, a 429.
"""

from __future__ import annotations

import asyncio
import logging
import time

import msgspec

from gateway.background import cancel_and_wait
from gateway.config import CHALLENGE_LOG_MODES
from gateway.routing.vocabulary import Outcome
from gateway.telemetry.logs import get_logger, log_struct
from gateway.web.asgi import Scope
from gateway.web.context import RequestContext

CHALLENGED = Outcome.CHALLENGED
"""The outcome of a plain challenge: a 402 to a request without a payment or sign-in."""
SUMMARY_INTERVAL_S = 60.0


class RequestLine(msgspec.Struct, omit_defaults=True, gc=False):
    """One request's fields (after ts, level, msg, pid); what is not known is left out."""

    method: str
    path: str
    route: str
    status: int
    latency_ms: float
    access: str
    outcome: str
    wallet: str | None = None
    payer: str | None = None
    amount: str | None = None
    settlement: str | None = None
    error: str | None = None


class ChallengeCount(msgspec.Struct, gc=False):
    """The plain challenges one route answered in the last ``window_s`` seconds."""

    route: str
    count: int
    window_s: float
    status: int = 402
    outcome: str = CHALLENGED


class RequestLog:
    """Write each finished request's line, or count it if it is a plain challenge.

    The app's lifespan calls :meth:`start` and :meth:`stop`, which write the summaries; without
    them (a bare middleware in a test) use ``challenges="all"``.
    """

    def __init__(self, challenges: str = "summary", interval_s: float = SUMMARY_INTERVAL_S) -> None:
        if challenges not in CHALLENGE_LOG_MODES:
            raise ValueError(f"challenges must be one of {', '.join(CHALLENGE_LOG_MODES)}")
        self.logger = get_logger()
        self.line_per_challenge = challenges == "all"
        self.count_challenges = challenges == "summary"
        self.interval_s = interval_s
        self.challenges: dict[str, int] = {}
        self._window_start = time.monotonic()
        self._summaries: asyncio.Task[None] | None = None

    def request(self, scope: Scope, ctx: RequestContext, latency_ms: float) -> None:
        if ctx.outcome == CHALLENGED and ctx.status == 402 and not self.line_per_challenge:
            if self.count_challenges:
                self.challenges[ctx.route] = self.challenges.get(ctx.route, 0) + 1
            return
        if not self.logger.isEnabledFor(logging.INFO):
            return
        line = RequestLine(
            method=scope["method"],
            path=scope["path"],
            route=ctx.route,
            status=ctx.status,
            latency_ms=round(latency_ms, 3),
            access=ctx.access,
            outcome=ctx.outcome,
            wallet=ctx.wallet,
            payer=ctx.payer,
            amount=ctx.amount,
            settlement=ctx.settlement,
            error=ctx.error,
        )
        log_struct(self.logger, logging.INFO, "request", line)

    def summarize(self) -> None:
        """One ``challenges`` line per route counted since the previous call; then start over."""
        counts, self.challenges = self.challenges, {}
        now = time.monotonic()
        window_s, self._window_start = round(now - self._window_start, 3), now
        for route, count in sorted(counts.items()):
            log_struct(self.logger, logging.INFO, "challenges", ChallengeCount(route, count, window_s))

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval_s)
            self.summarize()

    def start(self) -> None:
        if self.count_challenges and self._summaries is None:
            self._summaries = asyncio.create_task(self._run(), name="challenge-summaries")

    async def stop(self) -> None:
        """Stop the periodic summaries and write the last one, so no count is lost."""
        task, self._summaries = self._summaries, None
        await cancel_and_wait(task)
        self.summarize()
