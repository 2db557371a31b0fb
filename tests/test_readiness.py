"""``/readyz`` with real parts: the gateway under hypercorn on loopback, a real Redis, the fake CDP
facilitator (a loopback server speaking the facilitator API) or the internal facilitator with
its LiteSVM node. Ready when the store answers and the facilitator is reachable; otherwise 503
``not_ready`` naming what fails. ``/healthz`` stays 200 throughout: liveness asks neither."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from gateway.telemetry import readiness
from gateway.telemetry.readiness import STORE_TTL_S, CachedCheck, Problem
from tests.support.gateway_server import FULL_ENV, SERVICE_ONLY_ENV, run_gateway
from tests.support.paid_fixtures import PaidGateway, Reply, StartPaidGateway
from tests.support.ports import refusing_port
from tests.support.redis_server import RedisServer

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:x402", "ignore::FutureWarning:x402")

READY = {"ok": True, "status": "ready", "checks": {"store": "ok", "facilitator": "ok"}}


def assert_not_ready(reply: Reply, failing: list[str]) -> None:
    assert reply.status == 503, reply.body
    assert reply.headers["cache-control"] == "no-store"
    body = reply.json()
    assert body["ok"] is False
    assert body["error"]["code"] == "not_ready"
    assert body["error"]["details"]["failing"] == failing
    checks = body["error"]["details"]["checks"]
    assert {name for name, state in checks.items() if state != "ok"} == set(failing)
    for name in failing:
        assert name in body["error"]["message"]


async def wait_for_status(gateway: PaidGateway, status: int, within_s: float) -> Reply:
    """Probe ``/readyz`` as an orchestrator does until it answers ``status`` (bounded)."""
    deadline = time.monotonic() + within_s
    while True:
        reply = await gateway.get("/readyz")
        if reply.status == status or time.monotonic() > deadline:
            return reply
        await asyncio.sleep(0.2)


async def test_ready_with_a_real_store_and_a_reachable_facilitator(
    start_paid_gateway: StartPaidGateway, clean_redis_url: str
) -> None:
    paid = await start_paid_gateway(env={"STATE_STORE_REST_URL": clean_redis_url})

    reply = await paid.get("/readyz")

    assert reply.status == 200, reply.body
    assert reply.json() == READY
    assert reply.headers["cache-control"] == "no-store"
    async with paid.http.head(paid.url + "/readyz") as head:
        assert head.status == 200
        assert await head.read() == b""


async def test_probes_share_one_facilitator_question_per_few_seconds(
    start_paid_gateway: StartPaidGateway, clean_redis_url: str
) -> None:
    paid = await start_paid_gateway(env={"STATE_STORE_REST_URL": clean_redis_url})
    assert paid.facilitator is not None

    replies = await asyncio.gather(*(paid.get("/readyz") for _ in range(20)))
    replies += [await paid.get("/readyz") for _ in range(5)]

    assert [r.status for r in replies] == [200] * 25
    assert paid.facilitator.count("supported") == 1


async def test_not_ready_naming_the_store_when_redis_goes_down(
    start_paid_gateway: StartPaidGateway, private_redis: RedisServer
) -> None:
    paid = await start_paid_gateway(env={"STATE_STORE_REST_URL": private_redis.url})
    assert (await paid.get("/readyz")).status == 200

    private_redis.stop()
    reply = await wait_for_status(paid, 503, STORE_TTL_S + 5)

    assert_not_ready(reply, ["store"])
    assert (await paid.get("/healthz")).status == 200


async def test_not_ready_naming_the_facilitator_when_it_stops(
    start_paid_gateway: StartPaidGateway, clean_redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waits out the facilitator check's time to live, shortened from 5 s to 0.5 s for this
    gateway: what is checked is that a stopped facilitator is noticed and named once the cached
    answer lapses (the cache itself: test_a_check_is_asked_once_per_ttl_however_many_probe_at_once)."""
    ttl_s = 0.5
    monkeypatch.setattr(readiness, "FACILITATOR_TTL_S", ttl_s)
    paid = await start_paid_gateway(env={"STATE_STORE_REST_URL": clean_redis_url})
    assert paid.facilitator is not None
    assert (await paid.get("/readyz")).status == 200

    await paid.facilitator.stop()
    reply = await wait_for_status(paid, 503, ttl_s + 5)

    assert_not_ready(reply, ["facilitator"])
    assert reply.json()["error"]["details"]["checks"]["store"] == "ok"
    assert (await paid.get("/healthz")).status == 200


