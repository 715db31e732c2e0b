"""The event loop's stalls, measured by the server itself (``--loop-watch-ms``).

A tick every ``interval`` seconds on the asyncio loop reads the loop thread's CPU time
(:func:`time.thread_time`) and the loop's clock. Between two ticks the loop ran callbacks for
``cpu`` seconds and the tick came ``lag`` seconds after it was due. A callback that blocks the
loop shows as a large ``cpu``; other processes taking the machine's cores away show as
``lag`` but not as ``cpu`` (the thread was not running), so ``cpu`` judges the server's own
blocking on a busy machine. ``GET /llmsim/loop`` reports the loop's clock (``now``), the
longest of each since start, and the last :data:`KEEP` ticks whose ``cpu`` passed twice the
interval, each as ``[at, cpu_s, lag_s]``: a test reads ``now``, does its work, and reads the
stalls after that moment.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from typing import TYPE_CHECKING, Any

from ..messages import JSONResponse, Request

if TYPE_CHECKING:
    from .services import Host

__all__ = ["LoopWatch", "register", "KEEP"]

KEEP = 256


class LoopWatch:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.ticks = 0
        self.longest_cpu = 0.0
        self.longest_lag = 0.0
        self.stalls: deque[tuple[float, float, float]] = deque(maxlen=KEEP)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._cpu = 0.0

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._cpu = time.thread_time()
        self._arm(self._loop.time())

    def _arm(self, now: float) -> None:
        assert self._loop is not None
        self._due = now + self.interval
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        assert self._loop is not None
        now = self._loop.time()
        cpu = time.thread_time()
        used, lag = cpu - self._cpu, max(0.0, now - self._due)
        self._cpu = cpu
        self.ticks += 1
        self.longest_cpu = max(self.longest_cpu, used)
        self.longest_lag = max(self.longest_lag, lag)
        if used > 2 * self.interval:
            self.stalls.append((round(now, 6), round(used, 6), round(lag, 6)))
        self._arm(now)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def view(self) -> dict[str, Any]:
        now = self._loop.time() if self._loop is not None else 0.0
        return {"object": "llmsim.loop", "enabled": True, "interval_s": self.interval,
                "now": now, "ticks": self.ticks, "longest_cpu_s": self.longest_cpu,
                "longest_lag_s": self.longest_lag, "stalls": [list(s) for s in self.stalls]}


def register(app: Host) -> None:
    ms = app.config.loop_watch_ms
    watch = LoopWatch(ms / 1000.0) if ms > 0 else None

    async def view(req: Request, app_: Host) -> JSONResponse:
        if watch is None:
            return JSONResponse({"object": "llmsim.loop", "enabled": False})
        return JSONResponse(watch.view())

    app.router.add("GET", "/llmsim/loop", view, "llmsim.loop")
    if watch is not None:
        async def start(app_: Host) -> None:
            watch.start()

        async def stop(app_: Host) -> None:
            watch.stop()

        app.on_start.append(start)
        app.on_stop.append(stop)
