"""The clock's slotted timers (llmsim.streaming.clock.Clock): every timer fires at most ``coalesce``
early and never late, in deadline order across slots, armed-order within one; timers armed
during a pass for a slot already due run in that pass; odd deadlines do not break it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import Any

import pytest

from llmsim.streaming.clock import FakeClock, RealClock


async def test_every_timer_fires_within_its_slot_never_late() -> None:
    clock = FakeClock(start=0.0)
    rng = random.Random(5)
    fired: list[tuple[float, float]] = []
    for _ in range(2000):
        d = rng.uniform(0.0, 0.5)
        clock.call_at(d, lambda d=d: fired.append((d, clock.now())))
    while clock.next_deadline() is not None:
        await asyncio.sleep(0)
    assert len(fired) == 2000
    for d, at in fired:
        assert d - clock.coalesce <= at <= d + 1e-12
    # slots run in order: a timer never fires before one of an earlier slot
    slots = [int(d / clock.coalesce) for d, _ in fired]
    assert slots == sorted(slots)
    assert clock.entries == 0 and clock.pending == 0


async def test_a_timer_armed_for_a_due_slot_runs_in_the_same_pass() -> None:
    clock = FakeClock(start=10.0)
    ran: list[str] = []

    def first() -> None:
        ran.append("first")
        clock.call_at(9.0, lambda: ran.append("past"))  # an earlier, already-due slot
        clock.call_at(10.0, lambda: ran.append("same"))  # this very slot

    clock.call_at(10.0, first)
    clock.call_at(10.5, lambda: ran.append("later"))
    clock._run_due(10.0)
    assert ran == ["first", "past", "same"]
    assert clock.next_deadline() == 10.5


async def test_infinite_and_cancelled_deadlines() -> None:
    clock = FakeClock(start=0.0)
    ran: list[str] = []
    never = clock.call_at(float("inf"), lambda: ran.append("inf"))
    clock.call_at(float("-inf"), lambda: ran.append("-inf"))
    gone = clock.call_at(0.1, lambda: ran.append("cancelled"))
    clock.cancel(gone)
    clock._run_due(0.0)
    assert ran == ["-inf"]
    assert clock.next_deadline() == float("inf") and clock.pending == 1
    clock.advance(1e9)
    assert ran == ["-inf"] and not never.cancelled


async def test_real_clock_arms_the_start_of_the_earliest_live_slot() -> None:
    """One loop timer, armed for the start of the earliest slot holding a live timer (its
    timers run together in that pass, at most ``coalesce`` early): a timer joining an armed
    slot changes nothing, an earlier slot re-arms, a slot whose timers were all cancelled
    is skipped."""
    loop = asyncio.get_running_loop()
    clock = RealClock(loop)
    k = int(loop.time() / clock.coalesce) + 50
    base = k * clock.coalesce  # a slot's start
    handles: list[object] = []
    a = clock.call_at(base + 0.00015, lambda: None)
    assert clock._armed_at == base
    handles.append(clock._handle)
    b = clock.call_at(base + 0.00005, lambda: None)  # same slot, earlier: no change
    assert clock._armed_at == base and clock._handle is handles[0]
    c = clock.call_at(base - 0.0001, lambda: None)  # the slot before: armed again
    assert clock._armed_at == (k - 1) * clock.coalesce
    clock.call_at(base + 0.00019, lambda: None)
    for t in (a, b, c):
        clock.cancel(t)
    assert clock.next_slot() == k  # the emptied slot k - 1 is dropped
    assert clock.next_deadline() == base + 0.00019
    clock._arm()
    assert clock._armed_at <= base  # (cancelled timers leave the armed time)


async def test_real_clock_runs_a_slot_armed_at_its_start() -> None:
    """Armed at a slot's start, every timer of the slot fires in that one pass, none more
    than ``coalesce`` early and none late."""
    loop = asyncio.get_running_loop()
    fired: list[tuple[float, float]] = []
    passes: list[int] = []

    class CountingLoop:  # the loop as the clock sees it: each pass it arms is counted
        def __getattr__(self, name: str) -> Any:
            return getattr(loop, name)

        def _counted(self, fire: Callable[[], None]) -> Callable[[], None]:
            def counted() -> None:
                passes.append(len(fired))
                fire()
            return counted

        def call_at(self, when: float, fire: Callable[[], None]) -> asyncio.TimerHandle:
            return loop.call_at(when, self._counted(fire))

        def call_soon(self, fire: Callable[[], None]) -> asyncio.Handle:
            return loop.call_soon(self._counted(fire))

    clock = RealClock(CountingLoop())  # type: ignore[arg-type]
    k = int(loop.time() / clock.coalesce) + 25  # ~5 ms ahead
    for d in (0.00001, 0.0001, 0.00019):
        when = k * clock.coalesce + d
        clock.call_at(when, lambda when=when: fired.append((when, loop.time())))  # type: ignore[misc]
    await asyncio.sleep(0.05)
    assert len(fired) == 3
    assert passes == [0]  # one pass ran them all
    assert all(at >= when - clock.coalesce for when, at in fired)


def test_real_clock_on_uvloop_waits_for_the_millisecond_tick() -> None:
    """uvloop's time is whole milliseconds and a timer's delay is rounded to the nearest one:
    a slot starting under 0.5 ms ahead must not be armed as "at once" (each pass would find
    the loop's time unchanged and nothing due, and the loop would spin until the next tick).
    Timers at sub-millisecond offsets fire with about one pass per millisecond tick."""
    uvloop = pytest.importorskip("uvloop")

    async def main() -> tuple[int, int, list[tuple[float, float]]]:
        loop = asyncio.get_running_loop()
        clock = RealClock(loop)
        fires = 0
        fire = clock._fire

        def counted() -> None:
            nonlocal fires
            fires += 1
            fire()

        clock._fire = counted  # type: ignore[method-assign]
        base = loop.time() + 0.003
        late: list[tuple[float, float]] = []
        n = 40
        for i in range(n):  # one every 0.25 ms, for 10 ms
            when = base + i * 0.00025
            clock.call_at(when, lambda when=when: late.append((when, clock.now())))  # type: ignore[misc]
        while len(late) < n:
            await asyncio.sleep(0.005)
        return fires, n, late

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        fires, n, late = runner.run(main())
    assert len(late) == n
    assert all(at >= when - RealClock.coalesce - 1e-9 for when, at in late)  # never early
    # about one pass per tick of the 10 ms span; spinning made it hundreds
    assert fires <= 2 * 12, fires


async def test_the_entry_count_holds_through_every_path_of_a_pass() -> None:
    # a pass counts only the timers it takes out for good: re-armed ones (returned a
    # deadline, or recalled inside fire), cancelled, ended, failing, and those a pass left
    # for the next (its time budget) must leave entries equal to what the slots hold
    from llmsim.streaming.clock import Timer

    clock = FakeClock(start=0.0)

    def held() -> int:
        return sum(len(ts) for ts in clock._slots.values())

    class Rearm(Timer):
        def __init__(self, d: float, times: int, via_recall: bool = False) -> None:
            super().__init__(d, lambda: None)
            self.left, self.via_recall = times, via_recall

        def fire(self) -> float | None:
            self.left -= 1
            if self.left <= 0:
                return None
            if self.via_recall:  # (as a pump's general tick re-arms itself)
                clock.recall(self, self.deadline + 0.01)
                return None
            return self.deadline + 0.01

    class Broken(Timer):
        def fire(self) -> float | None:
            raise RuntimeError("broken timer")

    rng = random.Random(3)
    for i in range(300):
        d = rng.uniform(0.0, 0.05)
        kind = i % 5
        if kind == 0:
            clock.recall(Rearm(d, 4), d)
        elif kind == 1:
            clock.recall(Rearm(d, 3, via_recall=True), d)
        elif kind == 2:
            clock.cancel(clock.call_at(d, lambda: None))
        elif kind == 3:
            clock.recall(Broken(d, lambda: None), d)
        else:
            clock.call_at(d, lambda: None)
    assert clock.entries == held()
    # a pass that stops at once (its time budget spent) leaves the rest for the next
    clock._run_due(0.02, stop_at=0.0)
    assert clock.entries == held()
    for t in (0.02, 0.04, 0.06, 0.08, 0.1):
        clock._run_due(t)
        assert clock.entries == held()
    clock._run_due(1.0)
    assert clock.entries == held() == 0


async def test_a_pass_that_raises_counts_its_entries_again() -> None:
    # a timer that returns what is not a deadline stops the pass (a bug): what the slots
    # still hold is what the clock counts, not what the pass had taken out
    from llmsim.streaming.clock import Timer

    clock = FakeClock(start=0.0)

    class Bad(Timer):
        def fire(self) -> Any:
            return "not a deadline"

    for i in range(10):
        clock.call_at(0.001 * i, lambda: None)
    clock.recall(Bad(0.0045, lambda: None), 0.0045)
    for i in range(10):
        clock.call_at(0.02 + 0.001 * i, lambda: None)
    with pytest.raises(TypeError):
        clock._run_due(0.01)
    assert clock.entries == sum(len(ts) for ts in clock._slots.values())
