"""Lane scheduling of one WebSocket connection, as a pure data structure (no I/O, no clock).

A *lane* is a ``stream_id`` (``None`` is the default lane). A lane runs one item at a time,
FIFO. Up to ``max_active`` items of different lanes run at once; lanes with work wait for a
slot in the order their work became runnable. Named lanes are capped (``max_lanes`` distinct
ids; the count never goes down, as the real service). ``max_queued`` waiting items is the
backpressure signal (:attr:`LaneScheduler.full`): the session stops reading the socket while it
is set, so a client that floods creates is slowed by TCP instead of growing a queue.

The session calls :meth:`~LaneScheduler.admit` for a new item, starts what
:meth:`~LaneScheduler.take_ready` hands out, and reports each end with
:meth:`~LaneScheduler.finish`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = ["LaneScheduler", "LaneLimitError"]

T = TypeVar("T")


class LaneLimitError(Exception):
    """A new named lane beyond ``max_lanes``."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"more than {limit} distinct lanes")
        self.limit = limit


class _Lane(Generic[T]):
    __slots__ = ("queue", "running", "waiting")

    def __init__(self) -> None:
        self.queue: deque[T] = deque()
        self.running = False  # one of its items runs
        self.waiting = False  # in the run queue


class LaneScheduler(Generic[T]):
    """FIFO per lane, ``max_active`` lanes at once, ``max_lanes`` named lanes ever."""

    def __init__(self, max_lanes: int, max_active: int, max_queued: int) -> None:
        if min(max_lanes, max_active, max_queued) < 1:
            raise ValueError("max_lanes, max_active and max_queued must be >= 1")
        self.max_lanes = max_lanes
        self.max_active = max_active
        self.max_queued = max_queued
        self._lanes: dict[str | None, _Lane[T]] = {}  # lanes with work (≤ max_lanes + 1)
        self._named: set[str] = set()  # distinct named lanes ever used (≤ max_lanes)
        self._runq: deque[str | None] = deque()  # lanes with work waiting for a slot
        self.active = 0  # items running
        self.queued = 0  # items waiting

    @property
    def full(self) -> bool:
        """Backpressure: ``max_queued`` items wait; stop taking new ones from the client."""
        return self.queued >= self.max_queued

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing waits."""
        return self.active == 0 and self.queued == 0

    @property
    def lanes(self) -> int:
        """Lanes holding work (running or waiting)."""
        return len(self._lanes)

    def admit(self, lane: str | None, item: T) -> None:
        """Queue ``item`` on ``lane``; :class:`LaneLimitError` for one named lane too many
        (nothing changes then)."""
        if lane is not None and lane not in self._named:
            if len(self._named) >= self.max_lanes:
                raise LaneLimitError(self.max_lanes)
            self._named.add(lane)
        ln = self._lanes.get(lane)
        if ln is None:
            ln = self._lanes[lane] = _Lane()
        ln.queue.append(item)
        self.queued += 1
        if not ln.running and not ln.waiting:
            ln.waiting = True
            self._runq.append(lane)

    def take_ready(self) -> Iterator[tuple[str | None, T]]:
        """Hand out the items that may start now, marking them running (oldest lane first).
        A generator: stop iterating and the rest stays queued."""
        while self._runq and self.active < self.max_active:
            key = self._runq.popleft()
            ln = self._lanes.get(key)
            if ln is None:
                continue
            ln.waiting = False
            if ln.running or not ln.queue:
                continue
            item = ln.queue.popleft()
            self.queued -= 1
            ln.running = True
            self.active += 1
            yield key, item

    def finish(self, lane: str | None) -> None:
        """The running item of ``lane`` ended: its next item (if any) waits for a slot."""
        ln = self._lanes.get(lane)
        if ln is None or not ln.running:
            raise KeyError(f"no running item on lane {lane!r}")
        ln.running = False
        self.active -= 1
        if ln.queue:
            if not ln.waiting:
                ln.waiting = True
                self._runq.append(lane)
        else:
            del self._lanes[lane]

    def drop_queued(self) -> list[T]:
        """Forget every waiting item (the connection closes); running ones stay running."""
        dropped: list[T] = []
        for key in list(self._lanes):
            ln = self._lanes[key]
            dropped.extend(ln.queue)
            ln.queue.clear()
            ln.waiting = False
            if not ln.running:
                del self._lanes[key]
        self._runq.clear()
        self.queued = 0
        return dropped
