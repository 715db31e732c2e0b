"""The HTTP transport's one outbound path (protocol._out): HEAD and no-body statuses, HTTP/1.0
framing, pipelining through the per-request Exchange, timers on the app's clock, no leaks.

Tier 3 (real sockets on port 0, raw h11 clients: h11 knows a HEAD answer has no body, so a
body the server sent anyway would be read as a malformed next response) and tier 2 (the
in-memory transport, on a FakeClock where time is the subject)."""

from __future__ import annotations

import asyncio
import gc
import re
import weakref
from typing import Any

import h11
import orjson
import pytest

from llmsim.streaming.clock import FakeClock
from llmsim.transport.http import HTTPProtocol, Phase, header_bytes

from . import rawhttp
from .memtransport import connect, mem_server

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
RESP = {"model": "gpt-4o", "input": "hi", "max_output_tokens": 16}


def _events(sock: Any, conn: h11.Connection) -> tuple[h11.Response, bytes]:
    """Read one whole response with the h11 client: its head and its body bytes."""
    head: h11.Response | None = None
    body = b""
    while True:
        ev = conn.next_event()
        if ev is h11.NEED_DATA:
            conn.receive_data(sock.recv(65536))
            continue
        if isinstance(ev, h11.Response):
            head = ev
        elif isinstance(ev, h11.Data):
            body += bytes(ev.data)
        elif isinstance(ev, h11.EndOfMessage):
            assert head is not None
            conn.start_next_cycle()
            return head, body
        else:
            raise AssertionError(f"unexpected {ev!r}")


def _send(conn: h11.Connection, method: str, path: str, body: Any = None) -> bytes:
    raw = b"" if body is None else orjson.dumps(body)
    hs = [("host", "x"), ("content-type", "application/json"),
          ("content-length", str(len(raw)))]
    return (conn.send(h11.Request(method=method, target=path, headers=hs))
            + conn.send(h11.Data(data=raw)) + conn.send(h11.EndOfMessage()))


def _hdrs(head: h11.Response) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in head.headers}


def test_head_on_a_streaming_chat_request_sends_no_body_and_keeps_the_connection(srv: Any) -> None:
    s = rawhttp.connect(srv.url)
    c = h11.Connection(h11.CLIENT)
    s.sendall(_send(c, "HEAD", "/v1/chat/completions", {**CHAT, "stream": True}))
    head, body = _events(s, c)
    assert head.status_code == 405 and body == b""
    hs = _hdrs(head)
    assert int(hs["content-length"]) > 0  # the length GET would get, no bytes
    assert "connection" not in hs
    # the same connection goes on: a streaming POST, then a plain one
    s.sendall(_send(c, "POST", "/v1/chat/completions", {**CHAT, "stream": True}))
    head, body = _events(s, c)
    assert head.status_code == 200 and body.endswith(b"data: [DONE]\n\n")
    s.sendall(_send(c, "POST", "/v1/chat/completions", CHAT))
    head, body = _events(s, c)
    assert head.status_code == 200 and orjson.loads(body)["object"] == "chat.completion"
    s.close()
    assert srv.app.stats.connections_total == 1


def test_head_on_a_stream_and_a_complete_response_then_keep_alive(srv: Any) -> None:
    s = rawhttp.connect(srv.url)
    c = h11.Connection(h11.CLIENT)
    s.sendall(_send(c, "POST", "/v1/responses", RESP))
    head, body = _events(s, c)
    rid = orjson.loads(body)["id"]
    # GET /v1/responses/{id}?stream=true is a stream: HEAD gets its head, no event
    s.sendall(_send(c, "HEAD", f"/v1/responses/{rid}?stream=true"))
    head, body = _events(s, c)
    hs = _hdrs(head)
    assert head.status_code == 200 and body == b""
    assert hs["content-type"].startswith("text/event-stream")
    assert hs["transfer-encoding"] == "chunked" and "connection" not in hs
    # a complete response: HEAD gets the Content-Length of the GET body, and no body
    s.sendall(_send(c, "GET", f"/v1/responses/{rid}"))
    _, get_body = _events(s, c)
    s.sendall(_send(c, "HEAD", f"/v1/responses/{rid}"))
    head, body = _events(s, c)
    assert head.status_code == 200 and body == b""
    assert int(_hdrs(head)["content-length"]) == len(get_body)
    s.sendall(_send(c, "GET", "/health"))
    head, body = _events(s, c)
    assert head.status_code == 200 and body.startswith(b'{"status"')
    s.close()
    st = srv.app.stats
    assert st.connections_total == 1
    assert st.active_streams == 0 and st.active_requests <= 1


