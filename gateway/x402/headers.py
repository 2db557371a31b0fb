"""Header codecs: base64 (standard alphabet, padded) of UTF-8 JSON, for v1 and v2 headers."""

from __future__ import annotations

import base64
import binascii
from typing import TypeVar

import msgspec

T = TypeVar("T")

PAYMENT_SIGNATURE = b"payment-signature"
X_PAYMENT = b"x-payment"
SIGN_IN_WITH_X = b"sign-in-with-x"
CREDIT_BALANCE_HEADER = b"x-credit-balance"
"""On an answer paid from prepaid credit: the wallet's credit left, in micro-USDC."""
MAX_HEADER_CHARS = 16_384

_encoder = msgspec.json.Encoder()


class HeaderError(ValueError):
    """The header is not base64 JSON of the expected shape; the message is safe to show."""


def encode_header(value: object) -> str:
    """base64(JSON(value)) as sent in PAYMENT-REQUIRED, PAYMENT-RESPONSE and friends."""
    return base64.b64encode(_encoder.encode(value)).decode("ascii")


def decode_header(value: str, shape: type[T]) -> T:
    """Decode base64 JSON into ``shape``; any defect raises :class:`HeaderError`."""
    if len(value) > MAX_HEADER_CHARS:
        raise HeaderError(f"header longer than {MAX_HEADER_CHARS} characters")
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise HeaderError("header is not valid base64") from exc
    try:
        return msgspec.json.decode(raw, type=shape)
    except msgspec.ValidationError as exc:
        raise HeaderError(f"header JSON has the wrong shape: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise HeaderError("header is not valid JSON") from exc
    except RecursionError:  # msgspec's nesting limit (a few hundred levels), not a server fault
        raise HeaderError("header JSON is nested too deeply") from None
