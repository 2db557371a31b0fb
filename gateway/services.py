"""The long-lived parts one app shares: store, outbound client, facilitator, limiter, usage.

Created by the app factory; opened and closed by the app's lifespan, so the one outbound pool
lives inside the running event loop, once per process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.background import cancel_and_wait
from gateway.batch.endpoint import batch_endpoints
from gateway.config import INTERNAL, Settings
from gateway.facilitators.health import FacilitatorHealth
from gateway.facilitators.http import ChallengeFeePayer, Facilitator, HttpFacilitator
from gateway.facilitators.local import load_local_facilitator
from gateway.handlers.facilitator import InternalFacilitatorRoutes
from gateway.ledger import Journal, JournalWriter, LedgerUnavailable
from gateway.ledger.recorder import MoneyRecorder
from gateway.ledger.restore import StoreRestorer
from gateway.limits.rate_limiter import CHALLENGE_SCOPE, RateLimiter
from gateway.limits.synced import SyncedWindowLimit
from gateway.methods.credit.book import credit_book
from gateway.methods.credit.lapse import CreditSweeper
from gateway.methods.exact.confirmations import FOLLOW_MAX_S
from gateway.methods.exact.fee_guard import FeeGuard
from gateway.methods.exact.offer import SettlingFacilitator
from gateway.outbound.client import UpstreamClient
from gateway.outbound.transport import AiohttpTransport
from gateway.routing.pricing import facilitator_fee
from gateway.routing.routes import RouteSpec, named_limits, payment_methods
from gateway.store import Store, StoreUnavailable, open_store
from gateway.telemetry.logs import log_event
from gateway.telemetry.metrics import Usage
from gateway.telemetry.readiness import build_readiness, facilitator_probes
from gateway.telemetry.request_log import RequestLog
from gateway.x402.siwx import SiwxIssuer, random_secret

OUTBOUND_PER_HOST = 100
"""Connections the process's one pool keeps to any one host (a slow provider cannot take the
facilitator's); there is no total bound beyond it, the hosts being the configured few."""
OUTBOUND_DNS_CACHE_S = 300


def outbound_client(settings: Settings) -> UpstreamClient:
    """The process's one outbound client: one aiohttp pool for every upstream, facilitator,
    Solana node and probe (each caller binds its own name, timeout and cap to it)."""
    pool = AiohttpTransport(connections=0, per_host=OUTBOUND_PER_HOST, dns_cache_s=OUTBOUND_DNS_CACHE_S)
    return UpstreamClient(pool, timeout_s=settings.upstream_timeout_s)


def _external_facilitator(
    settings: Settings, url: str, outbound: UpstreamClient, *, authenticated: bool
) -> HttpFacilitator:
    """An external facilitator; only the first one in FACILITATOR_URL gets the API key (a token
    minted for one host must never reach another, which could replay it there)."""
    return HttpFacilitator(
        url,
        api_key_id=(settings.facilitator_api_key_id or None) if authenticated else None,
        api_key_secret=(settings.facilitator_api_key_secret or None) if authenticated else None,
        timeout_s=min(settings.upstream_timeout_s, 10.0),
        session=outbound,
    )


