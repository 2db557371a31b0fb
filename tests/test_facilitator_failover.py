"""Facilitator failover: several facilitators in FACILITATOR_URL, in order of preference.

Two fake CDP facilitators on loopback, each settling for real through the reference facilitator
on LiteSVM with a fee payer of its own. The 402 offers one ``accepts`` entry per facilitator,
healthy ones first, each naming its own fee payer; a payment is verified and settled by the one
it names. The preferred one is taken down mid-run: the payment signed for it is answered 503
(nothing charged), the next 402 offers the other first, and paid calls keep succeeding through
it. No payment is settled twice: each facilitator settled exactly the payments that named it.

The health behind that order probes each facilitator live (never its cached ``/supported``
answer): stopped for longer than a down mark lives, the preferred one is never offered first
and every payment after the one that found it dead settles through the other; started again,
it is offered first again. A failing probe renews the mark, on every replica.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import pytest
from solders.keypair import Keypair

from gateway.facilitators.health import FacilitatorHealth
from gateway.facilitators.http import HttpFacilitator
from gateway.outbound.client import UpstreamClient
from gateway.store import keys
from gateway.store.cluster import RedisClusterStore
from gateway.store.memory import MemoryStore
from gateway.telemetry.readiness import facilitator_probes
from gateway.x402.types import PaymentRequirements, ResourceInfo
from tests.support.adversarial_paid import Money
from tests.support.cdp_facilitator import CdpCredentials, ReferenceBackend
from tests.support.facilitator_fixtures import StartFacilitator
from tests.support.gateway_server import run_gateway
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PROVIDER_PRICE,
    PaidGateway,
    balance_body,
    paid_env,
)
from tests.support.polling import read_until
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream


def _offers(paid: PaidGateway, header: dict[str, Any]) -> list[tuple[PaymentRequirements, str]]:
    """(requirements, fee payer) of each ``accepts`` entry of a PAYMENT-REQUIRED header, in order."""
    accepts = header["accepts"]
    return [(msgspec.convert(a, PaymentRequirements), a["extra"]["feePayer"]) for a in accepts]


async def _pay_first_offer(paid: PaidGateway, request_id: int) -> tuple[int, str]:
    """What an x402 client does: read the 402, pay its first offer; (status, fee payer used)."""
    header = (await paid.challenge()).header_json("payment-required")
    requirements, fee_payer = _offers(paid, header)[0]
    resource = msgspec.convert(header["resource"], ResourceInfo)
    payment = paid.sign(requirements, resource)
    reply = await paid.pay(GET_BALANCE, balance_body(request_id=request_id), payment)
    return reply.status, fee_payer


async def test_paid_calls_fail_over_to_the_next_facilitator_and_nothing_is_settled_twice(
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    upstream: Upstream,
    start_cdp_facilitator: StartFacilitator,
    cdp_credentials: CdpCredentials,
) -> None:
    other_fee_payer = Keypair()
    usdc_chain.svm.airdrop(other_fee_payer.pubkey(), 1_000_000_000)
    preferred = await start_cdp_facilitator(
        credentials=cdp_credentials, backend=ReferenceBackend(usdc_chain.fee_payer, solana_rpc_server.url)
    )
    fallback = await start_cdp_facilitator(backend=ReferenceBackend(other_fee_payer, solana_rpc_server.url))
    env = {
        **paid_env(usdc_chain, solana_rpc_server, upstream, preferred),
        "FACILITATOR_URL": f"{preferred.base_url},{fallback.base_url}",
    }
    before = Money.of(usdc_chain)
    async with run_gateway(env) as running, aiohttp.ClientSession() as http:
        paid = PaidGateway(running, usdc_chain, solana_rpc_server, upstream, preferred, http)
        header = (await paid.challenge()).header_json("payment-required")
        offered = _offers(paid, header)
        assert [fee_payer for _, fee_payer in offered] == [
            str(usdc_chain.fee_payer.pubkey()),
            str(other_fee_payer.pubkey()),
        ]
        assert {r.amount for r, _ in offered} == {str(GET_BALANCE_PROVIDER_PRICE)}  # neither adds a fee

        first = [await _pay_first_offer(paid, n) for n in range(3)]
        stale = header  # a client that read the 402 before the outage
        await preferred.stop()
        requirements, _ = _offers(paid, stale)[0]
        resource = msgspec.convert(stale["resource"], ResourceInfo)
        refused = await paid.pay(GET_BALANCE, balance_body(request_id=10), paid.sign(requirements, resource))
        after = [await _pay_first_offer(paid, 20 + n) for n in range(3)]

    assert first == [(200, str(usdc_chain.fee_payer.pubkey()))] * 3
    assert (refused.status, refused.error_code) == (503, "facilitator_unavailable")
    assert after == [(200, str(other_fee_payer.pubkey()))] * 3
    # Each facilitator settled exactly the payments that named its fee payer; six sales in all.
    assert preferred.count("settle") == 3 and fallback.count("settle") == 3
    assert len(solana_rpc_server.sent) == 6
    spent = Money.of(usdc_chain).minus(before)
    six = 6 * GET_BALANCE_PROVIDER_PRICE
    assert (spent.client_usdc, spent.pay_to_usdc) == (-six, six)


DOWN_S = 5.0
"""The down mark's lifetime in the served tests (``FACILITATOR_DOWN_SECONDS``; 30 s by default):
the shortest start-up allows above a probe every second and its 3 s timeout."""
PROBE_S = 1.0
"""``FACILITATOR_PROBE_SECONDS`` there (5 s by default)."""


@dataclass(frozen=True)
class Round:
    """One client round after the outage: who the 402 offered first, and what paying it came to."""

    offered_first: str
    status: int
    error: str | None


@pytest.mark.slow
async def test_while_the_preferred_facilitator_is_dead_every_payment_settles_through_the_other(
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    upstream: Upstream,
    start_cdp_facilitator: StartFacilitator,
    cdp_credentials: CdpCredentials,
) -> None:
    """Two reference facilitators; the preferred one is stopped mid-run and stays dead for longer
    than its down mark lives (so the mark must be renewed), while a client reads the 402 and
    pays its first offer, over and over. At most the one payment that found it dead is a 503;
    from then on the dead one is never offered first and every payment settles through the
    other. Started again, it answers the live probe and is offered first again."""
    other_fee_payer = Keypair()
    usdc_chain.svm.airdrop(other_fee_payer.pubkey(), 1_000_000_000)
    preferred = await start_cdp_facilitator(
        credentials=cdp_credentials, backend=ReferenceBackend(usdc_chain.fee_payer, solana_rpc_server.url)
    )
    fallback = await start_cdp_facilitator(backend=ReferenceBackend(other_fee_payer, solana_rpc_server.url))
    dead, alive = str(usdc_chain.fee_payer.pubkey()), str(other_fee_payer.pubkey())
    env = {
        **paid_env(usdc_chain, solana_rpc_server, upstream, preferred),
        "FACILITATOR_URL": f"{preferred.base_url},{fallback.base_url}",
        "RATE_LIMIT_CHALLENGE_PER_MINUTE": "100000",  # a 402 read before each of many payments
        "RATE_LIMIT_RPC_RPS": "100000",
        "FACILITATOR_DOWN_SECONDS": str(DOWN_S),
        "FACILITATOR_PROBE_SECONDS": str(PROBE_S),
    }
    before, sent = Money.of(usdc_chain), len(solana_rpc_server.sent)
    async with run_gateway(env) as running, aiohttp.ClientSession() as http:
        paid = PaidGateway(running, usdc_chain, solana_rpc_server, upstream, preferred, http)
        first = [await _pay_first_offer(paid, n) for n in range(2)]

        await preferred.stop()
        rounds: list[Round] = []
        until = time.monotonic() + DOWN_S + PROBE_S + 2
        while time.monotonic() < until or len(rounds) < 12:  # past the mark's lifetime, 10 paid or more
            rounds.append(await _round(paid, 100 + len(rounds)))
            await asyncio.sleep(0.3)

        await preferred.start()
        back_by = time.monotonic() + PROBE_S + 5
        offered = await read_until(lambda: _first_fee_payer(paid), lambda f: f == dead, back_by)
        again = await _pay_first_offer(paid, 1000)

    assert first == [(200, dead)] * 2
    failed = [(n, r) for n, r in enumerate(rounds) if r.status != 200]
    assert [r.error for _, r in failed] in ([], ["facilitator_unavailable"]), failed
    detected = failed[0][0] + 1 if failed else 0  # the 503 that found it dead, if any
    after = rounds[detected:]
    assert after and all(r == Round(alive, 200, None) for r in after), rounds
    assert len(after) >= 10  # a client kept paying, past the down mark's lifetime (the loop's span)
    assert offered == dead and again == (200, dead)  # back, it is offered first again
    settled = len(after) + len(first) + 1
    assert preferred.count("settle") == len(first) + 1 and fallback.count("settle") == len(after)
    assert len(solana_rpc_server.sent) - sent == settled
    spent = Money.of(usdc_chain).minus(before)
    assert (spent.client_usdc, spent.pay_to_usdc) == (
        -settled * GET_BALANCE_PROVIDER_PRICE,
        settled * GET_BALANCE_PROVIDER_PRICE,
    )


async def _first_fee_payer(paid: PaidGateway) -> str:
    header = (await paid.challenge()).header_json("payment-required")
    return _offers(paid, header)[0][1]


async def _round(paid: PaidGateway, request_id: int) -> Round:
    """Read the 402, pay its first offer."""
    header = (await paid.challenge()).header_json("payment-required")
    requirements, fee_payer = _offers(paid, header)[0]
    resource = msgspec.convert(header["resource"], ResourceInfo)
    payment = paid.sign(requirements, resource)
    reply = await paid.pay(GET_BALANCE, balance_body(request_id=request_id), payment)
    return Round(fee_payer, reply.status, None if reply.status == 200 else reply.error_code)


class Answering:
    """A probe that answers while ``up`` (as the readiness question does: None, else why not)."""

    def __init__(self, up: bool = True) -> None:
        self.up = up
        self.asked = 0

    async def __call__(self) -> str | None:
        self.asked += 1
        return None if self.up else "connection refused"


async def test_a_facilitator_marked_down_is_offered_last_on_every_replica_and_probed_back() -> None:
    store = MemoryStore()
    a, b = Answering(up=False), Answering()
    replica_1 = FacilitatorHealth(store, {"a": a, "b": b}, probe_s=0.0)
    replica_2 = FacilitatorHealth(store, {"a": a, "b": b}, probe_s=0.0)
    assert replica_1.order() == ["a", "b"]

    await replica_1.mark_down("a")
    await replica_2.sync()  # reads the mark; its probe of "a" still fails

    assert replica_1.order() == replica_2.order() == ["b", "a"]
    a.up = True
    await replica_2.sync()  # the probe answers: "a" is offered first again, everywhere
    await replica_1.sync()
    assert replica_1.order() == replica_2.order() == ["a", "b"]


@pytest.mark.parametrize("names", [["a", "b"], ["b", "a", "c"]])
async def test_on_a_cluster_a_replica_reads_the_marks_another_made(
    clean_cluster_url: str, names: list[str]
) -> None:
    """The marks of every facilitator are read in one script: on a cluster they must share its
    slot (a read over several slots is refused, and each replica would keep its own marks)."""
    store = RedisClusterStore(clean_cluster_url)
    try:
        marking = FacilitatorHealth(store, {name: Answering() for name in names})
        reading = FacilitatorHealth(store, {name: Answering() for name in names})
        await marking.mark_down("a")
        await reading.read_marks()  # no probe: only the other replica's mark can tell
        assert reading.order() == [*(name for name in names if name != "a"), "a"]
        await marking.mark_up("a")
        await reading.read_marks()
        assert reading.order() == names
    finally:
        await store.close()


async def test_a_failing_probe_renews_the_down_mark_for_as_long_as_it_fails() -> None:
    """The mark lives 0.6 s; probed every 0.05 s for three times that, the facilitator stays
    down on a replica that never marked it itself (it only reads the store). A loaded machine
    may stall the probing for a few hundred milliseconds: the mark outlives that."""
    store = MemoryStore()
    a = Answering(up=False)
    prober = FacilitatorHealth(store, {"a": a, "b": Answering()}, down_s=0.6, probe_s=0.05)
    await prober.mark_down("a")
    until = time.monotonic() + 1.8
    while time.monotonic() < until:
        await prober.sync()
        assert prober.order() == ["b", "a"]
        await asyncio.sleep(0.02)

    assert a.asked >= 6
    assert await store.get(keys.facilitator_down("a")) == "1"  # past three of its lifetimes
    a.up = True
    await read_until(prober.sync, lambda _: prober.order() == ["a", "b"], time.monotonic() + 1)
    assert prober.order() == ["a", "b"]
    assert not await store.get(keys.facilitator_down("a"))


async def test_a_probe_that_hangs_never_holds_back_the_marks_of_other_replicas() -> None:
    """Probes may wait on a facilitator that hangs (up to their timeout); the marks are read on
    their own loop, so another replica's mark is seen within ``sync_s`` all the same."""
    store = MemoryStore()
    asked = asyncio.Event()

    async def hangs() -> str | None:
        asked.set()
        await asyncio.Event().wait()
        return None

    health = FacilitatorHealth(store, {"a": hangs, "b": Answering()}, sync_s=0.05, probe_timeout_s=60)
    other = FacilitatorHealth(store, {"a": hangs, "b": Answering()})
    health.start()
    try:
        await asyncio.wait_for(asked.wait(), 5)  # its probe of "a" is out, and hangs
        await other.mark_down("a")

        async def order() -> list[str]:
            return health.order()

        seen = await read_until(order, lambda found: found == ["b", "a"], time.monotonic() + 1)
    finally:
        await health.stop()
    assert seen == ["b", "a"]


