"""The whole gateway, built by ``create_app`` with its one outbound client on an in-process
transport: the JSON-RPC proxy, the asset-data proxy, the external facilitator's client and the
internal facilitator's Solana node client each answered by an ASGI app (tests/support/outbound.py)
with real statuses, headers and bytes; no socket, no server, no subprocess.

Each paid test asserts what the client got and what was settled: a provider that times out is
a 504, one that answers garbage a 502, and neither is settled.
"""

from __future__ import annotations

from collections.abc import Iterator

import jwt
import msgspec
import pytest
from prometheus_client import REGISTRY
from solders.hash import Hash
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from client.svm_payer import MintInfo, build_exact_transaction, build_payment_payload
from gateway.app import create_app
from gateway.config import load_settings
from gateway.outbound.client import UpstreamClient
from gateway.sandbox.chain import LiteSvmRpcServer, UsdcChain, setup_usdc_chain
from gateway.services import OUTBOUND_PER_HOST
from gateway.x402.headers import decode_header, encode_header
from gateway.x402.types import (
    USDC_MAINNET_MINT,
    PaymentPayload,
    PaymentRequirements,
    ResourceInfo,
    SettleResponse,
)
from tests.support.cdp_facilitator import make_ed25519_credentials
from tests.support.gateway_server import PAID_GROUPS, routes_of
from tests.support.inprocess import Answer
from tests.support.outbound import (
    BASE_URL,
    InProcessGateway,
    Reply,
    ThirdParty,
    facilitator,
    inprocess_gateway,
    settled_through,
    solana_node,
)
from tests.support.paid_fixtures import wallet_base58

GET_BALANCE = "/v1/x402/solana/mainnet/provider_a/rpc/getBalance"
BALANCE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "getBalance",
    "params": ["9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin"],
}
PROVIDER_ANSWER = b'{"jsonrpc":"2.0","id":1,"result":{"context":{"slot":1},"value":987654321}}'
PROVIDER_KEY = "provider-secret-key-0123456789"
TIMEOUT_S = 1.0
"""UPSTREAM_TIMEOUT_SECONDS: a provider that never answers is cut off after it."""
CDP = make_ed25519_credentials("outbound-key")
PROVIDERS = {
    name: f"http://provider.test/{name.lower()}?api-key={PROVIDER_KEY}"
    for name in (
        "PROVIDER_A_MAINNET_RPC_URL",
        "PROVIDER_A_DEVNET_RPC_URL",
        "PROVIDER_B_MAINNET_RPC_URL",
        "PROVIDER_B_DEVNET_RPC_URL",
    )
}


def upstream_sample(name: str, upstream: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, {"upstream": upstream, **labels}) or 0.0


def sign(answer: Answer, payer: Keypair, blockhash: Hash | None = None) -> PaymentPayload:
    """A real exact payment of the 402 ``answer``'s first offer, as a client builds it."""
    assert answer.status == 402, answer.body
    challenge = decode_header(answer.headers["payment-required"], dict)
    requirements = msgspec.convert(challenge["accepts"][0], PaymentRequirements)
    resource = msgspec.convert(challenge["resource"], ResourceInfo)
    mint = MintInfo(address=str(USDC_MAINNET_MINT), decimals=6)
    tx = build_exact_transaction(requirements, payer, mint, blockhash or Hash.new_unique())
    return build_payment_payload(requirements, tx, resource=resource)


async def pay_balance(
    gateway: InProcessGateway, payer: Keypair, blockhash: Hash | None = None
) -> tuple[Answer, int]:
    """Ask getBalance, pay its 402, send it again with the payment: the answer and the price."""
    challenge = await gateway.request("POST", GET_BALANCE, body=BALANCE)
    payment = sign(challenge, payer, blockhash)
    headers = {"payment-signature": encode_header(payment)}
    assert payment.accepted is not None
    answer = await gateway.request("POST", GET_BALANCE, body=BALANCE, headers=headers)
    return answer, int(payment.accepted.amount)


# --- the JSON-RPC proxy, settled through an external facilitator ------------------------------


