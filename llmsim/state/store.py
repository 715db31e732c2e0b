"""A bounded key/value store with a time-to-live, for stored responses and conversations.

Bounded three ways: at most ``max_entries`` entries (the oldest is evicted first: keys come
from the server, but clients choose how many to create), at most ``max_bytes`` accounted bytes
(0 = no byte bound; each entry's size is an estimate its owner gives to :meth:`put` or
:meth:`resize`, because one entry can be kilobytes or tens of megabytes), and each entry
lives ``ttl`` seconds on the injected clock (0 = no TTL). Entries are kept in insertion order,
and because every entry has the same TTL the oldest entry always expires first, so purging is
O(1) amortised: look at the front, drop while expired. ``on_evict`` is told about every entry
that leaves for any reason other than an explicit ``pop`` (so a running background response
can be stopped); ``on_remove`` about every entry that leaves, ``pop`` and replacement
included (so an owner can release what it accounted for the entry).

``extra_bytes`` is memory the owner keeps alive on behalf of the entries without it being an
entry (the earlier turns of a stored ``previous_response_id`` chain); it counts against
``max_bytes`` too, and it can only shrink by evicting entries, so eviction goes on, oldest
first, until the total fits.
"""

from __future__ import annotations

import gc
import sys
from collections import OrderedDict
from collections.abc import Callable, Iterator, KeysView
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["BoundedStore", "SnapshotStore", "approx_bytes", "json_bytes", "WALK_NODES"]

V = TypeVar("V")
V_co = TypeVar("V_co", covariant=True)

WALK_NODES = 1 << 13  # approx_bytes gives up beyond this many objects (~1.5 ms of walking)


def approx_bytes(obj: Any, limit: int = WALK_NODES) -> int | None:
    """The memory held by ``obj`` and everything it references (``sys.getsizeof`` summed
    over the object graph, one level at a time in C), or None once more than ``limit``
    objects were seen (then :func:`json_bytes` of its JSON is the cheaper bound). Meant for
    parsed JSON (trees): an object shared by several parents is counted each time."""
    getsizeof = sys.getsizeof
    referents = gc.get_referents
    total = 0
    seen = 0
    level = [obj]
    while level:
        seen += len(level)
        if seen > limit:
            return None
        total += sum(map(getsizeof, level))
        level = referents(*level)
    return total


def json_bytes(data: bytes) -> int:
    """An upper bound on the memory of ``data``'s parsed form, from its length and counts of
    its structural characters (C speed, ~3 GB/s a count): per ``{`` a small dict, per ``[`` a
    list, per ``"`` half a string header, per ``,`` a pointer and a number. Measured on
    orjson-parsed shapes: 1.1-4x the real size for structure-heavy JSON (lists of empty
    objects take 24x their JSON length), 1x for big strings, up to ~30x for JSON text
    embedded in strings (its braces count as objects)."""
    count = data.count
    return (len(data) + 200 * count(b"{") + 64 * count(b"[") + 32 * count(b'"')
            + 32 * count(b","))


