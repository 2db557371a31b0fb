"""One vocabulary of store keys: spelled in ``gateway/store/keys.py`` only, unchanged, and
with no key that two families could both write; on a Redis Cluster, every key a script reads
with others on one slot, and the families touched alone spread over the slots.

The exact strings are pinned here on purpose: replicas of two releases share one store during a
rolling deploy, so a key renamed by accident would let the new release miss the old one's claims
(a rename on purpose comes with its upgrade: ``docs/store.md``).
"""

from __future__ import annotations

import ast
import inspect
import itertools
import re
from collections.abc import Callable
from pathlib import Path

import pytest
from redis.crc import key_slot

from gateway.store import keys

ROOT = Path(__file__).resolve().parent.parent
KEYS_MODULE = ROOT / "gateway" / "store" / "keys.py"
ROOTS = re.compile(r"x402gw[}:]|x402gw\.[\w-]+:|x402:svm")
DIGEST = "ab" * 32
"""A payment key / message hash: hex SHA-256, 64 characters, no colon."""


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """Every string literal in ``tree``, the literal parts of f-strings included."""
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_no_module_but_the_keys_module_spells_a_store_key_root() -> None:
    spelled = [
        f"{path.relative_to(ROOT)}:{line}: {text[:60]!r}"
        for package in ("gateway", "middleware")
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != KEYS_MODULE
        for line, text in _strings(ast.parse(path.read_text(encoding="utf-8")))
        if ROOTS.search(text)
    ]
    assert spelled == []


def test_the_scan_would_find_a_root_spelled_in_an_f_string() -> None:
    found = _strings(ast.parse('key = f"x402gw:pay:{key}"'))
    assert any(ROOTS.search(text) for _, text in found)


def test_the_key_strings_are_the_ones_a_running_store_holds() -> None:
    assert keys.payment_claim("P1", DIGEST) == f"x402gw.pay:{{w:P1}}:{DIGEST}"
    assert keys.pending_settlement("P1", DIGEST) == f"x402gw.pending:{{w:P1}}:{DIGEST}"
    assert keys.delivery("P1", DIGEST) == f"x402gw.delivered:{{w:P1}}:{DIGEST}"
    assert keys.payment_id("P1", "order-7") == "x402gw.pid:{w:P1}:order-7"
    assert keys.sign_in_nonce("W1", "n0nce") == "x402gw.siwx:{w:W1}:n0nce"
    assert keys.rate_bucket("das") == "x402gw.rl:{rl:das}"
    assert keys.rate_bucket("das:ip", keys.ip_tag("203.0.113.7")) == "x402gw.rl:{ip:203.0.113.7}:das:ip"
    assert keys.rate_bucket("das:w", keys.wallet_tag("W1")) == "x402gw.rl:{w:W1}:das:w"
    share = keys.rate_bucket("tokens:ip", "ip:1.2.3.4", "tokens")
    assert share == "x402gw.rl:{rl:tokens}:tokens:ip:ip:1.2.3.4"
    assert keys.rate_contention("tokens:ip", "tokens") == "x402gw.rl-contended:{rl:tokens}:tokens:ip"
    assert (
        keys.limit_window("challenge:ip", "203.0.113.7", 1000) == "{x402gw:rlw:challenge:ip:203.0.113.7:1000}"
    )
    assert keys.usage("getSlot", "paid") == "{x402gw:usage:getSlot:paid}"
    assert keys.fee_guard_record("owner", "W") == "x402gw.fee-guard:settled:{w:W}"
    assert keys.fee_guard_cooldown("ip", "1.2.3.4") == "x402gw.fee-guard:cooling:{ip:1.2.3.4}"
    assert keys.fee_guard_in_flight("account", "A") == "x402gw.fee-guard:in-flight:{acct:A}"
    assert keys.fee_guard_funds("A") == "x402gw.fee-guard:funds:{acct:A}"
    assert keys.fee_guard_counted("payer", "S1") == "x402gw.fee-guard:counted:{payer:S1}"
    assert keys.facilitator_down("ours") == "{x402gw}:facilitator-down:ours"
    assert keys.fee_payer("solana:x", "https://f.example") == "{x402gw:fee-payer:solana:x:https://f.example}"
    assert keys.credit_balance("W1") == "x402gw.credit:{w:W1}"
    assert keys.credit_holds("W1") == "x402gw.credit-holds:{w:W1}"
    assert keys.credit_lapse("W1") == "x402gw.credit-lapse:{w:W1}"
    assert keys.credit_lapsed("W1") == "x402gw.credit-lapsed:{w:W1}"
    assert keys.credit_lapses() == "{x402gw}:credit-lapses"
    assert keys.credit_sweep() == "{x402gw:credit-sweep}"
    assert keys.ledger_mark("W1") == "x402gw.ledger-mark:{w:W1}"
    assert keys.ledger_restore() == "{x402gw:ledger-restore}"
    assert keys.ledger_checked() == "{x402gw}:ledger-checked"
    assert keys.credit_call("W1", "n0nce") == "x402gw.credit-call:{w:W1}:n0nce"
    assert keys.credit_session("W1", DIGEST) == f"x402gw.credit-session:{{w:W1}}:{DIGEST}"
    assert keys.settlement(DIGEST) == f"x402gw.svm:settle:{{p:{DIGEST}}}"
    assert keys.settlement_reported(keys.settlement(DIGEST)) == f"x402gw.svm:settle:{{p:{DIGEST}}}:done"


