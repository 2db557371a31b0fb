"""Sign-in-with-x on Solana: challenge shape, verification, every refusal, and the reference SDK."""

from __future__ import annotations

import base64
import time
from collections.abc import Callable
from typing import Any

import base58
import msgspec
import pytest
from nacl.signing import SigningKey
from solders.keypair import Keypair

from client.siwx_signer import sign_in, sign_payload, signer_address
from gateway.x402.headers import MAX_HEADER_CHARS, decode_header, encode_header
from gateway.x402.siwx import (
    EXTENSION_KEY,
    SiwxError,
    SiwxIssuer,
    SiwxReason,
    VerifiedSignIn,
    siws_message,
)
from gateway.x402.types import SOLANA_DEVNET, SOLANA_MAINNET, SiwxExtension, SiwxInfo, SiwxPayload

SECRET = b"test-siwx-secret-0123456789abcdef"
BASE_URL = "https://gateway.example.com"
STATEMENT = "Sign in to read asset data"
NOW = 1_800_000_000.0
SOLANA_TESTNET = "solana:4uhcVJyU9pJkvQyS88uRDiswHXSCkY3z"


@pytest.fixture
def issuer() -> SiwxIssuer:
    return SiwxIssuer(SECRET, BASE_URL, STATEMENT)


@pytest.fixture
def url(issuer: SiwxIssuer) -> str:
    return issuer.resource_url("/v1/assets/solana")


@pytest.fixture
def other_url(issuer: SiwxIssuer) -> str:
    return issuer.resource_url("/v1/assets/search")


@pytest.fixture
def keypair() -> Keypair:
    return Keypair()


def _ext(issuer: SiwxIssuer, url: str, now: float = NOW) -> SiwxExtension:
    ext = issuer.challenge(url, now).extensions[EXTENSION_KEY]  # type: ignore[index]
    assert isinstance(ext, SiwxExtension)
    return ext


def _signed(info: SiwxInfo, keypair: Keypair, chain: str = SOLANA_MAINNET, **changes: Any) -> str:
    """Sign ``info`` with ``changes`` applied before signing: a well-signed, possibly hostile header."""
    return encode_header(sign_payload(msgspec.structs.replace(info, **changes), keypair, chain))


def _tampered(header: str, **changes: Any) -> str:
    """Change payload fields after signing, as a man in the middle would."""
    payload = decode_header(header, SiwxPayload)
    return encode_header(msgspec.structs.replace(payload, **changes))


def _refused(issuer: SiwxIssuer, header: str, url: str, now: float = NOW + 1) -> SiwxReason:
    with pytest.raises(SiwxError) as caught:
        issuer.verify(header, url, now)
    assert caught.value.message
    assert SECRET.decode() not in caught.value.message
    return caught.value.reason


# --- the challenge ---------------------------------------------------------------------------


def test_challenge_is_a_sign_in_only_402_envelope(issuer: SiwxIssuer, url: str) -> None:
    body = msgspec.json.decode(msgspec.json.encode(issuer.challenge(url, NOW, description="asset")))
    assert body["x402Version"] == 2
    assert body["accepts"] == []
    assert body["resource"] == {"url": url, "description": "asset"}
    ext = body["extensions"]["sign-in-with-x"]
    info = ext["info"]
    assert info["domain"] == "gateway.example.com"
    assert info["uri"] == url
    assert info["version"] == "1"
    assert len(info["nonce"]) == 32 and int(info["nonce"], 16) >= 0
    assert info["issuedAt"] == "2027-01-15T08:00:00.000Z"
    assert info["expirationTime"] == "2027-01-15T08:05:00.000Z"
    assert info["statement"] == STATEMENT
    assert info["resources"] == [url]
    assert ext["supportedChains"] == [
        {"chainId": SOLANA_MAINNET, "type": "ed25519", "signatureScheme": "siws"},
        {"chainId": SOLANA_DEVNET, "type": "ed25519", "signatureScheme": "siws"},
    ]
    assert set(ext["schema"]["required"]) >= {"domain", "address", "uri", "nonce", "signature"}
    assert ext["networks"] == [SOLANA_MAINNET, SOLANA_DEVNET]
    assert ext["statement"] == STATEMENT
    assert ext["expirationSeconds"] == 300
    assert ext["resource"] == url


