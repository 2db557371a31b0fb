"""@solana/kit's RPC client uses the gateway's JSON-RPC endpoint as its RPC URL, paying through
@x402/fetch: ``tests/js/kit_rpc_endpoint.mjs`` builds ``createSolanaRpcFromTransport`` on a
transport that posts through ``wrapFetchWithPayment`` (exact SVM scheme, sign-in-with-x hook) and
calls ``getBalance`` and ``getAccountInfo``, one request each, then both in one tick, which the
transport sends as one JSON-RPC batch (kit has no batch API of its own). Against a real sandbox:

* exact: each request is settled once, the wallet's USDC falls and payTo's rises by exactly the
  sum of the three 402 prices (two single calls and the batch);
* credit: after a 1 USDC top-up (the only USDC that moves) and a credit session, whose token the
  transport adds in ``X-CREDIT-SESSION``, ``X-Credit-Balance`` falls by each call's credit price;
  kit's own transport (``createSolanaRpc(url, {headers})``) spends the session too, and the
  session, ended, says it spent exactly all that.

Skipped unless ``X402_JS_SDK_DIR`` names a directory where ``npm install @x402/fetch @x402/svm
@x402/extensions @solana/kit`` ran, and ``node`` is on PATH (CI has neither); with node alone, the
script is only checked to parse.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from solders.pubkey import Pubkey
from solders.token.associated import get_associated_token_address

from gateway.x402.types import USDC_MAINNET_MINT as USDC
from tests.support.gateway_process import clean_env
from tests.support.sandbox_process import Sandbox, run_sandbox

JS_SDK = os.environ.get("X402_JS_SDK_DIR", "")
SCRIPT = Path(__file__).resolve().parent / "js" / "kit_rpc_endpoint.mjs"
RPC = "/v1/x402/solana/mainnet/provider_a/rpc"
TOKEN_PROGRAM = "TokenkegQfeZyiNwAJbNbGKPFXCWuBvf9Ss623VQ5DA"
TOP_UP_USDC = 1_000_000
SDK_READY = bool(shutil.which("node") and JS_SDK and Path(JS_SDK, "node_modules/@x402/extensions").is_dir())
METHODS = ["getBalance", "getAccountInfo"]
"""What the script sends: each alone, then both as one batch."""

needs_sdk = pytest.mark.skipif(
    not SDK_READY,
    reason="set X402_JS_SDK_DIR to a directory where `npm install @x402/fetch @x402/svm @x402/extensions "
    "@solana/kit` ran",
)


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_kit_script_is_a_valid_module() -> None:
    checked = subprocess.run(
        [str(shutil.which("node")), "--check", str(SCRIPT)], capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stderr


@pytest.fixture(scope="module")
def sandbox() -> Iterator[Sandbox]:
    with run_sandbox() as running:
        yield running


def _post(url: str, body: Any) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read())


def _chain(sandbox: Sandbox, method: str, params: list[Any]) -> Any:
    return _post(sandbox.rpc_url, {"jsonrpc": "2.0", "id": 1, "method": method, "params": params})["result"]


def _usdc(sandbox: Sandbox) -> tuple[int, int]:
    """The demo wallet's and payTo's USDC on the sandbox chain."""
    owned = []
    for owner in (sandbox.wallet, sandbox.pay_to):
        ata = get_associated_token_address(Pubkey.from_string(owner), Pubkey.from_string(USDC))
        owned.append(int(_chain(sandbox, "getTokenAccountBalance", [str(ata)])["value"]["amount"]))
    return owned[0], owned[1]


def _exact_price(sandbox: Sandbox, methods: list[str]) -> int:
    """The endpoint's 402 price for one call of each of ``methods`` (a batch when several)."""
    account = sandbox.usdc_account
    calls = [{"jsonrpc": "2.0", "id": i, "method": m, "params": [account]} for i, m in enumerate(methods)]
    with pytest.raises(urllib.error.HTTPError) as refused:
        _post(sandbox.url + RPC, calls if len(calls) > 1 else calls[0])
    assert refused.value.code == 402
    return int(json.loads(refused.value.read())["accepts"][0]["amount"])


