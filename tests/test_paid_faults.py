"""Paid routes when something else fails: the facilitator, the provider, settlement, the store.

Settle after success: nothing is settled unless the provider answered with a
JSON-RPC ``result``; a discarded authorization stays claimed; a failed settlement withholds the
body; an unknown settlement outcome is reconciled on retry without calling the provider again.
The gateways keep their claims and intents in the shared store: single-node Redis, then a 3-master
Redis Cluster (a lost store too); the round-trip counts watch one Redis server's commands.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import redis
from x402 import x402FacilitatorSync
from x402.mechanisms.svm import FacilitatorKeypairSigner
from x402.mechanisms.svm.exact import register_exact_svm_facilitator

from gateway.store.redis import RedisStore
from gateway.store.upstash import UpstashStore
from gateway.x402.types import SOLANA_MAINNET
from tests.support.cdp_facilitator import (
    Fault,
    ReferenceBackend,
    StaticBackend,
    closed_port_url,
    settlement_signature,
)
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PROVIDER_PRICE,
    MARKER,
    PROVIDER_ANSWER,
    PROVIDER_KEY,
    PaidGateway,
    StartPaidGateway,
    assert_challenge,
    balance_body,
    paid_gateways_on_the_store,
)
from tests.support.redis_cluster import RedisCluster
from tests.support.redis_fixtures import ON_REDIS_ONLY, on_redis_and_cluster
from tests.support.redis_server import RedisServer
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstash_rest import UpstashRestServer
from tests.support.upstream import static

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")
redis_url = on_redis_and_cluster()
start_paid_gateway = paid_gateways_on_the_store()


# --- the facilitator at verify -----------------------------------------------------------------


async def test_paid_rpc_invalid_payment_per_facilitator_is_402_with_its_reason(paid: PaidGateway) -> None:
    assert paid.facilitator is not None
    paid.facilitator.inject(Fault.VERIFY_INVALID, reason="insufficient_funds")
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert_challenge(reply, "insufficient_funds")
    assert paid.verify_calls() == 1
    assert paid.settle_calls() == paid.upstream_calls == 0


async def test_paid_rpc_payment_refused_by_the_facilitator_can_be_retried(paid: PaidGateway) -> None:
    """A verify refusal claims nothing: the same payment is judged again on the next try."""
    assert paid.facilitator is not None
    paid.facilitator.inject(Fault.VERIFY_INVALID, reason="transaction_simulation_failed", times=1)
    payment = await paid.payment()
    assert (await paid.pay(GET_BALANCE, balance_body(), payment)).status == 402

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200
    assert paid.verify_calls() == 2
    assert paid.settle_calls() == paid.upstream_calls == 1


@pytest.mark.parametrize("fault", ["down", "slow", "invalid_json", "http_500", "unauthorized"])
async def test_paid_rpc_facilitator_unavailable_at_verify_is_503_and_calls_no_provider(
    start_paid_gateway: StartPaidGateway, fault: str
) -> None:
    paid = await start_paid_gateway(env={"UPSTREAM_TIMEOUT_SECONDS": "0.5"})
    assert paid.facilitator is not None
    payment = await paid.payment()  # /supported is known (and cached) from here on
    if fault == "down":
        await paid.facilitator.stop()
    elif fault == "slow":
        paid.facilitator.inject(Fault.SLOW, endpoint="verify", delay_s=2.0)
    elif fault == "invalid_json":
        paid.facilitator.inject(Fault.INVALID_JSON, endpoint="verify")
    elif fault == "http_500":
        paid.facilitator.inject(Fault.HTTP_ERROR, endpoint="verify")
    else:
        paid.facilitator.inject(Fault.HTTP_ERROR, endpoint="verify", status=401)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 503
    assert reply.error_code == "facilitator_unavailable"
    assert paid.facilitator.base_url not in reply.body.decode()
    assert paid.settle_calls() == paid.upstream_calls == 0


async def test_paid_rpc_payment_survives_a_facilitator_outage(paid: PaidGateway) -> None:
    """Nothing is claimed when verify could not be asked: the same payment works afterwards."""
    assert paid.facilitator is not None
    payment = await paid.payment()
    paid.facilitator.inject(Fault.HTTP_ERROR, endpoint="verify", times=1)
    assert (await paid.pay(GET_BALANCE, balance_body(), payment)).status == 503

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200
    assert paid.upstream_calls == paid.settle_calls() == 1


async def test_paid_rpc_facilitator_down_before_any_challenge_still_challenges(
    start_paid_gateway: StartPaidGateway,
) -> None:
    """An unpaid request always gets its 402; with no fee payer known from anywhere it names
    none (tests/adversarial/test_paid_challenge.py covers the sources that know one)."""
    paid = await start_paid_gateway(env={"FACILITATOR_URL": closed_port_url()})

    reply = await paid.post(GET_BALANCE, balance_body())

    assert reply.status == 402, reply.body
    accepted = reply.header_json("payment-required")["accepts"][0]
    assert accepted["amount"] == str(GET_BALANCE_PROVIDER_PRICE)
    assert "feePayer" not in (accepted.get("extra") or {})
    assert paid.upstream_calls == 0


# --- the provider fails: nothing is settled, the authorization is discarded ----------------------

UPSTREAM_FAILURES = {
    "http_500": static(500, {"error": "internal"}),
    "http_429": static(429, {"error": "slow down"}),
    "json_rpc_error": static(
        200, {"jsonrpc": "2.0", "id": 1, "error": {"code": -32005, "message": "behind"}}
    ),
    "missing_result": static(200, {"jsonrpc": "2.0", "id": 1}),
    "invalid_json": static(200, text='{"jsonrpc": "2.0", "result": '),
    "not_an_object": static(200, [1, 2, 3]),
}


def _failing_provider(failure: str) -> dict[str, str]:
    """Gateway env for ``failure`` (a refused connection needs another provider URL)."""
    if failure != "refused":
        return {}
    return {"PROVIDER_A_MAINNET_RPC_URL": closed_port_url("/rpc") + f"?api-key={PROVIDER_KEY}"}


@pytest.mark.parametrize("failure", [*UPSTREAM_FAILURES, "refused"])
async def test_paid_rpc_upstream_failure_is_502_and_settles_nothing(
    start_paid_gateway: StartPaidGateway, failure: str
) -> None:
    paid = await start_paid_gateway(env=_failing_provider(failure))
    paid.upstream.responder = UPSTREAM_FAILURES.get(failure)
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 502
    assert reply.error_code == "upstream_error"
    assert "payment-response" not in reply.headers and "x-payment-response" not in reply.headers
    assert PROVIDER_KEY not in reply.body.decode()
    assert paid.verify_calls() == 1
    assert paid.settle_calls() == 0
    assert paid.upstream_calls == (0 if failure == "refused" else 1)


async def test_paid_rpc_json_rpc_error_is_passed_on_without_the_provider_key(paid: PaidGateway) -> None:
    message = f"invalid params for /provider-a/mainnet?api-key={PROVIDER_KEY}"
    error = {"code": -32602, "message": message}
    paid.upstream.responder = static(200, {"jsonrpc": "2.0", "id": 1, "error": error})
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 502
    assert reply.error_code == "upstream_error"
    assert reply.json()["error"]["details"]["rpcError"]["code"] == -32602
    assert "invalid params" in reply.json()["error"]["details"]["rpcError"]["message"]
    assert PROVIDER_KEY not in reply.body.decode()
    assert paid.settle_calls() == 0


@pytest.mark.parametrize(
    "failure", ["http_500", "json_rpc_error", "missing_result", "invalid_json", "refused"]
)
async def test_paid_rpc_payment_of_a_failed_call_cannot_be_reused(
    start_paid_gateway: StartPaidGateway, failure: str
) -> None:
    paid = await start_paid_gateway(env=_failing_provider(failure))
    paid.upstream.responder = UPSTREAM_FAILURES.get(failure)
    payment = await paid.payment()
    assert (await paid.pay(GET_BALANCE, balance_body(), payment)).status == 502
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    calls = paid.upstream_calls

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert_challenge(reply, "payment_already_used")
    assert paid.upstream_calls == calls
    assert paid.settle_calls() == 0
    assert paid.verify_calls() == 1


async def test_paid_rpc_upstream_timeout_is_504_and_settles_nothing(
    start_paid_gateway: StartPaidGateway,
) -> None:
    paid = await start_paid_gateway(env={"UPSTREAM_TIMEOUT_SECONDS": "0.2"})
    paid.upstream.responder = static(200, PROVIDER_ANSWER, delay=0.5)
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 504
    assert reply.error_code == "upstream_timeout"
    assert "payment-response" not in reply.headers
    assert paid.settle_calls() == 0
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    assert_challenge(await paid.pay(GET_BALANCE, balance_body(), payment), "payment_already_used")
    assert paid.settle_calls() == 0


# --- settlement -----------------------------------------------------------------------------------


async def test_paid_rpc_settlement_failure_is_402_and_withholds_the_body(paid: PaidGateway) -> None:
    assert paid.facilitator is not None
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    paid.facilitator.inject(Fault.SETTLE_FAILURE, reason="insufficient_funds")
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert_challenge(reply, "settlement_failed")
    assert str(MARKER).encode() not in reply.body
    assert "x-payment-response" not in reply.headers
    assert paid.upstream_calls == 1
    assert paid.settle_calls() == 1


async def test_paid_rpc_facilitator_down_at_settle_withholds_the_body(paid: PaidGateway) -> None:
    assert paid.facilitator is not None
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    paid.facilitator.inject(Fault.HTTP_ERROR, endpoint="settle", status=502)
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 503
    assert reply.error_code == "settlement_pending"
    assert str(MARKER).encode() not in reply.body
    assert "payment-response" not in reply.headers


async def test_paid_rpc_pending_settlement_is_503_with_retry_after(paid: PaidGateway) -> None:
    assert paid.facilitator is not None
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    paid.facilitator.inject(Fault.SETTLE_PENDING, times=1)
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 503
    assert reply.error_code == "settlement_pending"
    assert int(reply.headers["retry-after"]) >= 1
    assert str(MARKER).encode() not in reply.body
    assert "payment-response" not in reply.headers
    assert paid.upstream_calls == paid.settle_calls() == 1


async def test_paid_rpc_retry_after_pending_settlement_reconciles_without_the_provider(
    paid: PaidGateway,
) -> None:
    assert paid.facilitator is not None
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    paid.facilitator.inject(Fault.SETTLE_PENDING, times=1)
    payment = await paid.payment()
    assert (await paid.pay(GET_BALANCE, balance_body(), payment)).status == 503

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200
    assert reply.json() == PROVIDER_ANSWER
    assert reply.headers["payment-response"] == reply.headers["x-payment-response"]
    settle = paid.facilitator.calls_to("settle")
    assert len(settle) == 2 and settle[1].body is not None
    assert reply.header_json("payment-response")["transaction"] == settlement_signature(settle[1].body)
    assert paid.upstream_calls == 1
    assert paid.verify_calls() == 1


async def test_paid_rpc_retry_whose_first_settlement_landed_delivers_on_duplicate_settlement(
    paid: PaidGateway,
) -> None:
    """The first settle's answer was lost (pending) but the broadcast landed: on the retry the
    facilitator answers duplicate_settlement with the transaction, and the client gets its data."""
    assert paid.facilitator is not None
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    paid.facilitator.inject(Fault.SETTLE_PENDING, times=1)
    payment = await paid.payment()
    assert (await paid.pay(GET_BALANCE, balance_body(), payment)).status == 503
    paid.facilitator.inject(Fault.SETTLE_PENDING, reason="duplicate_settlement", times=1)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200
    assert reply.json() == PROVIDER_ANSWER
    settlement = reply.header_json("payment-response")
    assert settlement["success"] is True and "errorReason" not in settlement
    settle = paid.facilitator.calls_to("settle")
    assert len(settle) == 2 and settle[1].body is not None
    assert settlement["transaction"] == settlement_signature(settle[1].body)
    assert paid.upstream_calls == 1


async def test_paid_rpc_duplicate_settlement_outside_a_retry_is_a_settlement_failure(
    paid: PaidGateway,
) -> None:
    assert paid.facilitator is not None
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    paid.facilitator.inject(Fault.SETTLE_PENDING, reason="duplicate_settlement", times=1)

    reply = await paid.pay(GET_BALANCE, balance_body(), await paid.payment())

    assert_challenge(reply, "settlement_failed")
    assert str(MARKER).encode() not in reply.body


async def test_paid_rpc_retry_after_pending_with_another_body_is_refused(paid: PaidGateway) -> None:
    assert paid.facilitator is not None
    paid.facilitator.inject(Fault.SETTLE_PENDING, times=1)
    payment = await paid.payment()
    assert (await paid.pay(GET_BALANCE, balance_body(), payment)).status == 503

    reply = await paid.pay(GET_BALANCE, balance_body(request_id=2), payment)

    assert_challenge(reply, "payment_already_used")
    assert paid.upstream_calls == paid.settle_calls() == 1


class _ImpatientSigner(FacilitatorKeypairSigner):
    """The reference fee-payer signer, waiting at most 1 s for confirmation (not 30 s)."""

    def confirm_transaction(self, signature: str, network: str, timeout_seconds: int = 30) -> None:
        super().confirm_transaction(signature, network, timeout_seconds=1)


class ImpatientReferenceBackend(ReferenceBackend):
    """The reference facilitator whose confirmation wait times out quickly: a broadcast it
    cannot confirm yet is answered ``settlement_pending`` and reconciled on the next settle."""

    def __init__(self, chain: UsdcChain, rpc: LiteSvmRpcServer) -> None:
        self.fee_payer = chain.fee_payer
        self.facilitator = x402FacilitatorSync()
        self._signer = _ImpatientSigner(chain.fee_payer, rpc_url=rpc.url)
        register_exact_svm_facilitator(self.facilitator, self._signer, networks=[SOLANA_MAINNET])


async def test_paid_rpc_pending_settlement_that_landed_is_reconciled_by_the_reference_facilitator(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    """The money moved but confirmation was late: the retry must not re-verify (the funds are
    gone, a simulation would now fail) but settle again, which reconciles the signature."""
    paid = await start_paid_gateway(backend=ImpatientReferenceBackend(usdc_chain, solana_rpc_server))
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    payment = await paid.payment()
    before = usdc_chain.balance(usdc_chain.payer_ata)
    solana_rpc_server.hold_confirmations = True
    first = await paid.pay(GET_BALANCE, balance_body(), payment)
    assert first.status == 503 and first.error_code == "settlement_pending"
    assert usdc_chain.balance(usdc_chain.payer_ata) == before - GET_BALANCE_PROVIDER_PRICE  # type: ignore[operator]
    solana_rpc_server.release_confirmations()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200, reply.body
    assert reply.json() == PROVIDER_ANSWER
    assert reply.header_json("payment-response")["transaction"] == solana_rpc_server.sent[0]
    assert len(solana_rpc_server.sent) == 1
    assert usdc_chain.balance(usdc_chain.payer_ata) == before - GET_BALANCE_PROVIDER_PRICE  # type: ignore[operator]
    assert paid.upstream_calls == 1


# --- the store ----------------------------------------------------------------------------------


class StoreCommands:
    """The commands clients send a Redis server while the block runs (``MONITOR``), without the
    ones scripts run inside the server: what the gateway pays a network round trip for."""

    STOP = "round-trip-count-done"

    def __init__(self, url: str) -> None:
        self.url = url
        self.commands: list[str] = []
        self._ready = threading.Event()

    def _listen(self) -> None:
        with redis.Redis.from_url(self.url).monitor() as monitor:
            self._ready.set()
            for entry in monitor.listen():
                if self.STOP in entry["command"]:
                    return
                if entry["client_type"] != "lua":
                    self.commands.append(entry["command"].split(" ", 1)[0].upper())

    async def __aenter__(self) -> StoreCommands:
        self._stopper = redis.Redis.from_url(self.url)
        self._stopper.ping()  # connected before the count starts: its handshake is not counted
        self._thread = threading.Thread(target=self._listen, daemon=True)
        self._thread.start()
        await asyncio.to_thread(self._ready.wait, 5)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        with self._stopper:
            self._stopper.echo(self.STOP)
        await asyncio.to_thread(self._thread.join, 5)


@pytest.mark.parametrize("payment_id", [None, "round-trips-0123456789"])
@ON_REDIS_ONLY
async def test_paid_rpc_takes_four_store_round_trips(
    start_paid_gateway: StartPaidGateway, private_redis: RedisServer, payment_id: str | None
) -> None:
    """The claim in two (at once, the payer's step: used? identifier known? its buckets, then the
    payment and its identifier; and the IP's: its refusal guard; then the route's shared budget),
    the write-ahead intent, the delivery (closing the intent, keeping the replay): four round
    trips of five commands, whatever the identifier. The usage flush and the challenge-limit
    sync run in the background, off the request's path."""
    env = {"STATE_STORE_REST_URL": private_redis.url, "RATE_LIMIT_SYNC_SECONDS": "10"}
    paid = await start_paid_gateway(env=env)
    warm_up = await paid.pay(GET_BALANCE, balance_body(), await paid.payment())  # loads the scripts
    payment = await paid.payment(payment_id=payment_id)
    await paid.running.services.usage.flush()

    async with StoreCommands(private_redis.url) as store:
        reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert warm_up.status == reply.status == 200, reply.body
    assert store.commands == ["EVALSHA", "EVALSHA", "EVALSHA", "SET", "EVALSHA"]
    assert paid.settle_calls() == 2


