"""The README's client examples still work: the Python SDK examples, extracted from README.md
as written, run against a real sandbox (``x402-gateway sandbox`` subprocess): the first pays and
the demo wallet's USDC moves to payTo by exactly the advertised price; the prepaid-credit one buys
a top-up, whose USDC alone moves, and calls on the credit, ``X-Credit-Balance`` falling by the
route's credit price each call."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from gateway.x402.types import USDC_MAINNET_MINT as USDC
from tests.support.gateway_process import clean_env
from tests.support.sandbox_process import Sandbox, run_sandbox

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = "## Paying from the x402 SDKs"
CREDIT_PART = "### Prepaid credit"
PATH = "/v1/x402/solana/mainnet/provider_a/rpc/getBalance"
TOP_UP_USDC = 1_000_000
"""The examples buy the smallest top-up, 1 USDC."""


def _fenced(language: str, part: str = "pay") -> str:
    """The one ``language`` block of the section's paying part, or of its ``credit`` part."""
    section = README.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    paying, credit = section.split(f"\n{CREDIT_PART}\n", 1)
    blocks = re.findall(rf"^```{language}\n(.*?)^```", credit if part == "credit" else paying, re.S | re.M)
    assert len(blocks) == 1, f"expected one {language} block in the {part} part of {SECTION!r}"
    return str(blocks[0])


def _rpc(sandbox: Sandbox, method: str, params: list[Any]) -> Any:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}).encode()
    request = urllib.request.Request(sandbox.rpc_url, data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read())["result"]


def _usdc_of(sandbox: Sandbox, owner: str) -> int:
    owned = _rpc(sandbox, "getTokenAccountsByOwner", [owner, {"mint": USDC}, {"encoding": "jsonParsed"}])
    return sum(int(a["account"]["data"]["parsed"]["info"]["tokenAmount"]["amount"]) for a in owned["value"])


