"""End to end: ``x402-gateway sandbox`` in a subprocess, paid with ``x402-gateway pay`` subprocesses.

The demo wallet pays for one RPC call and one DAS call (exact, settled on the local chain) and
signs in for one asset-data call; USDC moves from the wallet to payTo by exactly the prices the
402 challenges advertised, and nothing for the sign-in.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from solders.keypair import Keypair
from solders.pubkey import Pubkey
from solders.token.associated import get_associated_token_address

from client.pay import usdc_text
from gateway import cli
from gateway.x402.types import USDC_MAINNET_MINT
from tests.support.gateway_process import clean_env, command, kill_group, read_output, run_cli, run_script
from tests.support.ports import free_port
from tests.support.sandbox_process import Sandbox, banner_value, run_sandbox

pytestmark = pytest.mark.slow

ROOT_URL = "http://127.0.0.1"


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    """A sandbox of the test's own: it pays from the demo wallet, or stops the sandbox. Through
    the console script, as a user starts it (the other sandboxes here are forked)."""
    with run_sandbox(script=True) as running:
        yield running


@pytest.fixture(scope="module")
def idle_sandbox() -> Iterator[Sandbox]:
    """One sandbox for the tests that move nothing on it (a payment refused before it is signed
    moves nothing): each checks balances the others leave as they were."""
    with run_sandbox() as running:
        yield running


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
    sandbox: Sandbox,
    method: str,
    url: str,
    data: str | None,
    key_file: Path | None = None,
    run: Callable[..., subprocess.CompletedProcess[str]] = run_cli,
) -> subprocess.CompletedProcess[str]:
    """``x402-gateway pay``, forked (``run_cli``), or through the console script (``run_script``)."""
    key = str(key_file or sandbox.key_file)
    args = ["pay", method, url, "--keypair", key, "--rpc", sandbox.rpc_url]
    if data is not None:
        args += ["--data", data]
    return run({}, *args)


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
        done = _pay(sandbox, method, url, data, run=run_script)  # the entry point, as pasted
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
    idle_sandbox: Sandbox, tmp_path: Path
) -> None:
    sandbox = idle_sandbox
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
        "needs 0.002205 USDC"
    ]
    assert _usdc(sandbox, sandbox.wallet) == wallet_before


def _balance(
    sandbox: Sandbox, wallet: str, *extra: str, run: Callable[..., subprocess.CompletedProcess[str]] = run_cli
) -> subprocess.CompletedProcess[str]:
    """``x402-gateway balance``, forked (``run_cli``), or through the console script (``run_script``)."""
    return run({}, "balance", wallet, "--rpc", sandbox.rpc_url, *extra)


def _run_printed(
    sandbox: Sandbox, line: list[str], run: Callable[..., subprocess.CompletedProcess[str]] = run_cli
) -> subprocess.CompletedProcess[str]:
    """One command as the banner printed it (``x402-gateway`` is the installed entry point:
    ``run_script`` runs it, ``run_cli`` forks the same command)."""
    assert line[0] == "x402-gateway"
    return run({}, *line[1:])


def test_state_dir_keeps_the_wallet_balances_and_ports_so_printed_commands_work_after_a_restart(
    tmp_path: Path,
) -> None:
    state = tmp_path / "sandbox-state"
    port, chain_port, assets_port = free_port(), free_port(), free_port()
    args = ("--state-dir", str(state), "--chain-port", str(chain_port), "--assets-port", str(assets_port))
    rpc_url = f"{ROOT_URL}:{chain_port}"
    url = f"{ROOT_URL}:{port}/v1/x402/solana/mainnet/provider_a/rpc/getBalance"

    with run_sandbox(*args, port=port) as first:
        assert first.url == f"{ROOT_URL}:{port}"
        assert first.rpc_url == rpc_url
        assert f"sample asset-data API: {ROOT_URL}:{assets_port}" in first.banner
        assert f"x402-gateway balance {first.wallet} --rpc {rpc_url}" in first.banner
        assert first.usdc_account == str(
            get_associated_token_address(
                Pubkey.from_string(first.wallet), Pubkey.from_string(USDC_MAINNET_MINT)
            )
        )
        data = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [first.wallet]})
        price = _advertised_price(url, "POST", data)
        start = _usdc(first, first.wallet)
        assert _pay(first, "POST", url, data).returncode == 0
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(timeout=10) == 0
    for kept in ("demo-payer.json", "sandbox-state.json", "sandbox-config.json"):
        assert (state / kept).stat().st_mode & 0o077 == 0, kept

    # No port given this time: the state directory kept every one the first banner printed.
    with run_sandbox("--state-dir", str(state), port=port, port_flag=False) as second:
        assert (second.wallet, second.pay_to, second.key_file) == (first.wallet, first.pay_to, first.key_file)
        assert second.rpc_url == rpc_url and second.commands == first.commands
        assert second.exports == first.exports
        assert "moved from port" not in second.banner
        assert _usdc(second, second.wallet) == start - price
        assert _usdc(second, second.pay_to) == price
        # Every command the first run printed works again, pasted as it was: the balance, two
        # payments and a sign-in, then a top-up, a call on the credit it bought, and its balance.
        assert [line[1] for line in first.commands] == ["balance", *["pay"] * 5, "credits"]
        outputs = []
        for line in first.commands:
            done = _run_printed(second, line)
            assert done.returncode == 0, f"{shlex.join(line)}: {done.stderr}"
            outputs.append(done)
        assert (
            f"USDC:           {usdc_text(start - price)}  (token account {second.usdc_account})"
            in outputs[0].stdout
        )
        assert all(f" USDC to {second.pay_to}" in done.stderr for done in outputs[1:3])
        assert f"signed in as {second.wallet}" in outputs[3].stderr
        assert f"paid 1.00 USDC to {second.pay_to}" in outputs[4].stderr
        assert "paid from prepaid credit, no transaction: 0.999995 USDC" in outputs[5].stderr
        assert "credit:         0.999995 USDC" in outputs[6].stdout.splitlines()
        scripted = json.loads(_balance(second, second.pay_to, "--json").stdout)
        assert scripted["usdc"] == start - _usdc(second, second.wallet) and scripted["lamports"] == 0


def test_credit_bought_in_the_sandbox_is_spent_without_a_transaction_and_kept_across_a_restart(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    with run_sandbox("--state-dir", str(state)) as first:
        top_up, on_credit, balance = first.credit_commands
        assert top_up[:4] == ["x402-gateway", "pay", "--top-up", "1"] and top_up[4] == first.url
        assert on_credit == first.commands[1]  # the banner's first paid call, now on credit
        assert balance == ["x402-gateway", "credits", first.url, "--keypair", str(first.key_file)]
        start = _usdc(first, first.wallet)

        bought = _run_printed(first, top_up, run_script)
        spent = _run_printed(first, on_credit)
        after = (_usdc(first, first.wallet), _usdc(first, first.pay_to))
        first.process.send_signal(signal.SIGTERM)
        assert first.process.wait(timeout=10) == 0

    assert bought.returncode == 0, bought.stderr
    assert f"paid 1.00 USDC to {first.pay_to}" in bought.stderr
    assert spent.returncode == 0, spent.stderr
    assert spent.stderr.splitlines() == [
        f"signed in as {first.wallet}, credit session opened",
        "paid from prepaid credit, no transaction: 0.999995 USDC of credit left (X-Credit-Balance: 999995)",
    ]
    assert after == (start - 1_000_000, 1_000_000)  # the top-up only: the call moved no USDC
    assert (state / "sandbox-credit.json").stat().st_mode & 0o077 == 0

    port = int(first.url.rsplit(":", 1)[1])
    with run_sandbox("--state-dir", str(state), port=port, port_flag=False) as second:
        shown = _run_printed(second, balance)
        again = _run_printed(second, on_credit)
        assert (_usdc(second, second.wallet), _usdc(second, second.pay_to)) == after

    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[:2] == [
        f"wallet:         {first.wallet}",
        "credit:         0.999995 USDC",
    ]
    assert again.returncode == 0, again.stderr
    assert "0.99999 USDC of credit left (X-Credit-Balance: 999990)" in again.stderr


def test_a_kept_port_that_is_taken_fails_the_restart_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    state = tmp_path / "state"
    with run_sandbox("--state-dir", str(state)) as first:
        chain_port = int(first.rpc_url.rsplit(":", 1)[1])
    # Stopped: --print-env still prints, and says the chain must be running for it to work.
    assert cli.main(["sandbox", "--print-env", "--state-dir", str(state)]) == 0
    printed = capsys.readouterr()
    assert f"SOLANA_MAINNET_RPC_URL={first.rpc_url}" in printed.out.splitlines()
    assert f"nothing answers at {first.rpc_url}" in printed.err

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", chain_port))
        squatter.listen()
        done = run_cli({}, "sandbox", "--port", str(free_port()), "--state-dir", str(state))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"sandbox: cannot listen on 127.0.0.1:{chain_port}: Address already in use (the local chain's "
        f"port, kept in {state} so that printed commands keep working; stop what listens there, or "
        "pass --chain-port to move it)"
    ]


def test_print_env_needs_the_state_dir_of_a_sandbox(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for extra, reason in [
        ((), "--print-env needs --state-dir DIR"),
        (("--state-dir", str(tmp_path)), f"{tmp_path} holds no sandbox"),
        (("--state-dir", str(tmp_path), "--chain-port", "9"), "drop --chain-port"),
    ]:
        assert cli.main(["sandbox", "--print-env", *extra]) == 1
        done = capsys.readouterr()
        assert done.out == ""
        [line] = done.err.splitlines()
        assert reason in line


def _printed_env(text: str) -> dict[str, str]:
    pairs = {}
    for line in text.splitlines():
        [word] = shlex.split(line)  # one shell word per line: KEY=value, quoted
        key, _, value = word.partition("=")
        pairs[key] = value
    return pairs


def test_print_env_configures_check_and_a_serve_that_sells_on_the_sandbox_chain(tmp_path: Path) -> None:
    # In a container the state directory is a mount; here the host's path is a symlink to it.
    inside, host_side = tmp_path / "inside", tmp_path / "host-side"
    inside.mkdir()
    host_side.symlink_to(inside)
    with run_sandbox("--state-dir", str(inside), env={"SANDBOX_HOST_STATE_DIR": str(host_side)}) as sandbox:
        assert sandbox.key_file == host_side / "demo-payer.json"
        assert banner_value(sandbox.banner, "state") == str(host_side)
        exports = sandbox.exports
        assert exports == {
            "X402_KEYPAIR": str(host_side / "demo-payer.json"),
            "SOLANA_RPC_URL": sandbox.rpc_url,
            "GATEWAY": sandbox.url,
        }
        assert f"--print-env --state-dir {host_side}" in sandbox.banner

        serve_port = free_port()
        printed = run_cli(
            {}, "sandbox", "--print-env", "--state-dir", str(host_side), "--port", str(serve_port)
        )
        assert printed.returncode == 0 and printed.stderr == "", printed.stderr
        env = _printed_env(printed.stdout)
        assert env["FACILITATOR_URL"] == "internal" and env["FACILITATOR_WALLET_BASE58"]
        assert env["X402_PAY_TO_WALLET"] == sandbox.pay_to
        assert env["PORT"] == str(serve_port)

        checked = run_cli(env, "check")
        assert checked.returncode == 0, checked.stderr
        assert "facilitator:  internal" in checked.stdout and env["ASSET_API_KEY"] not in checked.stdout

        with _serving(env, serve_port) as url:
            body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [sandbox.wallet]})
            before = _usdc(sandbox, sandbox.pay_to)
            # pay reads the chain's URL from the exported SOLANA_RPC_URL.
            client_env = {"SOLANA_RPC_URL": exports["SOLANA_RPC_URL"]}
            keypair = ("--keypair", exports["X402_KEYPAIR"])
            paid = run_cli(
                client_env,
                "pay",
                "POST",
                f"{url}/v1/x402/solana/mainnet/provider_a/rpc/getBalance",
                "--data",
                body,
                *keypair,
            )
            assert paid.returncode == 0, paid.stderr
            assert f"paid 0.002205 USDC to {sandbox.pay_to}" in paid.stderr
            signed_in = run_cli(
                client_env, "pay", "GET", f"{url}/v1/x402/tokens/assets/search?q=sol", *keypair
            )
            assert signed_in.returncode == 0, signed_in.stderr
            assert '"sandbox": true' in signed_in.stdout
        assert _usdc(sandbox, sandbox.pay_to) == before + 2205


@contextmanager
def _serving(env: dict[str, str], port: int) -> Iterator[str]:
    """``x402-gateway serve`` with exactly the printed environment (its PORT included)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(
            [*command(), "serve", "--host", "127.0.0.1"],
            env=clean_env(env),
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + 20
            while f"Running on http://127.0.0.1:{port} " not in read_output(err):
                assert process.poll() is None, read_output(err)
                assert time.monotonic() < deadline, read_output(err)
                time.sleep(0.05)
            yield f"http://127.0.0.1:{port}"
        finally:
            kill_group(process)


def test_balance_prints_usdc_and_sol_of_any_wallet_on_the_sandbox_chain(idle_sandbox: Sandbox) -> None:
    sandbox = idle_sandbox
    assert banner_value(sandbox.banner, "facilitator") == "internal,"
    fee_payer = sandbox.banner.split("fee payer ", 1)[1].split()[0]
    shown = json.loads(_balance(sandbox, fee_payer, "--json", run=run_script).stdout)
    assert shown["ok"] is True and shown["usdc"] == 0 and shown["lamports"] == 100 * 10**9
    stranger = str(Keypair().pubkey())
    text = _balance(sandbox, stranger).stdout
    assert f"wallet:         {stranger}" in text and "USDC:           0.00 USDC" in text
    assert "SOL:            0 SOL" in text
    refused = _balance(sandbox, "not-a-wallet")
    assert refused.returncode == 1 and "is not a Solana address" in refused.stderr


def test_the_sandbox_chain_answers_json_parsed_token_accounts(idle_sandbox: Sandbox) -> None:
    sandbox = idle_sandbox
    owned = _rpc(
        sandbox.rpc_url,
        "getTokenAccountsByOwner",
        [sandbox.wallet, {"mint": USDC_MAINNET_MINT}, {"encoding": "jsonParsed"}],
    )
    [entry] = owned["value"]
    assert entry["pubkey"] == sandbox.usdc_account
    info = entry["account"]["data"]["parsed"]["info"]
    assert entry["account"]["data"]["program"] == "spl-token"
    assert info["owner"] == sandbox.wallet and info["mint"] == USDC_MAINNET_MINT
    assert info["tokenAmount"]["amount"] == str(1000 * 10**6) and info["tokenAmount"]["decimals"] == 6
    mint = _rpc(sandbox.rpc_url, "getAccountInfo", [USDC_MAINNET_MINT, {"encoding": "jsonParsed"}])
    assert mint["value"]["data"]["parsed"]["type"] == "mint"
    assert mint["value"]["data"]["parsed"]["info"]["decimals"] == 6


# --- sandbox fund, and pay into a closed pipe ------------------------------------------------------


def _fund_line(sandbox: Sandbox, wallet: str) -> list[str]:
    """The banner's ``sandbox fund`` command, for ``wallet``."""
    [line] = [line for line in sandbox.banner.splitlines() if line.startswith("  x402-gateway sandbox fund ")]
    return [wallet if word == "WALLET" else word for word in shlex.split(line)]


def test_sandbox_fund_gives_a_wallet_of_your_own_usdc_and_sol_to_pay_with(
    idle_sandbox: Sandbox, tmp_path: Path
) -> None:
    """The banner's fund command as printed, for a fresh key: it then pays a call, and its summary
    reaches stderr though stdout's reader has left (``| head -c 10``)."""
    sandbox = idle_sandbox
    key = Keypair()
    key_file = tmp_path / "mine.json"
    key_file.write_text(json.dumps(list(bytes(key))))
    wallet = str(key.pubkey())

    funded = _run_printed(sandbox, _fund_line(sandbox, wallet), run_script)
    again = run_cli({}, "sandbox", "fund", wallet, "--usdc", "0.5", "--sol", "0", "--rpc", sandbox.rpc_url)

    assert funded.returncode == 0, funded.stderr
    account = str(get_associated_token_address(key.pubkey(), Pubkey.from_string(USDC_MAINNET_MINT)))
    assert funded.stdout.splitlines() == [
        f"funded {wallet} on the sandbox chain {sandbox.rpc_url}: added 100.00 USDC and 1 SOL",
        f"USDC:           100.00 USDC  (token account {account})",
        "SOL:            1 SOL",
    ]
    assert again.returncode == 0 and "USDC:           100.50 USDC" in again.stdout
    shown = json.loads(_balance(sandbox, wallet, "--json").stdout)
    assert (shown["usdc"], shown["lamports"], shown["token_account"]) == (100_500_000, 10**9, account)
    pay_to_before = _usdc(sandbox, sandbox.pay_to)
    url = f"{sandbox.url}/v1/x402/solana/mainnet/provider_a/rpc/getBalance"
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [wallet]})
    price = _advertised_price(url, "POST", body)

    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader has left before the answer comes
    try:
        paid = subprocess.run(
            [
                *command(),
                "pay",
                "POST",
                url,
                "--data",
                body,
                "--keypair",
                str(key_file),
                "--rpc",
                sandbox.rpc_url,
            ],
            env=clean_env({}),
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        os.close(write_end)

    assert paid.returncode == 0, paid.stderr
    assert "Traceback" not in paid.stderr and "BrokenPipe" not in paid.stderr
    assert f"paid {usdc_text(price)} to {sandbox.pay_to} (transaction " in paid.stderr
    assert "PAYMENT-RESPONSE: " in paid.stderr
    assert _usdc(sandbox, wallet) == 100_500_000 - price
    assert _usdc(sandbox, sandbox.pay_to) == pay_to_before + price


def test_sandbox_fund_refuses_what_it_cannot_do_in_one_line(idle_sandbox: Sandbox) -> None:
    sandbox = idle_sandbox
    wallet = str(Keypair().pubkey())

    cases = {
        "not-a-wallet": run_cli({}, "sandbox", "fund", "not-a-wallet", "--rpc", sandbox.rpc_url),
        "nothing": run_cli(
            {}, "sandbox", "fund", wallet, "--usdc", "0", "--sol", "0", "--rpc", sandbox.rpc_url
        ),
        "no chain named": run_cli({}, "sandbox", "fund", wallet),
        "the gateway": run_cli({}, "sandbox", "fund", wallet, "--rpc", sandbox.url),
        "too much": run_cli({}, "sandbox", "fund", wallet, "--usdc", "1000001", "--rpc", sandbox.rpc_url),
    }

    said = {name: (done.returncode, done.stderr.splitlines()) for name, done in cases.items()}
    prefix = "x402-gateway sandbox fund: "
    assert said["not-a-wallet"] == (1, [f"{prefix}'not-a-wallet' is not a Solana address"])
    assert said["nothing"] == (1, [f"{prefix}nothing to add: give --usdc N and/or --sol N above 0"])
    assert said["no chain named"] == (
        1,
        [
            f"{prefix}which sandbox? give --rpc URL (the banner's `local chain`), --state-dir DIR or set "
            "SOLANA_RPC_URL"
        ],
    )
    assert said["the gateway"][0] == 1 and said["the gateway"][1][0].startswith(
        f"{prefix}cannot fund: no answer from the Solana RPC node {sandbox.url} (sandboxFund: HTTP 404)"
    )
    assert said["too much"] == (
        2,
        [
            f"{prefix}argument --usdc: 1000001 is out of range: USDC from 0 to 1000000, with at most 6 "
            "decimals (see x402-gateway sandbox fund --help)"
        ],
    )
    assert json.loads(_balance(sandbox, wallet, "--json").stdout)["usdc"] == 0


def test_funds_given_with_the_state_dir_are_kept_across_a_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    wallet = str(Keypair().pubkey())
    with run_sandbox("--state-dir", str(state)) as first:
        funded = run_cli({}, "sandbox", "fund", wallet, "--usdc", "7", "--state-dir", str(state))
        assert funded.returncode == 0, funded.stderr
        port = int(first.url.rsplit(":", 1)[1])

    with run_sandbox("--state-dir", str(state), port=port, port_flag=False) as second:
        shown = json.loads(_balance(second, wallet, "--json").stdout)

    assert (shown["usdc"], shown["lamports"]) == (7 * 10**6, 10**9)


def test_pay_names_the_rpc_node_it_could_not_reach_and_how_to_name_another(
    idle_sandbox: Sandbox, tmp_path: Path
) -> None:
    sandbox = idle_sandbox
    nowhere = f"http://127.0.0.1:{free_port()}"
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [sandbox.wallet]})
    url = f"{sandbox.url}/v1/x402/solana/mainnet/provider_a/rpc/getBalance"
    before = _usdc(sandbox, sandbox.wallet)

    done = run_cli(
        {}, "pay", "POST", url, "--data", body, "--keypair", str(sandbox.key_file), "--rpc", nowhere
    )

    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()[-1:]
    assert line.startswith(
        f"x402-gateway pay: cannot build the payment: no answer from the Solana RPC node {nowhere} ("
    )
    assert line.endswith(
        "); name one that answers with --rpc URL or SOLANA_RPC_URL (the sandbox's banner prints its local "
        "chain's)"
    )
    assert _usdc(sandbox, sandbox.wallet) == before