def test_pipelined_mixed_requests_answered_in_order(srv: Any) -> None:
    s = rawhttp.connect(srv.url)
    c = h11.Connection(h11.CLIENT)
    # h11's client sends one request at a time: write the pipeline by hand
    out = b""
    for method, path, body in [("POST", "/v1/chat/completions", {**CHAT, "stream": True}),
                               ("HEAD", "/health", None),
                               ("POST", "/v1/chat/completions", CHAT),
                               ("GET", "/nope", None),
                               ("GET", "/health", None)]:
        tmp = h11.Connection(h11.CLIENT)
        out += _send(tmp, method, path, body)
    s.sendall(out)
    # read them with one client connection that expects the same sequence
    seen = []
    for method, path in [("POST", "/v1/chat/completions"), ("HEAD", "/health"),
                         ("POST", "/v1/chat/completions"), ("GET", "/nope"),
                         ("GET", "/health")]:
        c.send(h11.Request(method=method, target=path, headers=[("host", "x"),
                                                                ("content-length", "0")]))
        c.send(h11.EndOfMessage())
        head, body = _events(s, c)
        seen.append((head.status_code, body[:14]))
    s.close()
    assert [st for st, _ in seen] == [200, 200, 200, 404, 200]
    assert seen[0][1].startswith(b"data: {") and seen[1][1] == b""
    assert seen[2][1].startswith(b'{"id":"chatcmp') and seen[4][1].startswith(b'{"status"')


def test_http10_answers_are_close_delimited_or_sized_then_closed(srv: Any) -> None:
    body = orjson.dumps({**CHAT, "stream": True})
    out = rawhttp.raw(srv.url, b"POST /v1/chat/completions HTTP/1.0\r\ncontent-length: %d\r\n"
                      b"\r\n%s" % (len(body), body))
    head, _, rest = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"transfer-encoding" not in head.lower() and b"content-length" not in head.lower()
    assert b"\r\nconnection: close" in head.lower()
    assert rest.startswith(b"data: {") and rest.endswith(b"data: [DONE]\n\n")
    assert b"\r\n0\r\n" not in rest  # no chunk framing inside the body
    # a complete answer on HTTP/1.0: sized, and the connection closed after it
    body = orjson.dumps(CHAT)
    out = rawhttp.raw(srv.url, b"POST /v1/chat/completions HTTP/1.0\r\ncontent-length: %d\r\n"
                      b"\r\n%s" % (len(body), body))
    head, _, rest = out.partition(b"\r\n\r\n")
    m = re.search(rb"content-length: (\d+)", head)
    assert m is not None and int(m.group(1)) == len(rest)
    assert b"connection: close" in head.lower()


