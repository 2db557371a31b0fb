"""The shared state store: one async interface, three backends picked by URL scheme.

The backends import only ``gateway.store.base``, so opening one here makes no import circle.
"""

from gateway.store.base import (
    Bucket,
    Credit,
    CreditState,
    Entry,
    Hold,
    Lookup,
    RateDecision,
    Store,
    StoreUnavailable,
)

__all__ = [
    "Bucket",
    "Credit",
    "CreditState",
    "Entry",
    "Hold",
    "Lookup",
    "RateDecision",
    "Store",
    "StoreUnavailable",
    "open_store",
]


def open_store(url: str | None, token: str | None) -> Store:
    """Pick the backend by the scheme of ``STATE_STORE_REST_URL``.

    ``https://`` / ``http://``: Upstash REST; ``redis://`` / ``rediss://``: Redis protocol;
    unset or ``memory://``: the in-process store (one process only).
    """
    if not url or url.startswith("memory://"):
        from gateway.store.memory import MemoryStore

        return MemoryStore()
    if url.startswith(("redis://", "rediss://")):
        from gateway.store.redis import RedisStore

        return RedisStore(url)
    if url.startswith(("https://", "http://")):
        from gateway.store.upstash import UpstashStore

        return UpstashStore(url, token or "")
    raise ValueError(
        "STATE_STORE_REST_URL must start with https://, http://, redis://, rediss:// or memory://"
    )
