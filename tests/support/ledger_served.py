"""pytest plugin: a served gateway selling credit with a ledger of its own, and what tests of the
ledger read back do to it: real payments through it, a transfer around it, the journal as it stands.

* :func:`ledger_gateway`: the gateway (in-process hypercorn on loopback, over Redis, settling
  with its own fee payer on the test's LiteSVM chain, journaling to a fresh PostgreSQL schema);
  the ``ledger`` fixture (function) serves one on the session's chain, provider and stores.
* :func:`settle_activity`: two top-ups, one call paid per call, two calls paid from credit,
  all settled through the gateway and journaled (waits for the background writer).
* :func:`eventually_owed`: waits until the journal owes a wallet what a test expects.
* :func:`transfer_to_pay_to`: a USDC transfer into payTo (or elsewhere) made on the chain
  directly, as a customer's wallet would, never seen by the gateway.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit

import asyncpg
import pytest_asyncio
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.message import MessageV0
from solders.pubkey import Pubkey
from solders.transaction import VersionedTransaction

from client.svm_payer import transfer_checked_instruction
from gateway.ledger import Journal, Recorded
from gateway.outbound.solana_rpc import SolanaRpc
from tests.support.adversarial_credit import CreditClient, served_credit_gateway
from tests.support.adversarial_paid import funded_wallet
from tests.support.paid_fixtures import GET_BALANCE, PaidGateway, balance_body
from tests.support.postgres_server import create_schema
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream


@dataclass
class LedgerGateway:
    gateway: PaidGateway
    journal: Journal
    journal_url: str

    @property
    def chain(self) -> UsdcChain:
        return self.gateway.chain

    @property
    def rpc(self) -> LiteSvmRpcServer:
        return self.gateway.rpc

    async def entries(self) -> list[Recorded]:
        return [entry async for entry in self.journal.entries()]


@asynccontextmanager
async def ledger_gateway(
    chain: UsdcChain,
    rpc: LiteSvmRpcServer,
    provider: Upstream,
    redis_url: str,
    postgres_url: str,
    journal_url: str | None = None,
) -> AsyncIterator[LedgerGateway]:
    """``journal_url`` default: a fresh schema on ``postgres_url``."""
    journal_url = journal_url or await create_schema(postgres_url)
    async with served_credit_gateway(
        chain, rpc, provider, redis_url, LEDGER_DATABASE_URL=journal_url
    ) as served:
        journal = await Journal.open(journal_url)
        try:
            yield LedgerGateway(served, journal, journal_url)
        finally:
            await journal.close()


@pytest_asyncio.fixture(loop_scope="session")
async def ledger(
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    upstream: Upstream,
    redis_url: str,
    postgres_url: str,
) -> AsyncIterator[LedgerGateway]:
    async with ledger_gateway(usdc_chain, solana_rpc_server, upstream, redis_url, postgres_url) as served:
        yield served


async def settle_activity(served: LedgerGateway) -> list[Keypair]:
    """Two wallets each top up 1 USDC; the first pays one call per call and two from credit.
    Returns the wallets once the journal holds all five movements."""
    gateway = served.gateway
    client = CreditClient(gateway, gateway.chain)
    wallets = [client.wallet()[0], client.wallet()[0]]
    for wallet in wallets:
        reply = await client.top_up(await client.top_up_payment(wallet))
        assert reply.status == 200, reply.body
    paid = await gateway.pay(
        GET_BALANCE, balance_body(), await gateway.payment(GET_BALANCE, payer=wallets[0])
    )
    assert paid.status == 200, paid.body
    for n in range(2):
        spent = await client.spend(await client.sign_in(wallets[0]), request_id=n)
        assert spent.status == 200, spent.body
    await journaled(served, 5)
    return wallets


async def journaled(served: LedgerGateway, count: int) -> list[Recorded]:
    """The journal once it holds ``count`` entries (sales and spends are written in the background)."""
    deadline = asyncio.get_running_loop().time() + 10
    while len(entries := await served.entries()) < count:
        assert asyncio.get_running_loop().time() < deadline, entries
        await asyncio.sleep(0.05)
    assert len(entries) == count, entries
    return entries


async def eventually_owed(journal: Journal, wallet: str, owed: int, timeout_s: float = 5.0) -> None:
    """Until the journal owes ``wallet`` exactly ``owed`` (spends are journaled in the background,
    in batches)."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (found := await journal.owed_to(wallet)) != owed:
        assert asyncio.get_running_loop().time() < deadline, f"ledger owes {found}, expected {owed}"
        await asyncio.sleep(0.05)


async def transfer_to_pay_to(
    chain: UsdcChain,
    rpc_url: str,
    amount: int,
    *,
    funds: int | None = None,
    to: Pubkey | None = None,
    checked: bool = True,
) -> tuple[str, Keypair]:
    """A fresh wallet holding ``funds`` (default ``amount``) sends ``amount`` micro-USDC into
    payTo's token account (or the token account ``to``) with a transaction of its own, broadcast
    without preflight (so one asking more than the wallet holds lands, and fails); a
    ``TransferChecked``, or with ``checked=False`` a plain ``Transfer``. Its signature and the
    wallet."""
    wallet, account = funded_wallet(chain, amount if funds is None else funds)
    chain.svm.airdrop(wallet.pubkey(), 1_000_000_000)
    destination = chain.pay_to_ata if to is None else to
    transfer = transfer_checked_instruction(
        source=account,
        mint=chain.mint,
        destination=destination,
        authority=wallet.pubkey(),
        amount=amount,
        decimals=chain.decimals,
        token_program=chain.token_program,
    )
    if not checked:  # SPL Token Transfer: [3, u64 amount LE]; source, destination, authority
        accounts = [
            AccountMeta(account, is_signer=False, is_writable=True),
            AccountMeta(destination, is_signer=False, is_writable=True),
            AccountMeta(wallet.pubkey(), is_signer=True, is_writable=False),
        ]
        transfer = Instruction(chain.token_program, bytes([3]) + amount.to_bytes(8, "little"), accounts)
    message = MessageV0.try_compile(wallet.pubkey(), [transfer], [], chain.blockhash)
    signed = base64.b64encode(bytes(VersionedTransaction(message, [wallet]))).decode()
    rpc = SolanaRpc(rpc_url)
    try:
        return await rpc.send_transaction(signed), wallet
    finally:
        await rpc.close()


async def allow_connections(postgres_url: str, database_url: str, *, allowed: bool) -> None:
    """Open or close the ledger's database to new connections; closing also ends the open ones
    (the ledger goes away under a running gateway, as a database failing over does)."""
    name = urlsplit(database_url).path.lstrip("/")
    admin = await asyncpg.connect(postgres_url)
    try:
        await admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {str(allowed).lower()}')
        if not allowed:
            terminate = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1"
            await admin.execute(terminate, name)
    finally:
        await admin.close()