@ON_REDIS_ONLY
async def test_paid_rpc_replay_is_refused_in_one_store_round_trip(
    start_paid_gateway: StartPaidGateway, private_redis: RedisServer
) -> None:
    """The claim's first round trip also reads the payment's pending record: a used payment
    offered again costs one round trip (the payer's and the IP's steps, sent at once), nothing
    of the shared budget and no facilitator call."""
    env = {"STATE_STORE_REST_URL": private_redis.url, "RATE_LIMIT_SYNC_SECONDS": "10"}
    paid = await start_paid_gateway(env=env)
    payment = await paid.payment()
    first = await paid.pay(GET_BALANCE, balance_body(), payment)
    await paid.running.services.usage.flush()

    async with StoreCommands(private_redis.url) as store:
        replay = await paid.pay(GET_BALANCE, balance_body(request_id=2), payment)
        again = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert first.status == 200, first.body
    assert replay.status == 402 and replay.json()["error"] == "payment_already_used"
    assert (again.status, again.body) == (200, first.body)  # the identical request: its answer again
    assert store.commands == ["EVALSHA"] * 4
    assert paid.verify_calls() == paid.settle_calls() == 1


@ON_REDIS_ONLY
async def test_paid_rpc_retry_of_a_pending_settlement_takes_three_store_round_trips_of_four_commands(
    start_paid_gateway: StartPaidGateway, private_redis: RedisServer
) -> None:
    """The retry's claim round trip finds the pending record it reconciles with; the retry marks
    it as retried before it settles (so the request that recorded it, were it still settling,
    would know a duplicate it hears is its retry's); the delivery is the third. The provider is
    not called again."""
    env = {"STATE_STORE_REST_URL": private_redis.url, "RATE_LIMIT_SYNC_SECONDS": "10"}
    paid = await start_paid_gateway(env=env)
    assert paid.facilitator is not None
    warm_up = await paid.pay(GET_BALANCE, balance_body(), await paid.payment())  # loads the scripts
    paid.facilitator.inject(Fault.SETTLE_PENDING, times=1)
    payment = await paid.payment()
    first = await paid.pay(GET_BALANCE, balance_body(), payment)
    await paid.running.services.usage.flush()

    async with StoreCommands(private_redis.url) as store:
        retry = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert warm_up.status == 200 and first.status == 503 and retry.status == 200, retry.body
    assert store.commands == ["EVALSHA", "EVALSHA", "SET", "EVALSHA"]  # the claim's two at once
    assert paid.upstream_calls == 2 and paid.settle_calls() == 3  # the warm-up's, then one each


