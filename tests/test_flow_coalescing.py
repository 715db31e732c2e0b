"""The pump's one coalescing rule (``clock.CATCH_UP``, issue 15) on the FakeClock: on time,
every event is its own write at its own deadline; events share a write only when due at the
same instant or when the pump is behind by more than ``catch_up``. No timing assertions:
virtual time only."""

from __future__ import annotations

import asyncio

import pytest

from llmsim.api.chat import CHAT
from llmsim.streaming import encode
from llmsim.streaming.clock import CATCH_UP, FakeClock
from llmsim.streaming.flow import Pump
from llmsim.streaming.stream import EventStream, TokenRun

GAP = 0.01  # 10 ms between tokens, as the bench streams
KEY = ({"id": "chatcmpl-1"}, 0)  # chat's token template key: the chunk head, the choice


class WriteLog:
    """A sink that records each write (one list of frames per call) with its virtual time."""

    paused = False

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.writes: list[tuple[float, int]] = []

    def write_events(self, frames: list[bytes]) -> None:
        self.writes.append((self.clock.now(), len(frames)))

    def abort(self) -> None:
        pass


def plan(tokens: int, runs: bool = False) -> list[tuple[float, str, object]]:
    # role chunk and first token due together, then one token per GAP, then the finish
    # chunk and [DONE] at the same instant as the last token; ``runs``: the tokens as one
    # TokenRun, which the pump renders itself under the same rule
    # (else each token its own item: a run of one, as a multi-choice plan yields them)
    out: list[tuple[float, str, object]] = [(0.1, "chunk", {"role": "assistant"})]
    if runs:
        out.append((0.0, "chunk", TokenRun([str(i) for i in range(tokens)],
                                           iter([GAP] * (tokens - 1)), KEY)))
    else:
        out.append((0.0, "chunk", TokenRun(["0"], key=KEY)))
        out += [(GAP, "chunk", TokenRun([str(i)], key=KEY)) for i in range(1, tokens)]
    out += [(0.0, "chunk", {"finish": 1}), (0.0, "done", None)]
    return out


