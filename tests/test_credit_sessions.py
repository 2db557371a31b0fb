"""Credit sessions in-process, over the real stores: one sign-in opens a session whose signed cap
and lifetime bound what its token spends; a call with ``X-CREDIT-SESSION`` spends credit with no
402 and no signature; a revoked, unknown, tampered or foreign token spends nothing.

Everything is the gateway's own (PaidAccess with the sign-in method and the session terms,
PaidAccess with the exact and credit methods, the credit book and sessions on MemoryStore and
on Redis); the sign-ins are real ed25519 signatures over the challenges the gateway issued.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from gateway.methods.credit.handlers import SessionOpenHandler, SessionRevokeHandler
from gateway.methods.credit.sessions import (
    CreditSessions,
    lifetime_words,
    new_token,
    token_wallet,
    usdc_words,
)
from gateway.routing.routes import RouteSpec
from gateway.store import Store, keys
from gateway.web.asgi import ASGIApp
from gateway.web.context import request_context
from gateway.web.router import MethodDispatcher
from gateway.x402.siwx import SiwxIssuer
from tests.support.inprocess import (
    BASE_URL,
    PROVIDER_ANSWER,
    UpstreamStandIn,
    balance_body,
    call,
    paid_route,
    signed_in,
)
from tests.test_credits import _book, _fund, _spend_app, store

__all__ = ["store"]

SESSIONS = "/v1/x402/credits/sessions"
SECRET = b"s" * 32
"""The sign-in secret of ``tests.test_credits._spend_app``'s issuer: one gateway."""


def _open_route() -> RouteSpec:
    return RouteSpec(
        name="credits.sessions.open",
        path=SESSIONS,
        method="POST",
        access="siwx",
        handler="credit_session_open",
        group="credits",
        description="Open a credit session",
        input={
            "query": {
                "type": "object",
                "additionalProperties": False,
                "required": ["capMicroUsdc"],
                "properties": {
                    "capMicroUsdc": {"type": "integer", "minimum": 1, "maximum": 1_000_000_000},
                    "ttlSeconds": {"type": "integer", "minimum": 1, "maximum": 3600, "default": 3600},
                },
            }
        },
    )


def _sessions_app(store: Store, origin: str = BASE_URL, challenge_limit: int = 1000) -> ASGIApp:
    """The two session routes of one gateway, as the app builds them."""
    limiter = paid_route(store, challenge_limit=challenge_limit).limiter
    sessions = CreditSessions(store, origin, _book(store))
    route = _open_route()
    issuer = SiwxIssuer(SECRET, origin, "Sign in to spend credit.")
    opener = signed_in(SessionOpenHandler(sessions), route, issuer, store, limiter)
    revoke = RouteSpec(
        name="credits.sessions.revoke",
        path=SESSIONS,
        method="DELETE",
        access="public",
        handler="credit_session_revoke",
        group="credits",
        description="Revoke a credit session",
    )
    pipelines = {"POST": (route, opener), "DELETE": (revoke, SessionRevokeHandler(sessions, limiter))}
    return MethodDispatcher(pipelines, "POST, DELETE, OPTIONS")


def _required(answer: Any) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(base64.b64decode(answer.headers["payment-required"]))
    return decoded


async def _open(app: ASGIApp, wallet: Keypair, query: bytes = b"capMicroUsdc=12") -> dict[str, Any]:
    challenge = await call(app, path=SESSIONS, query=query)
    assert challenge.status == 402
    header = sign_in(_required(challenge)["extensions"]["sign-in-with-x"], wallet)
    opened = await call(app, path=SESSIONS, query=query, headers={"sign-in-with-x": header})
    assert opened.status == 200, opened.body
    result: dict[str, Any] = opened.json()["result"]
    return result


def _session(token: str) -> dict[str, str]:
    return {"x-credit-session": token, "content-type": "application/json"}


# --- opening -------------------------------------------------------------------------------------


