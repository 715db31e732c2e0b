"""The HTTP layer: keep-alive, pipelining, limits, timeouts, errors, backpressure, leaks.

Tier 3 (real sockets on port 0, raw h11 client) and tier 2 (in-memory transport)."""

from __future__ import annotations

import asyncio
import re
import socket
import time

import h11
import orjson
import pytest

from llmsim.streaming.clock import FakeClock

from . import rawhttp
from .memtransport import connect, mem_server

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}


def wait_for(cond, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return cond()


def _envelope(resp: rawhttp.Resp) -> dict:
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_keep_alive_reuses_connection(srv):
    sock = rawhttp.connect(srv.url)
    conn = h11.Connection(h11.CLIENT)
    ids = set()
    for _ in range(3):
        r = rawhttp.request(srv.url, "POST", "/v1/chat/completions", CHAT, sock=sock, conn=conn)
        assert r.status == 200
        ids.add(r.headers["x-request-id"])
    sock.close()
    assert len(ids) == 3
    assert srv.app.stats.connections_total == 1


def test_pipelined_requests_answered_in_order(srv):
    req = (b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
           b"GET /v1/models/gpt-4o HTTP/1.1\r\nhost: x\r\n\r\n"
           b"GET /nope HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    out = rawhttp.raw(srv.url, req)
    statuses = re.findall(rb"HTTP/1\.1 \d+ [A-Za-z ]+(?=\r\n)", out)
    assert statuses == [b"HTTP/1.1 200 OK", b"HTTP/1.1 200 OK", b"HTTP/1.1 404 Not Found"]
    assert out.index(b'"status":"ok"') < out.index(b'"id":"gpt-4o"')


def test_every_response_has_request_id_and_envelope(srv):
    for method, path, body in [("GET", "/v1/nothing", None), ("GET", "/v1/chat/completions", None),
                               ("POST", "/v1/chat/completions", b"{not json"),
                               ("POST", "/v1/chat/completions", b"[1,2]"),
                               ("POST", "/openai/v1/chat/completions", CHAT)]:
        r = rawhttp.request(srv.url, method, path, body)
        assert r.headers["x-request-id"].startswith("req_")
        if r.status >= 400:
            _envelope(r)
    r = rawhttp.request(srv.url, "GET", "/v1/chat/completions")
    assert r.status == 405 and r.headers["allow"] == "POST"
    r = rawhttp.request(srv.url, "GET", "/v1/nothing")
    assert r.status == 404 and _envelope(r)["message"] == "Invalid URL (GET /v1/nothing)"


def test_oversized_headers_431(make_server):
    s = make_server(max_header_bytes=2048)
    out = rawhttp.raw(s.url, b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * 5000
                      + b"\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 431 ")
    assert b"request_header_fields_too_large" in out


def test_body_over_cap_413_from_content_length(make_server):
    s = make_server(max_body_bytes=1000)
    body = orjson.dumps({**CHAT, "pad": "x" * 2000})
    r = rawhttp.request(s.url, "POST", "/v1/chat/completions", body)
    assert r.status == 413
    assert _envelope(r)["code"] == "request_too_large"
    assert r.headers.get("connection") == "close"


def test_chunked_body_over_cap_413(make_server):
    s = make_server(max_body_bytes=1000)
    payload = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n"
               b"content-type: application/json\r\n\r\n")
    for _ in range(5):
        payload += b"1f4\r\n" + b"a" * 500 + b"\r\n"
    payload += b"0\r\n\r\n"
    out = rawhttp.raw(s.url, payload)
    assert out.startswith(b"HTTP/1.1 413 ")


def test_malformed_http_400(srv):
    out = rawhttp.raw(srv.url, b"THIS IS NOT HTTP\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 400 ")
    assert b'"error"' in out


def test_http10_stream_is_close_delimited(srv):
    body = orjson.dumps({**CHAT, "stream": True})
    out = rawhttp.raw(srv.url, b"POST /v1/chat/completions HTTP/1.0\r\ncontent-type: "
                      b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    assert out.startswith(b"HTTP/1.1 200 ")
    assert b"transfer-encoding" not in out.lower()
    assert out.endswith(b"data: [DONE]\n\n")


def test_head_health(srv):
    out = rawhttp.raw(srv.url, b"HEAD /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
    assert out.startswith(b"HTTP/1.1 200 ")
    assert out.endswith(b"\r\n\r\n")


def test_expect_100_continue(srv):
    body = orjson.dumps(CHAT)
    s = rawhttp.connect(srv.url)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\n"
              b"content-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body))
    first = s.recv(1000)
    assert first.startswith(b"HTTP/1.1 100 ")
    s.sendall(body)
    rest = s.recv(65536)
    assert b"HTTP/1.1 200 " in rest
    s.close()


def test_idle_and_header_timeouts_close(make_server):
    s = make_server(idle_timeout_s=0.2, header_timeout_s=0.2)
    sock = rawhttp.connect(s.url)
    sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n")  # head never completes
    sock.settimeout(30)  # (a hang guard: the server's 0.2 s timeout closes it)
    assert sock.recv(100) == b""  # closed by the server
    sock.close()
    sock = rawhttp.connect(s.url)
    conn = h11.Connection(h11.CLIENT)
    assert rawhttp.request(s.url, "GET", "/health", sock=sock, conn=conn).status == 200
    sock.settimeout(5)
    assert sock.recv(100) == b""  # idle keep-alive closed
    sock.close()
    assert wait_for(lambda: s.app.stats.active_connections == 0)


def test_disconnect_mid_stream_releases_everything(make_server):
    s = make_server(latency="realistic", ttft_ms=0, itl_ms=20)
    socks = []
    for _ in range(5):
        sock = rawhttp.connect(s.url)
        body = orjson.dumps({**CHAT, "max_tokens": 500, "stream": True})
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while b"data: " not in got:
            got += sock.recv(65536)
        socks.append(sock)
    assert wait_for(lambda: s.app.stats.active_streams == 5)
    for sock in socks:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        sock.close()
    st = s.app.stats
    assert wait_for(lambda: (st.active_streams, st.active_requests, st.active_connections)
                    == (0, 0, 0)), (st.active_streams, st.active_requests, st.active_connections)
    assert s.app.clock.pending == 0  # no timer left behind


@pytest.mark.asyncio
async def test_backpressure_pauses_generation():
    """A client that does not read: the pump stops pulling until the buffer drains."""
    server = mem_server(latency="instant", max_tokens_mode="exact")
    proto, tr = connect(server, high_water=4096)
    body = orjson.dumps({**CHAT, "max_tokens": 2000, "stream": True})
    proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d"
                        b"\r\n\r\n%s" % (len(body), body))
    for _ in range(20):
        await asyncio.sleep(0)
    assert tr.paused
    held = len(tr.out)
    assert held < 4096 + 256 * 400  # at most one batch beyond the high-water mark
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(tr.out) == held  # nothing generated while paused
    received = b""
    for _ in range(2000):
        received += tr.drain_client()
        if received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):
            break
        await asyncio.sleep(0)
    assert received.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
    assert received.count(b'"delta":{"content":') == 2000
    assert server.app.stats.active_streams == 0


@pytest.mark.asyncio
async def test_stream_timing_on_fake_clock():
    """TTFT and inter-token gaps follow the schedule exactly on the fake clock (tier 2)."""
    clock = FakeClock()
    server = mem_server(clock=clock, latency="realistic", ttft_ms=300, itl_ms=25)
    proto, tr = connect(server)
    body = orjson.dumps({**CHAT, "max_tokens": 10, "stream": True})
    t0 = clock.now()
    proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d"
                        b"\r\n\r\n%s" % (len(body), body))
    times = []
    seen = 0
    for _ in range(5000):
        await asyncio.sleep(0)
        n = tr.out.count(b'"delta":{"content":')
        while seen < n:
            times.append(clock.now() - t0)
            seen += 1
        if seen == 10:
            break
    assert seen == 10
    assert times[0] == pytest.approx(0.300)
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(g == pytest.approx(0.025) for g in gaps)