def test_challenge_carries_the_error_reason_when_given(issuer: SiwxIssuer, url: str) -> None:
    assert issuer.challenge(url, NOW, error=SiwxReason.EXPIRED).error == "siwx_expired"


def test_each_challenge_has_a_fresh_nonce(issuer: SiwxIssuer, url: str) -> None:
    assert _ext(issuer, url).info.nonce != _ext(issuer, url).info.nonce


@pytest.mark.parametrize(
    ("base_url", "domain", "resource"),
    [
        ("http://localhost:8080", "localhost:8080", "http://localhost:8080/v1/x"),
        ("https://Gateway.Example.com:443/", "gateway.example.com", "https://gateway.example.com/v1/x"),
        ("http://127.0.0.1:80", "127.0.0.1", "http://127.0.0.1/v1/x"),
        ("https://example.com/gw/", "example.com", "https://example.com/gw/v1/x"),
    ],
)
def test_domain_is_the_base_url_host_as_clients_see_it(base_url: str, domain: str, resource: str) -> None:
    issuer = SiwxIssuer(SECRET, base_url, STATEMENT)
    assert issuer.domain == domain
    assert issuer.resource_url("/v1/x") == resource


@pytest.mark.parametrize(
    ("secret", "base_url"),
    [
        (b"short", BASE_URL),
        (SECRET, "gateway.example.com"),
        (SECRET, "ftp://gateway.example.com"),
        (SECRET, "https://user:pw@gateway.example.com"),
        (SECRET, "https://gateway.example.com/?q=1"),
    ],
)
def test_issuer_refuses_bad_configuration(secret: bytes, base_url: str) -> None:
    with pytest.raises(ValueError):
        SiwxIssuer(secret, base_url, STATEMENT)


def test_issuer_repr_hides_the_secret(issuer: SiwxIssuer) -> None:
    assert SECRET.decode() not in repr(issuer)
    assert SECRET.decode() not in str(vars(issuer))


def test_challenge_round_trips_the_reference_decoders(issuer: SiwxIssuer, url: str) -> None:
    from x402.extensions.sign_in_with_x import SIWxExtension
    from x402.http.utils import decode_payment_required_header
    from x402.schemas import PaymentRequired

    challenge = issuer.challenge(url, NOW)
    decoded = decode_payment_required_header(encode_header(challenge))
    assert isinstance(decoded, PaymentRequired)
    assert decoded.x402_version == 2
    assert decoded.accepts == []
    assert decoded.extensions is not None
    ext = SIWxExtension.model_validate(decoded.extensions["sign-in-with-x"])
    ours = _ext(issuer, url)  # a second challenge: compare everything but the per-challenge nonce
    assert ext.info.domain == ours.info.domain
    assert ext.info.uri == ours.info.uri
    assert ext.info.statement == STATEMENT
    assert ext.info.issued_at == ours.info.issuedAt
    assert ext.info.expiration_time == ours.info.expirationTime
    assert ext.info.resources == [url]
    assert [(c.chain_id, c.type, c.signature_scheme) for c in ext.supported_chains] == [
        (SOLANA_MAINNET, "ed25519", "siws"),
        (SOLANA_DEVNET, "ed25519", "siws"),
    ]
    assert ext.schema_ == ours.schema


