"""The fault campaign: what tests/test_paid_faults.py does not already break.

For every fault: nothing is settled that should not be, nothing paid for is lost, and the client
hears a clear error. Covered there and not repeated here: the facilitator down, slow, invalid or
refusing at verify; the provider failing (HTTP errors, JSON-RPC errors, invalid JSON, refused
connection) and timing out; settlement failed or pending (and its reconciliation); the store down
before a request and refusing the claim after verify.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from gateway.x402.headers import encode_header
from gateway.x402.types import PaymentPayload
from tests.support.adversarial_paid import LateConfirmationBackend
from tests.support.cdp_facilitator import (
    CdpCredentials,
    Fault,
    ReferenceBackend,
    StaticBackend,
)
from tests.support.facilitator_fixtures import StartFacilitator
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PROVIDER_PRICE,
    MARKER,
    PROVIDER_ANSWER,
    PaidGateway,
    Reply,
    StartPaidGateway,
    assert_answered,
    assert_challenge,
    balance_body,
    encode_body,
    send_and_hang_up,
    settled_once,
)
from tests.support.paid_processes import eventually, paid_processes
from tests.support.redis_server import RedisServer
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Responder, Upstream, static

ROUTE = "solana.mainnet.provider_a.rpc.getBalance"

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")


# --- the provider answers garbage ------------------------------------------------------------------


async def _dropped_mid_answer(request: web.Request, body: bytes) -> web.StreamResponse:
    """Headers promising 4 KiB, a few bytes of JSON, then the connection is gone."""
    response = web.StreamResponse(status=200, headers={"content-type": "application/json"})
    response.content_length = 4096
    await response.prepare(request)
    await response.write(b'{"jsonrpc": "2.0", "id": 1, "result": {"value": ')
    assert request.transport is not None
    request.transport.close()
    return response


async def _oversized(request: web.Request, body: bytes) -> web.StreamResponse:
    """A well-formed JSON-RPC success larger than the gateway accepts (8 MiB)."""
    filler = b"x" * (9 * 1024 * 1024)
    return web.Response(
        body=b'{"jsonrpc": "2.0", "id": 1, "result": "' + filler + b'"}', content_type="application/json"
    )


async def _bad_gzip(request: web.Request, body: bytes) -> web.StreamResponse:
    """``Content-Encoding: gzip`` on bytes that are not gzip."""
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    return web.Response(body=b'{"jsonrpc": "2.0", "id": 1, "result": 1}', headers=headers)


async def _stalls_mid_answer(request: web.Request, body: bytes) -> web.StreamResponse:
    """Headers and a first chunk at once, then nothing for longer than the gateway waits."""
    response = web.StreamResponse(status=200, headers={"content-type": "application/json"})
    response.content_length = 4096
    await response.prepare(request)
    await response.write(b'{"jsonrpc": "2.0", "id": 1, "result": ')
    await asyncio.sleep(1.0)
    return response


async def _nested_too_deep(request: web.Request, body: bytes) -> web.StreamResponse:
    """Valid JSON nested deeper than the decoder recurses."""
    nested = b'{"jsonrpc": "2.0", "id": 1, "result": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    return web.Response(body=nested, content_type="application/json")


GARBAGE: dict[str, Responder] = {
    "nested_too_deep": _nested_too_deep,
    "dropped_mid_answer": _dropped_mid_answer,
    "oversized": _oversized,
    "bad_gzip": _bad_gzip,
}


@pytest.mark.parametrize("garbage", list(GARBAGE))
async def test_paid_rpc_provider_garbage_is_502_and_settles_nothing(
    start_paid_gateway: StartPaidGateway, garbage: str
) -> None:
    paid = await start_paid_gateway()
    paid.upstream.responder = GARBAGE[garbage]
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 502, reply.body[:200]
    assert reply.error_code == "upstream_error"
    assert "payment-response" not in reply.headers
    assert paid.upstream_calls == paid.verify_calls() == 1
    assert paid.settle_calls() == 0


async def test_paid_rpc_provider_stalling_mid_answer_is_504_and_settles_nothing(
    start_paid_gateway: StartPaidGateway,
) -> None:
    paid = await start_paid_gateway(env={"UPSTREAM_TIMEOUT_SECONDS": "0.3"})
    paid.upstream.responder = _stalls_mid_answer
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 504, reply.body
    assert reply.error_code == "upstream_timeout"
    assert "payment-response" not in reply.headers
    assert paid.upstream_calls == 1
    assert paid.settle_calls() == 0


# --- the facilitator fails at settle (after the provider answered) --------------------------------

SETTLE_OUTAGES = ["down", "slow", "invalid_json"]


async def _settle_outage(
    start_paid_gateway: StartPaidGateway, outage: str
) -> tuple[PaidGateway, PaymentPayload, Reply]:
    """A paid call whose provider answers and whose settle meets ``outage``: the gateway, the
    payment and the reply.

    The facilitator's client times out after 0.5 s (UPSTREAM_TIMEOUT_SECONDS caps it)."""
    paid = await start_paid_gateway(env={"UPSTREAM_TIMEOUT_SECONDS": "0.5"})
    facilitator = paid.facilitator
    assert facilitator is not None
    paid.upstream.responder = static(200, PROVIDER_ANSWER, delay=0.2)
    payment = await paid.payment()
    if outage == "slow":
        facilitator.inject(Fault.SLOW, endpoint="settle", delay_s=1.0, times=1)
    elif outage == "invalid_json":
        facilitator.inject(Fault.INVALID_JSON, endpoint="settle", times=1)
    request = asyncio.create_task(paid.pay(GET_BALANCE, balance_body(), payment))
    if outage == "down":
        await eventually(lambda: paid.upstream_calls == 1, what="the provider call")
        await facilitator.stop()  # verified already; gone before settle
    reply = await request
    if outage == "down":
        await facilitator.start()  # back, on the same port
    return paid, payment, reply


