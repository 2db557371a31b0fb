"""Attack: a hostile server answers ``x402-gateway pay`` with a crafted 402.

The client must sign nothing above ``--max-amount``, in another asset than the configured USDC
mint, or with its own key as the fee payer, nor anything malformed (amounts, addresses, timeouts);
each refusal is one clear line and exit 1, never a traceback, the hostile server never receives a
payment header and the wallet's USDC does not move. A redirect, before or after paying or signing
in, is never followed: the origin it names (a second loopback server) never sees the payment or
the sign-in. Against the real
gateway (internal facilitator, LiteSVM): an unfunded wallet is told what it holds and what is
needed before anything is signed, and a payment whose answer is lost to a dropped connection is
resent with the same payment-identifier and answered once, paid once. A server answering 429
forever gets one request a second, and only until the command's bound is spent.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from solders.keypair import Keypair
from solders.pubkey import Pubkey

import client.pay as payclient
from client.pay import run_pay
from gateway.x402.headers import encode_header
from gateway.x402.types import SOLANA_MAINNET
from tests.support.gateway_process import clean_env, command
from tests.support.paid_fixtures import (
    GET_BALANCE,
    GET_BALANCE_PRICE_INTERNAL,
    StartPaidGateway,
    balance_body,
)
from tests.support.solana_rpc_server import LiteSvmRpcServer, UsdcChain, set_mint, set_token_account
from tests.support.upstream import Upstream

ATTACKER = Keypair()


@dataclass
class Outcome:
    code: int
    out: str
    err: str


async def pay_cli(url: str, key_file: Path, rpc: LiteSvmRpcServer, *args: str, **options: Any) -> Outcome:
    out, err = io.StringIO(), io.StringIO()
    code = await run_pay(
        "POST",
        url,
        keypair_file=str(key_file),
        data=json.dumps(balance_body()),
        rpc_url=rpc.url,
        out=out,
        err=err,
        **options,
    )
    return Outcome(code, out.getvalue(), err.getvalue())


@pytest.fixture
def key_file(tmp_path: Path, usdc_chain: UsdcChain) -> Path:
    path = tmp_path / "payer.json"
    path.write_text(json.dumps(list(bytes(usdc_chain.payer))))
    return path


def hostile_accept(chain: UsdcChain, **changes: Any) -> dict[str, Any]:
    accept: dict[str, Any] = {
        "scheme": "exact",
        "network": SOLANA_MAINNET,
        "amount": "1000",
        "asset": str(chain.mint),
        "payTo": str(ATTACKER.pubkey()),
        "maxTimeoutSeconds": 60,
        "extra": {"feePayer": str(ATTACKER.pubkey())},
    }
    accept.update(changes)
    return accept


@pytest_asyncio.fixture(loop_scope="session")
async def hostile() -> AsyncIterator[Upstream]:
    """A server answering every request with the 402 in ``hostile.challenge``; it records calls."""
    server = Upstream()

    async def answer(request: web.Request, body: bytes) -> web.StreamResponse:
        required = server.challenge  # type: ignore[attr-defined]
        return web.json_response(required, status=402, headers={"PAYMENT-REQUIRED": encode_header(required)})

    server.responder = answer
    await server.start()
    yield server
    await server.stop()


def _payment_headers(server: Upstream) -> list[str]:
    return [
        name
        for call in server.calls
        for name in call.headers
        if name.lower() in ("payment-signature", "x-payment")
    ]


@pytest.mark.parametrize(
    ("changes", "code_word", "message"),
    [
        ({"amount": "500000000"}, "amount", "asks 500.00 USDC, more than --max-amount 0.10 USDC"),
        (
            {"extra": {"feePayer": "PAYER"}},
            "fee payer",
            "names this wallet",
        ),
        ({"asset": "OTHER_MINT"}, "asset", "not the USDC mint"),
    ],
)
async def test_hostile_challenges_are_refused_before_anything_is_signed(
    hostile: Upstream,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    key_file: Path,
    changes: dict[str, Any],
    code_word: str,
    message: str,
) -> None:
    payer = str(usdc_chain.payer.pubkey())
    other_mint = Pubkey.new_unique()
    set_mint(usdc_chain.svm, other_mint)  # a real mint the wallet holds plenty of
    other_ata = set_token_account(usdc_chain.svm, usdc_chain.payer.pubkey(), other_mint, 10**12)
    if changes.get("extra") == {"feePayer": "PAYER"}:
        changes = {"extra": {"feePayer": payer}}
    if changes.get("asset") == "OTHER_MINT":
        changes = {"asset": str(other_mint)}
    hostile.challenge = {  # type: ignore[attr-defined]
        "x402Version": 2,
        "accepts": [hostile_accept(usdc_chain, **changes)],
        "resource": {"url": hostile.url + "/paid"},
    }
    before = (usdc_chain.balance(usdc_chain.payer_ata), usdc_chain.balance(other_ata))

    done = await pay_cli(hostile.url + "/paid", key_file, solana_rpc_server)

    assert done.code == 1
    assert done.out == ""
    assert len(done.err.strip().splitlines()) == 1 and "refusing to pay" in done.err
    assert message in done.err, done.err
    assert len(hostile.calls) == 1 and _payment_headers(hostile) == []
    assert (usdc_chain.balance(usdc_chain.payer_ata), usdc_chain.balance(other_ata)) == before
    assert solana_rpc_server.sent == []


async def test_json_output_names_the_refusal_for_scripts(
    hostile: Upstream, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, key_file: Path
) -> None:
    hostile.challenge = {  # type: ignore[attr-defined]
        "x402Version": 2,
        "accepts": [hostile_accept(usdc_chain, amount="100001")],
    }
    done = await pay_cli(hostile.url + "/paid", key_file, solana_rpc_server, output="json")
    assert done.code == 1 and done.err == ""
    result = json.loads(done.out)
    assert result["ok"] is False and result["error"]["code"] == "amount_above_max"
    assert _payment_headers(hostile) == []


async def test_a_challenge_under_a_raised_max_amount_is_paid_at_the_real_gateway(
    start_paid_gateway: StartPaidGateway,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    key_file: Path,
) -> None:
    paid = await start_paid_gateway(internal=True)
    url = paid.url + GET_BALANCE
    fee_payer = usdc_chain.fee_payer.pubkey()
    before = (usdc_chain.balance(usdc_chain.payer_ata), usdc_chain.balance(usdc_chain.pay_to_ata))
    sol_before = usdc_chain.lamports(fee_payer)

    refused = await pay_cli(url, key_file, solana_rpc_server, max_amount="0.001")
    assert refused.code == 1 and "asks 0.002205 USDC, more than --max-amount 0.001 USDC" in refused.err
    assert paid.upstream_calls == 0

    done = await pay_cli(url, key_file, solana_rpc_server, max_amount="0.003", output="json")
    assert done.code == 0, done.out
    result = json.loads(done.out)
    assert result["ok"] is True and result["status"] == 200
    assert result["paid"]["amount"] == str(GET_BALANCE_PRICE_INTERNAL)
    assert result["paid"]["transaction"] == solana_rpc_server.sent[-1]
    assert result["paymentId"].startswith("pay_")
    assert "result" in result["body"]
    assert paid.upstream_calls == 1
    assert usdc_chain.balance(usdc_chain.payer_ata) == before[0] - GET_BALANCE_PRICE_INTERNAL
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == before[1] + GET_BALANCE_PRICE_INTERNAL
    assert usdc_chain.lamports(fee_payer) < sol_before  # the settlement's fee, and only one
    assert len(solana_rpc_server.sent) == 1


async def test_quiet_prints_the_body_only(
    start_paid_gateway: StartPaidGateway,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    key_file: Path,
) -> None:
    paid = await start_paid_gateway(internal=True)
    loud = await pay_cli(paid.url + GET_BALANCE, key_file, solana_rpc_server)
    quiet = await pay_cli(paid.url + GET_BALANCE, key_file, solana_rpc_server, output="quiet")
    assert loud.code == quiet.code == 0
    assert f"paid 0.002205 USDC to {usdc_chain.pay_to}" in loud.err
    assert quiet.err == ""
    assert "result" in json.loads(quiet.out)
    assert paid.upstream_calls == 2
    assert len(solana_rpc_server.sent) == 2


async def test_an_unfunded_wallet_is_told_what_it_has_and_what_is_needed(
    start_paid_gateway: StartPaidGateway,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    tmp_path: Path,
) -> None:
    paid = await start_paid_gateway(internal=True)
    poor = Keypair()
    set_token_account(usdc_chain.svm, poor.pubkey(), usdc_chain.mint, 1000)
    poor_file, stranger_file = tmp_path / "poor.json", tmp_path / "stranger.json"
    poor_file.write_text(json.dumps(list(bytes(poor))))
    stranger = Keypair()
    stranger_file.write_text(json.dumps(list(bytes(stranger))))
    pay_to_before = usdc_chain.balance(usdc_chain.pay_to_ata)

    short = await pay_cli(paid.url + GET_BALANCE, poor_file, solana_rpc_server)
    empty = await pay_cli(paid.url + GET_BALANCE, stranger_file, solana_rpc_server)

    assert short.code == empty.code == 1
    assert short.err.strip() == (
        f"x402-gateway pay: insufficient USDC: wallet {poor.pubkey()} has 0.001 USDC, needs 0.002205 USDC"
    )
    assert empty.err.strip() == (
        f"x402-gateway pay: insufficient USDC: wallet {stranger.pubkey()} has 0.00 USDC, needs 0.002205 USDC"
    )
    assert paid.upstream_calls == 0 and solana_rpc_server.sent == []
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == pay_to_before


# --- a dropped connection after the payment was sent ------------------------------------------


@dataclass
class DroppingProxy:
    """TCP proxy to ``target`` that swallows the answer to the first paid request and hangs up."""

    target_port: int
    paid_headers: list[str] = field(default_factory=list)
    dropped: int = 0
    port: int = 0
    _server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        doomed = asyncio.Event()

        async def upward() -> None:
            while data := await client_r.read(65536):  # a small request arrives in one piece
                for value in re.findall(rb"(?im)^payment-signature: *([^\r\n]+)", data):
                    self.paid_headers.append(value.decode())
                    if self.dropped == 0:
                        self.dropped += 1
                        doomed.set()
                up_w.write(data)
                await up_w.drain()

        async def downward() -> None:
            while data := await up_r.read(65536):
                if doomed.is_set():
                    client_w.transport.abort()  # the answer was written by the gateway: lose it
                    return
                client_w.write(data)
                await client_w.drain()

        tasks = [asyncio.create_task(upward()), asyncio.create_task(downward())]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            task.cancel()
        for writer in (up_w, client_w):
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def test_a_dropped_answer_is_recovered_with_the_same_payment_identifier(
    start_paid_gateway: StartPaidGateway,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    key_file: Path,
) -> None:
    paid = await start_paid_gateway(internal=True)
    port = int(paid.url.rsplit(":", 1)[1])
    proxy = DroppingProxy(port)
    await proxy.start()
    before = (usdc_chain.balance(usdc_chain.payer_ata), usdc_chain.balance(usdc_chain.pay_to_ata))
    try:
        # The gateway's resource URL names its own port; the path is what it checks.
        done = await pay_cli(f"http://127.0.0.1:{proxy.port}{GET_BALANCE}", key_file, solana_rpc_server)
    finally:
        await proxy.stop()

    assert done.code == 0, done.err
    assert "result" in json.loads(done.out)
    assert proxy.dropped == 1
    assert len(proxy.paid_headers) == 2 and proxy.paid_headers[0] == proxy.paid_headers[1]
    assert paid.upstream_calls == 1
    assert len(solana_rpc_server.sent) == 1
    assert usdc_chain.balance(usdc_chain.payer_ata) == before[0] - GET_BALANCE_PRICE_INTERNAL
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == before[1] + GET_BALANCE_PRICE_INTERNAL


# --- malformed challenges ---------------------------------------------------------------------

MISSING = object()
NO_LIMIT = "100000000000000"
"""--max-amount above any u64 amount: only the challenge's own shape can refuse it."""
KEY = str(ATTACKER.pubkey())


