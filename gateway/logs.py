"""Logs on stdout, one JSON object per line. Callers pass only non-secret fields."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import msgspec

_encoder = msgspec.json.Encoder()
LOGGER_NAME = "x402_gateway"


class JsonFormatter(logging.Formatter):
    """Render a record as one JSON line; structured fields come from ``extra={"fields": {...}}``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
            "pid": record.process,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update({k: v for k, v in fields.items() if v is not None})
        if record.exc_info and record.exc_info[0] is not None:
            entry["exc_type"] = record.exc_info[0].__name__
        return _encoder.encode(entry).decode()


def configure_logging(level: str) -> None:
    """Send the gateway's logs to stdout as JSON lines (idempotent)."""
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


def log_event(msg: str, level: int = logging.INFO, **fields: Any) -> None:
    """One structured line; ``fields`` must never hold a secret."""
    get_logger().log(level, msg, extra={"fields": fields})


def monotonic_ms() -> float:
    return time.perf_counter() * 1000.0