def test_connection_close_from_the_client_is_honoured(srv: Any) -> None:
    out = rawhttp.raw(srv.url, b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
                      b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    assert out.count(b"HTTP/1.1 200 ") == 1  # the second request is never read
    assert b"connection: close" in out.lower()


async def test_phases_and_exchange_follow_the_request() -> None:
    clock = FakeClock(start=0.0)
    server = mem_server(clock=clock, latency="realistic", ttft_ms=50, itl_ms=10)
    proto, tr = connect(server)
    assert proto.phase is Phase.IDLE and proto.exchange is None
    body = orjson.dumps({**CHAT, "stream": True})
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % len(body)
    proto.data_received(head)
    assert proto.phase is Phase.READING and proto.exchange is not None
    proto.data_received(body)
    for _ in range(20000):
        await asyncio.sleep(0)
        if proto.phase is Phase.STREAMING:
            break
    assert proto.phase is Phase.STREAMING
    for _ in range(20000):
        await asyncio.sleep(0)
        if proto.phase is Phase.IDLE:
            break
    assert proto.phase is Phase.IDLE and proto.exchange is None
    assert bytes(tr.out).endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    st = server.app.stats
    assert (st.active_streams, st.active_requests, st.active_connections) == (0, 0, 1)
    proto.connection_lost(None)
    assert proto.phase is Phase.CLOSED and st.active_connections == 0


async def _until(cond: Any, passes: int = 20000) -> bool:
    for _ in range(passes):
        if cond():
            return True
        await asyncio.sleep(0)
    return cond()


@pytest.mark.parametrize("version, chunked", [(b"1.1", True), (b"1.0", False)])
async def test_a_chunked_stream_writes_through_the_connection_wire_only_while_open(
        version: bytes, chunked: bool) -> None:
    """A chunked stream's pump writes through the connection's HTTPWire, which is open from
    the head to the stream's end and paused with the transport; once the stream ended (and
    after the terminating chunk) nothing written to it reaches the client. A body that is
    not chunked (HTTP/1.0) is written by the protocol itself."""
    clock = FakeClock(start=0.0)
    server = mem_server(clock=clock, latency="realistic", ttft_ms=50, itl_ms=10)
    proto, tr = connect(server)
    assert not proto.wire.open and proto.wire.transport is tr
    body = orjson.dumps({**CHAT, "stream": True, "max_tokens": 20})
    proto.data_received(b"POST /v1/chat/completions HTTP/%s\r\nhost: x\r\n"
                        b"content-length: %d\r\n\r\n%s" % (version, len(body), body))
    assert await _until(lambda: proto._pump is not None)
    assert (proto._pump.sink is proto.wire) is chunked
    assert proto.wire.open is chunked
    proto.pause_writing()  # backpressure: the wire's flag, which the pump reads
    assert proto.wire.paused
    proto.resume_writing()
    assert not proto.wire.paused
    assert await _until(lambda: b"data: [DONE]" in tr.out)
    assert not proto.wire.open
    if chunked:
        assert bytes(tr.out).endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
        n = len(tr.out)
        proto.wire.write_wire([b"late"])  # (a write after the end: dropped)
        proto.wire.write_events([b"late"])
        assert len(tr.out) == n
    assert b"late" not in tr.out
    proto.connection_lost(None)


async def test_a_lost_connection_closes_the_wire_of_its_stream() -> None:
    clock = FakeClock(start=0.0)
    server = mem_server(clock=clock, latency="realistic", ttft_ms=50, itl_ms=10)
    proto, tr = connect(server)
    body = orjson.dumps({**CHAT, "stream": True, "max_tokens": 20})
    proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(body), body))
    assert await _until(lambda: proto._pump is not None)
    assert proto.wire.open
    proto.connection_lost(None)
    assert not proto.wire.open and proto._pump is None
    assert server.app.stats.active_streams == 0


STREAMS = {  # family → (path, body, its last event)
    "chat": ("/v1/chat/completions", CHAT, b"data: [DONE]\n\n"),
    "completions": ("/v1/completions", {"model": "gpt-3.5-turbo-instruct", "prompt": "hi",
                                        "max_tokens": 3}, b"data: [DONE]\n\n"),
    "anthropic": ("/anthropic/v1/messages", {"model": "claude-sonnet-4-6", "max_tokens": 3,
                                             "messages": CHAT["messages"]},
                  b'event: message_stop\ndata: {"type":"message_stop"}\n\n'),
    "responses": ("/v1/responses", {**RESP, "store": False},
                  b"event: response.incomplete\n"),  # (capped at max_output_tokens)
}


async def _stream_writes(family: str, ends: bool) -> list[tuple[bytes, int, int]]:
    """The writes of one streamed request of ``family`` on a fresh connection, each with the
    stream and request gauges at the moment it was made; ``ends=False``: the pump makes the
    stream's last write itself, the terminating chunk its own write after it."""
    clock = FakeClock(start=0.0)
    server = mem_server(clock=clock, latency="realistic", ttft_ms=50, itl_ms=10)
    proto, tr = connect(server)
    proto.wire.ends = ends
    st = server.app.stats
    writes: list[tuple[bytes, int, int]] = []
    write = tr.write

    def record(data: bytes) -> None:
        writes.append((bytes(data), st.active_streams, st.active_requests))
        write(data)

    tr.write = record  # type: ignore[method-assign]
    path, req, _ = STREAMS[family]
    body = orjson.dumps({**req, "stream": True})
    proto.data_received(b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
                        % (path.encode(), len(body), body))
    assert await _until(lambda: proto.phase is Phase.IDLE and proto.exchange is None)
    proto.connection_lost(None)
    return writes


_VARYING = re.compile(rb"(?:date|x-request-id|openai-processing-ms|request-id): [^\r]*\r\n"
                      rb"|(?:chatcmpl|cmpl|msg|resp|req|rs)[-_][A-Za-z0-9]+"
                      rb'|"(?:created|created_at|completed_at)":\s*[0-9.]+')


