"""Scenario (h) of bench/run.py: calls paid from prepaid credit, beside calls paid one by one.

A gateway with credit on (``CREDITS_ENABLED=true``), as operators run it (``x402-gateway serve
--workers 1``, pinned like the others) on the run's Redis (a database of its own), with the
zero-latency provider and facilitator stubs. Before the clock starts, each measured run's wallet
(a fresh one, so every round starts from a wallet with no calls behind it) buys credit with a
real top-up (an exact payment of ``POST /v1/x402/credits/top-up/1``, which the stub facilitator
settles and the gateway books); then the load generator fetches the paid route's 402 once per
call and signs the sign-in challenge it carries (``bench.load`` kind ``siwx`` with a POST body
and ``top_up``). Each call is one fresh SIGN-IN-WITH-X spending the route's credit price: the
nonce claimed, the price held, the provider called, the hold taken. Within a run the wallet's
calls follow one another as a busy client's do.

Beside those pre-signed sign-ins, in the same rounds: calls on one credit session (the wallet
signs in once, before the clock, to ``POST /v1/x402/credits/sessions``; each call then carries
``X-CREDIT-SESSION``: no 402, no signature, one store round trip before the provider) and the
per-call sign-in as a client makes it, on the clock (the route's 402, a signature, the call).

In the same interleaved rounds, at c=1 and at c=32: the provider called directly, and the same
route paid per call with a unique exact payment, on this gateway and on the run's Redis gateway
(credit off). Then the same comparison at c=32 where per-call payments settle as they do for
real: a second credit gateway in front of scenario (g)'s stubs (the provider answers in 50 ms,
the facilitator verifies in 30 ms and settles in 700 ms, a transaction's landing and
confirmation). Targets:

* latency added over calling the provider directly, p50 at c=1: at most 2 ms;
* req/s at c=32, paid from credit / paid per call (exact) on the same gateway: at least 3x, read
  twice: against a facilitator that settles in no time (what the gateway's own work allows:
  both paths share the answer's two writes and the provider's round trip, and a per-call
  payment adds two facilitator round trips and one store round trip to credit's two) and
  against one that settles at a chain's pace (what a client of per-call payments gets);
* a call on a credit session: at most 1.5 ms over the provider at p50 (c=1), and at least 1.5x
  the req/s of the per-call sign-in (402, signature, call) at c=32.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from bench.common import (
    PAID_PATH,
    PROVIDER_PATH,
    REDIS,
    RPC_BODY,
    SERVER_CPU,
    Bench,
    Server,
    bench_routes_file,
    challenge_of,
    gateway_env,
    paid_job,
    static_job,
    table,
)
from bench.procs import GATEWAY_ARGS, python_server, redis_url, started, waits_stubs

CREDIT = "credit"
FROM_CREDIT = "gateway, credit on: paid from credit"
EXACT_CREDIT_ON = "gateway, credit on: paid per call (exact)"
EXACT_CREDIT_OFF = "gateway, Redis store: paid per call (exact)"
DIRECT = "direct to provider"
WALLET_SEED = "bench-credit-wallet"
"""Each measured run's wallet is a fresh one derived from it: it buys credit, then signs in."""
TOP_UP_PATH = "/v1/x402/credits/top-up/1"
"""What each run's wallet buys first: 1 USDC of credit, 200,000 calls of getBalance (5 each)."""
REDIS_DATABASE = 8
"""A database of the run's Redis server that no other scenario uses."""
WAITS_REDIS_DATABASE = 9
"""The database of the credit gateway in front of the stubs with realistic waits."""
WAITS = "credit, realistic waits"
FROM_CREDIT_WAITS = "credit gateway, realistic waits: paid from credit"
EXACT_WAITS = "credit gateway, realistic waits: paid per call (exact)"
ADDED_TARGET_MS = 2.0
SPEEDUP_TARGET = 3.0
ON_SESSION = "gateway, credit on: paid from credit on a session"
SIGN_IN_LIVE = "gateway, credit on: paid from credit, 402 + sign-in per call"
SESSION_PATH = "/v1/x402/credits/sessions"
SESSION_CAP = 1_000_000
"""What each run's session may spend: its whole top-up."""
SESSION_ADDED_TARGET_MS = 1.5
SESSION_SPEEDUP_TARGET = 1.5


