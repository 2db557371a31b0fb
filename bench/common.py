"""What the benchmark's modules share: the route and payer it measures, the CPUs it pins to,
the processes it starts (``Server``), the run's record (``Bench``, ``Row``), the load jobs, the
402 it reads and the report's table.

bench/run.py (the entry point) and each scenario module (bench/credit.py, bench/ledger.py,
bench/settlement_pace.py, bench/volume.py) import from here; this module imports none of them.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from solders.keypair import Keypair

from bench.load import paid_calls
from bench.stubs import FACILITATOR_BASE_PATH

REPO = Path(__file__).resolve().parent.parent
PAY_TO = "9xQeWvG816bUx9EPjHmaT23yvVM2ZWbrrpZb9PusVFin"
ACCOUNT = "vines1vzrYbzLMRdu58ou5XTby4qAqVRLmqo36NKPTg"
PAID_PATH = "/v1/x402/solana/mainnet/provider_a/rpc/getBalance"
PROVIDER_PATHS = {
    "PROVIDER_A_MAINNET_RPC_URL": "/provider-a/mainnet",
    "PROVIDER_A_DEVNET_RPC_URL": "/provider-a/devnet",
    "PROVIDER_B_MAINNET_RPC_URL": "/provider-b/mainnet",
    "PROVIDER_B_DEVNET_RPC_URL": "/provider-b/devnet",
}
PROVIDER_PATH = PROVIDER_PATHS["PROVIDER_A_MAINNET_RPC_URL"]
SIWX_PATH = "/v1/x402/tokens/assets/usd-coin"
ASSET_PATH = "/v1/assets/usd-coin"
RPC_BODY = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": [ACCOUNT]})
UNLIMITED = "limit: 3600000, period_seconds: 3600}"
"""Replaces the named limits in the bench's copy of routes.yaml: a burst no bounded run reaches."""
REDIS = "gateway, Redis store"
"""The run's gateway on Redis; scenarios that start gateways of their own put each on another
database of its Redis server."""
SERVER_CPU = {0}
CLIENT_CPU = {1}


@dataclass(frozen=True)
class Profile:
    """Request counts (warm-up, measured) of one round; every measurement is repeated ``rounds``
    times, interleaved across its targets, and the round with the median req/s is reported."""

    name: str
    throughput: tuple[int, int]
    latency: tuple[int, int]
    paid_throughput: tuple[int, int]
    paid_latency: tuple[int, int]
    soak_requests: int
    soak_chunk: int
    rounds: int
    concurrencies: tuple[int, ...] = (64, 32)
    """Throughput runs of the challenge path; the first is the headline, the paid and SIWX paths
    use the last."""
    cap_s: float = 60.0

    @property
    def concurrency(self) -> int:
        return self.concurrencies[-1]


# --- processes -------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def pinner(cpus: set[int] | None) -> Callable[[], None] | None:
    if not cpus:
        return None

    def pin() -> None:
        os.sched_setaffinity(0, cpus)

    return pin


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "X402_", "PROVIDER_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