@ON_REDIS_ONLY
async def test_paid_rpc_takes_five_requests_over_upstash_rest(
    start_paid_gateway: StartPaidGateway, private_redis: RedisServer
) -> None:
    """Over Upstash REST each command of the four round trips is one HTTP request (the claim's
    first two at once)."""
    rest = UpstashRestServer(private_redis.url, "round-trip-token")
    url = await rest.start()
    try:
        env = {"RATE_LIMIT_SYNC_SECONDS": "10"}
        paid = await start_paid_gateway(env=env, store=UpstashStore(url, "round-trip-token"))
        warm_up = await paid.pay(GET_BALANCE, balance_body(), await paid.payment())  # loads the scripts
        payment = await paid.payment(payment_id="upstash-round-trips-0123")
        await paid.running.services.usage.flush()
        rest.requests.clear()

        reply = await paid.pay(GET_BALANCE, balance_body(), payment)
        requests = list(rest.requests)
    finally:
        await rest.stop()

    assert warm_up.status == reply.status == 200, reply.body
    assert requests == ["EVALSHA", "EVALSHA", "EVALSHA", "SET", "EVALSHA"]


async def test_paid_rpc_store_down_is_503_and_calls_nothing(
    start_paid_gateway: StartPaidGateway, private_store: RedisServer | RedisCluster
) -> None:
    paid = await start_paid_gateway(env={"STATE_STORE_REST_URL": private_store.url})
    payment = await paid.payment()  # the store is up for the challenge
    private_store.stop()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 503
    assert reply.error_code == "store_unavailable"
    assert "127.0.0.1" not in reply.body.decode()
    assert paid.verify_calls() == paid.settle_calls() == paid.upstream_calls == 0


