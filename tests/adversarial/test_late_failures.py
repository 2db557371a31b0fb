"""Attack: make settlements fail on chain after the gateway stopped waiting for them.

The gateway settling with its own fee payer (``FACILITATOR_URL=internal``) waits for a
settlement's confirmation for a while (30 s by default), then answers ``settlement_pending``. A
settlement that lands and fails after that wait used to be counted nowhere: its payer owner, its
token account and its client IP never cooled down, and the owner kept its record. One stranger
on one IP made the fee payer lose a fee about every minute (605,000 lamports an hour, where the
stated bound is 66,000).

Mounted against a served gateway on LiteSVM whose transactions land 1.5 s after broadcast, with
a confirmation wait of 0.3 s (``X402_SETTLEMENT_CONFIRM_SECONDS``): as a cluster landing 35 s
after a 30 s wait. The owner drains its own token account, the drain landing first; the
settlement is answered pending, then lands and fails. The gateway follows it until it lands: the
owner, the account and the IP cool down, the owner's record is wiped, and every later attempt is
refused with nothing broadcast. The fee payer loses one fee in all. The guard's state lives in
the store replicas share: single-node Redis, then a 3-master Redis Cluster.
"""

from __future__ import annotations

import secrets

from solders.keypair import Keypair
from solders.pubkey import Pubkey

from client.svm_payer import MintInfo, build_exact_transaction, build_payment_payload
from gateway.methods.exact.fee_guard import Party
from gateway.outbound.solana_rpc import SolanaRpc
from gateway.store import Store
from gateway.x402.headers import encode_header
from gateway.x402.types import PaymentPayload, PaymentRequirements, ResourceInfo
from tests.support.adversarial_paid import ONE_SETTLEMENT_FEE, drain_transaction, via
from tests.support.paid_fixtures import (
    GET_BALANCE,
    PROVIDER_ANSWER,
    PaidGateway,
    Reply,
    StartPaidGateway,
    assert_answered,
    assert_challenge,
    balance_body,
)
from tests.support.paid_processes import stored_eventually
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.solana_rpc_server import set_token_account
from tests.support.upstream import static

redis_url = on_redis_and_cluster()

ATTACKER_IP = "203.0.113.77"
WAIT_S = "0.3"
ATTEMPTS_AFTER = 6
"""Attempts after the late failure: an hour of the old rate's failures, one a cool-down apart."""


def _sign(
    paid: PaidGateway,
    requirements: PaymentRequirements,
    resource: ResourceInfo,
    owner: Keypair,
    source: Pubkey,
) -> PaymentPayload:
    mint = MintInfo(address=str(paid.chain.mint), decimals=paid.chain.decimals)
    tx = build_exact_transaction(requirements, owner, mint, paid.chain.blockhash, source=source)
    return build_payment_payload(requirements, tx, resource=resource)


async def _pay(paid: PaidGateway, payment: PaymentPayload, request_id: int | None = None) -> Reply:
    headers = {"payment-signature": encode_header(payment), **via(ATTACKER_IP)}
    body = balance_body(request_id=secrets.randbelow(10**6) if request_id is None else request_id)
    return await paid.post(GET_BALANCE, body, headers)


async def _waiting_gateway(start_paid_gateway: StartPaidGateway, store: Store) -> PaidGateway:
    """A gateway settling with its own fee payer on ``store``, waiting ``WAIT_S`` for a
    confirmation, its provider answering."""
    paid = await start_paid_gateway(
        internal=True,
        env={"TRUSTED_PROXIES": "127.0.0.1", "X402_SETTLEMENT_CONFIRM_SECONDS": WAIT_S},
        store=store,
    )
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    return paid


