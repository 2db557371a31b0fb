"""End to end: ``x402-gateway sandbox`` in a subprocess, paid with ``x402-gateway pay`` subprocesses.

The demo wallet pays for one RPC call and one DAS call (exact, settled on the local chain) and
signs in for one asset-data call; USDC moves from the wallet to payTo by exactly the prices the
402 challenges advertised, and nothing for the sign-in.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from solders.token.associated import get_associated_token_address

from gateway.payclient import usdc_text
from gateway.x402.types import USDC_MAINNET_MINT
from tests.support.gateway_process import clean_env, command, kill_group
from tests.support.gateway_server import free_port

READY_LINE = "Ctrl-C stops it."
STARTUP_TIMEOUT_S = 10.0


@dataclass
class Sandbox:
    process: subprocess.Popen[bytes]
    url: str
    rpc_url: str
    wallet: str
    pay_to: str
    key_file: Path
    stdout: IO[bytes]
    stderr: IO[bytes]


def _read(stream: IO[bytes]) -> str:
    stream.flush()
    stream.seek(0)
    return stream.read().decode("utf-8", errors="replace")


def _banner_value(text: str, label: str) -> str:
    match = re.search(rf"^\s*{re.escape(label)}:\s+(\S+)", text, re.MULTILINE)
    assert match, f"banner has no {label!r}:\n{text}"
    return match.group(1)


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except (urllib.error.URLError, OSError):
        return 0


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    port = free_port()
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        process = subprocess.Popen(
            [*command(), "sandbox", "--port", str(port)],
            env=clean_env({}),
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + STARTUP_TIMEOUT_S
            while READY_LINE not in _read(stdout) or _get(url + "/healthz") != 200:
                if process.poll() is not None:
                    raise RuntimeError(f"sandbox exited with {process.returncode}:\n{_read(stderr)}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"sandbox not ready in {STARTUP_TIMEOUT_S} s:\n{_read(stderr)}")
                time.sleep(0.05)
            text = _read(stdout)
            yield Sandbox(
                process=process,
                url=url,
                rpc_url=_banner_value(text, "local chain"),
                wallet=_banner_value(text, "demo wallet"),
                pay_to=_banner_value(text, "payTo"),
                key_file=Path(_banner_value(text, "demo key file")),
                stdout=stdout,
                stderr=stderr,
            )
        finally:
            kill_group(process, grace_s=5)  # SIGTERM first: the sandbox removes its key file


def _rpc(url: str, method: str, params: list[Any]) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read())["result"]


def _usdc(sandbox: Sandbox, owner: str) -> int:
    ata = get_associated_token_address(Pubkey.from_string(owner), Pubkey.from_string(USDC_MAINNET_MINT))
    return int(_rpc(sandbox.rpc_url, "getTokenAccountBalance", [str(ata)])["value"]["amount"])


def _advertised_price(url: str, method: str, data: str | None) -> int:
    """The amount of the 402 an unpaid request gets (0 for sign-in routes: nothing in accepts)."""
    request = urllib.request.Request(
        url,
        data=data.encode() if data else None,
        method=method,
        headers={"content-type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 402
    challenge = json.loads(refused.value.read())
    return sum(int(a["amount"]) for a in challenge.get("accepts", []) if a.get("scheme") == "exact")


def _pay(
    sandbox: Sandbox, method: str, url: str, data: str | None, key_file: Path | None = None
) -> subprocess.CompletedProcess[str]:
    key = str(key_file or sandbox.key_file)
    args = [*command(), "pay", method, url, "--keypair", key, "--rpc", sandbox.rpc_url]
    if data is not None:
        args += ["--data", data]
    return subprocess.run(args, env=clean_env({}), capture_output=True, text=True, timeout=30, check=False)


def test_sandbox_pay_moves_exactly_the_advertised_prices(sandbox: Sandbox) -> None:
    base = sandbox.url
    calls: list[tuple[str, str, str | None, str]] = [
        (
            "POST",
            f"{base}/v1/x402/solana/mainnet/provider_a/rpc/getBalance",
            json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [sandbox.wallet]}),
            "value",
        ),
        (
            "POST",
            f"{base}/v1/x402/solana/mainnet/provider_a/das/getAsset",
            json.dumps(
                {"jsonrpc": "2.0", "id": 1, "method": "getAsset", "params": [{"id": USDC_MAINNET_MINT}]}
            ),
            "sandbox",
        ),
        ("GET", f"{base}/v1/x402/tokens/assets/search?q=sol", None, "sandbox"),
    ]
    prices = [_advertised_price(url, method, data) for method, url, data, _ in calls]
    assert prices[0] > 0 and prices[1] > 0 and prices[2] == 0
    wallet_before, pay_to_before = _usdc(sandbox, sandbox.wallet), _usdc(sandbox, sandbox.pay_to)

    for (method, url, data, expected), price in zip(calls, prices, strict=True):
        done = _pay(sandbox, method, url, data)
        assert done.returncode == 0, f"{url}: {done.stderr}"
        body = json.loads(done.stdout)
        assert expected in json.dumps(body)
        if "/x402/solana/" in url:
            assert "PAYMENT-RESPONSE:" in done.stderr and '"success":true' in done.stderr
            assert f"paid {usdc_text(price)} to {sandbox.pay_to}" in done.stderr
        else:
            assert f"signed in as {sandbox.wallet}" in done.stderr

    spent = sum(prices)
    assert _usdc(sandbox, sandbox.wallet) == wallet_before - spent
    assert _usdc(sandbox, sandbox.pay_to) == pay_to_before + spent

    sandbox.process.send_signal(signal.SIGTERM)
    assert sandbox.process.wait(timeout=10) == 0
    assert not sandbox.key_file.exists()


def test_pay_exits_non_zero_with_one_line_reason_when_the_wallet_holds_no_usdc(
    sandbox: Sandbox, tmp_path: Path
) -> None:
    stranger = tmp_path / "stranger.json"
    stranger_key = Keypair()
    stranger.write_text(json.dumps(list(bytes(stranger_key))))
    wallet_before = _usdc(sandbox, sandbox.wallet)
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [sandbox.wallet]})
    done = _pay(
        sandbox, "POST", f"{sandbox.url}/v1/x402/solana/mainnet/provider_a/rpc/getBalance", body, stranger
    )
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        f"x402-gateway pay: insufficient USDC: wallet {stranger_key.pubkey()} has 0.00 USDC, "
        "needs 0.001005 USDC"
    ]
    assert _usdc(sandbox, sandbox.wallet) == wallet_before
