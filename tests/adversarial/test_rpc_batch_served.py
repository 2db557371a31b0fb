"""A provider's JSON-RPC endpoint (``.../rpc``): one call or a batch, paid once or from credit.

One gateway served on a real Redis (single-node, then a 3-master Redis Cluster), settling with
its own fee payer on the LiteSVM chain (real ed25519 keys, real signed USDC transfers); the
provider is a recording loopback server answering JSON-RPC batches, failing every call that asks
about ``FAILING``. Every test states what moved: the client's and payTo's USDC and the fee
payer's SOL on chain, or the wallet's credit in the store.

* a batch is priced at the sum of its calls' provider parts plus one settlement fee, in its 402;
* paid, it is settled once, the provider hears one batch, and the answers come back in order
  under the client's ids; the same payment again is refused, and moves nothing;
* one failed call: 502 naming it, no result released, nothing settled;
* an unknown method, an empty or oversized batch or a malformed call: 400 naming the call,
  before anything is looked at (the provider and the chain hear nothing);
* on credit, the answered calls are taken, the failed ones released, every result returned;
* the rate limits count calls, not requests;
* solana-py's ``AsyncClient`` uses the endpoint as its RPC URL through the reference x402 httpx
  client, paying per call or from credit (its unset options, sent as ``null``, are left out).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from aiohttp import web
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from gateway.store import Store
from gateway.x402.types import PaymentPayload, PaymentRequirements, ResourceInfo
from tests.support.adversarial_credit import credit_of, fund, served_credit_gateway, started_provider
from tests.support.adversarial_paid import ONE_SETTLEMENT_FEE, Money, funded_wallet
from tests.support.metrics_text import earnings_series
from tests.support.paid_fixtures import (
    ACCOUNT,
    INTERNAL_SETTLEMENT_FEE,
    MARKER,
    PaidGateway,
    Reply,
    balance_body,
)
from tests.support.redis_fixtures import on_redis_and_cluster
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import Upstream, static

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")
redis_url = on_redis_and_cluster()

RPC = "/v1/x402/solana/mainnet/provider_a/rpc"
ENDPOINT = "solana.mainnet.provider_a.rpc"
DAS = "/v1/x402/solana/mainnet/provider_a/das"
SESSIONS = "/v1/x402/credits/sessions"
FAILING = "FaiLeDZzq1v2mXyW3aDLfTYtPuwGNEuNkShAxzpxuMJo"
"""An account the provider fails every call about (a JSON-RPC error)."""
BALANCE, TRANSACTION = 5, 18
"""routes.yaml provider parts on provider_a: getBalance 10 CU, getTransaction 40 CU, at 0.45."""
SIGNATURE = "5" * 88


def provider_answers(request: Any) -> Any:
    """One call's answer: an error about ``FAILING``, else ``MARKER`` plus its id."""
    params = request.get("params") or [None]
    if params[0] == FAILING:
        return {
            "jsonrpc": "2.0",
            "id": request["id"],
            "error": {"code": -32602, "message": "no such account"},
        }
    return {"jsonrpc": "2.0", "id": request["id"], "result": {"context": {"slot": 1}, "value": MARKER}}


async def answer_batches(request: web.Request, body: bytes) -> web.StreamResponse:
    calls = json.loads(body)
    if isinstance(calls, list):
        return web.json_response([provider_answers(call) for call in calls])
    return web.json_response(provider_answers(calls))