@dataclass
class Server:
    """One process group we started; stopped through its own group id only."""

    name: str
    port: int
    argv: list[str]
    env: dict[str, str]
    cpus: set[int] | None
    hypercorn: bool = True
    workers: int = 1
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, logdir: Path) -> None:
        self.log = logdir / f"{self.name.replace(' ', '_')}.err"
        with open(self.log, "ab") as err:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
                preexec_fn=pinner(self.cpus),
            )

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)

    def pids(self) -> list[int]:
        """The process and its children (a hypercorn master's worker and resource tracker)."""
        if self.proc is None:
            return []
        master = self.proc.pid
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
            return [master, *map(int, children)]
        return [master]

    def stderr_tail(self, lines: int = 15) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def worker_pids(self) -> list[int]:
        """The hypercorn workers (the master's spawned children), or the process itself."""
        assert self.proc is not None
        master = self.proc.pid
        if not self.hypercorn:
            return [master]
        for _ in range(200):
            found = []
            with contextlib.suppress(OSError):
                for child in Path(f"/proc/{master}/task/{master}/children").read_text().split():
                    if b"spawn_main" in Path(f"/proc/{child}/cmdline").read_bytes():
                        found.append(int(child))
            if len(found) >= self.workers:
                return found
            time.sleep(0.05)
        raise RuntimeError(f"{self.name}: {self.workers} hypercorn worker(s) not found")

    def worker_pid(self) -> int:
        return self.worker_pids()[0]

    def wait_ready(self, probe: str, timeout_s: float = 30.0) -> None:
        """Until ``probe`` answers over HTTP (any status); raises if the process died."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.stderr_tail()}")
            try:
                with urllib.request.urlopen(self.url + probe, timeout=2):
                    return
            except urllib.error.HTTPError:
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.name} not ready after {timeout_s:g}s:\n{self.stderr_tail()}")


FOREIGN_CPU_LIMIT = 0.05
"""Share of one core that processes other than the benchmark's may use before the report warns."""


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (none when it has exited)."""
    with contextlib.suppress(OSError):
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def bench_routes_file(directory: Path) -> Path:
    """The packaged routes.yaml with its named per-scope limits replaced by an unreachable one."""
    text = (REPO / "gateway" / "routes.yaml").read_text(encoding="utf-8")
    lifted, count = re.subn(r"limit: (?:rpc|das|tokens|wallet)\}", UNLIMITED, text)
    if count == 0:
        raise RuntimeError("routes.yaml has no named limits to lift; bench/common.py needs updating")
    path = directory / "routes.bench.yaml"
    path.write_text(lifted, encoding="utf-8")
    return path


def gateway_env(port: int, stubs: dict[str, Server], routes_file: Path, log_level: str) -> dict[str, str]:
    """Every upstream configured (the production-size route table), limits out of reach."""
    env = base_env()
    env.update({name: stubs["provider"].url + path for name, path in PROVIDER_PATHS.items()})
    env.update(
        GATEWAY_BASE_URL=f"http://127.0.0.1:{port}",
        X402_PAY_TO_WALLET=PAY_TO,
        FACILITATOR_URL=stubs["facilitator"].url + FACILITATOR_BASE_PATH,
        # Required for the paid groups; the stub facilitator does not check the JWT it signs.
        FACILITATOR_API_KEY_ID="bench-key-id",
        FACILITATOR_API_KEY_SECRET=base64.b64encode(bytes(Keypair())).decode("ascii"),
        # Priced like the peer (bench/apps.py PEER_PRICE): getBalance's 5 plus a 2200 settlement fee.
        FACILITATOR_SETTLEMENT_FEE_MICRO_USDC="2200",
        ASSET_API_BASE_URL=stubs["asset"].url,
        ASSET_API_KEY="bench-asset-api-key-0123456789",
        SIWX_SECRET="bench-siwx-secret-0123456789abcdef0123456789",
        RATE_LIMIT_RPC_RPS="1000000",
        RATE_LIMIT_DAS_RPS="1000000",
        RATE_LIMIT_TOKENS_PER_MINUTE="1000000",
        RATE_LIMIT_CHALLENGE_PER_MINUTE="1000000",
        ROUTES_FILE=str(routes_file),
        LOG_LEVEL=log_level,
        PORT=str(port),
    )
    return env


# --- measurements ----------------------------------------------------------------------------


Spec = tuple[dict[str, Any], str, str, "Server | None"]
"""A load job, its scenario, its target's name and the server whose CPU is measured."""


@dataclass
class Row:
    scenario: str
    target: str
    concurrency: int
    result: dict[str, Any]


