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

from .clock import RealClock

__all__ = ["ScaledClock", "MAX_TIME_SCALE"]

MAX_TIME_SCALE = 1000.0


class ScaledClock(RealClock):
    """The loop's monotonic time times ``scale``: the real clock's one armed ``call_at`` for
    the heap, in scaled time."""

    def __init__(self, scale: float, loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(loop)
        self.scale = scale

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        pass  # (now multiplies the loop's time: its own)

    def now(self) -> float:
        return self.loop.time() * self.scale