def call(method: str, params: list[Any], request_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


def balances(*accounts: str) -> list[dict[str, Any]]:
    return [call("getBalance", [account], f"c{i}") for i, account in enumerate(accounts)]


def result(request_id: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": {"context": {"slot": 1}, "value": MARKER}}


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def batch_provider() -> AsyncIterator[Upstream]:
    async with started_provider() as server:
        yield server


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def served(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], batch_provider: Upstream, redis_url: str
) -> AsyncIterator[PaidGateway]:
    chain, rpc = chain_rpc
    async with served_credit_gateway(chain, rpc, batch_provider, redis_url) as gateway:
        yield gateway


@pytest.fixture
def gateway(served: PaidGateway) -> PaidGateway:
    served.upstream.responder = answer_batches
    served.upstream.calls.clear()
    return served


@pytest.fixture
def store(gateway: PaidGateway) -> Store:
    return gateway.store


async def pay_for(gateway: PaidGateway, body: Any, *, payment_id: str | None = None) -> PaymentPayload:
    """A real signed payment of the 402 ``gateway`` answers for ``body`` at the endpoint."""
    header = (await gateway.challenge(RPC, body)).header_json("payment-required")
    requirements = msgspec.convert(header["accepts"][0], PaymentRequirements)
    resource = msgspec.convert(header["resource"], ResourceInfo)
    extensions = None
    if payment_id is not None:
        extensions = {"payment-identifier": {"info": {"required": False, "id": payment_id}}}
    return gateway.sign(requirements, resource, extensions=extensions)


async def revenue(gateway: PaidGateway) -> float:
    """The revenue the gateway's /metrics show for the endpoint."""
    reply = await gateway.get("/metrics")
    assert reply.status == 200, reply.body
    return earnings_series(reply.body.decode()).get(("x402_revenue_micro_usdc_total", ENDPOINT, ""), 0.0)


def assert_invalid(reply: Reply, parameter: str, words: str) -> None:
    assert reply.status == 400, reply.body
    error = reply.json()["error"]
    assert error["code"] == "invalid_request"
    assert error["details"] == {"parameter": parameter}
    assert error["message"].startswith(f"{parameter}: ") and words in error["message"]


# --- price ----------------------------------------------------------------------------------


async def test_a_batch_costs_its_calls_provider_parts_plus_one_settlement_fee(gateway: PaidGateway) -> None:
    batch = [*balances(ACCOUNT, ACCOUNT), call("getTransaction", [SIGNATURE], 7)]

    many = await gateway.challenge(RPC, batch)
    one = await gateway.challenge(RPC, balance_body())

    assert many.header_json("payment-required")["accepts"][0]["amount"] == str(
        2 * BALANCE + TRANSACTION + INTERNAL_SETTLEMENT_FEE
    )
    assert many.json()["accepts"][0]["amount"] == str(2 * BALANCE + TRANSACTION + INTERNAL_SETTLEMENT_FEE)
    assert one.json()["accepts"][0]["amount"] == str(BALANCE + INTERNAL_SETTLEMENT_FEE)
    assert many.header_json("payment-required")["resource"]["url"].endswith(RPC)
    assert "sign-in-with-x" in many.header_json("payment-required")["extensions"]
    assert gateway.upstream.calls == []


async def test_the_catalog_the_openapi_document_and_the_402_say_how_a_batch_is_priced(
    gateway: PaidGateway,
) -> None:
    catalog = (await gateway.get("/v1/catalog")).json()
    document = (await gateway.get("/openapi.json")).json()
    challenge = await gateway.challenge(
        RPC, [*balances(ACCOUNT, ACCOUNT), call("getTransaction", [SIGNATURE], 7)]
    )

    listed = {e["path"]: e for e in catalog["endpoints"]}
    rpc = listed[RPC]
    assert rpc["url"] == catalog["baseUrl"] + RPC
    assert (rpc["name"], rpc["method"], rpc["provider"], rpc["maxCalls"]) == (
        ENDPOINT,
        "POST",
        "provider_a",
        20,
    )
    assert rpc["settlementFee"] == {"microUsdc": str(INTERNAL_SETTLEMENT_FEE), "usd": "$0.0022"}
    assert "plus one settlement fee" in rpc["pricing"]
    assert rpc["methods"]["getBalance"] == {
        "operationId": "solana.mainnet.provider_a.rpc.getBalance",
        "provider": {"microUsdc": "5", "usd": "$0.000005"},
        "creditPrice": {"microUsdc": "5", "usd": "$0.000005"},
    }
    assert rpc["methods"]["getTransaction"]["provider"]["microUsdc"] == str(TRANSACTION)
    assert "getAsset" in listed[DAS]["methods"] and "getAsset" not in rpc["methods"]
    operation = document["paths"][RPC]["post"]
    assert operation["operationId"] == ENDPOINT
    assert operation["x-x402"]["methods"] == rpc["methods"]
    assert operation["requestBody"]["content"]["application/json"]["schema"]["oneOf"][1]["maxItems"] == 20
    bazaar = challenge.header_json("payment-required")["extensions"]["bazaar"]
    example = bazaar["info"]["input"]["body"]
    assert [c["method"] for c in example] == ["getAccountInfo", "getBalance"]
    assert example == operation["requestBody"]["content"]["application/json"]["schema"]["examples"][0]
    body_schema = bazaar["schema"]["properties"]["input"]["properties"]["body"]
    assert "getBalance 5, getProgramAccounts 9" in body_schema["description"]
    assert "one settlement fee" in body_schema["description"]
    described = challenge.header_json("payment-required")["resource"]["description"]
    assert described == (
        f"3 JSON-RPC call(s) to {RPC} (getBalance x2, getTransaction): the sum of their provider parts "
        f"({2 * BALANCE + TRANSACTION} micro-USDC) plus one settlement fee."
    )


# --- exact ----------------------------------------------------------------------------------


async def test_a_paid_batch_is_settled_once_and_answered_in_order_under_the_clients_ids(
    gateway: PaidGateway,
) -> None:
    batch = [*balances(ACCOUNT), call("getTransaction", [SIGNATURE], 7), call("getBalance", [ACCOUNT], None)]
    price = 2 * BALANCE + TRANSACTION + INTERNAL_SETTLEMENT_FEE
    payment = await pay_for(gateway, batch)
    before = Money.of(gateway.chain)
    earned = await revenue(gateway)

    reply = await gateway.pay(RPC, batch, payment)
    again = await gateway.pay(RPC, batch, payment)
    other = await gateway.pay(RPC, list(reversed(batch)), payment)

    assert reply.status == 200, reply.body
    assert reply.json() == [result("c0"), result(7), result(None)]
    assert reply.header_json("payment-response")["success"] is True
    assert Money.of(gateway.chain).minus(before) == Money(-price, price, -ONE_SETTLEMENT_FEE)
    upstream = [c.json for c in gateway.upstream.calls]
    assert upstream == [
        [
            call("getBalance", [ACCOUNT], 0),
            call("getTransaction", [SIGNATURE], 1),
            call("getBalance", [ACCOUNT], 2),
        ]
    ]
    # The same payment again: the identical request gets the answer it paid for again (its
    # delivery), another body under it is refused; neither reaches the provider nor moves anything.
    assert again.status == 200 and again.body == reply.body
    assert other.status == 402 and other.json()["error"] == "payment_already_used"
    assert len(gateway.upstream.calls) == 1
    assert Money.of(gateway.chain).minus(before) == Money(-price, price, -ONE_SETTLEMENT_FEE)
    assert await revenue(gateway) == earned + price  # the endpoint's sales are counted as its own


async def test_a_payment_for_a_cheaper_batch_pays_for_no_dearer_one(gateway: PaidGateway) -> None:
    cheap, dear = balances(ACCOUNT), [*balances(ACCOUNT), call("getTransaction", [SIGNATURE], 7)]
    payment = await pay_for(gateway, cheap)
    before = Money.of(gateway.chain)

    reply = await gateway.pay(RPC, dear, payment)

    assert reply.status == 402, reply.body
    assert reply.json()["accepts"][0]["amount"] == str(BALANCE + TRANSACTION + INTERNAL_SETTLEMENT_FEE)
    assert reply.json()["error"] == "amount_mismatch"
    assert str(MARKER) not in reply.body.decode()
    assert gateway.upstream.calls == []
    assert Money.of(gateway.chain) == before


async def test_an_identical_retry_with_a_payment_identifier_gets_the_answer_it_paid_for(
    gateway: PaidGateway,
) -> None:
    batch = balances(ACCOUNT, ACCOUNT)
    price = 2 * BALANCE + INTERNAL_SETTLEMENT_FEE
    payment = await pay_for(gateway, batch, payment_id="batch-retry-0123456789abcdef")
    before = Money.of(gateway.chain)

    first = await gateway.pay(RPC, batch, payment)
    retried = await gateway.pay(RPC, batch, payment)

    assert first.status == retried.status == 200, (first.body, retried.body)
    assert first.body == retried.body
    assert first.json() == [result("c0"), result("c1")]
    assert len(gateway.upstream.calls) == 1
    assert Money.of(gateway.chain).minus(before) == Money(-price, price, -ONE_SETTLEMENT_FEE)


async def test_a_paid_batch_with_a_failed_call_settles_nothing_and_names_the_call(
    gateway: PaidGateway,
) -> None:
    batch = balances(ACCOUNT, FAILING, ACCOUNT)
    payment = await pay_for(gateway, batch)
    before = Money.of(gateway.chain)

    reply = await gateway.pay(RPC, batch, payment)

    assert reply.status == 502, reply.body
    error = reply.json()["error"]
    assert error["code"] == "upstream_error"
    assert "call(s) 1;" in error["message"] and "nothing was charged" in error["message"]
    assert error["details"] == {
        "failed": [{"index": 1, "rpcError": {"code": -32602, "message": "no such account"}}]
    }
    assert str(MARKER) not in reply.body.decode()
    assert "payment-response" not in reply.headers
    assert Money.of(gateway.chain) == before
    assert len(gateway.upstream.calls) == 1


async def test_a_paid_batch_whose_provider_answers_no_batch_settles_nothing(gateway: PaidGateway) -> None:
    batch = balances(ACCOUNT, ACCOUNT)
    payment = await pay_for(gateway, batch)
    before = Money.of(gateway.chain)
    gateway.upstream.responder = static(200, {"jsonrpc": "2.0", "id": 0, "result": {"value": MARKER}})

    reply = await gateway.pay(RPC, batch, payment)
    gateway.upstream.responder = static(500, {"error": "down"})
    down = await gateway.pay(RPC, batch, await pay_for(gateway, batch))

    assert reply.status == 502, reply.body
    assert reply.json()["error"]["message"] == "provider answered with no JSON-RPC batch; nothing was charged"
    assert str(MARKER) not in reply.body.decode()
    assert down.status == 502 and "HTTP 500" in down.json()["error"]["message"]
    assert Money.of(gateway.chain) == before


# --- refused before anything ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "parameter", "words"),
    [
        (
            [*balances(ACCOUNT), call("getHealth", [], 2)],
            "body[1].method",
            "'getHealth' is not a method priced here",
        ),
        ([*balances(ACCOUNT), call("getAsset", [ACCOUNT], 2)], "body[1].method", "not a method priced here"),
        ([*balances(ACCOUNT), {"jsonrpc": "2.0", "id": 3}], "body[1].method", "is required"),
        ([*balances(ACCOUNT), 5], "body[1]", "must be a JSON-RPC call"),
        ([], "body", "an empty batch"),
        (balances(*[ACCOUNT] * 21), "body", "at most 20 calls, got 21"),
        (balances(ACCOUNT, "not-a-key"), "body[1].params[0]", ""),
        (call("getBalance", ["not-a-key"], 1), "params[0]", ""),
        ("[1,", "body", "is not valid JSON"),
    ],
)
async def test_a_call_not_sold_here_is_a_400_naming_it_and_nothing_is_charged(
    gateway: PaidGateway, body: Any, parameter: str, words: str
) -> None:
    valid = balances(ACCOUNT, ACCOUNT)
    payment = await pay_for(gateway, valid)
    before = Money.of(gateway.chain)

    reply = await gateway.pay(RPC, body, payment)
    paid = await gateway.pay(RPC, valid, payment)

    assert_invalid(reply, parameter, words)
    # Only the valid batch reached the provider.
    assert [c.json for c in gateway.upstream.calls] == [
        [call("getBalance", [ACCOUNT], 0), call("getBalance", [ACCOUNT], 1)]
    ]
    # The payment offered with the refused body was never looked at: it still pays the valid one.
    assert paid.status == 200, paid.body
    assert Money.of(gateway.chain).minus(before).client_usdc == -(2 * BALANCE + INTERNAL_SETTLEMENT_FEE)


