"""One numbering owner (issue 30): every ``sequence_number`` a Responses client sees comes
from an :class:`~llmsim.streaming.stream.EventStream` — the live stream's, a replay's that
numbers the plan again as the live one did (passing over the numbers the live stream gave
events outside its plan), or the WebSocket connection's own stream for an event of no running
response. These tests fail if a second count comes back: a replay from the middle after a
steer answer or an error event mid-stream must carry the live stream's numbers, read with the
strict SDK types over raw HTTP and with the openai SDK itself."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import orjson
import pytest
from openai import OpenAI

from llmsim.api.responses import RESPONSES
from llmsim.api.responses.record import Record, Snapshot
from llmsim.api.responses.state import state
from llmsim.streaming import encode
from llmsim.streaming import stream as stream_mod
from llmsim.streaming.clock import FakeClock
from llmsim.streaming.flow import Pump
from llmsim.streaming.stream import EventStream, TokenRun

from . import rawhttp
from .responses_sse import strict_events
from .test_token_runs import MSG, FrameLog
from .test_websocket_raw import BASE, TERMINAL, RawWS

STEER = "response.steer.failed"


def strict_replay(srv: Any, rid: str, after: int) -> list[dict[str, Any]]:
    """``GET /v1/responses/{rid}?stream=true&starting_after=after``, each event validated
    strictly by the SDK's stream event types."""
    return strict_events(rawhttp.request(
        srv.url, "GET", f"/v1/responses/{rid}?stream=true&starting_after={after}"))


def _told(ev: dict[str, Any]) -> tuple[str, int, str | None]:
    return ev["type"], ev["sequence_number"], ev.get("delta")


def test_a_replay_after_a_steer_answer_carries_the_live_numbers(make_server: Any) -> None:
    """A steer answer takes a number of the running response's stream; a replay of that
    response (from the start, before, at and after the steer's number) hands over the
    other events with the numbers the live stream gave them (the steer's is a gap: it was
    sent on the WebSocket only). Steer answers for responses not running here take the
    connection's own numbers: 0, 1, 2, ... (one owner, no repeated number)."""
    srv = make_server(latency="realistic", ttft_ms=1, itl_ms=4)
    c = RawWS(srv.url)
    try:
        c.send_json({"type": "response.create", **BASE, "max_output_tokens": 300})
        seen = [c.recv_json()]
        rid = seen[0]["response"]["id"]
        while sum(e["type"] == "response.output_text.delta" for e in seen) < 4:
            seen.append(c.recv_json())
        c.send_json({"type": "response.steer", "previous_response_id": rid, "input": "a"})
        while seen[-1]["type"] not in TERMINAL:
            seen.append(c.recv_json())
        assert [e["sequence_number"] for e in seen] == list(range(len(seen)))
        (steer,) = [e["sequence_number"] for e in seen if e["type"] == STEER]
        assert steer < len(seen) - 3  # (answered mid-stream: events followed it)
        # the connection's own stream: after the response, for it and for unknown ones
        own = []
        for target in ("resp_gone", rid, "resp_other"):
            c.send_json({"type": "response.steer", "previous_response_id": target,
                         "input": "b"})
            ev = c.recv_json()
            assert ev["type"] == STEER and ev["steer"]["previous_response_id"] == target
            own.append(ev["sequence_number"])
        assert own == [0, 1, 2]
    finally:
        c.close()
    live = [_told(e) for e in seen if e["type"] != STEER]
    sdk = OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0,
                 _strict_response_validation=True)
    try:
        for after in (-1, 2, steer - 1, steer, steer + 1, len(seen) - 2):
            want = [t for t in live if t[1] > after]
            assert [_told(e) for e in strict_replay(srv, rid, after)] == want, after
            got = list(sdk.responses.retrieve(rid, stream=True, starting_after=after))
            assert [(e.type, e.sequence_number) for e in got] == [t[:2] for t in want]
    finally:
        sdk.close()
    # another worker replays it from the snapshot it was published as (pickled): the
    # claimed numbers travel with it
    rec = state(srv.app).store.get(rid)
    assert type(rec) is Record
    other = pickle.loads(pickle.dumps(Snapshot(rec, 1, 8))).replay(srv.app)
    for after in (-1, steer - 1, steer):
        replay = EventStream(other.follow_plan(0.0), RESPONSES)
        other.follow(replay, after)
        got = [orjson.loads(d) if type(d) is bytes else d for _, d in replay.drain()]
        assert [_told(e) for e in got] == [t for t in live if t[1] > after]


PLAN_PIECES = ["a", "b", "c", "d", "e", "f"]


def _plan() -> list[tuple[float, str, Any]]:
    return [(0.0, "response.created", {"type": "response.created"}),
            (0.01, "response.output_text.delta",
             TokenRun(list(PLAN_PIECES), iter([0.01] * 5), MSG)),
            (0.01, "response.output_text.done", {"type": "response.output_text.done"}),
            (0.0, "response.completed", {"type": "response.completed"})]


def _sent(sink: Any) -> list[dict[str, Any]]:
    return [orjson.loads(f) for _, w in sink.writes for f in w.split(b"|")]


def _replayed(live: EventStream, after: int, end: int | None) -> list[dict[str, Any]]:
    replay = EventStream(iter(_plan()), RESPONSES)
    replay.replay(after, live.claimed or (), (lambda: (end, None)) if end is not None else None)
    return [orjson.loads(d) if type(d) is bytes else dict(d) for _, d in replay.drain()]


