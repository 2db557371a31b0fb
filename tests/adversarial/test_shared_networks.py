"""Attacks and bursts through shared networks, against the gateway settling with its own fee payer
(``FACILITATOR_URL=internal``) on LiteSVM, behind a trusted proxy (``X-Forwarded-For``).

* A wallet that drains its own token accounts while its settlements are in flight (the drain
  race, see ``test_fee_payer_drain_race.py``) cools its client IP down. An honest wallet with a
  record of settled payments on that same IP (a NAT, a cloud egress) is still served, within its
  own allowance; a wallet without a record there is refused, nothing broadcast.
* 20 IPv6 addresses of one /64, each a fresh wallet running the drain race at once, cost the fee
  payer what one IPv4 address does: one failed settlement (it was 20, 220,000 lamports).
* A neighbour inside a subnet the proxy lives in cannot pick its own bucket by writing an
  ``X-Forwarded-For`` hop, once only the proxy's own address is trusted (as ``deploy/`` does).
* A wallet that paid for a record costs the fee payer at most its own allowance (``1 + 2 x``
  its settled payments), then cools down everywhere.
* 10 paid calls at once from a wallet that settled 5 are broadcast in one round: its record
  allows 11 in flight, and every one of them lands before the first is confirmed.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import secrets
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import pytest
import yaml
from solders.keypair import Keypair
from solders.pubkey import Pubkey

from client.svm_payer import MintInfo, build_exact_transaction, build_payment_payload
from gateway.outbound.solana_rpc import SolanaRpc
from gateway.x402.headers import encode_header
from gateway.x402.types import PaymentPayload, PaymentRequirements, ResourceInfo
from tests.support.adversarial_paid import ONE_SETTLEMENT_FEE, drain_transaction, funded_wallet, via
from tests.support.paid_fixtures import (
    GET_BALANCE,
    PROVIDER_ANSWER,
    PaidGateway,
    Reply,
    StartPaidGateway,
    assert_answered,
    assert_challenge,
    balance_body,
    paid_gateways_on_the_store,
)
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.solana_rpc_server import set_token_account
from tests.support.upstream import static

redis_url = on_redis_and_cluster()
start_paid_gateway = paid_gateways_on_the_store()

FAILED_FEES = 'x402_fee_payer_fees_lamports_total{outcome="failed"}'
HELD_BACK_IN_FLIGHT = 'x402_settlements_held_back_total{reason="in_flight"}'
SHARED_IP = "198.51.100.23"
PROXIED = {"TRUSTED_PROXIES": "127.0.0.1"}
LAND_DELAY_S = 2.0
"""Broadcast to landing: long enough for 20 requests at once to reach their broadcast on a
busy machine before the drains (sent first) land. Set for the races and bursts only: a payment
made alone (a wallet's record) has nothing to race, and would wait it out for nothing."""


def _metric(reply: Reply, series: str) -> float:
    for line in reply.body.decode().splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _sign(
    paid: PaidGateway,
    requirements: PaymentRequirements,
    resource: ResourceInfo,
    owner: Keypair,
    source: Pubkey | None = None,
) -> PaymentPayload:
    mint = MintInfo(address=str(paid.chain.mint), decimals=paid.chain.decimals)
    tx = build_exact_transaction(requirements, owner, mint, paid.chain.blockhash, source=source)
    return build_payment_payload(requirements, tx, resource=resource)


async def _internal(start_paid_gateway: StartPaidGateway, **env: str) -> PaidGateway:
    """The gateway settling with its own fee payer, behind the trusted proxy at 127.0.0.1."""
    paid = await start_paid_gateway(internal=True, env={**PROXIED, **env})
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    return paid


async def _pay(paid: PaidGateway, payment: PaymentPayload, ip: str) -> Reply:
    headers = {"payment-signature": encode_header(payment), **via(ip)}
    return await paid.post(GET_BALANCE, balance_body(request_id=secrets.randbelow(10**6)), headers)


async def _drain_race(paid: PaidGateway, rpc: SolanaRpc, ips: Sequence[str]) -> list[Reply]:
    """One fresh wallet per address in ``ips``, each holding one price in its own token account,
    pays from it while its own transaction empties the account (landing before ours do)."""
    requirements, resource = await paid.requirements()
    price = int(requirements.amount)
    race = []
    for ip in ips:
        owner = Keypair()
        paid.chain.svm.airdrop(owner.pubkey(), 100_000_000)  # pays its own drain's fee
        account = set_token_account(paid.chain.svm, owner.pubkey(), paid.chain.mint, price)
        race.append((ip, _sign(paid, requirements, resource, owner, account), owner, account))
    for _, _, owner, account in race:
        drain = drain_transaction(paid.chain, owner, [account], price)
        await rpc.send_transaction(drain, skip_preflight=True)
    return list(await asyncio.gather(*(_pay(paid, payment, ip) for ip, payment, _, _ in race)))


@pytest.mark.slow
async def test_an_honest_wallet_with_a_record_is_served_on_the_ip_of_a_draining_attacker(
    start_paid_gateway: StartPaidGateway,
) -> None:
    paid = await _internal(start_paid_gateway)
    requirements, resource = await paid.requirements()
    price = int(requirements.amount)
    honest, honest_ata = funded_wallet(paid.chain, 100 * price)
    fee_payer = paid.chain.fee_payer.pubkey()
    for _ in range(2):  # the honest wallet's record: 2 settled payments, so 5 may be in flight
        assert_answered(await _pay(paid, _sign(paid, requirements, resource, honest), SHARED_IP))
    paid.rpc.land_delay_s = LAND_DELAY_S
    before = paid.chain.lamports(fee_payer)
    failed_before = _metric(await paid.get("/metrics"), FAILED_FEES)
    rpc = SolanaRpc(paid.rpc.url)
    try:
        (attack,) = await _drain_race(paid, rpc, [SHARED_IP])
    finally:
        await rpc.close()
    assert_challenge(attack, "settlement_failed", price)
    assert before - paid.chain.lamports(fee_payer) == ONE_SETTLEMENT_FEE  # its one failed fee
    assert _metric(await paid.get("/metrics"), FAILED_FEES) - failed_before in (
        ONE_SETTLEMENT_FEE,
        ONE_SETTLEMENT_FEE + 1,  # the priority fee as computed (rounded up), which LiteSVM does not charge
    )

    # The shared IP cools down, but the honest wallet's own record vouches for it: one at a
    # time, then 5 at once (its allowance), every one settled.
    usdc_before, lamports_before = paid.chain.balance(honest_ata) or 0, paid.chain.lamports(fee_payer)
    paid.rpc.land_delay_s = 0.0  # alone: nothing to race
    assert_answered(await _pay(paid, _sign(paid, requirements, resource, honest), SHARED_IP))
    burst = [_sign(paid, requirements, resource, honest) for _ in range(5)]
    paid.rpc.land_delay_s = LAND_DELAY_S  # all five in flight at once
    replies = await asyncio.gather(*(_pay(paid, payment, SHARED_IP) for payment in burst))
    paid.rpc.land_delay_s = 0.0
    for reply in replies:
        assert_answered(reply)
    assert usdc_before - (paid.chain.balance(honest_ata) or 0) == 6 * price
    assert lamports_before - paid.chain.lamports(fee_payer) == 6 * ONE_SETTLEMENT_FEE

    # A wallet without a record of its own is refused on that IP, before anything moves; the
    # same wallet from another IP is served.
    stranger, stranger_ata = funded_wallet(paid.chain, 10 * price)
    lamports_before = paid.chain.lamports(fee_payer)
    refused = await _pay(paid, _sign(paid, requirements, resource, stranger), SHARED_IP)
    assert_challenge(refused, "invalid_transaction_state", price)
    assert paid.chain.balance(stranger_ata) == 10 * price
    assert paid.chain.lamports(fee_payer) == lamports_before
    assert_answered(await _pay(paid, _sign(paid, requirements, resource, stranger), "198.51.100.24"))
    assert paid.chain.balance(stranger_ata) == 9 * price


@pytest.mark.slow
async def test_a_wallet_with_a_record_costs_at_most_its_own_allowance_then_cools_down(
    start_paid_gateway: StartPaidGateway,
) -> None:
    """What an attacker that paid for a record can cost: one settled payment allows it 3
    settlements in flight (``1 + 2 x 1``), all of which its drain makes fail; then it cools down
    everywhere, and its record is gone."""
    paid = await _internal(start_paid_gateway)
    requirements, resource = await paid.requirements()
    price = int(requirements.amount)
    owner, ata = funded_wallet(paid.chain, 10 * price)
    paid.chain.svm.airdrop(owner.pubkey(), 100_000_000)  # pays its own drain's fee
    assert_answered(await _pay(paid, _sign(paid, requirements, resource, owner), "198.51.100.31"))
    paid.rpc.land_delay_s = LAND_DELAY_S
    fee_payer = paid.chain.fee_payer.pubkey()
    before = paid.chain.lamports(fee_payer)
    accounts = [
        set_token_account(paid.chain.svm, owner.pubkey(), paid.chain.mint, price, address=Keypair().pubkey())
        for _ in range(6)
    ]
    payments = [_sign(paid, requirements, resource, owner, account) for account in accounts]
    rpc = SolanaRpc(paid.rpc.url)
    try:
        drain = drain_transaction(paid.chain, owner, accounts, price)
        await rpc.send_transaction(drain, skip_preflight=True)
        replies = await asyncio.gather(*(_pay(paid, payment, "198.51.100.31") for payment in payments))
    finally:
        await rpc.close()

    assert [r.status for r in replies] == [402] * 6
    assert before - paid.chain.lamports(fee_payer) == 3 * ONE_SETTLEMENT_FEE  # its allowance, no more
    # Cooling down itself: refused from any IP, nothing moved, however much it still holds.
    refused = await _pay(paid, _sign(paid, requirements, resource, owner), "198.51.100.32")
    assert_challenge(refused, "invalid_transaction_state", price)
    assert paid.chain.balance(ata) == 9 * price
    assert before - paid.chain.lamports(fee_payer) == 3 * ONE_SETTLEMENT_FEE


async def _lost_to_drain_race(paid: PaidGateway, ips: Sequence[str]) -> int:
    fee_payer = paid.chain.fee_payer.pubkey()
    before = paid.chain.lamports(fee_payer)
    rpc = SolanaRpc(paid.rpc.url)
    try:
        replies = await _drain_race(paid, rpc, ips)
    finally:
        await rpc.close()
    assert all(reply.status == 402 for reply in replies), [r.status for r in replies]
    assert {r.json()["error"] for r in replies} <= {
        "settlement_failed",
        "invalid_transaction_state",
        "transaction_simulation_failed",
    }
    return before - paid.chain.lamports(fee_payer)


@pytest.mark.slow
async def test_twenty_ipv6_addresses_of_one_64_cost_the_fee_payer_what_one_ipv4_address_does(
    start_paid_gateway: StartPaidGateway,
) -> None:
    paid = await _internal(start_paid_gateway)
    paid.rpc.land_delay_s = LAND_DELAY_S

    one_ipv4 = await _lost_to_drain_race(paid, ["203.0.113.77"] * 20)
    one_64 = await _lost_to_drain_race(paid, [f"2001:db8:77:1:{i:x}::{i + 1:x}" for i in range(20)])

    assert one_ipv4 == ONE_SETTLEMENT_FEE
    assert one_64 == one_ipv4  # (each address its own client: 20 failed fees, 200,000 lamports)


@pytest.mark.slow
async def test_keyed_per_address_the_same_64_is_twenty_clients(start_paid_gateway: StartPaidGateway) -> None:
    """What ``CLIENT_IPV6_PREFIX_LENGTH=128`` (every address a client) gives the attacker: more
    than one failed settlement in the same round, which the /64 default denies it."""
    paid = await _internal(start_paid_gateway, CLIENT_IPV6_PREFIX_LENGTH="128")
    paid.rpc.land_delay_s = LAND_DELAY_S

    lost = await _lost_to_drain_race(paid, [f"2001:db8:78:1::{i + 1:x}" for i in range(20)])

    assert lost > ONE_SETTLEMENT_FEE
    assert lost % ONE_SETTLEMENT_FEE == 0


def _deploy_trust_prefix() -> int:
    """The prefix length of what deploy/compose.yaml's gateways trust by default."""
    compose = yaml.safe_load((Path(__file__).parents[2] / "deploy" / "compose.yaml").read_text("utf-8"))
    trusted = compose["services"]["gateway"]["environment"]["TRUSTED_PROXIES"]
    default = re.fullmatch(r"\$\{\w+:-([^}]+)\}", trusted)
    assert default, trusted
    return ipaddress.ip_network(default[1], strict=False).prefixlen


async def _challenges(paid: PaidGateway, via_ip: str, hops: Sequence[str]) -> list[int]:
    """Unpaid 402s on the paid route, each sent from ``via_ip`` with an ``X-Forwarded-For``."""
    connector = aiohttp.TCPConnector(local_addr=(via_ip, 0))
    statuses = []
    async with aiohttp.ClientSession(connector=connector) as http:
        for hop in hops:
            headers = {"content-type": "application/json", "x-forwarded-for": hop}
            async with http.post(paid.url + GET_BALANCE, json=balance_body(), headers=headers) as resp:
                statuses.append(resp.status)
    return statuses


async def test_a_neighbour_of_the_proxy_cannot_pick_its_own_bucket(
    start_paid_gateway: StartPaidGateway,
) -> None:
    """The proxy at 127.0.0.2 is trusted as deploy/compose.yaml trusts its nginx by default (the
    same prefix length: the proxy's own address, not its subnet). A neighbour at 127.0.0.3 writes
    a random first hop, straight to the gateway or through the proxy (which appends the
    neighbour's address): either way it is counted as 127.0.0.3, and its unpaid challenges stop
    at the limit."""
    paid = await start_paid_gateway(
        internal=True,
        env={
            "TRUSTED_PROXIES": f"127.0.0.2/{_deploy_trust_prefix()}",
            "RATE_LIMIT_CHALLENGE_PER_MINUTE": "4",
        },
    )
    random_hops = [f"{secrets.randbelow(223) + 1}.{secrets.randbelow(256)}.7.9" for _ in range(6)]

    through_proxy = await _challenges(paid, "127.0.0.2", [f"{hop}, 127.0.0.3" for hop in random_hops[:3]])
    direct = await _challenges(paid, "127.0.0.3", random_hops[3:])
    # The proxy itself forwarding a real client elsewhere is believed: that client has its own bucket.
    other = await _challenges(paid, "127.0.0.2", ["198.51.100.200"])

    assert through_proxy + direct == [402, 402, 402, 402, 429, 429]
    assert other == [402]


async def test_a_subnet_trusted_whole_lets_a_neighbour_spoof(start_paid_gateway: StartPaidGateway) -> None:
    """Before: the proxy's subnet trusted whole, the neighbour's own hop is believed, and every
    random first hop is a fresh bucket (no 429)."""
    paid = await start_paid_gateway(
        internal=True, env={"TRUSTED_PROXIES": "127.0.0.0/24", "RATE_LIMIT_CHALLENGE_PER_MINUTE": "4"}
    )
    hops = [f"10.{i}.{secrets.randbelow(256)}.9, 127.0.0.3" for i in range(6)]

    assert await _challenges(paid, "127.0.0.2", hops) == [402] * 6


@pytest.mark.slow
async def test_ten_at_once_after_five_settled_are_broadcast_in_one_round(
    start_paid_gateway: StartPaidGateway,
) -> None:
    paid = await _internal(start_paid_gateway)
    requirements, resource = await paid.requirements()
    price = int(requirements.amount)
    wallet, ata = funded_wallet(paid.chain, 100 * price)
    fee_payer = paid.chain.fee_payer.pubkey()
    lamports_before = paid.chain.lamports(fee_payer)
    for _ in range(5):
        assert_answered(await _pay(paid, _sign(paid, requirements, resource, wallet), SHARED_IP))
    # A place in flight frees once its settlement is confirmed, so one held back for a place
    # lands a confirmation wait or more after the first: the burst lands within one wait only if
    # none was. The wait is long enough for ten requests to reach their broadcast on a loaded
    # machine (the record's payments above, one at a time, had none to wait out).
    paid.rpc.confirm_delay_s = 1.5
    held_before = _metric(await paid.get("/metrics"), HELD_BACK_IN_FLIGHT)
    burst = [_sign(paid, requirements, resource, wallet) for _ in range(10)]

    replies = await asyncio.gather(*(_pay(paid, payment, SHARED_IP) for payment in burst))

    for reply in replies:
        assert_answered(reply)
    landed = [paid.rpc._landed[r.header_json("payment-response")["transaction"]].at for r in replies]
    # One round: the last of the ten landed before the first of them was confirmed.
    assert max(landed) - min(landed) < paid.rpc.confirm_delay_s, sorted(t - min(landed) for t in landed)
    assert _metric(await paid.get("/metrics"), HELD_BACK_IN_FLIGHT) == held_before
    assert paid.chain.balance(ata) == 85 * price
    assert lamports_before - paid.chain.lamports(fee_payer) == 15 * ONE_SETTLEMENT_FEE