async def test_das_methods_have_their_own_endpoint(gateway: PaidGateway) -> None:
    on_rpc = await gateway.post(RPC, call("getAsset", [ACCOUNT], 1))
    on_das = await gateway.post(DAS, call("getAsset", [ACCOUNT], 1))

    assert_invalid(on_rpc, "method", "not a method priced here")
    assert on_das.status == 402
    assert on_das.json()["accepts"][0]["amount"] == str(36 + INTERNAL_SETTLEMENT_FEE)


# --- credit ---------------------------------------------------------------------------------


async def open_session(gateway: PaidGateway, wallet: Keypair, cap: int) -> str:
    path = f"{SESSIONS}?capMicroUsdc={cap}"
    challenge = await gateway.post(path)
    header = sign_in(challenge.header_json("payment-required")["extensions"]["sign-in-with-x"], wallet)
    opened = await gateway.post(path, None, {"sign-in-with-x": header})
    assert opened.status == 200, opened.body
    token: str = opened.json()["result"]["token"]
    return token


async def test_a_credit_batch_takes_the_answered_calls_and_releases_the_failed_ones(
    gateway: PaidGateway, store: Store
) -> None:
    wallet = Keypair()
    await fund(store, wallet, 100)
    token = await open_session(gateway, wallet, 30)
    batch = [*balances(ACCOUNT, FAILING), call("getTransaction", [SIGNATURE], 9)]

    reply = await gateway.post(RPC, batch, {"x-credit-session": token})
    credit = await credit_of(store, wallet)
    # The session's cap got the failed call's share back: 30 - 23 spent leaves 7 for a single call.
    follow = await gateway.post(RPC, balances(ACCOUNT), {"x-credit-session": token})
    over = await gateway.post(RPC, balances(ACCOUNT), {"x-credit-session": token})

    assert reply.status == 200, reply.body
    assert reply.json() == [
        result("c0"),
        {"jsonrpc": "2.0", "id": "c1", "error": {"code": -32602, "message": "no such account"}},
        result(9),
    ]
    assert reply.headers["x-credit-balance"] == str(100 - BALANCE - TRANSACTION)
    assert "payment-response" not in reply.headers
    assert (credit.balance, credit.held) == (100 - BALANCE - TRANSACTION, 0)
    assert follow.status == 200 and follow.headers["x-credit-balance"] == str(100 - 2 * BALANCE - TRANSACTION)
    assert over.status == 402 and over.json()["error"] == "credit_session_cap_reached"


