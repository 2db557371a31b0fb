"""The pieces of ``x402-gateway pay``: keypair files, challenge parsing, requirement choice."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import aiohttp
import base58
import pytest
from solders.keypair import Keypair

from client.pay import (
    DEFAULT_RETRY_AFTER_S,
    MAX_USDC_AMOUNT,
    Challenge,
    PayError,
    SpendPolicy,
    choose_requirement,
    credit_left,
    credit_refusal,
    exact_solana_requirements,
    parse_challenge,
    parse_keypair,
    parse_usdc,
    payment_header,
    retry_after_s,
    rpc_failure,
    siwx_extension,
)
from gateway.outbound.solana_rpc import RpcUnavailable
from gateway.x402.headers import decode_header, encode_header
from gateway.x402.types import SOLANA_MAINNET, USDC_MAINNET_MINT, PaymentPayload, PaymentRequirements
from tests.support.ports import free_port

PAY_TO = str(Keypair().pubkey())
EXACT = {
    "scheme": "exact",
    "network": SOLANA_MAINNET,
    "amount": "1005",
    "asset": USDC_MAINNET_MINT,
    "payTo": PAY_TO,
    "maxTimeoutSeconds": 60,
    "extra": {"feePayer": PAY_TO},
}


def test_keypair_file_as_solana_keygen_json_array() -> None:
    keypair = Keypair()
    assert parse_keypair(json.dumps(list(bytes(keypair))) + "\n") == keypair


def test_keypair_file_as_base58_string() -> None:
    keypair = Keypair()
    assert parse_keypair(base58.b58encode(bytes(keypair)).decode() + "\n") == keypair


@pytest.mark.parametrize(
    "text",
    ["", "[1, 2, 3]", json.dumps([300] * 64), "[not json", "not-base58-0OIl", json.dumps(list(range(64)))],
)
def test_malformed_keypair_files_are_refused_without_echoing_them(text: str) -> None:
    with pytest.raises(PayError) as refused:
        parse_keypair(text)
    assert text.strip() == "" or text not in str(refused.value)


def test_challenge_is_read_from_the_payment_required_header_first() -> None:
    header = encode_header({"x402Version": 2, "accepts": [EXACT], "resource": {"url": "http://x/y"}})
    challenge = parse_challenge({"payment-required": header}, b"not json")
    assert exact_solana_requirements(challenge) == [PaymentRequirements(**EXACT)]  # type: ignore[arg-type]


def test_challenge_falls_back_to_the_json_body() -> None:
    body = json.dumps({"x402Version": 2, "accepts": [], "extensions": {"sign-in-with-x": {"info": {}}}})
    challenge = parse_challenge({}, body.encode())
    assert exact_solana_requirements(challenge) == []
    assert siwx_extension(challenge) == {"info": {}}


def test_a_402_without_a_challenge_is_an_error() -> None:
    with pytest.raises(PayError):
        parse_challenge({}, b"<html>402</html>")


def test_only_exact_solana_requirements_are_chosen() -> None:
    evm = {**EXACT, "network": "eip155:8453"}
    upto = {**EXACT, "scheme": "upto"}
    challenge = Challenge(accepts=[evm, upto, EXACT])
    (chosen,) = exact_solana_requirements(challenge)
    assert chosen.network == SOLANA_MAINNET


def test_v1_challenges_use_max_amount_required_and_the_x_payment_header() -> None:
    v1 = {k: v for k, v in EXACT.items() if k != "amount"} | {"network": "solana", "maxAmountRequired": "7"}
    challenge = Challenge(x402Version=1, accepts=[v1])
    (chosen,) = exact_solana_requirements(challenge)
    assert chosen.amount == "7"
    payload = PaymentPayload(x402Version=2, payload={"transaction": "AA=="}, accepted=chosen)
    name, value = payment_header(challenge, payload)
    sent = decode_header(value, PaymentPayload)
    assert name == "X-PAYMENT" and (sent.x402Version, sent.scheme, sent.network) == (1, "exact", "solana")


def test_v2_challenges_use_the_payment_signature_header() -> None:
    chosen = PaymentRequirements(**EXACT)  # type: ignore[arg-type]
    payload = PaymentPayload(x402Version=2, payload={"transaction": "AA=="}, accepted=chosen)
    name, value = payment_header(Challenge(accepts=[EXACT]), payload)
    assert name == "PAYMENT-SIGNATURE" and decode_header(value, PaymentPayload) == payload


def test_a_malformed_entry_does_not_hide_a_well_formed_one_after_it() -> None:
    malformed = {**EXACT, "amount": "-5"}
    challenge = Challenge(accepts=[malformed, EXACT])
    assert exact_solana_requirements(challenge) == [PaymentRequirements(**EXACT)]  # type: ignore[arg-type]
    payer = str(Keypair().pubkey())
    assert choose_requirement(challenge, SpendPolicy(), payer) == PaymentRequirements(**EXACT)  # type: ignore[arg-type]
    with pytest.raises(PayError) as refused:
        choose_requirement(Challenge(accepts=[malformed]), SpendPolicy(), payer)
    assert refused.value.code == "invalid_payment_requirements"
    assert "the challenge is malformed: amount must be a whole number" in str(refused.value)


def test_the_credit_left_is_read_only_as_a_plain_number() -> None:
    assert credit_left({"x-credit-balance": "999995"}) == 999995
    for hostile in ("", "-1", "1e5", " 5", "\u0663", "9" * 21):
        assert credit_left({"x-credit-balance": hostile}) is None
    assert credit_left({}) is None


async def test_a_paid_route_above_max_amount_gets_no_sign_in_when_no_credit_price_is_listed() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1/paid"  # nothing listens: no catalog to read
    async with aiohttp.ClientSession() as session:
        within = await credit_refusal(session, "POST", url, Challenge(accepts=[EXACT]), SpendPolicy(1005))
        sign_in_only = await credit_refusal(session, "POST", url, Challenge(accepts=[]), SpendPolicy(0))
        refused = await credit_refusal(session, "POST", url, Challenge(accepts=[EXACT]), SpendPolicy(1004))

    assert within is None and sign_in_only is None
    assert refused is not None and refused.code == "amount_above_max"
    assert str(refused) == (
        "refusing to pay: the challenge asks 0.001005 USDC, more than --max-amount 0.001004 USDC "
        "(from credit or paid)"
    )


@pytest.mark.parametrize(
    ("value", "seconds"),
    [(None, DEFAULT_RETRY_AFTER_S), ("", DEFAULT_RETRY_AFTER_S), ("3", 3.0), ("0", 0.0), ("soon", None)],
)
def test_retry_after_is_read_as_seconds(value: str | None, seconds: float | None) -> None:
    assert retry_after_s(value) == seconds


def test_retry_after_as_an_http_date_is_the_time_left_until_it() -> None:
    later = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    earlier = format_datetime(datetime.now(UTC) - timedelta(seconds=30), usegmt=True)

    left = retry_after_s(later)

    assert left is not None and 28 <= left <= 30
    assert retry_after_s(earlier) == 0.0


def test_an_rpc_node_without_an_answer_is_named_with_how_to_name_another() -> None:
    failed = rpc_failure(
        "cannot build the payment",
        RpcUnavailable("getLatestBlockhash", "node unreachable (ClientConnectorDNSError)"),
        "https://rpc.example.com/v2/SECRETKEY",
    )

    assert failed.code == "rpc_failed"
    assert str(failed) == (
        "cannot build the payment: no answer from the Solana RPC node https://rpc.example.com/*** "
        "(getLatestBlockhash: node unreachable (ClientConnectorDNSError)); name one that answers with "
        "--rpc URL or SOLANA_RPC_URL (the sandbox's banner prints its local chain's)"
    )


@pytest.mark.parametrize(
    ("text", "micro"),
    [("0.10", 100_000), ("0", 0), ("0.000005", 5), (str(MAX_USDC_AMOUNT), MAX_USDC_AMOUNT * 10**6)],
)
def test_max_amount_is_read_as_micro_usdc(text: str, micro: int) -> None:
    assert parse_usdc(text) == micro


@pytest.mark.parametrize(
    "text", ["-1", "1e999999999", "nan", "inf", str(MAX_USDC_AMOUNT + 1), "0.0000001", "ten"]
)
def test_a_max_amount_out_of_range_is_one_line_never_a_traceback(text: str) -> None:
    with pytest.raises(PayError) as refused:
        parse_usdc(text)

    assert refused.value.code == "usage" and str(refused.value).startswith(f"--max-amount {text!r} ")
