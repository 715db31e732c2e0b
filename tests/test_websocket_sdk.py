"""Responses over WebSocket, judged by the official SDK: ``client.responses.connect()`` (sync
and async) and ``openai.lib.responses_websocket`` sessions. Every received event is validated
against the SDK's ``ResponsesServerEvent`` union (the SDK itself parses WS events unchecked)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from openai import AsyncOpenAI, OpenAI
from openai.lib.responses_websocket import (
    AsyncResponsesWebSocketSession,
    ResponsesWebSocketError,
    ResponsesWebSocketLimits,
    ResponsesWebSocketSession,
)
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter

from . import ws_fake
from .responses_sse import SSE_EVENT, strict_sse_events

WS_EVENT = TypeAdapter(ResponsesServerEvent)
TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}
LIMITS = ResponsesWebSocketLimits(max_lanes=8, max_events_per_lane=512, max_events=2048,
                                  max_bytes_per_lane=1 << 22, max_bytes=1 << 24)
BASE = {"model": "gpt-4o", "input": "Say something."}
# short, fixed-length answers (no max_output_tokens: reaching it would end "incomplete")
SHORT = {"output_tokens_mean": 12, "output_tokens_sigma": 0}


def validated(raw: bytes | str) -> dict[str, Any]:
    """Parse one frame and validate it strictly against the SDK's server-event union."""
    data = json.loads(raw)
    WS_EVENT.validate_python(data, strict=True)
    if data["type"] != "error" and not data["type"].startswith("response.steer"):
        SSE_EVENT.validate_python(data, strict=True)  # the same object as over SSE
    return data


def recv_until_terminal(conn: Any) -> list[dict[str, Any]]:
    out = []
    while True:
        ev = validated(conn.recv_bytes())
        out.append(ev)
        if ev["type"] in TERMINAL:
            return out


async def arecv_until_terminal(conn: Any) -> list[dict[str, Any]]:
    out = []
    while True:
        ev = validated(await conn.recv_bytes())
        out.append(ev)
        if ev["type"] in TERMINAL:
            return out


@pytest.fixture
def wsrv(make_server: Any) -> Any:
    srv = make_server(**SHORT)
    ws_fake.install(srv.app)
    return srv


@pytest.fixture
def wclient(wsrv: Any) -> Any:
    with OpenAI(base_url=wsrv.url + "/v1", api_key="sk-test", max_retries=0,
                _strict_response_validation=True) as c:
        yield c


def check_stream(events: list[dict[str, Any]], stream_id: str | None = None) -> None:
    """Sequence numbers 0..n-1, one response id, created first, completed last."""
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] == "response.completed"
    ids = {e["response"]["id"] for e in events if "response" in e}
    assert len(ids) == 1
    for e in events:
        if stream_id is None:
            assert "stream_id" not in e
        else:
            assert e["stream_id"] == stream_id


def test_sync_create_iterate_and_chain(wclient: Any, wsrv: Any) -> None:
    with wclient.responses.connect() as conn:
        conn.response.create(**BASE)
        first = recv_until_terminal(conn)
        check_stream(first)
        text = "".join(e["delta"] for e in first if e["type"] == "response.output_text.delta")
        assert text
        assert first[-1]["response"]["output"][0]["content"][0]["text"] == text
        rid = first[-1]["response"]["id"]
        # store=false: only the connection-local cache knows rid's state
        conn.response.create(**{**BASE, "store": False}, previous_response_id=rid)
        second = recv_until_terminal(conn)
        check_stream(second)
        assert second[-1]["response"]["previous_response_id"] == rid
        rid2 = second[-1]["response"]["id"]
        conn.response.create(**{**BASE, "store": False}, previous_response_id=rid2)
        third = recv_until_terminal(conn)
        check_stream(third)
        # the SDK's own parser agrees with the validated dicts
        ev = conn.parse_event(orjson.dumps(third[-1]))
        assert ev.type == "response.completed" and ev.response.id == third[-1]["response"]["id"]


