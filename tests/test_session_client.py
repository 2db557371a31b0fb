"""The client's credit session cache (``client.sessions``): kept per origin and wallet, in
memory and optionally in an owner-only file, never reused once close to its end, and a URL is
called on a session straight away only within the price its 402 was seen at."""

from __future__ import annotations

import json
import time
from pathlib import Path

from client.sessions import REUSE_MARGIN_S, CreditSession, SessionCache

ORIGIN = "http://127.0.0.1:8080"
URL = ORIGIN + "/v1/x402/solana/mainnet/provider_a/rpc/getBalance"


def _session(wallet: str = "W", lasts_s: float = 600) -> CreditSession:
    return CreditSession(ORIGIN, wallet, f"xcs1.{wallet}.secret", 1_000_000, int(time.time() + lasts_s))


def test_a_session_is_kept_per_origin_and_wallet_in_an_owner_only_file(tmp_path: Path) -> None:
    path = tmp_path / "sessions.json"
    cache = SessionCache(path)
    cache.put(_session("A"))
    cache.approve(cache.sessions["A@" + ORIGIN], URL, 2205)

    again = SessionCache(path)

    found = again.get(ORIGIN, "A")
    assert found is not None and found.token == "xcs1.A.secret" and found.prices == {URL: 2205}
    assert again.get(ORIGIN, "B") is None and again.get("http://other:1", "A") is None
    assert path.stat().st_mode & 0o777 == 0o600


def test_a_session_close_to_its_end_is_not_reused_nor_kept(tmp_path: Path) -> None:
    path = tmp_path / "sessions.json"
    cache = SessionCache(path)
    cache.put(_session("A", lasts_s=REUSE_MARGIN_S - 1))
    cache.put(_session("B"))

    assert cache.get(ORIGIN, "A") is None
    assert list(json.loads(path.read_text())) == ["B@" + ORIGIN]


def test_a_dropped_session_is_gone_from_the_file(tmp_path: Path) -> None:
    path = tmp_path / "sessions.json"
    cache = SessionCache(path)
    cache.put(_session("A"))

    cache.drop(ORIGIN, "A")

    assert SessionCache(path).get(ORIGIN, "A") is None


def test_an_unreadable_file_holds_no_session(tmp_path: Path) -> None:
    path = tmp_path / "sessions.json"
    for text in ("not json", "[1, 2]", '{"x": {"origin": 1}}'):
        path.write_text(text)
        assert SessionCache(path).sessions == {}
