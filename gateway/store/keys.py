"""Every key the gateway keeps in the shared store, spelled here and nowhere else.

A Redis Cluster runs a script only over keys of one slot, the slot of their hash tag (the text
in a key's first braces). So each key is named after whose it is, and what one script touches
shares that tag (``docs/store.md``: the steps of a request, the invariants across slots, the
capacity): ``x402gw.<family>:{<tag>}...``, the tag a wallet's (``w:``: its payments as payer,
identifiers, nonces, calls, credit, sessions, own buckets, fee-guard records as a payer owner),
a client IP's (``ip:``: its own buckets and fee-guard records), a shared budget's (``rl:``: the
budget, every share of it and their contention marks), a token account's (``acct:``) or a
payment's (``p:``: the internal facilitator's settlement and its report). The keys shared by
everyone (the lapse index, the ledger check, the facilitators' marks) are under ``{x402gw}:``,
touched in steps of their own; the families only ever touched one key at a time, or in batches
of independent keys, are each key its own tag, whole: ``{x402gw:usage:getSlot:paid}``. The tag
comes before any argument, so braces in an argument never move a key off its tag. No family's
head is the start of another's, so no two families can share a key; the one exception is a
settlement's ``:done`` marker, told apart from the settlement by its tail behind a fixed-length
digest (``tests/test_store_keys.py`` checks both).

A key's name is part of the store's format: replicas of two releases that name a family
differently do not see each other's claims, buckets or credit (a payment claimed under the old
name could be claimed again under the new). A release that renames keys therefore needs the
upgrade ``docs/store.md`` describes, not a rolling deploy; ``current_name`` maps each old name
to its new one where the name (or the value) says whose it is.

Under ``x402gw.``, on the tag named (``{w}``: a wallet's; ``{ip}``, ``{rl}``, ``{acct}``, ``{p}``):

===================  =================================  ==========================  ==========================
function             key                                value                       lives
===================  =================================  ==========================  ==========================
payment_claim        pay:{w}:{payment key}              claimant: {route} {random}  15 min, or until refused
pending_settlement   pending:{w}:{payment key}          write-ahead intent (JSON)   15 min; closed at delivery
delivery             delivered:{w}:{payment key}        delivered request, answer   10 min
payment_id           pid:{w}:{identifier}               request fingerprint (JSON)  10 min
sign_in_nonce        siwx:{w}:{nonce}                   the signed-in wallet        while the nonce verifies
rate_bucket          rl:{rl|w|ip}[:{scope}[:{subj}]]    GCRA arrival time           till the bucket refills
rate_contention      rl-contended:{rl}:{share scope}    subjects refused -> when    a period of the budget
fee_guard_record     fee-guard:settled:{w|ip|acct}      settlements landed          10 min
fee_guard_cooldown   fee-guard:cooling:{w|ip|acct}      1                           10 min
fee_guard_in_flight  fee-guard:in-flight:{w|ip|acct}    holds: token -> 1           each hold's TTL
fee_guard_funds      fee-guard:funds:{acct}             holds: token -> amount      each hold's TTL
fee_guard_counted    fee-guard:counted:{side:sig}       1: its outcome was counted  30 min
credit_balance       credit:{w}                         micro-USDC (counter)        lapse + grace after top-up
credit_holds         credit-holds:{w}                   holds: token -> amount      each hold's TTL
credit_lapse         credit-lapse:{w}                   when it lapses (Unix ms)    as the balance
credit_lapsed        credit-lapsed:{w}                  lapsed credit (counter)     till the sweeper counts it
ledger_mark          ledger-mark:{w}                    newest top-up's journal id  as the balance
credit_call          credit-call:{w}:{call id}          call, its answer (JSON)     hold's TTL, then sign-in's
credit_session       credit-session:{w}:{digest}        wallet, cap, spent (hash)   the session's lifetime
settlement           svm:settle:{p}                     settlement record (JSON)    15 min
settlement_reported  svm:settle:{p}:done                its signature               15 min
===================  =================================  ==========================  ==========================

Under ``{x402gw}:``, shared by everyone:

===================  =================================  ==========================  ==========================
function             key                                value                       lives
===================  =================================  ==========================  ==========================
facilitator_down     facilitator-down:{name}            1 while down                30 s
credit_lapses        credit-lapses                      wallet -> lapse time (ms)   till the sweeper drops it
ledger_checked       ledger-checked                     1: checked against ledger   ten years
===================  =================================  ==========================  ==========================

Each ``{x402gw:<key>}``, its own tag whole (so the keys spread over a cluster's slots):

===================  =================================  ==========================  ==========================
function             key                                value                       lives
===================  =================================  ==========================  ==========================
limit_window         rlw:{scope}:{subject}:{n}          admissions (counter)        two windows + 1 s
usage                usage:{route}:{outcome}            requests (counter)          forever
fee_payer            fee-payer:{network}:{url}          the advertised fee payer    30 days
credit_sweep         credit-sweep                       the sweeping replica        one sweep, 60 s at most
ledger_restore       ledger-restore                     the restoring replica       one restore, 60 s at most
===================  =================================  ==========================  ==========================

``{payment key}`` and the settlement's ``{p}`` are the same hex SHA-256 of a transaction's message.
The TTLs are set by the writers (named in each function's docstring); this table says how long
each lives with the defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final

_GATEWAY: Final = "{x402gw}:"
_FACILITATOR: Final = _GATEWAY + "svm:"
_SPREAD: Final = "{x402gw:"
_SHARDED: Final = "x402gw."
"""The root of the families sharded by a tag inside the key: ``x402gw.<family>:{<tag>}...``, the
tag being the wallet (``w:``), client IP (``ip:``), budget (``rl:``), token account (``acct:``)
or payment (``p:``) whose keys a script touches together (:func:`wallet_tag` and friends)."""
"""The head of a key that is its own hash tag, whole: ``{x402gw:<family>:<arguments>}``."""
LEGACY_ROOTS: Final = {"x402gw:": _GATEWAY, "x402:svm:": _FACILITATOR}
"""The roots before the hash tag, each with the root that replaced it: nothing writes under them;
``gateway.store.migrate`` renames what a store still holds there (to :func:`current_name`)."""
SPREAD_FAMILIES: Final = (
    "rlw:",
    "usage:",
    "fee-payer:",
    "credit-sweep",
    "ledger-restore",
)
"""The families each of whose keys is its own tag (so they spread over a cluster's slots), as
they were spelled under the one-slot root by the release before (``{x402gw}:usage:...``) and the
untagged one before it (``x402gw:usage:...``)."""
SPREAD_RENAMED: Final = tuple(_GATEWAY + family + "*" for family in SPREAD_FAMILIES)
"""SCAN patterns matching the spread families' keys under the one-slot root (all on its slot)."""
SHARDED_FAMILIES: Final = (
    "credit:",
    "credit-holds:",
    "credit-call:",
    "fee-guard:",
    "svm:settle:",
    "siwx:",
)
"""The families the release that kept every key on one slot named under it (``{x402gw}:credit:W``)
that are now named on their wallet's, IP's, token account's or payment's tag, and can be renamed:
their name (or, for a sign-in nonce, its value: the wallet) says which. Its payments, identifiers
and buckets cannot (their payer or subject is not in the name); they expire within 15 minutes."""
SHARDED_RENAMED: Final = tuple(_GATEWAY + family + "*" for family in SHARDED_FAMILIES)
"""SCAN patterns matching those keys under the one-slot root (all on its slot)."""
ONE_SLOT_RENAMED: Final = (*SPREAD_RENAMED, *SHARDED_RENAMED)
OLD_NONCES: Final = tuple(root + "siwx:" for root in ("x402gw:", _GATEWAY))
"""The heads of sign-in nonces of the untagged and the one-slot releases: named anew after their
value, the wallet that signed in (:func:`current_name`)."""
ONE_SLOT_INTENTS: Final = _GATEWAY + "pending:*"
"""SCAN pattern of the one-slot release's write-ahead intents (``gateway.store.migrate`` reports
the open ones: they cannot be named anew)."""
"""Every key the one-slot release left that has a name now (on a cluster: all on its slot)."""
RENAMED: Final = (*(root + "*" for root in LEGACY_ROOTS), *ONE_SLOT_RENAMED)
"""SCAN patterns matching every key an earlier release named otherwise (:func:`current_name`)."""

PAYMENT_CLAIM: Final = _SHARDED + "pay:"
PENDING_SETTLEMENT: Final = _SHARDED + "pending:"
DELIVERY: Final = _SHARDED + "delivered:"
PAYMENT_ID: Final = _SHARDED + "pid:"
SIGN_IN_NONCE: Final = _SHARDED + "siwx:"
RATE_BUCKET: Final = _SHARDED + "rl:"
RATE_CONTENTION: Final = _SHARDED + "rl-contended:"
LIMIT_WINDOW: Final = _SPREAD + "rlw:"
USAGE: Final = _SPREAD + "usage:"
FEE_GUARD_RECORD: Final = _SHARDED + "fee-guard:settled:"
FEE_GUARD_COOLDOWN: Final = _SHARDED + "fee-guard:cooling:"
FEE_GUARD_IN_FLIGHT: Final = _SHARDED + "fee-guard:in-flight:"
FEE_GUARD_FUNDS: Final = _SHARDED + "fee-guard:funds:"
FEE_GUARD_COUNTED: Final = _SHARDED + "fee-guard:counted:"
FACILITATOR_DOWN: Final = _GATEWAY + "facilitator-down:"
FEE_PAYER: Final = _SPREAD + "fee-payer:"
CREDIT_BALANCE: Final = _SHARDED + "credit:"
CREDIT_HOLDS: Final = _SHARDED + "credit-holds:"
CREDIT_LAPSE: Final = _SHARDED + "credit-lapse:"
CREDIT_LAPSED: Final = _SHARDED + "credit-lapsed:"
CREDIT_LAPSES: Final = _GATEWAY + "credit-lapses"
CREDIT_SWEEP: Final = _SPREAD + "credit-sweep"
LEDGER_MARK: Final = _SHARDED + "ledger-mark:"
LEDGER_CHECKED: Final = _GATEWAY + "ledger-checked"
LEDGER_RESTORE: Final = _SPREAD + "ledger-restore"
CREDIT_CALL: Final = _SHARDED + "credit-call:"
CREDIT_SESSION: Final = _SHARDED + "credit-session:"
SETTLEMENT: Final = _SHARDED + "svm:settle:"
_REPORTED_TAIL: Final = ":done"

LEGACY_CREDIT_LAPSED: Final = _GATEWAY + "credit-lapsed"
"""The release before per-wallet credit kept the credit top-ups found lapsed in this one hash
(wallet -> amount); ``gateway.store.migrate`` moves it to :func:`credit_lapsed`."""
LEGACY_LEDGER_MARK: Final = _GATEWAY + "ledger-mark"
"""That release's one ledger mark for every wallet (:func:`ledger_mark` is per wallet now):
``gateway.store.migrate`` deletes it."""
LEGACY_CREDIT_SESSIONS: Final = _GATEWAY + "credit-session:*"
"""SCAN pattern of that release's sessions, keyed by the token's digest alone (no wallet in the
name): nothing can name them anew without their token, so ``gateway.store.migrate`` ends them."""


def _spread(key: str) -> str:
    """Close a key of a spread family: the whole key between its braces is its tag, so its slot is
    its own (braces in an argument end the tag early: the key still has one slot, always the same)."""
    return key + "}"


def current_name(old: str, value: str | None = None) -> str | None:
    """The name a key written by an earlier release has now (``gateway.store.migrate``), or None
    when it has kept its name, is no gateway key, or cannot be named anew (a sign-in nonce
    without its ``value``, the wallet; a payment, whose payer its name does not say)."""
    for old_root, root in LEGACY_ROOTS.items():
        if old.startswith(old_root):
            rest = old.removeprefix(old_root)
            return current_name(root + rest, value) or root + rest
    rest = old.removeprefix(_GATEWAY)
    if rest == old:
        return None
    if rest.startswith(SPREAD_FAMILIES):
        return _spread(_SPREAD + rest)
    return _sharded_name(rest, value)


def _sharded_name(rest: str, value: str | None) -> str | None:
    """The tagged name of a one-slot key (``rest``: its name after the root), if it has one."""
    family, _, args = rest.partition(":")
    first, _, tail = args.partition(":")
    if family == "credit":
        return credit_balance(args)
    if family == "credit-holds":
        return credit_holds(first) + (":" + tail if tail else "")  # a taken mark keeps its tail
    if family == "credit-call" and tail:
        return credit_call(first, tail)
    if family == "siwx":
        return None if not value else sign_in_nonce(value, args)
    if family == "svm" and first == "settle":
        digest = tail.removesuffix(_REPORTED_TAIL)
        return settlement(digest) if digest == tail else settlement_reported(settlement(digest))
    if family != "fee-guard" or not tail:
        return None
    guard = {"settled": fee_guard_record, "cooling": fee_guard_cooldown, "in-flight": fee_guard_in_flight}
    kind, _, party = tail.partition(":")
    if first in guard and party:
        return guard[first](kind, party)
    if first == "funds":
        return fee_guard_funds(tail)
    return fee_guard_counted(kind, party) if first == "counted" and party else None


def wallet_tag(wallet: str) -> str:
    """A wallet's tag: its payments, nonces, calls, credit and own buckets share its slot."""
    return "w:" + wallet


def ip_tag(ip: str) -> str:
    """A client IP's tag (an IPv6 client's prefix): its own buckets and fee-guard keys."""
    return "ip:" + ip


def budget_tag(scope: str) -> str:
    """A shared budget's tag: the budget, the shares of it and their contention marks."""
    return "rl:" + scope


def _on(tag: str) -> str:
    return "{" + tag + "}"


def payment_claim(payer: str, payment_key: str) -> str:
    """The claim on a payment, on its payer's slot (``gateway.methods.exact.ledger``)."""
    return f"{PAYMENT_CLAIM}{_on(wallet_tag(payer))}:{payment_key}"


def pending_settlement(payer: str, payment_key: str) -> str:
    """The write-ahead record of a payment's settlement (``gateway.methods.exact.ledger``)."""
    return f"{PENDING_SETTLEMENT}{_on(wallet_tag(payer))}:{payment_key}"


def delivery(payer: str, payment_key: str) -> str:
    """The one delivery of a settled payment (``gateway.methods.exact.ledger``)."""
    return f"{DELIVERY}{_on(wallet_tag(payer))}:{payment_key}"


def payment_id(payer: str, identifier: str) -> str:
    """A payment identifier's request, among its payer's (``gateway.methods.exact.ledger``)."""
    return f"{PAYMENT_ID}{_on(wallet_tag(payer))}:{identifier}"


def sign_in_nonce(wallet: str, nonce: str) -> str:
    """A nonce the wallet signed in with (``gateway.methods.sign_in``)."""
    return f"{SIGN_IN_NONCE}{_on(wallet_tag(wallet))}:{nonce}"


def rate_bucket(scope: str, subject: str | None = None, budget: str | None = None) -> str:
    """A route limit's bucket: the scope's shared budget (no ``subject``), or one client's within
    it (``subject``: its :func:`wallet_tag` or :func:`ip_tag`), on the client's slot, or on the
    ``budget``'s when it is a share of that budget (``gateway.limits.rate_limiter``)."""
    if subject is None:
        return RATE_BUCKET + _on(budget_tag(scope))
    if budget is None:
        return f"{RATE_BUCKET}{_on(subject)}:{scope}"
    return f"{RATE_BUCKET}{_on(budget_tag(budget))}:{scope}:{subject}"


def rate_contention(scope: str, budget: str) -> str:
    """A share scope's contention mark, on its budget's slot: the latest subjects the budget
    refused (``gateway.store.base.Share``)."""
    return f"{RATE_CONTENTION}{_on(budget_tag(budget))}:{scope}"


def limit_window(scope: str, subject: str, window: int) -> str:
    """A subject's admissions in one window of a limit decided in the process
    (``gateway.limits.synced``)."""
    return _spread(f"{LIMIT_WINDOW}{scope}:{subject}:{window}")


def usage(route: str, outcome: str) -> str:
    """A route's requests of one outcome, across replicas (``gateway.telemetry.metrics``)."""
    return _spread(f"{USAGE}{route}:{outcome}")


def fee_guard_party(kind: str, party: str) -> str:
    """The tag of a party to settlements: a payer owner is a wallet, a client an IP, a token
    account its own (``gateway.methods.exact.fee_guard``)."""
    if kind == "owner":
        return wallet_tag(party)
    return ip_tag(party) if kind == "ip" else "acct:" + party


def fee_guard_record(kind: str, party: str) -> str:
    """A party's settlements that landed recently (``gateway.methods.exact.fee_guard``)."""
    return FEE_GUARD_RECORD + _on(fee_guard_party(kind, party))


def fee_guard_cooldown(kind: str, party: str) -> str:
    """A party cooling down after a failed settlement (``gateway.methods.exact.fee_guard``)."""
    return FEE_GUARD_COOLDOWN + _on(fee_guard_party(kind, party))


def fee_guard_in_flight(kind: str, party: str) -> str:
    """A party's settlements in flight (``gateway.methods.exact.fee_guard``)."""
    return FEE_GUARD_IN_FLIGHT + _on(fee_guard_party(kind, party))


def fee_guard_funds(account: str) -> str:
    """The amounts in flight from one token account (``gateway.methods.exact.fee_guard``)."""
    return FEE_GUARD_FUNDS + _on(fee_guard_party("account", account))


def fee_guard_counted(side: str, signature: str) -> str:
    """A settlement's outcome counted for one side of its parties (``payer``: owner and token
    account; ``client``: the IP), claimed by whoever counts it (``gateway.methods.exact.fee_guard``)."""
    return f"{FEE_GUARD_COUNTED}{_on(side + ':' + signature)}"


def facilitator_down(name: str) -> str:
    """A facilitator marked down by some replica (``gateway.facilitators.health``)."""
    return FACILITATOR_DOWN + name


def fee_payer(network: str, facilitator_url: str) -> str:
    """The fee payer a facilitator last advertised (``gateway.facilitators.http``)."""
    return _spread(f"{FEE_PAYER}{network}:{facilitator_url}")


def credit_balance(wallet: str) -> str:
    """A wallet's prepaid credit, the operator's liability (``gateway.methods.credit.book``)."""
    return CREDIT_BALANCE + _on(wallet_tag(wallet))


def credit_holds(wallet: str) -> str:
    """The credit held by a wallet's calls in flight (``gateway.methods.credit.book``)."""
    return CREDIT_HOLDS + _on(wallet_tag(wallet))


def credit_lapse(wallet: str) -> str:
    """When a wallet's credit lapses (Unix ms on the store's clock), written with its balance by
    each top-up: the truth every credit script reads (``gateway.methods.credit.book``)."""
    return CREDIT_LAPSE + _on(wallet_tag(wallet))


def credit_lapsed(wallet: str) -> str:
    """Credit a top-up of the wallet found lapsed, until the sweeper counts it
    (``gateway.methods.credit.lapse``)."""
    return CREDIT_LAPSED + _on(wallet_tag(wallet))


def credit_lapses() -> str:
    """The lapse index, shared by every wallet: the sweeper's hint of which wallets to visit when,
    scored no later than each one's lapse time (``gateway.methods.credit.lapse``)."""
    return CREDIT_LAPSES


def credit_sweep() -> str:
    """The claim of the one replica sweeping lapsed credit (``gateway.methods.credit.lapse``)."""
    return _spread(CREDIT_SWEEP)


def credit_call(wallet: str, call_id: str) -> str:
    """One call on a wallet's credit, named by its call id (a sign-in's nonce), and the answer it
    was charged for (``gateway.methods.credit.calls``)."""
    return f"{CREDIT_CALL}{_on(wallet_tag(wallet))}:{call_id}"


def credit_session(wallet: str, digest: str) -> str:
    """A credit session of ``wallet``: its wallet, signed cap and credit spent so far, under the
    SHA-256 of its origin and token, never the token itself (``gateway.methods.credit.sessions``)."""
    return f"{CREDIT_SESSION}{_on(wallet_tag(wallet))}:{digest}"


def ledger_mark(wallet: str) -> str:
    """How far into the ledger a wallet's credit goes: the journal id of the newest top-up booked
    for it, raised in the step that books each one. Behind the ledger, the store lost that
    wallet's credit and what the ledger says is owed must be restored (``gateway.ledger.restore``)."""
    return LEDGER_MARK + _on(wallet_tag(wallet))


def ledger_checked() -> str:
    """Set once the store was checked against the ledger (or restored from it). Absent, the store
    is new, flushed or replaced, and everything the ledger says is owed is restored to it at once,
    without waiting for a top-up's booking to settle (``gateway.ledger.restore``)."""
    return LEDGER_CHECKED


def ledger_restore() -> str:
    """The claim of the one replica restoring the store from the ledger (``gateway.ledger.restore``)."""
    return _spread(LEDGER_RESTORE)


def settlement(message_hash: str) -> str:
    """The internal facilitator's record of one payment (``gateway.facilitators.local``), on a
    slot of its own with its :func:`settlement_reported`."""
    return SETTLEMENT + _on("p:" + message_hash)


def settlement_reported(settlement_key: str) -> str:
    """The one ``success`` answer of a settlement, claimed by one of the settles watching it;
    named after the settlement's own key (:func:`settlement`)."""
    return settlement_key + _REPORTED_TAIL


FAMILIES: Final[Mapping[Callable[..., str], str]] = {
    payment_claim: PAYMENT_CLAIM,
    pending_settlement: PENDING_SETTLEMENT,
    delivery: DELIVERY,
    payment_id: PAYMENT_ID,
    sign_in_nonce: SIGN_IN_NONCE,
    rate_bucket: RATE_BUCKET,
    rate_contention: RATE_CONTENTION,
    limit_window: LIMIT_WINDOW,
    usage: USAGE,
    fee_guard_record: FEE_GUARD_RECORD,
    fee_guard_cooldown: FEE_GUARD_COOLDOWN,
    fee_guard_in_flight: FEE_GUARD_IN_FLIGHT,
    fee_guard_funds: FEE_GUARD_FUNDS,
    fee_guard_counted: FEE_GUARD_COUNTED,
    facilitator_down: FACILITATOR_DOWN,
    fee_payer: FEE_PAYER,
    credit_balance: CREDIT_BALANCE,
    credit_holds: CREDIT_HOLDS,
    credit_lapse: CREDIT_LAPSE,
    credit_lapsed: CREDIT_LAPSED,
    credit_lapses: CREDIT_LAPSES,
    credit_sweep: CREDIT_SWEEP,
    ledger_mark: LEDGER_MARK,
    ledger_checked: LEDGER_CHECKED,
    ledger_restore: LEDGER_RESTORE,
    credit_call: CREDIT_CALL,
    credit_session: CREDIT_SESSION,
    settlement: SETTLEMENT,
    settlement_reported: SETTLEMENT,
}
"""Each family and the head every one of its keys starts with."""