def test_store_false_chain_is_connection_local(wclient: Any) -> None:
    with wclient.responses.connect() as conn:
        conn.response.create(**BASE, store=False)
        rid = recv_until_terminal(conn)[-1]["response"]["id"]
    with wclient.responses.connect() as conn:  # a new connection has an empty cache
        conn.response.create(**BASE, previous_response_id=rid)
        (err,) = recv_until_terminal(conn)
        assert err == {"type": "error", "status": 400, "error": {
            "type": "invalid_request_error", "code": "previous_response_not_found",
            "param": "previous_response_id",
            "message": f"Previous response with id '{rid}' not found.",
            **({"headers": err["error"]["headers"]} if "headers" in err["error"] else {})}}
        # the connection stays usable after an error
        conn.response.create(**BASE)
        check_stream(recv_until_terminal(conn))


def test_unknown_previous_response_id_and_bad_request_keep_connection(wclient: Any) -> None:
    with wclient.responses.connect() as conn:
        conn.response.create(**BASE, previous_response_id="resp_doesnotexist")
        (err,) = recv_until_terminal(conn)
        assert err["error"]["code"] == "previous_response_not_found"
        assert err["status"] == 400
        conn.send({"type": "response.create", "input": "no model"})  # type: ignore[typeddict-item]
        (err,) = recv_until_terminal(conn)
        assert err["status"] == 400 and err["error"]["param"] == "model"
        conn.response.create(**BASE, background=True)
        (err,) = recv_until_terminal(conn)
        assert err["status"] == 400 and err["error"]["param"] == "background"
        conn.response.create(**BASE)
        check_stream(recv_until_terminal(conn))


def test_warm_up_generate_false_then_chain(wclient: Any) -> None:
    with wclient.responses.connect() as conn:
        conn.response.create(model="gpt-4o", input="You are terse.", generate=False,
                             store=False)
        warm = recv_until_terminal(conn)
        assert [e["type"] for e in warm] == ["response.created", "response.completed"]
        assert warm[-1]["response"]["output"] == []
        assert warm[-1]["response"]["usage"]["output_tokens"] == 0
        check_stream(warm)
        wid = warm[-1]["response"]["id"]
        conn.response.create(**BASE, previous_response_id=wid, store=False)
        events = recv_until_terminal(conn)
        check_stream(events)
        assert events[-1]["response"]["previous_response_id"] == wid
        assert events[-1]["response"]["usage"]["output_tokens"] > 0


def test_nested_create_form_and_steer(wclient: Any) -> None:
    with wclient.responses.connect() as conn:
        conn.send({"type": "response.create", "response": BASE})  # type: ignore[typeddict-item]
        events = recv_until_terminal(conn)
        check_stream(events)
        rid = events[-1]["response"]["id"]
        conn.response.steer(input="and shorter", previous_response_id=rid)
        ev = validated(conn.recv_bytes())
        assert ev["type"] == "response.steer.failed"
        assert ev["error"]["code"] == "response_already_completed"  # (it has ended)
        assert ev["steer"] == {"input": "and shorter", "previous_response_id": rid}
        conn.response.steer(input="x", previous_response_id="resp_nowhere")
        ev = validated(conn.recv_bytes())
        assert ev["type"] == "response.steer.failed"
        assert ev["error"]["code"] == "response_not_found" and "resp_nowhere" in \
            ev["error"]["message"]


def test_default_lane_is_fifo(wclient: Any) -> None:
    with wclient.responses.connect() as conn:
        for i in range(3):
            conn.response.create(**BASE, metadata={"i": str(i)})
        got = [recv_until_terminal(conn) for _ in range(3)]
        for i, events in enumerate(got):
            check_stream(events)  # one response at a time, never interleaved
            assert events[-1]["response"]["metadata"] == {"i": str(i)}