@pytest.mark.parametrize("outage", SETTLE_OUTAGES)
async def test_paid_rpc_facilitator_unreachable_at_settle_is_503_pending_and_withholds_the_body(
    start_paid_gateway: StartPaidGateway, outage: str
) -> None:
    paid, _, reply = await _settle_outage(start_paid_gateway, outage)

    assert reply.status == 503, reply.body
    assert reply.error_code == "settlement_pending"
    assert int(reply.headers["retry-after"]) >= 1
    assert str(MARKER).encode() not in reply.body
    assert "payment-response" not in reply.headers
    assert paid.upstream_calls == 1


@pytest.mark.parametrize("outage", SETTLE_OUTAGES)
async def test_paid_rpc_retry_after_a_settle_outage_delivers_without_calling_the_provider_again(
    start_paid_gateway: StartPaidGateway, outage: str
) -> None:
    paid, payment, first = await _settle_outage(start_paid_gateway, outage)
    assert first.status == 503

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert_answered(reply, paid.last_settled())
    assert paid.upstream_calls == 1
    assert paid.verify_calls() == 1


async def test_paid_rpc_replay_during_a_slow_verify_is_refused_as_already_used_without_a_verify(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    """The first use holds the payment's claim while the (slow) facilitator verifies it; a replay
    arriving meanwhile is refused from the store at once, the facilitator never asked about it,
    and the first use is served and settled once."""
    paid = await start_paid_gateway(backend=ReferenceBackend(usdc_chain.fee_payer, solana_rpc_server.url))
    assert paid.facilitator is not None
    payment = await paid.payment()
    paid.facilitator.inject(Fault.SLOW, endpoint="verify", delay_s=1.0, times=1)
    first = asyncio.create_task(paid.pay(GET_BALANCE, balance_body(), payment))
    await eventually(lambda: paid.verify_calls() == 1, what="the first use's verify call")

    replay = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert_challenge(replay, "payment_already_used")
    assert not first.done()
    assert (await first).status == 200
    assert paid.verify_calls() == 1
    assert paid.settle_calls() == paid.upstream_calls == 1
    assert len(solana_rpc_server.sent) == 1


# --- the client hangs up after sending -----------------------------------------------------------


async def test_paid_rpc_client_gone_before_the_answer_is_settled_once_and_replayed_by_payment_identifier(
    paid: PaidGateway,
) -> None:
    paid.upstream.responder = static(200, PROVIDER_ANSWER, delay=0.2)
    payment_id = "hang-up-retry-0123456789"
    payment = await paid.payment(payment_id=payment_id)
    await send_and_hang_up(
        paid.url, GET_BALANCE, encode_body(balance_body()), {"payment-signature": encode_header(payment)}
    )
    await settled_once(paid, ROUTE)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert_answered(reply, paid.last_settled())
    assert paid.settle_calls() == 1
    assert paid.upstream_calls == 1


async def test_paid_rpc_client_gone_before_the_answer_without_identifier_is_settled_once_and_answered_again(
    paid: PaidGateway,
) -> None:
    """Most clients send no payment identifier: charged and disconnected, the identical retry still
    gets the answer it paid for; the payment buys nothing else."""
    paid.upstream.responder = static(200, PROVIDER_ANSWER, delay=0.2)
    payment = await paid.payment()
    await send_and_hang_up(
        paid.url, GET_BALANCE, encode_body(balance_body()), {"payment-signature": encode_header(payment)}
    )
    await settled_once(paid, ROUTE)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)
    other = await paid.pay(GET_BALANCE, balance_body(request_id=2), payment)

    assert_answered(reply, paid.last_settled())
    assert_challenge(other, "payment_already_used")
    assert paid.settle_calls() == 1
    assert paid.upstream_calls == 1