class External:
    def __init__(self) -> None:
        self.fee_payer = Keypair()
        self.facilitator = facilitator(str(self.fee_payer.pubkey()))
        self.provider = ThirdParty(lambda seen: Reply(body=PROVIDER_ANSWER))
        self.env = {
            "X402_PAY_TO_WALLET": str(Keypair().pubkey()),
            "FACILITATOR_URL": "http://facilitator.test/x402",
            "FACILITATOR_API_KEY_ID": CDP.key_id,
            "FACILITATOR_API_KEY_SECRET": CDP.secret,
            "ROUTE_GROUPS": PAID_GROUPS,
            "UPSTREAM_TIMEOUT_SECONDS": str(TIMEOUT_S),
            **PROVIDERS,
        }
        self.parties = {"facilitator.test": self.facilitator, "provider.test": self.provider}


@pytest.fixture
def external() -> Iterator[External]:
    yield External()


async def test_a_paid_call_goes_out_through_the_one_client_and_is_settled_once(external: External) -> None:
    async with inprocess_gateway(external.env, external.parties) as gateway:
        outbound: UpstreamClient = gateway.services.outbound
        answer, _ = await pay_balance(gateway, Keypair())
        probe = await gateway.request("GET", "/readyz")

        # One pool: the provider's client, the facilitator's and the transport are the app's one.
        assert gateway.services.upstream("provider_a_mainnet").transport is gateway.transport
        assert gateway.services.facilitator._http.transport is outbound.transport is gateway.transport

    assert answer.status == 200, answer.body
    assert answer.body == PROVIDER_ANSWER
    receipt = decode_header(answer.headers["payment-response"], SettleResponse)
    assert (receipt.success, receipt.transaction) == (True, "tx-1")
    # What the provider was sent: the four JSON-RPC fields, its key in its URL only.
    [call] = external.provider.seen
    assert (call.method, call.path) == ("POST", "/provider_a_mainnet_rpc_url")
    assert call.query == f"api-key={PROVIDER_KEY}"
    assert call.json() == {**BALANCE, "method": "getBalance"}
    # What the facilitator was asked: /supported for the 402, then verify and settle, each with
    # a fresh CDP JWT for its own path.
    paths = external.facilitator.paths()
    assert paths.count("/x402/verify") == 1 and len(settled_through(external.facilitator)) == 1
    for seen in external.facilitator.seen:
        token = seen.headers["authorization"].removeprefix("Bearer ")
        claims = jwt.decode(token, CDP.public_key, algorithms=["EdDSA"], issuer="cdp")
        assert claims["uris"] == [f"{seen.method} {seen.headers['host']}{seen.path}"]
        assert seen.headers["host"] == "facilitator.test"
    assert probe.status == 200 and probe.json()["checks"]["facilitator"] == "ok"


@pytest.mark.parametrize(
    ("reply", "status", "code", "kind"),
    [
        pytest.param(Reply(hang=True), 504, "upstream_timeout", "timeout", id="timeout"),
        pytest.param(Reply(body=b"<html>", content_type="text/html"), 502, "upstream_error", "invalid_answer",
                     id="malformed"),
        pytest.param(Reply.of({"jsonrpc": "2.0", "id": 1}), 502, "upstream_error", "invalid_answer",
                     id="no-result"),
        pytest.param(Reply(503, b"busy"), 502, "upstream_error", "http_5xx", id="5xx"),
    ],
)  # fmt: skip
async def test_a_provider_failure_is_mapped_and_nothing_is_settled(
    external: External, reply: Reply, status: int, code: str, kind: str
) -> None:
    external.provider.then("/provider_a_mainnet_rpc_url", reply)
    errors_before = upstream_sample("x402_upstream_errors_total", "provider_a_mainnet", kind=kind)
    async with inprocess_gateway(external.env, external.parties) as gateway:
        answer, _ = await pay_balance(gateway, Keypair())

    assert answer.status == status, answer.body
    assert answer.json()["error"]["code"] == code
    assert "payment-response" not in answer.headers
    assert PROVIDER_KEY not in answer.body.decode()
    assert len(external.provider.seen) == 1
    assert external.facilitator.paths().count("/x402/verify") == 1
    assert settled_through(external.facilitator) == []  # verified, never settled
    assert upstream_sample("x402_upstream_errors_total", "provider_a_mainnet", kind=kind) == errors_before + 1