def test_named_lanes_with_sdk_session(make_server: Any) -> None:
    srv = make_server(latency="realistic", ttft_ms=5, itl_ms=2, **SHORT)
    ws_fake.install(srv.app)
    with OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0) as client:
        with client.responses.connect() as conn, \
                ResponsesWebSocketSession(conn, limits=LIMITS) as session:
            lanes = {name: session.lane(name) for name in ("alpha", "beta.2", "g-3")}
            for lane in lanes.values():
                lane.send({"type": "response.create", **BASE, "store": False})
            finals = {name: lane.get_final_response(timeout=10)
                      for name, lane in lanes.items()}
            assert len({r.id for r in finals.values()}) == 3
            # chain on each lane from its own cached response
            for name, lane in lanes.items():
                lane.send({"type": "response.create", **BASE, "store": False,
                           "previous_response_id": finals[name].id})
            for name, lane in lanes.items():
                r = lane.get_final_response(timeout=10)
                assert r.previous_response_id == finals[name].id
                assert r.status == "completed"
            # an error on a lane raises the SDK's lane error with the original event
            lanes["alpha"].send({"type": "response.create", **BASE,
                                 "previous_response_id": "resp_missing"})
            with pytest.raises(ResponsesWebSocketError) as exc:
                lanes["alpha"].get_final_response(timeout=10)
            assert exc.value.event.error.code == "previous_response_not_found"
            assert exc.value.event.stream_id == "alpha"


def test_stream_id_echoed_on_every_event(wclient: Any) -> None:
    with wclient.responses.connect() as conn:
        conn.response.create(**BASE, stream_id="lane_1")
        events = recv_until_terminal(conn)
        check_stream(events, stream_id="lane_1")
        rid = events[-1]["response"]["id"]
        # fork the cached response onto another lane
        conn.response.create(**BASE, stream_id="fork", previous_response_id=rid, store=False)
        check_stream(recv_until_terminal(conn), stream_id="fork")


async def test_async_create_chain_and_lanes(wsrv: Any) -> None:
    async with AsyncOpenAI(base_url=wsrv.url + "/v1", api_key="sk-test", max_retries=0,
                           _strict_response_validation=True) as client:
        async with client.responses.connect() as conn:
            await conn.response.create(**BASE, store=False)
            first = await arecv_until_terminal(conn)
            check_stream(first)
            await conn.response.create(**BASE, store=False,
                                       previous_response_id=first[-1]["response"]["id"])
            second = await arecv_until_terminal(conn)
            check_stream(second)
            await conn.response.create(model="gpt-4o", input="x", generate=False)
            warm = await arecv_until_terminal(conn)
            assert warm[-1]["response"]["output"] == []
        async with client.responses.connect() as conn:
            async with AsyncResponsesWebSocketSession(conn, limits=LIMITS) as session:
                a, b = session.lane("a"), session.lane("b")
                await a.send({"type": "response.create", **BASE})
                await b.send({"type": "response.create", **BASE})
                ra, rb = await a.get_final_response(), await b.get_final_response()
                assert ra.status == rb.status == "completed" and ra.id != rb.id


_sse_events = strict_sse_events


_VOLATILE = {"id", "item_id", "created_at", "completed_at", "response_id", "previous_response_id"}


def _normalise(x: Any) -> Any:
    """Drop ids and timestamps (the only fields allowed to differ between transports)."""
    if isinstance(x, dict):
        return {k: _normalise(v) for k, v in x.items() if k not in _VOLATILE}
    if isinstance(x, list):
        return [_normalise(v) for v in x]
    return x


def test_sse_and_websocket_carry_the_same_events(wclient: Any, wsrv: Any) -> None:
    body = {"model": "gpt-4o", "input": "Tell me a story.", "temperature": 0.7,
            "max_output_tokens": 40, "reasoning": None}
    sse = _sse_events(wsrv, body)
    with wclient.responses.connect() as conn:
        conn.response.create(**body)
        ws = recv_until_terminal(conn)
    assert [e["type"] for e in ws] == [e["type"] for e in sse]
    assert [e["sequence_number"] for e in ws] == [e["sequence_number"] for e in sse]
    assert _normalise(ws) == _normalise(sse)
