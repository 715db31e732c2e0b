"""Token runs (``stream.TokenRun``, issue 15's per-token hot path): a plan hands a run of
token events over as one item (pieces, gaps and the key of the dialect's token template)
and the pump renders the tokens itself. These tests pin that the wire is byte for byte, and
write for write on the FakeClock, what the same events give one by one (as runs of one
token, and rendered by the stream for an encoder without a token frame), in every dialect
that uses runs and on both kinds of sink, across the end of the stamp table; that numbers
stay in order around an out-of-band claim; that a pause shifts the rest of a run; and that
whoever needs the events one by one (a wrapper, an observer of that type, a reader of the
plan) gets them."""

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
from llmsim.streaming import encode
from llmsim.streaming import stream as stream_mod
from llmsim.streaming.clock import FakeClock
from llmsim.streaming.dialect import Dialect
from llmsim.streaming.flow import Pump
from llmsim.streaming.stream import EventStream, TokenRun, expand_runs

PIECES = ["Hello", " wor%ld", ' "q"', "\\", "é", "\n", "%d", "", " end"]
GAPS = [0.01, 0.013, 0.0, 0.007, 0.01, 0.0004, 0.02, 0.01]  # one fewer than PIECES
CHAT_KEY = ({"id": "c%1"}, 0)  # chat's template key: the chunk head, the choice
MSG = ("msg_1", 0)  # Responses' template key: the message item's id, its output index
# a dialect whose token event is the piece in brackets (what the pump writes, plainly)
BRACKETS = Dialect("brackets", numbered=False, sse=encode.sse_chat, sse_error=CHAT.sse_error,
                   error_events=CHAT.error_events, is_token=CHAT.is_token,
                   terminals=CHAT.terminals, token_type="chunk",
                   token_json=lambda key: (b"[", b"]"))


class WireSink:
    """Like the HTTP protocol's wire: offers the wire frame (an HTTP chunk around the
    event)."""

    paused = False

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.writes: list[tuple[float, bytes]] = []

    def wire_frame(self, prefix: bytes, suffix: bytes) -> Any:
        # (a short table of leads: longer events take the lead function)
        return ([b"%x\r\n" % n for n in range(64)], lambda n: b"%x\r\n" % n,
                len(prefix) + len(suffix), prefix, suffix + b"\r\n")

    def write_wire(self, frames: list[bytes]) -> None:
        self.writes.append((round(self.clock.now(), 9), b"".join(frames)))

    def write_events(self, frames: list[bytes]) -> None:  # (never called with the wire)
        raise AssertionError("write_wire is used")

    def abort(self) -> None:
        pass


class FrameLog(WireSink):
    """A sink that frames each event itself (no wire frame)."""

    wire_frame = None  # type: ignore[assignment]

    def write_events(self, frames: list[bytes]) -> None:
        self.writes.append((round(self.clock.now(), 9), b"|".join(frames)))


def chat_plan(gaps: list[float]) -> list[tuple[float, str, Any]]:
    return [(0.1, "chunk", {"role": "assistant"}),
            (0.0, "chunk", TokenRun(PIECES, iter(gaps), CHAT_KEY)),
            (0.0, "chunk", {"finish": "stop"}), (0.0, "done", None)]


def responses_plan(gaps: list[float]) -> list[tuple[float, str, Any]]:
    it = iter([0.0, *gaps, 0.03])  # shared with what follows the run, as render.plan does
    return [(0.0, "response.created", {"type": "response.created"}),
            (next(it), "response.output_text.delta",
             TokenRun(PIECES, it, ('msg_"odd%id', 2))),
            (next(it, 0.0), "response.output_text.done", {"type": "response.output_text.done"}),
            (0.0, "response.completed", {"type": "response.completed"})]


