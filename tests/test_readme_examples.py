"""The README's commands and client examples work as pasted: the Python SDK examples, extracted
from README.md as written, run against a real sandbox (``x402-gateway sandbox`` subprocess) with
only the packages the README's ``pip install`` line brings (the x402 extras it leaves out are
hidden): the first pays and the demo wallet's USDC moves to payTo by exactly the advertised price;
the prepaid-credit one buys a top-up, whose USDC alone moves, and calls on the credit,
``X-Credit-Balance`` falling by the route's credit price each call. The shell blocks that talk to a
sandbox run in bash with only the banner's values; every other shell command of README.md and
deploy/README.md names the test that checks it (no container engine or cluster here)."""

from __future__ import annotations

import base64
import functools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gateway.x402.types import USDC_MAINNET_MINT as USDC
from tests.support.gateway_process import clean_env
from tests.support.sandbox_process import Sandbox, banner_value, run_sandbox

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DEPLOY_README = ROOT / "deploy" / "README.md"
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


# --- the SDK install line: a fresh environment holds only the extras it names -----------------

INSTALL_LINE = re.compile(r'`pip install "x402\[([a-z,]+)\]==([0-9][0-9.]*)"`')


def _sdk_install() -> tuple[frozenset[str], str]:
    """The extras and the version of the README's one ``pip install "x402[...]==..."`` line."""
    section = README.read_text(encoding="utf-8").split(SECTION, 1)[1].split("\n## ", 1)[0]
    [(extras, version)] = INSTALL_LINE.findall(section.replace("\n", " "))
    return frozenset(extras.split(",")), version


def _requirements(dist: str, extras: Iterable[str]) -> list[Requirement]:
    try:
        listed = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return []
    wanted = ("", *extras)
    return [
        req
        for req in map(Requirement, listed)
        if req.marker is None or any(req.marker.evaluate({"extra": extra}) for extra in wanted)
    ]


def _closure(dist: str, extras: Iterable[str]) -> set[str]:
    """``dist`` with ``extras`` and every distribution it installs, transitively."""
    seen: set[str] = set()
    todo = [(dist, tuple(extras))]
    while todo:
        name, chosen = todo.pop()
        key = f"{canonicalize_name(name)}{sorted(chosen)}"
        if key in seen:
            continue
        seen.add(key)
        todo += [(req.name, tuple(req.extras)) for req in _requirements(name, chosen)]
    return {key.split("[", 1)[0] for key in seen}


@functools.cache
def _hidden_modules(extras: frozenset[str]) -> frozenset[str]:
    """The top-level modules of the distributions only x402's *other* extras install: what a
    fresh environment after the README's install line lacks, though this one has them."""
    every_extra = set(metadata.metadata("x402").get_all("Provides-Extra") or [])
    needed = _closure("x402", extras)
    others = {
        canonicalize_name(req.name)
        for extra in every_extra - extras
        for req in _requirements("x402", [extra])
        if req.marker is not None
    }
    hidden = others - needed
    return frozenset(
        module
        for module, dists in metadata.packages_distributions().items()
        if {canonicalize_name(d) for d in dists} & hidden
    )