async def test_the_challenge_signs_the_cap_and_lifetime_and_says_them(store: Store) -> None:
    answer = await call(_sessions_app(store), path=SESSIONS, query=b"ttlSeconds=900&capMicroUsdc=250000")

    siwx = _required(answer)["extensions"]["sign-in-with-x"]
    resource = f"{BASE_URL}{SESSIONS}?capMicroUsdc=250000&ttlSeconds=900"
    assert (
        answer.status == 402 and siwx["info"]["uri"] == resource and siwx["info"]["resources"] == [resource]
    )
    statement = (
        f"Open a credit session on {BASE_URL}: spend at most 0.25 USDC of prepaid credit for 15 minutes."
    )
    assert siwx["info"]["statement"] == statement == siwx["statement"]


async def test_a_session_opens_for_the_signed_in_wallet_with_its_signed_terms(store: Store) -> None:
    app = _sessions_app(store)
    wallet = Keypair()

    before = int(time.time())
    result = await _open(app, wallet, b"capMicroUsdc=12")

    assert set(result) == {"token", "wallet", "capMicroUsdc", "expiresAt"}
    assert result["wallet"] == str(wallet.pubkey()) == token_wallet(result["token"])
    assert result["capMicroUsdc"] == "12"
    assert before + 3600 <= result["expiresAt"] <= int(time.time()) + 3600
    assert await store.get(result["token"]) is None  # kept under its digest only


@pytest.mark.parametrize(
    "query",
    [
        b"",
        b"capMicroUsdc=0",
        b"capMicroUsdc=-5",
        b"capMicroUsdc=1000000001",
        b"capMicroUsdc=abc",
        b"capMicroUsdc=5&ttlSeconds=0",
        b"capMicroUsdc=5&ttlSeconds=3601",
        b"capMicroUsdc=5&capMicroUsdc=6",
        b"capMicroUsdc=5&wallet=x",
    ],
)
async def test_bad_terms_are_a_400_before_any_challenge(store: Store, query: bytes) -> None:
    answer = await call(_sessions_app(store), path=SESSIONS, query=query)

    assert answer.status == 400 and answer.reason == "invalid_request"
    assert "payment-required" not in answer.headers


async def test_a_sign_in_for_one_cap_cannot_open_another(store: Store) -> None:
    app = _sessions_app(store)
    challenge = await call(app, path=SESSIONS, query=b"capMicroUsdc=5")
    header = sign_in(_required(challenge)["extensions"]["sign-in-with-x"], Keypair())

    raised = await call(app, path=SESSIONS, query=b"capMicroUsdc=500000", headers={"sign-in-with-x": header})

    assert raised.status == 402 and raised.json()["error"] == "siwx_uri_mismatch"


async def test_a_sign_in_that_signed_other_words_opens_nothing(store: Store) -> None:
    """A relay that shows the wallet a reassuring statement for the same terms gets nothing."""
    app = _sessions_app(store)
    challenge = await call(app, path=SESSIONS, query=b"capMicroUsdc=5")
    siwx = _required(challenge)["extensions"]["sign-in-with-x"]
    siwx["info"]["statement"] = "Sign in. No funds move."
    header = sign_in(siwx, Keypair())

    answer = await call(app, path=SESSIONS, query=b"capMicroUsdc=5", headers={"sign-in-with-x": header})

    assert answer.status == 402 and answer.json()["error"] == "siwx_statement_mismatch"
    assert "token" not in answer.body.decode()


# --- spending ------------------------------------------------------------------------------------