async def run(plan: list[tuple[float, str, Any]], dialect: Any, encoder: Any, sink_cls: Any,
              *, runs: bool | None, first_seq: int = 0) -> list[tuple[float, bytes]]:
    """``runs``: True, the plan's runs; False, each token a run of one (expand_runs); None,
    every token event rendered by the stream and framed by the encoder (no token frame)."""
    clock = FakeClock(start=0.0)
    sink = sink_cls(clock)
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    s = EventStream(iter(plan) if runs else expand_runs(plan), dialect, first_seq=first_seq)
    enc = encoder if runs is not None else (lambda t, d: encoder(t, d))
    p = Pump(s, clock, enc, sink, on_done=done.set_result)
    assert s.take_runs is (runs is not None)
    p.start()
    assert await asyncio.wait_for(done, 5) == "completed"
    return sink.writes  # type: ignore[no-any-return]


def anthropic_plan(gaps: list[float]) -> list[tuple[float, str, Any]]:
    it = iter([0.0, *gaps, 0.03])
    return [(0.2, "message_start", {"type": "message_start"}),
            (next(it), "content_block_delta", TokenRun(PIECES, it, 0)),
            (0.0, "content_block_stop", {"type": "content_block_stop", "index": 0}),
            (next(it, 0.0), "message_stop", {"type": "message_stop"})]