Family = Callable[..., str]


def _public_functions() -> set[object]:
    return {
        value
        for name, value in vars(keys).items()
        if inspect.isfunction(value) and value.__module__ == keys.__name__ and not name.startswith("_")
    } - {keys.current_name, keys.wallet_tag, keys.ip_tag, keys.budget_tag, keys.fee_guard_party}


def _sample(family: Family) -> str:
    if family is keys.settlement_reported:
        return keys.settlement_reported(keys.settlement(DIGEST))
    return family(*(DIGEST for _ in inspect.signature(family).parameters))


def test_every_family_is_listed_with_its_head_and_in_the_table() -> None:
    doc = keys.__doc__ or ""
    assert set(keys.FAMILIES) == _public_functions()
    for family, head in keys.FAMILIES.items():
        assert _sample(family).startswith(head), family
        name = getattr(family, "__name__", "")
        assert re.search(rf"^{name} ", doc, re.MULTILINE), f"{name} not in the table"


SHARED_HEAD: set[Family] = {keys.settlement, keys.settlement_reported}
"""The one pair whose keys share a head: told apart by the ``:done`` tail behind a digest."""


@pytest.mark.parametrize(
    ("first", "second"),
    [pair for pair in itertools.combinations(keys.FAMILIES, 2) if set(pair) != SHARED_HEAD],
    ids=lambda family: getattr(family, "__name__", ""),
)
def test_no_two_families_can_write_the_same_key(first: Family, second: Family) -> None:
    """Every key of a family starts with its head, so two families whose heads are not one the
    start of the other differ within the shorter head, whatever their arguments."""
    a, b = keys.FAMILIES[first], keys.FAMILIES[second]
    assert not a.startswith(b) and not b.startswith(a)


def test_a_settlement_and_its_reported_marker_never_share_a_key() -> None:
    """Both are named after a hex digest (no colon): the settlement's key has nothing after it,
    the marker's always ``:done``, so neither can be the other for any two payments."""
    head = keys.FAMILIES[keys.settlement] + "{p:"
    settled = keys.settlement(DIGEST)
    reported = keys.settlement_reported(settled)
    assert ":" not in settled.removeprefix(head)
    assert ":" in reported.removeprefix(head)
    assert re.fullmatch(r"[0-9a-f]{64}\}", settled.removeprefix(head))


SPREAD: set[Family] = {
    keys.limit_window,
    keys.usage,
    keys.fee_payer,
    keys.credit_sweep,
    keys.ledger_restore,
}
"""The families only ever touched one key at a time, or in batches of independent keys
(``incr``/``counters``/``add_counts``: one pipeline per node on a cluster): each key is its own tag."""


