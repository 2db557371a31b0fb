"""Fuzzing: the running gateway from its own /openapi.json, and the decoders it trusts.

Two halves, both bounded in time:

* schemathesis drives every operation of the served OpenAPI document over a real socket, with
  path, query, header and body values in positive and negative modes, plus garbage and
  near-valid ``PAYMENT-SIGNATURE`` / ``X-PAYMENT`` / ``SIGN-IN-WITH-X`` headers (the near-valid
  payments carry real, correctly addressed Solana transactions, so they reach the facilitator's
  verify, which is scripted to refuse them). Every answer must be the one error shape or a 402
  challenge, never a 500 and never a secret; no request may reach an upstream or a settle.
  A second pass signs in for real on the sign-in routes, so fuzzed paths and queries reach the
  validator and the asset-data handler: exactly the 200s may reach the upstream.
* hypothesis properties: ``decode_header``, ``SiwxIssuer.verify``, ``RequestValidator`` and
  ``svm.check_exact_payment`` raise nothing but their own error on any input.

The gateway, its upstreams and the fake facilitator run in a background thread with their own
event loop, because schemathesis calls are synchronous.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import hashlib
import json
import threading
from collections.abc import Coroutine, Iterator
from contextlib import AsyncExitStack, suppress
from functools import cache
from typing import Any, TypeVar
from urllib.parse import urlencode

import msgspec
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from solders.hash import Hash
from solders.instruction import AccountMeta, Instruction
from solders.keypair import Keypair
from solders.message import MessageV0
from solders.null_signer import NullSigner
from solders.pubkey import Pubkey
from solders.signature import Signature
from solders.transaction import VersionedTransaction

from client.siwx_signer import sign_in, sign_payload
from client.svm_payer import (
    MintInfo,
    build_exact_transaction,
    compute_unit_limit_instruction,
    compute_unit_price_instruction,
    memo_instruction,
    transfer_checked_instruction,
)
from gateway.config import PACKAGED_ROUTES_FILE
from gateway.errors import STATUS_BY_CODE, ErrorCode
from gateway.routing.routes import load_routes
from gateway.routing.validation import InvalidInput, RequestValidator
from gateway.x402 import svm
from gateway.x402.headers import HeaderError, decode_header
from gateway.x402.siwx import SiwxError, SiwxIssuer, VerifiedSignIn, format_time
from gateway.x402.types import (
    SOLANA_DEVNET,
    SOLANA_MAINNET,
    USDC_MAINNET_MINT,
    PaymentPayload,
    PaymentRequirements,
    SiwxInfo,
    SiwxPayload,
)
from tests.support.cdp_facilitator import (
    DEFAULT_FEE_PAYER,
    CdpFacilitatorServer,
    Fault,
    StaticBackend,
    make_ed25519_credentials,
)
from tests.support.gateway_server import RunningGateway, run_gateway
from tests.support.upstream import Upstream

T = TypeVar("T")

pytestmark = pytest.mark.slow

PROVIDER_KEY = "fuzz-provider-key-7f3a9c2e51"
ASSET_API_KEY = "fuzz-asset-key-0b8d44e6a2"
SIWX_SECRET = "fuzz-siwx-secret-5d2c8b7e9f0a1c3d4e5f60718293a4b5"
INTERNAL_SECRET = "fuzz-internal-secret-c0ffee0123456789abcdef"
PAY_TO = str(Keypair.from_seed(hashlib.sha256(b"fuzz-pay-to").digest()).pubkey())
PAYER = Keypair.from_seed(hashlib.sha256(b"fuzz-payer").digest())
SIGNER = Keypair.from_seed(hashlib.sha256(b"fuzz-sign-in").digest())
UPSTREAM_PATHS = {
    "PROVIDER_A_MAINNET_RPC_URL": "/provider-a/mainnet",
    "PROVIDER_A_DEVNET_RPC_URL": "/provider-a/devnet",
    "PROVIDER_B_MAINNET_RPC_URL": "/provider-b/mainnet",
    "PROVIDER_B_DEVNET_RPC_URL": "/provider-b/devnet",
}
ALLOWED_ERROR_STATUSES = {400, 402, 404, 405, 409, 413, 429}
REFUSED_AT_VERIFY = "insufficient_funds"
"""The facilitator's scripted reason for refusing every payment at verify (no local check uses it)."""
PAID_PREFIX = "/v1/x402/solana/"
SETTINGS = settings(
    max_examples=15,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
PROPERTY = settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))
ROUTES = load_routes(
    PACKAGED_ROUTES_FILE,
    {"rpc": (1, 1), "das": (1, 1), "tokens": (1, 1), "challenge": (1, 1),
     "rpc_wallet": (1, 1), "das_wallet": (1, 1), "tokens_share": (1, 1),
     "sign_in_ip": (1, 1), "sign_in_wallet": (1, 1)},
)


# --- strategies shared by both halves ----------------------------------------------------------

printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=120)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
pubkeys = st.binary(min_size=32, max_size=32).map(lambda b: str(Pubkey.from_bytes(b)))


def b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def b64json(value: Any) -> str:
    return b64(json.dumps(value).encode())


def nested(depth: int, leaf: str = "0") -> str:
    """``[[[...leaf...]]]``, ``depth`` deep: JSON parsers with a recursion limit trip on it."""
    return "[" * depth + leaf + "]" * depth


deep_json_depths = st.integers(min_value=400, max_value=4000)


def or_junk(good: Any) -> st.SearchStrategy[Any]:
    """The right value most of the time, else a near miss or anything at all."""
    return st.one_of(st.just(good), st.just(good), json_scalars, printable)


def requirements_for(amount: str, asset: str, pay_to: str) -> PaymentRequirements:
    return PaymentRequirements(
        scheme="exact",
        network=SOLANA_MAINNET,
        amount=amount,
        asset=asset,
        payTo=pay_to,
        maxTimeoutSeconds=60,
        extra={"feePayer": DEFAULT_FEE_PAYER},
    )


@cache
def real_transactions(amount: str, asset: str, pay_to: str) -> tuple[str, ...]:
    """A few real, correctly addressed, partially signed payments of ``amount`` (random blockhash)."""
    requirements = requirements_for(amount, asset, pay_to)
    mint = MintInfo(address=asset, decimals=6)
    return tuple(
        svm.encode_transaction(build_exact_transaction(requirements, PAYER, mint, Hash.new_unique()))
        for _ in range(3)
    )


@st.composite
def mutated(draw: st.DrawFn, encoded: str) -> str:
    """A valid transaction with bytes flipped, cut or appended."""
    raw = bytearray(base64.b64decode(encoded))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "cut", "append"]))
        if kind == "flip" and raw:
            i = draw(st.integers(0, len(raw) - 1))
            raw[i] = draw(st.integers(0, 255))
        elif kind == "cut" and raw:
            del raw[draw(st.integers(0, len(raw) - 1)) :]
        else:
            raw += draw(st.binary(max_size=16))
    return b64(bytes(raw))


def transactions(amount: str, asset: str, pay_to: str) -> st.SearchStrategy[Any]:
    real = st.sampled_from(real_transactions(amount, asset, pay_to))
    return st.one_of(
        real,
        real.flatmap(mutated),
        st.binary(max_size=400).map(b64),
        printable,
        json_values,
    )


PAYMENT_MUTATIONS = (
    "x402Version", "scheme", "network", "asset", "amount", "payTo", "extra", "accepted", "payload",
    "transaction", "v1", "payment-identifier",
)  # fmt: skip


def correct_payment(amount: str, asset: str, pay_to: str, transaction: str) -> dict[str, Any]:
    """A payment exactly as the route asks for it: only the facilitator can refuse it."""
    accepted: dict[str, Any] = msgspec.to_builtins(requirements_for(amount, asset, pay_to))
    return {"x402Version": 2, "payload": {"transaction": transaction}, "accepted": accepted}


@st.composite
def payment_payloads(draw: st.DrawFn, amount: str, asset: str, pay_to: str) -> dict[str, Any]:
    """A correct payment of the route (real transaction, right requirements) with zero to two
    fields broken, so most of them get past decoding and reach the later checks."""
    transaction: Any = draw(st.sampled_from(real_transactions(amount, asset, pay_to)))
    payload = correct_payment(amount, asset, pay_to, transaction)
    accepted: dict[str, Any] = payload["accepted"]
    replace_payload = False
    for mutation in draw(st.lists(st.sampled_from(PAYMENT_MUTATIONS), max_size=2, unique=True)):
        if mutation == "x402Version":
            payload["x402Version"] = draw(st.sampled_from([0, 1, 3, -1, 2**63]))
        elif mutation in accepted:
            accepted[mutation] = draw(st.one_of(json_scalars, printable))
        elif mutation == "accepted":
            payload["accepted"] = draw(json_values)
        elif mutation == "payload":
            replace_payload = True
        elif mutation == "transaction":
            transaction = draw(
                st.one_of(
                    st.just(transaction).flatmap(mutated), st.binary(max_size=400).map(b64), json_values
                )
            )
        elif mutation == "v1":
            payload = {"x402Version": 1, "scheme": "exact", "network": draw(or_junk("solana")), "payload": {}}
        elif mutation == "payment-identifier":
            payment_id = draw(st.one_of(st.from_regex(r"\A[A-Za-z0-9_-]{16,40}\Z"), json_scalars))
            payload["extensions"] = {"payment-identifier": {"info": {"required": False, "id": payment_id}}}
    payload["payload"] = draw(json_values) if replace_payload else {"transaction": transaction}
    return payload


