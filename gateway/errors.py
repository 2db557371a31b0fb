"""The one JSON error shape of the service and the status each error code maps to.

Every non-402 error the gateway emits goes through :func:`error_body`, so the shape
``{"ok": false, "error": {"code", "message", "details"}}`` cannot drift between modules.
"""

from __future__ import annotations

import enum
from typing import Any

import msgspec


class ErrorCode(enum.StrEnum):
    """Stable snake_case codes; clients switch on these, so never rename one."""

    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    INVALID_REQUEST = "invalid_request"
    BODY_TOO_LARGE = "body_too_large"
    REQUEST_TIMEOUT = "request_timeout"
    UNAUTHORIZED = "unauthorized"
    RATE_LIMITED = "rate_limited"
    UPSTREAM_ERROR = "upstream_error"
    UPSTREAM_TIMEOUT = "upstream_timeout"
    STORE_UNAVAILABLE = "store_unavailable"
    FACILITATOR_UNAVAILABLE = "facilitator_unavailable"
    IDEMPOTENCY_CONFLICT = "idempotency_conflict"
    CALL_IN_PROGRESS = "call_in_progress"
    SETTLEMENT_PENDING = "settlement_pending"
    NOT_READY = "not_ready"
    INTERNAL_ERROR = "internal_error"


STATUS_BY_CODE: dict[ErrorCode, int] = {
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.METHOD_NOT_ALLOWED: 405,
    ErrorCode.INVALID_REQUEST: 400,
    ErrorCode.BODY_TOO_LARGE: 413,
    ErrorCode.REQUEST_TIMEOUT: 408,
    ErrorCode.UNAUTHORIZED: 401,
    ErrorCode.RATE_LIMITED: 429,
    ErrorCode.UPSTREAM_ERROR: 502,
    ErrorCode.UPSTREAM_TIMEOUT: 504,
    ErrorCode.STORE_UNAVAILABLE: 503,
    ErrorCode.FACILITATOR_UNAVAILABLE: 503,
    ErrorCode.IDEMPOTENCY_CONFLICT: 409,
    ErrorCode.CALL_IN_PROGRESS: 409,
    ErrorCode.SETTLEMENT_PENDING: 503,
    ErrorCode.NOT_READY: 503,
    ErrorCode.INTERNAL_ERROR: 500,
}


class ErrorDetail(msgspec.Struct, omit_defaults=True):
    code: str
    message: str
    details: dict[str, Any] | None = None


class ErrorBody(msgspec.Struct, kw_only=True):
    ok: bool = False
    error: ErrorDetail


_encoder = msgspec.json.Encoder()


class GatewayError(Exception):
    """An expected failure that becomes a JSON error response; never carries secrets."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details
        self.headers = headers or {}

    @property
    def status(self) -> int:
        return STATUS_BY_CODE[self.code]


def error_body(code: ErrorCode, message: str, details: dict[str, Any] | None = None) -> bytes:
    """Encode the one error shape."""
    return _encoder.encode(ErrorBody(error=ErrorDetail(code=code.value, message=message, details=details)))
