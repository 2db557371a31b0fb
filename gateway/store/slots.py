"""Which keys one script may touch: those of one hash tag.

A Redis Cluster runs a script only when all its keys hash to one slot, and a key's slot is its
hash tag's: the text between its first ``{`` and the next ``}``, when that is not empty, else the
whole key. Every domain splits its work into one step per tag (``gateway.store.limits``,
``.claims``, ``.holds``), on every backend alike, so what runs on a single Redis is what runs on
a cluster. Keys of one tag always share a slot; keys of two tags may share one by chance, which
changes nothing here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")


def hash_tag(key: str) -> str:
    """The part of ``key`` its slot is computed from (the Redis Cluster rule)."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            return key[start + 1 : end]
    return key


def by_tag(items: Iterable[T], key_of: Callable[[T], str]) -> dict[str, list[T]]:
    """``items`` grouped by their key's hash tag, each group (and the groups) in first-seen order."""
    groups: dict[str, list[T]] = {}
    for item in items:
        groups.setdefault(hash_tag(key_of(item)), []).append(item)
    return groups


def one_tag(keys: Iterable[str], what: str) -> str | None:
    """The one tag every key in ``keys`` shares (None when there are none); ValueError when they
    span several: ``what`` must be atomic, so its keys must be named to share a slot."""
    tags = {hash_tag(key) for key in keys}
    if len(tags) > 1:
        raise ValueError(f"{what}: its keys span several hash tags {sorted(tags)}")
    return next(iter(tags), None)
