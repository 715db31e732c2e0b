"""The WebSocket layer's pure parts without sockets: the handshake decision, the lane scheduler
and the previous-response cache; and the session's timers on a FakeClock (connection time
limit, close timeout) through the in-memory transport."""

from __future__ import annotations

import base64
import gc
import json
import weakref
from typing import Any

import pytest
from wsproto.events import CloseConnection, TextMessage

from llmsim.api.responses.state import ConnectionCache, LaneCache
from llmsim.api.responses.ws import PATHS
from llmsim.api.responses.ws_events import Create, EventError, Steer, parse_client_event
from llmsim.api.responses.ws_lanes import LaneLimitError, LaneScheduler
from llmsim.config import WebSocketConfig
from llmsim.errors import APIError
from llmsim.streaming.clock import FakeClock
from llmsim.transport.handshake import accept_key, check_capacity, check_handshake

from .memtransport import mem_server
from .test_hostile_bytes import _settle, _upgrade
from .test_websocket_sdk import BASE, validated

KEY = base64.b64encode(b"0123456789abcdef").decode()
GOOD = {"connection": "keep-alive, Upgrade", "upgrade": "websocket",
        "sec-websocket-version": "13", "sec-websocket-key": KEY}


# -- the handshake -------------------------------------------------------------------------

def test_handshake_accepts_and_computes_the_rfc_accept_value() -> None:
    # RFC 6455 §1.3's worked example
    assert accept_key("dGhlIHNhbXBsZSBub25jZQ==") == b"s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
    assert check_handshake("GET", "/v1/responses", GOOD, PATHS) == accept_key(KEY)
    assert check_handshake("GET", "/openai/v1/responses/", GOOD, PATHS) == accept_key(KEY)


@pytest.mark.parametrize("value,ok", [
    ("Upgrade", True), ("upgrade", True), ("UPGRADE", True), (" Upgrade ", True),
    ("keep-alive, Upgrade", True), ("Upgrade,keep-alive", True), (",,upgrade,", True),
    ("keep-alive", False), ("upgrades", False), ("up grade", False), ("", False),
    ("keep-alive; upgrade", False),
])
def test_handshake_connection_header_lists_upgrade(value: str, ok: bool) -> None:
    """``Connection`` is a comma-separated token list (RFC 9110 §7.6.1): ``upgrade`` in any
    case and place, a token alone or among others; nothing else passes."""
    headers = {**GOOD, "connection": value}
    if ok:
        assert check_handshake("GET", "/v1/responses", headers, PATHS) == accept_key(KEY)
        return
    with pytest.raises(APIError) as info:
        check_handshake("GET", "/v1/responses", headers, PATHS)
    assert info.value.code == "invalid_websocket_handshake"


@pytest.mark.parametrize("method,path,headers,version,status,code", [
    ("GET", "/v1/chat/completions", GOOD, b"1.1", 400, "websocket_not_supported"),
    ("POST", "/v1/responses", GOOD, b"1.1", 400, "invalid_websocket_handshake"),
    ("GET", "/v1/responses", GOOD, b"1.0", 400, "invalid_websocket_handshake"),
    ("GET", "/v1/responses", {**GOOD, "connection": "keep-alive"}, b"1.1", 400,
     "invalid_websocket_handshake"),
    ("GET", "/v1/responses", {**GOOD, "sec-websocket-version": "8"}, b"1.1", 426,
     "invalid_websocket_handshake"),
    ("GET", "/v1/responses", {**GOOD, "sec-websocket-key": "c2hvcnQ="}, b"1.1", 400,
     "invalid_websocket_handshake"),
    ("GET", "/v1/responses", {**GOOD, "sec-websocket-key": "not base64!"}, b"1.1", 400,
     "invalid_websocket_handshake"),
    ("GET", "/v1/responses", {**GOOD, "sec-websocket-key": "ключ"}, b"1.1", 400,
     "invalid_websocket_handshake"),
    ("GET", "/v1/responses", {k: v for k, v in GOOD.items() if k != "sec-websocket-key"},
     b"1.1", 400, "invalid_websocket_handshake"),
])
def test_handshake_errors(method: str, path: str, headers: dict[str, str], version: bytes,
                          status: int, code: str) -> None:
    with pytest.raises(APIError) as info:
        check_handshake(method, path, headers, PATHS, version)
    assert (info.value.status, info.value.code) == (status, code)
    if status == 426:
        assert ("sec-websocket-version", "13") in info.value.headers


