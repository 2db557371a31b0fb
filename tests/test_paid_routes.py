"""Paid Solana RPC and DAS routes: the real gateway on a socket, real signed payments.

The gateway runs under hypercorn on loopback with a recording loopback provider, a fake CDP
facilitator that checks every JWT (optionally delegating to the reference x402 facilitator, so
money moves on LiteSVM), or our own internal facilitator. Payments are partially signed Solana
transactions built by ``client.svm_payer`` or by the reference x402 client.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families
from x402.http.utils import decode_payment_required_header, decode_payment_response_header
from x402.schemas import PaymentRequired as ReferencePaymentRequired

from client.svm_payer import create_exact_payment
from gateway.outbound.solana_rpc import SolanaRpc
from gateway.x402.types import SOLANA_MAINNET, USDC_MAINNET_MINT, PaymentPayload
from tests.support.cdp_facilitator import ReferenceBackend, settlement_signature
from tests.support.paid_fixtures import (
    ACCOUNT,
    GET_BALANCE,
    GET_BALANCE_PRICE_INTERNAL,
    GET_BALANCE_PROVIDER_PRICE,
    PROVIDER_KEY,
    PaidGateway,
    Reply,
    StartPaidGateway,
    balance_body,
    reference_client_header,
)
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain
from tests.support.upstream import static

BALANCE_ROUTE = "solana.mainnet.provider_a.rpc.getBalance"
PROVIDER_ANSWER = {"jsonrpc": "2.0", "id": 1, "result": {"context": {"slot": 7}, "value": 424242}}
DAS_OWNER = "/v1/x402/solana/mainnet/provider_a/das/getAssetsByOwner"
GET_PROGRAM_ACCOUNTS = "/v1/x402/solana/mainnet/provider_b/rpc/getProgramAccounts"
GET_SIGNATURES = "/v1/x402/solana/mainnet/provider_a/rpc/getSignaturesForAddress"
TOKEN_PROGRAM = "TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA"

pytestmark = pytest.mark.filterwarnings(
    "ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402"
)  # the reference SDK's own solana-py deprecations


def reference_backend(chain: UsdcChain, rpc: LiteSvmRpcServer) -> ReferenceBackend:
    return ReferenceBackend(chain.fee_payer, rpc.url)


def balances(chain: UsdcChain) -> tuple[int | None, int | None]:
    return chain.balance(chain.payer_ata), chain.balance(chain.pay_to_ata)


def assert_settled_response(reply: Reply, transaction: str) -> None:
    """200 with both payment-response headers: the same base64 JSON SettlementResponse."""
    assert reply.headers["payment-response"] == reply.headers["x-payment-response"]
    settlement = reply.header_json("payment-response")
    assert settlement["success"] is True
    assert settlement["transaction"] == transaction
    assert settlement["network"] == SOLANA_MAINNET
    reference = decode_payment_response_header(reply.headers["x-payment-response"])
    assert reference.success and reference.transaction == transaction


# --- the challenge ------------------------------------------------------------------------------


async def test_paid_rpc_without_payment_answers_402_with_the_challenge(paid: PaidGateway) -> None:
    reply = await paid.post(GET_BALANCE, balance_body())

    assert reply.status == 402
    assert reply.headers["cache-control"] == "no-store"
    assert reply.headers["content-type"] == "application/json"
    body = reply.json()
    header = reply.header_json("payment-required")
    # The header is the v2 shape with the extensions; the body the same accepts plus the v1 names
    # and discovery fields, without the extensions: nothing is sent twice.
    v1_names = {"maxAmountRequired", "resource", "description", "mimeType", "outputSchema", "facilitator"}
    assert header == {
        **body,
        "accepts": [{k: v for k, v in body["accepts"][0].items() if k not in v1_names}],
        "extensions": header["extensions"],
    }
    assert not v1_names & set(header["accepts"][0])
    assert body["x402Version"] == 2
    assert "error" not in body
    accept = body["accepts"][0]
    assert accept["scheme"] == "exact"
    assert accept["network"] == SOLANA_MAINNET
    assert accept["asset"] == USDC_MAINNET_MINT
    # The fake CDP facilitator pays the Solana fees and no fee is configured: the provider part.
    assert accept["amount"] == accept["maxAmountRequired"] == str(GET_BALANCE_PROVIDER_PRICE)
    assert accept["payTo"] == str(paid.chain.pay_to)
    assert accept["maxTimeoutSeconds"] == 60
    assert accept["extra"]["feePayer"] == str(paid.chain.fee_payer.pubkey())
    assert paid.facilitator is not None
    assert accept["facilitator"] == {"url": paid.facilitator.base_url}
    assert accept["resource"] == body["resource"]["url"] == paid.url + GET_BALANCE
    assert accept["description"] == body["resource"]["description"]
    assert accept["description"] == "Lamport balance of an account (mainnet, provider_a)."
    assert accept["mimeType"] == "application/json"
    assert accept["outputSchema"]["input"]["properties"]["method"]["const"] == "getBalance"
    assert accept["outputSchema"]["output"]["required"] == ["jsonrpc", "result"]
    assert "extensions" not in body  # v2 only: in the header, which every v2 client reads
    assert set(header["extensions"]) == {"bazaar", "payment-identifier"}
    assert header["extensions"]["payment-identifier"]["info"] == {"required": False}
    assert PROVIDER_KEY not in reply.body.decode() + reply.headers["payment-required"]
    assert paid.verify_calls() == paid.settle_calls() == paid.upstream_calls == 0


async def test_paid_rpc_challenge_header_decodes_with_the_reference_sdk(paid: PaidGateway) -> None:
    reply = await paid.post(GET_BALANCE, balance_body())

    required = decode_payment_required_header(reply.headers["payment-required"])
    assert isinstance(required, ReferencePaymentRequired)
    accept = required.accepts[0]
    assert (accept.scheme, accept.network, accept.asset) == ("exact", SOLANA_MAINNET, USDC_MAINNET_MINT)
    assert accept.amount == str(GET_BALANCE_PROVIDER_PRICE)
    assert accept.pay_to == str(paid.chain.pay_to)
    assert accept.extra == {"feePayer": str(paid.chain.fee_payer.pubkey())}
    assert required.resource is not None and required.resource.url == paid.url + GET_BALANCE


async def test_paid_rpc_empty_body_probe_gets_the_challenge_not_a_400(paid: PaidGateway) -> None:
    reply = await paid.post(GET_BALANCE, b"", headers={"content-type": ""})

    assert reply.status == 402
    assert reply.headers["cache-control"] == "no-store"
    assert reply.json()["accepts"][0]["amount"] == str(GET_BALANCE_PROVIDER_PRICE)
    assert "payment-required" in reply.headers
    assert paid.verify_calls() == paid.upstream_calls == 0


async def test_paid_das_challenge_carries_the_das_price(paid: PaidGateway) -> None:
    reply = await paid.post(DAS_OWNER, b"")

    accept = reply.json()["accepts"][0]
    assert reply.status == 402
    assert accept["amount"] == accept["maxAmountRequired"] == "216"  # provider_a, 480 CU; no fee
    assert accept["resource"] == paid.url + DAS_OWNER


# --- malformed payments and bodies ---------------------------------------------------------------


@pytest.mark.parametrize(
    "header",
    [
        pytest.param("%%% not base64 %%%", id="not-base64"),
        pytest.param("e25vdCBqc29u", id="not-json"),  # base64 of "{not json"
        pytest.param("eyJ4NDAyVmVyc2lvbiI6ICJ0d28ifQ==", id="wrong-shape"),  # {"x402Version": "two"}
        pytest.param("WzEsIDIsIDNd", id="not-an-object"),  # [1, 2, 3]
    ],
)
async def test_paid_rpc_malformed_payment_header_is_402_and_verifies_nothing(
    paid: PaidGateway, header: str
) -> None:
    reply = await paid.pay(GET_BALANCE, balance_body(), header)

    assert reply.status == 402
    assert reply.json()["error"] == "invalid_payment_header"
    assert reply.header_json("payment-required")["error"] == "invalid_payment_header"
    assert reply.headers["cache-control"] == "no-store"
    assert paid.verify_calls() == paid.settle_calls() == paid.upstream_calls == 0


async def test_paid_rpc_payment_without_a_transaction_is_402_invalid_payload(paid: PaidGateway) -> None:
    payment = await paid.payment()
    payment = PaymentPayload(x402Version=2, payload={}, accepted=payment.accepted)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 402
    assert reply.json()["error"] == "invalid_payload"
    assert paid.verify_calls() == paid.upstream_calls == 0


INVALID_BODIES = [
    pytest.param(GET_BALANCE, b"{not json", id="not-json"),
    pytest.param(GET_BALANCE, {"jsonrpc": "2.0", "id": 1}, id="no-params"),
    pytest.param(GET_BALANCE, {"params": {"pubkey": ACCOUNT}}, id="params-not-an-array"),
    pytest.param(GET_BALANCE, {"params": [ACCOUNT, {"verbose": True}]}, id="unknown-option"),
    pytest.param(GET_BALANCE, {"params": ["not-a-pubkey!"]}, id="bad-pubkey"),
    pytest.param(GET_BALANCE, {"method": "getSlot", "params": [ACCOUNT]}, id="other-method-in-body"),
    pytest.param(
        GET_PROGRAM_ACCOUNTS,
        {"params": [TOKEN_PROGRAM, {"dataSlice": {"offset": 0, "length": 32}}]},
        id="gpa-without-filters",
    ),
    pytest.param(
        GET_PROGRAM_ACCOUNTS,
        {
            "params": [
                TOKEN_PROGRAM,
                {"filters": [{"dataSize": 165}] * 5, "dataSlice": {"offset": 0, "length": 32}},
            ]
        },
        id="gpa-5-filters",
    ),
    pytest.param(
        GET_PROGRAM_ACCOUNTS,
        {
            "params": [
                TOKEN_PROGRAM,
                {"filters": [{"dataSize": 165}], "dataSlice": {"offset": 0, "length": 257}},
            ]
        },
        id="gpa-dataslice-257",
    ),
    pytest.param(GET_SIGNATURES, {"params": [ACCOUNT, {"limit": 1001}]}, id="signatures-limit-1001"),
    pytest.param(DAS_OWNER, {"params": [{"ownerAddress": ACCOUNT, "limit": 1001}]}, id="das-limit-1001"),
]


@pytest.mark.parametrize(("path", "body"), INVALID_BODIES)
async def test_paid_route_invalid_body_is_400_and_charges_nothing(
    paid: PaidGateway, path: str, body: Any
) -> None:
    payment = await paid.payment(path)

    reply = await paid.pay(path, body, payment)

    assert reply.status == 400
    assert reply.error_code == "invalid_request"
    assert reply.json()["ok"] is False
    assert "payment-response" not in reply.headers
    assert paid.verify_calls() == paid.settle_calls() == paid.upstream_calls == 0


async def test_paid_rpc_invalid_body_leaves_the_payment_usable(paid: PaidGateway) -> None:
    payment = await paid.payment()
    assert (await paid.pay(GET_BALANCE, {"params": []}, payment)).status == 400

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200
    assert paid.settle_calls() == paid.upstream_calls == 1


# --- payments that do not match the route -----------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("amount", "1004", "amount_mismatch"),
        ("asset", "4zMMC9srt5Ri5X14GAgXhaHii3GnPAEERYPJgZJDncDU", "asset_mismatch"),
        ("network", "solana:EtWTRABZaYq6iMfeYKouRu166VU2xqa1", "invalid_network"),
        ("payTo", ACCOUNT, "pay_to_mismatch"),
        ("scheme", "upto", "invalid_scheme"),
    ],
)
async def test_paid_rpc_payment_for_other_requirements_is_402_with_the_reason(
    paid: PaidGateway, field: str, value: str, reason: str
) -> None:
    payment = await paid.payment()
    assert payment.accepted is not None
    wrong = msgspec.structs.replace(
        payment, accepted=msgspec.structs.replace(payment.accepted, **{field: value})
    )

    reply = await paid.pay(GET_BALANCE, balance_body(), wrong)

    assert reply.status == 402
    assert reply.json()["error"] == reason
    assert reply.json()["accepts"][0]["amount"] == str(GET_BALANCE_PROVIDER_PRICE)  # a fresh challenge
    assert paid.verify_calls() == paid.settle_calls() == paid.upstream_calls == 0


async def test_paid_rpc_self_transfer_is_402_self_transfer(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain
) -> None:
    # The payer pays itself: the gateway is paid to the payer's own wallet.
    paid = await start_paid_gateway(env={"X402_PAY_TO_WALLET": str(usdc_chain.payer.pubkey())})
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 402
    assert reply.json()["error"] == "self_transfer"
    assert paid.verify_calls() == paid.settle_calls() == paid.upstream_calls == 0


# --- success ------------------------------------------------------------------------------------


async def test_paid_rpc_success_returns_the_provider_json_and_the_settlement(paid: PaidGateway) -> None:
    paid.upstream.responder = static(200, PROVIDER_ANSWER)
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200
    assert reply.json() == PROVIDER_ANSWER
    assert reply.headers["content-type"] == "application/json"
    assert paid.facilitator is not None
    settle = paid.facilitator.calls_to("settle")
    assert len(settle) == 1 and settle[0].body is not None
    assert_settled_response(reply, settlement_signature(settle[0].body))
    assert "PAYMENT-RESPONSE" in reply.headers["access-control-expose-headers"]
    assert paid.verify_calls() == 1
    assert paid.upstream_calls == 1
    assert PROVIDER_KEY not in reply.body.decode()


async def test_paid_rpc_asks_the_facilitator_with_a_fresh_cdp_jwt_and_the_route_requirements(
    paid: PaidGateway,
) -> None:
    payment = await paid.payment()

    assert (await paid.pay(GET_BALANCE, balance_body(), payment)).status == 200

    assert paid.facilitator is not None
    assert paid.facilitator.rejections == []
    verify, settle = paid.facilitator.calls_to("verify")[0], paid.facilitator.calls_to("settle")[0]
    host = paid.facilitator.base_url.removeprefix("http://")
    assert verify.jwt_claims is not None and settle.jwt_claims is not None
    assert verify.jwt_claims["uris"] == [f"POST {host}/verify"]
    assert settle.jwt_claims["uris"] == [f"POST {host}/settle"]
    assert verify.jwt_header is not None and settle.jwt_header is not None
    assert verify.jwt_header["nonce"] != settle.jwt_header["nonce"]
    for call in (verify, settle):
        assert call.body is not None
        assert call.body.paymentPayload == payment
        assert call.body.paymentRequirements == payment.accepted


async def test_paid_rpc_forwards_json_rpc_2_with_the_method_from_the_path(paid: PaidGateway) -> None:
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, {"params": [ACCOUNT, {"commitment": "confirmed"}]}, payment)

    assert reply.status == 200
    (call,) = paid.upstream.calls
    assert call.method == "POST"
    assert call.path == "/provider-a/mainnet"
    assert call.query == {"api-key": PROVIDER_KEY}
    assert call.headers["Content-Type"] == "application/json"
    assert call.json == {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "getBalance",
        "params": [ACCOUNT, {"commitment": "confirmed"}],
    }
    for name in ("payment-signature", "x-payment", "Payment-Signature"):
        assert name not in call.headers


async def test_paid_rpc_keeps_the_client_request_id(paid: PaidGateway) -> None:
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(request_id="req-7"), payment)

    assert reply.status == 200
    assert paid.upstream.calls[0].json["id"] == "req-7"


async def test_paid_das_forwards_named_params_as_an_object(paid: PaidGateway) -> None:
    payment = await paid.payment(DAS_OWNER)
    params = {"ownerAddress": ACCOUNT, "limit": 10, "page": 2}

    reply = await paid.pay(DAS_OWNER, {"jsonrpc": "2.0", "id": 3, "params": [params]}, payment)

    assert reply.status == 200
    (call,) = paid.upstream.calls
    assert call.json == {"jsonrpc": "2.0", "id": 3, "method": "getAssetsByOwner", "params": params}
    assert paid.facilitator is not None
    settled = paid.facilitator.calls_to("settle")[0].body
    assert settled is not None and settled.paymentRequirements.amount == "216"


@pytest.mark.parametrize(
    ("path", "upstream_path", "method", "price"),
    [
        (
            "/v1/x402/solana/devnet/provider_a/rpc/getAccountInfo",
            "/provider-a/devnet",
            "getAccountInfo",
            "5",
        ),
        ("/v1/x402/solana/mainnet/provider_b/rpc/getBalance", "/provider-b/mainnet", "getBalance", "5"),
        ("/v1/x402/solana/devnet/provider_b/das/getAsset", "/provider-b/devnet", "getAsset", "50"),
    ],
)
async def test_paid_route_reaches_its_provider_and_cluster(
    paid: PaidGateway, path: str, upstream_path: str, method: str, price: str
) -> None:
    payment = await paid.payment(path)
    assert payment.accepted is not None and payment.accepted.amount == price
    body = {"params": [{"id": ACCOUNT}]} if method == "getAsset" else {"params": [ACCOUNT]}

    reply = await paid.pay(path, body, payment)

    assert reply.status == 200
    (call,) = paid.upstream.calls
    assert (call.path, call.json["method"]) == (upstream_path, method)


async def test_paid_rpc_accepts_a_v1_x_payment_header(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    paid = await start_paid_gateway(backend=reference_backend(usdc_chain, solana_rpc_server))
    signed = await paid.payment()
    v1 = PaymentPayload(x402Version=1, scheme="exact", network="solana", payload=signed.payload)
    before = balances(usdc_chain)

    reply = await paid.pay(GET_BALANCE, balance_body(), v1, header="x-payment")

    assert reply.status == 200, reply.body
    assert reply.headers["x-payment-response"] == reply.headers["payment-response"]
    assert reply.header_json("x-payment-response")["success"] is True
    price = GET_BALANCE_PROVIDER_PRICE
    assert balances(usdc_chain) == (before[0] - price, before[1] + price)  # type: ignore[operator]


async def test_paid_rpc_accepts_a_v2_payload_in_the_x_payment_header(paid: PaidGateway) -> None:
    payment = await paid.payment()

    reply = await paid.pay(GET_BALANCE, balance_body(), payment, header="x-payment")

    assert reply.status == 200
    assert paid.settle_calls() == paid.upstream_calls == 1


# --- real money on LiteSVM -----------------------------------------------------------------------


async def test_paid_rpc_moves_exactly_the_price_through_the_reference_facilitator(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    paid = await start_paid_gateway(backend=reference_backend(usdc_chain, solana_rpc_server))
    requirements, resource = await paid.requirements()
    rpc = SolanaRpc(solana_rpc_server.url)
    try:
        payment = await create_exact_payment(rpc, requirements, usdc_chain.payer, resource=resource)
    finally:
        await rpc.close()
    payer_before, pay_to_before = balances(usdc_chain)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200, reply.body
    assert solana_rpc_server.sent, "the reference facilitator broadcast nothing"
    assert_settled_response(reply, solana_rpc_server.sent[-1])
    assert reply.header_json("payment-response")["payer"] == str(usdc_chain.payer.pubkey())
    payer_after, pay_to_after = balances(usdc_chain)
    assert payer_before is not None and pay_to_before is not None
    # The reference facilitator pays the Solana fee: the client pays the provider part alone.
    assert payer_after == payer_before - GET_BALANCE_PROVIDER_PRICE
    assert pay_to_after == pay_to_before + GET_BALANCE_PROVIDER_PRICE
    assert paid.verify_calls() == paid.settle_calls() == paid.upstream_calls == 1


async def test_paid_rpc_accepts_a_payment_from_the_reference_x402_client(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    paid = await start_paid_gateway(backend=reference_backend(usdc_chain, solana_rpc_server))
    challenge = await paid.post(GET_BALANCE, balance_body())
    header = await reference_client_header(
        challenge.headers["payment-required"], usdc_chain.payer, solana_rpc_server.url
    )
    before = balances(usdc_chain)

    reply = await paid.pay(GET_BALANCE, balance_body(), header)

    assert reply.status == 200, reply.body
    assert_settled_response(reply, solana_rpc_server.sent[-1])
    price = GET_BALANCE_PROVIDER_PRICE
    assert balances(usdc_chain) == (before[0] - price, before[1] + price)  # type: ignore[operator]


async def test_paid_rpc_settles_through_the_internal_facilitator(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    paid = await start_paid_gateway(internal=True)
    challenge = (await paid.challenge()).json()["accepts"][0]
    assert challenge["extra"]["feePayer"] == str(usdc_chain.fee_payer.pubkey())
    assert challenge["amount"] == str(GET_BALANCE_PRICE_INTERNAL)  # 5 + routes.yaml's 2200 fee
    payment = await paid.payment()
    before = balances(usdc_chain)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200, reply.body
    assert solana_rpc_server.sent == [reply.header_json("payment-response")["transaction"]]
    assert_settled_response(reply, solana_rpc_server.sent[0])
    price = GET_BALANCE_PRICE_INTERNAL
    assert balances(usdc_chain) == (before[0] - price, before[1] + price)  # type: ignore[operator]
    assert paid.upstream_calls == 1


async def test_paid_rpc_with_a_configured_settlement_fee_settles_exactly_the_provider_part_and_the_fee(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    paid = await start_paid_gateway(
        backend=reference_backend(usdc_chain, solana_rpc_server),
        env={"FACILITATOR_SETTLEMENT_FEE_MICRO_USDC": "1000"},
    )
    challenge = await paid.challenge()
    accept = challenge.json()["accepts"][0]
    assert accept["amount"] == accept["maxAmountRequired"] == "1005"  # 5 + the configured 1000
    assert challenge.header_json("payment-required")["accepts"][0]["amount"] == "1005"
    payment = await paid.payment()
    before = balances(usdc_chain)

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200, reply.body
    assert_settled_response(reply, solana_rpc_server.sent[-1])
    assert balances(usdc_chain) == (before[0] - 1005, before[1] + 1005)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("internal", "env", "price", "settlement_fee"),
    [
        (False, {}, ("5", "$0.000005"), ("0", "$0.00")),
        (False, {"FACILITATOR_SETTLEMENT_FEE_MICRO_USDC": "1000"}, ("1005", "$0.001005"), ("1000", "$0.001")),
        (True, {}, ("2205", "$0.002205"), ("2200", "$0.0022")),
    ],
    ids=["external", "external-with-a-fee", "internal"],
)
async def test_catalog_and_openapi_show_the_price_the_402_asks_and_its_parts(
    start_paid_gateway: StartPaidGateway,
    internal: bool,
    env: dict[str, str],
    price: tuple[str, str],
    settlement_fee: tuple[str, str],
) -> None:
    paid = await start_paid_gateway(internal=internal, env=env)

    amount = (await paid.challenge()).json()["accepts"][0]["amount"]
    (entry,) = [e for e in (await paid.get("/v1/catalog")).json()["routes"] if e["path"] == GET_BALANCE]
    operation = (await paid.get("/openapi.json")).json()["paths"][GET_BALANCE]["post"]

    assert amount == price[0]
    assert entry["price"] == {"microUsdc": price[0], "usd": price[1]}
    assert entry["priceParts"] == {
        "provider": {"microUsdc": "5", "usd": "$0.000005"},
        "settlementFee": {"microUsdc": settlement_fee[0], "usd": settlement_fee[1]},
    }
    assert operation["x-x402"]["price"] == entry["price"]
    assert operation["x-x402"]["priceParts"] == entry["priceParts"]


# --- replay -------------------------------------------------------------------------------------


async def test_paid_rpc_same_payment_for_another_request_is_payment_already_used(paid: PaidGateway) -> None:
    payment = await paid.payment()
    assert (await paid.pay(GET_BALANCE, balance_body(), payment)).status == 200

    reply = await paid.pay(GET_BALANCE, balance_body(request_id=2), payment)

    assert reply.status == 402
    assert reply.json()["error"] == "payment_already_used"
    assert "payment-response" not in reply.headers
    assert paid.upstream_calls == 1
    assert paid.settle_calls() == 1
    assert paid.verify_calls() == 1  # a replay is refused from the store, before the facilitator


async def test_paid_rpc_identical_request_again_gets_the_answer_it_paid_for(paid: PaidGateway) -> None:
    payment = await paid.payment()
    first = await paid.pay(GET_BALANCE, balance_body(), payment)
    assert first.status == 200

    again = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert (again.status, again.body) == (200, first.body)
    assert again.headers["payment-response"] == first.headers["payment-response"]
    assert paid.upstream_calls == paid.settle_calls() == paid.verify_calls() == 1


async def test_paid_rpc_replay_is_refused_with_a_real_facilitator(
    start_paid_gateway: StartPaidGateway, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer
) -> None:
    paid = await start_paid_gateway(backend=reference_backend(usdc_chain, solana_rpc_server))
    payment = await paid.payment()
    assert (await paid.pay(GET_BALANCE, balance_body(), payment)).status == 200
    after_first = balances(usdc_chain)

    again = await paid.pay(GET_BALANCE, balance_body(), payment)
    reply = await paid.pay(GET_BALANCE, balance_body(request_id=2), payment)

    assert again.status == 200  # the identical request: its answer again, paid once
    assert reply.status == 402
    assert reply.json()["error"] == "payment_already_used"
    assert balances(usdc_chain) == after_first
    assert paid.upstream_calls == paid.settle_calls() == 1


async def test_paid_rpc_concurrent_requests_with_one_payment_reach_the_provider_once(
    paid: PaidGateway,
) -> None:
    paid.upstream.responder = static(200, PROVIDER_ANSWER, delay=0.1)
    payment = await paid.payment()

    replies = await asyncio.gather(*(paid.pay(GET_BALANCE, balance_body(), payment) for _ in range(4)))

    assert sorted(r.status for r in replies) == [200, 402, 402, 402]
    assert {r.json()["error"] for r in replies if r.status == 402} == {"payment_already_used"}
    assert paid.upstream_calls == 1
    assert paid.settle_calls() == 1


# --- routing, limits, accounting --------------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        pytest.param("/v1/x402/solana/devnet/provider_a/das/getAsset", id="provider_a-devnet-das"),
        pytest.param("/v1/x402/solana/mainnet/provider_a/rpc/sendTransaction", id="unknown-method"),
        pytest.param("/v1/x402/solana/mainnet/provider_c/rpc/getBalance", id="unknown-provider"),
        pytest.param("/v1/x402/solana/testnet/provider_a/rpc/getBalance", id="unknown-cluster"),
        pytest.param("/v1/x402/solana/mainnet/provider_a/das/getBalance", id="rpc-method-on-das"),
    ],
)
async def test_paid_route_that_does_not_exist_is_404(paid: PaidGateway, path: str) -> None:
    payment = await paid.payment()

    reply = await paid.pay(path, balance_body(), payment)

    assert reply.status == 404
    assert reply.error_code == "not_found"
    assert paid.verify_calls() == paid.settle_calls() == paid.upstream_calls == 0


async def test_paid_rpc_scope_rate_limit_answers_429_before_verifying(
    start_paid_gateway: StartPaidGateway,
) -> None:
    paid = await start_paid_gateway(env={"RATE_LIMIT_RPC_RPS": "2"})
    payments = [await paid.payment() for _ in range(3)]

    replies = await asyncio.gather(*(paid.pay(GET_BALANCE, balance_body(), p) for p in payments))

    assert sorted(r.status for r in replies) == [200, 200, 429]
    (limited,) = [r for r in replies if r.status == 429]
    assert limited.error_code == "rate_limited"
    assert int(limited.headers["retry-after"]) >= 1
    assert paid.verify_calls() == paid.settle_calls() == paid.upstream_calls == 2


async def test_paid_rpc_challenge_rate_limit_per_ip_answers_429(
    start_paid_gateway: StartPaidGateway,
) -> None:
    paid = await start_paid_gateway(env={"RATE_LIMIT_CHALLENGE_PER_MINUTE": "2"})
    assert (await paid.post(GET_BALANCE, b"")).status == 402
    assert (await paid.post(GET_BALANCE, b"")).status == 402

    reply = await paid.post(GET_BALANCE, b"")

    assert reply.status == 429
    assert reply.error_code == "rate_limited"
    assert int(reply.headers["retry-after"]) >= 1
    assert paid.verify_calls() == paid.upstream_calls == 0


async def test_paid_rpc_refused_payment_headers_count_against_the_challenge_limit(
    start_paid_gateway: StartPaidGateway,
) -> None:
    """A junk payment header earns a 402 challenge too: it must not make challenges unlimited."""
    paid = await start_paid_gateway(env={"RATE_LIMIT_CHALLENGE_PER_MINUTE": "2"})
    assert (await paid.pay(GET_BALANCE, balance_body(), "junk")).status == 402
    assert (await paid.pay(GET_BALANCE, balance_body(), "junk")).status == 402

    reply = await paid.pay(GET_BALANCE, balance_body(), "junk")

    assert reply.status == 429
    assert reply.error_code == "rate_limited"
    assert (await paid.post(GET_BALANCE, b"")).status == 429


async def test_paid_rpc_paid_requests_are_not_held_by_the_challenge_limit(
    start_paid_gateway: StartPaidGateway,
) -> None:
    paid = await start_paid_gateway(env={"RATE_LIMIT_CHALLENGE_PER_MINUTE": "1"})
    payment = await paid.payment()  # uses the one challenge
    assert (await paid.post(GET_BALANCE, b"")).status == 429

    reply = await paid.pay(GET_BALANCE, balance_body(), payment)

    assert reply.status == 200


def _samples(text: str, metric: str, route: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == metric and sample.labels.get("route") == route:
                found[sample.labels["outcome"]] = sample.value
    return found


async def test_paid_rpc_usage_counts_unpaid_paid_and_failed(paid: PaidGateway) -> None:
    before = _samples((await paid.get("/metrics")).body.decode(), "x402_payments_total", BALANCE_ROUTE)
    good = await paid.payment()  # one unpaid challenge
    assert (await paid.pay(GET_BALANCE, balance_body(), good)).status == 200  # paid
    bad = await paid.payment()  # a second unpaid challenge
    paid.upstream.responder = static(500, {"error": "down"})
    assert (await paid.pay(GET_BALANCE, balance_body(), bad)).status == 502  # failed

    metrics = await paid.get("/metrics")

    assert metrics.status == 200
    text = metrics.body.decode()
    assert _samples(text, "x402_usage_total", BALANCE_ROUTE) == {"unpaid": 2.0, "paid": 1.0, "failed": 1.0}
    after = _samples(text, "x402_payments_total", BALANCE_ROUTE)
    deltas = {k: after[k] - before.get(k, 0.0) for k in after if after[k] != before.get(k, 0.0)}
    assert deltas == {"challenged": 2.0, "paid": 1.0, "upstream_failed": 1.0}