# --- the store goes away mid-request ---------------------------------------------------------------


async def test_paid_rpc_store_lost_during_verify_is_503_and_settles_nothing(
    start_paid_gateway: StartPaidGateway, private_redis: RedisServer
) -> None:
    """The claim was taken; the store goes away while the facilitator verifies. The provider is
    asked, but without the write-ahead record nothing is settled and its answer is withheld."""
    paid = await start_paid_gateway(env={"STATE_STORE_REST_URL": private_redis.url})
    assert paid.facilitator is not None
    payment = await paid.payment()
    paid.facilitator.inject(Fault.SLOW, endpoint="verify", delay_s=0.5, times=1)
    request = asyncio.create_task(paid.pay(GET_BALANCE, balance_body(), payment))
    await eventually(lambda: paid.verify_calls() == 1, what="the verify call")
    await asyncio.to_thread(private_redis.stop)

    reply = await request

    assert reply.status == 503, reply.body
    assert reply.error_code == "store_unavailable"
    assert "127.0.0.1" not in reply.body.decode() and b"result" not in reply.body
    assert paid.settle_calls() == 0
    assert paid.upstream_calls == 1


async def test_paid_rpc_store_lost_after_the_claim_settles_nothing_without_its_write_ahead_record(
    start_paid_gateway: StartPaidGateway, private_redis: RedisServer
) -> None:
    """The intent to settle must be in the store before the facilitator is asked; with the store
    gone the answer is withheld and nothing is settled, so "nothing was charged" is true."""
    paid = await start_paid_gateway(env={"STATE_STORE_REST_URL": private_redis.url})
    paid.upstream.responder = static(200, PROVIDER_ANSWER, delay=0.3)
    payment = await paid.payment()
    request = asyncio.create_task(paid.pay(GET_BALANCE, balance_body(), payment))
    await eventually(lambda: paid.upstream_calls == 1, what="the provider call")
    await asyncio.to_thread(private_redis.stop)

    reply = await request

    assert reply.status == 503, reply.body
    assert reply.error_code == "store_unavailable"
    assert str(MARKER) not in reply.body.decode()
    assert "payment-response" not in reply.headers
    assert paid.settle_calls() == 0
    assert paid.upstream_calls == 1