async def test_a_credit_batch_whose_calls_all_failed_takes_nothing(
    gateway: PaidGateway, store: Store
) -> None:
    wallet = Keypair()
    await fund(store, wallet, 100)
    token = await open_session(gateway, wallet, 100)

    reply = await gateway.post(RPC, balances(FAILING, FAILING), {"x-credit-session": token})

    assert reply.status == 502, reply.body
    assert [f["index"] for f in reply.json()["error"]["details"]["failed"]] == [0, 1]
    credit = await credit_of(store, wallet)
    assert (credit.balance, credit.held) == (100, 0)


async def test_a_credit_batch_on_a_sign_in_takes_every_answered_call(
    gateway: PaidGateway, store: Store
) -> None:
    wallet = Keypair()
    await fund(store, wallet, 100)
    batch = balances(ACCOUNT, ACCOUNT, ACCOUNT)
    challenge = await gateway.challenge(RPC, batch)
    header = sign_in(challenge.header_json("payment-required")["extensions"]["sign-in-with-x"], wallet)

    reply = await gateway.post(RPC, batch, {"sign-in-with-x": header})
    retried = await gateway.post(RPC, batch, {"sign-in-with-x": header})

    assert reply.status == 200, reply.body
    assert reply.json() == [result("c0"), result("c1"), result("c2")]
    assert reply.headers["x-credit-balance"] == str(100 - 3 * BALANCE)
    assert retried.status == 200 and retried.body == reply.body  # its identical retry, not charged again
    credit = await credit_of(store, wallet)
    assert (credit.balance, credit.held) == (100 - 3 * BALANCE, 0)
    assert len(gateway.upstream.calls) == 1


