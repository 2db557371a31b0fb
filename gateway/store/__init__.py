"""The shared state store: one async interface, four backends picked by URL scheme.

The backends import only ``gateway.store.base`` and each other, so opening one here makes no
import circle.
"""

from gateway.store.base import (
    STORE_TIMEOUT_S,
    Bucket,
    Credit,
    CreditAccount,
    CreditHoldOrder,
    CreditSessionSpend,
    CreditSessionState,
    CreditState,
    Entry,
    Hold,
    LedgerPosition,
    Lookup,
    RateDecision,
    Script,
    SessionLookup,
    SessionSpent,
    Share,
    Store,
    StoreUnavailable,
    TakeTooLate,
)
from gateway.store.cluster import CLUSTER_SCHEMES, parse_cluster_url

__all__ = [
    "STORE_TIMEOUT_S",
    "Bucket",
    "Credit",
    "CreditAccount",
    "CreditHoldOrder",
    "CreditSessionSpend",
    "CreditSessionState",
    "CreditState",
    "Entry",
    "Hold",
    "LedgerPosition",
    "Lookup",
    "RateDecision",
    "Script",
    "SessionLookup",
    "SessionSpent",
    "Share",
    "Store",
    "StoreUnavailable",
    "TakeTooLate",
    "open_store",
]


MEMORY_SCHEME = "memory://"
REDIS_SCHEMES = ("redis://", "rediss://")
UPSTASH_SCHEMES = ("https://", "http://")
STORE_URL_PROBLEM = (
    "STATE_STORE_REST_URL must start with https://, http://, redis://, rediss:// or memory://, "
    "or be redis+cluster:// (rediss+cluster://) followed by [[user]:password@]host:port[,host:port...]"
)


def known_store_url(url: str) -> bool:
    """``url`` names a backend this gateway can open (empty: the in-process store); a cluster
    URL must also name its nodes well."""
    if url.startswith(CLUSTER_SCHEMES):
        try:
            parse_cluster_url(url)
        except ValueError:
            return False
        return True
    return not url or url.startswith((MEMORY_SCHEME, *REDIS_SCHEMES, *UPSTASH_SCHEMES))


def shared_store_url(url: str) -> bool:
    """``url`` names a store shared by processes that outlives each (Redis or Upstash)."""
    return bool(url) and not url.startswith(MEMORY_SCHEME)


def open_store(url: str | None, token: str | None, *, timeout_s: float = STORE_TIMEOUT_S) -> Store:
    """Pick the backend by the scheme of ``STATE_STORE_REST_URL``.

    ``https://`` / ``http://``: Upstash REST; ``redis://`` / ``rediss://``: Redis protocol;
    ``redis+cluster://`` / ``rediss+cluster://``: a Redis Cluster, by its startup nodes; unset or
    ``memory://``: the in-process store (one process only). ``timeout_s`` bounds each call to a
    shared store; the in-process one never waits.
    """
    if not url or not shared_store_url(url):
        from gateway.store.memory import MemoryStore

        return MemoryStore()
    if url.startswith(CLUSTER_SCHEMES):
        from gateway.store.cluster import RedisClusterStore

        return RedisClusterStore(url, timeout_s=timeout_s)
    if url.startswith(REDIS_SCHEMES):
        from gateway.store.redis import RedisStore

        return RedisStore(url, timeout_s=timeout_s)
    if url.startswith(UPSTASH_SCHEMES):
        from gateway.store.upstash import UpstashStore

        return UpstashStore(url, token or "", timeout_s=timeout_s)
    raise ValueError(STORE_URL_PROBLEM)
