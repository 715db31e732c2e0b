"""Per-token CPU of the shared clock and of the stats fold: ``python bench/clock_micro.py``.

Three measurements, each the median of ``--repeat`` runs:

- ``fold``: :class:`~llmsim.state.stats.StreamTrack`'s per-write protocol alone (the pump's
  ``times.append`` plus a ``fold()`` per ``fold_every``), for token-write times paced at
  ``--gap`` seconds on a loop clock of whole milliseconds (uvloop's; ``--exact``: a clock
  of nanoseconds, every gap its own value), in µs per token.
- ``pass``: the clock's passes without an event loop: ``--timers`` timers that re-arm
  themselves (as a pump does, through ``recall``) at ``--gap`` seconds with a per-timer
  phase, run slot by slot; µs per firing (the pass, the pop, the re-arm).
- ``wake``: one wake-up of a :class:`RealClock` (its ``_fire``: the pass and the re-arm) with
  one timer due, on a stand-in loop of whole milliseconds whose ``call_at`` costs nothing:
  the clock's own µs per wake-up.
- ``loop``: the same timers on a :class:`RealClock` in a real event loop (``--loop uvloop``
  or ``asyncio``) for ``--seconds``; process CPU per firing and firings per second (the
  loop's own polling included).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmsim.state.stats import Stats  # noqa: E402
from llmsim.streaming.clock import Clock, RealClock, Timer  # noqa: E402


def bench_fold(tokens: int, gap: float, exact: bool = False) -> float:
    """µs per token of appending write times and folding them."""
    stats = Stats()
    n_streams = 100
    per = tokens // n_streams
    tracks = [stats.track("m", 1000.0, "http", lambda e, d: True) for _ in range(n_streams)]
    # uvloop's clock: whole milliseconds; a gap of ``gap`` with ±1 ms of jitter
    series = []
    for s in range(n_streams):
        t = 1000.0 + 0.05 + s * 0.0003
        ts = []
        for i in range(per):
            if exact:  # asyncio's clock: a few µs of jitter, every gap its own value
                t += gap + ((i * 7919 + s) % 97) * 1e-7
                ts.append(t)
            else:
                t += gap + ((i * 7 + s) % 3 - 1) * 0.001
                ts.append(round(t, 3))
        series.append(ts)
    t0 = time.process_time()
    for tr, ts in zip(tracks, series, strict=True):
        ob = tr.observe
        assert ob is not None
        times = ob.times
        every = ob.fold_every
        fold = ob.fold
        for now in ts:  # (what the pump's one-token path does per token)
            times.append(now)
            if len(times) >= every:
                fold()
        tr.finish("completed", ts[-1])
    return (time.process_time() - t0) / (per * n_streams) * 1e6


class _Manual(Clock):
    def __init__(self) -> None:
        super().__init__()
        self.t = 1000.0

    def now(self) -> float:
        return self.t

    def _arm(self) -> None:
        pass


class _Ticker(Timer):
    __slots__ = ("clock", "gap", "count")

    def __init__(self, clock: Clock, gap: float) -> None:
        super().__init__(0.0, _noop)
        self.clock = clock
        self.gap = gap
        self.count = 0

    def fire(self) -> None:
        self.count += 1
        self.clock.recall(self, self.deadline + self.gap)


def _noop() -> None:
    pass


def bench_pass(timers: int, gap: float, firings: int) -> float:
    """µs per firing of the clock's passes (no event loop)."""
    clock = _Manual()
    ts = [_Ticker(clock, gap) for _ in range(timers)]
    for i, t in enumerate(ts):
        clock.recall(t, 1000.0 + gap * i / timers)
    t0 = time.process_time()
    end = 1000.0 + gap * (firings / timers)
    while clock.t < end:  # as RealClock fires: at the start of the earliest live slot
        k = clock.next_slot()
        assert k is not None
        clock.t = max(clock.t, k * clock.coalesce)
        clock._run_due(clock.t)
    n = sum(t.count for t in ts)
    return (time.process_time() - t0) / n * 1e6


