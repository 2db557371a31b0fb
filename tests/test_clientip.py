"""The client IP for rate limits: X-Forwarded-For counts only from TRUSTED_PROXIES, right-most first."""

from __future__ import annotations

import ipaddress
from typing import Any

import aiohttp

from gateway.config import IpNetwork
from gateway.limits.rate_limiter import RateLimiter
from gateway.store.memory import MemoryStore
from gateway.web.clientip import client_ip, client_subject
from tests.support.gateway_server import RunningGateway, run_gateway

PROXIES: tuple[IpNetwork, ...] = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/8"))


def _scope(peer: str | None, *forwarded: str) -> dict[str, Any]:
    return {
        "type": "http",
        "client": (peer, 40000) if peer else None,
        "headers": [(b"x-forwarded-for", value.encode()) for value in forwarded],
    }


def test_without_trusted_proxies_the_socket_peer_is_the_client() -> None:
    assert client_ip(_scope("203.0.113.9", "198.51.100.1"), ()) == "203.0.113.9"


def test_forwarded_for_from_an_untrusted_peer_is_ignored() -> None:
    assert client_ip(_scope("203.0.113.9", "198.51.100.1"), PROXIES) == "203.0.113.9"


def test_trusted_proxy_without_forwarded_for_is_the_client() -> None:
    assert client_ip(_scope("10.1.2.3"), PROXIES) == "10.1.2.3"


def test_trusted_proxy_hands_over_the_address_it_saw() -> None:
    assert client_ip(_scope("10.1.2.3", "198.51.100.7"), PROXIES) == "198.51.100.7"


def test_entries_written_by_the_client_are_ignored() -> None:
    # The client sent "X-Forwarded-For: 1.1.1.1"; our proxy appended the address it saw.
    assert client_ip(_scope("10.1.2.3", "1.1.1.1, 198.51.100.7"), PROXIES) == "198.51.100.7"


def test_chain_of_trusted_proxies_is_skipped_right_to_left() -> None:
    scope = _scope("10.1.2.3", "6.6.6.6, 198.51.100.7, 10.9.9.9, 10.8.8.8")

    assert client_ip(scope, PROXIES) == "198.51.100.7"


def test_forwarded_for_split_over_several_header_lines_is_one_list() -> None:
    # The client's own line comes first; the proxy added a second line rather than appending.
    scope = _scope("10.1.2.3", "6.6.6.6", "198.51.100.7")

    assert client_ip(scope, PROXIES) == "198.51.100.7"


def test_garbage_in_forwarded_for_falls_back_to_the_peer() -> None:
    assert client_ip(_scope("10.1.2.3", "1.1.1.1, not-an-ip"), PROXIES) == "10.1.2.3"


def test_ipv6_addresses_are_normalised() -> None:
    assert client_ip(_scope("fd00::1", "2001:DB8:0:0:0:0:0:1"), PROXIES) == "2001:db8::1"


def test_all_hops_trusted_yields_the_left_most() -> None:
    assert client_ip(_scope("10.1.2.3", "10.0.0.1, 10.0.0.2"), PROXIES) == "10.0.0.1"


def test_missing_client_is_unknown() -> None:
    assert client_ip(_scope(None, "198.51.100.7"), PROXIES) == "unknown"


# --- the client as per-IP limits key it: an IPv6 client by its prefix ---------------------------


def test_an_ipv4_client_is_its_address() -> None:
    assert client_subject("198.51.100.7") == "198.51.100.7"


def test_an_ipv6_client_is_its_slash_64_by_default() -> None:
    assert client_subject("2001:db8:1:2:aaaa:bbbb:cccc:dddd") == "2001:db8:1:2::/64"
    assert client_subject("2001:db8:1:2::1") == client_subject("2001:db8:1:2:ffff:ffff:ffff:ffff")
    assert client_subject("2001:db8:1:3::1") == "2001:db8:1:3::/64"


def test_the_ipv6_prefix_length_is_configurable() -> None:
    assert client_subject("2001:db8:1:2::1", 56) == "2001:db8:1::/56"
    assert client_subject("2001:db8:1:ff::1", 56) == "2001:db8:1::/56"
    assert client_subject("2001:db8:1:100::1", 56) == "2001:db8:1:100::/56"
    assert client_subject("2001:db8:1:2::1", 128) == "2001:db8:1:2::1"


def test_an_ipv4_mapped_ipv6_client_is_its_ipv4_address() -> None:
    assert client_subject("::ffff:198.51.100.7") == "198.51.100.7"