class Services:
    def __init__(
        self,
        settings: Settings,
        routes: list[RouteSpec],
        store: Store | None = None,
        outbound: UpstreamClient | None = None,
    ) -> None:
        self.settings = settings
        self.routes = routes
        self.outbound = outbound if outbound is not None else outbound_client(settings)
        """Every server-side HTTP call goes out through this one client (one connection pool);
        opened and closed by the lifespan, whether made here or handed in (a test's transport)."""
        self.store = (
            store
            if store is not None
            else open_store(
                settings.store_url.reveal(), settings.store_token.reveal(), timeout_s=settings.store_timeout_s
            )
        )
        limit, period_ms = named_limits(settings)["challenge"]
        challenge_limit = SyncedWindowLimit(
            self.store, CHALLENGE_SCOPE, limit, period_ms, sync_interval_s=settings.rate_limit_sync_s
        )
        self.limiter = RateLimiter(
            self.store,
            challenge_limit,
            settings.trusted_proxies,
            settings.rate_limit_refused_per_minute,
            ipv6_prefix_length=settings.client_ipv6_prefix_length,
        )
        self.credit_book = credit_book(self.store, settings)
        """Prepaid credit on this store: every part that moves credit shares this one book."""
        self.batch_endpoints = batch_endpoints(routes, settings.rpc_batch_max_items)
        """The providers' JSON-RPC endpoints (``gateway.batch``), derived from the mounted routes."""
        counted = [*routes, *(endpoint.template for endpoint in self.batch_endpoints)]
        self.usage = Usage(self.store, counted, lambda route: payment_methods(route, settings))
        self.request_log = RequestLog(settings.log_challenges)
        self._usage_flusher: asyncio.Task[None] | None = None
        self.recorder = MoneyRecorder()
        """The ledger of record, once :meth:`start` opened it (``LEDGER_DATABASE_URL``)."""
        self.restorer: StoreRestorer | None = None
        """Brings a store that lost credit forward from the ledger (credit and a ledger on)."""
        self.credit_sweeper = CreditSweeper(self.store, self.recorder) if settings.credits_enabled else None
        """Lapses credit past its lapse time, logged and counted; one replica at a time sweeps."""
        self.fee_guard = FeeGuard(
            self.store,
            max_in_flight=settings.max_settlements_in_flight,
            cooldown_s=settings.settlement_cooldown_s,
            # a place in flight outlives the confirmation wait and the late follow-up after it
            hold_ttl_s=settings.settlement_confirm_s + FOLLOW_MAX_S + 30.0,
        )
        self.local_facilitator = load_local_facilitator(
            settings.facilitator_wallet.reveal(),
            self.store,
            guard=self.fee_guard,
            mainnet_rpc_url=settings.solana_mainnet_rpc_url.reveal(),
            devnet_rpc_url=settings.solana_devnet_rpc_url.reveal() or None,
            url=settings.base_url,  # the gateway settles itself; internal routes stay undiscovered
            session=self.outbound,
            policy=settings.exact_policy,
            confirm_timeout_s=settings.settlement_confirm_s,
        )
        self.settling = self._settling_facilitators(settings)
        """Every facilitator a payment may be settled through, in order of preference."""
        probes = facilitator_probes(
            {s.name: s.facilitator for s in self.settling},
            node_url=settings.solana_mainnet_rpc_url.reveal(),
            outbound=self.outbound,
        )
        self.facilitator_health = FacilitatorHealth(
            self.store,
            probes.questions,
            down_s=settings.facilitator_down_s,
            probe_s=settings.facilitator_probe_s,
        )
        """Which facilitators are down, probed live with the readiness probe's questions."""
        self.settlement_guard = self.fee_guard if settings.uses_internal_facilitator else None
        """Guards our own fee payer (client IPs in flight, cool-downs) for the payments it
        settles; an external facilitator pays its own fees."""
        self.facilitator_fee = facilitator_fee(settings)
        """The settlement fee the preferred facilitator adds to every price it settles."""
        self.readiness = build_readiness(self.store, probes, sells_paid_routes=any(r.paid for r in routes))
        self._upstreams: dict[str, UpstreamClient] = {}
        secret = settings.siwx_secret.reveal().encode() or random_secret()
        statement = "Sign in to read asset data or your prepaid credit at this gateway. No funds move."
        self.siwx = SiwxIssuer(secret, settings.base_url, statement)
        self.internal_routes = InternalFacilitatorRoutes(
            self.local_facilitator,
            settings.internal_secret.reveal() or None,
            body_limit=settings.max_body_bytes,
        )

    def _settling_facilitators(self, settings: Settings) -> list[SettlingFacilitator]:
        found: list[SettlingFacilitator] = []
        first_external = next((u for u in settings.facilitator_urls if u != INTERNAL), None)
        for url in settings.facilitator_urls:
            facilitator: Facilitator | None = (
                self.local_facilitator
                if url == INTERNAL
                else _external_facilitator(settings, url, self.outbound, authenticated=url == first_external)
            )
            if facilitator is None:  # internal without its wallet: start-up names the variable
                continue
            # Only the preferred facilitator may take FACILITATOR_FEE_PAYER as its fee payer.
            configured = settings.facilitator_fee_payer if url == settings.facilitator_url else ""
            found.append(
                SettlingFacilitator(
                    name=url,
                    facilitator=facilitator,
                    fee_payer=ChallengeFeePayer(facilitator, self.store, configured),
                    fee=facilitator_fee(settings, url),
                )
            )
        return found

    @property
    def facilitator(self) -> Facilitator | None:
        """The preferred facilitator."""
        return self.settling[0].facilitator if self.settling else None

    def upstream(self, name: str) -> UpstreamClient:
        """The client of upstream ``name`` over :attr:`outbound`, made for the first handler that
        asks for it: only the upstreams routes use are metered."""
        client = self._upstreams.get(name)
        if client is None:
            client = self._upstreams[name] = self.outbound.bound(
                upstream=name or None, timeout_s=self.settings.upstream_timeout_s
            )
        return client

    async def start(self) -> None:
        """Open the ledger first (a gateway configured with one does not start without it), then
        the background tasks."""
        await self._open_ledger()
        self._usage_flusher = asyncio.create_task(self.usage.run(), name="usage-flusher")
        self.limiter.start()
        self.request_log.start()
        self.facilitator_health.start()
        if self.credit_sweeper is not None:
            self.credit_sweeper.start()
        self.outbound.open()

    async def _open_ledger(self) -> None:
        """The journal, its writer and (with credit) the check that brings a store that lost
        credit forward from it, made once before the first request is served."""
        ledger_url = self.settings.ledger_url.reveal()
        if not ledger_url:
            return
        journal = await Journal.open(ledger_url)
        self.recorder.journal, self.recorder.writer = journal, JournalWriter(journal)
        self.recorder.writer.start()
        if not self.settings.credits_enabled:
            return
        book = self.credit_book
        self.restorer = StoreRestorer(self.store, journal, lapse_ms=book.lapse_ms, grace_ms=book.grace_ms)
        try:
            await self.restorer.check()
        except (StoreUnavailable, LedgerUnavailable) as failed:
            log_event(f"ledger check at start-up skipped: {failed}", logging.WARNING)
        self.restorer.start()

    async def stop(self) -> None:
        task, self._usage_flusher = self._usage_flusher, None
        await cancel_and_wait(task)
        await self.usage.flush()
        await self.request_log.stop()
        await self.limiter.stop()
        await self.facilitator_health.stop()
        if self.credit_sweeper is not None:
            await self.credit_sweeper.stop()
        facilitators = [s.facilitator for s in self.settling] + [self.local_facilitator]
        for facilitator in {id(f): f for f in facilitators if f}.values():
            await facilitator.close()  # its watchers; the pool it shares is closed once, below
        await self.outbound.close()
        if self.restorer is not None:
            await self.restorer.stop()
        if self.recorder.writer is not None:
            await self.recorder.writer.stop()
        if self.recorder.journal is not None:
            await self.recorder.journal.close()
        await self.store.close()

    @asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        await self.start()
        try:
            yield
        finally:
            await self.stop()
