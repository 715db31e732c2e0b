"""Hostile input at the transport: every request is answered and releases what it holds.

Values the encoder cannot write (integers beyond 64 bits, nesting deeper than the encoder's
limit) are refused at validation with a 400 naming the parameter; and should anything still
fail between dispatch and the last byte (here forced by lifting those bounds or by breaking the
encoder), the client gets the 500 envelope or a terminal error event, and the connection,
request and stream counters return to 0 (issue 10, item 1: 1,030 such requests used to exhaust
the fd limit). Also: the write-stall timeout, the Content-Length + Transfer-Encoding shape, HEAD
on a stream, access-log escaping and ``openai-processing-ms`` on protocol errors.

Tier 1 (pump alone), tier 2 (in-memory transport) and tier 3 (real sockets on port 0, raw h11
and wsproto clients, the official SDK)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import os
import re
import socket
from typing import Any

import h11
import openai
import orjson
import pytest
from wsproto.connection import Connection, ConnectionType
from wsproto.events import TextMessage

import llmsim.api.validate as validate
import llmsim.messages as messages
import llmsim.streaming.encode as encode
from llmsim.api.chat import CHAT as CHAT_DIALECT
from llmsim.api.responses import RESPONSES
from llmsim.streaming.clock import FakeClock
from llmsim.streaming.flow import Pump
from llmsim.streaming.stream import EventStream

from . import rawhttp
from .memtransport import connect, mem_server
from .test_websocket_raw import RawWS, handshake, wait_for

RESP = {"model": "gpt-4o", "input": "hi", "max_output_tokens": 16}
CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
DONE = {"response.completed", "response.incomplete"}  # a normal end (16 tokens may cut it)


def gauges(srv: Any) -> tuple[int, ...]:
    st = srv.app.stats
    return (len(srv.server.connections), st.active_connections, st.active_requests,
            st.active_streams, st.active_websockets)


def settled(srv: Any) -> bool:
    """Every connection, request, stream and WebSocket counter is back to 0."""
    return wait_for(lambda: gauges(srv) == (0, 0, 0, 0, 0))


def envelope(r: rawhttp.Resp) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def post(url: str, path: str, body: Any, timeout: float = 5.0) -> rawhttp.Resp:
    """One request on its own connection; a hang fails the test (socket timeout)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    s = rawhttp.connect(url, timeout=timeout)
    try:
        return rawhttp.request(url, "POST", path, raw, sock=s)
    finally:
        s.close()


def nest(levels: int) -> dict[str, Any]:
    """``levels`` nested objects: nest(1) == {}, nest(2) == {"a": {}}."""
    d: dict[str, Any] = {}
    for _ in range(levels - 1):
        d = {"a": d}
    return d


def mcp_tool(depth: int) -> dict[str, Any]:
    """A Responses body nesting exactly ``depth`` levels, deepest in an echoed, otherwise
    uninterpreted field (body → tools → tool → headers → ...)."""
    tool = {"type": "mcp", "server_label": "x", "server_url": "https://mcp.example",
            "headers": nest(depth - 3)}
    return {**RESP, "tools": [tool]}


