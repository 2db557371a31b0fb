"""``x402-gateway ledger reconcile``: the journal against the chain's transfers into payTo.

Real parts only: a served gateway (credit on, Redis, its own fee payer) settles real payments on
the test's LiteSVM chain and journals them to a real PostgreSQL; the CLI runs as a process of its
own and reads the chain through the JSON-RPC server, as it would read a real node.
"""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import time
from collections.abc import Callable
from typing import Any, Literal

import msgspec
import pytest
from solders.keypair import Keypair
from solders.signature import Signature

from gateway.ledger import entries
from gateway.ledger.entries import Entry, SettledPayment
from gateway.ledger.reconcile import Difference, reconcile
from gateway.outbound.solana_rpc import SolanaRpc
from tests.support.adversarial_credit import TOP_UP_1_CREDIT
from tests.support.gateway_process import run_cli, run_script
from tests.support.ledger_served import (
    LedgerGateway,
    settle_activity,
    transfer_to_pay_to,
)
from tests.support.solana_rpc_server import set_token_account

pytestmark = [
    pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402"),
    pytest.mark.asyncio(loop_scope="session"),
]


async def _reconcile(ledger: LedgerGateway, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI as an operator runs it, in a process of its own (off the loop serving the gateway)."""
    command = ["ledger", "reconcile", "--rpc", ledger.rpc.url, "--database", ledger.journal_url]
    command += ["--pay-to", str(ledger.chain.pay_to), "--usdc-mint", str(ledger.chain.mint), *args]
    return await asyncio.to_thread(run_cli, {}, *command, timeout=60)


async def _findings(ledger: LedgerGateway, *args: str) -> tuple[int, dict[str, Any]]:
    done = await _reconcile(ledger, "--format", "json", *args)
    assert done.stderr == ""
    answer: dict[str, Any] = msgspec.json.decode(done.stdout)
    return done.returncode, answer


T0_MS = 1_764_201_600_000  # 2025-11-27T00:00:00Z


ENTRY_OF: dict[str, tuple[Callable[[SettledPayment], Entry], str]] = {
    "top_up": (entries.top_up, "credits.topUp.1"),
    "sale": (entries.sale, "solana.mainnet.provider_a.rpc.getBalance"),
}


async def _journal(
    ledger: LedgerGateway,
    kind: Literal["top_up", "sale"],
    payer: str,
    amount: int,
    signature: str,
    *,
    at_ms: int,
) -> None:
    """Journal a settled ``kind`` payment the gateway never made, for reconcile to hold against
    the chain."""
    entry, route = ENTRY_OF[kind]
    payment = SettledPayment(
        route=route,
        payer=payer,
        amount_micro=amount,
        signature=signature,
        facilitator="internal",
        at_ms=at_ms,
    )
    assert await ledger.journal.record([entry(payment)]) == 1


def _unknown_signature() -> str:
    return str(Signature.from_bytes(secrets.token_bytes(64)))


async def test_real_top_ups_and_sales_reconcile_with_nothing_wrong(ledger: LedgerGateway) -> None:
    await settle_activity(ledger)

    done = await _reconcile(ledger)
    code, answer = await _findings(ledger)

    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.strip() == (
        f"payTo {ledger.chain.pay_to} (token account {ledger.chain.pay_to_ata}): 3 transfers on chain, "
        "3 sales and top-ups journaled, 3 matched; no difference"
    )
    assert code == 0
    assert answer == {
        "payTo": str(ledger.chain.pay_to),
        "tokenAccount": str(ledger.chain.pay_to_ata),
        "sinceMs": None,
        "transfers": 3,
        "entries": 3,
        "matched": 3,
        "findings": [],
    }


async def test_transfers_into_pay_to_the_gateway_never_journaled_are_reported(ledger: LedgerGateway) -> None:
    await settle_activity(ledger)
    signature, sender = await transfer_to_pay_to(ledger.chain, ledger.rpc.url, 250_000)

    plain, plain_sender = await transfer_to_pay_to(ledger.chain, ledger.rpc.url, 30_000, checked=False)

    done = await _reconcile(ledger)
    code, answer = await _findings(ledger)

    assert done.returncode == 1 and done.stderr == ""
    assert done.stdout.splitlines()[1:] == [  # newest first, as the chain lists them
        f"transfer without an entry: {plain}: 0.03 USDC from {plain_sender.pubkey()}",
        f"transfer without an entry: {signature}: 0.25 USDC from {sender.pubkey()}",
    ]
    assert code == 1
    assert (answer["transfers"], answer["matched"]) == (5, 3)
    assert answer["findings"][1] == {
        "difference": "transfer_without_entry",
        "signature": signature,
        "chainAmountMicroUsdc": 250_000,
        "chainPayers": [str(sender.pubkey())],
        "slot": 0,  # LiteSVM's clock stays at slot 0
    }


async def test_a_journal_entry_whose_signature_is_not_on_chain_is_reported(ledger: LedgerGateway) -> None:
    [wallet, _] = await settle_activity(ledger)
    signature = _unknown_signature()
    await _journal(ledger, "top_up", str(wallet.pubkey()), TOP_UP_1_CREDIT, signature, at_ms=T0_MS)

    done = await _reconcile(ledger)
    code, answer = await _findings(ledger)

    assert done.returncode == 1
    assert done.stdout.splitlines()[1:] == [
        f"entry without its transfer: top_up settlement:{signature} at 2025-11-27T00:00:00.000Z: "
        f"1.00 USDC from {wallet.pubkey()}; not on chain"
    ]
    assert code == 1 and (answer["entries"], answer["matched"]) == (4, 3)
    assert answer["findings"] == [
        {
            "difference": "entry_without_transfer",
            "signature": signature,
            "entryRef": f"settlement:{signature}",
            "entryKind": "top_up",
            "journalAmountMicroUsdc": TOP_UP_1_CREDIT,
            "journalWallet": str(wallet.pubkey()),
            "occurredAtMs": T0_MS,
        }
    ]


async def test_an_entry_whose_amount_and_payer_differ_from_its_transfer_is_reported(
    ledger: LedgerGateway,
) -> None:
    [wallet, _] = await settle_activity(ledger)
    signature, sender = await transfer_to_pay_to(ledger.chain, ledger.rpc.url, 250_000)
    await _journal(ledger, "sale", str(wallet.pubkey()), 300_000, signature, at_ms=int(time.time() * 1000))

    done = await _reconcile(ledger)
    code, answer = await _findings(ledger)

    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[1].startswith(f"amount differs: sale settlement:{signature} at ")
    assert lines[1].endswith(": journal 0.30 USDC, chain 0.25 USDC")
    assert lines[2].endswith(f": journal {wallet.pubkey()}, chain {sender.pubkey()}")
    assert code == 1 and (answer["transfers"], answer["entries"], answer["matched"]) == (4, 4, 3)
    assert [(f["difference"], f["signature"]) for f in answer["findings"]] == [
        ("amount_differs", signature),
        ("payer_differs", signature),
    ]
    assert answer["findings"][0]["chainAmountMicroUsdc"] == 250_000
    assert answer["findings"][0]["journalAmountMicroUsdc"] == 300_000


async def test_an_entry_whose_transaction_pays_elsewhere_is_reported_missing(ledger: LedgerGateway) -> None:
    await settle_activity(ledger)
    elsewhere = set_token_account(ledger.chain.svm, Keypair().pubkey(), ledger.chain.mint, 0)
    signature, sender = await transfer_to_pay_to(ledger.chain, ledger.rpc.url, 700_000, to=elsewhere)
    await _journal(ledger, "sale", str(sender.pubkey()), 700_000, signature, at_ms=T0_MS)

    done = await _reconcile(ledger)
    code, answer = await _findings(ledger)

    assert done.returncode == 1
    assert done.stdout.splitlines()[1:] == [
        f"entry without its transfer: sale settlement:{signature} at 2025-11-27T00:00:00.000Z: "
        f"0.70 USDC from {sender.pubkey()}; its transaction pays nothing into payTo"
    ]
    assert code == 1 and (answer["transfers"], answer["entries"], answer["matched"]) == (3, 4, 3)
    [finding] = answer["findings"]
    assert (finding["difference"], finding["signature"]) == ("entry_without_transfer", signature)
    assert "slot" in finding  # the transaction was found (LiteSVM's clock stays at slot 0)


async def test_an_entry_whose_transfer_failed_on_chain_is_reported_and_the_failure_is_no_transfer(
    ledger: LedgerGateway,
) -> None:
    await settle_activity(ledger)
    unjournaled_failure, _ = await transfer_to_pay_to(ledger.chain, ledger.rpc.url, 500_000, funds=1)
    failed, sender = await transfer_to_pay_to(ledger.chain, ledger.rpc.url, 400_000, funds=1)
    await _journal(ledger, "top_up", str(sender.pubkey()), 400_000, failed, at_ms=int(time.time() * 1000))

    code, answer = await _findings(ledger)

    assert code == 1 and (answer["transfers"], answer["matched"]) == (3, 3)
    assert [(f["difference"], f["signature"]) for f in answer["findings"]] == [
        (Difference.FAILED.value, failed)
    ]
    assert unjournaled_failure not in str(answer)


async def test_since_bounds_what_is_looked_at_without_calling_the_edge_missing(ledger: LedgerGateway) -> None:
    await settle_activity(ledger)
    later = int(time.time()) + 3600

    done = await _reconcile(ledger, "--since", str(later))
    code, answer = await _findings(ledger, "--since", str(later))

    # the journal has nothing after --since; each transfer the chain lists is matched with its
    # entry journaled before it, and nothing is reported
    assert done.returncode == 0 and "no difference" in done.stdout
    assert code == 0 and answer["sinceMs"] == later * 1000
    assert (answer["transfers"], answer["entries"], answer["matched"], answer["findings"]) == (3, 3, 3, [])


async def test_the_chain_history_is_read_a_page_at_a_time(ledger: LedgerGateway) -> None:
    await settle_activity(ledger)
    extra = [(await transfer_to_pay_to(ledger.chain, ledger.rpc.url, 1_000 + n))[0] for n in range(3)]
    rpc = SolanaRpc(ledger.rpc.url)
    try:
        result = await reconcile(
            ledger.journal, rpc, pay_to=ledger.chain.pay_to, token_account=ledger.chain.pay_to_ata, page=2
        )
    finally:
        await rpc.close()

    assert (result.transfers, result.entries, result.matched) == (6, 3, 3)
    assert sorted(f.signature for f in result.findings) == sorted(extra)
    assert {f.difference for f in result.findings} == {Difference.UNJOURNALED}
    assert ledger.rpc.calls["getSignaturesForAddress"] >= 4


async def test_reconcile_refuses_bad_arguments_in_one_line() -> None:
    cases = {
        ("--rpc", "http://127.0.0.1:9", "--database", "postgresql://h/d"): "give --pay-to WALLET",
        ("--pay-to", "not-an-address"): "'not-an-address' is not a base58 Solana address",
        ("--since", "soon"): "'soon' is neither Unix seconds nor an ISO-8601 date or time",
        ("--database", "redis://h"): "the ledger's database must be a postgresql:// URL",
        ("--format", "xml"): "invalid choice: 'xml'",
    }
    for args, said in cases.items():
        done = await asyncio.to_thread(run_cli, {}, "ledger", "reconcile", *args)
        assert done.returncode == 2, (args, done.stderr)
        assert said in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert done.stdout == ""


async def test_an_unreachable_node_or_database_exits_3_without_a_traceback(ledger: LedgerGateway) -> None:
    base = [
        "ledger",
        "reconcile",
        "--pay-to",
        str(ledger.chain.pay_to),
        "--usdc-mint",
        str(ledger.chain.mint),
    ]
    no_node = await asyncio.to_thread(  # through the console script: the entry point itself
        run_script, {}, *base, "--rpc", "http://127.0.0.1:9", "--database", ledger.journal_url
    )
    no_database = await asyncio.to_thread(
        run_cli, {}, *base, "--rpc", ledger.rpc.url, "--database", "postgresql://u:secret@127.0.0.1:9/none"
    )

    assert no_node.returncode == 3
    assert (
        no_node.stderr
        == "x402-gateway ledger reconcile: getAccountInfo: node unreachable (ClientConnectorError)\n"
    )
    assert no_database.returncode == 3
    assert no_database.stderr.startswith("x402-gateway ledger reconcile: ledger database unavailable")
    assert "secret" not in no_database.stderr and "Traceback" not in no_database.stderr
