"""Redaction at the boundary: provider URLs and keys must never reach a response or a log."""

from __future__ import annotations

from urllib.parse import urlsplit


class Secret:
    """A string that refuses to print itself; call :meth:`reveal` where the value is needed."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)

    def __repr__(self) -> str:
        return "Secret('***')" if self._value else "Secret('')"

    __str__ = __repr__


def redact_url(url: str) -> str:
    """Keep scheme and host (and port); hide userinfo, path and query, where keys live."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or "?"
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<invalid url>"
    hidden = "/***" if (parts.path not in ("", "/") or parts.query or parts.username) else ""
    return f"{parts.scheme}://{host}{port}{hidden}"
