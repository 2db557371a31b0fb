"""Facilitators: who verifies and settles payments for the gateway.

One protocol, two implementations: :class:`HttpFacilitator` speaks the facilitator HTTP API
to an external service (Coinbase CDP by default), and ``LocalFacilitator``
(``gateway.facilitators.local``) verifies and settles with our own fee-payer wallet.
The payment core (PaymentGate, Settlement) only ever sees :class:`Facilitator`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Final, Protocol, TypeVar
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import msgspec

from gateway.errors import ErrorCode, GatewayError
from gateway.facilitators.cdp_auth import CdpKey
from gateway.outbound.client import (
    Answer,
    UpstreamClient,
    UpstreamStatus,
    UpstreamTimeout,
    UpstreamTooLarge,
    UpstreamUnreachable,
)
from gateway.outbound.metrics import ErrorKind, status_kind
from gateway.store import Store, StoreUnavailable, keys
from gateway.telemetry.logs import log_event
from gateway.telemetry.redact import Secret, redact_url
from gateway.x402.types import (
    SCHEME_EXACT,
    SOLANA_MAINNET,
    FacilitatorRequest,
    PaymentPayload,
    PaymentRequirements,
    SettleResponse,
    SupportedResponse,
    VerifyResponse,
)

T = TypeVar("T")


class FacilitatorUnavailable(Exception):
    """The facilitator could not be reached or answered garbage: 503, no upstream call."""


class Facilitator(Protocol):
    url: str
    """Public URL advertised in the 402's ``facilitator.url`` (never carries credentials)."""

    async def supported(self) -> SupportedResponse: ...

    async def verify(self, payload: PaymentPayload, requirements: PaymentRequirements) -> VerifyResponse: ...

    async def settle(self, payload: PaymentPayload, requirements: PaymentRequirements) -> SettleResponse: ...

    async def close(self) -> None: ...


def fee_payer_for(supported: SupportedResponse, network: str, scheme: str = SCHEME_EXACT) -> str | None:
    """``extra.feePayer`` the facilitator advertises for ``scheme`` on ``network`` (the 402 needs it).

    A v2 kind wins over a v1 kind for the same network; ``None`` when the facilitator does not
    support the pair or names no fee payer.
    """
    found: str | None = None
    for kind in supported.kinds:
        if kind.scheme != scheme or kind.network != network or not kind.extra:
            continue
        fee_payer = kind.extra.get("feePayer")
        if not isinstance(fee_payer, str) or not fee_payer:
            continue
        if kind.x402Version == 2:
            return fee_payer
        found = found or fee_payer
    return found


# --- the external facilitator over HTTP ------------------------------------------------------

X402_VERSION: Final = 2
DEFAULT_TIMEOUT_S: Final = 10.0
SUPPORTED_TTL_S: Final = 300.0
"""How long a ``/supported`` answer is trusted: fee payers change rarely, challenges need it often."""
SUPPORTED_RETRY_S: Final = 15.0
"""After a failed refresh, keep serving the stale answer and try again this much later."""
MAX_RESPONSE_BYTES: Final = 1 << 20

_ANSWER_STATUSES: Final = frozenset({400, 402, 409, 422})
"""Non-2xx statuses whose body may still be a protocol answer (e.g. 400 with ``isValid: false``).
Auth failures, rate limits and 5xx are never answers: they mean the facilitator is unusable."""

_encoder = msgspec.json.Encoder()
_verify_decoder = msgspec.json.Decoder(VerifyResponse)
_settle_decoder = msgspec.json.Decoder(SettleResponse)
_supported_decoder = msgspec.json.Decoder(SupportedResponse)


