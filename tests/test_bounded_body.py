"""Outbound answers are read whole however the peer splits them, and never past the cap.

The peer is a raw TCP server on loopback that writes a real HTTP/1.1 answer in pieces with
pauses between them, so the client's socket buffer holds only part of the body at a time.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest

from gateway.outbound import solana_rpc
from gateway.outbound.solana_rpc import RpcUnavailable, SolanaRpc

PAUSE_S = 0.01


@asynccontextmanager
async def dripping_server(body: bytes, pieces: int) -> AsyncIterator[str]:
    """Answer every request with ``body`` split into ``pieces`` writes, a pause between each."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.lower().split(b"\r\n")
        length = next(int(line.split(b":", 1)[1]) for line in lines if line.startswith(b"content-length"))
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
            + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
        )
        await writer.drain()
        step = max(1, len(body) // pieces)
        for start in range(0, len(body), step):
            writer.write(body[start : start + step])
            await writer.drain()
            await asyncio.sleep(PAUSE_S)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.close()
        await server.wait_closed()


def _balance_answer(padding: int = 0) -> bytes:
    answer = {"jsonrpc": "2.0", "id": 1, "result": {"context": {"slot": 7}, "value": 1_234_567}}
    if padding:
        answer["padding"] = "x" * padding  # an extra field the decoder ignores
    return json.dumps(answer).encode()


async def _with_client(url: str, call: Callable[[SolanaRpc], Awaitable[int]]) -> int:
    client = SolanaRpc(url, timeout_s=10)
    try:
        return await call(client)
    finally:
        await client.close()


@pytest.mark.parametrize("pieces", [2, 7, 40])
async def test_an_rpc_answer_written_in_pieces_with_pauses_is_read_whole(pieces: int) -> None:
    body = _balance_answer(padding=20_000)
    async with dripping_server(body, pieces) as url:
        lamports = await _with_client(url, lambda rpc: rpc.get_balance("11111111111111111111111111111111"))
    assert lamports == 1_234_567


async def test_an_rpc_answer_over_the_cap_is_refused_even_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(solana_rpc, "MAX_RESPONSE_BYTES", 4096)
    body = _balance_answer(padding=10_000)
    async with dripping_server(body, 5) as url:
        with pytest.raises(RpcUnavailable, match="getBalance: answer too large"):
            await _with_client(url, lambda rpc: rpc.get_balance("11111111111111111111111111111111"))
