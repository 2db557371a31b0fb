"""Which port each part of the sandbox listens on, so that printed commands survive a restart.

A port asked for on the command line wins; else the one the state directory kept from the last
run (the one its banner printed); else the default (the gateway: ``$PORT`` or 8080; the local
chain and the asset-data sample: any free port, kept from then on). A port that is taken fails
the start with one line naming the part, where the port came from and how to move it.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PortChoice:
    """One part's port for this run."""

    part: str  # "the gateway", ...
    flag: str  # the option that sets it
    requested: int | None  # from the command line
    kept: int | None  # from the state directory
    default: int  # 0: any free port

    @property
    def port(self) -> int:
        if self.requested is not None:
            return self.requested
        return self.kept if self.kept is not None else self.default

    def moved_note(self, bound: int) -> str | None:
        """A line for the banner when this run left the port the last run's commands name."""
        if self.kept is None or self.kept == bound:
            return None
        return (
            f"{self.part} moved from port {self.kept} to {bound} ({self.flag}): "
            "commands printed by earlier runs name the old port"
        )


def check_free(host: str, choice: PortChoice, state_dir: Path | None) -> None:
    """Fail fast (OSError, one line) when ``choice``'s port is taken, before anything starts."""
    port = choice.port
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if choice.requested is None and choice.kept is not None and state_dir is not None:
                source = (
                    f"{choice.part}'s port, kept in {state_dir} so that printed commands keep "
                    f"working; stop what listens there, or pass {choice.flag} to move it"
                )
            else:
                source = f"{choice.part}'s port; pass {choice.flag} to use another"
            raise OSError(f"cannot listen on {host}:{port}: {exc.strerror} ({source})") from None


def check_distinct(choices: tuple[PortChoice, ...]) -> None:
    """Fail (OSError, one line) when two parts would share a port: the second could not listen,
    and a start-up probe would find the first one answering in its place."""
    seen: dict[int, PortChoice] = {}
    for choice in choices:
        first = seen.setdefault(choice.port, choice) if choice.port else choice
        if first is not choice:
            raise OSError(
                f"{first.part} and {choice.part} would both listen on port {choice.port}: "
                f"give {choice.flag if choice.requested is not None else first.flag} another"
            )