class _StubLoop:
    """A loop of whole milliseconds (uvloop's) as the clock sees it; arming costs nothing."""

    __module__ = "uvloop.stub"  # (the clock arms ticks on a loop of whole milliseconds)

    def __init__(self) -> None:
        self.t = 1000.0

    def time(self) -> float:
        return self.t

    def call_at(self, when: float, cb: object) -> _StubLoop:
        return self

    def call_soon(self, cb: object) -> _StubLoop:
        return self

    def cancel(self) -> None:
        pass


def bench_wake(n: int) -> float:
    """µs per wake-up of the real clock with one timer due (the loop's own cost excluded)."""
    loop = _StubLoop()
    clock = RealClock(loop)  # type: ignore[arg-type]
    t = _Ticker(clock, 0.001)
    clock.recall(t, 1000.001)
    fire = clock._fire
    t0 = time.perf_counter()
    for _ in range(n):
        loop.t = t.deadline
        fire()
    return (time.perf_counter() - t0) / n * 1e6


def bench_loop(timers: int, gap: float, seconds: float, loop_name: str) -> tuple[float, float]:
    """(µs of process CPU per firing, firings per second) on a real loop."""
    async def main() -> tuple[float, int]:
        clock = RealClock()
        now = clock.now()
        ts = [_Ticker(clock, gap) for _ in range(timers)]
        for i, t in enumerate(ts):
            clock.recall(t, now + 0.01 + gap * i / timers)
        await asyncio.sleep(0.05)
        c0 = sum(t.count for t in ts)
        p0 = time.process_time()
        await asyncio.sleep(seconds)
        p1 = time.process_time()
        c1 = sum(t.count for t in ts)
        for t in ts:
            clock.cancel(t)
        return p1 - p0, c1 - c0

    if loop_name == "uvloop":
        import uvloop

        cpu, n = uvloop.run(main())
    else:
        cpu, n = asyncio.run(main())
    return cpu / max(n, 1) * 1e6, n / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--gap", type=float, default=0.02)
    ap.add_argument("--timers", type=int, default=500)
    ap.add_argument("--tokens", type=int, default=200_000)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--loop", default="uvloop", choices=("uvloop", "asyncio"))
    ap.add_argument("--only", default="fold,pass,wake,loop")
    ap.add_argument("--exact", action="store_true",
                    help="fold: write times on a nanosecond clock (asyncio's), not whole ms")
    a = ap.parse_args()
    only = set(a.only.split(","))
    if "fold" in only:
        r = [bench_fold(a.tokens, a.gap, a.exact) for _ in range(a.repeat)]
        print(f"fold  µs/token        median {statistics.median(r):.3f}  "
              f"({' '.join(f'{x:.3f}' for x in r)})")
    if "pass" in only:
        r = [bench_pass(a.timers, a.gap, a.tokens) for _ in range(a.repeat)]
        print(f"pass  µs/firing       median {statistics.median(r):.3f}  "
              f"({' '.join(f'{x:.3f}' for x in r)})")
    if "wake" in only:
        r = [bench_wake(a.tokens) for _ in range(a.repeat)]
        print(f"wake  µs/wake-up      median {statistics.median(r):.3f}  "
              f"({' '.join(f'{x:.3f}' for x in r)})")
    if "loop" in only:
        rs = [bench_loop(a.timers, a.gap, a.seconds, a.loop) for _ in range(a.repeat)]
        cpu = [x[0] for x in rs]
        rate = [x[1] for x in rs]
        print(f"loop  µs/firing       median {statistics.median(cpu):.3f}  "
              f"({' '.join(f'{x:.3f}' for x in cpu)}); firings/s "
              f"{statistics.median(rate):.0f}  [{a.loop}, {a.timers} timers]")


if __name__ == "__main__":
    main()
