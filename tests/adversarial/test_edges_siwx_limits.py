"""Attack: replayed sign-ins must not drain limits that other wallets share.

One used ``SIGN-IN-WITH-X`` header, replayed 35 times from one IP, is refused every time. The
refusals count against that IP's challenge limit and nothing else: the upstream-key bucket that
every wallet shares and the attacker's own wallet bucket stay untouched, so a different wallet on
a different IP still gets its answer. Fair shares are off here (100%), so that only the key's
budget could be drained; ``test_fair_shares.py`` mounts the throwaway-wallet flood. The real
gateway runs under hypercorn behind a trusted proxy (TRUSTED_PROXIES + X-Forwarded-For), the
asset-data upstream records every call.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import msgspec
import pytest_asyncio
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from tests.support.gateway_server import RunningGateway, run_gateway
from tests.support.upstream import ASSET_API_KEY, Upstream

PATH = "/v1/x402/tokens/health"
ATTACKER_IP = "203.0.113.66"
VICTIM_IP = "198.51.100.23"
UPSTREAM_KEY_LIMIT = 5  # far fewer than the replays: one charge per replay would exhaust it
CHALLENGE_LIMIT = 20
REPLAYS = 35


@pytest_asyncio.fixture(loop_scope="session")
async def gateway(asset_api: Upstream) -> AsyncIterator[RunningGateway]:
    env = {
        "ASSET_API_BASE_URL": asset_api.url,
        "ASSET_API_KEY": ASSET_API_KEY,
        "SIWX_SECRET": "edges-siwx-secret-0123456789abcdef-0123",
        "RATE_LIMIT_TOKENS_PER_MINUTE": str(UPSTREAM_KEY_LIMIT),
        "RATE_LIMIT_CHALLENGE_PER_MINUTE": str(CHALLENGE_LIMIT),
        "RATE_LIMIT_TOKENS_SHARE_PERCENT": "100",
        "TRUSTED_PROXIES": "127.0.0.1/32",
        "ROUTE_GROUPS": "tokens",
    }
    async with run_gateway(env) as running:
        yield running


async def _get(
    session: aiohttp.ClientSession, gateway: RunningGateway, ip: str, extra: Mapping[str, str] = {}
) -> tuple[int, Any]:
    headers = {"x-forwarded-for": ip, **extra}
    async with session.get(gateway.url + PATH, headers=headers) as resp:
        return resp.status, msgspec.json.decode(await resp.read())


async def _sign_in(
    session: aiohttp.ClientSession, gateway: RunningGateway, ip: str, wallet: Keypair
) -> tuple[int, Any, str]:
    status, challenge = await _get(session, gateway, ip)
    assert status == 402, challenge
    header = sign_in(challenge["extensions"]["sign-in-with-x"], wallet, request_url=gateway.url + PATH)
    status, body = await _get(session, gateway, ip, {"sign-in-with-x": header})
    return status, body, header


async def test_replayed_sign_ins_leave_another_wallet_on_another_ip_untouched(
    gateway: RunningGateway, asset_api: Upstream
) -> None:
    attacker, victim = Keypair(), Keypair()
    async with aiohttp.ClientSession() as session:
        status, _, used = await _sign_in(session, gateway, ATTACKER_IP, attacker)
        assert status == 200
        replies = [
            await _get(session, gateway, ATTACKER_IP, {"sign-in-with-x": used}) for _ in range(REPLAYS)
        ]
        victim_status, victim_body, _ = await _sign_in(session, gateway, VICTIM_IP, victim)
        attacker_challenged, challenge_body = await _get(session, gateway, ATTACKER_IP)

    # A sign-in challenge costs nothing; each replay takes a slot of the IP's challenge allowance
    # until the IP is refused with 429 (challenge scope), never anything shared.
    refused = CHALLENGE_LIMIT
    assert [s for s, _ in replies] == [402] * refused + [429] * (REPLAYS - refused)
    assert all(body["error"] == "siwx_replayed" for _, body in replies[:refused])
    assert all(body["error"]["details"]["scope"] == "challenge:ip" for _, body in replies[refused:])
    assert attacker_challenged == 402 and "error" not in challenge_body  # a challenge has no side effect

    assert victim_status == 200, victim_body
    assert len(asset_api.calls) == 2  # the attacker's one honest call and the victim's


async def test_replays_spend_neither_the_attackers_wallet_bucket_nor_the_shared_key(
    gateway: RunningGateway, asset_api: Upstream
) -> None:
    """Under the challenge limit, replays are refused and the same wallet can still sign in freshly
    as often as the upstream-key allowance permits."""
    wallet = Keypair()
    async with aiohttp.ClientSession() as session:
        status, _, used = await _sign_in(session, gateway, ATTACKER_IP, wallet)
        assert status == 200
        replays = [
            (await _get(session, gateway, ATTACKER_IP, {"sign-in-with-x": used}))[0] for _ in range(10)
        ]
        fresh = [
            (await _sign_in(session, gateway, VICTIM_IP, wallet))[0] for _ in range(UPSTREAM_KEY_LIMIT - 1)
        ]
    assert replays == [402] * 10
    assert fresh == [200] * (UPSTREAM_KEY_LIMIT - 1)
    assert len(asset_api.calls) == UPSTREAM_KEY_LIMIT
