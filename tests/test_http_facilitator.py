"""HttpFacilitator against a real fake CDP facilitator on a socket.

The fake verifies every JWT independently (PyJWT + the generated public key), so these tests
prove the wire format and the authentication, not just our own round trip.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import msgspec
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from solders.keypair import Keypair
from x402 import x402Client
from x402.mechanisms.svm import KeypairSigner
from x402.mechanisms.svm.exact.client import ExactSvmScheme as ReferenceExactSvmClient
from x402.schemas import PaymentRequired as ReferencePaymentRequired

from gateway.facilitators.cdp_auth import CdpKey, request_uri
from gateway.facilitators.http import FacilitatorUnavailable, HttpFacilitator, fee_payer_for
from gateway.x402.types import (
    SOLANA_DEVNET,
    SOLANA_MAINNET,
    USDC_MAINNET_MINT,
    FacilitatorRequest,
    PaymentPayload,
    PaymentRequirements,
    SupportedKind,
    SupportedResponse,
)
from tests.support.cdp_facilitator import (
    DEFAULT_FEE_PAYER,
    CdpCredentials,
    CdpFacilitatorServer,
    Fault,
    ReferenceBackend,
    StaticBackend,
    close_sdk_rpc_clients,
    closed_port_url,
    make_ed25519_credentials,
    settlement_signature,
)
from tests.support.facilitator_fixtures import StartFacilitator
from tests.support.solana_fixtures import exact_requirements
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain

PAY_TO = "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin"
REQUIREMENTS = PaymentRequirements(
    scheme="exact",
    network=SOLANA_MAINNET,
    amount="1000",
    asset=USDC_MAINNET_MINT,
    payTo=PAY_TO,
    maxTimeoutSeconds=60,
    extra={"feePayer": DEFAULT_FEE_PAYER},
)
PAYLOAD = PaymentPayload(x402Version=2, payload={"transaction": "AQID"}, accepted=REQUIREMENTS)


class FakeClock:
    """A monotonic clock the test moves by hand, for the /supported cache."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


ClientFactory = Callable[..., HttpFacilitator]


@pytest.fixture
async def make_client() -> AsyncIterator[ClientFactory]:
    """Build HttpFacilitators that are closed after the test."""
    clients: list[HttpFacilitator] = []

    def make(
        server: CdpFacilitatorServer | None = None, *, base_url: str | None = None, **kwargs: Any
    ) -> HttpFacilitator:
        if server is not None and server.credentials is not None:
            kwargs.setdefault("api_key_id", server.credentials.key_id)
            kwargs.setdefault("api_key_secret", server.credentials.secret)
        kwargs.setdefault("timeout_s", 2.0)
        url = base_url if base_url is not None else server.base_url if server else closed_port_url()
        client = HttpFacilitator(url, **kwargs)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


@pytest.fixture(params=["ed25519", "es256"])
def any_key_facilitator(request: pytest.FixtureRequest) -> CdpFacilitatorServer:
    """The fake facilitator with an Ed25519 key, then with an ES256 PEM key."""
    name = "cdp_facilitator" if request.param == "ed25519" else "cdp_facilitator_es256"
    server: CdpFacilitatorServer = request.getfixturevalue(name)
    return server


# --- round trips and authentication ---------------------------------------------------------