# --- the message -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "changes",
    [
        {},
        {"statement": None, "expirationTime": None, "resources": None},
        {"notBefore": "2027-01-15T08:00:00.000Z", "requestId": "req-1"},
        {"statement": "", "resources": []},
    ],
)
def test_message_is_byte_identical_to_the_reference(
    issuer: SiwxIssuer, url: str, keypair: Keypair, changes: dict[str, Any]
) -> None:
    from x402.extensions.sign_in_with_x import format_siws_message

    info = msgspec.structs.replace(_ext(issuer, url).info, **changes)
    address = str(keypair.pubkey())
    reference_info = {**msgspec.to_builtins(info), "chainId": SOLANA_DEVNET}
    assert siws_message(info, address, SOLANA_DEVNET) == format_siws_message(reference_info, address)


def test_message_layout() -> None:
    info = SiwxInfo(
        domain="d.example",
        uri="https://d.example/p",
        version="1",
        nonce="n" * 32,
        issuedAt="2027-01-15T08:00:00.000Z",
        statement="Hello",
        resources=["https://d.example/p"],
    )
    assert siws_message(info, "ADDR", SOLANA_MAINNET) == (
        "d.example wants you to sign in with your Solana account:\nADDR\n\nHello\n\n"
        "URI: https://d.example/p\nVersion: 1\nChain ID: 5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp\n"
        f"Nonce: {'n' * 32}\nIssued At: 2027-01-15T08:00:00.000Z\nResources:\n- https://d.example/p"
    )


# --- valid sign-ins --------------------------------------------------------------------------


def test_valid_sign_in_verifies(issuer: SiwxIssuer, url: str, keypair: Keypair) -> None:
    ext = _ext(issuer, url)
    verified = issuer.verify(sign_in(ext, keypair, SOLANA_MAINNET, request_url=url), url, NOW + 10)
    assert verified == VerifiedSignIn(
        address=str(keypair.pubkey()),
        chain_id=SOLANA_MAINNET,
        nonce=ext.info.nonce,
        issued_at=NOW,
        expires_at=NOW + 300,
        replay_ttl_ms=(300 - 10 + 30) * 1000,
    )


def test_valid_sign_in_with_a_nacl_key_on_devnet(issuer: SiwxIssuer, url: str) -> None:
    key = SigningKey.generate()
    verified = issuer.verify(sign_in(_ext(issuer, url), key, SOLANA_DEVNET), url, NOW + 299)
    assert verified.address == signer_address(key)
    assert verified.chain_id == SOLANA_DEVNET


def test_sign_in_answers_a_challenge_decoded_from_json(
    issuer: SiwxIssuer, url: str, keypair: Keypair
) -> None:
    raw = msgspec.json.decode(base64.b64decode(encode_header(issuer.challenge(url, NOW))))
    header = sign_in(raw["extensions"]["sign-in-with-x"], keypair)  # first offered chain
    assert issuer.verify(header, url, NOW + 1).chain_id == SOLANA_MAINNET


def test_issued_at_within_the_clock_skew_is_accepted(issuer: SiwxIssuer, url: str, keypair: Keypair) -> None:
    header = sign_in(_ext(issuer, url, NOW + 20), keypair)
    assert issuer.verify(header, url, NOW).issued_at == NOW + 20


def test_verify_is_pure_so_replay_is_the_callers_claim(
    issuer: SiwxIssuer, url: str, keypair: Keypair
) -> None:
    header = sign_in(_ext(issuer, url), keypair)
    first = issuer.verify(header, url, NOW + 1)
    assert issuer.verify(header, url, NOW + 2).nonce == first.nonce
    assert SiwxReason.REPLAYED.value == "siwx_replayed"


def test_another_replica_with_the_same_secret_verifies(url: str, keypair: Keypair) -> None:
    header = sign_in(_ext(SiwxIssuer(SECRET, BASE_URL, STATEMENT), url), keypair)
    assert SiwxIssuer(SECRET, BASE_URL, STATEMENT).verify(header, url, NOW + 1).address == str(
        keypair.pubkey()
    )


# --- the reference SDK as a client and as a checker -----------------------------------------


