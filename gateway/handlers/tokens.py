"""The asset-data routes (``handler: tokens``): one validated request -> one upstream call -> envelope.

The request arrives validated (the :class:`ValidatedInput` in the request context's ``input``,
put there by the access middleware); the handler only builds the upstream request from it. The
upstream is called with the server-side key in ``x-api-key`` and the client's ``Accept``; no
other client header goes out. Success is a :class:`TokensEnvelope` with the upstream JSON
passed through as is.

Upstream failures (the client is told what it can act on, never our key's problems):

====================================  ======  ===================
upstream answer                       status  code
====================================  ======  ===================
2xx with a JSON body                  200     (envelope)
404, 410                              404     not_found
400, 422                              400     invalid_request
429                                   429     rate_limited (Retry-After kept when numeric)
401, 403 and any other 4xx            502     upstream_error (our key or their bug, not the client's)
5xx, non-JSON, oversized, refused     502     upstream_error
no answer within the upstream timeout 504     upstream_timeout
====================================  ======  ===================

Upstream error bodies and headers are never passed on. The API key is redacted from anything
that is (the JSON result), however the upstream happens to echo it.
"""

from __future__ import annotations

import re
from typing import Any, Final
from urllib.parse import quote, urlencode

import msgspec
from yarl import URL

from gateway.errors import ErrorCode, GatewayError
from gateway.outbound.client import (
    Answer,
    UpstreamClient,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamTooLarge,
    UpstreamUnreachable,
)
from gateway.outbound.metrics import ErrorKind
from gateway.routing.routes import RouteSpec
from gateway.routing.validation import ValidatedInput
from gateway.telemetry.logs import log_event
from gateway.web.asgi import JSON_CONTENT_TYPE, Receive, Scope, Send, header, send_bytes
from gateway.web.context import validated_input

PROVIDER: Final = "tokens"
MAX_RETRY_AFTER_S: Final = 3600
REDACTED: Final = "[redacted]"
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
_encoder = msgspec.json.Encoder()


class TokensEnvelope(msgspec.Struct):
    """Every successful asset-data answer; ``result`` is the upstream JSON, untouched."""

    ok: bool
    provider: str
    surface: str
    method: str
    result: msgspec.Raw