def test_what_is_no_address_is_left_as_is() -> None:
    assert client_subject("unknown") == "unknown"


def test_the_limiter_keys_forwarded_ipv6_clients_by_prefix_and_keeps_ipv4_whole() -> None:
    limiter = RateLimiter(MemoryStore(), trusted_proxies=PROXIES)
    twenty = {limiter.client_ip(_scope("10.1.2.3", f"2001:db8:5:6::{i:x}")) for i in range(1, 21)}

    assert twenty == {"2001:db8:5:6::/64"}
    assert limiter.client_ip(_scope("10.1.2.3", "198.51.100.7")) == "198.51.100.7"
    assert (
        RateLimiter(MemoryStore(), (), PROXIES, ipv6_prefix_length=128).client_ip(
            _scope("10.1.2.3", "2001:db8:5:6::1")
        )
        == "2001:db8:5:6::1"
    )


# --- over the socket: the unpaid-challenge limit per IP ---------------------------------------------

SIWX_ENV = {
    "ROUTE_GROUPS": "tokens",
    "ASSET_API_BASE_URL": "http://127.0.0.1:9",
    "ASSET_API_KEY": "k",
    "RATE_LIMIT_CHALLENGE_PER_MINUTE": "3",
}
CHALLENGED = "/v1/x402/tokens/health"
REFUSED_SIGN_IN = {"SIGN-IN-WITH-X": "bm90LWEtc2lnbi1pbg=="}
"""A sign-in the gateway refuses: refusals count against the IP's challenge limit, while a plain
sign-in challenge has no side effect."""


async def _statuses(http: aiohttp.ClientSession, gateway: RunningGateway, n: int) -> list[int]:
    statuses = []
    for i in range(n):
        headers = {"X-Forwarded-For": f"198.51.100.{i + 1}", **REFUSED_SIGN_IN}
        async with http.get(f"{gateway.url}{CHALLENGED}", headers=headers) as response:
            statuses.append(response.status)
    return statuses


async def test_client_cannot_pick_its_own_challenge_bucket(http: aiohttp.ClientSession) -> None:
    async with run_gateway(SIWX_ENV) as gateway:
        statuses = await _statuses(http, gateway, 5)

    assert statuses == [402, 402, 402, 429, 429]


async def test_sign_in_challenges_are_never_counted_against_the_ip(http: aiohttp.ClientSession) -> None:
    async with run_gateway(SIWX_ENV) as gateway:
        statuses = []
        for _ in range(6):
            async with http.get(f"{gateway.url}{CHALLENGED}") as response:
                statuses.append(response.status)

    assert statuses == [402] * 6


async def test_trusted_proxy_gives_each_forwarded_client_its_own_bucket(http: aiohttp.ClientSession) -> None:
    async with run_gateway({**SIWX_ENV, "TRUSTED_PROXIES": "127.0.0.1"}) as gateway:
        statuses = await _statuses(http, gateway, 5)

    assert statuses == [402] * 5


async def test_rate_limited_challenge_carries_retry_after(http: aiohttp.ClientSession) -> None:
    async with run_gateway({**SIWX_ENV, "RATE_LIMIT_CHALLENGE_PER_MINUTE": "1"}) as gateway:
        await _statuses(http, gateway, 1)
        headers = {"X-Forwarded-For": "6.6.6.6", **REFUSED_SIGN_IN}
        async with http.get(f"{gateway.url}{CHALLENGED}", headers=headers) as response:
            body = await response.json()
            assert response.status == 429
            assert int(response.headers["Retry-After"]) >= 1

    assert body["error"]["code"] == "rate_limited"


async def test_addresses_of_one_ipv6_prefix_share_one_bucket_behind_the_trusted_proxy(
    http: aiohttp.ClientSession,
) -> None:
    async with run_gateway({**SIWX_ENV, "TRUSTED_PROXIES": "127.0.0.1"}) as gateway:
        statuses = []
        for i in range(5):  # five addresses of one /64, then one of the next /64
            headers = {"X-Forwarded-For": f"2001:db8:7:8::{i + 1:x}", **REFUSED_SIGN_IN}
            async with http.get(f"{gateway.url}{CHALLENGED}", headers=headers) as response:
                statuses.append(response.status)
        headers = {"X-Forwarded-For": "2001:db8:7:9::1", **REFUSED_SIGN_IN}
        async with http.get(f"{gateway.url}{CHALLENGED}", headers=headers) as response:
            other = response.status

    assert statuses == [402, 402, 402, 429, 429]
    assert other == 402
