"""The gateway's log lines, as it writes them to stdout, captured in the test process."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

from gateway.telemetry.logs import LOGGER_NAME, JsonFormatter


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(JsonFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@contextmanager
def captured_log_lines() -> Iterator[list[str]]:
    """Every gateway log line (of an in-process gateway) while open, as rendered for stdout."""
    handler = _Lines()
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(handler)
    try:
        yield handler.lines
    finally:
        logger.removeHandler(handler)
