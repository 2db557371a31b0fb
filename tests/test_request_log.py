"""The request log of the real gateway (on loopback, real payments on a local Solana VM, a real
sign-in): every payment, refused payment, sign-in and error is one line; plain 402 challenges are
counted per route and summarised (``LOG_CHALLENGES=summary``, the default), logged a line each
(``all``) or not logged (``off``).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from typing import Any

import aiohttp
import pytest
from solders.keypair import Keypair

from client.siwx_signer import sign_in
from gateway.config import ConfigError, load_settings
from gateway.routing.vocabulary import Outcome
from gateway.telemetry.logs import LOGGER_NAME
from gateway.telemetry.request_log import RequestLog
from gateway.web.context import RequestContext
from tests.support.gateway_process import serve
from tests.support.gateway_server import FULL_ENV, PAID_GROUPS, PAY_TO
from tests.support.log_capture import captured_log_lines
from tests.support.paid_fixtures import GET_BALANCE, PaidGateway, Reply, StartPaidGateway, balance_body
from tests.support.upstream import Upstream, static

TOKENS_HEALTH = "/v1/x402/tokens/health"


def _env(upstream: Upstream, **extra: str) -> dict[str, str]:
    """Paid routes and the asset-data routes (the same recording upstream), request logs on."""
    return {
        "LOG_LEVEL": "INFO",
        "ROUTE_GROUPS": f"{PAID_GROUPS},tokens",
        "ASSET_API_BASE_URL": f"{upstream.url}/assets",
        "ASSET_API_KEY": "request-log-asset-key-0123456789",
        "SIWX_SECRET": "request-log-siwx-secret-0123456789abcdef",
        **extra,
    }


def _lines(raw: list[str], msg: str) -> list[dict[str, Any]]:
    return [line for line in map(json.loads, raw) if line["msg"] == msg]


async def _signed_in_call(paid: PaidGateway, path: str) -> Reply:
    """The sign-in challenge, then the call signed in with a fresh wallet."""
    challenge = await paid.get(path)
    assert challenge.status == 402, challenge.body
    signed = sign_in(challenge.json()["extensions"]["sign-in-with-x"], Keypair(), request_url=paid.url + path)
    async with paid.http.get(paid.url + path, headers={"sign-in-with-x": signed}) as response:
        return Reply(response.status, response.headers, await response.read())


async def test_by_default_challenges_are_counted_and_every_other_request_keeps_its_line(
    start_paid_gateway: StartPaidGateway, upstream: Upstream
) -> None:
    paid = await start_paid_gateway(env=_env(upstream))
    with captured_log_lines() as raw:
        for _ in range(3):
            await paid.challenge()
        assert (await _signed_in_call(paid, TOKENS_HEALTH)).status == 200  # and one sign-in challenge
        assert (await paid.pay(GET_BALANCE, balance_body(), await paid.payment())).status == 200  # and one
        assert (await paid.pay(GET_BALANCE, balance_body(), "not-a-payment")).status == 402
        assert (await paid.get("/nowhere")).status == 404
        upstream.responder = static(500, {"error": "down"})
        assert (await paid.pay(GET_BALANCE, balance_body(), await paid.payment())).status == 502  # and one
        requests = _lines(raw, "request")
        paid.running.services.request_log.summarize()
        summaries = _lines(raw, "challenges")

    assert Counter((line["outcome"], line["status"]) for line in requests) == {
        ("signed_in", 200): 1,
        ("paid", 200): 1,
        ("rejected", 402): 1,
        ("-", 404): 1,
        ("upstream_failed", 502): 1,
    }
    [settled] = [line for line in requests if line["outcome"] == "paid"]
    assert settled["settlement"] and settled["amount"] and settled["payer"]
    [signed_in] = [line for line in requests if line["outcome"] == "signed_in"]
    assert signed_in["wallet"] and signed_in["route"] == "tokens.health"
    assert {line["route"]: line["count"] for line in summaries} == {settled["route"]: 5, "tokens.health": 1}
    assert all(line["status"] == 402 and line["outcome"] == "challenged" for line in summaries)
    assert all(0 < line["window_s"] < 120 for line in summaries)


@pytest.mark.parametrize(("mode", "lines"), [("all", 3), ("off", 0)])
async def test_log_challenges_all_logs_each_challenge_and_off_none(
    start_paid_gateway: StartPaidGateway, upstream: Upstream, mode: str, lines: int
) -> None:
    paid = await start_paid_gateway(env=_env(upstream, LOG_CHALLENGES=mode))
    with captured_log_lines() as raw:
        for _ in range(3):
            await paid.challenge()
        paid.running.services.request_log.summarize()

    challenged = [line for line in _lines(raw, "request") if line["outcome"] == "challenged"]
    assert len(challenged) == lines
    assert all(line["status"] == 402 and line["path"] == GET_BALANCE for line in challenged)
    assert _lines(raw, "challenges") == []


async def test_the_summary_is_written_every_interval_and_counts_start_over() -> None:
    logger = logging.getLogger(LOGGER_NAME)
    level = logger.level
    logger.setLevel(logging.INFO)
    log = RequestLog("summary", interval_s=0.05)
    scope = {"method": "POST", "path": "/v1/x"}
    try:
        with captured_log_lines() as raw:
            log.start()
            for _ in range(2):
                log.request(scope, RequestContext(route="a", status=402, outcome=Outcome.CHALLENGED), 0.1)
            for _ in range(500):  # the first summary is due after 0.05 s; give it up to 5 s
                if _lines(raw, "challenges"):
                    break
                await asyncio.sleep(0.01)
            log.request(scope, RequestContext(route="b", status=402, outcome=Outcome.CHALLENGED), 0.1)
            await log.stop()
    finally:
        logger.setLevel(level)

    assert [(line["route"], line["count"]) for line in _lines(raw, "challenges")] == [("a", 2), ("b", 1)]
    assert _lines(raw, "request") == []


async def test_a_stopping_gateway_writes_the_last_summary_on_stdout() -> None:
    env = {**FULL_ENV, "FACILITATOR_FEE_PAYER": PAY_TO, "LOG_LEVEL": "INFO"}
    with serve(env) as gateway:
        async with aiohttp.ClientSession() as http:
            for _ in range(4):
                async with http.post(gateway.url + GET_BALANCE, json=balance_body()) as response:
                    assert response.status == 402
        assert gateway.terminate() == 0
        lines = [json.loads(line) for line in gateway.stdout().splitlines() if line.startswith("{")]

    assert [line for line in lines if line.get("outcome") == "challenged" and line["msg"] == "request"] == []
    [summary] = [line for line in lines if line["msg"] == "challenges"]
    assert summary["count"] == 4 and summary["route"] == "solana.mainnet.provider_a.rpc.getBalance"


def test_log_challenges_is_summary_by_default_and_refuses_other_words() -> None:
    base = {"GATEWAY_BASE_URL": "https://gw.example.com"}

    assert load_settings(base).log_challenges == "summary"
    assert load_settings({**base, "LOG_CHALLENGES": "ALL"}).log_challenges == "all"
    with pytest.raises(ConfigError) as refused:
        load_settings({**base, "LOG_CHALLENGES": "sometimes"})
    assert refused.value.problems == ["LOG_CHALLENGES must be one of summary, all, off, got 'sometimes'"]