class TokensHandler:
    """Proxy one asset-data operation; the URL template, key and headers are fixed at start-up."""

    def __init__(
        self, route: RouteSpec, *, base_url: str | None, api_key: str, client: UpstreamClient
    ) -> None:
        """``client`` calls the upstream: its timeout, its cap on the answer and its metrics,
        labelled with the upstream's route-table name."""
        if route.upstream is None or route.upstream_path is None:
            raise ValueError(f"route {route.name}: a tokens route needs upstream and upstream_path")
        base = base_url
        if not base:
            raise ValueError(f"route {route.name}: upstream {route.upstream} is not configured")
        # Alternating literal text and path-parameter names: ["/v1/assets/", "assetId", "/ohlcv"].
        self.pieces = _PLACEHOLDER.split(route.upstream_path)
        missing = set(self.pieces[1::2]) - set(_PLACEHOLDER.findall(route.path))
        if missing:
            raise ValueError(f"route {route.name}: upstream_path names unknown parameters {sorted(missing)}")
        self.base = base.rstrip("/")
        self.route_name = route.name
        self.client = client
        self.method = route.method
        self.operation = route.operation or route.name
        self._key = api_key
        self.headers = [JSON_CONTENT_TYPE, (b"cache-control", b"no-store")]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        validated = validated_input(scope)
        url = self._url(validated)
        headers = {"x-api-key": self._key, "accept": _accept(scope)}
        body = None
        if self.method != "GET":
            body = _encoder.encode(validated.body)
            headers["content-type"] = "application/json"
        result = self._result(await self._call(url, headers, body))
        envelope = TokensEnvelope(
            ok=True, provider=PROVIDER, surface=PROVIDER, method=self.operation, result=result
        )
        await send_bytes(send, 200, _encoder.encode(envelope), self.headers)

    def _url(self, validated: ValidatedInput) -> URL:
        """The upstream URL: path parameters quoted into the template, the query re-encoded."""
        parts = list(self.pieces)
        for i in range(1, len(parts), 2):
            value = str(validated.path[parts[i]])
            if value in ("", ".", ".."):  # the schema refuses these; never let one reach a path
                raise GatewayError(
                    ErrorCode.INVALID_REQUEST, f"{parts[i]}: is not a valid id", {"parameter": parts[i]}
                )
            parts[i] = quote(value, safe="")
        url = self.base + "".join(parts)
        if validated.query:
            url += "?" + _encode_query(validated.query)
        return URL(url, encoded=True)

    async def _call(self, url: URL, headers: dict[str, str], body: bytes | None) -> Answer:
        """The upstream's 2xx answer; any other status or a transport failure is raised as the
        error it maps to."""
        try:
            return await self.client.request(self.method, url, headers=headers, data=body)
        except UpstreamStatus as exc:
            raise self._status_error(exc.status, exc.answer.headers.get("retry-after", "")) from None
        except UpstreamTooLarge as exc:
            raise GatewayError(
                ErrorCode.UPSTREAM_ERROR,
                f"the asset-data upstream answered more than {exc.limit} bytes",
            ) from None
        except UpstreamTimeout:
            self._log("timeout")
            raise GatewayError(
                ErrorCode.UPSTREAM_TIMEOUT, "the asset-data upstream did not answer in time"
            ) from None
        except UpstreamUnreachable as exc:
            # Only the exception's type: its text can name the upstream host.
            self._log("unreachable", error=exc.cause)
            raise GatewayError(ErrorCode.UPSTREAM_ERROR, "the asset-data upstream is unreachable") from None

    def _result(self, answer: Answer) -> msgspec.Raw:
        """The upstream JSON, scrubbed of our key."""
        raw = answer.body
        try:
            value = msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            self.client.failed(ErrorKind.INVALID_ANSWER)
            self._log("invalid JSON", upstream_status=answer.status)
            raise GatewayError(
                ErrorCode.UPSTREAM_ERROR, "the asset-data upstream answered with invalid JSON"
            ) from None
        return msgspec.Raw(self._scrub(raw, value))

    def _status_error(self, status: int, retry_after: str) -> GatewayError:
        details = {"upstreamStatus": status}
        if status in (404, 410):
            return GatewayError(ErrorCode.NOT_FOUND, "the asset-data upstream has no such resource", details)
        if status in (400, 422):
            return GatewayError(
                ErrorCode.INVALID_REQUEST, "the asset-data upstream refused the request", details
            )
        if status == 429:
            seconds = int(retry_after) if retry_after.isdigit() else 60
            return GatewayError(
                ErrorCode.RATE_LIMITED,
                "the asset-data upstream is rate limiting, try again later",
                details,
                headers={"Retry-After": str(min(max(seconds, 1), MAX_RETRY_AFTER_S))},
            )
        self._log("error status", upstream_status=status)
        return GatewayError(ErrorCode.UPSTREAM_ERROR, f"the asset-data upstream answered {status}", details)

    def _scrub(self, raw: bytes, value: Any) -> bytes:
        """``raw`` with every occurrence of the API key replaced; fails closed if one survives.

        A plain byte search finds the key unless JSON escapes hide it, and escapes need a
        backslash; only then (or on a hit) is the decoded value walked and re-encoded.
        """
        key = self._key
        if key.encode() not in raw and b"\\" not in raw:
            return raw
        try:
            clean, changed = _redact(value, key)
            out = _encoder.encode(clean) if changed else raw
        except RecursionError:
            out = key.encode()  # too deep to inspect: refuse it below
        if key.encode() in out:
            self.client.failed(ErrorKind.INVALID_ANSWER)
            self._log("unredactable answer")
            raise GatewayError(ErrorCode.UPSTREAM_ERROR, "the asset-data upstream answered unusably")
        return out

    def _log(self, problem: str, **fields: Any) -> None:
        log_event("asset-data upstream failure", route=self.route_name, problem=problem, **fields)


def _accept(scope: Scope) -> str:
    """The client's Accept when it is plain printable ASCII, else JSON."""
    value = header(scope, b"accept")
    if value and value.isascii() and value.isprintable():
        return value
    return "application/json"


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(_query_value(item) for item in value)
    return str(value)


def _encode_query(query: dict[str, Any]) -> str:
    """Validated query -> query string; comma lists are joined again, commas kept readable."""
    return urlencode([(k, _query_value(v)) for k, v in query.items()], quote_via=quote, safe=",")


def _redact(value: Any, key: str) -> tuple[Any, bool]:
    """``value`` with ``key`` replaced in every string and object key, and whether anything changed."""
    if isinstance(value, str):
        return (value.replace(key, REDACTED), True) if key in value else (value, False)
    if isinstance(value, list):
        items = [_redact(item, key) for item in value]
        if any(changed for _, changed in items):
            return [item for item, _ in items], True
        return value, False
    if isinstance(value, dict):
        pairs = [(_redact(k, key), _redact(v, key)) for k, v in value.items()]
        if any(kc or vc for (_, kc), (_, vc) in pairs):
            return {k: v for (k, _), (v, _) in pairs}, True
        return value, False
    return value, False