@cache
def payment_headers(amount: str, asset: str, pay_to: str) -> st.SearchStrategy[str]:
    """PAYMENT-SIGNATURE / X-PAYMENT values from garbage to near-valid (and too deep to parse)."""
    return st.one_of(
        payment_payloads(amount, asset, pay_to).map(b64json),
        payment_payloads(amount, asset, pay_to).map(b64json),
        json_values.map(b64json),
        st.binary(max_size=200).map(b64),
        printable,
        deep_json_depths.map(lambda d: b64(f'{{"x402Version":2,"payload":{{"a":{nested(d)}}}}}'.encode())),
    )


@st.composite
def siwx_payloads(draw: st.DrawFn, domain: str, uri: str) -> dict[str, Any]:
    """SIGN-IN-WITH-X payloads with most fields right (but never a nonce this gateway issued)."""
    now_ms = 1_700_000_000_000
    return {
        "domain": draw(or_junk(domain)),
        "address": draw(st.one_of(pubkeys, printable)),
        "uri": draw(or_junk(uri)),
        "version": draw(or_junk("1")),
        "chainId": draw(st.sampled_from([SOLANA_MAINNET, SOLANA_DEVNET, "eip155:1", ""])),
        "type": draw(or_junk("ed25519")),
        "nonce": draw(st.one_of(st.from_regex(r"\A[0-9a-f]{32}\Z"), printable)),
        "issuedAt": draw(st.one_of(st.just(format_time(now_ms)), printable)),
        "signature": draw(
            st.one_of(
                st.binary(min_size=64, max_size=64).map(lambda b: str(Signature.from_bytes(b))), printable
            )
        ),
        "statement": draw(st.one_of(st.none(), printable)),
        "resources": draw(st.one_of(st.none(), st.lists(printable, max_size=3))),
    }


@cache
def siwx_headers(domain: str, uri: str) -> st.SearchStrategy[str]:
    return st.one_of(
        siwx_payloads(domain, uri).map(b64json),
        siwx_payloads(domain, uri).map(b64json),
        json_values.map(b64json),
        st.binary(max_size=200).map(b64),
        printable,
        deep_json_depths.map(lambda d: b64(f'{{"domain":"x","extra":{nested(d)}}}'.encode())),
    )


# --- the world: gateway, upstreams and facilitator on loopback, in a background thread ------------


