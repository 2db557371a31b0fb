"""The client side of credit sessions: open one with a sign-in, keep it, revoke it.

``pay`` on a paid route that takes prepaid credit opens a session (``POST
{origin}/v1/x402/credits/sessions?capMicroUsdc=CAP&ttlSeconds=S``, answered by signing the
challenge's statement and resource unchanged, which name the cap and lifetime) and calls with
its token in ``X-CREDIT-SESSION``: no 402 and no signature per call. The token is kept in a
:class:`SessionCache`, in memory for one process and, when given a file, across processes (the
file holds a bearer token: it is written owner-only). A cached token is sent straight away only
to a URL whose 402 this cache saw within the spend policy's ``--max-amount`` (naming the price is
the consent to pay it); any other URL is asked for its 402 first.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from solders.keypair import Keypair

from client.challenge import parse_challenge, siwx_extension
from client.siwx_signer import sign_in
from gateway.methods.credit.wire import RevokedResult, SessionResult, result_of

SESSIONS_PATH = "/v1/x402/credits/sessions"
SESSION_HEADER = "X-CREDIT-SESSION"
DEFAULT_SESSION_CAP = 1_000_000
"""What ``pay`` lets one session spend unless told otherwise: 1 USDC."""
MAX_SESSION_CAP = 1_000_000_000
"""The largest cap a gateway grants: 1,000 USDC."""
DEFAULT_SESSION_TTL_S = 3600
REUSE_MARGIN_S = 30
"""A session closer than this to its end is not reused: a call must not reach it expired."""
RENEWED = ("credit_session_unknown", "credit_session_cap_reached")
"""The 402 reasons after which a fresh session may still serve the call."""


class SessionError(Exception):
    """A session could not be opened or revoked; ``status`` is the gateway's answer (0: none)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class CreditSession:
    origin: str
    wallet: str
    token: str
    cap: int
    expires_at: int
    prices: dict[str, int] = field(default_factory=dict)
    """URL -> the most its 402 asked, seen by this cache: reused straight away within that."""

    def live(self, now: float | None = None) -> bool:
        return self.expires_at - REUSE_MARGIN_S > (time.time() if now is None else now)


class SessionCache:
    """Sessions by origin and wallet: in memory, and in ``path`` (JSON, owner-only) when given."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else None
        self.sessions: dict[str, CreditSession] = {}
        if self.path is not None and self.path.exists():
            self._load(self.path)

    @staticmethod
    def _name(origin: str, wallet: str) -> str:
        return f"{wallet}@{origin}"

    def _load(self, path: Path) -> None:
        try:
            stored = json.loads(path.read_text(encoding="utf-8"))
            self.sessions = {name: CreditSession(**fields) for name, fields in stored.items()}
        except (OSError, ValueError, TypeError, AttributeError):
            self.sessions = {}  # unreadable: sessions are cheap to open again

    def _save(self) -> None:
        if self.path is None:
            return
        now = time.time()
        live = {name: asdict(s) for name, s in self.sessions.items() if s.live(now)}
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(live, file)

    def get(self, origin: str, wallet: str) -> CreditSession | None:
        found = self.sessions.get(self._name(origin, wallet))
        return found if found is not None and found.live() else None

    def put(self, session: CreditSession) -> None:
        self.sessions[self._name(session.origin, session.wallet)] = session
        self._save()

    def approve(self, session: CreditSession, url: str, price: int) -> None:
        """``url``'s 402 asked at most ``price``, within the spend policy: reuse it straight away."""
        session.prices[url] = price
        self._save()

    def drop(self, origin: str, wallet: str) -> None:
        if self.sessions.pop(self._name(origin, wallet), None) is not None:
            self._save()


PROCESS_CACHE = SessionCache()
"""The sessions of this process (``pay`` called many times by one program reuses them)."""


def _challenge_extension(headers: dict[str, str], body: bytes) -> dict[str, Any] | None:
    """The sign-in challenge of a 402 (``PAYMENT-REQUIRED`` header, else the JSON body)."""
    return siwx_extension(parse_challenge(headers, body))


async def open_session(
    http: aiohttp.ClientSession,
    origin: str,
    keypair: Keypair,
    cap: int = DEFAULT_SESSION_CAP,
    ttl_s: int = DEFAULT_SESSION_TTL_S,
) -> CreditSession:
    """Sign in at ``origin`` to open a session spending at most ``cap`` micro-USDC for ``ttl_s``."""
    url = f"{origin}{SESSIONS_PATH}?capMicroUsdc={cap}&ttlSeconds={ttl_s}"
    status, body, headers = await _post(http, url, {})
    extension = _challenge_extension(headers, body) if status == 402 else None
    if extension is None:
        raise SessionError(f"{origin} opens no credit session (HTTP {status} at {SESSIONS_PATH})", status)
    try:
        signed = sign_in(extension, keypair, request_url=url)
    except ValueError as exc:
        raise SessionError(f"cannot sign in: {exc}") from None
    status, body, headers = await _post(http, url, {"SIGN-IN-WITH-X": signed})
    result = result_of(body, SessionResult) if status == 200 else None
    if result is None:
        raise SessionError(f"{origin} did not open a credit session (HTTP {status})", status)
    return CreditSession(origin, result.wallet, result.token, int(result.capMicroUsdc), result.expiresAt)


async def revoke_session(http: aiohttp.ClientSession, origin: str, token: str) -> RevokedResult:
    """Revoke the session of ``token`` at ``origin``: what it spent, or SessionError (404: none live)."""
    try:
        async with http.delete(
            origin + SESSIONS_PATH, headers={SESSION_HEADER: token}, allow_redirects=False
        ) as resp:
            status, body = resp.status, await resp.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SessionError(f"request failed: {exc.__class__.__name__}") from None
    result: RevokedResult | None = result_of(body, RevokedResult) if status == 200 else None
    if result is None:
        gone = "no live credit session under this token" if status == 404 else f"HTTP {status}"
        raise SessionError(f"{origin} revoked nothing: {gone}", status)
    return result


async def _post(
    http: aiohttp.ClientSession, url: str, extra: dict[str, str]
) -> tuple[int, bytes, dict[str, str]]:
    try:
        async with http.post(
            url, headers={"accept": "application/json", **extra}, allow_redirects=False
        ) as resp:
            return resp.status, await resp.read(), {k.lower(): v for k, v in resp.headers.items()}
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise SessionError(f"request failed: {exc.__class__.__name__}") from None