async def test_a_settlement_failing_after_the_wait_cools_its_parties_down_and_costs_one_fee(
    start_paid_gateway: StartPaidGateway, clean_store: Store
) -> None:
    store = clean_store
    paid = await _waiting_gateway(start_paid_gateway, store)
    requirements, resource = await paid.requirements()
    price = int(requirements.amount)
    owner = Keypair()
    paid.chain.svm.airdrop(owner.pubkey(), 1_000_000_000)  # pays its own drains' fees
    me = Party("owner", str(owner.pubkey()))
    ip = Party("ip", ATTACKER_IP)

    # It pays once honestly while the chain lands at once: a record of its own.
    funded = set_token_account(
        paid.chain.svm, owner.pubkey(), paid.chain.mint, price, address=Keypair().pubkey()
    )
    assert_answered(await _pay(paid, _sign(paid, requirements, resource, owner, funded)))
    assert await store.get(me.record_key) == "1"

    # Then the chain lands only once the gateway's 0.3 s wait has passed (held until then, so
    # its checks see the funds the drain sent just before takes, however loaded the machine).
    paid.rpc.hold_landing = True
    fee_payer = paid.chain.fee_payer.pubkey()
    before = paid.chain.lamports(fee_payer)
    sent_before = len(paid.rpc.sent)
    account = set_token_account(
        paid.chain.svm, owner.pubkey(), paid.chain.mint, price, address=Keypair().pubkey()
    )
    payment = _sign(paid, requirements, resource, owner, account)
    rpc = SolanaRpc(paid.rpc.url)
    try:
        await rpc.send_transaction(
            drain_transaction(paid.chain, owner, [account], price), skip_preflight=True
        )
    finally:
        await rpc.close()
    pending = await _pay(paid, payment, request_id=7)

    # Broadcast, not yet known: the client is told to retry, nothing counted yet.
    assert pending.status == 503, pending.body
    assert pending.error_code == "settlement_pending"
    assert len(paid.rpc.sent) == sent_before + 2  # the drain and the settlement
    assert await store.get(me.cooldown_key) is None
    paid.rpc.land_held()
    # It lands and fails: the follow-ups cool the owner, its account and the IP down. Two of them,
    # each in its own time: the facilitator's counts the payer's side (owner, account), the
    # gateway's the client's (the IP).
    for cooling in (me, Party("account", str(account)), ip):
        await stored_eventually(store, cooling.cooldown_key)
        assert await store.get(cooling.cooldown_key) == "1", cooling
    assert await store.get(me.record_key) == "0"  # the record it paid for is wiped
    assert before - paid.chain.lamports(fee_payer) == ONE_SETTLEMENT_FEE

    # Every later attempt of the owner, and of a stranger on its IP, is refused before the
    # provider is called, nothing broadcast: one fee in all.
    calls = len(paid.upstream.calls)
    stranger = Keypair()
    for n in range(ATTEMPTS_AFTER):
        payer = owner if n % 2 == 0 else stranger
        source = set_token_account(
            paid.chain.svm, payer.pubkey(), paid.chain.mint, price, address=Keypair().pubkey()
        )
        assert_challenge(
            await _pay(paid, _sign(paid, requirements, resource, payer, source)),
            "invalid_transaction_state",
            price,
        )
    assert len(paid.upstream.calls) == calls
    assert len(paid.rpc.sent) == sent_before + 2
    assert before - paid.chain.lamports(fee_payer) == ONE_SETTLEMENT_FEE

    # The retry of the pending request is told to come back after the IP's cool-down (a
    # cool-down never fails a payment that may have settled), nothing asked or counted again.
    retry = await _pay(paid, payment, request_id=7)  # the identical request
    assert retry.status == 503 and retry.error_code == "settlement_pending", retry.body
    assert len(paid.rpc.sent) == sent_before + 2
    assert await store.get(me.record_key) == "0"


async def test_a_settlement_landing_after_the_wait_is_delivered_on_retry_and_counted_once(
    start_paid_gateway: StartPaidGateway, clean_store: Store
) -> None:
    store = clean_store  # the store replicas share
    paid = await _waiting_gateway(start_paid_gateway, store)
    requirements, resource = await paid.requirements()
    price = int(requirements.amount)
    payer = Keypair()
    source = set_token_account(
        paid.chain.svm, payer.pubkey(), paid.chain.mint, price, address=Keypair().pubkey()
    )
    me, ip = Party("owner", str(payer.pubkey())), Party("ip", ATTACKER_IP)
    paid.rpc.hold_landing = True  # until the gateway's wait has passed
    payment = _sign(paid, requirements, resource, payer, source)

    pending = await _pay(paid, payment, request_id=9)
    assert pending.status == 503 and pending.error_code == "settlement_pending", pending.body
    paid.rpc.land_held()
    # It lands (and confirms) after the wait: the follow-ups count it for the payer and the IP.
    await stored_eventually(store, me.record_key)
    await stored_eventually(store, ip.record_key)
    retry = await _pay(paid, payment, request_id=9)  # the identical request reconciles it

    assert_answered(retry, paid.rpc.sent[-1])
    assert paid.chain.balance(source) == 0
    assert len(paid.rpc.sent) == 1
    # Heard by the follow-ups and by the retry, counted once on each side.
    assert await store.get(me.record_key) == "1"
    assert await store.get(ip.record_key) == "1"
    assert await store.get(me.cooldown_key) is None and await store.get(ip.cooldown_key) is None