def _assert_refused_in_one_line(done: Outcome, hostile: Upstream, rpc: LiteSvmRpcServer) -> None:
    assert done.code != 0
    assert "Traceback" not in done.err and "Traceback" not in done.out
    assert len(done.err.splitlines()) == 1 and done.err.startswith("x402-gateway pay: "), done.err
    assert len(hostile.calls) == 1 and _payment_headers(hostile) == []
    assert rpc.sent == []


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        pytest.param({"amount": "-5"}, "amount must be a whole number", id="amount-negative"),
        pytest.param({"amount": "five"}, "amount must be a whole number", id="amount-word"),
        pytest.param({"amount": "1.5"}, "amount must be a whole number", id="amount-fraction"),
        pytest.param({"amount": "1e3"}, "amount must be a whole number", id="amount-exponent"),
        pytest.param({"amount": " 1000"}, "amount must be a whole number", id="amount-padded"),
        pytest.param({"amount": "0"}, "amount must be a whole number", id="amount-zero"),
        pytest.param({"amount": str(2**64)}, "amount must be a whole number", id="amount-above-u64"),
        pytest.param({"amount": "9" * 40}, "amount must be a whole number", id="amount-huge"),
        pytest.param({"amount": 1000}, "amount must be a whole number", id="amount-a-number"),
        pytest.param({"amount": MISSING}, "amount is missing", id="amount-missing"),
        pytest.param({"payTo": "0OIl" * 11}, "payTo must be a Solana address", id="payTo-not-base58"),
        pytest.param({"payTo": "1" * 31}, "payTo must be a Solana address", id="payTo-31-bytes"),
        pytest.param({"payTo": MISSING}, "payTo is missing", id="payTo-missing"),
        pytest.param({"asset": "USDC"}, "asset must be a Solana address", id="asset-not-base58"),
        pytest.param({"asset": MISSING}, "asset is missing", id="asset-missing"),
        pytest.param(
            {"extra": {"feePayer": "not-a-key!"}}, "extra.feePayer must be a Solana", id="feePayer-not-base58"
        ),
        pytest.param({"extra": {"feePayer": 7}}, "extra.feePayer must be a Solana", id="feePayer-a-number"),
        pytest.param({"extra": {}}, "extra.feePayer is missing", id="feePayer-missing"),
        pytest.param({"extra": MISSING}, "extra is missing", id="extra-missing"),
        pytest.param({"extra": "x"}, "extra must be an object", id="extra-a-string"),
        pytest.param(
            {"extra": {"feePayer": KEY, "memo": "m" * 300}}, "extra.memo must be", id="memo-too-long"
        ),
        pytest.param({"maxTimeoutSeconds": -1}, "maxTimeoutSeconds must be", id="timeout-negative"),
        pytest.param({"maxTimeoutSeconds": 0}, "maxTimeoutSeconds must be", id="timeout-zero"),
        pytest.param({"maxTimeoutSeconds": 10**30}, "maxTimeoutSeconds must be", id="timeout-absurd"),
        pytest.param({"maxTimeoutSeconds": "60"}, "maxTimeoutSeconds must be", id="timeout-text"),
        pytest.param({"maxTimeoutSeconds": 1.5}, "maxTimeoutSeconds must be", id="timeout-fraction"),
        pytest.param({"maxTimeoutSeconds": MISSING}, "maxTimeoutSeconds is missing", id="timeout-missing"),
    ],
)
async def test_malformed_challenges_are_refused_in_one_line_and_nothing_is_signed(
    hostile: Upstream,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    key_file: Path,
    changes: dict[str, Any],
    rule: str,
) -> None:
    accept = hostile_accept(usdc_chain, **changes)
    hostile.challenge = {  # type: ignore[attr-defined]
        "x402Version": 2,
        "accepts": [{k: v for k, v in accept.items() if v is not MISSING}],
    }
    before = usdc_chain.balance(usdc_chain.payer_ata)

    done = await pay_cli(hostile.url + "/paid", key_file, solana_rpc_server, max_amount=NO_LIMIT)

    _assert_refused_in_one_line(done, hostile, solana_rpc_server)
    assert "refusing to pay: the challenge is malformed: " + rule in done.err, done.err
    assert usdc_chain.balance(usdc_chain.payer_ata) == before


