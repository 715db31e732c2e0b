"""Faults, rate limits and capacity on the Responses API: SSE over HTTP (in-memory protocol,
exact events) and WebSocket frames (raw wsproto client on a real socket, driven by scenario
rules with ``transport: "ws"``)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from llmsim.api.faults import CAPACITY
from llmsim.api.validate import SERVING
from llmsim.config import CapacityConfig, RateLimitConfig
from llmsim.streaming.clock import FakeClock

from . import rawhttp
from .faultkit import exchange, server
from .test_websocket_raw import RawWS

RESP = {"model": "gpt-4o", "input": "Hello there", "stream": True}
SHORT = {"output_tokens_mean": 8, "output_tokens_sigma": 0}
TERMINALS = {"response.completed", "response.failed", "response.incomplete"}


def types(ex: Any) -> list[str]:
    return [e for e, _d in ex.sse()]


def deltas(ex: Any) -> list[str]:
    return [d["delta"] for e, d in ex.sse() if e == "response.output_text.delta"]


def _seq_ok(ex: Any) -> None:
    seqs = [d["sequence_number"] for _e, d in ex.sse()]
    assert seqs == list(range(len(seqs)))


# ------------------------------------------------------------------------------ SSE
@pytest.mark.parametrize("fault,status", [("429", 429), ("500", 500), ("503", 503),
                                          ("529", 529), ("504", 504)])
async def test_status_faults_before_the_first_event(fault: str, status: int) -> None:
    ex = await exchange(server(**SHORT), RESP, [("x-llmsim-fault", fault)], path="/v1/responses")
    assert ex.status == status and ex.headers["content-type"] == "application/json"
    assert set(ex.json()["error"]) == {"message", "type", "param", "code"}


async def test_reset_and_hang() -> None:
    srv = server(FakeClock(), **SHORT)
    ex = await exchange(srv, RESP, [("x-llmsim-fault", "reset")], path="/v1/responses")
    assert ex.aborted and ex.body == b""
    ex = await exchange(srv, RESP, [("x-llmsim-fault", "hang:1000:504")], path="/v1/responses")
    assert ex.status == 504


async def test_disconnect_after_n_tokens() -> None:
    ex = await exchange(server(**SHORT), RESP, [("x-llmsim-fault", "disconnect-after:3")],
                        path="/v1/responses")
    assert ex.status == 200 and ex.aborted and not ex.complete
    assert len(deltas(ex)) == 3 and not TERMINALS & set(types(ex))
    _seq_ok(ex)


async def test_truncate_after_n_tokens() -> None:
    ex = await exchange(server(**SHORT), RESP, [("x-llmsim-fault", "truncate-after:3")],
                        path="/v1/responses")
    assert ex.complete and not ex.aborted
    assert len(deltas(ex)) == 3 and not TERMINALS & set(types(ex))
    assert types(ex)[-1] == "response.output_text.delta"
    _seq_ok(ex)


async def test_truncate_beyond_the_stream_drops_the_terminal_only() -> None:
    ex = await exchange(server(**SHORT), RESP, [("x-llmsim-fault", "truncate-after:999")],
                        path="/v1/responses")
    assert ex.complete and len(deltas(ex)) == 8
    assert "response.output_item.done" in types(ex) and not TERMINALS & set(types(ex))


async def test_error_after_n_tokens_is_response_failed() -> None:
    ex = await exchange(server(**SHORT), RESP, [("x-llmsim-fault", "error-after:2")],
                        path="/v1/responses")
    assert ex.complete and len(deltas(ex)) == 2
    last_type, last = ex.sse()[-1]
    assert last_type == "response.failed"
    assert last["response"]["status"] == "failed"
    assert last["response"]["error"]["code"] == "server_error"
    _seq_ok(ex)


async def test_stall_after_n_tokens_on_fake_clock() -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10, **SHORT)
    t0 = clock.now()
    ex = await exchange(srv, RESP, [("x-llmsim-fault", "stall-after:2:3000")],
                        path="/v1/responses")
    assert ex.complete and types(ex)[-1] == "response.completed"
    times = [round(t - t0, 6) for t, c in zip(ex.times, ex.chunks, strict=True)
             for _ in range(c.count(b"event: response.output_text.delta"))]
    gaps = [round(b - a, 6) for a, b in zip(times, times[1:], strict=False)]
    assert gaps == [0.01, 3.01, 0.01, 0.01, 0.01, 0.01, 0.01]


def test_sdk_responses_stream_sees_failed_and_truncated(make_server: Any) -> None:
    from openai import OpenAI

    st = make_server(**SHORT)
    with OpenAI(base_url=st.url + "/v1", api_key="sk-test", max_retries=0,
                _strict_response_validation=True) as c:
        evs = list(c.responses.create(model="gpt-4o", input="hi", stream=True,
                                      extra_headers={"X-LLMSim-Fault": "error-after:2"}))
        assert evs[-1].type == "response.failed"
        with c.responses.stream(model="gpt-4o", input="hi",
                                extra_headers={"X-LLMSim-Fault": "truncate-after:2"}) as s:
            for _ in s:
                pass
            with pytest.raises(RuntimeError, match="response.completed"):
                s.get_final_response()


async def test_rate_limit_and_context_window_on_responses() -> None:
    srv = server(FakeClock(), ratelimit=RateLimitConfig(rpm=1), **SHORT)
    ok = await exchange(srv, RESP, path="/v1/responses")
    assert ok.status == 200 and ok.headers["x-ratelimit-remaining-requests"] == "0"
    no = await exchange(srv, RESP, path="/v1/responses")
    assert no.status == 429 and no.headers["retry-after"] == "60"
    big = {**RESP, "model": "gpt-4", "input": "hello " * 9000}
    ex = await exchange(server(**SHORT), big, path="/v1/responses")
    assert ex.status == 400 and ex.json()["error"]["code"] == "context_length_exceeded"


async def test_capacity_waves_on_responses() -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=1, itl_slope=1.0), **SHORT)
    t0 = clock.now()
    exs = await asyncio.gather(*(exchange(srv, RESP, path="/v1/responses") for _ in range(3)))
    assert all(types(ex)[-1] == "response.completed" for ex in exs)
    ends = sorted(round(ex.times[-1] - t0, 6) for ex in exs)
    assert ends == [0.17, 0.34, 0.51]  # 100 ms + 7 gaps of 10 ms, one at a time
    eng = srv.app.feature(SERVING).engines["gpt-4o"][0]  # (on the serving scheduler)
    assert not eng.running and eng.success == {"stop": 3}
    assert srv.app.feature(CAPACITY).engines == {}


# ------------------------------------------------------------------------------ WebSocket
@pytest.fixture
def wsrv(make_server: Any) -> Any:
    return make_server(**SHORT)


def _rule(srv: Any, fault: str, **kw: Any) -> None:
    r = rawhttp.request(srv.url, "POST", "/llmsim/faults",
                        {"fault": fault, "transport": "ws", "count": 1, **kw})
    assert r.status == 200, r.body


def _create(ws: Any) -> None:
    ws.send_json({"type": "response.create", "model": "gpt-4o", "input": "Hello"})


def _events(ws: Any) -> list[dict[str, Any]]:
    out = []
    while True:
        ev = ws.recv_json()
        out.append(ev)
        if ev["type"] in TERMINALS | {"error"}:
            return out


@pytest.mark.parametrize("fault,status", [("429", 429), ("500", 500), ("503", 503),
                                          ("529", 529), ("504", 504)])
def test_ws_status_faults_are_error_events_and_the_connection_lives(wsrv: Any, fault: str,
                                                                    status: int) -> None:
    _rule(wsrv, fault)
    ws = RawWS(wsrv.url)
    try:
        _create(ws)
        ev = ws.recv_json()
        assert ev["type"] == "error" and ev["status"] == status
        assert set(ev["error"]) >= {"type", "code", "message", "param"}
        _create(ws)  # the rule is spent: the next response completes on the same connection
        assert _events(ws)[-1]["type"] == "response.completed"
    finally:
        ws.close()


def test_ws_error_after_is_response_failed(wsrv: Any) -> None:
    _rule(wsrv, "error-after:2")
    ws = RawWS(wsrv.url)
    try:
        _create(ws)
        evs = _events(ws)
        assert evs[-1]["type"] == "response.failed"
        assert len([e for e in evs if e["type"] == "response.output_text.delta"]) == 2
        _create(ws)
        assert _events(ws)[-1]["type"] == "response.completed"
    finally:
        ws.close()


def test_ws_truncate_then_next_response(wsrv: Any) -> None:
    _rule(wsrv, "truncate-after:2")
    ws = RawWS(wsrv.url)
    try:
        _create(ws)
        first = [ws.recv_json() for _ in range(6)]
        kinds = [e["type"] for e in first]
        assert kinds.count("response.output_text.delta") == 2
        _create(ws)  # no terminal came for the first; the next one runs to completion
        evs = _events(ws)
        assert evs[-1]["type"] == "response.completed"
        assert evs[-1]["response"]["id"] != first[0]["response"]["id"]
    finally:
        ws.close()


@pytest.mark.parametrize("fault", ["reset", "disconnect-after:2", "hang:50"])
def test_ws_connection_drops(wsrv: Any, fault: str) -> None:
    _rule(wsrv, fault)
    ws = RawWS(wsrv.url)
    try:
        _create(ws)
        got: list[Any] = []
        with pytest.raises((ConnectionError, OSError, AssertionError)):
            for _ in range(200):
                got.append(ws.next_event())
                if not isinstance(got[-1], str):
                    raise ConnectionError("closed")
        assert not any('"response.completed"' in g for g in got if isinstance(g, str))
    finally:
        ws.close()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and wsrv.app.stats.active_connections:
        time.sleep(0.01)
    assert wsrv.app.stats.active_streams == 0