async def test_not_ready_naming_the_facilitator_on_a_refusing_port(
    start_paid_gateway: StartPaidGateway, clean_redis_url: str
) -> None:
    paid = await start_paid_gateway(
        env={
            "STATE_STORE_REST_URL": clean_redis_url,
            "FACILITATOR_URL": f"http://127.0.0.1:{refusing_port()}/platform/v2/x402",
        }
    )

    assert_not_ready(await paid.get("/readyz"), ["facilitator"])


async def test_internal_facilitator_is_ready_while_its_node_answers(
    start_paid_gateway: StartPaidGateway, clean_redis_url: str
) -> None:
    paid = await start_paid_gateway(internal=True, env={"STATE_STORE_REST_URL": clean_redis_url})

    reply = await paid.get("/readyz")

    assert reply.status == 200, reply.body
    assert reply.json() == READY


async def test_internal_facilitator_is_not_ready_when_its_node_refuses(
    start_paid_gateway: StartPaidGateway, clean_redis_url: str
) -> None:
    node = f"http://127.0.0.1:{refusing_port()}/?api-key=LEAK-NODE-KEY"
    paid = await start_paid_gateway(
        internal=True, env={"STATE_STORE_REST_URL": clean_redis_url, "SOLANA_MAINNET_RPC_URL": node}
    )

    reply = await paid.get("/readyz")

    assert_not_ready(reply, ["facilitator"])
    assert b"LEAK" not in reply.body and b"127.0.0.1" not in reply.body


async def test_a_gateway_selling_no_paid_route_never_asks_a_facilitator(clean_redis_url: str) -> None:
    async with (
        run_gateway({**SERVICE_ONLY_ENV, "STATE_STORE_REST_URL": clean_redis_url}) as gateway,
        aiohttp.ClientSession() as http,
        http.get(gateway.url + "/readyz") as reply,
    ):
        assert reply.status == 200
        assert await reply.json() == {"ok": True, "status": "ready", "checks": {"store": "ok"}}


async def test_everything_down_names_both_and_never_a_secret() -> None:
    store = f"redis://:LEAK-REDIS-PASSWORD@127.0.0.1:{refusing_port()}/0"
    async with (
        run_gateway({**FULL_ENV, "STATE_STORE_REST_URL": store}) as gateway,
        aiohttp.ClientSession() as http,
    ):
        async with http.get(gateway.url + "/readyz") as got:
            body = await got.read()
            reply = Reply(got.status, got.headers, body)
        async with http.get(gateway.url + "/healthz") as health:
            assert health.status == 200

    assert_not_ready(reply, ["store", "facilitator"])
    assert b"LEAK" not in body and b"127.0.0.1" not in body


# --- the cache, on its own ----------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_a_check_is_asked_once_per_ttl_however_many_probe_at_once() -> None:
    clock = Clock()
    asked: list[float] = []
    answers: list[Problem] = [None, "refused", None]

    async def question() -> Problem:
        asked.append(clock.now)
        await asyncio.sleep(0.01)
        return answers[len(asked) - 1]

    check = CachedCheck("facilitator", question, ttl_s=5.0, clock=clock)

    assert await asyncio.gather(*(check.state() for _ in range(10))) == ["ok"] * 10
    clock.now += 4.9
    assert await check.state() == "ok"
    clock.now += 0.2
    assert await check.state() == "unavailable"
    clock.now += 5.1
    assert await check.state() == "ok"
    assert asked == pytest.approx([100.0, 105.1, 110.2])


async def test_a_check_that_hangs_is_cut_off_at_its_timeout() -> None:
    async def question() -> Problem:
        await asyncio.sleep(10)
        return None

    check = CachedCheck("store", question, ttl_s=1.0, timeout_s=0.05)
    started = time.monotonic()

    assert await check.state() == "timeout"
    assert time.monotonic() - started < 5  # long before the question's 10 s (a loaded machine)