def test_connection_cap_is_a_429_with_retry_after() -> None:
    check_capacity(3, 4)
    check_capacity(10_000, 0)  # 0 = no limit
    with pytest.raises(APIError) as info:
        check_capacity(4, 4)
    err = info.value
    assert (err.status, err.type, err.code) == (429, "rate_limit_error",
                                                "too_many_websocket_connections")
    assert ("retry-after", "1") in err.headers


# -- client events -------------------------------------------------------------------------

def test_create_flat_and_nested_forms() -> None:
    ev = parse_client_event(json.dumps({"type": "response.create", "model": "m", "input": "hi",
                                        "stream_id": "a", "previous_response_id": "resp_1"}))
    assert ev == Create("a", {"model": "m", "input": "hi", "previous_response_id": "resp_1"},
                        "resp_1")
    ev = parse_client_event(json.dumps({"type": "response.create", "store": False,
                                        "response": {"model": "m", "stream_id": "b",
                                                     "store": True}}))
    assert ev == Create("b", {"model": "m", "store": True}, None)  # nested wins
    steer = parse_client_event('{"type": "response.steer", "previous_response_id": "r", '
                               '"input": "more"}')
    assert steer == Steer("r", "more")


@pytest.mark.parametrize("text,code,param,sid", [
    ("{bad", "invalid_json", None, None),
    ("[1]", "invalid_type", None, None),
    ('{"model": "m"}', "missing_required_parameter", "type", None),
    ('{"type": "response.cancel"}', "invalid_value", "type", None),
    ('{"type": {"x": 1}}', "invalid_value", "type", None),
    ('{"type": "response.create", "stream_id": "a b"}', "invalid_stream_id", "stream_id", None),
    ('{"type": "response.create", "stream_id": 7}', "invalid_stream_id", "stream_id", None),
    ('{"type": "response.create", "stream_id": "' + "x" * 257 + '"}', "invalid_stream_id",
     "stream_id", None),
    ('{"type": "response.create", "stream_id": "s", "response": 3}', "invalid_type",
     "response", "s"),
    ('{"type": "response.steer", "input": "x"}', "missing_required_parameter",
     "previous_response_id", None),
    ('{"type": "response.steer", "previous_response_id": "r", "input": []}', "invalid_value",
     "input", None),
    ('{"type": "response.create", "metadata": ' + "[" * 200 + "]" * 200 + "}",
     "nesting_above_max_depth", "metadata", None),
])
def test_bad_client_events(text: str, code: str, param: str | None, sid: str | None) -> None:
    with pytest.raises(EventError) as info:
        parse_client_event(text)
    err = info.value
    assert (err.status, err.type, err.code, err.param, err.stream_id) == (
        400, "invalid_request_error", code, param, sid)
    assert len(err.message) < 400  # an unknown type is echoed, bounded


# -- the lane scheduler --------------------------------------------------------------------

def test_lanes_one_at_a_time_fifo() -> None:
    s: LaneScheduler[str] = LaneScheduler(max_lanes=4, max_active=4, max_queued=10)
    for item in ("a1", "a2", "a3"):
        s.admit(None, item)
    assert list(s.take_ready()) == [(None, "a1")]  # one running per lane
    assert list(s.take_ready()) == [] and (s.active, s.queued) == (1, 2)
    s.finish(None)
    assert list(s.take_ready()) == [(None, "a2")]
    s.finish(None)
    assert list(s.take_ready()) == [(None, "a3")]
    s.finish(None)
    assert s.idle and s.lanes == 0  # an empty lane is forgotten


def test_lanes_share_max_active_in_arrival_order() -> None:
    s: LaneScheduler[str] = LaneScheduler(max_lanes=8, max_active=2, max_queued=10)
    for lane, item in (("x", "x1"), ("y", "y1"), ("z", "z1"), ("x", "x2"), ("w", "w1")):
        s.admit(lane, item)
    assert list(s.take_ready()) == [("x", "x1"), ("y", "y1")]
    s.finish("x")  # x2 goes behind z and w, which were waiting first
    assert list(s.take_ready()) == [("z", "z1")]
    s.finish("y")
    assert list(s.take_ready()) == [("w", "w1")]
    s.finish("z")
    assert list(s.take_ready()) == [("x", "x2")]
    with pytest.raises(KeyError):
        s.finish("y")  # nothing runs there: a bookkeeping bug must not pass silently