async def test_header_from_the_reference_client_verifies(
    issuer: SiwxIssuer, url: str, keypair: Keypair
) -> None:
    from x402.extensions.sign_in_with_x import create_siwx_client_hook
    from x402.http.utils import decode_payment_required_header
    from x402.mechanisms.svm.signers import KeypairSigner
    from x402.schemas.hooks import PaymentRequiredContext

    now = time.time()
    payment_required = decode_payment_required_header(encode_header(issuer.challenge(url, now)))
    hook = create_siwx_client_hook(KeypairSigner(keypair))
    result = await hook(PaymentRequiredContext(payment_required=payment_required, request_url=url))
    assert result is not None
    verified = issuer.verify(result.headers["sign-in-with-x"], url, now + 1)
    assert verified.address == str(keypair.pubkey())
    assert verified.chain_id == SOLANA_MAINNET


async def test_our_header_passes_the_reference_parser_and_verifier(
    issuer: SiwxIssuer, url: str, keypair: Keypair
) -> None:
    from x402.extensions.sign_in_with_x import (
        parse_siwx_header,
        validate_siwx_message,
        verify_siwx_signature,
    )

    header = sign_in(_ext(issuer, url, time.time()), keypair, SOLANA_DEVNET)
    payload = parse_siwx_header(header)
    assert (await validate_siwx_message(payload, BASE_URL)).is_valid
    verification = await verify_siwx_signature(payload)
    assert verification.is_valid, verification.invalid_message
    assert verification.payer == str(keypair.pubkey())


# --- refusals --------------------------------------------------------------------------------


def test_challenge_too_old_is_expired(issuer: SiwxIssuer, url: str, keypair: Keypair) -> None:
    info = _ext(issuer, url).info
    header = _signed(info, keypair, expirationTime=None)  # only issuedAt's age can expire it
    assert issuer.verify(header, url, NOW + 299).address
    assert _refused(issuer, header, url, NOW + 300) is SiwxReason.EXPIRED
    assert _refused(issuer, sign_in(_ext(issuer, url), keypair), url, NOW + 301) is SiwxReason.EXPIRED


def test_expiration_time_in_the_past_is_expired(issuer: SiwxIssuer, url: str, keypair: Keypair) -> None:
    header = _signed(_ext(issuer, url).info, keypair, expirationTime="2027-01-15T08:00:10.000Z")
    assert _refused(issuer, header, url, NOW + 20) is SiwxReason.EXPIRED


def test_not_before_in_the_future_is_not_yet_valid(issuer: SiwxIssuer, url: str, keypair: Keypair) -> None:
    header = _signed(_ext(issuer, url).info, keypair, notBefore="2027-01-15T08:02:00.000Z")
    assert _refused(issuer, header, url, NOW + 1) is SiwxReason.NOT_YET_VALID
    assert issuer.verify(header, url, NOW + 121).address


def test_issued_at_in_the_future_is_refused(issuer: SiwxIssuer, url: str, keypair: Keypair) -> None:
    header = sign_in(_ext(issuer, url, NOW + 60), keypair)
    assert _refused(issuer, header, url, NOW) is SiwxReason.ISSUED_IN_FUTURE


@pytest.mark.parametrize("domain", ["evil.example.com", "gateway.example.com:8443", "GATEWAY.example.com."])
def test_wrong_domain_is_refused(issuer: SiwxIssuer, url: str, keypair: Keypair, domain: str) -> None:
    header = _signed(_ext(issuer, url).info, keypair, domain=domain)
    assert _refused(issuer, header, url) is SiwxReason.DOMAIN_MISMATCH


def test_sign_in_for_another_route_is_refused(
    issuer: SiwxIssuer, url: str, other_url: str, keypair: Keypair
) -> None:
    header = sign_in(_ext(issuer, other_url), keypair)
    assert _refused(issuer, header, url) is SiwxReason.URI_MISMATCH