def _raw_402(body: bytes) -> Any:
    """A responder answering 402 with ``body`` as is, and no PAYMENT-REQUIRED header."""

    async def answer(request: web.Request, _: bytes) -> web.StreamResponse:
        return web.Response(status=402, body=body, content_type="application/json")

    return answer


DEEP = 200_000
"""Nesting deeper than any JSON decoder recurses."""


@pytest.mark.parametrize(
    ("body", "said"),
    [
        pytest.param(
            json.dumps({"x402Version": 2, "accepts": [], "error": "one\ntwo\x1b[2J\u202e"}).encode(),
            "402 (one?two?[2J?): no exact Solana payment",
            id="error-with-control-characters",
        ),
        pytest.param(b'{"x402Version": 2, "accepts": {}}', "without a readable", id="accepts-not-a-list"),
        pytest.param(b'{"x402Version": 1e400, "accepts": []}', "without a readable", id="version-absurd"),
        pytest.param(
            b'{"x402Version":2,"accepts":[],"extensions":{"x":' + b"[" * DEEP + b"]" * DEEP + b"}}",
            "without a readable",
            id="nested-too-deep",
        ),
        pytest.param(b"<html>pay me</html>", "without a readable", id="not-json"),
    ],
)
async def test_unreadable_challenges_give_one_line(
    hostile: Upstream, solana_rpc_server: LiteSvmRpcServer, key_file: Path, body: bytes, said: str
) -> None:
    hostile.responder = _raw_402(body)

    done = await pay_cli(hostile.url + "/paid", key_file, solana_rpc_server)

    _assert_refused_in_one_line(done, hostile, solana_rpc_server)
    assert said in done.err, done.err