@pytest.fixture
def lifted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lift the validation bounds so unencodable values reach the renderer (the failure the
    bounds now prevent): what must still hold is that every request is answered."""
    monkeypatch.setattr(validate, "INT_MAX", 1 << 200)
    monkeypatch.setattr(messages, "MAX_JSON_DEPTH", 10**6)
    logging.getLogger("llmsim").disabled = True  # one traceback per forced failure
    yield
    logging.getLogger("llmsim").disabled = False


# -- validation: unencodable values are a 400 naming the parameter ------------------------------

@pytest.mark.parametrize("path,body,param", [
    ("/v1/responses", {**RESP, "max_tool_calls": 1e30}, "max_tool_calls"),
    ("/v1/responses", {**RESP, "max_tool_calls": 1e30, "stream": True}, "max_tool_calls"),
    ("/v1/responses", {**RESP, "max_output_tokens": 2e19}, "max_output_tokens"),
    ("/v1/responses", {**RESP, "top_logprobs": -1e300}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "seed": 1e30}, "seed"),
    ("/v1/chat/completions", {**CHAT, "seed": -1e19, "stream": True}, "seed"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 1e30}, "max_tokens"),
])
def test_integers_beyond_64_bits_are_a_400(srv: Any, path: str, body: dict[str, Any],
                                           param: str) -> None:
    r = post(srv.url, path, body)
    assert r.status == 400, r.body
    err = envelope(r)
    assert err["param"] == param
    assert err["code"] in ("integer_above_max_value", "integer_below_min_value")
    assert "e+" in err["message"]  # the value as sent (1e+30), not a 31-digit integer
    assert settled(srv)


def test_int64_bounds_are_inclusive(srv: Any) -> None:
    for seed in ((1 << 63) - 1, -(1 << 63)):
        r = post(srv.url, "/v1/chat/completions", {**CHAT, "seed": seed})
        assert r.status == 200, r.body
    r = post(srv.url, "/v1/chat/completions", {**CHAT, "seed": 1 << 63})
    assert r.status == 400 and envelope(r)["param"] == "seed"


def test_sdk_sees_the_400(client: Any) -> None:
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model="gpt-4o", input="hi", max_tool_calls=10**30)
    assert ei.value.param == "max_tool_calls"  # type: ignore[attr-defined]


def test_nesting_bound_is_exact_and_names_the_key(srv: Any) -> None:
    limit = messages.MAX_JSON_DEPTH
    ok = post(srv.url, "/v1/responses", mcp_tool(limit))
    assert ok.status == 200, ok.body  # the deepest accepted body also renders
    assert ok.json()["tools"][0]["server_label"] == "x"
    r = post(srv.url, "/v1/responses", mcp_tool(limit + 1))
    assert r.status == 400
    err = envelope(r)
    assert err["param"] == "tools" and err["code"] == "nesting_above_max_depth"
    # a top-level array: no key to name
    deep = b"[" * (limit + 1) + b"]" * (limit + 1)
    r = post(srv.url, "/v1/chat/completions", deep)
    assert r.status == 400 and envelope(r)["param"] is None
    shallow = b"[" * limit + b"]" * limit
    r = post(srv.url, "/v1/chat/completions", shallow)
    assert r.status == 400 and envelope(r)["code"] != "nesting_above_max_depth"
    # far beyond the encoder's 255 levels, on chat and Responses, JSON and stream
    for path, body in (("/v1/chat/completions", {**CHAT, "messages": [nest(300)]}),
                       ("/v1/responses", {**mcp_tool(400), "stream": True})):
        r = post(srv.url, path, body)
        assert r.status == 400, r.body
        assert envelope(r)["code"] == "nesting_above_max_depth"
    assert settled(srv)


def test_websocket_refuses_unencodable_values_and_goes_on(srv: Any) -> None:
    c = RawWS(srv.url)
    try:
        c.send_json({"type": "response.create", **RESP, "max_tool_calls": 1e30,
                     "stream_id": "a"})
        ev = c.recv_json()
        assert ev["type"] == "error" and ev["error"]["param"] == "max_tool_calls"
        assert ev["stream_id"] == "a"
        deep = nest(300)
        c.send_json({"type": "response.create", **RESP, "metadata": deep})
        ev = c.recv_json()
        assert ev["type"] == "error"
        assert ev["error"]["code"] == "nesting_above_max_depth"
        assert ev["error"]["param"] == "metadata"
        c.send_json({"type": "response.steer", "previous_response_id": "resp_x",
                     "input": [nest(300)]})  # echoed by steer.failed: refused first
        assert c.recv_json()["error"]["param"] == "input"
        c.send_json({"type": "response.create", **RESP, "stream_id": "a"})
        assert c.until_terminal()[-1]["type"] in DONE  # the lane is fine
        st = srv.app.stats
        assert wait_for(lambda: (st.active_requests, st.active_streams) == (0, 0))
    finally:
        c.close()
    assert settled(srv)


# -- structural: anything that fails after dispatch is still answered ----------------------------

@pytest.mark.parametrize("latency", ["instant", "realistic"])  # eager first step / Task
def test_render_failure_is_answered_over_http(make_server: Any, lifted: None,
                                              latency: str) -> None:
    srv = make_server(latency=latency, ttft_ms=1, itl_ms=1)
    r = post(srv.url, "/v1/responses", {**RESP, "max_tool_calls": 1e30})
    assert r.status == 500 and envelope(r)["code"] == "server_error"
    r = post(srv.url, "/v1/responses", mcp_tool(300))  # deeper than orjson writes
    assert r.status == 500 and envelope(r)["code"] == "server_error"
    # a stream: the Response it echoes is rendered once, before its head (the events splice
    # those bytes), so it is refused as the JSON answer is; a failure after the head is a
    # terminal error event (tests/test_token_runs.py, test_clock_outbox.py, the WebSocket
    # case below)
    r = post(srv.url, "/v1/responses", {**RESP, "max_tool_calls": 1e30, "stream": True})
    assert r.status == 500 and envelope(r)["code"] == "server_error"
    assert settled(srv), gauges(srv)


def test_1100_failing_requests_do_not_leak(make_server: Any, lifted: None) -> None:
    """The issue's fd exhaustion (~1,030 requests) with a margin: each on a new connection,
    JSON and stream alternately, each answered; nothing is left open."""
    srv = make_server()
    fds = len(os.listdir("/proc/self/fd"))
    bad = json.dumps({**RESP, "max_tool_calls": 1e30}).encode()
    bad_stream = json.dumps({**RESP, "max_tool_calls": 1e30, "stream": True}).encode()
    for i in range(1100):
        r = post(srv.url, "/v1/responses", bad_stream if i % 2 else bad)
        assert r.status == 500
    assert settled(srv), gauges(srv)
    assert len(os.listdir("/proc/self/fd")) <= fds + 5
    assert rawhttp.request(srv.url, "GET", "/health").status == 200


def test_websocket_render_failure_is_an_error_event(make_server: Any, lifted: None) -> None:
    srv = make_server(latency="realistic", ttft_ms=1, itl_ms=1)
    c = RawWS(srv.url)
    try:
        c.send_json({"type": "response.create", **RESP, "max_tool_calls": 1e30,
                     "stream_id": "a"})
        c.send_json({"type": "response.create", **RESP, "stream_id": "a"})  # queued behind
        ev = c.recv_json()  # validated as the SDK's ResponseWsError
        assert ev["type"] == "error" and ev["error"]["code"] == "server_error"
        assert ev["stream_id"] == "a" and ev["status"] == 500
        assert c.until_terminal()[-1]["type"] in DONE  # lane not wedged
        st = srv.app.stats
        assert wait_for(lambda: (st.active_requests, st.active_streams) == (0, 0))
    finally:
        c.close()
    assert settled(srv)


def _fail_on(n: int, real: Any) -> Any:
    """An encoder that raises on its ``n``-th call (an event it cannot represent)."""
    calls = [0]

    def enc(etype: str, data: Any) -> bytes:
        calls[0] += 1
        if calls[0] == n:
            raise TypeError("Integer exceeds 64-bit range")
        return real(etype, data)

    return enc


@pytest.mark.parametrize("latency", ["instant", "realistic"])
def test_encoder_failure_mid_stream_sdk(make_server: Any, monkeypatch: pytest.MonkeyPatch,
                                        latency: str) -> None:
    """The encoder breaks after the stream started: the official SDK sees a terminal error
    (Responses: an ``error`` event; chat: the error chunk, raised as APIError)."""
    srv = make_server(latency=latency, ttft_ms=1, itl_ms=1)
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-x", max_retries=0,
                           _strict_response_validation=True)
    logging.getLogger("llmsim").disabled = True
    try:
        monkeypatch.setattr(RESPONSES, "sse", _fail_on(5, encode.sse_responses))
        events = list(client.responses.create(model="gpt-4o", input="hi", stream=True))
        assert [e.type for e in events][-1] == "error"
        assert events[-1].sequence_number == 4  # the number of the event that failed
        assert len(events) == 5
        monkeypatch.setattr(CHAT_DIALECT, "sse", _fail_on(3, encode.sse_chat))
        got = []
        with pytest.raises(openai.APIError, match="server had an error"):
            for chunk in client.chat.completions.create(model="gpt-4o", messages=[
                    {"role": "user", "content": "hi"}], max_tokens=20, stream=True):
                got.append(chunk)
        assert len(got) == 2
    finally:
        logging.getLogger("llmsim").disabled = False
        client.close()
    assert settled(srv), gauges(srv)
    assert srv.app.stats.stream_ends["error"] == 2
    # the connection pool reused a connection after the clean end: both were answered
    assert srv.app.stats.connections_total <= 2


def test_encoder_failure_mid_stream_websocket(make_server: Any,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    srv = make_server(latency="realistic", ttft_ms=1, itl_ms=1)
    monkeypatch.setattr(RESPONSES, "ws", _fail_on(4, encode.ws_text))
    logging.getLogger("llmsim").disabled = True
    c = RawWS(srv.url)
    try:
        c.send_json({"type": "response.create", **RESP, "stream_id": "s"})
        c.send_json({"type": "response.create", **RESP, "stream_id": "s"})
        first = c.until_terminal()
        assert [e["type"] for e in first][:3] == ["response.created", "response.in_progress",
                                                  "response.output_item.added"]
        err = first[-1]
        assert err["type"] == "error" and err["stream_id"] == "s"
        assert err["sequence_number"] == 3 and err["error"]["code"] == "server_error"
        assert c.until_terminal()[-1]["type"] in DONE
    finally:
        logging.getLogger("llmsim").disabled = False
        c.close()
    assert settled(srv)


async def test_pump_failure_writes_terminal_frame_and_releases() -> None:
    """Tier 1: the plan raising (not only the encoder) ends the stream the same way."""
    closed: list[bool] = []

    def plan():  # type: ignore[no-untyped-def]
        try:
            yield 0.0, "response.created", {"type": "response.created"}
            yield 0.1, "response.in_progress", {"type": "response.in_progress"}
            raise RuntimeError("plan bug")
        finally:
            closed.append(True)

    class Sink:
        paused = False
        frames: list[bytes] = []

        def write_events(self, frames: list[bytes]) -> None:
            self.frames.extend(frames)

        def abort(self) -> None:
            raise AssertionError("not a broken sink")

    clock = FakeClock(start=0.0)
    sink = Sink()
    reasons: list[str] = []
    done = asyncio.Event()
    p = Pump(EventStream(plan(), RESPONSES), clock, encode.sse_responses, sink,
             lambda r: (reasons.append(r), done.set()),
             error_frame=RESPONSES.sse_error)
    logging.getLogger("llmsim").disabled = True
    try:
        p.start()
        await asyncio.wait_for(done.wait(), 5)
    finally:
        logging.getLogger("llmsim").disabled = False
    assert reasons == ["error"] and closed == [True] and clock.pending == 0
    evs = rawhttp.parse_sse(b"".join(sink.frames))
    assert [e for e, _ in evs] == ["response.created", "response.in_progress", "error"]
    assert json.loads(evs[-1][1])["sequence_number"] == 2


# -- write-stall timeout --------------------------------------------------------------------

def _fake_loop_time(server: Any) -> list[float]:
    now = [1000.0]
    server._loop_time = lambda: now[0]
    return now


def _unread_stream(stall_s: int, tokens: int) -> tuple[Any, list[float], Any, Any]:
    """A server on a fake loop time with one chat stream of ``tokens`` to a client whose
    transport pauses at 4 KiB (it reads nothing until the test drains it)."""
    server = mem_server(write_stall_timeout_s=stall_s, max_tokens_mode="exact")
    now = _fake_loop_time(server)
    proto, tr = connect(server, high_water=4096)
    body = orjson.dumps({**CHAT, "max_tokens": tokens, "stream": True})
    proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d"
                        b"\r\n\r\n%s" % (len(body), body))
    return server, now, proto, tr


async def test_write_stall_cuts_a_stream_that_is_never_read() -> None:
    server, now, proto, tr = _unread_stream(5, 5000)
    for _ in range(20):
        await asyncio.sleep(0)
    st = server.app.stats
    assert tr.paused and st.active_streams == 1  # the client reads nothing
    now[0] += 4.9
    server._sweep()
    assert not tr.closed  # not yet
    now[0] += 0.2
    server._sweep()
    assert tr.aborted  # aborted: a graceful close would wait for the unread buffer
    await asyncio.sleep(0)
    assert (st.active_streams, st.active_requests, st.active_connections) == (0, 0, 0)
    assert st.stream_ends["write_stall"] == 1 and st.errors["write_stall"] == 1
    assert server.app.clock.pending == 0


async def test_a_slow_reader_that_drains_is_not_cut() -> None:
    server, now, proto, tr = _unread_stream(5, 3000)
    received = b""
    for _ in range(5000):
        await asyncio.sleep(0)
        if tr.paused:
            now[0] += 4  # each pause lasts 4 s < 5 s, then the client reads
            server._sweep()
            received += tr.drain_client()
        if received.endswith(b"0\r\n\r\n"):
            break
    assert not tr.closed and received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert server.app.stats.active_streams == 0


async def test_write_stall_off_with_zero() -> None:
    server, now, proto, tr = _unread_stream(0, 3000)
    for _ in range(20):
        await asyncio.sleep(0)
    assert tr.paused
    now[0] += 10**6
    server._sweep()
    assert not tr.closed
    proto.connection_lost(None)


async def test_write_stall_cuts_a_websocket() -> None:
    from . import ws_fake

    server = mem_server(write_stall_timeout_s=5)
    ws_fake.install(server.app)
    now = _fake_loop_time(server)
    proto, tr = connect(server, high_water=8192)
    client = Connection(ConnectionType.CLIENT)
    msgs = b"".join(client.send(TextMessage(data=json.dumps(
        {"type": "response.create", "model": "gpt-4o", "input": "hi", "stream_id": sid,
         "max_output_tokens": 3000}))) for sid in ("a", "b"))
    proto.data_received(handshake() + msgs)
    for _ in range(20):
        await asyncio.sleep(0)
    st = server.app.stats
    assert tr.paused and st.active_streams == 2 and st.active_websockets == 1
    now[0] += 6
    server._sweep()
    assert tr.aborted
    await asyncio.sleep(0)
    assert (st.active_streams, st.active_requests, st.active_websockets,
            st.active_connections) == (0, 0, 0, 0)
    assert st.stream_ends["write_stall"] == 2


# -- HTTP hygiene --------------------------------------------------------------------------------

def _read_until_closed(s: socket.socket) -> bytes:
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            return out
        out += b


def test_content_length_with_transfer_encoding_is_answered_then_closed(srv: Any) -> None:
    body = json.dumps(CHAT).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    s = rawhttp.connect(srv.url)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
              b"application/json\r\ncontent-length: 4\r\ntransfer-encoding: chunked\r\n\r\n"
              + chunked + b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    out = _read_until_closed(s)  # the server closes (a timeout here fails the test)
    s.close()
    assert out.startswith(b"HTTP/1.1 200 ")
    head = out.split(b"\r\n\r\n", 1)[0].lower()
    assert b"\r\nconnection: close" in head
    assert out.count(b"HTTP/1.1 ") == 1  # the smuggled-looking follower is not served
    # an ordinary keep-alive request is unaffected
    s = rawhttp.connect(srv.url)
    conn = h11.Connection(h11.CLIENT)
    for _ in range(2):
        r = rawhttp.request(srv.url, "POST", "/v1/chat/completions", CHAT, sock=s, conn=conn)
        assert r.status == 200 and "connection" not in r.headers
    s.close()
    assert settled(srv)


def test_head_never_carries_a_body(srv: Any) -> None:
    rid = post(srv.url, "/v1/responses", RESP).json()["id"]
    s = rawhttp.connect(srv.url)
    s.sendall(f"HEAD /v1/responses/{rid}?stream=true HTTP/1.1\r\nhost: x\r\n\r\n"
              "HEAD /v1/responses/resp_nope HTTP/1.1\r\nhost: x\r\n\r\n"
              "GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
    out = _read_until_closed(s)
    s.close()
    parts = out.split(b"\r\n\r\n")
    assert parts[0].startswith(b"HTTP/1.1 200 ")
    assert b"content-type: text/event-stream" in parts[0].lower()
    assert parts[1].startswith(b"HTTP/1.1 404 ")  # no SSE body between the two heads
    assert parts[2].startswith(b"HTTP/1.1 200 ")  # nor an error body before the third
    assert parts[3] == b'{"status":"ok"}' or parts[3].startswith(b'{"status"')
    assert b"event:" not in out and b"data:" not in out and b'"error"' not in out
    st = srv.app.stats
    assert wait_for(lambda: st.active_streams == 0 and st.active_requests == 0)
    # an error decided before the body (413) is answered too, head only (h11 refused the
    # body and the connection was dropped without an answer)
    out = rawhttp.raw(srv.url, b"HEAD /health HTTP/1.1\r\nhost: x\r\n"
                      b"content-length: 999999999\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 413 ") and out.endswith(b"\r\n\r\n")
    assert int(re.search(rb"content-length: (\d+)", out).group(1)) > 0  # type: ignore[union-attr]


def test_access_log_escapes_client_fields(srv: Any) -> None:
    from llmsim.state.logs import setup_logging

    forged = 'gpt-x\n127.0.0.1:1 "GET /admin HTTP/1.1" 200 model=evil\r\\'
    buf = io.StringIO()
    h = setup_logging("info", "plain", buf)
    try:
        r = post(srv.url, "/v1/chat/completions", {**CHAT, "model": forged})
        assert r.status == 200 and r.json()["model"] == forged  # echoed as sent
        assert wait_for(lambda: "chat/completions" in buf.getvalue())
    finally:
        logger = logging.getLogger("llmsim")
        logger.removeHandler(h)
        logger.setLevel(logging.WARNING)
    lines = [ln for ln in buf.getvalue().splitlines() if "llmsim.access" in ln]
    assert len(lines) == 1, buf.getvalue()
    assert not any(ln.startswith("127.0.0.1:1") for ln in buf.getvalue().splitlines())
    assert 'model=gpt-x\\n127.0.0.1:1\\x20\\"GET\\x20/admin' in lines[0]
    assert lines[0].endswith(tuple("0123456789abcdef"))  # ends with the request id


def test_processing_ms_is_sane_on_protocol_errors(srv: Any) -> None:
    # malformed from the first byte: no request was processed, so no processing time
    out = rawhttp.raw(srv.url, b"GET / HTTP/1.1\r\nbad header line\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 ")
    assert b"openai-processing-ms" not in out.lower()
    # after a keep-alive request: the previous request's start must not leak into it
    s = rawhttp.connect(srv.url)
    conn = h11.Connection(h11.CLIENT)
    ok = rawhttp.request(srv.url, "GET", "/health", sock=s, conn=conn)
    s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
    out = _read_until_closed(s)
    s.close()
    assert out.startswith(b"HTTP/1.1 400 ")
    assert b"openai-processing-ms" not in out.lower()
    rid = re.search(rb"x-request-id: (\S+)", out)
    assert rid and rid.group(1).decode() != ok.headers["x-request-id"]
    # a parsed head with an error (413) has a small, real value
    big = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 999999999\r\n\r\n"
    out = rawhttp.raw(srv.url, big)
    m = re.search(rb"openai-processing-ms: (\d+)", out)
    assert out.startswith(b"HTTP/1.1 413 ") and m and int(m.group(1)) < 10_000
