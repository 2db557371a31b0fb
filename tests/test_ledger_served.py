"""The ledger of record as a served gateway writes it: every settled payment and every credit
movement reaches the PostgreSQL journal, a top-up before its answer.

The whole gateway is served (hypercorn on loopback) with credit on, over a real Redis, settling
with its own fee payer on a LiteSVM chain, journaling to a real PostgreSQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from gateway.ledger import EntryKind, Journal, Recorded
from gateway.x402.types import SettleResponse
from tests.support.adversarial_credit import (
    CALL_CREDIT,
    TOP_UP_1_CREDIT,
    CreditClient,
    credit_of,
    served_credit_gateway,
)
from tests.support.ledger_served import allow_connections, eventually_owed
from tests.support.paid_fixtures import GET_BALANCE, PaidGateway, balance_body
from tests.support.postgres_server import create_database, create_schema
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream, static

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def journal_url(postgres_url: str) -> str:
    return await create_schema(postgres_url)


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def served(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], provider: Upstream, redis_url: str, journal_url: str
) -> AsyncIterator[PaidGateway]:
    chain, rpc = chain_rpc
    async with served_credit_gateway(
        chain, rpc, provider, redis_url, LEDGER_DATABASE_URL=journal_url
    ) as gateway:
        yield gateway


@pytest_asyncio.fixture(loop_scope="session")
async def journal(journal_url: str) -> AsyncIterator[Journal]:
    opened = await Journal.open(journal_url)
    yield opened
    await opened.close()


async def _entries_of(journal: Journal, wallet: str) -> list[Recorded]:
    return list(reversed(await journal.movements(wallet, limit=100)))


@pytest.mark.asyncio(loop_scope="session")
async def test_a_top_up_is_in_the_ledger_when_its_answer_arrives(
    served: PaidGateway, journal: Journal
) -> None:
    client = CreditClient(served, served.chain)
    payer, _ = client.wallet()
    wallet = str(payer.pubkey())

    reply = await client.top_up(await client.top_up_payment(payer))

    assert reply.status == 200, reply.body
    settlement = reply.header_json("payment-response")["transaction"]
    [entry] = await _entries_of(journal, wallet)  # read at once: written before the answer
    assert (entry.kind, entry.amount_micro, entry.signature) == (
        EntryKind.TOP_UP,
        TOP_UP_1_CREDIT,
        settlement,
    )
    assert entry.route == "credits.topUp.1" and entry.facilitator == "internal"
    assert await journal.owed_to(wallet) == (await credit_of(served.store, payer)).balance == TOP_UP_1_CREDIT


@pytest.mark.asyncio(loop_scope="session")
async def test_calls_paid_from_credit_are_journaled_as_spends(served: PaidGateway, journal: Journal) -> None:
    client = CreditClient(served, served.chain)
    payer, _ = client.wallet()
    wallet = str(payer.pubkey())
    assert (await client.top_up(await client.top_up_payment(payer))).status == 200

    for n in range(3):
        reply = await client.spend(await client.sign_in(payer), request_id=n)
        assert reply.status == 200, reply.body

    await eventually_owed(journal, wallet, TOP_UP_1_CREDIT - 3 * CALL_CREDIT)
    spends = [e for e in await _entries_of(journal, wallet) if e.kind is EntryKind.CREDIT_SPENT]
    assert [(e.amount_micro, e.route) for e in spends] == [
        (CALL_CREDIT, "solana.mainnet.provider_a.rpc.getBalance")
    ] * 3
    assert (await credit_of(served.store, payer)).balance == TOP_UP_1_CREDIT - 3 * CALL_CREDIT


@pytest.mark.asyncio(loop_scope="session")
async def test_a_call_whose_provider_failed_is_journaled_as_released_and_moves_no_money(
    served: PaidGateway, journal: Journal
) -> None:
    client = CreditClient(served, served.chain)
    payer, _ = client.wallet()
    wallet = str(payer.pubkey())
    assert (await client.top_up(await client.top_up_payment(payer))).status == 200
    answering = served.upstream.responder
    served.upstream.responder = static(500, {"error": "down"})
    try:
        failed = await client.spend(await client.sign_in(payer))
    finally:
        served.upstream.responder = answering

    assert failed.status == 502, failed.body
    deadline = asyncio.get_running_loop().time() + 5
    while not [e for e in await _entries_of(journal, wallet) if e.kind is EntryKind.CREDIT_RELEASED]:
        assert asyncio.get_running_loop().time() < deadline, "no release journaled"
        await asyncio.sleep(0.05)
    kinds = [(e.kind, e.amount_micro) for e in await _entries_of(journal, wallet)]
    assert kinds == [(EntryKind.TOP_UP, TOP_UP_1_CREDIT), (EntryKind.CREDIT_RELEASED, CALL_CREDIT)]
    assert await journal.owed_to(wallet) == TOP_UP_1_CREDIT == (await credit_of(served.store, payer)).balance


@pytest.mark.asyncio(loop_scope="session")
async def test_a_call_paid_per_call_is_journaled_as_a_sale(served: PaidGateway, journal: Journal) -> None:
    client = CreditClient(served, served.chain)
    payer, _ = client.wallet()
    payment = await served.payment(GET_BALANCE, payer=payer)

    reply = await served.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200, reply.body
    settled = SettleResponse(**reply.header_json("payment-response"))
    deadline = asyncio.get_running_loop().time() + 5
    while not (sales := await _entries_of(journal, str(payer.pubkey()))):
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)
    [sale] = sales
    assert (sale.kind, sale.signature, sale.facilitator) == (EntryKind.SALE, settled.transaction, "internal")
    assert sale.amount_micro == served.balance_price


@pytest.mark.asyncio(loop_scope="session")
async def test_a_top_up_the_ledger_cannot_record_is_not_credited_until_a_retry_records_it(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], provider: Upstream, redis_url: str, postgres_url: str
) -> None:
    ledger_url = await create_database(postgres_url)
    chain, rpc = chain_rpc
    async with served_credit_gateway(
        chain, rpc, provider, redis_url, LEDGER_DATABASE_URL=ledger_url
    ) as gateway:
        client = CreditClient(gateway, gateway.chain)
        payer, _ = client.wallet()
        payment = await client.top_up_payment(payer)
        await allow_connections(postgres_url, ledger_url, allowed=False)

        pending = await client.top_up(payment)

        assert pending.status == 503 and pending.error_code == "settlement_pending", pending.body
        assert (await credit_of(gateway.store, payer)).balance == 0
        await allow_connections(postgres_url, ledger_url, allowed=True)

        retried = await client.top_up(payment)

        assert retried.status == 200, retried.body
        again = await client.top_up(payment)
        assert again.status == 200 and again.body == retried.body  # the kept answer, nothing more
        assert (await credit_of(gateway.store, payer)).balance == TOP_UP_1_CREDIT
    journal = await Journal.open(ledger_url)
    try:
        [entry] = await _entries_of(journal, str(payer.pubkey()))
        assert (
            entry.kind is EntryKind.TOP_UP and await journal.owed_to(str(payer.pubkey())) == TOP_UP_1_CREDIT
        )
    finally:
        await journal.close()