async def test_the_console_script_refuses_a_negative_amount_without_a_traceback(
    hostile: Upstream, usdc_chain: UsdcChain, solana_rpc_server: LiteSvmRpcServer, key_file: Path
) -> None:
    """The reported crash, as a user meets it: the installed ``x402-gateway pay`` on a 402 of -5."""
    hostile.challenge = {"x402Version": 2, "accepts": [hostile_accept(usdc_chain, amount="-5")]}  # type: ignore[attr-defined]
    args = ["pay", "POST", hostile.url + "/paid", "--keypair", str(key_file), "--rpc", solana_rpc_server.url]
    process = await asyncio.create_subprocess_exec(
        *command(),
        *args,
        "--data",
        json.dumps(balance_body()),
        env=clean_env({}),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=60)
    done = Outcome(process.returncode or 0, out.decode(), err.decode())

    _assert_refused_in_one_line(done, hostile, solana_rpc_server)
    assert "amount must be a whole number of base units" in done.err, done.err


# --- redirects --------------------------------------------------------------------------------

SECRET_HEADERS = ("payment-signature", "x-payment", "sign-in-with-x")


@pytest_asyncio.fixture(loop_scope="session")
async def elsewhere() -> AsyncIterator[Upstream]:
    """Another loopback origin (its own port) that a redirect points to; it records every call."""
    server = Upstream()
    await server.start()
    yield server
    await server.stop()