@pytest.mark.parametrize(
    "uri", ["https://gateway.example.com", "https://gateway.example.com/v1/assets/solana?x=1"]
)
def test_uri_other_than_the_resource_url_is_refused(
    issuer: SiwxIssuer, url: str, keypair: Keypair, uri: str
) -> None:
    header = _signed(_ext(issuer, url).info, keypair, uri=uri)
    assert _refused(issuer, header, url) is SiwxReason.URI_MISMATCH


@pytest.mark.parametrize(
    ("chain", "field_changes"),
    [
        (SOLANA_TESTNET, {}),
        ("eip155:8453", {}),
        (SOLANA_MAINNET, {"type": "eip191"}),
        (SOLANA_MAINNET, {"signatureScheme": "eip191"}),
    ],
)
def test_unsupported_chain_is_refused(
    issuer: SiwxIssuer, url: str, keypair: Keypair, chain: str, field_changes: dict[str, Any]
) -> None:
    header = _signed(_ext(issuer, url).info, keypair, chain)
    if field_changes:
        header = _tampered(header, **field_changes)
    assert _refused(issuer, header, url) is SiwxReason.UNSUPPORTED_CHAIN


def test_signature_by_another_key_is_refused(issuer: SiwxIssuer, url: str, keypair: Keypair) -> None:
    header = sign_in(_ext(issuer, url), keypair)
    forged = _tampered(header, address=str(Keypair().pubkey()))
    assert _refused(issuer, forged, url) is SiwxReason.SIGNATURE_INVALID


def test_corrupted_signature_is_refused(issuer: SiwxIssuer, url: str, keypair: Keypair) -> None:
    header = sign_in(_ext(issuer, url), keypair)
    raw = bytearray(base58.b58decode(decode_header(header, SiwxPayload).signature))
    raw[0] ^= 1
    forged = _tampered(header, signature=base58.b58encode(bytes(raw)).decode())
    assert _refused(issuer, forged, url) is SiwxReason.SIGNATURE_INVALID


@pytest.mark.parametrize(
    "changes",
    [
        {"statement": "Sign in and approve everything"},
        {"statement": None},
        {"requestId": "injected"},
        {"resources": ["https://evil.example/"]},
        {"expirationTime": "2027-01-15T09:00:00.000Z"},
        {"notBefore": "2027-01-15T07:00:00.000Z"},
    ],
)
def test_tampered_message_field_is_refused(
    issuer: SiwxIssuer, url: str, keypair: Keypair, changes: dict[str, Any]
) -> None:
    header = _tampered(sign_in(_ext(issuer, url), keypair), **changes)
    assert _refused(issuer, header, url) is SiwxReason.SIGNATURE_INVALID


def test_tampered_issued_at_breaks_the_nonce(issuer: SiwxIssuer, url: str, keypair: Keypair) -> None:
    header = _tampered(sign_in(_ext(issuer, url), keypair), issuedAt="2027-01-15T08:04:00.000Z")
    assert _refused(issuer, header, url, NOW + 290) is SiwxReason.NONCE_INVALID


def _flip_last(nonce: str) -> str:
    return nonce[:-1] + ("0" if nonce[-1] != "0" else "1")


@pytest.mark.parametrize(
    "make_nonce",
    [
        _flip_last,
        lambda n: _flip_last(n[:16]) + n[16:],
        lambda n: "0" * 32,
        lambda n: n[:31],
        lambda n: n + "0",
        lambda n: "z" * 32,
    ],
)
def test_nonce_not_ours_is_refused(
    issuer: SiwxIssuer, url: str, keypair: Keypair, make_nonce: Callable[[str], str]
) -> None:
    info = _ext(issuer, url).info
    header = _signed(info, keypair, nonce=make_nonce(info.nonce))
    assert _refused(issuer, header, url) is SiwxReason.NONCE_INVALID