@dataclass
class Bench:
    profile: Profile
    pin: bool
    rows: list[Row] = field(default_factory=list)
    rss: list[tuple[str, str, int, int]] = field(default_factory=list)
    """(gateway, when, RSS KiB, requests of the soak so far)."""
    notes: list[str] = field(default_factory=list)
    own_pids: list[int] = field(default_factory=list)
    own_roots: list[int] = field(default_factory=list)
    """Processes whose children are the bench's own too, counted afresh for every job (a
    database server forks a backend per connection)."""
    own_daemon_cpu_s: float = 0.0
    """CPU-seconds of processes the bench started but does not reap (a database server's), for
    the whole run's count of what other processes used."""
    store_pid: int | None = None
    profile_dir: Path | None = None
    """``--profile``: where scenarios that profile their own gateways write (j does)."""
    profiles: list[str] = field(default_factory=list)
    _ip: int = 0

    def next_ip(self) -> str:
        """A fresh loopback source address per job: the challenge limit is per client IP."""
        self._ip += 1
        return f"127.0.{1 + self._ip // 250}.{1 + self._ip % 250}"

    def run_load(self, job: dict[str, Any], server: Server | None) -> subprocess.Popen[str]:
        own = [*self.own_pids, *(pid for root in self.own_roots for pid in (root, *children(root)))]
        job = {"cap_s": self.profile.cap_s, "local_ip": self.next_ip(), "own_pids": own, **job}
        if server is not None:
            job["cpu_pids"] = server.worker_pids()
            if "STATE_STORE_REST_URL" in server.env:
                job["store_pid"] = self.store_pid
        pinned = self.pin and not (server is not None and server.cpus is None)
        return subprocess.Popen(
            [sys.executable, "-m", "bench.load", json.dumps(job)],
            cwd=REPO,
            env=base_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=pinner(CLIENT_CPU if pinned else None),
        )

    def load(self, job: dict[str, Any], scenario: str, target: str, server: Server | None) -> dict[str, Any]:
        result = self.measure(job, scenario, target, server)
        self.rows.append(Row(scenario, target, int(job["concurrency"]), result))
        return result

    def load_rounds(
        self, specs: list[Spec], rounds: int, alternate: bool = False
    ) -> dict[tuple[str, str], list[dict[str, Any]]]:
        """Each spec ``rounds`` times, interleaved so drift hits every target alike (``alternate``:
        every other round in reverse order, so no target always follows the same one). The round
        with the median req/s among those that other processes left alone is kept (among all
        rounds when none was), with the spread of all rounds. Answers every round's result by
        (scenario, target), in round order, for figures paired within a round."""
        seen: dict[tuple[str, str], list[dict[str, Any]]] = {(s[1], s[2]): [] for s in specs}
        for i in range(rounds):
            for job, scenario, target, server in specs[::-1] if alternate and i % 2 else specs:
                seen[(scenario, target)].append(self.measure(job, scenario, target, server))
        for (job, scenario, target, _), results in zip(specs, seen.values(), strict=True):
            ranked = sorted(results, key=lambda r: float(r["rps"]))
            clean = [r for r in ranked if r["foreign_cpu_pct"] <= FOREIGN_CPU_LIMIT * 100] or ranked
            median = dict(clean[len(clean) // 2])
            if rounds > 1:
                median["spread"] = f"{ranked[0]['rps']:.0f}-{ranked[-1]['rps']:.0f}"
            median["unexpected"] = sum(int(r["unexpected"]) for r in results)
            self.rows.append(Row(scenario, target, int(job["concurrency"]), median))
        return seen

    def measure(
        self, job: dict[str, Any], scenario: str, target: str, server: Server | None
    ) -> dict[str, Any]:
        proc = self.run_load(job, server)
        out, err = proc.communicate(timeout=3 * self.profile.cap_s + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"load generator failed for {scenario}/{target}:\n{err[-3000:]}")
        result: dict[str, Any] = json.loads(out)
        flag = ""
        if result["unexpected"]:
            flag = f"  UNEXPECTED {result['unexpected']}, e.g. {result['sample_error'][:160]}"
        cpu = ""
        if result["server_cpu_pct"] is not None:
            per_request = result["server_cpu_ms_per_request"]
            cpu = f"  server CPU {result['server_cpu_pct']:.0f}% ({per_request:.3f} ms/req)"
        if result.get("store_cpu_pct") is not None:
            cpu += f"  Redis {result['store_cpu_pct']:.0f}%"
        if result["foreign_cpu_pct"] > FOREIGN_CPU_LIMIT * 100:
            cpu += f"  (other processes: {result['foreign_cpu_pct']:.0f}% CPU)"
        print(
            f"  {scenario:<9} {target:<24} c={job['concurrency']:<3} n={result['requests']:<6}"
            f"{result['rps']:>8.0f} req/s  p50 {result['p50_ms']:7.3f} ms  p99 {result['p99_ms']:7.3f} ms"
            f"{cpu}{flag}",
            flush=True,
        )
        return result

    def find(self, scenario: str, target: str, concurrency: int) -> dict[str, Any] | None:
        for row in self.rows:
            if (row.scenario, row.target, row.concurrency) == (scenario, target, concurrency):
                return row.result
        return None


def fetch_402(url: str, body: bytes = b"{}") -> tuple[dict[str, str], bytes]:
    """Headers and body of the 402 answering a POST of ``body`` (anything else raises)."""
    request = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            raise RuntimeError(f"{url} answered {resp.status}, expected 402")
    except urllib.error.HTTPError as exc:
        answer = exc.read()
        if exc.code != 402:
            raise RuntimeError(f"{url} answered {exc.code}, expected 402: {answer[:300]!r}") from None
        return {k.lower(): v for k, v in exc.headers.items()}, answer


def challenge_of(url: str) -> dict[str, Any]:
    """The decoded PAYMENT-REQUIRED header of the 402 answering an unpaid JSON-RPC call."""
    headers, _ = fetch_402(url, RPC_BODY.encode())
    decoded: dict[str, Any] = json.loads(base64.b64decode(headers["payment-required"]))
    return decoded


def static_job(
    url: str, method: str, path: str, body: str, c: int, counts: tuple[int, int], expect: int
) -> dict[str, Any]:
    warmup, count = counts
    headers = {"content-type": "application/json"} if body else {}
    return {
        "kind": "static",
        "url": url,
        "method": method,
        "path": path,
        "body": body,
        "headers": headers,
        "concurrency": c,
        "warmup": warmup,
        "count": count,
        "expect": expect,
    }


def paid_job(
    url: str, path: str, challenge: dict[str, Any], c: int, counts: tuple[int, int]
) -> dict[str, Any]:
    warmup, count = counts
    return {
        "kind": "paid",
        "url": url,
        "path": path,
        "body": RPC_BODY,
        "accepted": challenge["accepts"][0],
        "resource": challenge.get("resource"),
        "concurrency": c,
        "warmup": warmup,
        "count": count,
        "expect": 200,
    }


def siwx_job(url: str, c: int, counts: tuple[int, int]) -> dict[str, Any]:
    warmup, count = counts
    return {
        "kind": "siwx",
        "url": url,
        "path": SIWX_PATH,
        "concurrency": c,
        "warmup": warmup,
        "count": count,
        "expect": 200,
    }


def verify_body(challenge: dict[str, Any]) -> str:
    """A realistic facilitator /verify body (one signed payment), for the round-trip reference."""
    call = paid_calls(paid_job("", PAID_PATH, challenge, 1, (0, 1)), 1)[0]
    payload = json.loads(base64.b64decode(call.headers["payment-signature"]))
    request = {"x402Version": 2, "paymentPayload": payload, "paymentRequirements": payload["accepted"]}
    return json.dumps(request)


# --- report ----------------------------------------------------------------------------------


def fmt_ms(value: float) -> str:
    return f"{value:.3f}"


def table(bench: Bench, scenario: str, added_vs: str | None) -> list[str]:
    head = "| target | conc. | requests | req/s | p50 ms | p99 ms | mean ms |"
    sep = "|---|---:|---:|---:|---:|---:|---:|"
    if added_vs:
        head += " added p50 ms | added p99 ms |"
        sep += "---:|---:|"
    lines = [
        head + " server CPU % | CPU ms/req | Redis CPU % | other CPU % | errors |",
        sep + "---:|---:|---:|---:|---:|",
    ]
    for row in bench.rows:
        if row.scenario != scenario:
            continue
        r = row.result
        rps = f"{r['rps']:.0f}" + (f" ({r['spread']})" if "spread" in r else "")
        cells = [row.target, str(row.concurrency), str(r["requests"]), rps]
        cells += [fmt_ms(r["p50_ms"]), fmt_ms(r["p99_ms"]), fmt_ms(r["mean_ms"])]
        if added_vs:
            base = bench.find(scenario, added_vs, row.concurrency)
            if base is not None and not row.target.startswith("direct"):
                cells += [fmt_ms(r["p50_ms"] - base["p50_ms"]), fmt_ms(r["p99_ms"] - base["p99_ms"])]
            else:
                cells += ["", ""]
        cpu, per_request, store = (
            r["server_cpu_pct"],
            r.get("server_cpu_ms_per_request"),
            r.get("store_cpu_pct"),
        )
        cells.append("" if cpu is None else f"{cpu:.0f}")
        cells.append("" if per_request is None else f"{per_request:.3f}")
        cells.append("" if store is None else f"{store:.0f}")
        cells.append(f"{r['foreign_cpu_pct']:.0f}")
        cells.append(str(r["unexpected"]) + (" (time cap hit)" if r["capped"] else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return lines