def completions_plan(gaps: list[float]) -> list[tuple[float, str, Any]]:
    return [(0.1, "token", TokenRun(PIECES, iter(gaps), ({"id": "cmpl-1"}, 0))),
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
    ones = await run(make(GAPS), dialect, encoder, sink_cls, runs=False, first_seq=first_seq)
    slow = await run(make(GAPS), dialect, encoder, sink_cls, runs=None, first_seq=first_seq)
    assert fast == ones == slow
    assert len(fast) >= len(PIECES) - 2  # (the 0-gap tokens share a write)
    if dialect is RESPONSES:  # numbered in order across the end of the stamp table
        blob = b"".join(w for _, w in fast)
        nums = [int(x) for x in re.findall(rb'"sequence_number":(\d+)', blob)]
        assert nums == list(range(first_seq, first_seq + len(PIECES) + 3))


@pytest.mark.asyncio
async def test_fewer_gaps_than_tokens_sends_the_rest_at_once() -> None:
    fast = await run(chat_plan(GAPS[:3]), CHAT, encode.sse_chat, WireSink, runs=True)
    slow = await run(chat_plan(GAPS[:3]), CHAT, encode.sse_chat, WireSink, runs=None)
    assert fast == slow
    assert fast[-1][0] == round(0.1 + sum(GAPS[:3]), 9)


def test_a_run_draws_a_gap_only_for_a_token_that_follows() -> None:
    """A plan may share its gaps with what follows the run (Responses): the run must draw
    exactly one gap per later token, in the pump as in its events."""
    for split in (True, False):
        gaps = iter([0.5, 0.25, 9.0])
        run_ = TokenRun(["a", "b", "c"], gaps, CHAT_KEY)
        items = run_.split("chunk", 1.0) if split else run_.events("chunk", 1.0, CHAT)
        assert [d for d, _, _ in items] == [1.0, 0.5, 0.25]
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
    plan = [(0.0, "response.created", {"type": "response.created"}),
            (0.0, "response.output_text.delta",
             TokenRun(["a", "b", "c", "d"], iter([0.01] * 3), MSG)),
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
    plan = [(0.0, "chunk", TokenRun(["a", "b", "c"], iter([0.01, 0.01]))),
            (0.0, "done", None)]
    clock, sink, p, s = _manual(plan, BRACKETS)
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
    """A wrapper and a reader of the plan see each token as a run of one (no bytes)."""

    def make() -> list[tuple[float, str, Any]]:
        return responses_plan(GAPS)

    seen: list[Any] = []

    def wrapper(plan: Any) -> Any:
        for item in plan:
            seen.append(item[2])
            yield item

    s = EventStream(iter(make()), RESPONSES)
    s.take_runs = True  # even so: the wrapper reads the events one by one
    s.wrap(wrapper)
    got = s.drain()
    runs = [d for d in seen if type(d) is TokenRun]
    assert [r.pieces for r in runs] == [[p] for p in PIECES] and len(got) == len(PIECES) + 3
    assert not any(type(d) is bytes for d in seen)
    # a reader of the plan (a replay counting numbers) gets the same items
    flat = list(expand_runs(make()))
    assert [t for _, t, _ in flat] == [t for t, _ in got]


def test_a_wrapper_that_asks_for_runs_gets_them_whole() -> None:
    """``wrap(fn, runs=True)`` (the engine's pacing): the wrapper gets the plan's runs as
    one item each, and one that splits them itself hands the stream the same events; a
    wrapper added after it sees them one token at a time."""
    seen: list[Any] = []
    later: list[int] = []

    def wrapper(plan: Any) -> Any:
        for item in plan:
            seen.append(type(item[2]))
            if type(item[2]) is TokenRun:
                yield from item[2].split(item[1], item[0])
            else:
                yield item

    def outer(plan: Any) -> Any:
        for item in plan:
            if type(item[2]) is TokenRun:
                later.append(len(item[2].pieces))
            yield item

    s = EventStream(iter(responses_plan(GAPS)), RESPONSES)
    s.wrap(wrapper, runs=True)
    s.wrap(outer)
    got = s.drain()
    assert seen.count(TokenRun) == 1 and later and set(later) == {1}
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
            yield 0.0, "chunk", TokenRun(["a", "b"], iter([0.01]), CHAT_KEY)
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


def test_a_run_of_another_type_than_the_dialects_token_type_is_refused() -> None:
    """A run's events are the dialect's token event (its one template): a run of another
    type is a plan's mistake, refused where the stream reads it (a pump ends the stream
    with its error frame) instead of being rendered as the wrong event."""
    s = EventStream(iter([(0.0, "response.reasoning_summary_text.delta",
                           TokenRun(["a"], key=MSG))]), RESPONSES)
    s.take_runs = True
    with pytest.raises(ValueError, match="reasoning_summary_text"):
        s.pull()
    # the template: the run's token as the dict the dialect's event would be
    s = EventStream(iter([(0.0, "response.output_text.delta", TokenRun(["a"], key=MSG))]),
                    RESPONSES, first_seq=4)
    ev = s.pull()
    assert ev is not None and orjson.loads(ev[2]) == {
        "type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0,
        "content_index": 0, "delta": "a", "logprobs": [], "sequence_number": 4}


@pytest.mark.asyncio
async def test_a_claim_while_a_run_waits_for_its_first_token_numbers_before_it() -> None:
    """The run is pulled (held until its first token is due) when a claim comes: the claim
    takes the next number and the run's tokens follow it."""
    plan = [(0.0, "response.created", {"type": "response.created"}),
            (0.05, "response.output_text.delta",
             TokenRun(["a", "b"], iter([0.01]), MSG)),
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
        yield 0.0, "response.created", {"type": "response.created"}
        yield 0.05, "response.output_text.delta", TokenRun(PIECES, g, MSG)
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
    """The pump takes a run's numbers from the stream's count as it writes: when the stream
    ends mid-run (the client gone), that count (what a stored response's cancel reads) is
    the number after the last token written, and the stream's end callback sees it."""
    seen: list[int] = []
    plan = [(0.0, "response.created", {"type": "response.created"}),
            (0.0, "response.output_text.delta",
             TokenRun(["a", "b", "c", "d"], iter([0.01] * 3), MSG))]
    clock = FakeClock(start=0.0)
    sink = FrameLog(clock)
    s = EventStream(iter(plan), RESPONSES, on_end=lambda: seen.append(s.seq))
    p = Pump(s, clock, encode.ws_text, sink)
    p.start()  # created + token a
    clock.advance(0.01)  # token b
    assert _seqs(sink) == [0, 1, 2]
    p.cancel()
    assert s.seq == 3 and seen == [3]


@pytest.mark.parametrize("wire_cls", ["http", "ws"])
def test_a_wires_frame_parts_are_its_frame(wire_cls: str) -> None:
    """``Wire.wire_frame``'s parts around a payload are the chunk (HTTP) or the text frame
    (WebSocket) of the whole event, at every length class: the WebSocket header's 7-bit,
    16-bit and 64-bit lengths, and either side of the end of the lead table."""
    import struct

    from llmsim.streaming import wire

    def ws_frame(b: bytes) -> bytes:  # RFC 6455 §5.2, written out independently
        n = len(b)
        head = (struct.pack("!BB", 0x81, n) if n < 126 else
                struct.pack("!BBH", 0x81, 126, n) if n < 65536 else
                struct.pack("!BBQ", 0x81, 127, n))
        return head + b

    w: Any = wire.HTTPWire(None) if wire_cls == "http" else wire.WSWire(None)
    whole = ((lambda b: b"%x\r\n%b\r\n" % (len(b), b)) if wire_cls == "http" else ws_frame)
    prefix, suffix = b'event: x\ndata: {"a":', b"}\n\n"
    for n in (0, 1, 100, 125, 126, 127, wire.LEADS - 1, wire.LEADS, wire.LEADS + 1,
              65535, 65536, 70000):
        payload = b"y" * max(0, n - len(prefix) - len(suffix))
        leads, lead, extra, head, tail = w.wire_frame(prefix, suffix)
        m = len(payload) + extra
        assert (leads[m] if m < len(leads) else lead(m)) == lead(m)
        assert lead(m) + head + payload + tail == whole(prefix + payload + suffix)
        if wire_cls == "ws":
            assert wire.ws_text_frame(prefix + payload + suffix) == whole(
                prefix + payload + suffix)


@pytest.mark.asyncio
@pytest.mark.parametrize("choices", [3, 20])
@pytest.mark.parametrize("sink_cls", [WireSink, FrameLog])
async def test_runs_of_choices_taking_turns_keep_their_own_template(
        choices: int, sink_cls: Any) -> None:
    """A multi-choice plan yields a run of one token per choice per step, the choices'
    keys taking turns: each token is written in its own choice's template (the pump keeps
    a few templates by key, starting again past its bound), as the stream renders it."""
    from llmsim.streaming.flow import MAX_TEMPLATES

    assert choices > MAX_TEMPLATES or choices < MAX_TEMPLATES
    keys = [({"id": "chatcmpl-1", "n": k}, k) for k in range(choices)]

    def plan() -> list[tuple[float, str, Any]]:
        out: list[tuple[float, str, Any]] = [(0.1, "chunk", {"role": "assistant"})]
        for step in range(3):
            for k in range(choices):
                out.append((0.01 if step and not k else 0.0, "chunk",
                            TokenRun([f"s{step}c{k}"], key=keys[k])))
        return [*out, (0.0, "done", None)]

    fast = await run(plan(), CHAT, encode.sse_chat, sink_cls, runs=True)
    slow = await run(plan(), CHAT, encode.sse_chat, sink_cls, runs=None)
    assert fast == slow
    blob = b"".join(w for _, w in fast)
    for step in range(3):
        for k in range(choices):
            assert b'"n":%d,"choices":[{"index":%d,"delta":{"content":"s%dc%d"}' % (
                k, k, step, k) in blob


class _Transport:
    """Under a real Wire: records each write (clock time, bytes); ``fail_at``: the write of
    that index raises once (a transport that breaks mid-run)."""

    def __init__(self, clock: FakeClock, fail_at: int = -1) -> None:
        self.clock = clock
        self.writes: list[tuple[float, bytes]] = []
        self.fail_at = fail_at
        self.calls = 0
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.calls += 1
        if self.calls - 1 == self.fail_at:
            raise OSError("broken transport")
        self.writes.append((round(self.clock.now(), 9), data))

    def is_closing(self) -> bool:
        return False

    def abort(self) -> None:
        self.aborted = True


class _Times(list[float]):
    """A stream's held token-write times that remember the most they held."""

    most = 0

    def append(self, t: float) -> None:
        super().append(t)
        self.most = max(self.most, len(self))

    def extend(self, ts: Any) -> None:
        super().extend(ts)
        self.most = max(self.most, len(self))


async def _through_wire(const: bool, dialect: Any, wire_cls: str, fail_at: int = -1,
                        tokens: int = 40, held: list[int] | None = None
                        ) -> tuple[list[tuple[float, bytes]], str, Any, list[Any], bool]:
    """A plan with a run whose gaps are equal (ConstantGaps when ``const``: the pump's
    one-token tick; else the same gaps from an iterator: the general tick) through a real
    Wire, observed by a stream's stats track (``held``: gets the most token times the
    track held at once)."""
    from llmsim.sim.latency import ConstantGaps
    from llmsim.state.stats import Stats
    from llmsim.streaming.wire import HTTPWire, WSWire

    pieces = [f"t{i}" for i in range(tokens)]
    clock = FakeClock(start=0.0)
    tr = _Transport(clock, fail_at)
    wire = (HTTPWire if wire_cls == "http" else WSWire)(tr)  # type: ignore[arg-type]
    wire.open = True
    numbered = dialect is RESPONSES

    def plan() -> Any:
        g: Any = (ConstantGaps(0.01, tokens + 20) if const
                  else iter([0.01] * (tokens + 20)))
        if numbered:
            yield 0.0, "response.created", {"type": "response.created"}
            yield 0.05, "response.output_text.delta", TokenRun(pieces, g, MSG)
            yield next(g, 0.0), "response.completed", {"type": "response.completed"}
        else:
            yield 0.05, "chunk", TokenRun(pieces, g, CHAT_KEY)
            yield next(g, 0.0), "chunk", {"finish": "stop"}
            yield 0.0, "done", None
    stats = Stats(time_fn=clock.time)
    track = stats.track("m", clock.now(), "sse", dialect.is_token)
    times = _Times()
    assert track.observe is not None
    track.observe.times = times
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    s = EventStream(plan(), dialect)
    enc = dialect.ws if wire_cls == "ws" else dialect.sse
    p = Pump(s, clock, enc, wire, on_done=done.set_result, observer=track.observe,
             error_frame=dialect.sse_error)
    p.start()
    clock.advance(0.05)  # the run's first token is written: the run is the pump's now
    fast = p._fast
    reason = await asyncio.wait_for(done, 5)
    if held is not None:
        held.append(times.most)
    track.finish(reason, clock.now())
    return tr.writes, reason, (track.tokens, track.first), list(stats.hists["m"]), fast


@pytest.mark.asyncio
@pytest.mark.parametrize("wire_cls", ["http", "ws"])
@pytest.mark.parametrize("dialect", [CHAT, RESPONSES], ids=["chat", "responses"])
async def test_the_one_token_tick_writes_what_the_general_tick_writes(
        wire_cls: str, dialect: Any) -> None:
    """On time, a tick that writes one token of a run with equal gaps into a connection's
    Wire takes a shorter path (Pump._tick): the same bytes at the same times, the same
    numbers, and the same statistics (token count, TTFT and gap histograms) as the general
    path writes for the same gaps read one by one."""
    if wire_cls == "ws" and dialect is CHAT:
        pytest.skip("chat has no WebSocket mode")
    fast = await _through_wire(True, dialect, wire_cls)
    slow = await _through_wire(False, dialect, wire_cls)
    assert fast[4] is True and slow[4] is False  # (the short path is the one tested)
    assert fast[:4] == slow[:4]
    # (the tokens, the end 10 ms after the last; Responses' created before them)
    assert fast[1] == "completed" and len(fast[0]) == 40 + 1 + (dialect is RESPONSES)


@pytest.mark.asyncio
@pytest.mark.parametrize("dialect", [CHAT, RESPONSES], ids=["chat", "responses"])
async def test_a_long_run_folds_its_token_times_as_the_general_tick_does(dialect: Any) -> None:
    """A run of 300 tokens through the one-token tick: the stream's track never holds more
    than ``fold_every`` token times (the statistics' bound), and the counts and histograms
    are the general tick's."""
    from llmsim.state.stats import FOLD_EVERY

    held: list[int] = []
    fast = await _through_wire(True, dialect, "http", tokens=300, held=held)
    slow = await _through_wire(False, dialect, "http", tokens=300, held=held)
    assert fast[4] is True and fast[:4] == slow[:4]
    assert fast[2][0] == 300
    assert held[0] <= FOLD_EVERY and held[1] <= FOLD_EVERY


@pytest.mark.asyncio
@pytest.mark.parametrize("const", [True, False], ids=["one-token tick", "general tick"])
async def test_a_fold_failing_mid_run_ends_the_stream_with_its_error_frame(
        const: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The statistics' fold raising where a run's held token times reach their bound (in the
    one-token tick, or the general one): nothing escapes the pump, the stream ends with its
    terminal error frame and reason ``error`` after the tokens written before."""
    from llmsim.state import stats
    from llmsim.state.stats import FOLD_EVERY

    inner = stats._Observer.fold
    failed: list[int] = []

    def fold(self: Any) -> None:
        if not failed and len(self.times) >= FOLD_EVERY - 1:
            failed.append(len(self.times))
            raise RuntimeError("a broken observer")
        inner(self)

    monkeypatch.setattr(stats._Observer, "fold", fold)
    writes, reason, (tokens, _), _, fast = await _through_wire(const, CHAT, "http",
                                                               tokens=2 * FOLD_EVERY)
    assert fast is const and failed and reason == "error"
    assert b'"error"' in writes[-1][1] and FOLD_EVERY - 1 <= tokens <= FOLD_EVERY
    assert len(writes) == tokens + 1  # a write a token, then the error frame


@pytest.mark.asyncio
@pytest.mark.parametrize("dialect", [CHAT, RESPONSES], ids=["chat", "responses"])
async def test_a_write_failing_in_the_one_token_tick_fails_as_in_the_general_tick(
        dialect: Any) -> None:
    """A transport that raises in the middle of a run: the short tick ends the stream as
    the general one does (the token again, then the terminal error frame; reason
    ``error``; the tokens written before counted)."""
    fast = await _through_wire(True, dialect, "http", fail_at=12)
    slow = await _through_wire(False, dialect, "http", fail_at=12)
    assert fast[:4] == slow[:4]
    assert fast[1] == "error" and len(fast[0]) == 12 + 1


@pytest.mark.asyncio
@pytest.mark.parametrize("dialect", [CHAT, RESPONSES], ids=["chat", "responses"])
async def test_a_token_failing_to_render_in_the_one_token_tick_fails_as_in_the_general_tick(
        dialect: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's piece whose JSON cannot be rendered, mid-run: the short tick writes nothing of
    it and ends the stream as the general one does (the tokens before, then the terminal
    error frame; reason ``error``; only the tokens written counted)."""
    from llmsim.streaming import flow

    inner = flow.piece_json

    def piece_json(piece: str) -> bytes:
        if piece == "t12":
            raise ValueError("an unrenderable piece")
        return inner(piece)

    monkeypatch.setattr(flow, "piece_json", piece_json)
    fast = await _through_wire(True, dialect, "http")
    slow = await _through_wire(False, dialect, "http")
    assert fast[4] is True and fast[:4] == slow[:4]
    assert fast[1] == "error" and fast[2][0] == 12
    assert b'"error"' in fast[0][-1][1] and len(fast[0]) == 12 + 1 + (dialect is RESPONSES)