class BoundedStore(Generic[V]):
    """``max_entries`` newest entries, ``max_bytes`` in all, each for at most ``ttl`` seconds
    of ``now()``."""

    def __init__(self, max_entries: int, ttl: float, now: Callable[[], float],
                 on_evict: Callable[[str, V], None] | None = None, *, max_bytes: int = 0,
                 on_remove: Callable[[str, V], None] | None = None) -> None:
        self.max_entries = max(0, int(max_entries))
        self.max_bytes = max(0, int(max_bytes))
        self.ttl = float(ttl)
        self._now = now
        self._data: OrderedDict[str, tuple[float, V, int]] = OrderedDict()  # (born, v, bytes)
        self.on_evict = on_evict
        self.on_remove = on_remove
        self.evicted = 0  # entries dropped by the bounds (count, for stats and tests)
        self.bytes = 0  # accounted bytes of the entries
        self.extra_bytes = 0  # owner-kept bytes counted against max_bytes (see module doc)

    def __len__(self) -> int:
        self.purge()
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return self.get(key) is not None  # type: ignore[arg-type]

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def fits(self, nbytes: int) -> bool:
        """Whether an entry of ``nbytes`` can be stored at all (enabled, within max_bytes)."""
        return self.max_entries > 0 and (not self.max_bytes or nbytes <= self.max_bytes)

    def purge(self, now: float | None = None) -> None:
        """Drop expired entries (oldest first); ``now``: the clock read already."""
        if self.ttl <= 0 or not self._data:
            return
        limit = (self._now() if now is None else now) - self.ttl
        data = self._data
        while data:
            key, (born, value, _) = next(iter(data.items()))
            if born > limit:
                break
            self._drop(key)

    def put(self, key: str, value: V, *, nbytes: int = 0) -> bool:
        """Insert or replace ``key`` (accounted as ``nbytes``); False when it is not kept: the
        store is disabled (0 entries), or the entry alone is bigger than ``max_bytes``, or
        it had to go to bring the owner's ``extra_bytes`` back under the bound."""
        if not self.fits(nbytes):
            return False
        now = self._now()
        data = self._data
        # (purge's and shrink's own tests, written out: no call while nothing is due)
        if self.ttl > 0 and data and next(iter(data.values()))[0] <= now - self.ttl:
            self.purge(now)
        if key in data:
            _, old, size = data.pop(key)
            self.bytes -= size
            if self.on_remove is not None:
                self.on_remove(key, old)
        data[key] = (now, value, nbytes)
        self.bytes += nbytes
        cap = self.max_bytes
        if len(data) > self.max_entries or (cap and self.bytes + self.extra_bytes > cap):
            self.shrink()
        return key in data

    def resize(self, key: str, nbytes: int) -> None:
        """Re-account an entry that grew or shrank in place (its age is kept); other entries
        are evicted, oldest first, if the total no longer fits (``key`` itself stays)."""
        hit = self._data.get(key)
        if hit is None:
            return
        self._data[key] = (hit[0], hit[1], nbytes)
        self.bytes += nbytes - hit[2]
        self.shrink(keep=key)

    def shrink(self, keep: str | None = None) -> None:
        """Evict the oldest entries (not ``keep``) until both bounds hold."""
        data = self._data
        cap = self.max_bytes
        while data and (len(data) > self.max_entries
                        or (cap and self.bytes + self.extra_bytes > cap)):
            if keep is None:  # (the usual case: one C call takes the oldest)
                self._gone(*data.popitem(last=False))
                continue
            it = iter(data)
            old_key = next(it)
            if old_key == keep:
                after = next(it, None)
                if after is None:
                    return
                old_key = after
            self._drop(old_key)

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
        if hit is None:
            return None
        self.bytes -= hit[2]
        if self.on_remove is not None:
            self.on_remove(key, hit[1])
        return hit[1]

    def keys(self) -> KeysView[str]:
        """The live entries' keys (expired ones dropped first): a view, read it at once."""
        self.purge()
        return self._data.keys()

    def values(self) -> Iterator[V]:
        self.purge()
        return iter([v for _, v, _ in self._data.values()])

    def clear(self) -> None:
        while self._data:
            self._drop(next(iter(self._data)))

    def _drop(self, key: str) -> None:
        """Remove ``key`` because of a bound (or clear): account, tell the owner."""
        self._gone(key, self._data.pop(key))

    def _gone(self, key: str, entry: tuple[float, V, int]) -> None:
        """``key``'s entry was taken out by a bound (or clear): account, tell the owner."""
        _, value, size = entry
        self.bytes -= size
        self.evicted += 1
        if self.on_remove is not None:
            self.on_remove(key, value)
        if self.on_evict is not None:
            self.on_evict(key, value)


class SnapshotStore(Protocol[V_co]):
    """A bounded TTL key/value table shared by processes: what stored responses and their
    control entries are kept in across ``--workers`` (:class:`llmsim.state.shared.SharedStore`,
    sqlite) or replicas (:class:`llmsim.state.redis_store.RedisStore`). The paired reads and
    writes are one round trip where the back end can (Redis), two calls where it need not
    (sqlite, on the same machine)."""

    def put(self, key: str, value: Any, owner: Any = None) -> bool: ...

    def update(self, key: str, value: Any, owner: Any = None) -> bool: ...

    def update_owned(self, owner: Any, fn: Callable[[Any], Any]) -> int: ...

    def get(self, key: str) -> V_co | None: ...

    def has(self, key: str) -> bool: ...

    def pop(self, key: str) -> V_co | None: ...

    def close(self) -> None: ...

    def put_then_get(self, key: str, value: Any, other: Any, other_key: str,
                     owner: Any = None) -> Any:
        """:meth:`put`, then ``other.get(other_key)`` after it."""
        ...

    def get_with(self, key: str, other: Any, other_key: str) -> tuple[V_co | None, Any]:
        """``(get(key), other.get(other_key))``."""
        ...

    def get_and_has(self, key: str, other: Any, other_key: str) -> tuple[V_co | None, bool]:
        """``(get(key), other.has(other_key))``."""
        ...
