"""A WebSocket connection's cache of previous responses (:class:`ConnectionCache`, per
lane), which the Responses handler reads through :class:`.record.PreviousResponses`."""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass
from .record import Record

__all__ = ["ConnectionCache", "LaneCache"]


def _cached_id(record: Any) -> str | None:
    rid = record.id if isinstance(record, Record) else (
        record.get("id") if isinstance(record, dict) else None)
    return rid if isinstance(rid, str) else None


class ConnectionCache:
    """The most recent completed response of each lane of one WebSocket connection (the whole
    connection when no lanes are used): at most ``limit`` entries (one per named lane plus the
    default lane). The session owns it and hands each create a :class:`LaneCache`; it holds no
    reference to the session, so a stored record that keeps its lane view keeps only this
    (emptied by :meth:`clear` when the connection ends)."""

    __slots__ = ("limit", "_by_id", "_by_lane", "closed")

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._by_id: OrderedDict[str, Any] = OrderedDict()
        self._by_lane: dict[str | None, str] = {}
        self.closed = False

    def __len__(self) -> int:
        return len(self._by_id)

    def lane(self, stream_id: str | None) -> LaneCache:
        """The view of lane ``stream_id`` (a create's ``Request.context``)."""
        return LaneCache(self, stream_id)

    def get(self, response_id: str) -> Any | None:
        return self._by_id.get(response_id)

    def put(self, stream_id: str | None, record: Any) -> None:
        """Remember ``record`` as lane ``stream_id``'s most recent completed response."""
        rid = _cached_id(record)
        if self.closed or rid is None:
            return
        old = self._by_lane.get(stream_id)
        if old is not None and old != rid:
            self._by_id.pop(old, None)
        self._by_id[rid] = record
        self._by_id.move_to_end(rid)
        self._by_lane[stream_id] = rid
        while len(self._by_id) > self.limit:
            self.evict(next(iter(self._by_id)))

    def continuation_failed(self, stream_id: str | None, previous_id: str | None) -> None:
        """A continuation of ``previous_id`` on lane ``stream_id`` failed: as the real
        service, a failed same-lane continuation evicts its parent."""
        if previous_id is not None and self._by_lane.get(stream_id) == previous_id:
            self.evict(previous_id)

    def evict(self, response_id: str) -> None:
        self._by_id.pop(response_id, None)
        for k in [k for k, v in self._by_lane.items() if v == response_id]:
            del self._by_lane[k]

    def clear(self) -> None:
        """The connection ended: forget everything, accept nothing more."""
        self.closed = True
        self._by_id.clear()
        self._by_lane.clear()


class LaneCache:
    """:class:`PreviousResponses` of one lane of a :class:`ConnectionCache`."""

    __slots__ = ("cache", "stream_id")

    def __init__(self, cache: ConnectionCache, stream_id: str | None) -> None:
        self.cache = cache
        self.stream_id = stream_id

    def cached_response(self, response_id: str) -> Any | None:
        return self.cache.get(response_id)

    def cache_response(self, record: Any) -> None:
        self.cache.put(self.stream_id, record)