@pytest.mark.parametrize(
    "reply",
    [
        pytest.param(Reply(hang=True), id="timeout"),
        pytest.param(Reply(body=b"[]"), id="malformed"),
        pytest.param(Reply(401, b'{"error":"unauthorized"}'), id="key-refused"),
    ],
)
async def test_a_facilitator_that_cannot_verify_is_a_503_and_the_provider_is_never_called(
    external: External, reply: Reply
) -> None:
    external.facilitator.then("/x402/verify", reply)
    async with inprocess_gateway(external.env, external.parties) as gateway:
        answer, _ = await pay_balance(gateway, Keypair())

    assert answer.status == 503, answer.body
    assert answer.json()["error"]["code"] == "facilitator_unavailable"
    assert external.provider.seen == [] and settled_through(external.facilitator) == []


async def test_a_settle_answer_that_is_garbage_is_pending_and_its_retry_learns_the_outcome(
    external: External,
) -> None:
    """Garbage from settle may hide a settlement that happened: the answer is withheld, the
    payment is left pending, and the identical retry settles it (the facilitator answers now)."""
    external.facilitator.then("/x402/settle", Reply(body=b'{"success": "maybe"}'))
    async with inprocess_gateway(external.env, external.parties) as gateway:
        challenge = await gateway.request("POST", GET_BALANCE, body=BALANCE)
        headers = {"payment-signature": encode_header(sign(challenge, Keypair()))}
        pending = await gateway.request("POST", GET_BALANCE, body=BALANCE, headers=headers)
        retried = await gateway.request("POST", GET_BALANCE, body=BALANCE, headers=headers)

    assert pending.status == 503, pending.body
    assert pending.json()["error"]["code"] == "settlement_pending"
    assert PROVIDER_ANSWER not in pending.body and "payment-response" not in pending.headers
    assert retried.status == 200, retried.body
    assert retried.body == PROVIDER_ANSWER  # the answer kept for it: the provider is not asked twice
    receipt = decode_header(retried.headers["payment-response"], SettleResponse)
    assert (receipt.success, receipt.transaction) == (True, "tx-2")
    assert len(external.provider.seen) == 1
    assert external.facilitator.paths().count("/x402/verify") == 1
    assert len(settled_through(external.facilitator)) == 2


# --- the asset-data proxy, behind sign-in -----------------------------------------------------

ASSET_KEY = "asset-secret-key-0123456789"
SEARCH = "/v1/x402/tokens/assets/search"


def assets_env() -> dict[str, str]:
    return {
        "ROUTE_GROUPS": "tokens",
        "ASSET_API_BASE_URL": "http://assets.test/api",
        "ASSET_API_KEY": ASSET_KEY,
        "SIWX_SECRET": "outbound-siwx-secret-0123456789abcdef-0123",
        "UPSTREAM_TIMEOUT_SECONDS": str(TIMEOUT_S),
    }


async def signed_in_search(gateway: InProcessGateway) -> Answer:
    first = await gateway.request("GET", SEARCH, query="q=sol")
    assert first.status == 402, first.body
    signed = sign_in(first.json()["extensions"]["sign-in-with-x"], Keypair())
    return await gateway.request("GET", SEARCH, query="q=sol", headers={"sign-in-with-x": signed})


async def test_the_asset_data_proxy_answers_through_the_seam() -> None:
    assets = ThirdParty(lambda seen: Reply.of({"assets": [{"id": "sol"}]}))
    async with inprocess_gateway(assets_env(), {"assets.test": assets}) as gateway:
        answer = await signed_in_search(gateway)

    assert answer.status == 200, answer.body
    assert answer.json() == {
        "ok": True, "provider": "tokens", "surface": "tokens", "method": "search",
        "result": {"assets": [{"id": "sol"}]},
    }  # fmt: skip
    [call] = assets.seen
    assert (call.method, call.path, call.query) == ("GET", "/api/v1/assets/search", "q=sol")
    assert call.headers["x-api-key"] == ASSET_KEY


@pytest.mark.parametrize(
    ("reply", "status", "code"),
    [
        pytest.param(Reply(hang=True), 504, "upstream_timeout", id="timeout"),
        pytest.param(Reply(body=b"<html>", content_type="text/html"), 502, "upstream_error", id="malformed"),
        pytest.param(Reply(404, b"{}"), 404, "not_found", id="404"),
        pytest.param(Reply(401, b"{}"), 502, "upstream_error", id="key-refused"),
    ],
)
async def test_an_asset_data_failure_is_mapped(reply: Reply, status: int, code: str) -> None:
    assets = ThirdParty()
    assets.then("/api/v1/assets/search", reply)
    async with inprocess_gateway(assets_env(), {"assets.test": assets}) as gateway:
        answer = await signed_in_search(gateway)

    assert answer.status == status, answer.body
    assert answer.json()["error"]["code"] == code
    assert ASSET_KEY not in answer.body.decode()