@pytest.mark.parametrize("family", sorted(STREAMS))
async def test_a_streams_last_write_carries_the_terminating_chunk(family: str) -> None:
    """The stream's last events and the body's terminating chunk go out in one write, made
    after the stream and the request are released (a client that has the last byte sees
    the gauges down), and the bytes are those of the two writes it replaces."""
    got = await _stream_writes(family, ends=True)
    was = await _stream_writes(family, ends=False)
    assert len(got) == len(was) - 1 >= 3  # the head, a token at least, the end
    last, streams, requests = got[-1]
    assert STREAMS[family][2] in last and last.endswith(b"\n\n\r\n0\r\n\r\n")
    assert (streams, requests) == (0, 0)
    assert was[-1][0] == b"0\r\n\r\n" and was[-1][1:] == (0, 0)
    assert b"0\r\n\r\n" not in b"".join(w for w, _, _ in got[:-1])
    assert [_VARYING.sub(b"", w) for w, _, _ in got] == (
        [_VARYING.sub(b"", w) for w, _, _ in was[:-2]]
        + [_VARYING.sub(b"", was[-2][0] + was[-1][0])])


async def test_header_and_idle_timeouts_run_on_the_app_clock() -> None:
    clock = FakeClock(start=0.0)
    server = mem_server(clock=clock, header_timeout_s=10, idle_timeout_s=75)
    proto, tr = connect(server)
    clock.advance(9.9)
    server._sweep()
    assert not tr.closed  # the loop's own time is irrelevant: only the app's clock counts
    clock.advance(0.2)
    server._sweep()
    assert tr.closed
    await asyncio.sleep(0)
    # idle keep-alive: measured from the end of the last response, on the same clock
    proto, tr = connect(server)
    proto.data_received(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    await asyncio.sleep(0)  # (a request is handled on the loop's next pass)
    assert bytes(tr.out).startswith(b"HTTP/1.1 200 ")
    clock.advance(74)
    server._sweep()
    assert not tr.closed
    clock.advance(2)
    server._sweep()
    assert tr.closed
    await asyncio.sleep(0)
    assert server.app.stats.active_connections == 0 and not server.connections


async def test_a_request_is_handled_on_the_next_loop_pass(
        caplog: pytest.LogCaptureFixture) -> None:
    """A request is not handled inside the read that completed it but on the loop's next
    pass (the events due meanwhile go first); one whose connection closed in between is
    never handled, and its counters are released."""
    server = mem_server()
    proto, tr = connect(server)
    proto.data_received(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    assert bytes(tr.out) == b"" and server.app.stats.active_requests == 1
    await asyncio.sleep(0)
    assert bytes(tr.out).startswith(b"HTTP/1.1 200 ")
    assert server.app.stats.active_requests == 0
    tr.out.clear()
    proto.data_received(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    tr.close()
    for _ in range(3):
        await asyncio.sleep(0)
    assert bytes(tr.out) == b"" and not caplog.records  # (not handled: nothing failed)
    st = server.app.stats
    assert (st.active_requests, st.active_connections) == (0, 0)


async def test_the_requests_read_in_one_pass_are_handled_together_in_read_order(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The requests of several connections read in one loop pass are handled on the next
    pass, in the order they were read, through one scheduled callback (not one each)."""
    server = mem_server()
    loop = asyncio.get_running_loop()
    scheduled: list[Any] = []
    call_soon = loop.call_soon

    def counting(cb: Any, *args: Any, **kw: Any) -> asyncio.Handle:
        scheduled.append(cb)
        return call_soon(cb, *args, **kw)

    answered: list[int] = []
    conns = [connect(server) for _ in range(3)]
    monkeypatch.setattr(loop, "call_soon", counting)
    for i, (proto, tr) in enumerate(conns):
        def write(data: bytes, i: int = i, write: Any = tr.write) -> None:
            answered.append(i)
            write(data)

        tr.write = write  # type: ignore[method-assign]
        proto.data_received(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    n = len(scheduled)
    monkeypatch.undo()
    assert n == 1 and answered == []
    await asyncio.sleep(0)
    assert answered == [0, 1, 2]
    assert all(bytes(tr.out).startswith(b"HTTP/1.1 200 ") for _, tr in conns)
    assert server.app.stats.active_requests == 0
    for proto, _ in conns:
        proto.connection_lost(None)


async def test_a_cancel_before_the_handler_task_ran_reaches_the_handler() -> None:
    """A handler that suspended in its first step continues in a Task; a client gone before
    that Task's first step still cancels the handler itself (its own cancellation path
    runs: the request is counted as a client disconnect, 499), not just the Task."""
    clock = FakeClock()
    server = mem_server(clock=clock, latency="realistic", ttft_ms=500)
    proto, tr = connect(server)
    body = orjson.dumps(CHAT)
    proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(body), body))
    await asyncio.sleep(0)  # the handler's first step ran and waits for its latency
    task = proto._task
    assert task is not None and not task.done()
    proto.connection_lost(None)  # (before the Task's first step)
    for _ in range(5):
        await asyncio.sleep(0)
    assert task.done()
    s = server.app.stats.snapshot()
    assert s["errors"] == {"client_disconnect": 1}
    assert [(r["status"], r["count"]) for r in s["requests"]] == [(499, 1)]
    assert s["active"]["requests"] == 0 and clock.pending == 0


async def test_thousands_of_connections_leave_no_timer_and_no_protocol_behind() -> None:
    clock = FakeClock(start=0.0)
    server = mem_server(clock=clock)
    refs = []
    for i in range(2000):
        proto, tr = connect(server)
        if i % 2:
            proto.data_received(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        refs.append(weakref.ref(proto))
        tr.close()
        del proto, tr
    for _ in range(3):
        await asyncio.sleep(0)
    gc.collect()
    assert sum(r() is not None for r in refs) == 0
    assert clock.pending == 0 and not server.connections
    assert server.app.stats.active_connections == 0


async def test_a_cancelled_clock_timer_drops_its_callback() -> None:
    clock = FakeClock(start=0.0)

    class Owner:
        def cb(self) -> None:
            raise AssertionError("cancelled")

    owner = Owner()
    ref = weakref.ref(owner)
    t = clock.call_at(3600.0, owner.cb)  # far away: the heap keeps the entry until then
    t.cancel()
    del owner
    gc.collect()
    assert ref() is None and clock.pending == 0


def test_handler_headers_cannot_split_the_head() -> None:
    assert header_bytes([("retry-after", "1"), ("x-a", "b: c")]) == \
        b"retry-after: 1\r\nx-a: b: c\r\n"
    for bad in [("x-a", "1\r\nset-cookie: evil"), ("x-a", "1\nx: y"), ("x\r\ny", "1"),
                ("x-a:", "1"), ("", "1"), ("x-a", "a\0b")]:
        with pytest.raises(ValueError):
            header_bytes([bad])


async def test_a_handler_header_that_would_split_the_head_becomes_a_500() -> None:
    from llmsim.messages import JSONResponse

    server = mem_server()
    app = server.app

    async def bad(req: Any, app: Any) -> JSONResponse:
        return JSONResponse({"ok": True}, headers=[("x-echo", "a\r\nset-cookie: evil=1")])

    route, _ = app.resolve(_health_req())
    original = route.handler
    object.__setattr__(route, "handler", bad)
    try:
        proto, tr = connect(server)
        proto.data_received(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
                            b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        for _ in range(5):
            await asyncio.sleep(0)
    finally:
        object.__setattr__(route, "handler", original)
    out = bytes(tr.out)
    assert out.count(b"HTTP/1.1 500 ") == 2 and b"set-cookie" not in out.lower()
    assert not tr.closed  # the 500 is a complete answer: the connection goes on


def _health_req() -> Any:
    from llmsim.messages import Request

    return Request(method="GET", path="/health", query={}, headers={}, body=b"",
                   request_id="req_x")


@pytest.mark.parametrize("status", [101, 1000, 42])
async def test_a_handler_status_that_cannot_be_sent_becomes_a_500(status: int) -> None:
    from llmsim.messages import RawResponse

    server = mem_server()
    app = server.app

    async def bad(req: Any, app: Any) -> RawResponse:
        return RawResponse(b"x", status)

    route, _ = app.resolve(_health_req())
    original = route.handler
    object.__setattr__(route, "handler", bad)
    try:
        proto, tr = connect(server)
        proto.data_received(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        for _ in range(5):
            await asyncio.sleep(0)
    finally:
        object.__setattr__(route, "handler", original)
    out = bytes(tr.out)
    assert out.startswith(b"HTTP/1.1 500 ") and out.count(b"HTTP/1.1") == 1
    assert not tr.closed and proto.phase is Phase.IDLE
    st = server.app.stats
    assert st.active_requests == 0 and st.requests_n == 1  # counted once, as the 500
    assert [k[3] for k in st.requests] == [500]


async def test_body_deadline_runs_from_the_head_when_the_body_is_late(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A head whose body has not all arrived arms the body deadline (header_timeout_s from
    the head, not extended by body bytes that trickle in); a request that arrives whole is
    answered with no body deadline armed."""
    clock = FakeClock(start=0.0)
    server = mem_server(clock=clock, header_timeout_s=10, idle_timeout_s=75)
    proto, tr = connect(server)
    proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                        b"content-type: application/json\r\ncontent-length: 100\r\n\r\n{")
    assert proto._timer_kind == "body"
    clock.advance(6)
    proto.data_received(b'"model"')  # more of the body: the same deadline
    assert proto._timer_kind == "body"
    clock.advance(4.1)
    server._sweep()
    assert tr.closed
    await asyncio.sleep(0)
    proto, tr = connect(server)
    kinds = []
    arm = HTTPProtocol._arm

    def spy(self: HTTPProtocol, kind: str, seconds: float) -> None:
        kinds.append(kind)
        arm(self, kind, seconds)

    monkeypatch.setattr(HTTPProtocol, "_arm", spy)  # (the class: its instances have slots)
    proto.data_received(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    await asyncio.sleep(0)
    assert bytes(tr.out).startswith(b"HTTP/1.1 200 ")
    assert "body" not in kinds and proto._timer_kind == "idle"


@pytest.mark.parametrize("family", sorted(STREAMS))
async def test_the_events_due_at_once_go_out_with_the_head(family: str) -> None:
    """A stream's head is held for its first write: the events due when it starts (the
    Responses lifecycle's ``response.created``) go out with it in one write; a family whose
    first event waits for the first token writes its head alone at once."""
    got = await _stream_writes(family, ends=True)
    first = got[0][0]
    assert first.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in first
    head, _, rest = first.partition(b"\r\n\r\n")
    if family == "responses":
        assert re.match(rb"[0-9a-f]+\r\nevent: response.created\n", rest)  # (a chunk)
        assert b"event: response.created\n" in rest and b"event: response.in_progress\n" in rest
        assert b"response.output_text.delta" not in rest  # (the first token waits for TTFT)
    else:
        assert rest == b""


async def test_a_stream_that_ends_in_its_start_is_one_write() -> None:
    """With instant latency the whole stream is decided and written as it starts: the head,
    every event and the terminating chunk leave in one write."""
    server = mem_server(latency="instant")
    proto, tr = connect(server)
    writes: list[bytes] = []
    write = tr.write

    def record(data: bytes) -> None:
        writes.append(bytes(data))
        write(data)

    tr.write = record  # type: ignore[method-assign]
    body = orjson.dumps({**CHAT, "stream": True, "max_tokens": 5})
    proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(body), body))
    assert await _until(lambda: proto.phase is Phase.IDLE and proto.exchange is None)
    assert len(writes) == 1
    assert writes[0].startswith(b"HTTP/1.1 200 ") and writes[0].endswith(b"\r\n0\r\n\r\n")
    assert b"data: [DONE]\n\n" in writes[0] and proto.wire.head is None
    proto.connection_lost(None)


async def test_a_stream_whose_pump_cannot_start_ends_with_its_head_and_an_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The head is held when the pump fails to start: the client still gets it, then the
    terminal error event and the end of the body, in that order, and the connection and its
    counters are released for the next request."""
    import llmsim.transport.http as http_mod

    def broken(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("no pump")

    monkeypatch.setattr(http_mod, "Pump", broken)
    server = mem_server()
    proto, tr = connect(server)
    body = orjson.dumps({**CHAT, "stream": True, "max_tokens": 5})
    proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                        b"content-length: %d\r\n\r\n%s" % (len(body), body))
    assert await _until(lambda: proto.phase is Phase.IDLE and proto.exchange is None)
    out = bytes(tr.out)
    assert out.startswith(b"HTTP/1.1 200 ") and out.endswith(b"\r\n0\r\n\r\n")
    head, _, rest = out.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head and b'"error"' in rest
    assert b"server_error" in rest and proto.wire.head is None
    st = server.app.stats
    assert (st.active_streams, st.active_requests) == (0, 0)
    assert not tr.closed
    proto.connection_lost(None)
