"""Run ``x402-gateway`` as a real subprocess, as an operator would, and always clean it up.

Each process gets its own session (process group), so the hypercorn worker it spawns is stopped
with it even when a test fails half-way. Output goes to unnamed temporary files, never to a pipe
nobody drains, so a chatty gateway can never block on a full pipe.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import IO

from tests.support.cli_fork import ForkedProcess, forkable, launcher, run_forked, start_forked
from tests.support.ports import PORT_TAKEN, START_ATTEMPTS, free_port


def command() -> list[str]:
    """The installed console script, else the same entry point through this interpreter."""
    script = shutil.which("x402-gateway")
    return [script] if script else [sys.executable, "-m", "gateway.cli"]


def launched_command(env: Mapping[str, str]) -> list[str]:
    """``command()`` for a program that starts the command itself with ``clean_env(env)`` (an
    MCP client over stdio): a launcher that has it forked from the fork server on the launcher's
    own streams, passing signals on (``tests/support/cli_fork.py``); the console script where
    the command could not fork."""
    if not forkable(clean_env(env), clean_env({})):
        return command()
    return [*launcher(clean_env({})), command()[0]]


def clean_env(env: Mapping[str, str]) -> dict[str, str]:
    """Only what the test sets, plus what a process needs to start (no inherited gateway config)."""
    # PYTHONPATH too: a checkout on it (a worktree) is the code its subprocesses run
    kept = ("PATH", "HOME", "LANG", "SYSTEMROOT", "PYTHONPATH")
    base = {k: os.environ[k] for k in kept if k in os.environ}
    return {**base, "PYTHONUNBUFFERED": "1", **env}


def run_cli(env: Mapping[str, str], *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run one short command (``check``, ``routes``, ``pay``, a refused ``serve``) to completion,
    in a process forked from one that imported the CLI already (``tests/support/cli_fork.py``):
    its own environment, streams and exit status, without a Python start and its imports."""
    if not forkable(clean_env(env), clean_env({})):
        return run_script(env, *args, timeout=timeout)
    return run_forked([command()[0], *args], clean_env(env), timeout=timeout, base_env=clean_env({}))


def run_script(env: Mapping[str, str], *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``run_cli`` through the console script in a fresh interpreter: for the tests that prove
    the entry point itself (each command family keeps one)."""
    return subprocess.run(
        [*command(), *args], env=clean_env(env), capture_output=True, text=True, timeout=timeout, check=False
    )


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes] | ForkedProcess
    url: str
    port: int
    _stdout: IO[bytes]
    _stderr: IO[bytes]

    def terminate(self, timeout: float = 15) -> int:
        """SIGTERM to the server only (as an orchestrator sends it); wait for and return its exit code."""
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def stdout(self) -> str:
        return read_output(self._stdout)

    def stderr(self) -> str:
        return read_output(self._stderr)


def read_output(stream: IO[bytes]) -> str:
    """All the process wrote so far, read without moving the offset it shares with the process
    (a seek here would make its next write land over earlier output)."""
    fd = stream.fileno()
    return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", errors="replace")


def kill_group(process: subprocess.Popen[bytes] | ForkedProcess, grace_s: float = 10) -> None:
    """Stop a process started in its own session and everything it spawned: SIGTERM to the
    group (so it can clean up), then SIGKILL to whatever lingers after ``grace_s``."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    # The group outlives its leader only through a stray worker; it is ours, so end it.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


def _wait_until_serving(
    process: subprocess.Popen[bytes] | ForkedProcess, port: int, stderr: IO[bytes], timeout: float
) -> None:
    """Until hypercorn says it runs on ``port``: that line proves this process bound the port,
    where a TCP connect could reach another server that took the port first."""
    running = f"Running on http://127.0.0.1:{port} "
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if running in read_output(stderr):
            return
        if process.poll() is not None:
            raise RuntimeError(f"gateway exited with {process.returncode}:\n{read_output(stderr)}")
        time.sleep(0.02)
    raise TimeoutError(f"gateway did not listen on {port} within {timeout} s:\n{read_output(stderr)}")


@contextmanager
def serve(
    env: Mapping[str, str], *args: str, timeout: float = 20, script: bool = False
) -> Iterator[GatewayProcess]:
    """``x402-gateway serve --host 127.0.0.1 --port <free>`` with ``env``; killed on exit if still up.

    The serving process is forked from the CLI's fork server (``tests/support/cli_fork.py``): a
    process of its own, in a session of its own, whose hypercorn workers start as they always do;
    ``script=True`` runs the console script in a fresh interpreter instead (the entry point).
    GATEWAY_BASE_URL defaults to the bound address. A start that fails because another process
    took the free port first is tried again on a fresh one. No request is made (and logged)
    before the test's own.
    """
    for attempt in range(START_ATTEMPTS):
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
            argv = ["serve", "--host", "127.0.0.1", "--port", str(port), *args]
            process_env = clean_env({"GATEWAY_BASE_URL": url, **env})
            process: subprocess.Popen[bytes] | ForkedProcess
            if script or not forkable(process_env, clean_env({})):
                process = subprocess.Popen(
                    [*command(), *argv],
                    env=process_env,
                    stdout=stdout,
                    stderr=stderr,
                    start_new_session=True,
                )
            else:
                with open(os.devnull, "rb") as stdin:
                    streams = (stdin.fileno(), stdout.fileno(), stderr.fileno())
                    process = start_forked(
                        [command()[0], *argv], process_env, streams, base_env=clean_env({}), new_session=True
                    )
            try:
                try:
                    _wait_until_serving(process, port, stderr, timeout)
                except RuntimeError as failed:
                    if PORT_TAKEN in str(failed) and attempt < START_ATTEMPTS - 1:
                        continue
                    raise
                yield GatewayProcess(process, url, port, stdout, stderr)
                return
            finally:
                kill_group(process)
