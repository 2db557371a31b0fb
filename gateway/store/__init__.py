"""The shared state store: one async interface, three backends picked by URL scheme."""

from gateway.store.base import RateDecision, Store, StoreUnavailable, open_store

__all__ = ["RateDecision", "Store", "StoreUnavailable", "open_store"]
