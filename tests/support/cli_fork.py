"""``x402-gateway`` commands (short ones, ``serve``, ``sandbox``) run as real processes forked
from one that imported the CLI already: a process costs its own work, not a Python start and
some 0.4 s of imports.

A fresh interpreter spends about 0.4 s of CPU importing the gateway, aiohttp and solders before
``check`` or ``pay`` does anything; the suite runs a few hundred commands and a hundred-odd
gateways. Here one server per test process (``python -m tests.support.cli_fork``, started on
first use with the clean environment every command gets) imports them once and forks a child
per command. The child is a process of its own, as a fresh one would be: the command's
environment exactly (nothing of the server's), its arguments, working directory and three
standard streams (no other descriptor), a session of its own when asked (as
``start_new_session``), Python's default signal dispositions, ``atexit`` run and the streams
flushed at exit, and the exit status a fresh interpreter would give (``sys.exit``'s rules, 1
with a traceback on an exception). ``serve`` with one worker serves in the child itself (as it
does anywhere); more workers are spawned by hypercorn as always, fresh.

What only a fresh interpreter shows stays on one: the console script itself (its entry point),
a stream closed under the command. Those tests call ``run_script``, ``serve(script=True)`` or
``run_sandbox(script=True)``, and every command family keeps one that does.

Where the platform cannot (no ``fork``, pidfds or descriptor passing), or a command's
environment sets what the interpreter reads only as it starts (``LANG``, a ``PYTHON*`` variable,
``forkable``), the command runs through the console script instead.

Protocol, one Unix-socket connection per command: the client sends one JSON line (argv, env,
cwd) with its stdin, stdout and stderr as passed descriptors; the server answers with the
child's pid, then, when the child ended, its wait status. The server forks only while it has no
thread, ends when its stdin closes (the test process ended), and never runs a command itself.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import select
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path

PRELOADED = (
    "gateway.cli",
    "gateway.config",
    "gateway.routing.routes",
    "gateway.ledger.commands",
    "gateway.sandbox.faucet",
    "gateway.sandbox.run",
    "gateway.app",
    "gateway.mcp.endpoint",
    "hypercorn.asyncio",
    "hypercorn.config",
    "hypercorn.run",
    "client.pay",
    "client.credits",
    "aiohttp",
    "asyncpg",
    "solders.keypair",
    "solders.transaction",
)
"""What the commands run here import (lazily, inside ``main``): imported once, by the server."""

MAX_REQUEST = 1 << 20
MAX_FD = 65536
STARTUP_VARIABLES = ("LANG", "LC_ALL", "LC_CTYPE")
"""Read by the interpreter as it starts (with every ``PYTHON*`` but ``PYTHONUNBUFFERED``, which
the child's streams follow): a command whose value differs from the server's needs a fresh one."""


def forkable(env: Mapping[str, str], base_env: Mapping[str, str]) -> bool:
    """Whether a command with ``env`` can fork from a server started with ``base_env``: the
    platform can (``fork``, pidfds, descriptor passing), and nothing the interpreter reads only
    as it starts differs."""
    if not (hasattr(os, "fork") and hasattr(os, "pidfd_open") and hasattr(socket, "send_fds")):
        return False
    names = {n for n in (*env, *base_env) if n.startswith("PYTHON") or n in STARTUP_VARIABLES}
    return all(env.get(n) == base_env.get(n) for n in names - {"PYTHONUNBUFFERED"})


# --- the server -------------------------------------------------------------------------------


def _serve(path: str) -> None:
    for name in PRELOADED:
        __import__(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "parent")
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.data == "parent":
                if not os.read(sys.stdin.fileno(), 1024):
                    return  # the test process ended
            elif key.data == "accept":
                connection, _ = listener.accept()
                started = _fork(connection, listener, selector)
                if started is not None:
                    selector.register(started[0], selectors.EVENT_READ, (connection, started[1]))
            else:
                pidfd = key.fileobj
                connection, pid = key.data
                selector.unregister(pidfd)
                os.close(pidfd)  # type: ignore[arg-type]
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):
                    connection.sendall(f"{status}\n".encode())
                connection.close()


def _fork(
    connection: socket.socket, listener: socket.socket, selector: selectors.BaseSelector
) -> tuple[int, int] | None:
    """Read one request and fork its child; its pidfd and pid (None: a broken request)."""
    try:
        message, fds, _, _ = socket.recv_fds(connection, MAX_REQUEST, 3)
        request = json.loads(message)
    except (OSError, ValueError):
        connection.close()
        return None
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        connection.close()
        return None
    assert threading.active_count() == 1, "a thread in the fork server: forking would be unsafe"
    pid = os.fork()
    if pid == 0:
        selector.close()
        listener.close()
        connection.close()
        _run_child(request, fds)  # never returns
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):  # a client gone meanwhile: its child is still reaped
        connection.sendall(f"{pid}\n".encode())
    return os.pidfd_open(pid), pid


def _run_child(request: dict[str, object], fds: list[int]) -> None:
    """In the child: become the command's process, run ``main`` as the console script does, exit
    as a fresh interpreter would."""
    code = 1
    try:
        if request.get("new_session"):
            os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        os.closerange(3, MAX_FD)  # as Popen's close_fds: nothing of the server's, nor other commands'
        os.chdir(str(request["cwd"]))
        env = request["env"]
        assert isinstance(env, dict)
        os.environ.clear()
        os.environ.update(env)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _standard_streams(unbuffered=bool(env.get("PYTHONUNBUFFERED")))
        argv = request["argv"]
        assert isinstance(argv, list)
        sys.argv = [str(arg) for arg in argv]
        from gateway.cli import main

        code = _exit_code(main())
    except SystemExit as exit_:
        code = _exit_code(exit_.code)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                code = 120  # as Python's own exit does when the final flush fails
        os._exit(code)


def _standard_streams(*, unbuffered: bool) -> None:
    """New ``sys.stdin``, ``stdout`` and ``stderr`` on descriptors 0-2, as a fresh interpreter
    makes them (the server's encoding and error handlers: it started with the commands' locale)."""
    made = []
    for fd, mode, old in ((0, "rb", sys.stdin), (1, "wb", sys.stdout), (2, "wb", sys.stderr)):
        raw = io.FileIO(fd, mode, closefd=False)
        buffered: io.RawIOBase | io.BufferedIOBase
        if fd == 0:
            buffered = io.BufferedReader(raw)
        elif unbuffered:
            buffered = raw
        else:
            buffered = io.BufferedWriter(raw)
        made.append(
            io.TextIOWrapper(
                buffered,
                encoding=old.encoding,
                errors=old.errors,
                line_buffering=fd == 2 and not unbuffered,
                write_through=unbuffered or fd == 2,
            )
        )
    sys.stdin, sys.stdout, sys.stderr = made
    for name, stream in zip(("__stdin__", "__stdout__", "__stderr__"), made, strict=True):
        setattr(sys, name, stream)


def _exit_code(code: object) -> int:
    """``sys.exit(code)``'s status: None 0, an int itself, anything else printed and 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


# --- the client -------------------------------------------------------------------------------


class _Server:
    """This process's fork server, started on first use."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._path = ""

    def path(self, env: Mapping[str, str]) -> str:
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                folder = tempfile.mkdtemp(prefix="cli-fork-")
                self._path = os.path.join(folder, "s")
                self._process = subprocess.Popen(
                    [sys.executable, "-m", "tests.support.cli_fork", self._path],
                    env=dict(env),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    cwd=str(Path(__file__).resolve().parents[2]),
                )
                assert self._process.stdout is not None
                ready = self._process.stdout.readline()
                if ready != b"ready\n":
                    raise RuntimeError(f"the CLI fork server did not start: {ready!r}")
                atexit.register(self.stop)
            return self._path

    def stop(self) -> None:
        """End the server (it exits when its stdin closes) and reap it, with the commands' CPU."""
        with self._lock:
            process, self._process = self._process, None
        if process is not None and process.stdin is not None:
            process.stdin.close()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)