def _credit_prices(sandbox: Sandbox) -> dict[str, int]:
    with urllib.request.urlopen(sandbox.url + "/v1/catalog", timeout=5) as resp:
        [endpoint] = [e for e in json.loads(resp.read())["endpoints"] if e["path"] == RPC]
    return {m: int(endpoint["methods"][m]["creditPrice"]["microUsdc"]) for m in METHODS}


def _run_kit(sandbox: Sandbox, mode: str) -> dict[str, Any]:
    script = Path(JS_SDK) / SCRIPT.name  # resolves its imports there
    shutil.copyfile(SCRIPT, script)
    done = subprocess.run(
        [str(shutil.which("node")), str(script), mode, sandbox.usdc_account],
        env=clean_env(sandbox.exports),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return out


def _assert_chain_answers(sandbox: Sandbox, out: dict[str, Any]) -> None:
    """Kit decoded the chain's own answers, alone and from the batch."""
    lamports = str(_chain(sandbox, "getBalance", [sandbox.usdc_account])["value"])
    assert int(lamports) > 0
    assert out["balance"] == out["lamports"] == lamports
    assert out["balanceType"] == "bigint"  # kit's Lamports, not a float
    assert out["owner"] == TOKEN_PROGRAM
    assert out["batch"] == [lamports, TOKEN_PROGRAM]


@pytest.mark.slow
@needs_sdk
def test_kit_pays_each_request_exactly_once_a_batch_included(sandbox: Sandbox) -> None:
    prices = [_exact_price(sandbox, [m]) for m in METHODS] + [_exact_price(sandbox, METHODS)]
    before = _usdc(sandbox)

    out = _run_kit(sandbox, "exact")

    after = _usdc(sandbox)
    _assert_chain_answers(sandbox, out)
    assert out["plain"] is None
    assert out["requests"] == [
        {"methods": ["getBalance"], "status": 200, "settled": True, "creditBalance": None},
        {"methods": ["getAccountInfo"], "status": 200, "settled": True, "creditBalance": None},
        {"methods": METHODS, "status": 200, "settled": True, "creditBalance": None},
    ]
    # The batch costs one settlement fee, not two.
    assert prices[2] < prices[0] + prices[1]
    assert after == (before[0] - sum(prices), before[1] + sum(prices))


@pytest.mark.slow
@needs_sdk
def test_kit_spends_a_credit_session_through_its_transport(sandbox: Sandbox) -> None:
    credit = _credit_prices(sandbox)
    before = _usdc(sandbox)

    out = _run_kit(sandbox, "credit")

    after = _usdc(sandbox)
    _assert_chain_answers(sandbox, out)
    bought, *calls, revoked = out["requests"]
    assert bought == {"topUp": 200, "bought": str(TOP_UP_USDC), "session": 200}
    left = [
        TOP_UP_USDC - credit["getBalance"],
        TOP_UP_USDC - credit["getBalance"] - credit["getAccountInfo"],
        TOP_UP_USDC - 2 * credit["getBalance"] - 2 * credit["getAccountInfo"],
    ]
    assert calls == [
        {"methods": ["getBalance"], "status": 200, "settled": None, "creditBalance": str(left[0])},
        {"methods": ["getAccountInfo"], "status": 200, "settled": None, "creditBalance": str(left[1])},
        {"methods": METHODS, "status": 200, "settled": None, "creditBalance": str(left[2])},
    ]
    # Kit's own transport, createSolanaRpc with the header, called on the session too.
    assert out["plain"] == out["balance"]
    # The calls were the session's (a sign-in per call would have spent the same credit).
    spent = TOP_UP_USDC - left[2] + credit["getBalance"]
    assert revoked == {"revoked": 200, "spent": str(spent)}
    # Only the top-up moved USDC: no call was paid per request.
    assert after == (before[0] - TOP_UP_USDC, before[1] + TOP_UP_USDC)