async def test_a_call_on_a_session_spends_credit_with_no_402_and_no_signature(store: Store) -> None:
    upstream = UpstreamStandIn()
    app, route, book = _spend_app(store, upstream)
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), 20)
    token = (await _open(_sessions_app(store), wallet))["token"]

    answer = await call(app, body=balance_body(), headers=_session(token))

    assert answer.status == 200 and answer.body == PROVIDER_ANSWER
    assert answer.headers["x-credit-balance"] == "15"
    ctx = request_context(answer.scope)
    assert (ctx.outcome, ctx.payer, ctx.amount) == ("credit_spent", str(wallet.pubkey()), "5")
    assert upstream.calls == 1 and route.facilitator.verified == []
    balance = await book.balance(str(wallet.pubkey()))
    assert (balance.balance, balance.held) == (15, 0)


async def test_the_cap_bounds_what_a_session_spends(store: Store) -> None:
    upstream = UpstreamStandIn()
    app, _, book = _spend_app(store, upstream)
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), 100)
    token = (await _open(_sessions_app(store), wallet, b"capMicroUsdc=12"))["token"]

    answers = [await call(app, body=balance_body(), headers=_session(token)) for _ in range(3)]

    assert [a.status for a in answers] == [200, 200, 402]
    assert answers[2].json()["error"] == "credit_session_cap_reached"
    assert [a["scheme"] for a in _required(answers[2])["accepts"]] == ["exact"]
    assert upstream.calls == 2
    assert (await book.balance(str(wallet.pubkey()))).balance == 90


async def test_a_session_cannot_spend_credit_the_wallet_lacks(store: Store) -> None:
    app, _, book = _spend_app(store, UpstreamStandIn())
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), 4)
    token = (await _open(_sessions_app(store), wallet, b"capMicroUsdc=1000"))["token"]

    answer = await call(app, body=balance_body(), headers=_session(token))

    assert answer.status == 402 and answer.json()["error"] == "insufficient_credit"
    assert (await book.balance(str(wallet.pubkey()))).balance == 4


async def test_a_provider_failure_takes_nothing_and_gives_the_cap_back(store: Store) -> None:
    failing, _, book = _spend_app(store, UpstreamStandIn(502, b'{"ok":false}'))
    serving, _, _ = _spend_app(store, UpstreamStandIn())
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), 100)
    token = (await _open(_sessions_app(store), wallet, b"capMicroUsdc=5"))["token"]

    failed = await call(failing, body=balance_body(), headers=_session(token))
    served = await call(serving, body=balance_body(), headers=_session(token))

    assert (failed.status, served.status) == (502, 200)
    balance = await book.balance(str(wallet.pubkey()))
    assert (balance.balance, balance.held) == (95, 0)


async def test_a_bad_body_on_a_session_is_a_400_and_spends_nothing(store: Store) -> None:
    app, _, book = _spend_app(store, UpstreamStandIn())
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), 100)
    sessions = _sessions_app(store)
    token = (await _open(sessions, wallet, b"capMicroUsdc=5"))["token"]

    bad = await call(app, body=b'{"params": "no"}', headers=_session(token))
    good = await call(app, body=balance_body(), headers=_session(token))

    assert (bad.status, bad.reason, good.status) == (400, "invalid_request", 200)
    assert (await book.balance(str(wallet.pubkey()))).balance == 95


# --- revoked, unknown, tampered, foreign ----------------------------------------------------------


async def test_a_revoked_session_spends_nothing_and_its_revocation_says_what_it_spent(store: Store) -> None:
    app, _, book = _spend_app(store, UpstreamStandIn())
    sessions = _sessions_app(store)
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), 100)
    token = (await _open(sessions, wallet, b"capMicroUsdc=50"))["token"]
    assert (await call(app, body=balance_body(), headers=_session(token))).status == 200

    revoked = await call(sessions, "DELETE", SESSIONS, headers={"x-credit-session": token})
    after = await call(app, body=balance_body(), headers=_session(token))
    again = await call(sessions, "DELETE", SESSIONS, headers={"x-credit-session": token})

    assert revoked.status == 200
    assert revoked.json()["result"] == {
        "wallet": str(wallet.pubkey()),
        "capMicroUsdc": "50",
        "spentMicroUsdc": "5",
    }
    assert after.status == 402 and after.json()["error"] == "credit_session_unknown"
    assert "sign-in-with-x" in _required(after)["extensions"]  # the client may sign in again
    assert again.status == 404 and again.reason == "not_found"
    assert (await book.balance(str(wallet.pubkey()))).balance == 95