def _price(sandbox: Sandbox, wallet: str) -> int:
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [wallet]}).encode()
    request = urllib.request.Request(
        sandbox.url + PATH, data=body, headers={"content-type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)
    assert refused.value.code == 402
    return int(json.loads(refused.value.read())["accepts"][0]["amount"])


ENV_READ = re.compile(r"""os\.environ(?:\.get\(|\[)"(\w+)"|process\.env\.(\w+)""")


def _variables_read(example: str) -> set[str]:
    """The environment variables an example reads (Python's os.environ, Node's process.env)."""
    return {python or js for python, js in ENV_READ.findall(example)}


def _pays_the_sandbox(command: list[str], example: str) -> None:
    """Run ``command`` (the example) against a fresh sandbox with nothing but the variables of
    the banner's ``export`` line, which must set every one the example reads; it must pay
    exactly once."""
    with run_sandbox() as sandbox:
        price = _price(sandbox, sandbox.wallet)
        before = (_usdc_of(sandbox, sandbox.wallet), _usdc_of(sandbox, sandbox.pay_to))
        assert sandbox.exports == {
            "X402_KEYPAIR": str(sandbox.key_file),
            "SOLANA_RPC_URL": sandbox.rpc_url,
            "GATEWAY": sandbox.url,
        }
        assert _variables_read(example) == set(sandbox.exports)
        done = subprocess.run(
            command,
            env=clean_env(sandbox.exports),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        after = (_usdc_of(sandbox, sandbox.wallet), _usdc_of(sandbox, sandbox.pay_to))
    assert done.returncode == 0, done.stderr
    status_line, settlement_line = done.stdout.strip().splitlines()[-2:]
    assert status_line.startswith("200 ") and "result" in status_line
    settlement = json.loads(base64.b64decode(settlement_line.split(" ", 1)[1]))
    assert settlement["success"] is True and settlement["transaction"]
    assert after == (before[0] - price, before[1] + price)


def _credit_price(sandbox: Sandbox) -> int:
    """What a getBalance call takes from credit, as the sandbox's catalog states it."""
    with urllib.request.urlopen(sandbox.url + "/v1/catalog", timeout=5) as resp:
        routes = json.loads(resp.read())["routes"]
    [route] = [r for r in routes if r["path"] == PATH]
    return int(route["creditPrice"]["microUsdc"])


def _buys_credit_and_calls_on_it(command: list[str], example: str) -> None:
    """Run the credit example against a fresh sandbox: one top-up moves its USDC, the four calls
    after it (two signing in, two on a credit session) none, each printing the credit it left."""
    with run_sandbox() as sandbox:
        assert _variables_read(example) == set(sandbox.exports)
        price = _credit_price(sandbox)
        before = (_usdc_of(sandbox, sandbox.wallet), _usdc_of(sandbox, sandbox.pay_to))
        done = subprocess.run(
            command,
            env=clean_env(sandbox.exports),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        after = (_usdc_of(sandbox, sandbox.wallet), _usdc_of(sandbox, sandbox.pay_to))
    assert done.returncode == 0, done.stderr
    bought, *calls = done.stdout.strip().splitlines()[-6:]
    assert bought == f"200 credit {TOP_UP_USDC}"
    assert calls == [  # two calls signing in, a session opened, two calls on it
        f"200 X-Credit-Balance {TOP_UP_USDC - price}",
        f"200 X-Credit-Balance {TOP_UP_USDC - 2 * price}",
        "200 session cap 100000",
        f"200 X-Credit-Balance {TOP_UP_USDC - 3 * price}",
        f"200 X-Credit-Balance {TOP_UP_USDC - 4 * price}",
    ]
    assert after == (before[0] - TOP_UP_USDC, before[1] + TOP_UP_USDC)


def test_the_python_sdk_example_in_the_readme_pays_the_sandbox(tmp_path: Path) -> None:
    script = tmp_path / "pay_with_sdk.py"
    script.write_text(_fenced("python"), encoding="utf-8")
    _pays_the_sandbox([sys.executable, str(script)], _fenced("python"))


def test_the_python_sdk_credit_example_in_the_readme_buys_credit_and_calls_on_it(tmp_path: Path) -> None:
    script = tmp_path / "credit_with_sdk.py"
    script.write_text(_fenced("python", "credit"), encoding="utf-8")
    _buys_credit_and_calls_on_it([sys.executable, str(script)], _fenced("python", "credit"))


def test_both_sdk_examples_read_the_same_variables_the_banner_exports() -> None:
    # The Python examples' runs (above) hold the banner's export line to exactly these.
    for part in ("pay", "credit"):
        assert _variables_read(_fenced("js", part)) == _variables_read(_fenced("python", part))
        assert _variables_read(_fenced("python", part)) == {"X402_KEYPAIR", "SOLANA_RPC_URL", "GATEWAY"}


JS_SDK = os.environ.get("X402_JS_SDK_DIR", "")
"""A directory with ``node_modules`` holding @x402/fetch, @x402/svm, @x402/extensions and
@solana/kit (CI has none)."""


def _js_sdk_has(package: str) -> bool:
    return bool(shutil.which("node") and JS_SDK and (Path(JS_SDK) / "node_modules" / package).is_dir())


@pytest.mark.skipif(
    not _js_sdk_has("@x402/fetch"),
    reason="set X402_JS_SDK_DIR to a directory where `npm install @x402/fetch @x402/svm @solana/kit` ran",
)
def test_the_javascript_sdk_example_in_the_readme_pays_the_sandbox() -> None:
    script = Path(JS_SDK) / "x402-gateway-readme-example.mjs"  # resolves its imports there
    script.write_text(_fenced("js"), encoding="utf-8")
    _pays_the_sandbox([str(shutil.which("node")), str(script)], _fenced("js"))


@pytest.mark.skipif(
    not _js_sdk_has("@x402/extensions"),
    reason="set X402_JS_SDK_DIR to a directory where `npm install @x402/fetch @x402/svm @x402/extensions "
    "@solana/kit` ran",
)
def test_the_javascript_sdk_credit_example_in_the_readme_buys_credit_and_calls_on_it() -> None:
    script = Path(JS_SDK) / "x402-gateway-readme-credit-example.mjs"
    script.write_text(_fenced("js", "credit"), encoding="utf-8")
    _buys_credit_and_calls_on_it([str(shutil.which("node")), str(script)], _fenced("js", "credit"))