_SERVER = _Server()


def stop_server() -> None:
    """End this process's fork server, if it started (at the end of the session: an xdist worker
    may leave without running ``atexit``)."""
    _SERVER.stop()


class ForkedProcess:
    """A command's forked process, as much of ``subprocess.Popen`` as the tests use: ``pid``,
    ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``. Its exit
    status comes from the fork server (its parent) over the command's connection."""

    def __init__(self, args: list[str], connection: socket.socket) -> None:
        self.args = args
        self.returncode: int | None = None
        self._connection = connection
        self._buffer = b""
        self._lock = threading.Lock()
        line = self._line(30)
        if line is None:
            connection.close()
            raise RuntimeError("the CLI fork server did not fork")
        self.pid = int(line)

    def _line(self, timeout: float | None) -> bytes | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._connection], [], [], left)
            if not ready:
                return None
            chunk = self._connection.recv(4096)
            if not chunk:
                raise RuntimeError("the CLI fork server went away")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def wait(self, timeout: float | None = None) -> int:
        with self._lock:
            if self.returncode is None:
                line = self._line(timeout)
                if line is None:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0)
                self.returncode = os.waitstatus_to_exitcode(int(line))
                self._connection.close()
            return self.returncode

    def poll(self) -> int | None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            return self.wait(0)
        return None

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def start_forked(
    argv: Sequence[str],
    env: Mapping[str, str],
    streams: tuple[int, int, int],
    *,
    base_env: Mapping[str, str],
    new_session: bool = False,
) -> ForkedProcess:
    """``subprocess.Popen(argv, env=env, stdin/stdout/stderr=streams, start_new_session=...)``
    for an ``x402-gateway`` command, its process forked from the server (started with
    ``base_env``)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(_SERVER.path(base_env))
        request = {"argv": list(argv), "env": dict(env), "cwd": os.getcwd(), "new_session": new_session}
        socket.send_fds(connection, [json.dumps(request).encode()], list(streams))
        return ForkedProcess(list(argv), connection)
    except BaseException:
        connection.close()
        raise


def run_forked(
    argv: Sequence[str], env: Mapping[str, str], *, timeout: float, base_env: Mapping[str, str]
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)`` for an
    ``x402-gateway`` command, its process forked from the server (started with ``base_env``)."""
    with (
        tempfile.TemporaryFile() as stdout,
        tempfile.TemporaryFile() as stderr,
        open(os.devnull, "rb") as stdin,
    ):
        process = start_forked(
            argv, env, (stdin.fileno(), stdout.fileno(), stderr.fileno()), base_env=base_env
        )
        try:
            returncode = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)
            raise subprocess.TimeoutExpired(list(argv), timeout) from None
        outputs = []
        for stream in (stdout, stderr):
            stream.seek(0)
            outputs.append(_text(stream.read()))
    return subprocess.CompletedProcess(list(argv), returncode, outputs[0], outputs[1])