def session_job(url: str, c: int, counts: tuple[int, int], kind: str) -> dict[str, Any]:
    """Calls of the paid route on one credit session (``session``), or each signing in on the
    clock (``siwx_live``), by a fresh wallet that bought credit before the clock."""
    return {
        **credit_job(url, c, counts),
        "kind": kind,
        "session_path": SESSION_PATH,
        "session_cap": SESSION_CAP,
    }


def credit_job(url: str, c: int, counts: tuple[int, int]) -> dict[str, Any]:
    """One fresh sign-in per call of the paid route, over challenges fetched before the clock."""
    warmup, count = counts
    return {
        "kind": "siwx",
        "url": url,
        "path": PAID_PATH,
        "method": "POST",
        "body": RPC_BODY,
        "wallet_seed": WALLET_SEED,
        "top_up": TOP_UP_PATH,
        "concurrency": c,
        "warmup": warmup,
        "count": count,
        "expect": 200,
    }


def run_credit(bench: Bench, servers: dict[str, Server], stubs: dict[str, Server]) -> None:
    p = bench.profile
    print("(h) paid from credit: a fresh sign-in per call, beside exact payments", flush=True)
    gateway = python_server("credit gateway", GATEWAY_ARGS, SERVER_CPU if bench.pin else None, hypercorn=True)
    with tempfile.TemporaryDirectory(prefix="x402-bench-credit-routes-") as tmp:
        env = gateway_env(gateway.port, stubs, bench_routes_file(Path(tmp)), "WARNING")
        env.update(CREDITS_ENABLED="true", STATE_STORE_REST_URL=redis_url(servers, REDIS_DATABASE))
        gateway.env = env
        with started(bench, [gateway], ["/healthz"]):
            plain = servers[REDIS]
            challenges = {
                name: challenge_of(server.url + PAID_PATH)
                for name, server in (("on", gateway), ("off", plain))
            }
            provider = stubs["provider"]
            for conc, counts in ((1, p.paid_latency), (p.concurrency, p.paid_throughput)):
                specs = [
                    (
                        static_job(provider.url, "POST", PROVIDER_PATH, RPC_BODY, conc, counts, 200),
                        CREDIT,
                        DIRECT,
                        None,
                    ),
                    (credit_job(gateway.url, conc, counts), CREDIT, FROM_CREDIT, gateway),
                    (session_job(gateway.url, conc, counts, "session"), CREDIT, ON_SESSION, gateway),
                    (session_job(gateway.url, conc, counts, "siwx_live"), CREDIT, SIGN_IN_LIVE, gateway),
                    (
                        paid_job(gateway.url, PAID_PATH, challenges["on"], conc, counts),
                        CREDIT,
                        EXACT_CREDIT_ON,
                        gateway,
                    ),
                    (
                        paid_job(plain.url, PAID_PATH, challenges["off"], conc, counts),
                        CREDIT,
                        EXACT_CREDIT_OFF,
                        plain,
                    ),
                ]
                bench.load_rounds(specs, p.rounds)
    run_credit_with_waits(bench, servers, stubs)