@ON_REDIS_ONLY
async def test_paid_rpc_store_that_hangs_is_503_within_the_store_timeout_and_calls_nothing(
    start_paid_gateway: StartPaidGateway,
) -> None:
    """A store that accepts the connection and never answers: the request fails closed after
    ``STATE_STORE_TIMEOUT_SECONDS`` (0.3 s here), not the 2 s default, and nothing is charged."""
    hung: list[asyncio.StreamWriter] = []

    async def accept_and_stay_silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        hung.append(writer)

    silent = await asyncio.start_server(accept_and_stay_silent, "127.0.0.1", 0)
    url = f"redis://127.0.0.1:{silent.sockets[0].getsockname()[1]}/0"
    try:
        env = {"STATE_STORE_REST_URL": url, "STATE_STORE_TIMEOUT_SECONDS": "0.3"}
        paid = await start_paid_gateway(env=env)
        payment = await paid.payment()
        loop = asyncio.get_running_loop()
        started = loop.time()
        reply = await paid.pay(GET_BALANCE, balance_body(), payment)
        waited = loop.time() - started
    finally:
        for writer in hung:
            writer.close()
        silent.close()
        await silent.wait_closed()

    assert reply.status == 503 and reply.error_code == "store_unavailable", reply.body
    assert "127.0.0.1" not in reply.body.decode()
    assert paid.verify_calls() == paid.settle_calls() == paid.upstream_calls == 0
    # At least the configured 0.3 s, and well short of the 2 s default (a loaded machine adds a second).
    assert 0.3 <= waited < 1.9, waited