def test_lane_limit_counts_distinct_names_for_good() -> None:
    s: LaneScheduler[int] = LaneScheduler(max_lanes=2, max_active=4, max_queued=10)
    s.admit("a", 1)
    s.admit("b", 2)
    s.admit("a", 3)  # a known name is fine
    s.admit(None, 4)  # the default lane is not a named lane
    with pytest.raises(LaneLimitError) as info:
        s.admit("c", 5)
    assert info.value.limit == 2 and s.queued == 4  # nothing admitted
    while not s.idle:
        for lane, _ in list(s.take_ready()):
            s.finish(lane)
    with pytest.raises(LaneLimitError):  # the count never goes down (as the real service)
        s.admit("c", 6)


def test_backpressure_signal_and_drop() -> None:
    s: LaneScheduler[int] = LaneScheduler(max_lanes=8, max_active=1, max_queued=3)
    s.admit("a", 0)
    assert [i for _, i in s.take_ready()] == [0]
    for i in range(1, 4):
        assert not s.full
        s.admit(str(i), i)
    assert s.full and s.queued == 3  # the session stops reading the socket here
    assert list(s.take_ready()) == []  # the one slot is taken
    assert sorted(s.drop_queued()) == [1, 2, 3]
    assert not s.full and s.queued == 0 and s.lanes == 1 and s.active == 1
    s.finish("a")
    assert s.idle and list(s.take_ready()) == []


def test_scheduler_limits_are_bounded() -> None:
    with pytest.raises(ValueError):
        LaneScheduler(max_lanes=0, max_active=1, max_queued=1)


# -- the previous-response cache (Responses state) ------------------------------------------

def test_connection_cache_keeps_the_latest_per_lane() -> None:
    c = ConnectionCache(limit=3)
    a, b = c.lane("a"), c.lane(None)
    assert isinstance(a, LaneCache)
    a.cache_response({"id": "r1"})
    a.cache_response({"id": "r2"})  # the lane's newer response replaces r1
    b.cache_response({"id": "r3"})
    assert a.cached_response("r1") is None and b.cached_response("r2") == {"id": "r2"}
    c.continuation_failed("other", "r2")  # not that lane's parent: kept
    assert c.get("r2") is not None
    c.continuation_failed("a", "r2")  # a failed same-lane continuation evicts its parent
    assert c.get("r2") is None and len(c) == 1
    for i in range(5):
        c.lane(f"l{i}").cache_response({"id": f"x{i}"})
    assert len(c) == 3  # bounded: the oldest go first
    c.clear()
    a.cache_response({"id": "late"})  # after the connection ended: nothing is kept
    assert len(c) == 0 and c.get("late") is None
    c.lane(None).cache_response({"no": "id"})
    assert len(c) == 0


# -- timers: cancelled ones let go --------------------------------------------------------

async def test_cancelled_timer_releases_its_callback() -> None:
    class Owner:
        def fire(self) -> None:
            raise AssertionError("cancelled")

    clock = FakeClock()
    owner = Owner()
    ref = weakref.ref(owner)
    t = clock.call_later(3600, owner.fire)
    del owner
    gc.collect()
    assert ref() is not None  # the armed timer holds it
    t.cancel()
    gc.collect()
    assert ref() is None  # still in the heap until its deadline, but not holding it
    clock.advance(3600)  # the released callback is never called


# -- the session's timers on a FakeClock ---------------------------------------------------

LONG = 50_000  # loop passes: a FakeClock jumps to the next deadline after a few idle ones