def test_the_spread_families_are_the_ones_the_migration_renames() -> None:
    assert {keys.FAMILIES[family] for family in SPREAD} == {
        "{x402gw:" + family for family in keys.SPREAD_FAMILIES
    }


def _slots(*names: str) -> set[int]:
    return {key_slot(name.encode()) for name in names}


@pytest.mark.parametrize("wallet", ["W1", "{W}", "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin"], ids=str)
def test_what_one_atomic_step_touches_hashes_to_one_slot(wallet: str) -> None:
    """Each script runs over keys of one slot: a wallet's payments, identifiers, nonces, calls,
    credit, sessions, ledger mark, own buckets and fee-guard records (a payment's claim, a
    top-up's delivery with its credit, a sign-in with its hold, a session's spend); a client
    IP's buckets and records; a budget with the shares of it and their marks, whoever the
    subject; a token account's places and funds; a settlement and its report. Braces in an
    argument change nothing: only the first tag counts, and it comes before them."""
    ip, budget = "203.0.113.7", "tokens:upstream-key"
    assert len(_slots(
        keys.payment_claim(wallet, DIGEST), keys.pending_settlement(wallet, DIGEST),
        keys.delivery(wallet, DIGEST), keys.payment_id(wallet, "order-7"),
        keys.sign_in_nonce(wallet, "n"), keys.rate_bucket("rpc:wallet", keys.wallet_tag(wallet)),
        keys.rate_bucket("payments-refused:payer", keys.wallet_tag(wallet)),
        keys.fee_guard_record("owner", wallet), keys.fee_guard_cooldown("owner", wallet),
        keys.fee_guard_in_flight("owner", wallet), keys.credit_balance(wallet), keys.credit_holds(wallet),
        keys.credit_lapse(wallet), keys.credit_lapsed(wallet), keys.ledger_mark(wallet),
        keys.credit_call(wallet, "n"), keys.credit_session(wallet, DIGEST),
    )) == 1
    assert len(_slots(
        keys.rate_bucket("x:ip", keys.ip_tag(ip)), keys.fee_guard_cooldown("ip", ip),
        keys.fee_guard_record("ip", ip), keys.fee_guard_in_flight("ip", ip),
    )) == 1
    assert len(_slots(
        keys.rate_bucket(budget), keys.rate_bucket("tokens:wallet", keys.wallet_tag(wallet), budget),
        keys.rate_bucket("tokens:ip", keys.ip_tag(ip), budget), keys.rate_contention("tokens:wallet", budget),
        keys.rate_contention("tokens:ip", budget),
    )) == 1
    assert len(_slots(
        keys.fee_guard_in_flight("account", wallet), keys.fee_guard_funds(wallet),
        keys.fee_guard_cooldown("account", wallet),
    )) == 1
    assert len(_slots(keys.settlement(DIGEST), keys.settlement_reported(keys.settlement(DIGEST)))) == 1


def test_wallets_clients_budgets_and_payments_spread_over_the_slots() -> None:
    """So a cluster's masters share the per-call work: each wallet's state on its slot, each
    IP's, each budget's, each settlement's."""
    wallets = _slots(*(keys.payment_claim(f"W{n}", DIGEST) for n in range(64)))
    ips = _slots(*(keys.rate_bucket("rpc", keys.ip_tag(f"203.0.113.{n}")) for n in range(64)))
    budgets = _slots(*(keys.rate_bucket(f"provider{n}:rpc") for n in range(64)))
    settlements = _slots(*(keys.settlement(f"{n:064x}") for n in range(64)))
    assert min(len(wallets), len(ips), len(budgets), len(settlements)) > 50


def test_each_key_of_a_spread_family_is_its_own_tag_and_they_spread_over_the_slots() -> None:
    """So their load (a usage flush, the limit windows of every client, the facilitators' marks)
    is shared by every master of a cluster rather than the gateway's one slot."""
    for family in SPREAD:
        key = _sample(family)
        assert key.startswith("{") and key.endswith("}") and key.count("}") == 1, key
        assert key_slot(key.encode()) == key_slot(key[1:-1].encode())
    windows = {key_slot(keys.limit_window("ip", f"203.0.113.{n}", 1000).encode()) for n in range(64)}
    usage = {key_slot(keys.usage(f"route{n}", "paid").encode()) for n in range(64)}
    assert len(windows) > 50 and len(usage) > 50
    assert key_slot(keys.usage("{r}", "paid").encode()) == key_slot(keys.usage("{r}", "paid").encode())


