"""Standard streams that outlive the reader: ``x402-gateway pay ... | head -c 10`` ends quietly.

Python ignores SIGPIPE, so a write to a pipe whose reader left raises ``BrokenPipeError``:
unhandled, a traceback; at exit, an "Exception ignored" line from the final flush. Letting
SIGPIPE kill the process instead would cut ``pay`` short after the payment was made, before its
summary reached stderr. So each stream is guarded: the first broken write points the stream's
descriptor at /dev/null (the standard recipe: the interpreter's own flush at exit then succeeds)
and the command carries on, its other stream still saying what happened.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO


class PipeGuard:
    """A text stream whose writes after the reader left are dropped instead of raising."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.broken = False

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._lost()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._lost()

    def _lost(self) -> None:
        self.broken = True
        with contextlib.suppress(OSError, ValueError):  # a stream without a descriptor (tests)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_streams() -> Iterator[None]:
    """stdout and stderr guarded while the block runs, flushed before it ends."""
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PipeGuard(out), PipeGuard(err)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        sys.stdout, sys.stderr = out, err