class World:
    """Everything the gateway talks to, recording every call; served by its own event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fuzz-world", daemon=True)
        self.providers = Upstream()
        self.assets = Upstream()
        self.credentials = make_ed25519_credentials()
        self.facilitator = CdpFacilitatorServer(backend=StaticBackend(), credentials=self.credentials)
        self.stack = AsyncExitStack()
        self.gateway: RunningGateway | None = None
        self.fuzzed = 0
        self.paid_answers: collections.Counter[tuple[int, str]] = collections.Counter()
        """What those cases were answered (status, error), for the final check's message."""
        self.correct_answers: collections.Counter[tuple[int, str]] = collections.Counter()
        """What the paid cases that carried a correct payment (no field broken) were answered."""

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> None:
        self.thread.start()
        self.run(self._start())

    def stop(self) -> None:
        try:
            self.run(self._stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
            self.loop.close()

    async def _start(self) -> None:
        await self.providers.start()
        await self.assets.start()
        await self.facilitator.start()
        # Every payment is refused at verify: nothing a fuzzer sends may ever be settled.
        self.facilitator.inject(Fault.VERIFY_INVALID, reason=REFUSED_AT_VERIFY)
        env = {
            "X402_PAY_TO_WALLET": PAY_TO,
            "FACILITATOR_URL": self.facilitator.base_url,
            "FACILITATOR_API_KEY_ID": self.credentials.key_id,
            "FACILITATOR_API_KEY_SECRET": self.credentials.secret,
            "ASSET_API_BASE_URL": f"{self.assets.url}/assets",
            "ASSET_API_KEY": ASSET_API_KEY,
            "SIWX_SECRET": SIWX_SECRET,
            "INTERNAL_SETTLEMENT_SECRET": INTERNAL_SECRET,
            "RATE_LIMIT_RPC_RPS": "1000000",
            "RATE_LIMIT_DAS_RPS": "1000000",
            "RATE_LIMIT_TOKENS_PER_MINUTE": "1000000",
            "RATE_LIMIT_CHALLENGE_PER_MINUTE": "1000000",
            "LOG_LEVEL": "WARNING",
            **{
                name: f"{self.providers.url}{path}?api-key={PROVIDER_KEY}"
                for name, path in UPSTREAM_PATHS.items()
            },
        }
        self.gateway = await self.stack.enter_async_context(run_gateway(env))

    async def _stop(self) -> None:
        await self.stack.aclose()
        await self.facilitator.stop()
        await self.assets.stop()
        await self.providers.stop()

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url

    @property
    def secrets(self) -> list[str]:
        """What must never appear in a response: keys, secrets and the key-bearing upstream URLs."""
        return [
            PROVIDER_KEY,
            ASSET_API_KEY,
            SIWX_SECRET,
            INTERNAL_SECRET,
            self.credentials.secret,
            self.providers.url,
            self.assets.url,
        ]

    def settles(self) -> int:
        return self.facilitator.count("settle")

    def upstream_calls(self) -> int:
        return len(self.providers.calls) + len(self.assets.calls)


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    running = World()
    try:
        running.start()
        yield running
        if running.fuzzed:
            fuzzing_settled_nothing_and_reached_no_provider(running)
    finally:
        running.stop()


def fuzzing_settled_nothing_and_reached_no_provider(world: World) -> None:
    """Checked when the module's fuzzing is over (in each pytest worker that fuzzed): no paid
    request (none was validly paid) reached a provider or a settle, though the correct payments
    the fuzzers sent on requests the route accepts got as far as the facilitator's verify (which
    refused them) or its refusal guard.

    Whether any such case is drawn at all is the fuzzers' luck: a correct payment (no field
    broken) on a body or query the route accepts is a few in a hundred of the paid cases, and the
    draws shift with whatever else the process imported (collecting the whole suite draws other
    cases than this module alone). So the check counts what was sent; the path itself is pinned
    by :func:`test_a_correct_payment_gets_as_far_as_verify_and_settles_nothing`."""
    assert world.providers.calls == [], "a fuzzed paid request reached a provider"
    assert world.settles() == 0, "a fuzzed paid request was settled"
    correct = world.correct_answers
    stopped_before = {
        answer: n
        for answer, n in correct.items()
        if answer[0] in (402, 409) and answer[1] != REFUSED_AT_VERIFY
    }
    assert not stopped_before, (
        f"correct payments refused before verify: {correct.most_common()}; "
        f"all paid cases: {world.paid_answers.most_common(12)}"
    )
    if any(answer in correct for answer in ((402, REFUSED_AT_VERIFY), (429, "rate_limited"))):
        assert world.facilitator.count("verify") > 0, (
            f"no fuzzed payment got as far as verify: {correct.most_common()}; "
            f"all paid cases: {world.paid_answers.most_common(12)}"
        )


@pytest.fixture(scope="module")
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        yield session


PAYMENT_HEADER_NAMES = st.sampled_from(["PAYMENT-SIGNATURE", "X-PAYMENT"])
SIWX_HEADER_NAMES = st.just("SIGN-IN-WITH-X")


def _load(world: World, config: dict[str, Any]) -> Any:
    """The gateway's own document, fetched from it, with credential headers worth fuzzing."""
    loaded = schemathesis.openapi.from_url(
        f"{world.url}/openapi.json", config=schemathesis.Config.from_dict(config)
    )
    domain = world.url.removeprefix("http://")

    @loaded.hook
    def flatmap_headers(context: Any, headers: dict[str, Any] | None) -> st.SearchStrategy[Any]:
        operation = context.operation
        terms = operation.definition.raw.get("x-x402") or {}
        generated = dict(headers or {})
        if terms.get("scheme") == "exact":
            value = payment_headers(terms["price"]["microUsdc"], terms["asset"], terms["payTo"])
        elif terms.get("scheme") == "sign-in-with-x":
            value = siwx_headers(domain, world.url + operation.path)
        else:
            return st.just(headers)
        names = PAYMENT_HEADER_NAMES if terms["scheme"] == "exact" else SIWX_HEADER_NAMES
        # Strategies are built once per operation (cached): building them per case is slow.
        credential = st.tuples(names, value).map(lambda pair: {**generated, pair[0]: pair[1]})
        return st.one_of(st.just(headers), credential, credential)

    return loaded


@pytest.fixture(scope="module")
def api_schema(world: World) -> Any:
    """Fuzzing phase only: without a credential every paid or sign-in request ends in its 402, so
    the coverage phase's boundary values would all be spent on the same challenge."""
    return _load(world, {"phases": {"coverage": {"enabled": False}}})


@pytest.fixture(scope="module")
def signed_in_api_schema(world: World) -> Any:
    """Coverage (boundary values, duplicate query parameters, unexpected methods) and fuzzing:
    signed in, every value reaches the validator."""
    return _load(world, {"phases": {"coverage": {"generate-duplicate-query-parameters": True}}})


schema = schemathesis.pytest.from_fixture("api_schema")
signed_in_schema = schemathesis.pytest.from_fixture("signed_in_api_schema").include(tag="tokens")


# --- what every answer must look like -----------------------------------------------------------


def _header(response: Any, name: str) -> str:
    """One header of a schemathesis response (lower-case keys, list values)."""
    values = response.headers.get(name.lower()) or [""]
    return str(values[0])


def check_answer(world: World, response: Any) -> None:
    """The one error shape or a 402 challenge; no 5xx; no secret anywhere in the response."""
    status = response.status_code
    text = response.content.decode("latin-1")
    headers = "\n".join(f"{k}: {v}" for k, values in response.headers.items() for v in values)
    for secret in world.secrets:
        assert secret not in text, f"secret in the body of a {status}"
        assert secret not in headers, f"secret in the headers of a {status}"
    assert status < 500, f"{status}: {text[:500]}"
    if 200 <= status < 300:
        return
    assert status in ALLOWED_ERROR_STATUSES, f"unexpected {status}: {text[:500]}"
    assert _header(response, "content-type").startswith("application/json"), text[:200]
    body = json.loads(text)
    if status == 402:
        assert body["x402Version"] == 2
        assert isinstance(body["accepts"], list)
        assert isinstance(body.get("error"), str | None)
        header = json.loads(base64.b64decode(_header(response, "payment-required"), validate=True))
        assert header["x402Version"] == 2
        return
    assert set(body) == {"ok", "error"}, body
    assert body["ok"] is False
    assert set(body["error"]) <= {"code", "message", "details"}
    assert isinstance(body["error"]["message"], str)
    code = ErrorCode(body["error"]["code"])
    assert STATUS_BY_CODE[code] == status, body


def carries_a_correct_payment(case: Any) -> bool:
    """The case's payment header is one of the correct payments for its route, nothing broken."""
    terms = case.operation.definition.raw.get("x-x402") or {}
    headers = case.headers or {}
    value = headers.get("PAYMENT-SIGNATURE", headers.get("X-PAYMENT"))
    if terms.get("scheme") != "exact" or not isinstance(value, str):
        return False
    amount, asset, pay_to = terms["price"]["microUsdc"], terms["asset"], terms["payTo"]
    try:
        payload = json.loads(base64.b64decode(value, validate=True))
    except (ValueError, RecursionError):  # not even JSON, or nested past the parser's depth
        return False
    return any(
        payload == correct_payment(amount, asset, pay_to, transaction)
        for transaction in real_transactions(amount, asset, pay_to)
    )


# --- schemathesis against the running gateway -----------------------------------------------------

GET_BALANCE = "/v1/x402/solana/mainnet/provider_a/rpc/getBalance"
BALANCE_CALL = {"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [str(PAYER.pubkey())]}


def test_a_correct_payment_gets_as_far_as_verify_and_settles_nothing(
    world: World, http: requests.Session
) -> None:
    """The path the fuzzers' final check counts on, taken on purpose (first in the module, before
    the fuzzing spends the refusal guard): a correct payment on a request the route accepts is
    refused by the facilitator's verify, and nothing reaches the provider or a settle."""
    challenge = http.post(world.url + GET_BALANCE, json=BALANCE_CALL)
    assert challenge.status_code == 402, challenge.text
    offer = challenge.json()["accepts"][0]
    (transaction, *_) = real_transactions(offer["amount"], offer["asset"], offer["payTo"])
    payment = correct_payment(offer["amount"], offer["asset"], offer["payTo"], transaction)
    verifies = world.facilitator.count("verify")

    reply = http.post(
        world.url + GET_BALANCE, json=BALANCE_CALL, headers={"PAYMENT-SIGNATURE": b64json(payment)}
    )

    assert reply.status_code == 402, reply.text
    assert reply.json()["error"] == REFUSED_AT_VERIFY
    assert world.facilitator.count("verify") == verifies + 1
    assert world.settles() == 0 and world.upstream_calls() == 0


@schema.parametrize()
@SETTINGS
def test_fuzz_every_operation_never_fails_leaks_or_reaches_upstream(
    case: Any, world: World, http: requests.Session
) -> None:
    upstream_before, settles_before = world.upstream_calls(), world.settles()

    response = case.call(base_url=world.url, session=http, timeout=10)
    world.fuzzed += 1  # counted for the module's final check (the signed-in pass pays nothing)
    if case.path.startswith(PAID_PREFIX):
        error = response.json().get("error") if response.content.startswith(b"{") else None
        reason = error.get("code") if isinstance(error, dict) else error
        world.paid_answers[(response.status_code, str(reason))] += 1
        if carries_a_correct_payment(case):
            world.correct_answers[(response.status_code, str(reason))] += 1

    check_answer(world, response)
    assert world.upstream_calls() == upstream_before, "an unauthenticated request reached an upstream"
    assert world.settles() == settles_before, "an unauthenticated request was settled"
    case.validate_response(
        response,
        checks=[
            schemathesis.checks.not_a_server_error,
            schemathesis.checks.status_code_conformance,
            schemathesis.checks.content_type_conformance,
            schemathesis.checks.response_schema_conformance,
        ],
    )


@signed_in_schema.parametrize()
@SETTINGS
def test_fuzz_signed_in_requests_reach_the_upstream_only_when_valid(
    case: Any, world: World, http: requests.Session
) -> None:
    case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "sign-in-with-x"}
    challenge = case.call(base_url=world.url, session=http, timeout=10)
    check_answer(world, challenge)
    if challenge.status_code != 402:  # a preflight, another method, an encoded slash: nothing to sign
        assert challenge.status_code in (204, 404, 405), challenge.text[:300]
        return
    header = sign_in(challenge.json()["extensions"]["sign-in-with-x"], SIGNER, request_url=world.url)
    calls_before = len(world.assets.calls)

    response = case.call(base_url=world.url, session=http, timeout=10, headers={"SIGN-IN-WITH-X": header})

    check_answer(world, response)
    assert response.status_code != 402, f"a fresh, correctly signed sign-in was refused: {response.text}"
    reached = len(world.assets.calls) - calls_before
    assert reached == (1 if response.status_code == 200 else 0), (response.status_code, response.text[:300])
    if reached:
        call = world.assets.calls[-1]
        assert call.path.startswith("/assets/v1/")
        assert call.headers.get("x-api-key") == ASSET_API_KEY
        declared = {p["name"] for p in case.operation.definition.raw.get("parameters", []) if "name" in p}
        assert set(call.query) <= declared, "a parameter the route does not declare was forwarded"


def test_too_deeply_nested_json_is_refused_not_a_500(world: World, http: requests.Session) -> None:
    """Found by the fuzzers: msgspec raises RecursionError past a few hundred levels of nesting,
    which escaped the header decoder and the body validator as a 500."""
    deep_header = b64(f'{{"x402Version":2,"payload":{{"a":{nested(2000)}}}}}'.encode())
    decodable = b64json({"x402Version": 2, "payload": {"transaction": "AA=="}})

    header_reply = http.post(world.url + GET_BALANCE, json={}, headers={"PAYMENT-SIGNATURE": deep_header})
    body_reply = http.post(
        world.url + GET_BALANCE,
        data=nested(2000).encode(),
        headers={"PAYMENT-SIGNATURE": decodable, "content-type": "application/json"},
    )

    assert header_reply.status_code == 402
    assert header_reply.json()["error"] == "invalid_payment_header"
    assert body_reply.status_code == 400
    assert body_reply.json()["error"]["message"] == "body: is nested too deeply"


# --- hypothesis: header decoders ------------------------------------------------------------------


def _decode_only_header_errors(value: str) -> None:
    for shape in (PaymentPayload, SiwxPayload):
        with suppress(HeaderError):
            decode_header(value, shape)


@PROPERTY
@given(st.one_of(st.text(max_size=300), st.binary(max_size=300).map(lambda b: b.decode("latin-1"))))
def test_decode_header_refuses_arbitrary_text_with_header_error(value: str) -> None:
    _decode_only_header_errors(value)


@PROPERTY
@given(
    st.one_of(
        st.binary(max_size=300).map(b64),
        json_values.map(b64json),
        payment_payloads("1005", USDC_MAINNET_MINT, PAY_TO).map(b64json),
        siwx_payloads("gw.example", "https://gw.example/x").map(b64json),
        deep_json_depths.map(lambda d: b64(f'{{"x402Version":2,"payload":{{"a":{nested(d)}}}}}'.encode())),
        deep_json_depths.map(lambda d: b64(f'{{"domain":"x","zzz":{nested(d)}}}'.encode())),
    ),
    st.sampled_from(["", " ", "\n", "=", "==", "!"]),
)
def test_decode_header_refuses_near_valid_base64_json_with_header_error(value: str, suffix: str) -> None:
    _decode_only_header_errors(value)
    _decode_only_header_errors(value + suffix)


# --- hypothesis: sign-in verification -------------------------------------------------------------

ISSUER = SiwxIssuer(SIWX_SECRET.encode(), "https://gw.example", "Sign in to x402-gateway")
RESOURCE = "https://gw.example/v1/x402/tokens/assets/search"
NOW = 1_800_000_000.0


@st.composite
def signed_payloads(draw: st.DrawFn) -> SiwxPayload:
    """A payload whose nonce MAC is right for its issuedAt (so the time and signature checks run),
    signed over whatever the other fields hold, then possibly tampered with."""
    issued_at = draw(
        st.one_of(
            st.integers(int(NOW * 1000) - 600_000, int(NOW * 1000) + 600_000).map(format_time),
            printable.filter(lambda s: "\n" not in s),
        )
    )
    random_part = draw(st.from_regex(r"\A[0-9a-f]{16}\Z"))
    optional = st.one_of(st.none(), printable, st.text(max_size=40))
    info = SiwxInfo(
        domain=draw(or_junk(ISSUER.domain).filter(lambda v: isinstance(v, str))),
        uri=draw(st.sampled_from([RESOURCE, RESOURCE + "/", "https://other.example/"])),
        version=draw(st.sampled_from(["1", "2"])),
        nonce=random_part + ISSUER._mac(random_part, issued_at, RESOURCE),
        issuedAt=issued_at,
        expirationTime=draw(optional),
        notBefore=draw(optional),
        requestId=draw(optional),
        statement=draw(optional),
        resources=draw(st.one_of(st.none(), st.lists(st.text(max_size=30), max_size=3))),
    )
    chain = draw(st.sampled_from([SOLANA_MAINNET, SOLANA_DEVNET, "solana:x", "eip155:1"]))
    payload = sign_payload(info, SIGNER, chain, draw(st.sampled_from([None, "siws", "eip191"])))
    if draw(st.booleans()):
        field = draw(st.sampled_from(["statement", "signature", "address", "nonce", "uri"]))
        payload = msgspec.structs.replace(payload, **{field: draw(printable)})
    return payload


def test_an_untampered_signed_payload_verifies() -> None:
    """The generator above starts from sign-ins the issuer accepts, so its mutations are near misses."""
    issued_at = format_time(int(NOW * 1000))
    info = SiwxInfo(
        domain=ISSUER.domain,
        uri=RESOURCE,
        version="1",
        nonce="0" * 16 + ISSUER._mac("0" * 16, issued_at, RESOURCE),
        issuedAt=issued_at,
    )
    payload = sign_payload(info, SIGNER, SOLANA_MAINNET)

    assert _verify(base64.b64encode(msgspec.json.encode(payload)).decode()) is not None


def _verify(header: str) -> VerifiedSignIn | None:
    try:
        return ISSUER.verify(header, RESOURCE, now=NOW)
    except SiwxError:
        return None


@PROPERTY
@given(st.one_of(printable, st.text(max_size=200), siwx_headers(ISSUER.domain, RESOURCE)))
def test_siwx_verify_refuses_arbitrary_headers_with_siwx_error(header: str) -> None:
    assert _verify(header) is None


@PROPERTY
@given(signed_payloads())
def test_siwx_verify_raises_only_siwx_error_on_signed_near_valid_payloads(payload: SiwxPayload) -> None:
    header = base64.b64encode(msgspec.json.encode(payload)).decode()

    verified = _verify(header)

    if verified is not None:  # then it really was a valid sign-in for this resource
        assert verified.address == str(SIGNER.pubkey())
        assert payload.uri == RESOURCE


# --- hypothesis: request validation ----------------------------------------------------------------

VALIDATED = [r for r in ROUTES if r.input]
VALIDATORS = {r.name: RequestValidator(r.input) for r in VALIDATED}


def _names(route_name: str, location: str) -> list[str]:
    (route,) = [r for r in VALIDATED if r.name == route_name]
    return sorted((route.input.get(location) or {}).get("properties") or {}) or ["x"]


@st.composite
def queries(draw: st.DrawFn) -> tuple[str, bytes]:
    name = draw(st.sampled_from(sorted(VALIDATORS)))
    keys = st.one_of(st.sampled_from(_names(name, "query")), st.text(max_size=10))
    values = st.one_of(st.text(max_size=60), st.integers().map(str), printable)
    pairs = draw(st.lists(st.tuples(keys, values), max_size=6))
    raw = draw(st.one_of(st.just(urlencode(pairs).encode()), st.binary(max_size=200)))
    return name, raw


@PROPERTY
@given(queries())
def test_query_validation_raises_only_invalid_input(case: tuple[str, bytes]) -> None:
    name, raw = case
    with suppress(InvalidInput):
        VALIDATORS[name].query(raw)


@PROPERTY
@given(
    st.sampled_from(sorted(VALIDATORS)),
    st.one_of(
        st.binary(max_size=300),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.fixed_dictionaries(
            {"jsonrpc": or_junk("2.0"), "id": json_scalars, "method": printable, "params": json_values}
        ).map(lambda v: json.dumps(v).encode()),
        deep_json_depths.map(lambda d: nested(d).encode()),
        deep_json_depths.map(lambda d: f'{{"jsonrpc":"2.0","params":[{{"options":{nested(d)}}}]}}'.encode()),
    ),
)
def test_body_validation_raises_only_invalid_input(name: str, raw: bytes) -> None:
    with suppress(InvalidInput):
        VALIDATORS[name].body(raw)


@PROPERTY
@given(st.sampled_from(sorted(VALIDATORS)), st.dictionaries(st.sampled_from(["assetId", "x"]), st.text()))
def test_path_validation_raises_only_invalid_input(name: str, params: dict[str, str]) -> None:
    with suppress(InvalidInput):
        VALIDATORS[name].path(params)


# --- hypothesis: the exact-payment rules -----------------------------------------------------------

REQUIREMENTS = requirements_for("1005", USDC_MAINNET_MINT, PAY_TO)
MINT = Pubkey.from_string(USDC_MAINNET_MINT)
FEE_PAYER = Pubkey.from_string(DEFAULT_FEE_PAYER)
KEYS = [FEE_PAYER, PAYER.pubkey(), MINT, Pubkey.from_string(PAY_TO), svm.TOKEN_PROGRAM, Pubkey.new_unique()]


@st.composite
def instructions(draw: st.DrawFn) -> Instruction:
    """Any of the instructions a payment may hold, with fuzzed fields, or something else entirely."""
    key = st.sampled_from(KEYS)
    kind = draw(st.sampled_from(["limit", "price", "transfer", "memo", "other"]))
    if kind == "limit":
        return compute_unit_limit_instruction(draw(st.integers(0, 2**32 - 1)))
    if kind == "price":
        return compute_unit_price_instruction(draw(st.integers(0, 2**64 - 1)))
    if kind == "transfer":
        owner = draw(key)
        return transfer_checked_instruction(
            source=svm.associated_token_address(owner, MINT),
            mint=draw(st.sampled_from([MINT, *KEYS])),
            destination=draw(
                st.sampled_from([svm.associated_token_address(Pubkey.from_string(PAY_TO), MINT), *KEYS])
            ),
            authority=draw(st.sampled_from([PAYER.pubkey(), FEE_PAYER])),
            amount=draw(st.sampled_from([1005, 1004, 0, 2**64 - 1])),
            decimals=draw(st.integers(0, 255)),
            token_program=draw(st.sampled_from([svm.TOKEN_PROGRAM, svm.TOKEN_2022_PROGRAM, *KEYS])),
        )
    if kind == "memo":
        return memo_instruction(draw(st.binary(max_size=40)))
    accounts = draw(st.lists(st.tuples(key, st.booleans()), max_size=4))
    return Instruction(
        draw(st.sampled_from([*KEYS, svm.MEMO_PROGRAM, svm.LIGHTHOUSE_PROGRAM])),
        draw(st.binary(max_size=20)),
        [AccountMeta(k, is_signer=False, is_writable=w) for k, w in accounts],
    )


@st.composite
def structured_transactions(draw: st.DrawFn) -> str:
    """Well-formed v0 transactions from fuzzed instructions, signed by the payer: every rule runs."""
    program = draw(st.lists(instructions(), max_size=8))
    payer_key = draw(st.sampled_from([FEE_PAYER, FEE_PAYER, PAYER.pubkey(), Pubkey.new_unique()]))
    try:
        message = MessageV0.try_compile(payer_key, program, [], Hash.new_unique())
        signers: list[Any] = [NullSigner(payer_key)] if payer_key != PAYER.pubkey() else []
        n = message.header.num_required_signatures
        signers += [PAYER] if PAYER.pubkey() in list(message.account_keys)[:n] else []
        tx = VersionedTransaction(message, signers)
    except Exception:  # compile/sign refusals are solders' business, not the rules'
        assume(False)
        raise
    return svm.encode_transaction(tx)


def _check(transaction: Any, requirements: PaymentRequirements = REQUIREMENTS) -> svm.ExactCheck:
    payload = PaymentPayload(x402Version=2, payload={"transaction": transaction}, accepted=requirements)
    result = svm.check_exact_payment(payload, requirements, [DEFAULT_FEE_PAYER])
    assert isinstance(result, svm.ExactCheck)
    return result


@PROPERTY
@given(st.one_of(st.binary(max_size=1300).map(b64), printable, json_values))
def test_check_exact_payment_never_raises_on_garbage_transactions(transaction: Any) -> None:
    assert not _check(transaction).ok


@PROPERTY
@given(st.sampled_from(real_transactions("1005", USDC_MAINNET_MINT, PAY_TO)).flatmap(mutated))
def test_check_exact_payment_never_raises_on_mutated_transactions(transaction: str) -> None:
    _check(transaction)


@PROPERTY
@given(structured_transactions())
def test_check_exact_payment_never_raises_on_structured_transactions(transaction: str) -> None:
    _check(transaction)


def test_a_real_payment_passes_the_rules() -> None:
    """The generators above start from payments the rules accept, so mutations are near misses."""
    (transaction, *_) = real_transactions("1005", USDC_MAINNET_MINT, PAY_TO)

    assert _check(transaction).ok


ODD_REQUIREMENTS: dict[str, st.SearchStrategy[Any]] = {
    "scheme": st.one_of(printable, st.just("EXACT")),
    "network": st.sampled_from([SOLANA_DEVNET, "solana", "eip155:1", ""]),
    "amount": st.one_of(
        st.integers().map(str),
        st.text(max_size=30),
        st.integers(4000, 6000).map(lambda n: "9" * n),  # past int()'s 4300-digit limit
    ),
    "asset": st.one_of(printable, pubkeys),
    "payTo": st.one_of(printable, pubkeys),
    "extra": st.one_of(st.none(), st.dictionaries(st.just("feePayer"), json_values), json_values),
}


@PROPERTY
@given(st.lists(st.sampled_from(sorted(ODD_REQUIREMENTS)), min_size=1, max_size=2, unique=True), st.data())
def test_check_exact_payment_never_raises_on_odd_requirements(fields: list[str], data: st.DataObject) -> None:
    """The requirements are ours at the gateway, but the internal facilitator takes them from callers."""
    changes = {field: data.draw(ODD_REQUIREMENTS[field]) for field in fields}
    if "extra" in changes and not isinstance(changes["extra"], dict | None):
        changes["extra"] = {"feePayer": changes["extra"]}
    requirements = msgspec.structs.replace(REQUIREMENTS, **changes)
    (transaction, *_) = real_transactions("1005", USDC_MAINNET_MINT, PAY_TO)

    _check(transaction, requirements)
