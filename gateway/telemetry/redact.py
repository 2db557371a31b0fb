"""Redaction at the boundary: provider URLs and keys must never reach a response or a log."""

from __future__ import annotations

from urllib.parse import parse_qsl, unquote, urlsplit

MIN_SECRET_PART = 16
"""Shorter URL pieces (``v1``, ``rpc``, ``mainnet``) are no keys, and hiding them would mangle text."""


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


def url_secrets(url: str) -> tuple[str, ...]:
    """The pieces of ``url`` that may be a key: userinfo, query values and path segments."""
    try:
        parts = urlsplit(url)
        pieces = [parts.username or "", parts.password or ""]
    except ValueError:
        return ()
    pieces += [unquote(p) for p in parts.path.split("/")]
    pieces += [value for _, value in parse_qsl(parts.query, keep_blank_values=True)]
    return tuple(sorted({p for p in pieces if len(p) >= MIN_SECRET_PART}, key=len, reverse=True))


def scrub(text: str, secrets: tuple[str, ...]) -> str:
    """``text`` with every occurrence of ``secrets`` replaced by ``***`` (for upstream text we pass on)."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