async def test_verify_settle_supported_round_trip_is_authenticated_per_request(
    any_key_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    fake = any_key_facilitator
    assert fake.credentials is not None
    client = make_client(fake)

    supported = await client.supported()
    verified = await client.verify(PAYLOAD, REQUIREMENTS)
    settled = await client.settle(PAYLOAD, REQUIREMENTS)

    assert fee_payer_for(supported, SOLANA_MAINNET) == DEFAULT_FEE_PAYER
    assert verified.isValid is True
    expected_request = FacilitatorRequest(2, PAYLOAD, REQUIREMENTS)
    assert settled.success is True
    assert settled.transaction == settlement_signature(expected_request)
    assert settled.network == SOLANA_MAINNET
    assert fake.rejections == []
    assert [(c.endpoint, c.method) for c in fake.calls] == [
        ("supported", "GET"),
        ("verify", "POST"),
        ("settle", "POST"),
    ]
    assert fake.calls_to("verify")[0].body == expected_request
    assert fake.calls_to("settle")[0].body == expected_request
    host = f"127.0.0.1:{fake.port}"
    for call in fake.calls:
        assert call.jwt_header is not None and call.jwt_claims is not None
        assert call.jwt_header["alg"] == fake.credentials.algorithm
        assert call.jwt_header["kid"] == fake.credentials.key_id
        assert call.jwt_header["typ"] == "JWT"
        assert call.jwt_claims["iss"] == "cdp"
        assert call.jwt_claims["sub"] == fake.credentials.key_id
        assert call.jwt_claims["exp"] - call.jwt_claims["nbf"] == 120
        assert call.jwt_claims["uris"] == [f"{call.method} {host}/platform/v2/x402/{call.endpoint}"]
    nonces = {call.jwt_header["nonce"] for call in fake.calls if call.jwt_header}
    assert len(nonces) == 3


async def test_each_request_carries_a_fresh_nonce(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    client = make_client(cdp_facilitator)

    for _ in range(5):
        assert (await client.verify(PAYLOAD, REQUIREMENTS)).isValid

    assert cdp_facilitator.rejections == []
    nonces = {call.jwt_header["nonce"] for call in cdp_facilitator.calls if call.jwt_header}
    assert len(nonces) == 5


async def test_facilitator_without_key_gets_no_authorization_header(
    start_cdp_facilitator: StartFacilitator, make_client: ClientFactory
) -> None:
    fake = await start_cdp_facilitator(credentials=None)
    client = make_client(fake)

    assert (await client.verify(PAYLOAD, REQUIREMENTS)).isValid

    assert [call.bearer for call in fake.calls] == [False]


async def test_wrong_key_is_refused_with_401_and_reported_unavailable(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    assert cdp_facilitator.credentials is not None
    impostor = make_ed25519_credentials(cdp_facilitator.credentials.key_id)
    client = make_client(cdp_facilitator, api_key_secret=impostor.secret)

    with pytest.raises(FacilitatorUnavailable, match="HTTP 401"):
        await client.verify(PAYLOAD, REQUIREMENTS)

    assert [call.rejection for call in cdp_facilitator.calls] == ["bad signature"]
    assert cdp_facilitator.count("verify") == 0


async def test_base_path_and_query_of_the_facilitator_url_are_kept(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    client = make_client(cdp_facilitator, base_url=cdp_facilitator.base_url + "/?tenant=t1")

    assert (await client.settle(PAYLOAD, REQUIREMENTS)).success

    assert cdp_facilitator.rejections == []
    assert client.url == cdp_facilitator.base_url


# --- the fake really checks the JWT ---------------------------------------------------------


async def _post_verify(fake: CdpFacilitatorServer, token: str | None, path: str = "verify") -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = b'{"x402Version":2,"paymentPayload":{"x402Version":2,"payload":{}},"paymentRequirements":' + (
        b'{"scheme":"exact","network":"n","amount":"1","asset":"a","payTo":"p","maxTimeoutSeconds":1}}'
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{fake.base_url}/{path}", data=body, headers=headers) as response,
    ):
        return response.status


async def test_fake_rejects_a_replayed_token(cdp_facilitator: CdpFacilitatorServer) -> None:
    assert cdp_facilitator.credentials is not None
    key = CdpKey.parse(cdp_facilitator.credentials.key_id, cdp_facilitator.credentials.secret)
    token = key.token("POST", f"{cdp_facilitator.base_url}/verify")

    assert await _post_verify(cdp_facilitator, token) == 200
    assert await _post_verify(cdp_facilitator, token) == 401
    assert cdp_facilitator.rejections[0].rejection == "nonce reused"


async def test_fake_rejects_a_token_for_another_endpoint(cdp_facilitator: CdpFacilitatorServer) -> None:
    assert cdp_facilitator.credentials is not None
    key = CdpKey.parse(cdp_facilitator.credentials.key_id, cdp_facilitator.credentials.secret)
    token = key.token("POST", f"{cdp_facilitator.base_url}/verify")

    assert await _post_verify(cdp_facilitator, token, path="settle") == 401
    assert "do not match" in (cdp_facilitator.rejections[0].rejection or "")


async def test_fake_rejects_expired_and_missing_tokens(cdp_facilitator: CdpFacilitatorServer) -> None:
    assert cdp_facilitator.credentials is not None
    key = CdpKey.parse(cdp_facilitator.credentials.key_id, cdp_facilitator.credentials.secret)
    stale = key.token("POST", f"{cdp_facilitator.base_url}/verify", now=1_000_000)

    assert await _post_verify(cdp_facilitator, stale) == 401
    assert await _post_verify(cdp_facilitator, None) == 401
    assert [c.rejection for c in cdp_facilitator.rejections] == ["token expired", "missing bearer token"]


def test_uri_claim_is_method_host_port_and_path_only() -> None:
    assert (
        request_uri("post", "https://api.cdp.coinbase.com/platform/v2/x402/verify")
        == "POST api.cdp.coinbase.com/platform/v2/x402/verify"
    )
    assert request_uri("GET", "http://u:p@127.0.0.1:8080/x/supported?k=v") == "GET 127.0.0.1:8080/x/supported"


# --- /supported cache -----------------------------------------------------------------------


async def advertised_fee_payer(client: HttpFacilitator, network: str) -> str | None:
    """What a challenge advertises, as ChallengeFeePayer asks it: ``/supported``, then the kind."""
    return fee_payer_for(await client.supported(), network)


async def test_supported_is_fetched_once_within_the_ttl(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    client = make_client(cdp_facilitator)

    assert await advertised_fee_payer(client, SOLANA_MAINNET) == DEFAULT_FEE_PAYER
    assert await advertised_fee_payer(client, SOLANA_DEVNET) == DEFAULT_FEE_PAYER
    assert await advertised_fee_payer(client, "solana:unknown") is None

    assert cdp_facilitator.count("supported") == 1


async def test_concurrent_lookups_share_one_supported_call(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    client = make_client(cdp_facilitator)

    payers = await asyncio.gather(*(advertised_fee_payer(client, SOLANA_MAINNET) for _ in range(10)))

    assert set(payers) == {DEFAULT_FEE_PAYER}
    assert cdp_facilitator.count("supported") == 1


async def test_supported_is_refreshed_after_the_ttl(
    start_cdp_facilitator: StartFacilitator, cdp_credentials: CdpCredentials, make_client: ClientFactory
) -> None:
    backend = StaticBackend(fee_payer="OldFeePayer1111111111111111111111111111111")
    fake = await start_cdp_facilitator(credentials=cdp_credentials, backend=backend)
    clock = FakeClock()
    client = make_client(fake, supported_ttl_s=300, clock=clock)
    assert await advertised_fee_payer(client, SOLANA_MAINNET) == backend.fee_payer

    backend.fee_payer = DEFAULT_FEE_PAYER
    clock.now += 299
    assert await advertised_fee_payer(client, SOLANA_MAINNET) != DEFAULT_FEE_PAYER
    clock.now += 2
    assert await advertised_fee_payer(client, SOLANA_MAINNET) == DEFAULT_FEE_PAYER

    assert fake.count("supported") == 2


async def test_failed_refresh_keeps_the_stale_answer_and_retries_later(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    clock = FakeClock()
    client = make_client(cdp_facilitator, supported_ttl_s=300, supported_retry_s=15, clock=clock)
    assert await advertised_fee_payer(client, SOLANA_MAINNET) == DEFAULT_FEE_PAYER
    cdp_facilitator.inject(Fault.HTTP_ERROR, endpoint="supported", status=503)

    clock.now += 301
    assert await advertised_fee_payer(client, SOLANA_MAINNET) == DEFAULT_FEE_PAYER
    clock.now += 10
    assert await advertised_fee_payer(client, SOLANA_MAINNET) == DEFAULT_FEE_PAYER
    assert cdp_facilitator.count("supported") == 2

    cdp_facilitator.clear_faults()
    clock.now += 6
    assert await advertised_fee_payer(client, SOLANA_MAINNET) == DEFAULT_FEE_PAYER
    assert cdp_facilitator.count("supported") == 3
    assert cdp_facilitator.calls_to("supported")[-1].fault is None


async def test_a_live_question_asks_past_the_cache_fails_when_it_fails_and_refreshes_it(
    start_cdp_facilitator: StartFacilitator, make_client: ClientFactory
) -> None:
    """The failover's and the readiness probe's question: never the cached answer, which a
    failed refresh keeps serving; an answer it gets is cached for the challenges."""
    backend = StaticBackend(fee_payer="OldFeePayer1111111111111111111111111111111")
    fake = await start_cdp_facilitator(backend=backend)
    clock = FakeClock()
    client = make_client(fake, supported_ttl_s=300, clock=clock)
    assert await advertised_fee_payer(client, SOLANA_MAINNET) == backend.fee_payer

    backend.fee_payer = DEFAULT_FEE_PAYER
    assert fee_payer_for(await client.ask_supported(), SOLANA_MAINNET) == DEFAULT_FEE_PAYER
    assert await advertised_fee_payer(client, SOLANA_MAINNET) == DEFAULT_FEE_PAYER  # cached now
    await fake.stop()
    with pytest.raises(FacilitatorUnavailable):
        await client.ask_supported()
    assert await advertised_fee_payer(client, SOLANA_MAINNET) == DEFAULT_FEE_PAYER  # within its TTL
    assert fake.count("supported") == 2


async def test_supported_failure_without_a_cached_answer_is_unavailable(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    cdp_facilitator.inject(Fault.HTTP_ERROR, endpoint="supported")
    client = make_client(cdp_facilitator)

    with pytest.raises(FacilitatorUnavailable, match="HTTP 500"):
        await advertised_fee_payer(client, SOLANA_MAINNET)


def test_fee_payer_prefers_the_v2_kind_and_ignores_kinds_without_one() -> None:
    supported = SupportedResponse(
        kinds=[
            SupportedKind(2, "exact", SOLANA_DEVNET),
            SupportedKind(1, "exact", SOLANA_MAINNET, {"feePayer": "V1Payer"}),
            SupportedKind(2, "exact", SOLANA_MAINNET, {"feePayer": "V2Payer"}),
            SupportedKind(2, "upto", SOLANA_DEVNET, {"feePayer": "UptoPayer"}),
        ]
    )

    assert fee_payer_for(supported, SOLANA_MAINNET) == "V2Payer"
    assert fee_payer_for(supported, SOLANA_DEVNET) is None
    assert fee_payer_for(supported, SOLANA_DEVNET, scheme="upto") == "UptoPayer"


# --- faults ---------------------------------------------------------------------------------


async def test_closed_port_is_unavailable(make_client: ClientFactory) -> None:
    client = make_client(base_url=closed_port_url())

    with pytest.raises(FacilitatorUnavailable, match="ClientConnectorError"):
        await client.supported()
    with pytest.raises(FacilitatorUnavailable, match="ClientConnectorError"):
        await client.verify(PAYLOAD, REQUIREMENTS)
    with pytest.raises(FacilitatorUnavailable, match="ClientConnectorError"):
        await client.settle(PAYLOAD, REQUIREMENTS)


async def test_facilitator_going_down_and_up_again(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    client = make_client(cdp_facilitator)
    assert (await client.verify(PAYLOAD, REQUIREMENTS)).isValid

    await cdp_facilitator.stop()
    with pytest.raises(FacilitatorUnavailable):
        await client.verify(PAYLOAD, REQUIREMENTS)

    await cdp_facilitator.start()
    assert (await client.verify(PAYLOAD, REQUIREMENTS)).isValid


async def test_slow_facilitator_times_out(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    cdp_facilitator.inject(Fault.SLOW, endpoint="settle", delay_s=2.0)
    client = make_client(cdp_facilitator, timeout_s=0.2)

    with pytest.raises(FacilitatorUnavailable, match="timed out"):
        await client.settle(PAYLOAD, REQUIREMENTS)

    assert cdp_facilitator.count("settle") == 1


@pytest.mark.parametrize(
    ("fault", "status", "match"),
    [
        (Fault.INVALID_JSON, None, "not a valid verify response"),
        (Fault.WRONG_SHAPE, None, "not a valid verify response"),
        (Fault.HTTP_ERROR, 500, "HTTP 500"),
        (Fault.HTTP_ERROR, 400, "HTTP 400"),
        (Fault.HTTP_ERROR, 429, "HTTP 429"),
        (Fault.WRONG_SHAPE, 400, "HTTP 400"),
    ],
)
async def test_garbage_answers_are_unavailable(
    cdp_facilitator: CdpFacilitatorServer,
    make_client: ClientFactory,
    fault: Fault,
    status: int | None,
    match: str,
) -> None:
    cdp_facilitator.inject(fault, endpoint="verify", status=status)
    client = make_client(cdp_facilitator)

    with pytest.raises(FacilitatorUnavailable, match=match):
        await client.verify(PAYLOAD, REQUIREMENTS)


async def test_wrong_shape_from_supported_and_settle_is_unavailable(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    cdp_facilitator.inject(Fault.WRONG_SHAPE, endpoint=("supported", "settle"))
    client = make_client(cdp_facilitator)

    with pytest.raises(FacilitatorUnavailable, match="not a valid supported response"):
        await client.supported()
    with pytest.raises(FacilitatorUnavailable, match="not a valid settle response"):
        await client.settle(PAYLOAD, REQUIREMENTS)


async def test_oversized_answer_is_unavailable(
    start_cdp_facilitator: StartFacilitator, make_client: ClientFactory
) -> None:
    backend = StaticBackend(networks=[f"solana:{i:040d}" for i in range(20_000)])
    fake = await start_cdp_facilitator(backend=backend)
    client = make_client(fake)

    with pytest.raises(FacilitatorUnavailable, match="larger than"):
        await client.supported()


@pytest.mark.parametrize("status", [200, 400])
async def test_invalid_payment_is_an_answer_not_unavailability(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory, status: int
) -> None:
    cdp_facilitator.inject(Fault.VERIFY_INVALID, reason="insufficient_funds", status=status)
    client = make_client(cdp_facilitator)

    verified = await client.verify(PAYLOAD, REQUIREMENTS)

    assert verified.isValid is False
    assert verified.invalidReason == "insufficient_funds"


@pytest.mark.parametrize("status", [200, 400])
async def test_failed_settlement_is_an_answer(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory, status: int
) -> None:
    cdp_facilitator.inject(Fault.SETTLE_FAILURE, reason="transaction_simulation_failed", status=status)
    client = make_client(cdp_facilitator)

    settled = await client.settle(PAYLOAD, REQUIREMENTS)

    assert settled.success is False
    assert settled.errorReason == "transaction_simulation_failed"
    assert settled.transaction == ""
    assert cdp_facilitator.count("settle") == 1


async def test_pending_settlement_carries_the_signature(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    cdp_facilitator.inject(Fault.SETTLE_PENDING, times=1)
    client = make_client(cdp_facilitator)

    pending = await client.settle(PAYLOAD, REQUIREMENTS)
    settled = await client.settle(PAYLOAD, REQUIREMENTS)

    assert (pending.success, pending.errorReason) == (False, "settlement_pending")
    assert pending.transaction == settled.transaction != ""
    assert settled.success is True
    assert cdp_facilitator.count("settle") == 2


# --- the reference facilitator behind the fake ----------------------------------------------


async def test_reference_backend_answers_through_the_wire(
    start_cdp_facilitator: StartFacilitator, cdp_credentials: CdpCredentials, make_client: ClientFactory
) -> None:
    fee_payer = Keypair()
    backend = ReferenceBackend(fee_payer, rpc_url=closed_port_url(""))
    fake = await start_cdp_facilitator(credentials=cdp_credentials, backend=backend)
    client = make_client(fake)

    assert await advertised_fee_payer(client, SOLANA_MAINNET) == str(fee_payer.pubkey())
    requirements = msgspec.structs.replace(REQUIREMENTS, extra={"feePayer": str(fee_payer.pubkey())})
    payload = msgspec.structs.replace(PAYLOAD, accepted=requirements)
    verified = await client.verify(payload, requirements)
    settled = await client.settle(payload, requirements)

    assert verified.isValid is False
    assert verified.invalidReason == "invalid_exact_svm_payload_transaction_could_not_be_decoded"
    assert (settled.success, settled.transaction) == (False, "")
    assert fake.rejections == []


@pytest.mark.filterwarnings(
    "ignore:.*is deprecated:DeprecationWarning", "ignore:.*is deprecated:FutureWarning"
)
async def test_reference_client_payment_settles_through_cdp_wire_and_reference_facilitator(
    start_cdp_facilitator: StartFacilitator,
    cdp_credentials: CdpCredentials,
    make_client: ClientFactory,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
) -> None:
    backend = ReferenceBackend(usdc_chain.fee_payer, rpc_url=solana_rpc_server.url)
    fake = await start_cdp_facilitator(credentials=cdp_credentials, backend=backend)
    client = make_client(fake, timeout_s=10.0)
    requirements = exact_requirements(usdc_chain, amount="1234")
    assert requirements.extra is not None
    assert await advertised_fee_payer(client, SOLANA_MAINNET) == requirements.extra["feePayer"]
    scheme = ReferenceExactSvmClient(KeypairSigner(usdc_chain.payer), solana_rpc_server.url)
    required = ReferencePaymentRequired.model_validate(
        {"x402Version": 2, "resource": {"url": "http://gateway.test/v1/rpc"}, "accepts": [requirements]}
    )
    try:
        signed = await x402Client().register("solana:*", scheme).create_payment_payload(required)
    finally:
        close_sdk_rpc_clients(scheme)
    payload = msgspec.convert(signed.model_dump(by_alias=True, exclude_none=True), PaymentPayload)

    verified = await client.verify(payload, requirements)
    settled = await client.settle(payload, requirements)
    replayed = await client.settle(payload, requirements)

    assert verified.isValid, verified.invalidReason
    assert settled.success, settled.errorReason
    assert settled.payer == str(usdc_chain.payer.pubkey())
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == 1234
    assert replayed.success is False
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == 1234
    assert fake.count("settle") == 2 and fake.rejections == []


# --- secrets --------------------------------------------------------------------------------


async def test_no_secret_in_any_failure_message(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    assert cdp_facilitator.credentials is not None
    secret = cdp_facilitator.credentials.secret
    client = make_client(
        cdp_facilitator, base_url=cdp_facilitator.base_url + "?apikey=sekrit-q", timeout_s=0.2
    )
    down = make_client(
        base_url=closed_port_url().replace("http://", "http://user:hunter2pass@") + "?apikey=sekrit-q"
    )
    messages = [repr(client), repr(down)]
    for fault, status in [
        (Fault.SLOW, None),
        (Fault.INVALID_JSON, None),
        (Fault.WRONG_SHAPE, None),
        (Fault.HTTP_ERROR, 401),
        (Fault.HTTP_ERROR, 500),
    ]:
        cdp_facilitator.clear_faults()
        cdp_facilitator.inject(fault, endpoint="verify", status=status, delay_s=1.0)
        with pytest.raises(FacilitatorUnavailable) as caught:
            await client.verify(PAYLOAD, REQUIREMENTS)
        messages.append(str(caught.value))
    with pytest.raises(FacilitatorUnavailable) as caught:
        await down.verify(PAYLOAD, REQUIREMENTS)
    messages.append(str(caught.value))

    assert len(messages) == 8
    for message in messages:
        for leak in ("hunter2pass", "sekrit-q", secret, secret[:16]):
            assert leak not in message, message
    assert client.url == cdp_facilitator.base_url


def test_credentials_in_the_url_and_an_api_key_are_refused_together() -> None:
    credentials = make_ed25519_credentials()

    with pytest.raises(ValueError, match="use one") as caught:
        HttpFacilitator(
            "https://user:hunter2pass@x.example/x402",
            api_key_id=credentials.key_id,
            api_key_secret=credentials.secret,
        )

    assert "hunter2pass" not in str(caught.value)
    assert credentials.secret not in str(caught.value)


def test_public_url_has_no_credentials() -> None:
    client = HttpFacilitator("https://key:pass@facilitator.example/platform/v2/x402/?token=t#f")

    assert client.url == "https://facilitator.example/platform/v2/x402"


def _pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _mismatched_ed25519() -> str:
    seed = ed25519.Ed25519PrivateKey.generate().private_bytes_raw()
    other = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes_raw()
    return base64.b64encode(seed + other).decode()


@pytest.mark.parametrize(
    ("secret", "match"),
    [
        ("not-a-key-at-all!!", "neither a PEM EC key nor base64"),
        (base64.b64encode(b"S" * 32).decode(), "must decode to 64 bytes"),
        (_mismatched_ed25519(), "public half does not match"),
        (
            "-----BEGIN EC PRIVATE KEY-----\nc2VjcmV0Z2FyYmFnZQ==\n-----END EC PRIVATE KEY-----",
            "not a readable",
        ),
        (_pem(rsa.generate_private_key(public_exponent=65537, key_size=1024)), "not an EC private key"),
        (_pem(ec.generate_private_key(ec.SECP384R1())), "must be on P-256"),
    ],
    ids=["garbage", "short", "mismatched", "bad-pem", "rsa", "p384"],
)
def test_bad_key_material_is_refused_without_echoing_it(secret: str, match: str) -> None:
    with pytest.raises(ValueError, match=match) as caught:
        HttpFacilitator(
            "https://api.cdp.coinbase.com/platform/v2/x402", api_key_id="kid", api_key_secret=secret
        )

    message = str(caught.value)
    body = "".join(line for line in secret.splitlines() if "-----" not in line)
    assert body[:12] not in message
    assert secret not in message


@pytest.mark.parametrize(
    ("key_id", "secret"),
    [("kid", None), (None, "c2VjcmV0"), ("   ", make_ed25519_credentials().secret)],
    ids=["id-without-secret", "secret-without-id", "blank-id"],
)
def test_half_configured_key_is_refused(key_id: str | None, secret: str | None) -> None:
    with pytest.raises(ValueError) as caught:
        HttpFacilitator("https://x.example/x402", api_key_id=key_id, api_key_secret=secret)

    if secret:
        assert secret not in str(caught.value)


def test_pem_with_escaped_newlines_is_accepted() -> None:
    pem = _pem(ec.generate_private_key(ec.SECP256R1()))

    key = CdpKey.parse("kid", pem.replace("\n", "\\n"))

    assert key.algorithm == "ES256"
    assert "kid" in repr(key) and "PRIVATE" not in repr(key)


# --- session life ---------------------------------------------------------------------------


async def test_one_session_for_the_client_life_and_close_releases_it(
    cdp_facilitator: CdpFacilitatorServer,
) -> None:
    client = HttpFacilitator(
        cdp_facilitator.base_url,
        api_key_id=cdp_facilitator.credentials.key_id if cdp_facilitator.credentials else None,
        api_key_secret=cdp_facilitator.credentials.secret if cdp_facilitator.credentials else None,
    )
    await client.verify(PAYLOAD, REQUIREMENTS)
    session = client._http.session
    await client.settle(PAYLOAD, REQUIREMENTS)

    assert client._http.session is session and session is not None
    await client.close()
    assert session.closed


async def test_a_borrowed_session_is_left_open(
    cdp_facilitator: CdpFacilitatorServer, make_client: ClientFactory
) -> None:
    async with aiohttp.ClientSession() as session:
        client = make_client(cdp_facilitator, session=session)
        assert (await client.verify(PAYLOAD, REQUIREMENTS)).isValid
        await client.close()
        assert not session.closed