@pytest.mark.parametrize("header", ["", "xcs1.nope", "Bearer abc"])
async def test_a_revocation_without_a_token_is_a_400(store: Store, header: str) -> None:
    answer = await call(_sessions_app(store), "DELETE", SESSIONS, headers={"x-credit-session": header})

    assert answer.status == 400 and answer.reason == "invalid_request"


async def test_guessing_tokens_to_revoke_is_bounded_by_the_ips_challenge_limit(store: Store) -> None:
    app = _sessions_app(store, challenge_limit=3)
    guesses = [new_token(str(Keypair().pubkey())) for _ in range(5)]

    answers = [await call(app, "DELETE", SESSIONS, headers={"x-credit-session": g}) for g in guesses]

    assert [a.status for a in answers] == [404, 404, 404, 429, 429]
    assert answers[3].reason == "rate_limited" and "retry-after" in answers[3].headers


async def test_a_token_naming_another_wallet_spends_nothing_of_either(store: Store) -> None:
    app, _, book = _spend_app(store, UpstreamStandIn())
    alice, bob = Keypair(), Keypair()
    await _fund(store, str(alice.pubkey()), 100)
    await _fund(store, str(bob.pubkey()), 100)
    token = (await _open(_sessions_app(store), alice, b"capMicroUsdc=50"))["token"]
    prefix, _, secret = token.split(".")
    tampered = [
        f"{prefix}.{bob.pubkey()}.{secret}",
        f"{prefix}.{alice.pubkey()}.{secret[:-1]}{'A' if secret[-1] != 'A' else 'B'}",
        new_token(str(alice.pubkey())),
        "not a token",
    ]

    answers = [await call(app, body=balance_body(), headers=_session(t)) for t in tampered]

    assert [(a.status, a.json()["error"]) for a in answers] == [(402, "credit_session_unknown")] * 4
    assert (await book.balance(str(alice.pubkey()))).balance == 100
    assert (await book.balance(str(bob.pubkey()))).balance == 100


async def test_a_session_opened_at_another_origin_spends_nothing_here(store: Store) -> None:
    app, _, book = _spend_app(store, UpstreamStandIn())
    wallet = Keypair()
    await _fund(store, str(wallet.pubkey()), 100)
    elsewhere = _sessions_app(store, "https://other-gateway.test")
    token = (await _open(elsewhere, wallet, b"capMicroUsdc=50"))["token"]

    answer = await call(app, body=balance_body(), headers=_session(token))

    assert answer.status == 402 and answer.json()["error"] == "credit_session_unknown"
    assert (await book.balance(str(wallet.pubkey()))).balance == 100


def test_the_store_keeps_a_digest_of_origin_and_token_never_the_token() -> None:
    wallet = str(Keypair().pubkey())
    token = new_token(wallet)
    here = CreditSessions(None, BASE_URL, None).key(wallet, token)  # type: ignore[arg-type]
    there = CreditSessions(None, "https://other-gateway.test", None).key(wallet, token)  # type: ignore[arg-type]

    assert here.startswith(keys.CREDIT_SESSION) and token not in here and here != there
    assert here.startswith(keys.credit_session(wallet, ""))  # among the wallet's own keys


def test_the_words_a_wallet_signs() -> None:
    assert [usdc_words(n) for n in (1, 250_000, 1_000_000, 12_500_000)] == [
        "0.000001 USDC",
        "0.25 USDC",
        "1 USDC",
        "12.5 USDC",
    ]
    assert [lifetime_words(n) for n in (1, 90, 900, 3600, 60)] == [
        "1 second",
        "90 seconds",
        "15 minutes",
        "1 hour",
        "1 minute",
    ]