async def test_connection_time_limit_on_the_fake_clock() -> None:
    clock = FakeClock()
    server = mem_server(clock=clock, latency="realistic", ttft_ms=10, itl_ms=1000,
                        output_tokens_mean=100_000, output_tokens_sigma=0,
                        websocket=WebSocketConfig(connection_time_limit_s=120,
                                                  close_timeout_s=5))
    proto, tr, client = await _upgrade(server)
    t0 = clock.now()
    proto.data_received(client.send(TextMessage(data=json.dumps(
        {"type": "response.create", **BASE}))))
    seen: list[Any] = []

    def pull() -> list[Any]:
        client.receive_data(tr.drain_client())
        seen.extend(client.events())
        return seen

    assert await _settle(lambda: any(isinstance(e, CloseConnection) for e in pull()), LONG)
    assert clock.now() - t0 == pytest.approx(120)  # not a moment earlier or later
    texts = [validated(e.data) for e in seen if isinstance(e, TextMessage)]
    deltas = [e for e in texts if e["type"] == "response.output_text.delta"]
    assert len(deltas) > 10  # the response was streaming when the limit came
    assert not any(e["type"].startswith("response.") and e["type"] in (
        "response.completed", "response.incomplete", "response.failed") for e in texts)
    err = texts[-1]
    assert err["type"] == "error" and err["status"] == 400
    assert err["error"]["code"] == "websocket_connection_limit_reached"
    assert "2 minutes" in err["error"]["message"] and "stream_id" not in err
    close = seen[-1]
    assert isinstance(close, CloseConnection) and close.code == 1001
    st = server.app.stats
    assert st.active_streams == 0 and st.active_requests == 0  # released at the limit
    # the client answers the close: the connection ends at once, no timer left behind
    proto.data_received(client.send(close.response()))
    assert tr.closed and clock.now() - t0 == pytest.approx(120)
    assert await _settle(lambda: st.active_websockets == 0, LONG)
    assert clock.pending == 0


async def test_close_timeout_drops_a_client_that_never_answers() -> None:
    clock = FakeClock()
    server = mem_server(clock=clock, websocket=WebSocketConfig(connection_time_limit_s=60,
                                                               close_timeout_s=7))
    proto, tr, client = await _upgrade(server)
    session = proto.upgraded
    ref = weakref.ref(session)
    t0 = clock.now()
    del session
    assert await _settle(lambda: tr.closed, LONG)  # the limit (60 s), then 7 s unanswered
    client.receive_data(tr.drain_client())
    evs = list(client.events())
    assert isinstance(evs[-1], CloseConnection) and evs[-1].code == 1001
    assert clock.now() - t0 == pytest.approx(67)
    assert not tr.aborted  # closed politely (the close frame was sent), not reset
    assert await _settle(lambda: server.app.stats.active_websockets == 0, LONG)
    assert clock.pending == 0
    proto = tr = None  # what the event loop would drop
    gc.collect()
    assert ref() is None  # no timer (nor anything else) keeps a closed session


async def test_a_closed_connection_leaves_no_live_timer() -> None:
    """The client vanishes: the hour-long time limit is cancelled and lets go of the session
    (the heap drops the entry only at its deadline)."""
    clock = FakeClock()
    server = mem_server(clock=clock)
    proto, tr, _client = await _upgrade(server)
    ref = weakref.ref(proto.upgraded)
    assert clock.pending == 1  # connection_time_limit_s (3600 s by default)
    proto.connection_lost(None)
    assert clock.pending == 0 and server.app.stats.active_websockets == 0
    del proto, tr  # what the event loop would drop
    gc.collect()
    assert ref() is None


async def test_connection_churn_does_not_grow_the_timer_heap() -> None:
    """Each connection arms an hour-long time limit; cancelled through the clock, the heap
    drops them instead of holding one entry per closed connection until its deadline."""
    clock = FakeClock()
    live = [clock.call_later(5, lambda: None) for _ in range(10)]
    for _ in range(10_000):
        clock.cancel(clock.call_later(3600, lambda: None))
    assert clock.entries < 200 and clock.pending == 10
    clock.cancel(live[0])
    clock.cancel(live[0])  # twice: a no-op
    assert clock.pending == 9
    fired: list[int] = []
    clock.call_later(1, lambda: fired.append(1))
    clock.advance(1)
    assert fired == [1]  # the heap is still a heap after compactions


async def test_a_closed_connection_leaves_no_heap_entry_behind() -> None:
    clock = FakeClock()
    clock.settle_passes = 10**9  # time stands still: only compaction can drop entries
    clock.call_later(1, lambda: None)  # (the heap's top stays live)
    server = mem_server(clock=clock)
    for _ in range(200):
        proto, _tr, _client = await _upgrade(server)
        proto.connection_lost(None)
    assert server.app.stats.active_websockets == 0
    assert clock.entries < 130  # not 201