@pytest.mark.asyncio
async def test_graceful_shutdown_lets_stream_finish():
    from llmsim import Config, Server

    async with Server(Config(port=0, latency="realistic", ttft_ms=0, itl_ms=5, quiet=True,
                             shutdown_grace_s=5)) as srv:
        reader, writer = await asyncio.open_connection(srv.host, srv.port)
        body = orjson.dumps({**CHAT, "max_tokens": 40, "stream": True})
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d"
                     b"\r\n\r\n%s" % (len(body), body))
        await writer.drain()
        await reader.readuntil(b"data: ")
        closing = asyncio.create_task(srv.close(grace=5))
        rest = await asyncio.wait_for(reader.read(), 5)
        await closing
        assert rest.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n")
        with pytest.raises(OSError):
            await asyncio.open_connection(srv.host, srv.port)
        writer.close()


async def test_max_pipelined_pauses_reading_then_serves_every_request():
    """--max-pipelined: with a request in flight, reading stops once that many pipelined
    request heads wait; it resumes as they are served, and every one is answered in order."""
    clock = FakeClock(start=0.0)
    server = mem_server(clock=clock, latency="realistic", ttft_ms=100, itl_ms=1,
                        max_pipelined=2)
    proto, tr = connect(server)
    body = orjson.dumps({**CHAT, "max_tokens": 2})
    one = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
           % (len(body), body))
    proto.data_received(one)  # in flight (waits 100 ms on the fake clock)
    for _ in range(5):
        await asyncio.sleep(0)
    proto.data_received(one)
    assert tr.reading  # one waiting head: below the bound
    proto.data_received(one * 2)
    assert not tr.reading  # three waiting: reading paused
    for _ in range(5000):  # the fake clock moves when the loop is idle
        await asyncio.sleep(0)
        if bytes(tr.out).count(b"HTTP/1.1 200") == 4:
            break
    assert bytes(tr.out).count(b"HTTP/1.1 200") == 4 and tr.reading


def test_request_http_is_the_constructors_value():
    """Request.http fills the slots directly (hot path): the same value as the constructor,
    still frozen, with fresh mutable defaults."""
    import dataclasses

    import pytest as _pytest

    from llmsim.messages import Request
    args = ("POST", "/v1/x", {"a": ["1"]}, {"h": "v"}, b"{}", "req_1", "1.2.3.4:5", 7.5)
    a = Request.http(*args)
    b = Request(method="POST", path="/v1/x", query={"a": ["1"]}, headers={"h": "v"},
                body=b"{}", request_id="req_1", client="1.2.3.4:5", received_at=7.5)
    assert a == b and type(a) is Request
    with _pytest.raises(dataclasses.FrozenInstanceError):
        a.path = "/other"  # type: ignore[misc]
    c = Request.http(*args)
    assert c.params is not a.params and c.notes is not a.notes
