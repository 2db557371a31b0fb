"""``GET /docs``: the API reference page, and the script and style it loads, from the package.

The page (``gateway/docs_page/``) renders ``/openapi.json`` in the browser and loads nothing
from anywhere else, so it works offline and under a Content-Security-Policy that allows only
the gateway's own script, style and document (no inline code). Its "try it" form sends a route's
request to this same origin (``connect-src 'self'``) without any credential, so the worst it can
do is read a 402 or a free route's data. The page names its assets with a
hash of their content (``docs/docs.js?v=...``), so browsers may keep the assets for a day and
still never run a stale script after an upgrade; every answer carries an ETag, and a matching
``If-None-Match`` gets a 304.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from gateway.web.asgi import RawHeaders, Receive, Scope, Send, header, send_bytes

PAGE_DIR = Path(__file__).resolve().parent.parent / "docs_page"
PAGE = "index.html"
CONTENT_TYPES = {
    ".html": b"text/html; charset=utf-8",
    ".js": b"text/javascript; charset=utf-8",
    ".css": b"text/css; charset=utf-8",
}
PAGE_POLICY = (
    b"default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src data:; "
    b"base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
ASSET_CACHE = b"public, max-age=86400"
PAGE_CACHE = b"no-cache"  # revalidated each time (a 304), so a new page names the new assets
_VERSION = re.compile(rb"\{\{version:([A-Za-z0-9_.-]+)\}\}")


def page_file(path: str) -> str:
    """The file a docs route serves: its path's last segment when it names one
    (``/docs/docs.js``), else the page itself (``/docs``)."""
    last = path.rsplit("/", 1)[-1]
    return last if "." in last else PAGE


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def _with_versions(page: bytes) -> bytes:
    """The page with each ``{{version:NAME}}`` replaced by a hash of the asset NAME."""
    return _VERSION.sub(lambda m: _digest((PAGE_DIR / m.group(1).decode()).read_bytes()).encode(), page)


def _etag_matches(if_none_match: str, etag: str) -> bool:
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags


class DocsHandler:
    """Serve one file of the reference page, read, versioned and hashed once at start-up."""

    def __init__(self, path: str) -> None:
        name = page_file(path)
        file = PAGE_DIR / name
        content_type = CONTENT_TYPES.get(file.suffix)
        if content_type is None or not file.is_file():
            raise ValueError(f"docs route {path}: the package has no page file {name!r} to serve")
        body = file.read_bytes()
        if name == PAGE:
            body = _with_versions(body)
        self.body = body
        self.etag = f'"{_digest(body)}"'
        common: RawHeaders = [
            (b"etag", self.etag.encode()),
            (b"cache-control", PAGE_CACHE if name == PAGE else ASSET_CACHE),
            (b"x-content-type-options", b"nosniff"),
        ]
        if name == PAGE:
            common += [(b"content-security-policy", PAGE_POLICY), (b"referrer-policy", b"no-referrer")]
        self.not_modified = common
        self.headers = [(b"content-type", content_type), *common]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if_none_match = header(scope, b"if-none-match")
        if if_none_match is not None and _etag_matches(if_none_match, self.etag):
            # No Content-Length: a 304's would have to be the 200's, and it carries no body.
            await send({"type": "http.response.start", "status": 304, "headers": self.not_modified})
            await send({"type": "http.response.body", "body": b""})
            return
        await send_bytes(send, 200, self.body, self.headers)
