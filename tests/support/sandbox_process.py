"""Run ``x402-gateway sandbox`` as a real subprocess and read what its banner says."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests.support.cli_fork import ForkedProcess, forkable, start_forked
from tests.support.gateway_process import clean_env, command, kill_group, read_output
from tests.support.ports import PORT_TAKEN, START_ATTEMPTS, free_port

READY_LINE = "Ctrl-C stops it."
STARTUP_TIMEOUT_S = 15.0


@dataclass
class Sandbox:
    process: subprocess.Popen[bytes] | ForkedProcess
    url: str
    rpc_url: str
    wallet: str
    usdc_account: str
    pay_to: str
    key_file: Path
    banner: str
    stdout: IO[bytes]
    stderr: IO[bytes]

    @property
    def commands(self) -> list[list[str]]:
        """The commands the banner prints to paste (``balance``, ``pay``, ``credits``), as
        argument lists."""
        return [
            shlex.split(line)
            for line in self.banner.splitlines()
            if re.match(r"^\s+x402-gateway (pay|balance|credits) ", line)
        ]

    @property
    def credit_commands(self) -> list[list[str]]:
        """The commands of the banner's prepaid-credit part: top-up, a call on credit, balance."""
        part = self.banner.split("\nPrepaid credit", 1)[1].split("\n\n", 1)[0]
        return [shlex.split(line) for line in part.splitlines() if line.startswith("  x402-gateway ")]

    @property
    def exports(self) -> dict[str, str]:
        """The variables of the banner's ``export`` line."""
        [line] = [line for line in self.banner.splitlines() if line.strip().startswith("export ")]
        return dict(word.split("=", 1) for word in shlex.split(line)[1:])


def banner_value(text: str, label: str) -> str:
    match = re.search(rf"^\s*{re.escape(label)}:\s+(\S+)", text, re.MULTILINE)
    assert match, f"banner has no {label!r}:\n{text}"
    return match.group(1)


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return int(resp.status)
    except (urllib.error.URLError, OSError):
        return 0


def _start(
    args: tuple[str, ...],
    port: int,
    stdout: IO[bytes],
    stderr: IO[bytes],
    env: Mapping[str, str],
    port_flag: bool,
    script: bool,
) -> subprocess.Popen[bytes] | ForkedProcess:
    """Start the sandbox and wait until its banner is out and it answers; raises if it exits."""
    for stream in (stdout, stderr):
        stream.seek(0)
        stream.truncate()
    argv = ["sandbox", *(("--port", str(port)) if port_flag else ()), *args]
    process: subprocess.Popen[bytes] | ForkedProcess
    if script or not forkable(clean_env(env), clean_env({})):
        process = subprocess.Popen(
            [*command(), *argv], env=clean_env(env), stdout=stdout, stderr=stderr, start_new_session=True
        )
    else:
        with open(os.devnull, "rb") as stdin:
            streams = (stdin.fileno(), stdout.fileno(), stderr.fileno())
            process = start_forked(
                [command()[0], *argv], clean_env(env), streams, base_env=clean_env({}), new_session=True
            )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while READY_LINE not in read_output(stdout) or _status(url + "/healthz") != 200:
        if process.poll() is not None:
            raise RuntimeError(f"sandbox exited with {process.returncode}:\n{read_output(stderr)}")
        if time.monotonic() > deadline:
            kill_group(process, grace_s=5)
            raise TimeoutError(f"sandbox not ready in {STARTUP_TIMEOUT_S} s:\n{read_output(stderr)}")
        time.sleep(0.05)
    return process


@contextmanager
def run_sandbox(
    *args: str,
    port: int | None = None,
    env: Mapping[str, str] = {},
    port_flag: bool = True,
    script: bool = False,
) -> Iterator[Sandbox]:
    """``x402-gateway sandbox --port <free> *args`` until ready; stopped (SIGTERM first) on exit.

    Forked from the CLI's fork server (``tests/support/cli_fork.py``), in a session of its own;
    ``script=True`` runs the console script in a fresh interpreter (the entry point, as pasted).

    ``port_flag=False`` leaves ``--port`` out: the sandbox takes the port its ``--state-dir``
    kept, which the caller passes as ``port``. A free port can be taken by another process
    before the sandbox binds it (its chain's and asset API's ports too), so a start that fails
    on a taken port is tried again on fresh ones.
    """
    assert port_flag or port, "without --port, say which port the state directory kept"
    with tempfile.TemporaryFile() as stdout, tempfile.TemporaryFile() as stderr:
        for attempt in range(START_ATTEMPTS):
            chosen = port or free_port()
            try:
                process = _start(args, chosen, stdout, stderr, env, port_flag, script)
                break
            except RuntimeError as failed:
                if PORT_TAKEN not in str(failed) or attempt == START_ATTEMPTS - 1:
                    raise
        try:
            text = read_output(stdout)
            yield Sandbox(
                process=process,
                url=f"http://127.0.0.1:{chosen}",
                rpc_url=banner_value(text, "local chain"),
                wallet=banner_value(text, "demo wallet"),
                usdc_account=banner_value(text, "demo USDC account"),
                pay_to=banner_value(text, "payTo"),
                key_file=Path(banner_value(text, "demo key file")),
                banner=text,
                stdout=stdout,
                stderr=stderr,
            )
        finally:
            kill_group(process, grace_s=5)  # SIGTERM first: the sandbox saves or removes its state