def test_nonce_from_a_gateway_with_another_secret_is_refused(
    issuer: SiwxIssuer, url: str, keypair: Keypair
) -> None:
    stranger = SiwxIssuer(b"another-secret-of-enough-bytes!!", BASE_URL, STATEMENT)
    header = sign_in(_ext(stranger, url), keypair)
    assert _refused(issuer, header, url) is SiwxReason.NONCE_INVALID


def test_nonce_issued_for_another_resource_is_refused(
    issuer: SiwxIssuer, url: str, other_url: str, keypair: Keypair
) -> None:
    info = _ext(issuer, other_url).info
    header = _signed(info, keypair, uri=url, resources=[url])
    assert _refused(issuer, header, url) is SiwxReason.NONCE_INVALID


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


@pytest.mark.parametrize(
    "header",
    [
        "!!! not base64 !!!",
        "",
        _b64(b"not json"),
        _b64(b"[1, 2, 3]"),
        _b64(b'{"domain": "gateway.example.com"}'),
        "A" * (MAX_HEADER_CHARS + 4),
    ],
)
def test_undecodable_header_is_malformed(issuer: SiwxIssuer, url: str, header: str) -> None:
    assert _refused(issuer, header, url) is SiwxReason.MALFORMED


@pytest.mark.parametrize(
    "changes",
    [
        {"address": base58.b58encode(bytes(31)).decode()},
        {"address": base58.b58encode(bytes(range(33))).decode()},
        {"address": "0xdeadbeef"},
        {"signature": "not-base58-0OIl"},
        {"signature": base58.b58encode(bytes(63)).decode()},
        {"version": "2"},
    ],
)
def test_wrong_field_shape_is_malformed(
    issuer: SiwxIssuer, url: str, keypair: Keypair, changes: dict[str, Any]
) -> None:
    header = _tampered(sign_in(_ext(issuer, url), keypair), **changes)
    assert _refused(issuer, header, url) is SiwxReason.MALFORMED


def test_wrong_json_type_is_malformed(issuer: SiwxIssuer, url: str, keypair: Keypair) -> None:
    raw = msgspec.json.decode(base64.b64decode(sign_in(_ext(issuer, url), keypair)))
    raw["issuedAt"] = 1_800_000_000
    assert _refused(issuer, _b64(msgspec.json.encode(raw)), url) is SiwxReason.MALFORMED


@pytest.mark.parametrize(
    "changes",
    [
        {"statement": "line one\nURI: https://evil.example/"},
        {"requestId": "a\nb"},
        {"resources": ["https://gateway.example.com/a\n- https://evil.example/"]},
        {"expirationTime": "tomorrow"},
        {"expirationTime": "2027-01-15T09:00:00"},
        {"notBefore": "2027-13-01T00:00:00Z"},
    ],
)
def test_well_signed_but_unparseable_fields_are_malformed(
    issuer: SiwxIssuer, url: str, keypair: Keypair, changes: dict[str, Any]
) -> None:
    header = _signed(_ext(issuer, url).info, keypair, **changes)
    assert _refused(issuer, header, url) is SiwxReason.MALFORMED


# --- the client's own guards -----------------------------------------------------------------


def test_client_refuses_a_challenge_bound_to_another_origin(
    issuer: SiwxIssuer, url: str, keypair: Keypair
) -> None:
    with pytest.raises(ValueError, match="domain"):
        sign_in(_ext(issuer, url), keypair, request_url="https://phish.example/v1/assets/solana")
    sign_in(_ext(issuer, url), keypair, request_url="https://GATEWAY.example.com:443/v1/assets/solana")


def test_client_refuses_a_chain_the_challenge_does_not_offer(
    issuer: SiwxIssuer, url: str, keypair: Keypair
) -> None:
    with pytest.raises(ValueError, match="does not accept"):
        sign_in(_ext(issuer, url), keypair, SOLANA_TESTNET)
    with pytest.raises(ValueError, match="not a sign-in-with-x challenge"):
        sign_in({"supportedChains": []}, keypair)