# --- limits ---------------------------------------------------------------------------------


async def test_the_rate_limits_count_calls_not_requests(
    chain_rpc: tuple[UsdcChain, LiteSvmRpcServer], batch_provider: Upstream, redis_url: str
) -> None:
    chain, rpc = chain_rpc
    batch_provider.responder = answer_batches
    async with served_credit_gateway(
        chain, rpc, batch_provider, redis_url, RATE_LIMIT_RPC_RPS="5"
    ) as gateway:
        batch_provider.calls.clear()
        store = gateway.store
        over, within = Keypair(), Keypair()
        for wallet in (over, within):
            await fund(store, wallet, 100)
        over_token = await open_session(gateway, over, 100)
        within_token = await open_session(gateway, within, 100)

        six = await gateway.post(RPC, balances(*[ACCOUNT] * 6), {"x-credit-session": over_token})
        five = await gateway.post(RPC, balances(*[ACCOUNT] * 5), {"x-credit-session": within_token})

        assert six.status == 429, six.body
        assert six.json()["error"]["code"] == "rate_limited"
        assert five.status == 200, five.body
        assert len(five.json()) == 5
        assert [len(c.json) for c in batch_provider.calls] == [5]
        spent_over, spent_within = await credit_of(store, over), await credit_of(store, within)
        assert (spent_over.balance, spent_over.held) == (100, 0)
        assert (spent_within.balance, spent_within.held) == (100 - 5 * BALANCE, 0)


# --- an ordinary Solana client, through the reference x402 client -------------------------