# Runs a script with the modules named in argv[1] (comma-separated) impossible to import.
WITHOUT_MODULES = """
import importlib.abc, runpy, sys
hidden = frozenset(filter(None, sys.argv[1].split(",")))
class Hidden(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in hidden:
            why = "not installed by the README's pip line"
            raise ModuleNotFoundError(f"No module named {name!r} ({why})", name=name)
        return None
sys.meta_path.insert(0, Hidden())
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def _python_as_installed_by_the_readme(script: Path) -> list[str]:
    extras, _ = _sdk_install()
    return [sys.executable, "-c", WITHOUT_MODULES, ",".join(sorted(_hidden_modules(extras))), str(script)]


def test_the_sdk_install_line_pins_the_tested_x402_with_the_extras_the_examples_need() -> None:
    extras, version = _sdk_install()
    assert version == metadata.version("x402")
    assert {"svm", "httpx", "extensions"} <= extras
    # The credit example's sign-in needs jsonschema, which only the extensions extra installs.
    assert "jsonschema" in _hidden_modules(frozenset(extras - {"extensions"}))
    assert not {"jsonschema", "solders", "httpx"} & _hidden_modules(extras)


ENV_READ = re.compile(r"""os\.environ(?:\.get\(|\[)"(\w+)"|process\.env\.(\w+)""")


def _variables_read(example: str) -> set[str]:
    """The environment variables an example reads (Python's os.environ, Node's process.env)."""
    return {python or js for python, js in ENV_READ.findall(example)}


def _pays_the_sandbox(command: list[str], example: str) -> None:
    """Run ``command`` (the example) against a fresh sandbox with nothing but the variables of
    the banner's ``export`` line, which must set every one the example reads; it must pay
    exactly once."""
    with run_sandbox(script=True) as sandbox:
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
    with run_sandbox(script=True) as sandbox:
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
    _pays_the_sandbox(_python_as_installed_by_the_readme(script), _fenced("python"))


def test_the_python_sdk_credit_example_in_the_readme_buys_credit_and_calls_on_it(tmp_path: Path) -> None:
    script = tmp_path / "credit_with_sdk.py"
    script.write_text(_fenced("python", "credit"), encoding="utf-8")
    _buys_credit_and_calls_on_it(_python_as_installed_by_the_readme(script), _fenced("python", "credit"))


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


# --- the shell blocks of README.md and deploy/README.md ----------------------------------------

BANNER_PLACEHOLDERS = {
    "<key file>": "demo key file",
    "<chain URL>": "local chain",
    "<demo wallet>": "demo wallet",
}
"""Each placeholder the README pastes, and the banner line that prints its value."""
README_GATEWAY = "http://127.0.0.1:8080"


def _shell_blocks(path: Path) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", path.read_text(encoding="utf-8"), re.S | re.M)


def _shell_block(containing: str) -> str:
    [block] = [b for b in _shell_blocks(README) if containing in b]
    return block


def _commands(block: str) -> list[str]:
    """The block's commands, continuation lines joined, comment-only lines left out."""
    joined = re.sub(r"\\\n\s*", "", block)
    return [
        line.strip() for line in joined.splitlines() if line.strip() and not line.lstrip().startswith("#")
    ]


def _pasted(block: str, sandbox: Sandbox) -> str:
    """The block as a reader pastes it: each placeholder replaced by what the banner prints."""
    for placeholder, label in BANNER_PLACEHOLDERS.items():
        block = block.replace(placeholder, shlex.quote(banner_value(sandbox.banner, label)))
    block = block.replace(README_GATEWAY, sandbox.url)
    assert not re.search(r"<[a-zA-Z][^>]*>", block), f"a placeholder the banner does not print:\n{block}"
    return block


def _bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``script`` in bash, as typed at a prompt of the environment the README installs into."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        env=clean_env({**env, "PATH": path}),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


@pytest.mark.slow
def test_the_quick_start_and_credit_shell_blocks_run_as_pasted_against_the_sandbox() -> None:
    quick = _shell_block("export X402_KEYPAIR=")
    credit = _shell_block("--top-up")
    placeholders = set(re.findall(r"<[^>]+>", quick))
    assert placeholders <= set(BANNER_PLACEHOLDERS), placeholders - set(BANNER_PLACEHOLDERS)
    assert not re.search(r"<[a-zA-Z][^>]*>", credit), "the credit block runs after the export line alone"
    with run_sandbox(script=True) as sandbox:
        exported = re.search(r"^export (.*)$", quick, re.M)
        assert exported and set(re.findall(r"(\w+)=", exported[1])) == set(sandbox.exports)
        price, credit_price = _price(sandbox, sandbox.wallet), _credit_price(sandbox)
        start = _usdc_of(sandbox, sandbox.wallet)

        # The quick start: the banner's export line, then a paid call.
        paid = _bash(_pasted(quick, sandbox), {})
        assert paid.returncode == 0, paid.stderr
        assert json.loads(paid.stdout)["result"] is not None
        assert _usdc_of(sandbox, sandbox.wallet) == start - price

        # The credit block, after the banner's export line: a top-up, a call on credit, the balance.
        bought = _bash(_pasted(credit, sandbox), sandbox.exports)
        assert bought.returncode == 0, bought.stderr
        assert _usdc_of(sandbox, sandbox.wallet) == start - price - TOP_UP_USDC
    assert f"{(TOP_UP_USDC - credit_price) / 1e6:.6f}" in bought.stdout + bought.stderr


# Every other command of a shell block, and the test that checks it (containers, a cluster and the
# package index are out of reach here). The commands above run in this module.
RUN_HERE = ("export X402_KEYPAIR=", "x402-gateway pay ", "x402-gateway credits ")
E2E_TESTS, DEPLOY_TESTS = "tests/test_sandbox_e2e.py", "tests/test_deploy.py"
DOCKER_TESTS = "tests/test_sandbox_docker_recipe.py"
BACKUP_TESTS = "tests/test_ledger_backup.py"
CHECKED_BY: dict[str, tuple[str, str]] = {
    "pip install -e . && x402-gateway sandbox": (
        E2E_TESTS,
        "test_sandbox_pay_moves_exactly_the_advertised_prices",
    ),
    '(set -a; eval "$(x402-gateway sandbox --print-env': (
        E2E_TESTS,
        "test_print_env_configures_check_and_a_serve_that_sells_on_the_sandbox_chain",
    ),
    "docker build -f deploy/Dockerfile": (
        DEPLOY_TESTS,
        "test_the_images_install_steps_in_a_fresh_venv_land_exactly_the_pins",
    ),
    "podman build --format docker": (
        DEPLOY_TESTS,
        "test_deploy_readme_names_the_builders_that_keep_the_healthcheck_and_compose_v2",
    ),
    "mkdir -p ~/.x402-sandbox": (
        DOCKER_TESTS,
        "test_the_docker_sandbox_recipe_mounts_its_state_and_publishes_its_ports",
    ),
    "docker run --rm --user": (
        DOCKER_TESTS,
        "test_the_docker_sandbox_recipe_mounts_its_state_and_publishes_its_ports",
    ),
    "cp deploy/.env.example deploy/.env": (
        DEPLOY_TESTS,
        "test_compose_lets_deploy_env_set_every_setting_of_the_gateway",
    ),
    "docker compose -f deploy/compose.yaml up": (
        DEPLOY_TESTS,
        "test_compose_file_matches_the_compose_specification",
    ),
    "curl http://localhost:8080/healthz": (
        DEPLOY_TESTS,
        "test_compose_runs_redis_two_gateway_replicas_and_a_proxy_with_healthchecks",
    ),
    "docker compose -f deploy/compose.yaml --profile monitoring": (
        DEPLOY_TESTS,
        "test_promtool_accepts_the_shipped_prometheus_files",
    ),
    "pip install -e '.[test]' -c constraints.txt": (
        ".ci/run",
        "",
    ),
    "kubectl create secret generic x402-gateway-redis": (
        DEPLOY_TESTS,
        "test_secret_template_lists_the_referenced_keys_without_values",
    ),
    "kubectl create secret generic x402-gateway-postgres": (
        DEPLOY_TESTS,
        "test_kubernetes_postgres_keeps_the_ledger_on_a_persistent_volume",
    ),
    "docker compose -f deploy/compose.yaml exec -T postgres pg_": (
        BACKUP_TESTS,
        "test_the_readmes_dump_and_restore_bring_the_ledger_back_and_an_empty_store_with_it",
    ),
    "kubectl exec x402-gateway-postgres-0 -- pg_dump": (
        BACKUP_TESTS,
        "test_the_readmes_dump_and_restore_bring_the_ledger_back_and_an_empty_store_with_it",
    ),
    "kubectl exec -i x402-gateway-postgres-0 -- pg_restore": (
        BACKUP_TESTS,
        "test_the_readmes_dump_and_restore_bring_the_ledger_back_and_an_empty_store_with_it",
    ),
    "kubectl create secret generic x402-gateway ": (
        DEPLOY_TESTS,
        "test_secret_template_lists_the_referenced_keys_without_values",
    ),
    "kubectl apply -k deploy/k8s": (
        DEPLOY_TESTS,
        "test_kustomization_applies_every_manifest_except_the_secret_template",
    ),
    "x402-gateway ledger export --since": (
        "tests/test_ledger_export.py",
        "test_since_and_until_select_a_window_however_they_are_written",
    ),
    "x402-gateway ledger reconcile --rpc": (
        "tests/test_ledger_reconcile.py",
        "test_real_top_ups_and_sales_reconcile_with_nothing_wrong",
    ),
}


@pytest.mark.parametrize("path", [README, DEPLOY_README], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shell_command_of_the_readmes_runs_here_or_names_the_test_that_checks_it(path: Path) -> None:
    commands = [c for block in _shell_blocks(path) for c in _commands(block)]
    assert commands
    for command in commands:
        if command.startswith(RUN_HERE):
            assert path == README, command
            continue
        checks = [where for prefix, where in CHECKED_BY.items() if command.startswith(prefix)]
        assert checks, f"{path.name}: no test runs or checks {command!r}: add one to CHECKED_BY"
        file, test = checks[0]
        source = (ROOT / file).read_text(encoding="utf-8")
        assert not test or f"def {test}(" in source, checks[0]


def test_ci_runs_the_readmes_test_command() -> None:
    [line] = [
        c for b in _shell_blocks(README) for c in _commands(b) if c.startswith("pip install -e '.[test]'")
    ]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    steps = line.removeprefix("pip install ").split(" && ")
    assert all(step in ci for step in steps), steps


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
@pytest.mark.parametrize("part", ["pay", "credit"])
def test_the_javascript_sdk_examples_are_valid_modules_as_pasted(part: str, tmp_path: Path) -> None:
    """Without the SDK installed the examples cannot run (the tests above do where it is), but
    node can still check they parse as the ES modules `node pay.mjs` loads."""
    script = tmp_path / "pay.mjs"
    script.write_text(_fenced("js", part), encoding="utf-8")
    node = str(shutil.which("node"))
    checked = subprocess.run([node, "--check", str(script)], capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr
