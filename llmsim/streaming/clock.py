"""Clocks: one shared timer heap for every stream, and a fake clock for tests.

Theory of operation. Pacing thousands of token streams with one ``asyncio.sleep`` per token
costs a task wake-up per token and drifts (each relative sleep adds the loop's lateness). Here
every due action is a :class:`Timer` in one heap of *absolute* deadlines, kept in slots of
``coalesce`` seconds, and the clock keeps exactly one ``loop.call_at`` armed for the start of
the earliest slot holding a live timer. When it fires, every timer of the slots begun by then
runs in that same pass, so events of many streams that fall due together are written in one
loop iteration. A stream computes its deadlines from its start time
plus the scheduled offsets, never from "now", so lateness never accumulates.

A pass also holds the writes of its streams' common ticks (:attr:`Clock.outbox`) and makes
them back to back when it ends: the client, woken by the first, finds the others already
there, instead of being woken once per write while the pass computes the next event (on a
shared host, waking a reader is most of a small write's cost). Every other timer, and a
stream's own uncommon path, writes the held ones first, so each connection's bytes keep
their order.

:class:`FakeClock` runs the same heap on virtual time: whenever the loop has been idle for a
few passes it jumps to the earliest deadline. Tests that are about timing run instantly and
see exact scheduled times.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections.abc import Callable
from heapq import heappop as _heappop
from heapq import heappush as _heappush
from math import ceil as _ceil
from time import monotonic as _monotonic
from typing import Any, Protocol

__all__ = ["Clock", "RealClock", "FakeClock", "Timer", "COALESCE", "CATCH_UP", "HoldsWrites",
           "holds_writes"]

# The one coalescing rule for stream events (applied by flow.Pump): events of one stream
# share a write only when they are due at the same instant (within COALESCE) or when the
# pump is behind, i.e. the next event is already later than CATCH_UP seconds. On time, every
# event is its own write at its own deadline: two tokens written together are a timing error
# the client sees.
COALESCE = 0.0002  # run timers due within 0.2 ms of each other in one pass
CATCH_UP = 0.002


class HoldsWrites(Protocol):
    """A timer whose writes a pass may hold (:attr:`Clock.outbox`): where they go, and what
    to do when one raises (a pump ends its stream as if its own write had raised)."""

    held_write: Callable[[bytes], Any]

    def held_write_failed(self, data: bytes) -> None: ...


def holds_writes() -> None:
    """The callback of a timer whose ``fire`` may hold writes in :attr:`Clock.outbox`
    (flow.Pump, which the clock calls through ``fire``, never through this)."""


def _released() -> None:
    """What a cancelled :class:`Timer` holds instead of its callback."""


class Timer:
    """A scheduled callback; ``cancel()`` is O(1) (lazy deletion from the heap)."""

    __slots__ = ("deadline", "callback", "cancelled")

    def __init__(self, deadline: float, callback: Callable[[], Any]) -> None:
        self.deadline = deadline
        self.callback = callback
        self.cancelled = False

    def fire(self) -> float | None:
        """Run the callback: what the clock calls when the timer is due. A subclass that is
        its own callback overrides it (flow.Pump) and may return the finite deadline at
        which it is due again, for the clock to arm (as :meth:`Clock.recall` would)."""
        self.callback()
        return None

    def cancel(self) -> None:
        self.cancelled = True
        self.callback = _released  # the heap may keep the entry until its deadline: not what
        # the callback holds (a long timer of a closed connection would keep it alive)


log = logging.getLogger("llmsim")

_INF = float("inf")
_FAR = 1 << 62  # the slot of an infinite deadline


class Clock:
    """Interface: monotonic ``now()``, wall ``time()``, ``call_at``, and ``sleep``.

    The timers live in slots of :attr:`coalesce` seconds (``_slots``: slot number → timers
    in the order they were armed) and a heap of the slot numbers (``_keys``): arming a timer
    is a dict lookup and a list append, firing one is a step through a list. One heap entry
    per slot, not per timer: with a thousand streams a per-timer heap was a fifth of the
    per-event cost (issue 15). A pass runs every slot that has begun by ``now``: a timer
    fires at most ``coalesce`` early, never late, as the coalescing rule says."""

    coalesce = COALESCE  # (the rule: see COALESCE and CATCH_UP above)
    catch_up = CATCH_UP

    def __init__(self) -> None:
        self._slots: dict[int, list[Timer]] = {}
        self._keys: list[int] = []  # heap of the numbers of the slots in _slots
        self._entries = 0  # timers in the slots, cancelled ones included
        self._per_slot = 1.0 / self.coalesce
        self._running = False  # inside _run_due: arm once at the end, not per push
        # inside _run_due: the writes held until the pass ends, (writer, bytes) in order (a
        # pump's common tick appends, flush() makes them); None outside a pass
        self.outbox: list[tuple[HoldsWrites, bytes]] | None = None
        # inside _run_due: the time the pass began (what its timers take for now)
        self.pass_at = 0.0
        self._held: list[tuple[HoldsWrites, bytes]] = []

    # -- to be provided by subclasses ----------------------------------------------------
    def now(self) -> float:  # pragma: no cover - interface
        raise NotImplementedError

    def time(self) -> float:
        """Wall-clock seconds since the epoch (for ``created`` fields)."""
        return time.time()

    def now_fn(self) -> Callable[[], float]:
        """The cheapest callable that returns :meth:`now` (a pump calls it once per tick)."""
        return self.now

    def _arm(self) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    # -- shared ---------------------------------------------------------------------------
    def _slot(self, deadline: float) -> int:
        try:
            return int(deadline * self._per_slot)
        except OverflowError:  # ±inf: after (before) every other timer
            return _FAR if deadline > 0 else -_FAR

    def call_at(self, deadline: float, callback: Callable[[], Any]) -> Timer:
        """Run ``callback()`` at monotonic time ``deadline`` (or as soon as possible)."""
        return self.recall(Timer(deadline, callback), deadline)

    def recall(self, timer: Timer, deadline: float) -> Timer:
        """Arm ``timer`` again for ``deadline`` with the same callback: ``call_at`` without
        allocating, for a callback that re-arms its own timer once per event (the pump).
        Only for a timer that has FIRED (its slot entry is gone) or a new one; a timer
        cancelled before firing still has its entry and must not be reused."""
        timer.deadline = deadline
        timer.cancelled = False
        try:
            k = int(deadline * self._per_slot)  # (_slot, inlined: once per event)
        except OverflowError:
            k = self._slot(deadline)
        self._entries += 1
        timers = self._slots.get(k)  # (not try/except KeyError: live, most arms open a
        if timers is None:             # slot, and a raised exception costs ~1 µs)
            self._slots[k] = [timer]
            keys = self._keys
            _heappush(keys, k)
            if keys[0] == k and not self._running:
                self._arm()  # a new earliest slot (inside _run_due the pass re-arms once)
        else:
            timers.append(timer)  # (a slot already armed: its start is unchanged)
        return timer

    def call_later(self, delay: float, callback: Callable[[], Any]) -> Timer:
        return self.call_at(self.now() + delay, callback)

    async def sleep_until(self, deadline: float) -> None:
        """Wait until ``deadline`` on this clock."""
        if deadline <= self.now():
            return
        fut = asyncio.get_running_loop().create_future()
        t = self.call_at(deadline, lambda: None if fut.done() else fut.set_result(None))
        try:
            await fut
        finally:
            t.cancel()

    async def sleep(self, delay: float) -> None:
        if delay <= 0:
            return
        await self.sleep_until(self.now() + delay)

    def next_slot(self) -> int | None:
        """The number of the earliest slot holding a live timer, or None (drops spent slots
        on the way). Its timers run together, from the slot's start on."""
        keys, slots = self._keys, self._slots
        while keys:
            for t in slots[keys[0]]:
                if not t.cancelled:
                    return keys[0]
            self._entries -= len(slots.pop(_heappop(keys)))
        return None

    def next_deadline(self) -> float | None:
        """The earliest deadline of a live timer, or None (drops spent slots on the way)."""
        k = self.next_slot()
        if k is None:
            return None
        return min(t.deadline for t in self._slots[k] if not t.cancelled)

    def _run_due(self, now: float, stop_at: float = _INF) -> None:
        """Run the timers of every slot begun by ``now``, in the order they were armed; past
        ``stop_at`` on ``time.monotonic`` (checked after each 32 timers), leave the rest for the
        next pass. The writes held meanwhile (:attr:`outbox`) are made after each 32 timers,
        before a timer that is not a pump, and at the end."""
        keys, slots = self._keys, self._slots
        per_slot = self._per_slot
        # (+1 ns: a deadline on the loop's own tick, e.g. uvloop's whole milliseconds, may
        # come out a float rounding after that tick; without it the pass finds its slot not
        # yet begun and the loop spins on zero-delay timers until the next tick)
        try:
            last = int((now + 1e-9) * per_slot)  # (_slot, inlined: once per pass)
        except OverflowError:
            last = self._slot(now + 1e-9)
        if not keys or keys[0] > last:
            return
        n = 0  # timers run since the time was last checked
        # the timers taken from the slots and not put back in one (self._entries, counted
        # once when the pass ends: a token re-arms its pump, which then stays counted)
        gone = 0
        self._running = True
        self.pass_at = now
        held = self.outbox = self._held
        try:
            while keys and keys[0] <= last:
                k = _heappop(keys)
                timers = slots.pop(k)
                # in chunks of 32 (a slot is usually one chunk: no slice, no per-timer count)
                for i in range(0, len(timers), 32):
                    if n >= 32:
                        n = 0
                        if held:  # (at most 64 held: a bounded list, a bounded delay)
                            self.flush()
                        if _monotonic() > stop_at:
                            self._put_back(k, timers[i:])
                            return
                    chunk = timers if len(timers) <= 32 else timers[i:i + 32]
                    n += len(chunk)
                    for t in chunk:  # (a timer armed meanwhile for slot k goes into a new
                        if not t.cancelled:  # list, run in a later turn)
                            t.cancelled = True  # fired; a late cancel() is a no-op
                            if t.callback is not holds_writes and held:
                                self.flush()  # (a timer that may write: after the held)
                            try:
                                again = t.fire()
                            except Exception:  # a broken callback must not stop the others
                                log.exception("timer callback failed")
                                gone += 1
                                continue
                            if again is not None:  # (recall, inlined: once per token;
                                t.deadline = again  # no _arm inside the pass)
                                t.cancelled = False
                                try:
                                    k2 = int(again * per_slot)
                                except OverflowError:
                                    k2 = self._slot(again)
                                ts = slots.get(k2)
                                if ts is None:  # (a new slot: the heap too)
                                    slots[k2] = [t]
                                    _heappush(keys, k2)
                                else:
                                    ts.append(t)
                            else:  # (its own recall() inside fire counted it again)
                                gone += 1
                        else:
                            gone += 1
        except BaseException:  # (the pass stops: what its slots hold, counted again)
            gone = 0
            self._entries = sum(len(ts) for ts in slots.values())
            raise
        finally:
            self._entries -= gone
            self._running = False
            if held:
                self.flush()
            self.outbox = None

    def flush(self) -> None:
        """Make the writes the pass holds (see :attr:`outbox`), in the order they were held.
        Called by whatever may write to a connection during a pass, before it does."""
        held = self._held
        items = held[:]  # (emptied first: a failing write's stream flushes again as it ends)
        held.clear()
        # (a loop, not map(operator.call, ...) drained by a deque: ~3x dearer for a pass's
        # usual ten writes, however fewer its bytecodes)
        for writer, data in items:
            try:  # (the write read as an attribute, then called: as a method, a slot's is
                w = writer.held_write  # looked up generically, never specialized)
                w(data)
            except Exception:  # (one connection's broken transport: not the others' writes)
                try:
                    writer.held_write_failed(data)
                except Exception:
                    log.exception("a held stream write failed")

    def _put_back(self, k: int, timers: list[Timer]) -> None:
        """Timers of slot ``k`` a pass left: first in their slot again (still counted in
        ``_entries``: a pass counts only what it takes out for good)."""
        cur = self._slots.get(k)
        if cur is None:
            self._slots[k] = timers
            _heappush(self._keys, k)
        else:
            cur[:0] = timers

    @property
    def pending(self) -> int:
        return sum(1 for ts in self._slots.values() for t in ts if not t.cancelled)

    @property
    def entries(self) -> int:
        """Timers held, cancelled ones not yet dropped included (bounded by compaction)."""
        return self._entries

    # -- cancelling long timers ------------------------------------------------------------
    _stale = 0  # cancels through cancel() since the last compaction (an upper bound)
    COMPACT_MIN = 64  # smaller sets are left alone

    def cancel(self, timer: Timer) -> None:
        """Cancel ``timer``; once cancelled entries may be most of the timers, drop them. A
        cancelled entry otherwise stays until its slot is due: with an hour-long timer per
        connection (the WebSocket time limit), connection churn would grow the slots without
        bound. Amortised O(1) (a compaction follows at least len/2 cancels)."""
        if timer.cancelled:
            return
        Timer.cancel(timer)  # (the timer's own: a subclass may give cancel another meaning)
        self._stale += 1
        if (self._running or self._entries < self.COMPACT_MIN
                or self._stale * 2 <= self._entries):
            return
        self._stale = 0
        slots: dict[int, list[Timer]] = {}
        for k, ts in self._slots.items():
            live = [t for t in ts if not t.cancelled]
            if live:
                slots[k] = live
        self._slots = slots
        self._keys = list(slots)
        heapq.heapify(self._keys)
        self._entries = sum(len(ts) for ts in slots.values())