@pytest.mark.asyncio
async def test_a_replay_passes_over_the_numbers_claimed_mid_run() -> None:
    """Out-of-band events claimed in the middle of a token run (a steer answer, an error
    event) and the stream then stopped: the stream keeps the claimed numbers, and a replay
    of its plan from any point hands over exactly the plan events the live stream numbered
    after that point, with the same numbers, and nothing past where it stopped."""
    clock = FakeClock(start=0.0)
    sink = FrameLog(clock)
    live = EventStream(iter(_plan()), RESPONSES)
    pump = Pump(live, clock, encode.ws_text, sink)
    pump.start()  # created
    clock.advance(0.01)  # token a
    clock.advance(0.01)  # token b
    first = pump.claim()  # a steer answer between two tokens
    clock.advance(0.01)  # token c
    second = pump.claim()  # an error event: the stream ends here
    pump.cancel("error")
    told = [(e["type"], e["sequence_number"], e.get("delta")) for e in _sent(sink)]
    assert (first, second) == (3, 5) and live.claimed == [3, 5]
    assert [n for _, n, _ in told] == [0, 1, 2, 4]
    for after in range(-1, 7):
        got = [(e["type"], e["sequence_number"], e.get("delta"))
               for e in _replayed(live, after, live.seq)]
        assert got == [t for t in told if t[1] > after], after
    # the live stream run to its end: the replay is the live stream without the claims
    clock2 = FakeClock(start=0.0)
    sink2 = FrameLog(clock2)
    whole = EventStream(iter(_plan()), RESPONSES)
    pump2 = Pump(whole, clock2, encode.ws_text, sink2)
    pump2.start()
    clock2.advance(0.02)
    mid = pump2.claim()
    for _ in range(10):
        clock2.advance(0.01)
    told2 = [(e["type"], e["sequence_number"], e.get("delta")) for e in _sent(sink2)]
    assert told2[-1][0] == "response.completed" and mid not in [n for _, n, _ in told2]
    for after in range(-1, len(told2) + 1):
        got = [(e["type"], e["sequence_number"], e.get("delta"))
               for e in _replayed(whole, after, None)]
        assert got == [t for t in told2 if t[1] > after]


def test_the_claimed_numbers_a_stream_keeps_are_bounded() -> None:
    """A client that floods steers at a running response: every answer is numbered, the
    stream keeps at most MAX_CLAIMED of the numbers for its replays."""
    s = EventStream(iter(_plan()), RESPONSES)
    got = [s.claim() for _ in range(stream_mod.MAX_CLAIMED + 50)]
    assert got == list(range(stream_mod.MAX_CLAIMED + 50))
    assert s.claimed == list(range(stream_mod.MAX_CLAIMED))


@pytest.mark.asyncio
async def test_a_replay_of_a_running_stream_follows_its_later_claims_and_end() -> None:
    """A follower that joins a stream still running: a number the live stream claims after
    the replay began is passed over too, and a cancel that comes later ends the replay
    where it ended the live stream."""
    clock = FakeClock(start=0.0)
    sink = FrameLog(clock)
    live = EventStream(iter(_plan()), RESPONSES)
    live.claimed = []  # (what Record.follow does for a live stream: its claims to come)
    pump = Pump(live, clock, encode.ws_text, sink)
    pump.start()
    clock.advance(0.02)  # created, a, b: 0, 1, 2
    end: list[int] = []
    replay = EventStream(iter(_plan()), RESPONSES)
    replay.replay(1, live.claimed, lambda: (end[0], None) if end else None)

    def pulled() -> tuple[str, int, str | None] | None:
        ev = replay.pull()
        if ev is None:
            return None
        d = orjson.loads(ev[2]) if type(ev[2]) is bytes else ev[2]
        return d["type"], d["sequence_number"], d.get("delta")

    assert pulled() == ("response.output_text.delta", 2, "b")
    assert pump.claim() == 3  # a steer answer, after the follower joined
    clock.advance(0.01)  # c: 4
    assert pulled() == ("response.output_text.delta", 4, "c")
    pump.cancel("cancelled")
    end.append(live.seq)  # (Record.cancel: cancel_seq, the live stream's count)
    assert pulled() is None
    assert [e["sequence_number"] for e in _sent(sink)] == [0, 1, 2, 4]


@pytest.mark.asyncio
async def test_a_follower_of_a_background_response_stops_at_a_later_cancel() -> None:
    """``GET ?stream=true&starting_after=3`` of a running background response, then a
    cancel: the follower told exactly the live stream's numbers 4 .. up to the cancel."""
    from llmsim import Config
    from llmsim.app import App
    from llmsim.messages import JSONResponse, StreamResponse

    from .test_responses_state import _pump, _req

    clock = FakeClock()
    app = App(Config(latency="realistic", ttft_ms=100, itl_ms=10, seed=3), clock=clock)
    res = await app.dispatch(_req({"model": "gpt-4o", "input": "x", "background": True,
                                   "max_output_tokens": 200}))
    assert isinstance(res, JSONResponse)
    rid = res.data["id"]
    rec = state(app).store.get(rid)
    while rec.emitted < 6:
        await asyncio.sleep(0)
    follow = await app.dispatch(_req({}, "GET", f"/v1/responses/{rid}",
                                     {"stream": ["true"], "starting_after": ["3"]}))
    assert isinstance(follow, StreamResponse)
    seen, done = _pump(app, follow)
    while len(seen) < 8:
        await asyncio.sleep(0)
    got = await app.dispatch(_req({}, "POST", f"/v1/responses/{rid}/cancel"))
    assert got.data["status"] == "cancelled"
    for _ in range(50):
        clock.advance(0.05)
        await asyncio.sleep(0)
    assert await done == "completed"
    assert [s for _, s, _ in seen] == list(range(4, rec.cancel_seq))