# --- the internal facilitator's Solana node client --------------------------------------------


class Internal:
    def __init__(self) -> None:
        self.chain: UsdcChain = setup_usdc_chain()
        self.rpc = LiteSvmRpcServer(svm=self.chain.svm)
        self.node = solana_node(self.rpc)
        self.provider = ThirdParty(lambda seen: Reply(body=PROVIDER_ANSWER))
        self.env = {
            "X402_PAY_TO_WALLET": str(self.chain.pay_to),
            "FACILITATOR_URL": "internal",
            "FACILITATOR_WALLET_BASE58": wallet_base58(self.chain.fee_payer),
            "SOLANA_MAINNET_RPC_URL": "http://node.test/",
            "ROUTE_GROUPS": PAID_GROUPS,
            **PROVIDERS,
        }
        self.parties = {"node.test": self.node, "provider.test": self.provider}

    def rpc_methods(self) -> list[str]:
        return [s.json()["method"] for s in self.node.seen]


async def test_the_internal_facilitator_settles_on_the_chain_through_the_seam() -> None:
    internal = Internal()
    async with inprocess_gateway(internal.env, internal.parties) as gateway:
        answer, price = await pay_balance(gateway, internal.chain.payer, internal.chain.blockhash)
        probe = await gateway.request("GET", "/readyz")

    assert answer.status == 200, answer.body
    assert answer.body == PROVIDER_ANSWER
    receipt = decode_header(answer.headers["payment-response"], SettleResponse)
    assert receipt.success and receipt.transaction == internal.rpc.sent[0]
    assert internal.chain.balance(internal.chain.pay_to_ata) == price  # settled on the chain, once
    assert "sendTransaction" in internal.rpc_methods() and "getHealth" in internal.rpc_methods()
    assert probe.status == 200 and probe.json()["checks"]["facilitator"] == "ok"


async def test_a_node_that_answers_garbage_settles_nothing_and_is_not_ready() -> None:
    internal = Internal()
    internal.node.answer = lambda seen: Reply(body=b"<html>", content_type="text/html")
    async with inprocess_gateway(internal.env, internal.parties) as gateway:
        answer, _ = await pay_balance(gateway, internal.chain.payer, internal.chain.blockhash)
        probe = await gateway.request("GET", "/readyz")

    assert answer.status == 503, answer.body
    assert answer.json()["error"]["code"] == "facilitator_unavailable"
    assert internal.provider.seen == [] and internal.rpc.sent == []
    assert internal.chain.balance(internal.chain.pay_to_ata) == 0
    assert probe.status == 503 and probe.json()["error"]["code"] == "not_ready"
    assert probe.json()["error"]["details"] == {
        "failing": ["facilitator"],
        "checks": {"store": "ok", "facilitator": "unavailable"},
    }


# --- production wiring: one aiohttp pool, opened and closed by the lifespan --------------------


async def test_without_a_client_handed_in_the_app_opens_one_pool_for_everything_and_closes_it() -> None:
    internal = Internal()
    env = {**internal.env, "FACILITATOR_URL": "http://facilitator.test/x402,internal"}
    env |= {"FACILITATOR_API_KEY_ID": CDP.key_id, "FACILITATOR_API_KEY_SECRET": CDP.secret}
    settings = load_settings({"GATEWAY_BASE_URL": BASE_URL, "LOG_LEVEL": "WARNING", **env})
    app = create_app(settings, routes_of(settings))
    services = app.state.services
    assert services.outbound.session is None  # nothing opened outside the running loop

    async with app.router.lifespan_context(app):
        session = services.outbound.session
        assert session is not None and not session.closed
        assert session.connector.limit_per_host == OUTBOUND_PER_HOST
        senders = [
            services.upstream("provider_a_mainnet"),
            *(s.facilitator._http for s in services.settling),
            services.local_facilitator._rpc_for(None)._http,
        ]
        assert len(services.settling) == 2
        assert all(client.session is session for client in senders)

    assert session.closed