class HttpFacilitator:
    """Client of an external facilitator (``{base}/verify``, ``/settle``, ``/supported``).

    One session for its life (its own, opened lazily; or ``session``: an aiohttp session or an
    :class:`UpstreamClient` to share one with), a fresh CDP JWT per request when an API key is
    configured, redirects never followed (the JWT is for one host), and ``/supported`` cached
    for ``supported_ttl_s``.
    Every failure to get a well-formed answer becomes :class:`FacilitatorUnavailable`, whose
    message never carries the URL's credentials or the key.
    """

    def __init__(
        self,
        base_url: str,
        *,
        api_key_id: str | None = None,
        api_key_secret: str | Secret | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        supported_ttl_s: float = SUPPORTED_TTL_S,
        supported_retry_s: float = SUPPORTED_RETRY_S,
        max_connections: int = 100,
        session: aiohttp.ClientSession | UpstreamClient | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"facilitator URL must be an http(s) URL with a host: {redact_url(base_url)}")
        if timeout_s <= 0:
            raise ValueError("facilitator timeout must be positive")
        has_secret = bool(api_key_secret.reveal() if isinstance(api_key_secret, Secret) else api_key_secret)
        if bool(api_key_id) != has_secret:
            raise ValueError("set both the facilitator API key id and its secret, or neither")
        if has_secret and (parts.username or parts.password):
            raise ValueError(
                f"facilitator URL carries credentials and an API key is set; use one: {redact_url(base_url)}"
            )
        self._key = CdpKey.parse(api_key_id, api_key_secret) if api_key_id and api_key_secret else None
        base_path = parts.path.rstrip("/")
        self._endpoints = {
            name: urlunsplit((parts.scheme, parts.netloc, f"{base_path}/{name}", parts.query, ""))
            for name in ("verify", "settle", "supported")
        }
        self.url = _public_url(base_url)
        self._redacted = redact_url(base_url)
        self._timeout_s = timeout_s
        self._http = UpstreamClient(
            session,
            timeout_s=timeout_s,
            max_bytes=MAX_RESPONSE_BYTES,
            follow_redirects=False,
            connections=max_connections,
        )
        self._clients: dict[str, UpstreamClient] = {}
        """One per endpoint, over ``_http``'s session: each is its own upstream in the metrics."""
        self._clock = clock
        self._supported_ttl_s = supported_ttl_s
        self._supported_retry_s = supported_retry_s
        self._supported: SupportedResponse | None = None
        self._supported_expires = 0.0
        self._supported_lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"HttpFacilitator({self._redacted!r}, authenticated={self._key is not None})"

    async def close(self) -> None:
        """Close the session if it is our own; a later call would open a new one."""
        await self._http.close()

    async def verify(self, payload: PaymentPayload, requirements: PaymentRequirements) -> VerifyResponse:
        """Ask the facilitator whether ``payload`` pays ``requirements``; ``isValid: false`` is an answer."""
        body = _encoder.encode(FacilitatorRequest(X402_VERSION, payload, requirements))
        return await self._call("POST", "verify", body, _verify_decoder)

    async def settle(self, payload: PaymentPayload, requirements: PaymentRequirements) -> SettleResponse:
        """Ask the facilitator to submit the payment; ``success: false`` is an answer, not an error."""
        body = _encoder.encode(FacilitatorRequest(X402_VERSION, payload, requirements))
        return await self._call("POST", "settle", body, _settle_decoder)

    async def supported(self) -> SupportedResponse:
        """``/supported``, cached; concurrent callers share one refresh, and a failed refresh
        keeps the stale answer (retried every ``supported_retry_s``) rather than failing 402s."""
        if self._supported is not None and self._clock() < self._supported_expires:
            return self._supported
        async with self._supported_lock:
            if self._supported is not None and self._clock() < self._supported_expires:
                return self._supported
            try:
                fresh = await self._call("GET", "supported", None, _supported_decoder)
            except FacilitatorUnavailable:
                if self._supported is None:
                    raise
                self._supported_expires = self._clock() + self._supported_retry_s
                return self._supported
            self._supported = fresh
            self._supported_expires = self._clock() + self._supported_ttl_s
            return fresh

    async def ask_supported(self) -> SupportedResponse:
        """``/supported`` asked now, past the cache: whether the facilitator answers at all
        (the readiness probe and the failover's), which a stale cached answer would hide. Its
        answer refreshes the cache."""
        fresh = await self._call("GET", "supported", None, _supported_decoder)
        self._supported = fresh
        self._supported_expires = self._clock() + self._supported_ttl_s
        return fresh

    def cached_supported(self) -> SupportedResponse | None:
        """The last ``/supported`` answer held in memory (maybe stale), without asking."""
        return self._supported

    def supported_due(self) -> bool:
        """Whether :meth:`supported` would ask the facilitator now."""
        return self._supported is None or self._clock() >= self._supported_expires

    def _client(self, name: str) -> UpstreamClient:
        """The endpoint's client; its metrics are created at first use, only if it is used."""
        client = self._clients.get(name)
        if client is None:
            client = self._clients[name] = UpstreamClient(
                self._http,
                timeout_s=self._timeout_s,
                max_bytes=MAX_RESPONSE_BYTES,
                upstream=f"facilitator_{name}",
                follow_redirects=False,
            )
        return client

    async def _call(self, method: str, name: str, body: bytes | None, decoder: msgspec.json.Decoder[T]) -> T:
        url = self._endpoints[name]
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self._key is not None:
            headers["Authorization"] = self._key.bearer(method, url)
        where = f"facilitator {name} at {self._redacted}"
        client = self._client(name)
        try:
            answer = await client.request(method, url, data=body, headers=headers, accept=_ANSWER_STATUSES)
        except UpstreamTimeout:
            raise FacilitatorUnavailable(f"{where}: timed out after {self._timeout_s:g}s") from None
        except UpstreamTooLarge:
            raise FacilitatorUnavailable(f"{where}: answer larger than {MAX_RESPONSE_BYTES} bytes") from None
        except UpstreamUnreachable as exc:
            raise FacilitatorUnavailable(f"{where}: {exc.cause}") from None
        except UpstreamStatus as exc:
            raise _http_status(where, exc.answer) from None
        try:
            return decoder.decode(answer.body)
        except (msgspec.DecodeError, RecursionError):
            if answer.ok:
                client.failed(ErrorKind.INVALID_ANSWER)
                raise FacilitatorUnavailable(f"{where}: answer is not a valid {name} response") from None
        client.failed(status_kind(answer.status))
        raise _http_status(where, answer)