PER_WALLET: set[Family] = {
    keys.credit_balance,
    keys.credit_holds,
    keys.credit_lapse,
    keys.credit_lapsed,
    keys.ledger_mark,
    keys.credit_call,
    keys.credit_session,
}
"""The families of one wallet's credit: every credit script but the lapse index's touches these of
one wallet only, so a tag per wallet (the sharding to come) changes these functions and no caller."""


def test_every_wallets_credit_key_is_a_function_of_its_wallet() -> None:
    for family in PER_WALLET:
        rest = [DIGEST] * (len(inspect.signature(family).parameters) - 1)
        one, other = family("W1", *rest), family("W2", *rest)
        assert "W1" in one and one != other and one.replace("W1", "W2") == other, family


def test_the_release_befores_shared_credit_keys_are_no_family_any_more() -> None:
    """The lapsed hash and the one ledger mark were read by every top-up of every wallet: they
    are only names the migration reads now, and no current key can be one of them."""
    for legacy in (keys.LEGACY_CREDIT_LAPSED, keys.LEGACY_LEDGER_MARK):
        assert legacy not in keys.FAMILIES.values()
        for family in keys.FAMILIES:
            assert _sample(family) != legacy


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("x402gw:usage:getSlot:paid", "{x402gw:usage:getSlot:paid}"),
        ("{x402gw}:usage:getSlot:paid", "{x402gw:usage:getSlot:paid}"),
        ("{x402gw}:rlw:challenge:ip:1.2.3.4:7", "{x402gw:rlw:challenge:ip:1.2.3.4:7}"),
        ("{x402gw}:credit-sweep", "{x402gw:credit-sweep}"),
        ("x402gw:credit:W1", "x402gw.credit:{w:W1}"),
        ("{x402gw}:credit:W1", "x402gw.credit:{w:W1}"),
        ("{x402gw}:credit-holds:W1", "x402gw.credit-holds:{w:W1}"),
        ("{x402gw}:credit-holds:W1:taken:t1", "x402gw.credit-holds:{w:W1}:taken:t1"),
        ("{x402gw}:credit-call:W1:n0nce", "x402gw.credit-call:{w:W1}:n0nce"),
        ("{x402gw}:fee-guard:cooling:ip:1.2.3.4", "x402gw.fee-guard:cooling:{ip:1.2.3.4}"),
        ("{x402gw}:fee-guard:in-flight:account:A", "x402gw.fee-guard:in-flight:{acct:A}"),
        ("{x402gw}:fee-guard:funds:A", "x402gw.fee-guard:funds:{acct:A}"),
        ("{x402gw}:fee-guard:counted:client:S", "x402gw.fee-guard:counted:{client:S}"),
        ("{x402gw}:svm:settle:" + DIGEST, f"x402gw.svm:settle:{{p:{DIGEST}}}"),
        ("x402:svm:settle:" + DIGEST + ":done", f"x402gw.svm:settle:{{p:{DIGEST}}}:done"),
        ("{x402gw}:siwx:n0nce", None),
        ("{x402gw}:pay:" + DIGEST, None),
        ("{x402gw}:credit-lapses", None),
        ("{x402gw:usage:getSlot:paid}", None),
        ("another-app:usage:x", None),
    ],
)
def test_a_key_an_earlier_release_wrote_has_its_current_name(old: str, new: str | None) -> None:
    assert keys.current_name(old) == new


def test_a_sign_in_nonce_is_named_after_the_wallet_its_value_names() -> None:
    assert keys.current_name("{x402gw}:siwx:n0nce", "W1") == "x402gw.siwx:{w:W1}:n0nce"
    assert keys.current_name("x402gw:siwx:n0nce", "W1") == "x402gw.siwx:{w:W1}:n0nce"