@ON_REDIS_ONLY
async def test_paid_rpc_store_refusing_the_claim_is_503_before_verify_and_calls_nothing(
    start_paid_gateway: StartPaidGateway, private_redis: RedisServer, usdc_chain: UsdcChain
) -> None:
    """The store refuses to write payment claims (the gateway's user may read but not write them:
    an operator's ACL change, say): fail closed before the facilitator is asked, nothing reaches
    the provider, nothing is settled."""
    admin = redis.Redis.from_url(private_redis.url)
    admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", "gateway", "on", ">gateway-password", "+@all",
        "~{x402gw}:rl*", "~{x402gw:*", "~{x402gw}:pending:*", "~{x402gw}:pid:*", "%R~{x402gw}:pay:*",
    )  # fmt: skip
    admin.close()
    url = private_redis.url.replace("redis://", "redis://gateway:gateway-password@")
    backend = StaticBackend(fee_payer=str(usdc_chain.fee_payer.pubkey()))
    paid = await start_paid_gateway(store=RedisStore(url), backend=backend)
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 503
    assert reply.error_code == "store_unavailable"
    assert "gateway-password" not in reply.body.decode()
    assert paid.verify_calls() == paid.settle_calls() == paid.upstream_calls == 0


async def test_paid_rpc_store_outage_still_answers_a_challenge_and_keeps_the_ip_limit(
    start_paid_gateway: StartPaidGateway, private_store: RedisServer | RedisCluster
) -> None:
    """A 402 needs nothing from the store: the per-IP challenge limit is decided in the process
    and goes on counting there while the store is down."""
    env = {"STATE_STORE_REST_URL": private_store.url, "RATE_LIMIT_CHALLENGE_PER_MINUTE": "2"}
    paid = await start_paid_gateway(env=env)
    private_store.stop()

    replies = [await paid.post(GET_BALANCE, balance_body()) for _ in range(3)]

    assert [reply.status for reply in replies] == [402, 402, 429]
    accepted = replies[0].header_json("payment-required")["accepts"][0]
    assert accepted["amount"] == str(GET_BALANCE_PROVIDER_PRICE)
    assert replies[2].error_code == "rate_limited"
    assert paid.upstream_calls == paid.verify_calls() == 0