# --- the process is told to stop mid-request ------------------------------------------------------


@pytest.mark.slow
async def test_sigterm_during_a_paid_request_finishes_it_or_settles_nothing(
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    upstream: Upstream,
    start_cdp_facilitator: StartFacilitator,
    cdp_credentials: CdpCredentials,
) -> None:
    """hypercorn's graceful shutdown lets the in-flight request finish: the client gets what it
    paid for. Should the process die first instead, nothing may have been settled."""
    facilitator = await start_cdp_facilitator(
        credentials=cdp_credentials, backend=StaticBackend(fee_payer=str(usdc_chain.fee_payer.pubkey()))
    )
    upstream.responder = static(200, PROVIDER_ANSWER, delay=1.5)
    async with paid_processes(
        1, chain=usdc_chain, rpc=solana_rpc_server, upstream=upstream, facilitator=facilitator
    ) as running:
        gateway = running.replicas[0]
        payment = await running.payment(gateway)
        request = asyncio.create_task(gateway.pay(GET_BALANCE, balance_body(), payment))
        await eventually(lambda: running.upstream_calls == 1, what="the provider call")

        # In a thread: the provider and the facilitator answer from this loop meanwhile.
        exit_code = await asyncio.to_thread(gateway.process.terminate, 15)
        try:
            reply: Reply | None = await request
        except aiohttp.ClientError:
            reply = None
        assert exit_code == 0, gateway.process.stderr()

    if reply is not None and reply.status == 200:
        assert reply.json() == PROVIDER_ANSWER
        assert reply.headers["payment-response"] == reply.headers["x-payment-response"]
        assert facilitator.count("settle") == 1
    else:
        assert facilitator.count("settle") == 0
    assert running.upstream_calls == 1


@pytest.mark.slow
async def test_sigterm_past_the_graceful_timeout_mid_settle_leaves_the_payment_to_reconcile_on_a_replica(
    clean_redis_url: str,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    upstream: Upstream,
    start_cdp_facilitator: StartFacilitator,
    cdp_credentials: CdpCredentials,
) -> None:
    """The settlement was broadcast (the money moved) but its confirmation outlived the graceful
    timeout, so the process stopped before answering. The client's retry, on another replica,
    gets what it paid for, without paying twice or calling the provider again."""
    backend = LateConfirmationBackend(usdc_chain, solana_rpc_server)
    facilitator = await start_cdp_facilitator(credentials=cdp_credentials, backend=backend)
    upstream.responder = static(200, PROVIDER_ANSWER)
    payer_before = usdc_chain.balance(usdc_chain.payer_ata)
    assert payer_before is not None
    async with paid_processes(
        2,
        chain=usdc_chain,
        rpc=solana_rpc_server,
        upstream=upstream,
        facilitator=facilitator,
        env={"STATE_STORE_REST_URL": clean_redis_url},
        args=("--graceful-timeout", "0.2"),
    ) as running:
        stopping, other = running.replicas
        payment = await running.payment(stopping)
        request = asyncio.create_task(stopping.pay(GET_BALANCE, balance_body(), payment))
        await eventually(lambda: len(solana_rpc_server.sent) == 1, what="the settlement broadcast")
        exit_code = await asyncio.to_thread(stopping.process.terminate, 15)
        first = await request
        assert first.status == 503, first.body
        assert first.error_code == "settlement_pending"
        assert exit_code == 0, stopping.process.stderr()
        backend.signer.release.set()  # the facilitator gives up waiting and keeps it pending
        await eventually(backend.pending.kept.is_set, what="the facilitator's pending record")

        reply = await other.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200, reply.body
    assert reply.json() == PROVIDER_ANSWER
    assert reply.header_json("payment-response")["transaction"] == solana_rpc_server.sent[0]
    assert len(solana_rpc_server.sent) == 1
    assert usdc_chain.balance(usdc_chain.payer_ata) == payer_before - GET_BALANCE_PROVIDER_PRICE
    assert running.upstream_calls == 1
