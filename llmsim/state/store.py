"""A bounded key/value store with a time-to-live, for stored responses and conversations.

Bounded twice: at most ``max_entries`` entries (the oldest is evicted first: keys come from the
server, but clients choose how many to create) and each entry lives ``ttl`` seconds on the
injected clock (0 = no TTL). Entries are kept in insertion order, and because every entry has
the same TTL the oldest entry always expires first, so purging is O(1) amortised: look at the
front, drop while expired. ``on_evict`` is told about every entry that leaves for any reason
other than an explicit ``pop`` (so a running background response can be stopped).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["BoundedStore"]

V = TypeVar("V")


class BoundedStore(Generic[V]):
    """``max_entries`` newest entries, each for at most ``ttl`` seconds of ``now()``."""

    def __init__(self, max_entries: int, ttl: float, now: Callable[[], float],
                 on_evict: Callable[[str, V], None] | None = None) -> None:
        self.max_entries = max(0, int(max_entries))
        self.ttl = float(ttl)
        self._now = now
        self._data: OrderedDict[str, tuple[float, V]] = OrderedDict()
        self.on_evict = on_evict
        self.evicted = 0  # entries dropped by the bounds (count, for stats and tests)

    def __len__(self) -> int:
        self.purge()
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None  # type: ignore[arg-type]

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def purge(self) -> None:
        """Drop expired entries (oldest first)."""
        if self.ttl <= 0 or not self._data:
            return
        limit = self._now() - self.ttl
        data = self._data
        while data:
            key, (born, value) = next(iter(data.items()))
            if born > limit:
                break
            del data[key]
            self._evicted(key, value)

    def put(self, key: str, value: V) -> bool:
        """Insert or replace ``key``; returns False when the store is disabled (0 entries)."""
        if self.max_entries <= 0:
            return False
        self.purge()
        data = self._data
        if key in data:
            del data[key]
        data[key] = (self._now(), value)
        while len(data) > self.max_entries:
            old_key, (_, old) = data.popitem(last=False)
            self._evicted(old_key, old)
        return True

    def get(self, key: str) -> V | None:
        hit = self._data.get(key)
        if hit is None:
            return None
        if self.ttl > 0 and hit[0] <= self._now() - self.ttl:
            self.purge()
            return None
        return hit[1]

    def pop(self, key: str) -> V | None:
        """Remove ``key`` (no ``on_evict``); returns its value or None."""
        self.purge()
        hit = self._data.pop(key, None)
        return None if hit is None else hit[1]

    def values(self) -> Iterator[V]:
        self.purge()
        return iter([v for _, v in self._data.values()])

    def clear(self) -> None:
        items = list(self._data.items())
        self._data.clear()
        for k, (_, v) in items:
            self._evicted(k, v)

    def _evicted(self, key: str, value: V) -> None:
        self.evicted += 1
        if self.on_evict is not None:
            self.on_evict(key, value)