# --- secrets ------------------------------------------------------------------------------------


async def test_paid_rpc_logs_carry_the_settlement_but_no_secret(
    start_paid_gateway: StartPaidGateway, log_lines: list[str]
) -> None:
    paid = await start_paid_gateway(env={"LOG_LEVEL": "DEBUG"})
    assert paid.facilitator is not None and paid.facilitator.credentials is not None
    assert (await paid.pay(GET_BALANCE, balance_body(), await paid.payment())).status == 200
    paid.upstream.responder = static(500, {"error": f"bad key {PROVIDER_KEY}"})
    assert (await paid.pay(GET_BALANCE, balance_body(), await paid.payment())).status == 502
    paid.facilitator.inject(Fault.HTTP_ERROR, endpoint="verify", status=401)
    assert (await paid.pay(GET_BALANCE, balance_body(), await paid.payment())).status == 503

    text = "\n".join(log_lines)
    assert PROVIDER_KEY not in text
    assert paid.facilitator.credentials.secret not in text
    settled = [json.loads(line) for line in log_lines if '"payment settled"' in line]
    assert len(settled) == 1
    assert settled[0]["payer"] == str(paid.chain.payer.pubkey())
    assert settled[0]["amount"] == str(GET_BALANCE_PROVIDER_PRICE)