def _text(data: bytes) -> str:
    """As ``subprocess.run(text=True)`` decodes (the locale's encoding, universal newlines)."""
    return io.TextIOWrapper(io.BytesIO(data)).read()


def launcher(base_env: Mapping[str, str]) -> list[str]:
    """The command line of a launcher (this file, run by path: it imports only the standard
    library) that has the command appended to it forked from this process's server, started
    with ``base_env``; for a program that starts the command itself (an MCP client over stdio)."""
    return [sys.executable, str(Path(__file__).resolve()), "--exec", _SERVER.path(base_env)]


def _launch(path: str, argv: list[str]) -> None:
    """The launcher: ``argv`` forked from the server at ``path`` with this process's streams,
    environment and working directory; the signals its parent sends passed on; ends as the
    command ended (by the same signal, when a signal ended it)."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.connect(path)
    request = {"argv": argv, "env": dict(os.environ), "cwd": os.getcwd(), "new_session": False}
    socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2])
    process = ForkedProcess(argv, connection)

    def pass_on(signum: int, _: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signum)  # not send_signal: wait() holds its lock meanwhile

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, pass_on)
    code = process.wait()
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    if sys.argv[1] == "--exec":
        _launch(sys.argv[2], sys.argv[3:])
    else:
        _serve(sys.argv[1])