def _secret_headers(server: Upstream) -> list[str]:
    return [name for call in server.calls for name in call.headers if name.lower() in SECRET_HEADERS]


def _siwx_challenge(url: str) -> dict[str, Any]:
    """A sign-in-with-x extension bound to ``url``'s origin, so the client agrees to sign it."""
    netloc = url.split("://", 1)[1].split("/", 1)[0]
    return {
        "info": {
            "domain": netloc,
            "uri": url,
            "version": "1",
            "nonce": "n0nce0123456789",
            "issuedAt": "2025-01-01T00:00:00.000Z",
        },
        "supportedChains": [{"chainId": SOLANA_MAINNET, "type": "ed25519"}],
    }


@pytest.mark.parametrize(
    ("status", "credential", "version", "said"),
    [
        pytest.param(307, "payment-signature", 2, "the payment went to", id="307-after-paying"),
        pytest.param(308, "payment-signature", 2, "the payment went to", id="308-after-paying"),
        pytest.param(302, "x-payment", 1, "the payment went to", id="302-after-paying-v1"),
        pytest.param(303, "payment-signature", 2, "the payment went to", id="303-after-paying"),
        pytest.param(307, "sign-in-with-x", 2, "the sign-in went to", id="307-after-signing-in"),
    ],
)
async def test_a_redirect_of_the_paid_request_never_carries_it_to_another_origin(
    hostile: Upstream,
    elsewhere: Upstream,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    key_file: Path,
    status: int,
    credential: str,
    version: int,
    said: str,
) -> None:
    url = hostile.url + "/paid"
    target = elsewhere.url + "/collect"
    if credential == "sign-in-with-x":
        challenge: dict[str, Any] = {"x402Version": 2, "accepts": [], "extensions": {}}
        challenge["extensions"]["sign-in-with-x"] = _siwx_challenge(url)
    else:
        challenge = {"x402Version": version, "accepts": [hostile_accept(usdc_chain)]}

    async def answer(request: web.Request, _: bytes) -> web.StreamResponse:
        if credential in {name.lower() for name in request.headers}:
            return web.Response(status=status, headers={"Location": target})
        required = {"PAYMENT-REQUIRED": encode_header(challenge)}
        return web.json_response(challenge, status=402, headers=required)

    hostile.responder = answer
    before = usdc_chain.balance(usdc_chain.payer_ata)

    done = await pay_cli(url, key_file, solana_rpc_server)

    assert elsewhere.calls == [] and _secret_headers(elsewhere) == []
    assert [credential in {n.lower() for n in call.headers} for call in hostile.calls] == [False, True]
    assert done.code != 0 and "Traceback" not in done.err
    *narrated, line = done.err.splitlines()
    assert line == (
        f"x402-gateway pay: HTTP {status}: redirect to {target} (another origin) not followed: "
        f"{said} {hostile.url} only, never to where it points"
    )
    signed_in = credential == "sign-in-with-x"
    assert narrated == ([f"signed in as {usdc_chain.payer.pubkey()}"] if signed_in else [])
    assert usdc_chain.balance(usdc_chain.payer_ata) == before and solana_rpc_server.sent == []


