"""The servers a scenario starts of its own, beside the run's (bench/run.py ``running``): a
``python -m`` process on a free port, started and counted as the bench's own for the scenario's
length, a gateway on another database of the run's Redis, the stubs with realistic waits."""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from bench.common import CLIENT_CPU, REDIS, Bench, Server, base_env, free_port

GATEWAY_ARGS = ("gateway.cli", "serve", "--host", "127.0.0.1", "--port", "{port}", "--workers", "1")
"""``x402-gateway serve``, one worker, as bench/run.py runs it."""


def python_server(name: str, args: Sequence[str], cpus: set[int] | None, *, hypercorn: bool) -> Server:
    """``python -m ARGS`` on a free port (``{port}`` in ``args`` is replaced by it)."""
    port = free_port()
    argv = [sys.executable, "-m", *(arg.format(port=port) for arg in args)]
    return Server(name, port, argv, base_env(), cpus, hypercorn=hypercorn)


def redis_url(servers: dict[str, Server], database: int) -> str:
    """The run's Redis server, database ``database`` (each scenario's gateway has its own)."""
    return f"{servers[REDIS].env['STATE_STORE_REST_URL'].rsplit('/', 1)[0]}/{database}"


def start(server: Server, logdir: Path, probe: str, retries: int = 0, wait_s: float = 20.0) -> None:
    """Start and wait; a gateway broken by a half-done edit elsewhere gets ``retries`` more tries."""
    for attempt in range(retries + 1):
        if server.proc is None:
            server.start(logdir)
        try:
            server.wait_ready(probe)
            return
        except RuntimeError as exc:
            server.stop()
            if attempt == retries:
                raise
            print(f"{server.name} did not start (try {attempt + 1}), retrying in {wait_s:g} s:\n{exc}")
            time.sleep(wait_s)


@contextmanager
def started(bench: Bench, servers: Sequence[Server], probes: Sequence[str]) -> Iterator[None]:
    """Start ``servers`` in their own log directory, count them as the bench's own processes,
    and stop them on the way out."""
    with tempfile.TemporaryDirectory(prefix="x402-bench-pace-") as tmp:
        try:
            for server in servers:
                server.start(Path(tmp))
            for server, probe in zip(servers, probes, strict=True):
                start(server, Path(tmp), probe, retries=3)
                bench.own_pids.extend(server.pids())
            yield
        finally:
            for server in servers:
                server.stop()


def waits_stubs(bench: Bench) -> tuple[Server, Server]:
    """The provider and the facilitator with realistic waits of scenario (g) (not yet started;
    ``python -m bench.settlement_pace stub``), on the load generator's CPU."""
    client_cpus = CLIENT_CPU if bench.pin else None
    stub = ("bench.settlement_pace", "stub")
    provider = python_server("waits provider", (*stub, "provider", "{port}"), client_cpus, hypercorn=False)
    facilitator = python_server(
        "waits facilitator", (*stub, "facilitator", "{port}"), client_cpus, hypercorn=False
    )
    return provider, facilitator
