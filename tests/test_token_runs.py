"""Token runs (``stream.TokenRun``, issue 15's per-token hot path): a plan hands a run of
token events over as one item and the pump renders the tokens itself. These tests pin that
the wire is byte for byte, and write for write on the FakeClock, what the same events
yielded one by one give, in every dialect that uses runs and on both kinds of sink, across
the end of the pre-rendered stamp table; that numbers stay in order around an out-of-band
claim; that a pause shifts the rest of a run; and that whoever needs the events one by one
(a wrapper, an observer of that type, a reader of the plan) gets them."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest

from llmsim.api.anthropic import ANTHROPIC
from llmsim.api.chat import CHAT
from llmsim.api.completions import COMPLETIONS
from llmsim.api.responses import RESPONSES
from llmsim.api.responses.render import _TEXT_DELTA, _TEXT_DELTA_END
from llmsim.streaming import encode
from llmsim.streaming import stream as stream_mod
from llmsim.streaming.clock import FakeClock
from llmsim.streaming.flow import Pump
from llmsim.streaming.stream import EventStream, TokenRun, expand_runs

PIECES = ["Hello", " wor%ld", ' "q"', "\\", "é", "\n", "%d", "", " end"]
GAPS = [0.01, 0.013, 0.0, 0.007, 0.01, 0.0004, 0.02, 0.01]  # one fewer than PIECES


class WireSink:
    """Like the HTTP protocol: offers the wire format (an HTTP chunk around the frame)."""

    paused = False

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.writes: list[tuple[float, bytes]] = []

    def wire_format(self, prefix: bytes, suffix: bytes) -> tuple[bytes, int]:
        return (b"%x\r\n" + prefix.replace(b"%", b"%%") + b"%b" + suffix.replace(b"%", b"%%")
                + b"\r\n", len(prefix) + len(suffix))

    def write_wire(self, frames: list[bytes]) -> None:
        self.writes.append((round(self.clock.now(), 9), b"".join(frames)))

    def write_events(self, frames: list[bytes]) -> None:  # (never called with the wire)
        raise AssertionError("write_wire is used")

    def abort(self) -> None:
        pass


class FrameLog(WireSink):
    """Like a WebSocket session: frames each event itself (no wire format)."""

    wire_format = None  # type: ignore[assignment]

    def write_events(self, frames: list[bytes]) -> None:
        self.writes.append((round(self.clock.now(), 9), b"|".join(frames)))


def chat_plan(gaps: list[float]) -> list[tuple[float, str, Any]]:
    pre = b'{"id":"c%1","choices":[{"index":0,"delta":{"content":'
    post = b'},"finish_reason":null}]}'
    return [(0.1, "chunk", {"role": "assistant"}),
            (0.0, "chunk", TokenRun(PIECES, iter(gaps), pre, post)),
            (0.0, "chunk", {"finish": "stop"}), (0.0, "done", None)]


def responses_plan(gaps: list[float]) -> list[tuple[float, str, Any]]:
    it = iter([0.0, *gaps, 0.03])  # shared with what follows the run, as render.plan does
    pre = _TEXT_DELTA % (orjson.dumps('msg_"odd%id'), 2)
    return [(0.0, "response.created", {"type": "response.created"}),
            (next(it), "response.output_text.delta",
             TokenRun(PIECES, it, pre, _TEXT_DELTA_END)),
            (next(it, 0.0), "response.output_text.done", {"type": "response.output_text.done"}),
            (0.0, "response.completed", {"type": "response.completed"})]


async def run(plan: list[tuple[float, str, Any]], dialect: Any, encoder: Any, sink_cls: Any,
              *, runs: bool, first_seq: int = 0) -> list[tuple[float, bytes]]:
    clock = FakeClock(start=0.0)
    sink = sink_cls(clock)
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    s = EventStream(iter(plan) if runs else expand_runs(plan), dialect, first_seq=first_seq)
    p = Pump(s, clock, encoder, sink, on_done=done.set_result)
    assert s.take_runs
    p.start()
    assert await asyncio.wait_for(done, 5) == "completed"
    return sink.writes  # type: ignore[no-any-return]


def anthropic_plan(gaps: list[float]) -> list[tuple[float, str, Any]]:
    it = iter([0.0, *gaps, 0.03])
    pre = b'{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'
    return [(0.2, "message_start", {"type": "message_start"}),
            (next(it), "content_block_delta", TokenRun(PIECES, it, pre, b"}}")),
            (0.0, "content_block_stop", {"type": "content_block_stop", "index": 0}),
            (next(it, 0.0), "message_stop", {"type": "message_stop"})]


def completions_plan(gaps: list[float]) -> list[tuple[float, str, Any]]:
    pre = b'{"id":"cmpl-1","object":"text_completion","choices":[{"text":'
    post = b',"index":0,"logprobs":null,"finish_reason":null}]}'
    return [(0.1, "token", TokenRun(PIECES, iter(gaps), pre, post)),
            (0.0, "chunk", {"finish": "length"}), (0.0, "done", None)]


CASES = [("chat sse", chat_plan, CHAT, encode.sse_chat),
         ("completions sse", completions_plan, COMPLETIONS, COMPLETIONS.sse),
         ("anthropic sse", anthropic_plan, ANTHROPIC, ANTHROPIC.sse),
         ("responses sse", responses_plan, RESPONSES, encode.sse_responses),
         ("responses ws", responses_plan, RESPONSES, encode.ws_text)]


@pytest.mark.asyncio
@pytest.mark.parametrize("sink_cls", [WireSink, FrameLog])
@pytest.mark.parametrize("name,make,dialect,encoder", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("first_seq", [0, stream_mod._NSTAMPS - 4])
@pytest.mark.parametrize("stamp_tables", [True, False])
async def test_a_run_writes_what_its_events_one_by_one_write(
        name: str, make: Any, dialect: Any, encoder: Any, sink_cls: Any, first_seq: int,
        stamp_tables: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not stamp_tables:  # the suffix table is full: every number rendered per event
        monkeypatch.setattr(stream_mod, "_SUFFIXES", {})
        monkeypatch.setattr(stream_mod, "_MAX_SUFFIXES", 0)
    fast = await run(make(GAPS), dialect, encoder, sink_cls, runs=True, first_seq=first_seq)
    slow = await run(make(GAPS), dialect, encoder, sink_cls, runs=False, first_seq=first_seq)
    assert fast == slow
    assert len(fast) >= len(PIECES) - 2  # (the 0-gap tokens share a write)
    if dialect is RESPONSES:  # numbered in order across the end of the stamp table
        blob = b"".join(w for _, w in fast)
        nums = [int(x) for x in re.findall(rb'"sequence_number":(\d+)', blob)]
        assert nums == list(range(first_seq, first_seq + len(PIECES) + 3))


@pytest.mark.asyncio
async def test_fewer_gaps_than_tokens_sends_the_rest_at_once() -> None:
    fast = await run(chat_plan(GAPS[:3]), CHAT, encode.sse_chat, WireSink, runs=True)
    slow = await run(chat_plan(GAPS[:3]), CHAT, encode.sse_chat, WireSink, runs=False)
    assert fast == slow
    assert fast[-1][0] == round(0.1 + sum(GAPS[:3]), 9)


def test_a_run_draws_a_gap_only_for_a_token_that_follows() -> None:
    """A plan may share its gaps with what follows the run (Responses): the run must draw
    exactly one gap per later token, in the pump as in its events."""
    gaps = iter([0.5, 0.25, 9.0])
    run_ = TokenRun(["a", "b", "c"], gaps, b"", b"")
    assert [d for d, _, _ in run_.events("t", 1.0)] == [1.0, 0.5, 0.25]
    assert next(gaps) == 9.0


def _manual(plan: list[tuple[float, str, Any]], dialect: Any = RESPONSES
            ) -> tuple[FakeClock, Any, Pump, EventStream]:
    clock = FakeClock(start=0.0)
    sink = FrameLog(clock)
    s = EventStream(iter(plan), dialect)
    p = Pump(s, clock, encode.ws_text, sink)
    return clock, sink, p, s


def _seqs(sink: Any) -> list[int]:
    out = []
    for _, w in sink.writes:
        for f in w.split(b"|"):
            out.append(orjson.loads(f)["sequence_number"])
    return out


@pytest.mark.asyncio
async def test_a_claim_in_the_middle_of_a_run_takes_the_next_number() -> None:
    """A WebSocket error or steer answer written mid-run takes the next number; the run's
    next token continues after it (the client sees 0, 1, 2, ... in order)."""
    pre = _TEXT_DELTA % (b'"msg_1"', 0)
    plan = [(0.0, "response.created", {"type": "response.created"}),
            (0.0, "response.output_text.delta",
             TokenRun(["a", "b", "c", "d"], iter([0.01] * 3), pre, _TEXT_DELTA_END)),
            (0.0, "response.completed", {"type": "response.completed"})]
    clock, sink, p, s = _manual(plan)
    p.start()  # created + token a
    clock.advance(0.01)  # token b
    assert _seqs(sink) == [0, 1, 2]
    assert p.claim() == 3
    clock.advance(0.01)  # token c
    clock.advance(0.01)  # token d + completed
    assert _seqs(sink) == [0, 1, 2, 4, 5, 6]
    assert [orjson.loads(f)["delta"] for _, w in sink.writes[1:] for f in w.split(b"|")
            if b"delta" in f] == ["b", "c", "d"]


@pytest.mark.asyncio
async def test_a_pause_in_the_middle_of_a_run_shifts_the_rest() -> None:
    plan = [(0.0, "chunk", TokenRun(["a", "b", "c"], iter([0.01, 0.01]), b"[", b"]")),
            (0.0, "done", None)]
    clock, sink, p, s = _manual(plan, CHAT)
    p.encode = encode.sse_chat
    p.start()  # a at 0
    sink.paused = True
    clock.advance(0.01)  # b is due: the pump finds the sink paused
    clock.advance(0.05)
    sink.paused = False
    p.resume()  # at 0.06, paused since 0.01: b now, c at 0.07
    clock.advance(0.01)
    assert [t for t, _ in sink.writes] == [0.0, 0.06, 0.07]
    assert sink.writes[1][1] == b'["b"]' and sink.writes[2][1] == b'["c"]|data: [DONE]\n\n'


def test_a_wrapper_and_a_reader_see_every_token_event() -> None:
    pre = _TEXT_DELTA % (b'"m"', 0)

    def make() -> list[tuple[float, str, Any]]:
        return responses_plan(GAPS)

    seen: list[Any] = []

    def wrapper(plan: Any) -> Any:
        for item in plan:
            seen.append(type(item[2]))
            yield item

    s = EventStream(iter(make()), RESPONSES)
    s.take_runs = True  # even so: the wrapper reads the events one by one
    s.wrap(wrapper)
    got = s.drain()
    assert TokenRun not in seen and len(got) == len(PIECES) + 3
    # a reader of the plan (a replay counting numbers) gets the same items
    flat = list(expand_runs(make()))
    assert [t for _, t, _ in flat] == [t for t, _ in got]
    assert pre  # (the same prefix shape as render.plan)


def test_a_wrapper_that_asks_for_runs_gets_them_whole() -> None:
    """``wrap(fn, runs=True)`` (the engine's pacing): the wrapper gets the plan's runs as
    one item each, and one that expands them itself hands the stream the same events; a
    wrapper added after it sees them one by one."""
    seen: list[Any] = []
    later: list[Any] = []

    def wrapper(plan: Any) -> Any:
        for item in plan:
            seen.append(type(item[2]))
            if type(item[2]) is TokenRun:
                yield from item[2].events(item[1], item[0])
            else:
                yield item

    def outer(plan: Any) -> Any:
        for item in plan:
            later.append(type(item[2]))
            yield item

    s = EventStream(iter(responses_plan(GAPS)), RESPONSES)
    s.wrap(wrapper, runs=True)
    s.wrap(outer)
    got = s.drain()
    assert seen.count(TokenRun) == 1 and TokenRun not in later
    plain = EventStream(iter(responses_plan(GAPS)), RESPONSES)
    assert got == plain.drain()


def test_an_observed_type_is_pulled_event_by_event() -> None:
    """A stream whose on_event observes the run's type hands its events over one by one,
    each observed, even to a pump that takes runs."""
    observed: list[str] = []
    s = EventStream(iter(responses_plan(GAPS)), RESPONSES,
                    on_event=lambda t, d: observed.append(t),
                    observed=frozenset({"response.output_text.delta"}))
    s.take_runs = True
    items = []
    while (ev := s.pull()) is not None:
        items.append(ev)
    assert not any(type(d) is TokenRun for _, _, d in items)
    assert observed == ["response.output_text.delta"] * len(PIECES)
    # an observer of other types only: the run is taken whole
    s2 = EventStream(iter(responses_plan(GAPS)), RESPONSES, on_event=lambda t, d: None,
                     observed=frozenset({"response.completed"}))
    s2.take_runs = True
    assert any(type(ev[2]) is TokenRun for ev in iter(s2.pull, None))


def test_closing_a_stream_mid_run_closes_the_plan() -> None:
    closed = []

    def plan() -> Any:
        try:
            yield 0.0, "chunk", TokenRun(["a", "b"], iter([0.01]), b"", b"")
            yield 0.0, "done", None
        finally:
            closed.append(True)

    s = EventStream(plan(), CHAT)  # not taken: expanded in front of the plan
    assert s.pull() is not None
    s.close()
    assert closed == [True]


def test_the_stamp_suffix_tables_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stream_mod, "_SUFFIXES", {})
    tables = [stream_mod.stamped_suffixes(b',"s%d":' % i) for i in range(20)]
    assert len(stream_mod._SUFFIXES) == stream_mod._MAX_SUFFIXES
    assert all(t == [] for t in tables[stream_mod._MAX_SUFFIXES:])
    assert tables[0][7] == b',"s0":7}' and len(tables[0]) == stream_mod._NSTAMPS
    assert stream_mod.stamped_suffixes(b"x" * 100) == []  # too long a suffix: not kept


def test_a_run_of_another_type_than_the_dialects_bytes_type_is_expanded() -> None:
    """Responses frames bytes payloads as ``event: response.output_text.delta``: a run of
    another type is handed over event by event (the encoder frames each)."""
    s = EventStream(iter([(0.0, "response.reasoning_summary_text.delta",
                           TokenRun(["a"], iter(()), b'{"x":', b',"sequence_number":'))]),
                    RESPONSES)
    s.take_runs = True
    ev = s.pull()
    assert ev is not None and ev[2] == b'{"x":"a","sequence_number":0}'


@pytest.mark.asyncio
async def test_a_claim_while_a_run_waits_for_its_first_token_numbers_before_it() -> None:
    """The run is pulled (held until its first token is due) when a claim comes: the claim
    takes the next number and the run's tokens follow it."""
    pre = _TEXT_DELTA % (b'"msg_1"', 0)
    plan = [(0.0, "response.created", {"type": "response.created"}),
            (0.05, "response.output_text.delta",
             TokenRun(["a", "b"], iter([0.01]), pre, _TEXT_DELTA_END)),
            (0.0, "response.completed", {"type": "response.completed"})]
    clock, sink, p, s = _manual(plan)
    p.start()  # created; the run is held for 0.05
    assert _seqs(sink) == [0] and p.claim() == 1
    sink.paused = True  # and a pause before the run starts shifts it whole
    clock.advance(0.05)
    clock.advance(0.02)
    sink.paused = False
    p.resume()  # paused from 0.05 to 0.07: a now, b at 0.08
    clock.advance(0.01)
    assert _seqs(sink) == [0, 2, 3, 4]
    assert [t for t, _ in sink.writes] == [0.0, 0.07, 0.08]


@pytest.mark.asyncio
@pytest.mark.parametrize("sink_cls", [WireSink, FrameLog])
@pytest.mark.parametrize("supply", [len(PIECES) + 1, len(PIECES) - 1, 3, 0])
async def test_equal_gaps_write_what_the_same_gaps_read_one_by_one_write(
        sink_cls: Any, supply: int) -> None:
    """A constant latency's gaps (ConstantGaps) are taken by the pump at once, not read per
    token: the writes, their times and what the plan reads after the run are those of the
    same values read one by one, with enough gaps for the run, exactly enough, or too few
    (the rest of the run at once, then 0.0 after it, as an iterator that ran out gives)."""
    from llmsim.sim.latency import ConstantGaps

    def plan(const: bool) -> Any:  # (a generator: it reads on after the run, as render's)
        g: Any = ConstantGaps(0.01, supply) if const else iter([0.01] * supply)
        pre = _TEXT_DELTA % (orjson.dumps("msg_1"), 0)
        yield 0.0, "response.created", {"type": "response.created"}
        yield 0.05, "response.output_text.delta", TokenRun(PIECES, g, pre, _TEXT_DELTA_END)
        yield next(g, 0.0), "response.output_text.done", {"type": "t.done"}
        yield next(g, 0.0), "response.completed", {"type": "r.completed"}

    fast = await run(plan(True), RESPONSES, encode.sse_responses, sink_cls, runs=True)
    slow = await run(plan(False), RESPONSES, encode.sse_responses, sink_cls, runs=True)
    assert fast == slow
    ends = [t for t, _ in fast]
    run_gaps = min(supply, len(PIECES) - 1)
    after = max(0, supply - (len(PIECES) - 1))  # gaps left for the two events after it
    last_token = 0.05 + 0.01 * run_gaps
    assert ends[-1] == round(last_token + 0.01 * min(after, 2), 9)


def test_constant_gaps_take_all_or_nothing() -> None:
    from llmsim.sim.latency import ConstantGaps
    g = ConstantGaps(0.25, 5)
    assert g.take(0) and g.take(3) and list(g) == [0.25, 0.25]
    g = ConstantGaps(0.25, 2)
    assert not g.take(3) and list(g) == [0.25, 0.25]  # (nothing consumed)
    assert g.value == 0.25 and not g.take(1) and g.take(0)


@pytest.mark.parametrize("profile, lat, constant", [
    ({"itl_jitter": 0.2}, {}, None),  # drawn: the seeded generator's values
    ({"itl_jitter": 0.0, "itl_ms": 12.0}, {}, 0.012),  # a profile without jitter
    ({}, {"fixed_itl_ms": 7.0}, 0.007),
    ({}, {"instant": True}, 0.0),
])
def test_seeded_gaps_are_the_gaps_of_the_seeded_generator(
        profile: dict[str, Any], lat: dict[str, Any], constant: float | None) -> None:
    """``seeded_gaps(seed, n)`` seeds no generator when nothing is drawn, and gives what
    ``gaps(Random(seed), n)`` gives either way."""
    import random

    from llmsim.sim.latency import ConstantGaps, Latency
    from llmsim.sim.models import ModelProfile
    lt = Latency(ModelProfile("m", **profile), **lat)
    assert lt.constant_gap() == constant
    got = lt.seeded_gaps(1234, 6)
    assert isinstance(got, ConstantGaps) is (constant is not None)
    assert list(got) == list(lt.gaps(random.Random(1234), 6))
    assert len(set(lt.seeded_gaps(1234, 6))) == (1 if constant is not None else 6)


@pytest.mark.asyncio
async def test_a_pump_finished_while_armed_leaves_the_clock() -> None:
    """The pump is its own clock timer: cancelled while it waits for its next token, its
    entry is dead (the clock never ticks it again) and the stream ends once."""
    clock = FakeClock(start=0.0)
    sink = FrameLog(clock)
    ends: list[str] = []
    s = EventStream(iter(chat_plan(GAPS)), CHAT)
    p = Pump(s, clock, encode.sse_chat, sink, on_done=ends.append)
    p.start()
    assert clock.pending == 1 and not sink.writes  # armed for the role chunk at 0.1 s
    p.cancel()
    assert clock.pending == 0 and ends == ["cancelled"]
    clock.advance(1.0)
    await asyncio.sleep(0)
    assert not sink.writes and ends == ["cancelled"]


@pytest.mark.asyncio
async def test_the_stream_knows_the_next_number_when_a_run_stops_midway() -> None:
    """The pump numbers a run's tokens itself: when the stream ends mid-run (the client
    gone), the stream's own count (what a stored response's cancel reads) is the number
    after the last token written, and the stream's end callback already sees it."""
    pre = _TEXT_DELTA % (b'"msg_1"', 0)
    seen: list[int] = []
    plan = [(0.0, "response.created", {"type": "response.created"}),
            (0.0, "response.output_text.delta",
             TokenRun(["a", "b", "c", "d"], iter([0.01] * 3), pre, _TEXT_DELTA_END))]
    clock = FakeClock(start=0.0)
    sink = FrameLog(clock)
    s = EventStream(iter(plan), RESPONSES, on_end=lambda: seen.append(s.seq))
    p = Pump(s, clock, encode.ws_text, sink)
    p.start()  # created + token a
    clock.advance(0.01)  # token b
    assert _seqs(sink) == [0, 1, 2]
    p.cancel()
    assert s.seq == 3 and seen == [3]
