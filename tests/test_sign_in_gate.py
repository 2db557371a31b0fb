"""The sign-in core in-process: single use, own buckets before the shared key, nothing spent
by a refused sign-in. Over the in-process store and Redis; real ed25519 addresses."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from solders.keypair import Keypair

from gateway.limits.rate_limiter import RateLimiter
from gateway.methods.credit.book import CreditBook
from gateway.methods.credit.calls import StillInFlight, credit_call
from gateway.methods.sign_in import Admitted, Limited, Replayed, SignInGate, Uncovered
from gateway.routing.routes import RateLimitSpec
from gateway.store import Share, Store, keys
from gateway.store.claims import claim_then_put
from gateway.store.memory import MemoryStore
from gateway.store.redis import RedisStore
from gateway.x402.siwx import VerifiedSignIn

KEY = RateLimitSpec(scope="tokens:upstream-key", limit=4, period_ms=60_000)
WALLET_SHARE = RateLimitSpec(scope="tokens:wallet", limit=2, period_ms=60_000, per="wallet")
IP_SHARE = RateLimitSpec(scope="tokens:ip", limit=2, period_ms=60_000, per="ip")
FLOODER, OTHERS = "203.0.113.66", ["198.51.100.1", "198.51.100.2", "198.51.100.3"]


@pytest_asyncio.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    backend: Store = (
        MemoryStore() if request.param == "memory" else RedisStore(request.getfixturevalue("clean_redis_url"))
    )
    try:
        yield backend
    finally:
        await backend.close()


def _gate(store: Store) -> SignInGate:
    return SignInGate(store, RateLimiter(store), (KEY, WALLET_SHARE, IP_SHARE))


def _signed(wallet: Keypair | None = None) -> VerifiedSignIn:
    now = time.time()
    return VerifiedSignIn(
        address=str((wallet or Keypair()).pubkey()),
        chain_id="solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp",
        nonce=secrets.token_hex(16),
        issued_at=now,
        expires_at=now + 300,
        replay_ttl_ms=330_000,
    )


def _scope(admission: object) -> str:
    assert isinstance(admission, Limited), admission
    assert admission.error.details is not None
    return str(admission.error.details["scope"])


async def test_a_sign_in_is_admitted_once_and_its_replay_is_refused(store: Store) -> None:
    gate = _gate(store)
    signed = _signed()

    assert isinstance(await gate.admit(signed, FLOODER), Admitted)
    assert isinstance(await gate.admit(signed, OTHERS[0]), Replayed)
    assert await store.get(keys.sign_in_nonce(signed.address, signed.nonce)) == signed.address


async def test_throwaway_wallets_from_one_ip_take_only_that_ips_share_of_the_key(store: Store) -> None:
    gate = _gate(store)
    flood = [await gate.admit(_signed(), FLOODER) for _ in range(30)]

    assert sum(isinstance(a, Admitted) for a in flood) == IP_SHARE.limit
    assert {_scope(a) for a in flood if not isinstance(a, Admitted)} == {"tokens:ip"}
    # What is left of the key's budget is there for everybody else.
    others = [await gate.admit(_signed(), ip) for ip in OTHERS]
    assert [isinstance(a, Admitted) for a in others] == [True, True, False]
    assert _scope(others[2]) == "tokens:upstream-key"


async def test_one_wallet_from_many_ips_takes_only_its_share(store: Store) -> None:
    gate = _gate(store)
    wallet = Keypair()
    admissions = [await gate.admit(_signed(wallet), ip) for ip in [*OTHERS, FLOODER]]

    assert [isinstance(a, Admitted) for a in admissions] == [True, True, False, False]
    assert {_scope(a) for a in admissions[2:]} == {"tokens:wallet"}
    assert isinstance(await gate.admit(_signed(), FLOODER), Admitted)  # the key still had room


async def test_a_sign_in_refused_by_a_limit_keeps_its_nonce_and_spends_nothing_shared(store: Store) -> None:
    gate = _gate(store)
    wallet = Keypair()
    for ip in OTHERS[:2]:
        assert isinstance(await gate.admit(_signed(wallet), ip), Admitted)
    refused = _signed(wallet)

    for _ in range(5):
        assert _scope(await gate.admit(refused, OTHERS[2])) == "tokens:wallet"

    assert await store.get(keys.sign_in_nonce(refused.address, refused.nonce)) is None
    others = [await gate.admit(_signed(), ip) for ip in (FLOODER, OTHERS[2])]
    assert all(isinstance(a, Admitted) for a in others)  # the key's last two slots were untouched


async def test_a_sign_in_paid_from_credit_holds_its_price_in_the_same_step(store: Store) -> None:
    """The credit is checked before any bucket: a wallet short of it spends nothing shared and
    keeps its nonce; one that has it is admitted with the price held."""
    gate = _gate(store)
    wallet = Keypair()
    signed = _signed(wallet)
    book = CreditBook(store, lapse_days=1, upstream_timeout_s=1.0)

    short = [await gate.admit(signed, FLOODER, book.order(signed.address, 5)) for _ in range(10)]

    assert all(isinstance(a, Uncovered) for a in short)
    assert await store.get(keys.sign_in_nonce(signed.address, signed.nonce)) is None
    assert isinstance(await gate.admit(_signed(), FLOODER), Admitted)  # the IP's share is untouched
    assert await claim_then_put(store, [], [], book.credits(signed.address, 5)) == 0
    order = book.order(signed.address, 5)
    admitted = await gate.admit(signed, FLOODER, order)
    assert isinstance(admitted, Admitted) and admitted.held is not None
    assert (admitted.held.balance, admitted.held.held) == (5, 5)
    assert isinstance(await gate.admit(signed, FLOODER, book.order(signed.address, 0)), Replayed)
    state = await book.balance(signed.address)
    assert (state.balance, state.held) == (5, 5)


# --- shares that bind only while others wait for the key ----------------------------------------

SHARED_KEY = RateLimitSpec(scope="tokens:upstream-key", limit=4, period_ms=400)  # a slot every 100 ms
SHARES = tuple(
    RateLimitSpec(scope=f"tokens:{per}", limit=1, period_ms=60_000, per=per, share_of=SHARED_KEY.scope)
    for per in ("wallet", "ip")
)


def _shares_gate(store: Store) -> SignInGate:
    return SignInGate(store, RateLimiter(store), (SHARED_KEY, *SHARES))


async def test_a_lone_wallet_may_use_all_of_the_key_while_nobody_else_waits(store: Store) -> None:
    gate = _shares_gate(store)
    wallet = Keypair()

    admissions = [await gate.admit(_signed(wallet), FLOODER) for _ in range(6)]

    assert [isinstance(a, Admitted) for a in admissions] == [True] * 4 + [False] * 2
    assert {_scope(a) for a in admissions[4:]} == {"tokens:upstream-key"}  # not its share (1)


async def test_once_others_wait_for_the_key_a_flood_of_throwaway_wallets_gets_only_its_ips_share(
    store: Store,
) -> None:
    """The flooder took the whole key while alone; the first sign-in it refuses from another IP
    binds the shares, so each waiting client is admitted at the next free slot (its refused
    sign-in kept its nonce) and the flood from one IP, whatever its wallets, gets none of them."""
    gate = _shares_gate(store)
    alone = [await gate.admit(_signed(), FLOODER) for _ in range(5)]
    assert [isinstance(a, Admitted) for a in alone] == [True] * 4 + [False]
    waiting = {ip: _signed() for ip in OTHERS}
    first = [await gate.admit(signed, ip) for ip, signed in waiting.items()]
    assert {_scope(a) for a in first} == {"tokens:upstream-key"}

    flood: list[object] = []
    deadline = time.monotonic() + 10.0  # a few slots; a loaded machine may take seconds over them
    while waiting and time.monotonic() < deadline:
        flood += [await gate.admit(_signed(), FLOODER) for _ in range(3)]
        for ip, signed in list(waiting.items()):
            if isinstance(await gate.admit(signed, ip), Admitted):
                del waiting[ip]
        await asyncio.sleep(0.01)

    assert not waiting  # all three admitted, each within a few slots of the key
    assert flood and {_scope(a) for a in flood} == {"tokens:ip"}


def test_each_share_is_planned_against_the_requests_budget_and_its_scopes_mark() -> None:
    plan = RateLimiter(MemoryStore()).plan((SHARED_KEY, *SHARES), wallet="W1", ip=FLOODER)

    key = keys.rate_bucket(SHARED_KEY.scope)
    assert [(b.key, b.share) for b in plan.buckets] == [
        (
            keys.rate_bucket("tokens:wallet", keys.wallet_tag("W1"), SHARED_KEY.scope),
            Share(key, keys.rate_contention("tokens:wallet", SHARED_KEY.scope)),
        ),
        (
            keys.rate_bucket("tokens:ip", keys.ip_tag(FLOODER), SHARED_KEY.scope),
            Share(key, keys.rate_contention("tokens:ip", SHARED_KEY.scope)),
        ),
        (key, None),
    ]
    assert plan.shared == (plan.buckets[2],)  # what a refused payment would hand back: not the shares


async def test_a_call_on_credit_is_claimed_with_its_nonce_and_its_hold_in_one_step(store: Store) -> None:
    """The call's record is written with the nonce and the hold, only when both are; a replay of
    the nonce reads it back (the caller tells an identical retry from another request), and a
    sign-in short of credit writes none of the three."""
    gate = _gate(store)
    signed = _signed()
    book = CreditBook(store, lapse_days=1, upstream_timeout_s=1.0)
    call = credit_call("route", signed.address, signed.nonce, b"{}", 31_000)

    short = await gate.admit(signed, FLOODER, book.order(signed.address, 5), call.in_flight())
    assert isinstance(short, Uncovered)
    assert await store.get(call.key) is None
    assert await store.get(keys.sign_in_nonce(signed.address, signed.nonce)) is None
    assert await claim_then_put(store, [], [], book.credits(signed.address, 10)) == 0
    admitted = await gate.admit(signed, FLOODER, book.order(signed.address, 5), call.in_flight())
    replayed = await gate.admit(signed, FLOODER, book.order(signed.address, 5), call.in_flight())
    elsewhere = await gate.admit(signed, FLOODER)  # the nonce spent without a call of its own

    assert isinstance(admitted, Admitted) and admitted.held is not None
    assert await store.get(call.key) == call.in_flight().value
    assert isinstance(replayed, Replayed) and replayed.call == call.in_flight().value
    assert isinstance(call.earlier(replayed.call), StillInFlight)
    assert isinstance(elsewhere, Replayed) and elsewhere.call is None
    state = await book.balance(signed.address)
    assert (state.balance, state.held) == (10, 5)  # the one hold


async def test_a_call_id_is_scoped_by_its_wallet(store: Store) -> None:
    """Two wallets naming the same call id never share a record (a client's own idempotency key
    cannot reach another wallet's answer)."""
    first, second = Keypair(), Keypair()
    assert (
        credit_call("r", str(first.pubkey()), "id", b"", 1).key
        != credit_call("r", str(second.pubkey()), "id", b"", 1).key
    )
    assert (
        credit_call("r", "W", "id", b"a", 1).fingerprint != credit_call("r", "W", "id", b"b", 1).fingerprint
    )
    assert (
        credit_call("r", "W", "id", b"a", 1).fingerprint != credit_call("s", "W", "id", b"a", 1).fingerprint
    )