def run_credit_with_waits(bench: Bench, servers: dict[str, Server], stubs: dict[str, Server]) -> None:
    """From credit against per call (exact) at c=32, where the provider and the facilitator take
    the time they take for real (scenario (g)'s stubs)."""
    p = bench.profile
    c = p.concurrency
    print(f"(h) paid from credit beside exact payments that settle at a chain's pace (c={c})", flush=True)
    provider, facilitator = waits_stubs(bench)
    cpus = SERVER_CPU if bench.pin else None
    gateway = python_server("credit gateway, waits", GATEWAY_ARGS, cpus, hypercorn=True)
    waiting = {"provider": provider, "asset": stubs["asset"], "facilitator": facilitator}
    with tempfile.TemporaryDirectory(prefix="x402-bench-credit-waits-") as tmp:
        env = gateway_env(gateway.port, waiting, bench_routes_file(Path(tmp)), "WARNING")
        env.update(CREDITS_ENABLED="true", STATE_STORE_REST_URL=redis_url(servers, WAITS_REDIS_DATABASE))
        gateway.env = env
        with started(bench, [provider, facilitator, gateway], ["/", "/", "/healthz"]):
            challenge = challenge_of(gateway.url + PAID_PATH)
            # Per call, each request takes the physical limit (about 0.8 s): a few of them per
            # client keep the run short; from credit, each takes the provider's 50 ms.
            exact_counts = (c, 8 * c) if p.name != "quick" else (c, 3 * c)
            credit_counts = (c, 60 * c) if p.name != "quick" else (c, 20 * c)
            specs = [
                (credit_job(gateway.url, c, credit_counts), WAITS, FROM_CREDIT_WAITS, gateway),
                (paid_job(gateway.url, PAID_PATH, challenge, c, exact_counts), WAITS, EXACT_WAITS, gateway),
            ]
            bench.load_rounds(specs, p.rounds)


# --- report (called by bench/run.py) ----------------------------------------------------------


def _verdict(ok: bool, *rows: dict[str, Any]) -> str:
    found = "met" if ok else "**NOT met**"
    return found + (" (disturbed measurement)" if any(r["foreign_cpu_pct"] > 5 for r in rows) else "")


def credit_summary(bench: Bench) -> list[str]:
    """The summary table's lines for (h), one per target (nothing when it did not run)."""
    c = bench.profile.concurrency
    direct, credit1 = bench.find(CREDIT, DIRECT, 1), bench.find(CREDIT, FROM_CREDIT, 1)
    credit_c, exact_c = bench.find(CREDIT, FROM_CREDIT, c), bench.find(CREDIT, EXACT_CREDIT_ON, c)
    if direct is None or credit1 is None or credit_c is None or exact_c is None:
        return []
    added = credit1["p50_ms"] - direct["p50_ms"]
    added99 = credit1["p99_ms"] - direct["p99_ms"]
    speedup = credit_c["rps"] / exact_c["rps"]
    lines = [
        f"| paid from credit (h): latency added over the provider, p50 / p99 (c=1) "
        f"| {added:.3f} / {added99:.3f} ms "
        f"| p50 <= {ADDED_TARGET_MS:.0f} ms: {_verdict(added <= ADDED_TARGET_MS, credit1, direct)} |",
        f"| paid from credit (h): req/s from credit / per call (exact), same gateway on Redis (c={c}) "
        f"| {speedup:.2f} ({credit_c['rps']:.0f} vs {exact_c['rps']:.0f}) "
        f"| >= {SPEEDUP_TARGET:.0f}x: {_verdict(speedup >= SPEEDUP_TARGET, credit_c, exact_c)} |",
    ]
    exact1 = bench.find(CREDIT, EXACT_CREDIT_ON, 1)
    if exact1 is not None:
        lines.append(
            f"| paid from credit (h): latency added over the provider, p50, per call (exact), same gateway "
            f"(c=1) | {exact1['p50_ms'] - direct['p50_ms']:.3f} ms | |"
        )
    off = bench.find(CREDIT, EXACT_CREDIT_OFF, c)
    if off is not None:
        lines.append(
            f"| paid from credit (h): req/s per call (exact), credit on / credit off (c={c}) "
            f"| {exact_c['rps'] / off['rps']:.2f} | |"
        )
    lines += session_summary(bench, direct)
    credit_w, exact_w = bench.find(WAITS, FROM_CREDIT_WAITS, c), bench.find(WAITS, EXACT_WAITS, c)
    if credit_w is not None and exact_w is not None:
        speedup_w = credit_w["rps"] / exact_w["rps"]
        lines.append(
            f"| paid from credit (h): req/s from credit / per call (exact), realistic waits, Redis (c={c}) "
            f"| {speedup_w:.1f} ({credit_w['rps']:.0f} vs {exact_w['rps']:.0f}) "
            f"| >= {SPEEDUP_TARGET:.0f}x: {_verdict(speedup_w >= SPEEDUP_TARGET, credit_w, exact_w)} |"
        )
    return lines