class ThroughX402:
    """solana-py 0.39 speaks over ``httpx2`` (its fork of httpx); the reference x402 transport is
    httpx's. This hands each request of the one to a client of the other, unchanged: the paying
    is all the reference ``x402HttpxClient``'s."""

    def __init__(self, paying: Any) -> None:
        self.paying = paying

    async def handle_async_request(self, request: Any) -> Any:
        import httpx2

        body = await request.aread()
        answer = await self.paying.request(
            request.method, str(request.url), headers=dict(request.headers), content=body
        )
        kept = [
            (k, v)
            for k, v in answer.headers.multi_items()
            if k.lower() not in ("content-length", "content-encoding")
        ]
        return httpx2.Response(answer.status_code, headers=kept, content=answer.content)

    async def aclose(self) -> None:
        return None


@pytest.mark.parametrize("paid_from", ["exact", "credit"])
async def test_solana_py_uses_the_endpoint_as_its_rpc_url_through_the_reference_x402_client(
    gateway: PaidGateway, store: Store, paid_from: str
) -> None:
    import httpx2
    from solana.rpc.async_api import AsyncClient
    from solders.pubkey import Pubkey
    from x402 import x402Client
    from x402.extensions.sign_in_with_x import create_siwx_client_hook
    from x402.http import x402HTTPClient
    from x402.http.clients import x402HttpxClient
    from x402.mechanisms.svm import KeypairSigner
    from x402.mechanisms.svm.exact.register import register_exact_svm_client

    from tests.support.cdp_facilitator import close_sdk_rpc_clients

    payer, payer_ata = funded_wallet(gateway.chain, 1_000_000)
    if paid_from == "credit":
        await fund(store, payer, 100)
    signer = KeypairSigner(payer)
    client = x402Client()
    register_exact_svm_client(client, signer, rpc_url=gateway.rpc.url)
    signing_in = x402HTTPClient(client).on_payment_required(create_siwx_client_hook(signer))
    before = Money.of(gateway.chain, payer_ata)
    try:
        async with x402HttpxClient(signing_in, timeout=30) as paying:
            solana = AsyncClient(gateway.url + RPC)
            solana._provider.session = httpx2.AsyncClient(transport=ThroughX402(paying))
            balances_seen = [(await solana.get_balance(Pubkey.from_string(ACCOUNT))).value for _ in range(2)]
            await solana.close()
    finally:
        for schemes in client._schemes.values():  # the SDK cannot close its RPC clients itself
            for scheme in schemes.values():
                close_sdk_rpc_clients(scheme)

    assert balances_seen == [MARKER, MARKER]
    assert [[call["method"] for call in c.json] for c in gateway.upstream.calls] == [["getBalance"]] * 2
    moved = Money.of(gateway.chain, payer_ata).minus(before)
    credit = await credit_of(store, payer)
    if paid_from == "exact":
        price = BALANCE + INTERNAL_SETTLEMENT_FEE
        assert moved == Money(-2 * price, 2 * price, -2 * ONE_SETTLEMENT_FEE)
        assert (credit.balance, credit.held) == (0, 0)
    else:
        assert moved == Money(0, 0, 0)
        assert (credit.balance, credit.held) == (100 - 2 * BALANCE, 0)


async def test_a_credit_batch_on_a_sign_in_with_a_failed_call_takes_the_rest_once(
    gateway: PaidGateway, store: Store
) -> None:
    wallet = Keypair()
    await fund(store, wallet, 100)
    batch = [*balances(FAILING), call("getTransaction", [SIGNATURE], 9)]
    challenge = await gateway.challenge(RPC, batch)
    header = sign_in(challenge.header_json("payment-required")["extensions"]["sign-in-with-x"], wallet)

    reply = await gateway.post(RPC, batch, {"sign-in-with-x": header})
    retried = await gateway.post(RPC, batch, {"sign-in-with-x": header})

    assert reply.status == 200, reply.body
    assert reply.json() == [
        {"jsonrpc": "2.0", "id": "c0", "error": {"code": -32602, "message": "no such account"}},
        result(9),
    ]
    assert reply.headers["x-credit-balance"] == str(100 - TRANSACTION)
    assert retried.status == 200 and retried.json() == reply.json()  # answered again, not taken again
    credit = await credit_of(store, wallet)
    assert (credit.balance, credit.held) == (100 - TRANSACTION, 0)
    assert len(gateway.upstream.calls) == 1
