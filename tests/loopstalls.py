"""What a server measures of its own event loop (``--loop-watch-ms``, ``GET /llmsim/loop``):
the tests judge "the loop stayed free" by it instead of by wall-clock latencies, which other
processes on a busy machine inflate."""

from __future__ import annotations

import time
from typing import Any

from . import rawhttp

STALL_BUDGET_CPU_S = 0.100  # the most CPU one loop pass may take while hostile work runs
WATCH_MS = 10


def loop_report(url: str) -> dict[str, Any]:
    r: dict[str, Any] = rawhttp.request(url, "GET", "/llmsim/loop").json()
    assert r["enabled"], "start the server with --loop-watch-ms"
    return r


def stalls_since(url: str, since: float) -> list[float]:
    """CPU seconds of each loop stall the server measured after its clock read ``since``,
    once two more ticks have passed (a stall still running is then counted)."""
    ticks = loop_report(url)["ticks"]
    while (rep := loop_report(url))["ticks"] < ticks + 2:
        time.sleep(0.002)
    return [cpu for at, cpu, _lag in rep["stalls"] if at > since]