def session_summary(bench: Bench, direct: dict[str, Any]) -> list[str]:
    """The credit session's lines: its added latency, and its req/s against signing in per call."""
    c = bench.profile.concurrency
    session1, session_c = bench.find(CREDIT, ON_SESSION, 1), bench.find(CREDIT, ON_SESSION, c)
    live_c, signed_c = bench.find(CREDIT, SIGN_IN_LIVE, c), bench.find(CREDIT, FROM_CREDIT, c)
    if session1 is None or session_c is None or live_c is None or signed_c is None:
        return []
    added = session1["p50_ms"] - direct["p50_ms"]
    added_ok = _verdict(added <= SESSION_ADDED_TARGET_MS, session1, direct)
    speedup = session_c["rps"] / live_c["rps"]
    return [
        f"| credit session (h): latency added over the provider, p50 / p99 (c=1) "
        f"| {added:.3f} / {session1['p99_ms'] - direct['p99_ms']:.3f} ms "
        f"| p50 <= {SESSION_ADDED_TARGET_MS} ms: {added_ok} |",
        f"| credit session (h): req/s on a session / per-call sign-in (402, signature, call) (c={c}) "
        f"| {speedup:.2f} ({session_c['rps']:.0f} vs {live_c['rps']:.0f}) "
        f"| >= {SESSION_SPEEDUP_TARGET}x: {_verdict(speedup >= SESSION_SPEEDUP_TARGET, session_c, live_c)} |",
        f"| credit session (h): req/s on a session / pre-signed sign-ins, the gateway's work alone (c={c}) "
        f"| {session_c['rps'] / signed_c['rps']:.2f} ({session_c['rps']:.0f} vs {signed_c['rps']:.0f}) | |",
    ]


def credit_report(bench: Bench) -> list[str]:
    """The report's section for (h) (nothing when it did not run)."""
    if bench.find(CREDIT, FROM_CREDIT, 1) is None:
        return []
    return [
        "",
        "## (h) paid from credit",
        "",
        "`x402-gateway serve --workers 1` with `CREDITS_ENABLED=true` on Redis (its own database), the "
        "zero-latency stubs. Before the clock starts, each measured run's wallet (a fresh one) buys credit "
        "with a top-up and fetches the paid route's 402 once per call; each call from credit carries a "
        "fresh SIGN-IN-WITH-X signed over one of them: the nonce claimed, the credit price held, the "
        "provider called, the hold taken. The per-call (exact) rows carry a unique exact payment per "
        "call, on the same gateway and on the run's Redis gateway (credit off). The session row's wallet "
        "signs in once before the clock to open a credit session and each call carries its token "
        "(`X-CREDIT-SESSION`); the `402 + sign-in per call` row times the whole per-call pattern a client "
        "runs (the 402, a signature, the call). Added latency is over `direct to provider` at the same "
        "concurrency.",
        "",
        *table(bench, CREDIT, DIRECT),
        "",
        "The same at c=32 in front of scenario (g)'s stubs (the provider answers in 50 ms, the "
        "facilitator verifies in 30 ms and settles in 700 ms), on a second credit gateway (Redis, its own "
        "database): each per-call payment waits for its settlement, each call from credit for the provider.",
        "",
        *table(bench, WAITS, None),
    ]
