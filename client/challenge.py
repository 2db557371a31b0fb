"""A gateway's 402 as the buyer reads it: the challenge, its sign-in extension, the one error type.

Kept apart from ``client.pay`` so that credit sessions (``client.sessions``), which ``pay`` uses,
can read a challenge without importing ``pay`` back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from gateway.x402.headers import HeaderError, decode_header
from gateway.x402.types import ResourceInfo

SIWX_EXTENSION = "sign-in-with-x"


class PayError(Exception):
    """Why the request could not be completed; the message is one line, safe to print.

    ``code`` is stable for scripts (``--json``); x402 words where x402 has one.
    """

    def __init__(self, message: str, code: str = "pay_failed") -> None:
        super().__init__(message)
        self.code = code



class Challenge(msgspec.Struct):
    """A 402 challenge as any x402 server may send it (v1 or v2); accepts stay raw until chosen."""

    x402Version: int = 2
    accepts: list[dict[str, Any]] = msgspec.field(default_factory=list)
    resource: ResourceInfo | str | None = None
    error: str | None = None
    extensions: dict[str, Any] | None = None


def parse_challenge(headers: Mapping[str, str], body: bytes) -> Challenge:
    """The challenge of a 402: the ``PAYMENT-REQUIRED`` header, else the JSON body."""
    header = headers.get("payment-required") or headers.get("PAYMENT-REQUIRED")
    if header:
        try:
            return decode_header(header, Challenge)
        except HeaderError:
            pass
    try:
        return msgspec.json.decode(body, type=Challenge)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        raise PayError("402 without a readable x402 challenge") from None



def siwx_extension(challenge: Challenge) -> dict[str, Any] | None:
    ext = (challenge.extensions or {}).get(SIWX_EXTENSION)
    return ext if isinstance(ext, dict) else None
