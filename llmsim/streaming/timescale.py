"""``--time-scale X``: the simulation's clock running X times faster than the loop's.

Everything the simulation times runs on ``App.clock`` (token schedules, the serving engine's
steps, delays and faults, prompt-cache and store TTLs, rate-limit windows, the latency it
measures): with this clock an hour of simulated load passes in ``3600 / X`` seconds, and every
duration the server reports (metrics, stats, logs) is in simulated seconds, so the numbers
read as they would at X = 1. What protects the server from real clients stays on the loop's
real time: header, idle and write-stall timeouts, the shutdown grace; and the stores shared
between processes (``--workers``, ``--state``) keep their real-time TTLs and windows.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from .clock import Clock

__all__ = ["ScaledClock", "MAX_TIME_SCALE"]

MAX_TIME_SCALE = 1000.0


class ScaledClock(Clock):
    """The loop's monotonic time times ``scale``, with one armed ``call_at`` for the heap
    (the real clock's pattern, in scaled time)."""

    pass_budget = 0.0005  # (as RealClock: a pass of due timers yields to the loop's I/O)

    def __init__(self, scale: float, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__()
        self.scale = scale
        self._loop = loop
        self._handle: asyncio.Handle | None = None
        self._armed_at = float("inf")

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def now(self) -> float:
        return self.loop.time() * self.scale

    def now_fn(self) -> Callable[[], float]:
        return self.now

    def _arm(self) -> None:
        k = self.next_slot()
        if k is None:
            return
        when = k * self.coalesce if abs(k) < 1 << 62 else self.next_deadline()
        assert when is not None
        if when >= self._armed_at and self._handle is not None:
            return
        if self._handle is not None:
            self._handle.cancel()
        self._armed_at = when
        loop = self.loop
        real = when / self.scale
        self._handle = (loop.call_soon(self._fire) if real <= loop.time()
                        else loop.call_at(real, self._fire))

    def _fire(self) -> None:
        self._handle = None
        self._armed_at = float("inf")
        self._run_due(self.now(), time.monotonic() + self.pass_budget)
        self._arm()