def _http_status(where: str, answer: Answer) -> FacilitatorUnavailable:
    """A status that is no answer (or an answer status without a protocol body)."""
    hint = " (API key refused)" if answer.status in (401, 403) else ""
    return FacilitatorUnavailable(f"{where}: HTTP {answer.status}{hint}")


def _public_url(base_url: str) -> str:
    """The base URL as advertised to clients: no userinfo, query or fragment (where keys hide)."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


# --- the fee payer a challenge names ----------------------------------------------------------

REMEMBERED_TTL_MS: Final = 30 * 24 * 3600 * 1000
"""How long the shared store keeps the last fee payer a facilitator named."""
STORE_RECHECK_S: Final = 10.0
"""How long this process trusts what it read (or did not find) in the store."""
COLD_WAIT_S: Final = 1.0
"""With no fee payer known from anywhere, how long a challenge waits for a first ``/supported``."""


class ChallengeFeePayer:
    """``extra.feePayer`` for the 402 challenge, without the challenge waiting on the facilitator.

    An unpaid request always gets its 402. Sources, first found wins: a facilitator in this
    process (the internal one: its own key), the external facilitator's last ``/supported``
    answer held in memory, the last one any replica kept in the shared store (so a new or
    restarted replica has it during a facilitator outage), then ``FACILITATOR_FEE_PAYER``.
    ``/supported`` is refreshed in the background. Only when none of these knows a fee payer
    does a challenge wait, at most :data:`COLD_WAIT_S`, for a first answer; then it goes out
    without ``extra.feePayer`` (a client cannot pay it yet, but it still learns the price).
    """

    def __init__(
        self,
        facilitator: Facilitator,
        store: Store,
        configured: str = "",
        network: str = SOLANA_MAINNET,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.facilitator = facilitator
        self.store = store
        self.configured = configured
        self.network = network
        self._clock = clock
        self._key = keys.fee_payer(network, facilitator.url)
        self._refresh: asyncio.Task[None] | None = None
        self._next_refresh = 0.0
        self._stored: str | None = None
        """What this process last wrote to (or read from) the store."""
        self._recheck_at = 0.0

    async def current(self) -> str | None:
        """The fee payer to advertise now; None when nothing knows one."""
        facilitator = self.facilitator
        if not isinstance(facilitator, HttpFacilitator):  # in-process: answers from memory
            return fee_payer_for(await facilitator.supported(), self.network)
        if facilitator.supported_due():
            self._refresh_soon()
        known = facilitator.cached_supported()
        if known is not None:
            return fee_payer_for(known, self.network)
        remembered = await self._remembered()
        if remembered or self.configured:
            return remembered or self.configured
        if self._refresh is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._refresh), COLD_WAIT_S)
            known = facilitator.cached_supported()
            if known is not None:
                return fee_payer_for(known, self.network)
        return None

    async def required(self) -> str:
        """The fee payer a paid request is verified with; 503 when none can be had."""
        found = await self.current()
        if found is None:
            try:
                found = fee_payer_for(await self.facilitator.supported(), self.network)
            except FacilitatorUnavailable as exc:
                message = "payment facilitator unavailable"
                raise GatewayError(ErrorCode.FACILITATOR_UNAVAILABLE, message) from exc
        if found is None:
            raise GatewayError(
                ErrorCode.FACILITATOR_UNAVAILABLE, "facilitator offers no exact payments on Solana"
            )
        return found

    def _refresh_soon(self) -> None:
        """Ask ``/supported`` in the background (one at a time, backing off after a failure)."""
        if (self._refresh is not None and not self._refresh.done()) or self._clock() < self._next_refresh:
            return
        self._next_refresh = self._clock() + SUPPORTED_RETRY_S
        self._refresh = asyncio.create_task(self._refresh_now(), name="facilitator-supported")

    async def _refresh_now(self) -> None:
        try:
            found = fee_payer_for(await self.facilitator.supported(), self.network)
        except FacilitatorUnavailable as exc:
            log_event("facilitator /supported unavailable", error=str(exc))
            return
        if found is None or found == self._stored:
            return
        try:
            await self.store.put(self._key, found, REMEMBERED_TTL_MS)
        except StoreUnavailable:
            return
        self._stored = found

    async def _remembered(self) -> str | None:
        """The fee payer kept in the store, read at most every :data:`STORE_RECHECK_S`."""
        if self._clock() >= self._recheck_at:
            self._recheck_at = self._clock() + STORE_RECHECK_S
            with contextlib.suppress(StoreUnavailable):
                self._stored = await self.store.get(self._key)
        return self._stored
