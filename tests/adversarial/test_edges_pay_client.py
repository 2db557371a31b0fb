"""Attack: a hostile server answers ``x402-gateway pay`` with a crafted 402.

The client must sign nothing above ``--max-amount``, in another asset than the configured USDC
mint, or with its own key as the fee payer; each refusal is one clear line and exit 1, the hostile
server never receives a payment header and the wallet's USDC does not move. Against the real
gateway (internal facilitator, LiteSVM): an unfunded wallet is told what it holds and what is
needed before anything is signed, and a payment whose answer is lost to a dropped connection is
resent with the same payment-identifier and answered once, paid once.
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

from gateway.payclient import run_pay
from gateway.x402.headers import encode_header
from gateway.x402.types import SOLANA_MAINNET
from tests.support.paid_fixtures import GET_BALANCE, GET_BALANCE_PRICE, StartPaidGateway, balance_body
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
    assert result["paid"]["amount"] == str(GET_BALANCE_PRICE)
    assert result["paid"]["transaction"] == solana_rpc_server.sent[-1]
    assert result["paymentId"].startswith("pay_")
    assert "result" in result["body"]
    assert paid.upstream_calls == 1
    assert usdc_chain.balance(usdc_chain.payer_ata) == before[0] - GET_BALANCE_PRICE
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == before[1] + GET_BALANCE_PRICE
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
    assert usdc_chain.balance(usdc_chain.payer_ata) == before[0] - GET_BALANCE_PRICE
    assert usdc_chain.balance(usdc_chain.pay_to_ata) == before[1] + GET_BALANCE_PRICE