@pytest.fixture(params=[False, True], ids=["events", "run"])
def runs(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


async def pump(tokens: int, late_by: float, runs: bool = False) -> list[tuple[float, int]]:
    """Run one stream; ``late_by``: the pump starts that long after the stream's start (a
    server that fell behind), so everything due by then is late."""
    clock = FakeClock(start=0.0)
    sink = WriteLog(clock)
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    stream = EventStream(iter(plan(tokens, runs)), CHAT)
    stream.begin(clock.now())
    clock.advance(late_by)
    p = Pump(stream, clock, encode.sse_chat, sink, on_done=done.set_result)
    p.start()
    assert await asyncio.wait_for(done, 5) == "completed"
    return sink.writes


@pytest.mark.asyncio
async def test_on_time_every_event_is_its_own_write(runs: bool) -> None:
    writes = await pump(5, 0.0, runs)
    # role+token 0 together (same instant), tokens 1..3 alone, token 4 + finish + [DONE]
    assert [n for _, n in writes] == [2, 1, 1, 1, 3]
    assert [round(t, 6) for t, _ in writes] == [0.1, 0.11, 0.12, 0.13, 0.14]


@pytest.mark.asyncio
async def test_slightly_late_events_are_still_written_one_by_one(runs: bool) -> None:
    # token 1 is due 0.11: starting at 0.11 + catch_up/2, tokens 0 and 1 are both due but
    # the later one is not late by more than the threshold: two writes, not a pair
    writes = await pump(5, 0.11 + CATCH_UP / 2, runs)
    assert [n for _, n in writes] == [2, 1, 1, 1, 3]


@pytest.mark.asyncio
async def test_behind_by_more_than_catch_up_writes_the_due_batch_once(runs: bool) -> None:
    # at 0.125 tokens 0, 1, 2 are due and token 2 (0.12) is 5 ms late: one write for the
    # role chunk and tokens 0..2, then on time again
    writes = await pump(5, 0.12 + 2 * CATCH_UP + 0.001, runs)
    assert [n for _, n in writes] == [4, 1, 3]
    assert [round(t, 6) for t, _ in writes][1:] == [0.13, 0.14]


def test_per_write_observation_equals_per_event_observation() -> None:
    """The pump observes tokens once per write (``observe.per_write``): the histograms and
    counters are those of one ``observe`` call per token event."""
    from llmsim.state.stats import Stats

    def run(batched: bool) -> tuple[object, ...]:
        st = Stats()
        t = st.track("m", 0.0, "sse", lambda e, d: e == "tok", 3)
        assert t.observe is not None
        for now, n in [(0.1, 2), (0.11, 1), (0.125, 3), (0.3, 1)]:
            if batched:
                t.observe.per_write(n, now)  # type: ignore[attr-defined]
            else:
                for _ in range(n):
                    t.observe("tok", None, now)
                t.observe("other", None, now)  # not a token: not counted
        t.finish("completed", 0.4)
        raw = st.raw()
        return t.tokens, t.ttft, raw["counters"]["tokens_delivered"], repr(st._hist("m"))

    assert run(True) == run(False)
    assert run(True)[0] == 7


@pytest.mark.asyncio
async def test_pump_counts_tokens_per_write() -> None:
    """A StreamTrack observer gets one per_write call per write, with its token count."""
    clock = FakeClock(start=0.0)
    sink = WriteLog(clock)
    calls: list[tuple[int, float]] = []

    def observe(etype: str, data: object, now: float) -> None:
        raise AssertionError("per-event observation used")

    observe.per_write = lambda n, now: calls.append((n, now))  # type: ignore[attr-defined]
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    Pump(EventStream(iter(plan(3)), CHAT), clock, encode.sse_chat, sink,
         on_done=done.set_result, observer=observe).start()
    assert await asyncio.wait_for(done, 5) == "completed"
    # role+token 0 (one token), token 1, token 2 + finish + [DONE] (one token)
    assert [n for n, _ in calls] == [1, 1, 1]


async def test_real_clock_runs_an_overdue_deadline_after_the_io_poll() -> None:
    """A deadline already due when the clock arms goes through ``call_soon`` (the loop polls
    its sockets first), not a timer: uvloop re-runs timers armed for "now" without reading a
    socket, so a server behind schedule left new requests unread for seconds."""
    from llmsim.streaming.clock import RealClock

    loop = asyncio.get_running_loop()
    clock = RealClock(loop)
    ran: list[int] = []
    clock.call_at(loop.time() - 1.0, lambda: ran.append(1))
    assert clock._handle is not None and not isinstance(clock._handle, asyncio.TimerHandle)
    later = clock.call_at(loop.time() + 60.0, lambda: ran.append(2))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert ran == [1]
    assert isinstance(clock._handle, asyncio.TimerHandle)  # the next one is in the future
    later.cancel()


async def test_a_clock_pass_stops_at_its_budget() -> None:
    """A pass of due timers ends once ``stop_at`` has passed (checked after every 32 timers,
    within a slot or across small ones); the rest run in the next pass, in order, so a
    saturated loop still polls its sockets in between."""
    clock = FakeClock(start=0.0)
    ran: list[int] = []
    for i in range(100):  # one slot
        clock.call_at(0.0, lambda i=i: ran.append(i))
    clock._run_due(0.0, stop_at=0.0)  # (time.monotonic() is far past 0.0: the budget is spent)
    assert ran == list(range(32))
    clock._run_due(0.0, stop_at=0.0)
    assert ran == list(range(64))
    clock._run_due(0.0)  # no budget: everything due runs
    assert ran == list(range(100))

    ran.clear()  # 100 slots of 3 timers: the check comes at the first slot boundary past 32
    for i in range(300):
        clock.call_at(1.0 + (i // 3) * clock.coalesce, lambda i=i: ran.append(i))
    clock._run_due(2.0, stop_at=0.0)
    assert ran == list(range(33))
    clock._run_due(2.0)
    assert ran == list(range(300))


def _reference_hists(t0: float, writes: list[tuple[float, int]]) -> tuple[list, list, int]:
    """The TTFT and gap histograms as one bucket search per token write made them."""
    from bisect import bisect_left

    from llmsim.state.stats import BOUNDS, _new_hist

    ttft, itl = _new_hist(), _new_hist()
    last = -1.0
    for now, n in writes:
        for _ in range(n):
            if last < 0.0:
                ttft[bisect_left(BOUNDS, now - t0)] += 1
                ttft[-1] += now - t0
            else:
                v = now - last
                itl[bisect_left(BOUNDS, v)] += 1
                itl[-1] += v
            last = now
    return ttft, itl, sum(n for _, n in writes)


def test_folded_token_times_give_the_per_write_histograms() -> None:
    """The track folds token-write times in batches (``observe.times``, ``fold``): the same
    buckets and counts as a search per write, read mid-stream (every read folds first) or at
    the end, with jittered, equal (one write) and far-apart gaps."""
    import random

    from llmsim.state.stats import FOLD_EVERY, Stats

    rng = random.Random(3)
    now, writes = 1.0, []
    for _ in range(1000):
        now += rng.choice([0.0, 0.01 * rng.lognormvariate(0, 0.3), rng.uniform(0, 2.0)])
        writes.append((now, rng.choice([1, 1, 1, 2, 5])))
    st = Stats()
    t = st.track("m", 0.5, "sse", lambda e, d: True)
    assert t.observe is not None
    times = t.observe.times  # type: ignore[attr-defined]
    for i, (w, n) in enumerate(writes):
        t.observe.per_write(n, w)  # type: ignore[attr-defined]
        assert len(times) < FOLD_EVERY  # bounded: folded when full
        if i == 500:  # a read mid-stream sees every token written so far
            assert st.delivered_total() == sum(n for _, n in writes[:501])
            assert not times
    ttft, itl, count = _reference_hists(0.5, writes)
    h = st._hist("m")
    st.raw()
    assert h[0][:-1] == ttft[:-1] and h[1][:-1] == itl[:-1]
    assert abs(h[1][-1] - itl[-1]) < 1e-6 and t.tokens == count
    t.finish("completed", now + 1)
    assert st.raw()["counters"]["tokens_delivered"] == count


def test_the_bucket_of_a_value_is_the_binary_search_one() -> None:
    """``stats.bucket`` (a cell of the value's log, then a step or two) is
    ``bisect_left(BOUNDS, v)`` for every value: each bound, a float either side of it, the
    ends, zero, negatives, infinities, NaN and random values over twelve decades."""
    import math
    import random
    from bisect import bisect_left

    from llmsim.state.stats import BOUNDS, bucket

    values = [*BOUNDS, 0.0, -0.0, -1.0, 5e-324, 1e-300, 1e300, math.inf, -math.inf, math.nan]
    for b in BOUNDS:
        values += [math.nextafter(b, 0.0), math.nextafter(b, math.inf)]
    rng = random.Random(11)
    values += [10 ** rng.uniform(-6, 6) for _ in range(20000)]
    assert [bucket(v) for v in values] == [bisect_left(BOUNDS, v) for v in values]


def test_fold_on_a_millisecond_clock_and_on_bucket_bounds() -> None:
    """The fold counts gaps per bucket, not per gap: on uvloop's clock of whole milliseconds
    (a few distinct gaps), with gaps that are exactly a bucket's bound (the bound is in its
    bucket) and beyond the last bound, the buckets are those of a search per write."""
    import random

    from llmsim.state.stats import BOUNDS, Stats

    rng = random.Random(5)
    now, writes = 0.0, []
    for i in range(2000):
        if i % 3:
            now = round(now + rng.choice([0.009, 0.01, 0.011, 0.0, 0.05]), 3)
        else:
            now += rng.choice([BOUNDS[rng.randrange(len(BOUNDS))], 0.0, 1500.0])
        writes.append((now, rng.choice([1, 1, 3])))
    st = Stats()
    t = st.track("m", -0.25, "sse", lambda e, d: True)
    assert t.observe is not None
    for w, n in writes:
        t.observe.per_write(n, w)  # type: ignore[attr-defined]
    st.raw()
    ttft, itl, count = _reference_hists(-0.25, writes)
    h = st._hist("m")
    assert h[0][:-1] == ttft[:-1] and h[1][:-1] == itl[:-1]
    assert itl[-2] > 0 and abs(h[1][-1] - itl[-1]) < 1e-6 and t.tokens == count


@pytest.mark.asyncio
async def test_pump_appends_token_write_times_and_folds_when_full(monkeypatch) -> None:
    from llmsim.state import stats
    from llmsim.state.stats import FOLD_EVERY, Stats

    clock = FakeClock(start=0.0)
    st = Stats()
    track = st.track("m", 0.0, "sse", CHAT.is_token)
    folds = []
    inner = stats._Observer.fold

    def fold(self: stats._Observer) -> None:
        folds.append(len(self.times))
        inner(self)

    monkeypatch.setattr(stats._Observer, "fold", fold)
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    Pump(EventStream(iter(plan(2 * FOLD_EVERY + 22)), CHAT), clock, encode.sse_chat, WriteLog(clock),
         on_done=done.set_result, observer=track.observe).start()
    assert await asyncio.wait_for(done, 5) == "completed"
    assert folds == [FOLD_EVERY, FOLD_EVERY]  # the pump folded each time the list was full
    track.finish("completed", clock.now())
    assert track.tokens == st.delivered_total() == 2 * FOLD_EVERY + 22


def test_what_a_pump_reads_once_is_kept_per_family_and_bounded() -> None:
    """The facts a pump reads from its encoder, its dialect and its sink (the token frame,
    the wire frame) are those of a pump that computes them, kept once per (dialect's own
    encoder, dialect, sink type), and never more than MAX_FACTS of them."""
    from llmsim.api.responses.render import RESPONSES
    from llmsim.streaming import flow
    from llmsim.streaming.dialect import Dialect
    from llmsim.streaming.wire import HTTPWire, WSWire

    clock = FakeClock(start=0.0)

    def fields(p: Pump) -> tuple[object, ...]:
        return (p._frame, p._wired, p._nw, p._leads, p._lead, p._tail, p._nleads,
                p.stream.take_runs)

    for sink in (HTTPWire(None), WSWire(None), WriteLog(clock)):
        for dialect, enc in ((CHAT, CHAT.sse), (RESPONSES, RESPONSES.sse),
                             (RESPONSES, RESPONSES.ws)):
            assert enc is not None
            flow._FACTS.clear()
            first = Pump(EventStream(iter(()), dialect), clock, enc,
                         sink)  # type: ignore[arg-type]
            assert (enc, dialect, type(sink)) in flow._FACTS
            kept = Pump(EventStream(iter(()), dialect), clock, enc,
                        sink)  # type: ignore[arg-type]
            own = Pump(EventStream(iter(()), dialect), clock,  # a foreign encoder: computed
                       lambda t, d, enc=enc: enc(t, d), sink)  # type: ignore[arg-type, misc]
            assert fields(first) == fields(kept)
            assert flow._FACTS[(enc, dialect, type(sink))] == flow._facts(enc, dialect, sink,
                                                                          False)
            assert fields(own)[1:-1] == fields(kept)[1:-1] and own._frame is None
    for i in range(3 * flow.MAX_FACTS):
        d = Dialect(f"x{i}", numbered=False, sse=encode.sse_chat, sse_error=CHAT.sse_error,
                    error_events=CHAT.error_events)
        Pump(EventStream(iter(()), d), clock, d.sse, HTTPWire(None))
        assert len(flow._FACTS) <= flow.MAX_FACTS