class RealClock(Clock):
    """The loop's monotonic clock with one armed ``call_at`` for the whole heap."""

    # A pass of due timers ends after this long even if more are due (they run in the next
    # pass, after the loop polled its sockets): a saturated server keeps reading requests
    # and accepting connections (server.Listener: up to ACCEPT_BATCH a pass).
    pass_budget = 0.0005
    scale = 1.0  # this clock's seconds per second of the loop's (timescale.ScaledClock)

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__()
        self._loop = loop
        self._handle: asyncio.Handle | None = None
        self._armed_at = float("inf")
        self._coarse: bool | None = None  # the loop's time is whole milliseconds (uvloop)
        if loop is not None:
            self._bind(loop)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
            self._bind(self._loop)
        return self._loop

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop is known (it never changes): ``now`` becomes the loop's own bound
        method, no Python frame per call, one object every pump's tick shares."""
        self.now = loop.time  # type: ignore[method-assign]

    def now(self) -> float:
        loop = self._loop  # (not the property: once per wake-up)
        return (loop if loop is not None else self.loop).time()

    def now_fn(self) -> Callable[[], float]:
        try:
            _ = self.loop  # (known: now is the loop's time, see _bind)
        except RuntimeError:  # no loop yet: found at each call
            pass
        return self.now

    def _arm(self) -> None:
        # armed for the start of the earliest live slot: its timers all run in that pass
        # (at most ``coalesce`` early, the rule), so no scan of the slot for its earliest
        keys = self._keys
        if not keys:
            return
        k = keys[0]
        if self._slots[k][0].cancelled:  # (else live: next_slot's answer, without its call)
            k = self.next_slot()  # type: ignore[assignment]
            if k is None:
                return
        when = k * self.coalesce if -_FAR < k < _FAR else self.next_deadline()
        assert when is not None
        handle = self._handle
        if handle is not None:
            if when >= self._armed_at:
                return
            handle.cancel()
        self._armed_at = when
        loop = self._loop
        if loop is None:
            loop = self.loop
        at = when / self.scale  # (the loop's time at which this clock reads ``when``)
        now = loop.time()
        # Already due (the pass fell behind): run after the loop's next I/O poll, not as a
        # timer. uvloop (libuv) runs a timer re-armed for "now" again in the same timer
        # phase, so a clock that stays behind would never let the loop read a socket: new
        # requests waited seconds for their first token while tokens kept flowing.
        if at <= now:
            self._handle = loop.call_soon(self._fire)
            return
        coarse = self._coarse
        if coarse is None:
            coarse = self._coarse = type(loop).__module__.partition(".")[0] == "uvloop"
        if coarse:
            # uvloop's time is whole milliseconds and it rounds a timer's delay to the
            # nearest one: a slot starting within 0.5 ms would fire at once, find the loop's
            # time unchanged and nothing due, and re-arm, spinning the loop until its next
            # millisecond. Armed for the first tick at which the pass sees the slot begun.
            ms = _ceil((at - now) * 1000.0 - 1e-6)
            if ms < 1:  # within a nanosecond: begun, by the pass's own rule?
                if self._slot(self.now() + 1e-9) >= k:
                    self._handle = loop.call_soon(self._fire)
                    return
                ms = 1
            at = now + ms / 1000.0
        self._handle = loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._handle = None
        self._armed_at = _INF
        self._run_due(self.now(), _monotonic() + self.pass_budget)
        self._arm()


class FakeClock(Clock):
    """Virtual time for tests: jumps to the next deadline once the loop has gone quiet."""

    settle_passes = 8

    def __init__(self, start: float = 1000.0, wall: float = 1_700_000_000.0) -> None:
        super().__init__()
        self._now = start
        self._wall0 = wall - start
        self._scheduled = False
        self._quiet = 0

    def now(self) -> float:
        return self._now

    def time(self) -> float:
        return self._wall0 + self._now

    def advance(self, seconds: float) -> None:
        """Move time forward by hand (runs what falls due)."""
        self._now += seconds
        self._run_due(self._now)
        if self._keys:
            self._arm()

    def _arm(self) -> None:
        self._quiet = 0
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        self._scheduled = False
        earliest = self.next_deadline()
        if earliest is None:
            return
        if earliest <= self._now:
            self._run_due(self._now)
            self._quiet = 0
        elif self._quiet < self.settle_passes:
            self._quiet += 1
        else:
            self._quiet = 0
            self._now = earliest
            self._run_due(self._now)
        if self._keys:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)
