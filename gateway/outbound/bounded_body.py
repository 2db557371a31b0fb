"""Read a whole upstream answer without letting a peer exhaust our memory.

Every outbound call (providers, the asset-data API, facilitators, Solana RPC nodes) reads its
answer through :func:`read_bounded`: it keeps reading however the peer splits the body into
TCP writes, and stops at the cap. Each caller turns :class:`AnswerTooLarge` into its own error.
"""

from __future__ import annotations

import aiohttp

CHUNK_BYTES = 64 * 1024
MAX_UPSTREAM_BYTES = 8 * 1024 * 1024
"""The largest answer read from an upstream (provider or asset-data API)."""


class AnswerTooLarge(Exception):
    """The peer's answer is longer than the caller's cap."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"answer larger than {limit} bytes")
        self.limit = limit


async def read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The complete body of ``response``; :class:`AnswerTooLarge` past ``limit`` bytes."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(CHUNK_BYTES):
        size += len(chunk)
        if size > limit:
            raise AnswerTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)