async def test_a_facilitator_that_stops_is_found_by_its_live_probe_past_its_cached_answer(
    start_cdp_facilitator: StartFacilitator,
) -> None:
    """Its ``/supported`` answer is cached for minutes (the challenges' fee payer); the probe
    asks it live, so a stopped facilitator is offered last before any payment is sent its way,
    stays last while it is stopped, and is offered first again once it answers."""
    preferred, fallback = await start_cdp_facilitator(), await start_cdp_facilitator()
    facilitators = {
        preferred.base_url: HttpFacilitator(preferred.base_url),
        fallback.base_url: HttpFacilitator(fallback.base_url),
    }
    # no internal facilitator: no node, nothing sent on the client
    probes = facilitator_probes(facilitators, node_url="", outbound=UpstreamClient(timeout_s=1))
    health = FacilitatorHealth(MemoryStore(), probes.questions, probe_s=0.0)
    try:
        for facilitator in facilitators.values():
            await facilitator.supported()  # cached, as the challenges' fee payer warms it
        await health.sync()
        assert health.order() == [preferred.base_url, fallback.base_url]

        await preferred.stop()
        await health.sync()
        assert health.order() == [fallback.base_url, preferred.base_url]
        await health.sync()  # probed again: still dead, still last (a cached answer said "up")
        assert health.order() == [fallback.base_url, preferred.base_url]

        await preferred.start()
        await health.sync()
        assert health.order() == [preferred.base_url, fallback.base_url]
    finally:
        for facilitator in facilitators.values():
            await facilitator.close()
