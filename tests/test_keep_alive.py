"""Every request on a kept-alive connection is answered, whenever its body's bytes arrive.

Most refusals (a 402 challenge, a 429, a 401, a 404) are answered without reading the body. A
client that writes its request's head and body in two writes (as HTTP clients under load do)
used to see the served gateway close the connection once such an answer ended with the body
still in flight, and its next request on that connection went unanswered. These tests speak
raw HTTP/1.1 to a real ``x402-gateway serve`` so that the split is certain, not a race.
"""

from __future__ import annotations

import asyncio
import collections
import json
from collections.abc import Iterator

import pytest

from tests.support.gateway_process import GatewayProcess, serve
from tests.support.gateway_server import FULL_ENV, PAY_TO

pytestmark = pytest.mark.slow

GET_BALANCE = "/v1/x402/solana/mainnet/provider_a/rpc/getBalance"
BODY = json.dumps(
    {"jsonrpc": "2.0", "id": 1, "method": "getBalance", "params": ["11111111111111111111111111111111"]}
).encode()
PATHS = (GET_BALANCE, "/v1/no-such-route", "/api/internal/facilitator/verify")
"""A paid route (402, then 429 past the challenge limit), an unknown path (404), an internal
route without its secret (401): none of them reads the body."""


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    with serve({**FULL_ENV, "FACILITATOR_FEE_PAYER": PAY_TO, "LOG_CHALLENGES": "off"}) as running:
        yield running


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    fields = (line.partition(":") for line in lines[1:] if line)
    headers = {name.strip().lower(): value.strip() for name, _, value in fields}
    await reader.readexactly(int(headers["content-length"]))
    return status, headers


async def _one_client(port: int, requests: int, split_every: int) -> collections.Counter[object]:
    """``requests`` POSTs with a JSON body on a kept-alive connection, opening a new one only when
    told to (``connection: close``, as hypercorn says after 1,000 requests); every
    ``split_every``-th writes its body a moment after its head. Counts statuses, the connections
    closed with notice, and requests lost on a connection closed without it."""
    seen: collections.Counter[object] = collections.Counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i in range(requests):
            path = PATHS[i % len(PATHS)]
            head = (
                f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                f"content-length: {len(BODY)}\r\n\r\n"
            ).encode()
            try:
                if i % split_every == 0:
                    writer.write(head)
                    await writer.drain()
                    await asyncio.sleep(0.002)  # the answer is on its way before the body is
                    writer.write(BODY)
                else:
                    writer.write(head + BODY)
                await writer.drain()
                status, headers = await _read_answer(reader)
            except (ConnectionError, asyncio.IncompleteReadError) as lost:
                seen[f"lost: {type(lost).__name__}"] += 1
                return seen
            seen[status] += 1
            if headers.get("connection") == "close":
                seen["closed with notice"] += 1
                writer.close()
                reader, writer = await asyncio.open_connection("127.0.0.1", port)
    finally:
        writer.close()
    return seen


async def test_ten_thousand_posts_on_kept_alive_connections_are_all_answered(gateway: GatewayProcess) -> None:
    clients, per_client = 8, 1250

    results = await asyncio.gather(
        *(_one_client(gateway.port, per_client, split_every=4) for _ in range(clients))
    )

    total: collections.Counter[object] = sum(results, collections.Counter())
    assert sum(n for key, n in total.items() if isinstance(key, int)) == clients * per_client, total
    assert set(total) <= {401, 402, 404, 429, "closed with notice"}, total
    assert total[402] > 0 and total[404] > 0 and total[401] > 0


async def test_a_body_slower_than_the_drain_is_answered_with_connection_close(
    gateway: GatewayProcess,
) -> None:
    """The client learns not to reuse the connection, instead of finding it closed under it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", gateway.port)
    try:
        writer.write(
            f"POST {GET_BALANCE} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: {len(BODY)}\r\n\r\n".encode()
            + BODY[:10]
        )
        await writer.drain()
        status, headers = await asyncio.wait_for(_read_answer(reader), timeout=10)
    finally:
        writer.close()

    assert status in (402, 429) and headers["connection"] == "close"