@pytest.mark.parametrize("same_origin", [False, True], ids=["another-origin", "same-origin"])
async def test_a_redirect_before_any_challenge_is_not_followed(
    hostile: Upstream,
    elsewhere: Upstream,
    usdc_chain: UsdcChain,
    solana_rpc_server: LiteSvmRpcServer,
    key_file: Path,
    same_origin: bool,
) -> None:
    """The challenge would come from where the redirect points: the client answers none of it."""
    challenge = {"x402Version": 2, "accepts": [hostile_accept(usdc_chain)]}
    location = "/moved" if same_origin else elsewhere.url + "/moved"

    async def answer(request: web.Request, _: bytes) -> web.StreamResponse:
        if request.path == "/moved":
            return web.json_response(challenge, status=402)
        return web.Response(status=307, headers={"Location": location})

    hostile.responder = elsewhere.responder = answer

    done = await pay_cli(hostile.url + "/paid", key_file, solana_rpc_server, output="json")
    text = await pay_cli(hostile.url + "/paid", key_file, solana_rpc_server)

    assert elsewhere.calls == [] and [call.path for call in hostile.calls] == ["/paid", "/paid"]
    assert _secret_headers(hostile) == []
    assert done.code != 0 and text.code != 0 and "Traceback" not in text.err
    target = (hostile.url if same_origin else elsewhere.url) + "/moved"
    kind = "same origin" if same_origin else "another origin"
    reason = (
        f"HTTP 307: redirect to {target} ({kind}) not followed: pay answers challenges only from the URL "
        "it was given; call that URL if you trust it"
    )
    assert json.loads(done.out)["error"] == reason
    assert text.err.splitlines() == [f"x402-gateway pay: {reason}"]
    assert solana_rpc_server.sent == []


# --- rate limits ------------------------------------------------------------------------------------


@pytest.mark.slow  # seconds each: the waits it checks are a second long
@pytest.mark.parametrize("retry_after", ["0", "", "Thu, 01 Jan 1970 00:00:00 GMT"])
async def test_a_server_answering_429_forever_gets_one_request_a_second_until_the_bound(
    solana_rpc_server: LiteSvmRpcServer, retry_after: str
) -> None:
    """``Retry-After: 0`` (or none, or a date long past) cannot turn the waits into a flood: each
    wait is at least a second, and they stop once the command's bound is spent."""
    server = Upstream()

    async def answer(request: web.Request, body: bytes) -> web.StreamResponse:
        headers = {"Retry-After": retry_after} if retry_after else {}
        return web.json_response({"error": "slow down"}, status=429, headers=headers)

    server.responder = answer
    await server.start()
    err = io.StringIO()
    loop = asyncio.get_running_loop()
    try:
        unbound = await payclient.pay("GET", server.url + "/a", ATTACKER, rpc_url=solana_rpc_server.url)
        started = loop.time()
        with payclient.waiting_out_rate_limits(True, err):
            waits = payclient.RATE_LIMIT_WAITS.get()
            assert waits is not None
            waits.left_s = 2.0  # the command's bound (60 s), shortened for the test
            bound = await payclient.pay("GET", server.url + "/b", ATTACKER, rpc_url=solana_rpc_server.url)
        elapsed = loop.time() - started
    finally:
        await server.stop()

    assert unbound.status == 429 and [c.path for c in server.calls].count("/a") == 1  # no waits asked
    assert bound.status == 429 and [c.path for c in server.calls].count("/b") == 3  # at once, then 2 s
    assert 2 <= elapsed < 10
    waited = "HTTP 429 (rate limited): waiting 1 s as Retry-After asks, then sending again "
    waited += "(--no-wait stops at once)"
    assert err.getvalue().splitlines() == [waited] * 2
