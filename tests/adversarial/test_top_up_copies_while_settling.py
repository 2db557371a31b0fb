"""Attack (or an impatient client): copies of a top-up sent while its first copy is settling.

The gateway is served (hypercorn on loopback) with credit on, over a real Redis (single-node,
then a 3-master Redis Cluster), settling with its own fee payer on a LiteSVM chain that confirms
a landed transaction only 0.4 s later, as a real Solana cluster does, one settlement of a client
IP in flight at a time (``X402_MAX_SETTLEMENTS_IN_FLIGHT=1``). Another top-up from the same IP
settles first, so the first copy of the payment claims it, writes its intent and then waits for
the IP's place; the identical copies sent meanwhile reconcile that intent and wait for the same
place. Whichever gets it first lands the payment, and the internal facilitator answers the
others ``duplicate_settlement``: so the copy that holds the claim often hears the duplicate of a
copy's settlement. It must never answer ``settlement_failed`` (which invites the client to pay
again for a payment that settled). One answer is given (to the identical copies that ask after
it went out, again), every other copy is refused as ``payment_already_used``, the wallet is
credited once and one transfer lands.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio

from tests.support.adversarial_credit import (
    ONE_TOP_UP,
    TOP_UP_1_CREDIT,
    CreditClient,
    credit_of,
    own_chain,
    served_credit_gateway,
)
from tests.support.adversarial_paid import Money, another_client_signature
from tests.support.paid_fixtures import PaidGateway, Reply, assert_challenge
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402"),
]

redis_url = on_redis_and_cluster()

CONFIRM_DELAY_S = 0.4
FIRST_AFTER_S = 0.05
"""When the first copy goes out: the other top-up then holds the IP's place in flight."""
COPIES_AFTER_S = 0.1
"""When the other copies go out, after the first: it is then waiting for the IP's place."""


@pytest.fixture(scope="module")
def chain_rpc() -> Iterator[tuple[UsdcChain, LiteSvmRpcServer]]:
    with own_chain() as (chain, rpc):
        rpc.confirm_delay_s = CONFIRM_DELAY_S
        yield chain, rpc


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def served(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], provider: Upstream, redis_url: str
) -> AsyncIterator[PaidGateway]:
    chain, rpc = chain_rpc
    async with served_credit_gateway(
        chain, rpc, provider, redis_url, X402_MAX_SETTLEMENTS_IN_FLIGHT="1"
    ) as gateway:
        yield gateway


def assert_not_answered_again(reply: Reply) -> None:
    """A copy that did not get the answer (it came after the answer went out, or it is a re-signed
    copy): refused as used, never told its settlement failed."""
    assert_challenge(reply, "payment_already_used", TOP_UP_1_CREDIT)


@pytest.mark.parametrize("round_", range(4), ids=lambda n: f"round{n}")
async def test_copies_of_a_top_up_sent_while_it_settles_are_never_told_it_failed(
    served: PaidGateway, round_: int
) -> None:
    client = CreditClient(served, served.chain)
    store = served.store
    wallet, account = client.wallet()
    payment = await client.top_up_payment(wallet)
    before, sent = Money.of(served.chain, account), len(served.rpc.sent)

    other = asyncio.create_task(client.top_up(await client.top_up_payment(client.wallet()[0])))
    await asyncio.sleep(FIRST_AFTER_S)
    first = asyncio.create_task(client.top_up(payment))
    await asyncio.sleep(COPIES_AFTER_S)
    copies = [payment] * 4 + [another_client_signature(payment, wallet) for _ in range(3)]
    later = asyncio.gather(*(client.top_up(copy) for copy in copies))  # sent now, not after the first
    replies = [await first, *await later]
    assert (await other).status == 200

    answered = [r for r in replies if r.status == 200]
    assert answered, [(r.status, r.body) for r in replies]
    assert {r.body for r in answered} == {answered[0].body}  # one answer, however often it is given
    assert answered[0].json()["result"]["balanceMicroUsdc"] == str(TOP_UP_1_CREDIT)
    assert answered[0].header_json("payment-response")["success"] is True
    for reply in replies:
        if reply.status != 200:
            assert_not_answered_again(reply)
    credit = await credit_of(store, wallet)
    assert (credit.balance, credit.held) == (TOP_UP_1_CREDIT, 0)
    assert len(served.rpc.sent) - sent == 2  # this payment's transfer and the other top-up's
    moved = Money.of(served.chain, account).minus(before)  # payTo and the fee payer: both top-ups
    assert moved == Money(ONE_TOP_UP.client_usdc, 2 * ONE_TOP_UP.pay_to_usdc, 2 * ONE_TOP_UP.fee_payer_sol)
