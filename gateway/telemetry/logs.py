"""Logs on stdout, one JSON object per line. Callers pass only non-secret fields.

A line is ``{"ts", "level", "msg", "pid", ...fields}``. Fields come as keyword arguments
(:func:`log_event`) or, on paths that log per request, as a msgspec Struct (:func:`log_struct`),
which is encoded in one call without building a dict. Neither asks the logging module to find
the caller's frame: no line of ours shows it.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import msgspec

_encoder = msgspec.json.Encoder()
LOGGER_NAME = "x402_gateway"


class _Head(msgspec.Struct, gc=False):
    """The keys every line starts with."""

    ts: float
    level: str
    msg: str
    pid: int | None


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON line; structured fields come from ``extra={"fields": ...}``,
    a dict (its None values left out) or a msgspec Struct (encoded as it is)."""

    def format(self, record: logging.LogRecord) -> str:
        head = _Head(round(record.created, 3), record.levelname.lower(), record.getMessage(), record.process)
        line = _encoder.encode(head)[:-1]
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            fields = {k: v for k, v in fields.items() if v is not None}
        if isinstance(fields, dict | msgspec.Struct):
            body = _encoder.encode(fields)
            if len(body) > 2:  # not "{}"
                line += b"," + body[1:-1]
        if record.exc_info and record.exc_info[0] is not None:
            line += b',"exc_type":' + _encoder.encode(record.exc_info[0].__name__)
        return (line + b"}").decode()


def configure_logging(level: str) -> None:
    """Send the gateway's logs to stdout as JSON lines (idempotent)."""
    # No line shows a thread or process name: skip looking them up for every record.
    logging.logThreads = False
    logging.logMultiprocessing = False
    logger = logging.getLogger(LOGGER_NAME)
    logger.setLevel(level)
    logger.propagate = False
    if not any(getattr(h, "_x402_gateway", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(JsonFormatter())
        handler._x402_gateway = True  # type: ignore[attr-defined]
        logger.addHandler(handler)


def get_logger() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)


def _emit(logger: logging.Logger, level: int, msg: str, fields: object) -> None:
    logger.handle(logger.makeRecord(logger.name, level, "", 0, msg, (), None, extra={"fields": fields}))


def log_event(msg: str, level: int = logging.INFO, **fields: Any) -> None:
    """One structured line; ``fields`` must never hold a secret."""
    logger = get_logger()
    if logger.isEnabledFor(level):
        _emit(logger, level, msg, fields)


def log_struct(logger: logging.Logger, level: int, msg: str, fields: msgspec.Struct) -> None:
    """One structured line from a Struct (its defaults left out if it says ``omit_defaults``);
    for lines written per request. ``fields`` must never hold a secret."""
    if logger.isEnabledFor(level):
        _emit(logger, level, msg, fields)


def monotonic_ms() -> float:
    return time.perf_counter() * 1000.0
