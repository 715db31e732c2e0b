"""Responses over WebSocket at the frame level: handshake errors, trailing bytes, malformed and
binary frames, unknown events, limits (message size, connections, lanes, lifetime), ping/pong,
the close handshake, disconnects and backpressure. Raw sockets with a wsproto client (tier 3)
and an in-memory transport (tier 2)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import socket
import time
from typing import Any

import orjson
import pytest
from wsproto.connection import Connection, ConnectionType
from wsproto.events import BytesMessage, CloseConnection, Ping, Pong, TextMessage

from llmsim.config import WebSocketConfig
from llmsim.transport.ws import WEBSOCKET

from . import rawhttp, ws_fake
from .memtransport import connect, mem_server
from .test_websocket_sdk import BASE, SHORT, validated

TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


def wait_for(cond: Any, timeout: float = 5.0) -> bool:
    """Poll ``cond`` until true or the deadline (bounded; no fixed sleeps)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.005)
    return bool(cond())


def handshake(path: str = "/v1/responses", extra_headers: str = "",
              version: str = "13", key: str | None = None) -> bytes:
    key = key if key is not None else base64.b64encode(os.urandom(16)).decode()
    return (f"GET {path} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            f"Sec-WebSocket-Version: {version}\r\nAuthorization: Bearer sk-test\r\n"
            f"{extra_headers}\r\n").encode()


def http_once(url: str, payload: bytes) -> tuple[bytes, bytes]:
    """Send raw bytes, read one response (head, body by Content-Length); keep-alive safe."""
    s = rawhttp.connect(url)
    try:
        s.sendall(payload)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            assert chunk, "closed before a response"
            buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        n = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                     if line.lower().startswith(b"content-length:")))
        while len(body) < n:
            chunk = s.recv(65536)
            assert chunk
            body += chunk
        return head, body
    finally:
        s.close()


class RawWS:
    """A minimal WebSocket client: raw handshake bytes, wsproto for frames."""

    def __init__(self, url: str, path: str = "/v1/responses", first: list[Any] | None = None,
                 timeout: float = 5.0) -> None:
        self.ws = Connection(ConnectionType.CLIENT)
        self.sock = rawhttp.connect(url, timeout=timeout)
        extra = b"".join(self.ws.send(ev) for ev in (first or []))
        self.sock.sendall(handshake(path) + extra)  # frames right behind the upgrade request
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = self.sock.recv(65536)
            assert chunk, "closed during the handshake"
            buf += chunk
        head, _, rest = buf.partition(b"\r\n\r\n")
        self.head = head.decode()
        self.status = int(self.head.split()[1])
        self.ws.receive_data(rest) if rest else None
        self._text: list[str] = []
        self.closed_with: CloseConnection | None = None

    def send(self, ev: Any) -> None:
        self.sock.sendall(self.ws.send(ev))

    def send_json(self, obj: Any) -> None:
        self.send(TextMessage(data=json.dumps(obj)))

    def next_event(self) -> Any:
        """The next complete message (str/bytes), Ping/Pong or CloseConnection."""
        while True:
            for ev in self.ws.events():
                if isinstance(ev, TextMessage):
                    self._text.append(ev.data)
                    if ev.message_finished:
                        out, self._text = "".join(self._text), []
                        return out
                elif isinstance(ev, BytesMessage):
                    return bytes(ev.data)
                else:
                    if isinstance(ev, CloseConnection):
                        self.closed_with = ev
                    return ev
            data = self.sock.recv(65536)
            if not data:
                self.ws.receive_data(None)
            else:
                self.ws.receive_data(data)

    def recv_json(self) -> dict[str, Any]:
        ev = self.next_event()
        assert isinstance(ev, str), ev
        return validated(ev)

    def until_terminal(self) -> list[dict[str, Any]]:
        out = []
        while True:
            ev = self.recv_json()
            out.append(ev)
            if ev["type"] in TERMINAL:
                return out

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def wsrv(make_server: Any) -> Any:
    srv = make_server(**SHORT)
    ws_fake.install(srv.app)
    return srv


def quiet(srv: Any) -> bool:
    st = srv.app.stats
    return (st.active_websockets == 0 and st.active_streams == 0
            and st.active_connections == 0 and st.active_requests == 0)


# -- handshake -----------------------------------------------------------------------------

def _error(resp: rawhttp.Resp) -> dict[str, Any]:
    body = resp.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
    return body["error"]


def test_plain_get_is_a_clear_426(wsrv: Any) -> None:
    for path in ("/v1/responses", "/openai/v1/responses"):
        r = rawhttp.request(wsrv.url, "GET", path)
        assert r.status == 426
        assert r.headers["upgrade"] == "websocket"
        err = _error(r)
        assert err["code"] == "websocket_upgrade_required" and "Upgrade" in err["message"]


@pytest.mark.parametrize("raw,status,code", [
    (handshake(version="8"), 426, "invalid_websocket_handshake"),
    (handshake(key="short"), 400, "invalid_websocket_handshake"),
    (handshake(path="/v1/chat/completions"), 400, "websocket_not_supported"),
    (handshake(path="/v1/nowhere"), 404, None),
    (handshake().replace(b"Connection: Upgrade", b"Connection: keep-alive"), 400,
     "invalid_websocket_handshake"),
    (handshake().replace(b"GET ", b"PUT ", 1), 400, "invalid_websocket_handshake"),
])
def test_bad_handshakes_get_http_errors(wsrv: Any, raw: bytes, status: int,
                                        code: str | None) -> None:
    head, body = http_once(wsrv.url, raw)
    assert head.startswith(b"HTTP/1.1 %d " % status), head
    err = orjson.loads(body)["error"]
    assert err["code"] == code
    if status == 426:
        assert b"sec-websocket-version: 13" in head.lower()
    assert wait_for(lambda: wsrv.app.stats.active_websockets == 0)


def test_handshake_101_and_no_compression(wsrv: Any) -> None:
    c = RawWS(wsrv.url, path="/openai/v1/responses")
    assert c.status == 101
    assert "sec-websocket-accept" in c.head.lower()
    assert "sec-websocket-extensions" not in c.head.lower()
    c.send_json({"type": "response.create", **BASE})
    assert c.until_terminal()[-1]["type"] == "response.completed"
    c.close()


def test_bytes_behind_the_upgrade_request_are_not_lost(wsrv: Any) -> None:
    first = [TextMessage(data=json.dumps({"type": "response.create", **BASE})),
             Ping(payload=b"early")]
    c = RawWS(wsrv.url, first=first)
    assert c.status == 101
    pongs, types = [], []
    while not types or types[-1] not in TERMINAL:
        ev = c.next_event()
        if isinstance(ev, Pong):
            pongs.append(ev.payload)  # control frames may interleave with the stream
        else:
            types.append(validated(ev)["type"])
    assert types[-1] == "response.completed"
    assert pongs == [b"early"]
    c.close()
    assert wait_for(lambda: quiet(wsrv))


# -- client frames -------------------------------------------------------------------------

def test_malformed_and_unknown_frames_keep_the_connection(wsrv: Any) -> None:
    c = RawWS(wsrv.url)
    c.send(TextMessage(data="{not json"))
    e = c.recv_json()
    assert e["type"] == "error" and e["status"] == 400
    assert e["error"]["type"] == "invalid_request_error" and e["error"]["code"] == "invalid_json"
    c.send_json([1, 2])
    assert c.recv_json()["error"]["code"] == "invalid_type"
    c.send_json({"model": "gpt-4o"})
    assert c.recv_json()["error"]["param"] == "type"
    c.send_json({"type": "session.update"})
    e = c.recv_json()
    assert e["error"]["code"] == "invalid_value" and "session.update" in e["error"]["message"]
    c.send(BytesMessage(data=b'{"type": "response.create"}'))
    e = c.recv_json()
    assert e["error"]["code"] == "invalid_message_type" and "Binary" in e["error"]["message"]
    c.send_json({"type": "response.create", "response": "nope"})
    assert c.recv_json()["error"]["param"] == "response"
    c.send_json({"type": "response.create", **BASE, "stream_id": "bad id!"})
    e = c.recv_json()
    assert e["error"]["code"] == "invalid_stream_id" and e["error"]["param"] == "stream_id"
    # a fragmented text message is reassembled
    msg = json.dumps({"type": "response.create", **BASE, "stream_id": "frag"})
    c.send(TextMessage(data=msg[:10], message_finished=False))
    c.send(TextMessage(data=msg[10:], message_finished=True))
    events = c.until_terminal()
    assert events[-1]["type"] == "response.completed"
    assert all(ev["stream_id"] == "frag" for ev in events)
    c.close()


def test_ping_pong_and_close_handshake(wsrv: Any) -> None:
    c = RawWS(wsrv.url)
    c.send(Ping(payload=b"hello"))
    ev = c.next_event()
    assert isinstance(ev, Pong) and ev.payload == b"hello"
    c.send(CloseConnection(code=1000, reason="bye"))
    ev = c.next_event()
    assert isinstance(ev, CloseConnection) and ev.code == 1000
    assert c.sock.recv(10) == b""  # the server closes TCP after the handshake
    c.close()
    assert wait_for(lambda: quiet(wsrv))


def test_message_size_cap_closes_1009(make_server: Any) -> None:
    srv = make_server(**SHORT, websocket=WebSocketConfig(max_message_bytes=1000))
    ws_fake.install(srv.app)
    c = RawWS(srv.url)
    c.send_json({"type": "response.create", **BASE, "input": "x" * 500})
    assert c.until_terminal()[-1]["type"] == "response.completed"
    c.send(TextMessage(data="y" * 800, message_finished=False))
    c.send(TextMessage(data="y" * 800, message_finished=True))
    ev = c.next_event()
    assert isinstance(ev, CloseConnection) and ev.code == 1009
    c.close()
    assert wait_for(lambda: quiet(srv))


def test_protocol_error_closes_1002(wsrv: Any) -> None:
    c = RawWS(wsrv.url)
    c.sock.sendall(b"\x81\x05hello")  # unmasked client frame: a protocol error
    ev = c.next_event()
    assert isinstance(ev, CloseConnection) and ev.code == 1002
    c.close()
    assert wait_for(lambda: quiet(wsrv))


# -- limits --------------------------------------------------------------------------------

def test_connection_cap_answered_before_upgrade(make_server: Any) -> None:
    srv = make_server(**SHORT, websocket=WebSocketConfig(max_connections=1))
    ws_fake.install(srv.app)
    a = RawWS(srv.url)
    assert a.status == 101
    head, body = http_once(srv.url, handshake())
    assert head.startswith(b"HTTP/1.1 429 "), head
    err = orjson.loads(body)["error"]
    assert err["type"] == "rate_limit_error" and err["code"] == "too_many_websocket_connections"
    a.close()
    assert wait_for(lambda: srv.app.stats.active_websockets == 0)
    b = RawWS(srv.url)
    assert b.status == 101
    b.close()


def test_lane_cap(make_server: Any) -> None:
    srv = make_server(**SHORT, websocket=WebSocketConfig(max_lanes=2))
    ws_fake.install(srv.app)
    c = RawWS(srv.url)
    for sid in ("a", "b", "a", None):
        msg = {"type": "response.create", **BASE}
        if sid:
            msg["stream_id"] = sid
        c.send_json(msg)
        assert c.until_terminal()[-1]["type"] == "response.completed"
    c.send_json({"type": "response.create", **BASE, "stream_id": "c"})
    e = c.recv_json()
    assert e["error"]["code"] == "websocket_stream_limit_reached" and e["stream_id"] == "c"
    c.close()


def test_connection_time_limit(make_server: Any) -> None:
    srv = make_server(latency="realistic", ttft_ms=1, itl_ms=20,
                      websocket=WebSocketConfig(connection_time_limit_s=0.3))
    ws_fake.install(srv.app)
    c = RawWS(srv.url)
    c.send_json({"type": "response.create", **BASE, "max_output_tokens": 1000})
    seen = 0
    while True:
        ev = c.recv_json()
        if ev["type"] == "error":
            break
        seen += 1
    assert 0 < seen < 1000
    assert ev["error"]["code"] == "websocket_connection_limit_reached"
    assert "stream_id" not in ev
    close = c.next_event()
    assert isinstance(close, CloseConnection) and close.code == 1001
    c.close()
    assert wait_for(lambda: quiet(srv))


def test_disconnect_mid_stream_frees_everything(make_server: Any) -> None:
    srv = make_server(latency="realistic", ttft_ms=1, itl_ms=5)
    ws_fake.install(srv.app)
    timers = srv.app.clock.pending  # the server's own (if any), not the connection's
    # generous bounds (each wait ends as soon as its condition holds): on a loaded machine the
    # first response of a fresh process (tokenizer load, imports) can take seconds
    c = RawWS(srv.url, timeout=60)
    for sid in ("one", "two"):
        c.send_json({"type": "response.create", **BASE, "max_output_tokens": 5000,
                     "stream_id": sid})
    c.send_json({"type": "response.create", **BASE, "stream_id": "one"})  # queued behind
    deltas = {"one": 0, "two": 0}  # both lanes streaming (not just the first to start)
    while min(deltas.values()) < 2:
        ev = c.recv_json()
        if ev["type"] == "response.output_text.delta":
            deltas[ev["stream_id"]] += 1
    st = srv.app.stats
    assert st.active_websockets == 1 and st.active_streams == 2
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    c.close()  # RST: the client vanishes without a close frame
    # settled = gauges back to zero AND no pump or connection timer left behind (waiting on
    # both: the connection-lost callback releases the gauges a moment before the last timer
    # is gone); a generous bound, as it returns as soon as the condition holds: a loaded
    # machine may take seconds to run the server thread
    assert wait_for(lambda: quiet(srv) and srv.app.clock.pending <= timers, timeout=60), (
        st.active_websockets, st.active_streams, st.active_connections, st.active_requests,
        srv.app.clock.pending, timers)


# -- tier 2: backpressure ------------------------------------------------------------------

async def test_slow_reader_pauses_generation() -> None:
    server = mem_server(latency="instant", max_tokens_mode="exact")
    ws_fake.install(server.app)
    proto, tr = connect(server, high_water=8192)
    client = Connection(ConnectionType.CLIENT)
    msg = json.dumps({"type": "response.create", **BASE, "max_output_tokens": 3000})
    proto.data_received(handshake() + client.send(TextMessage(data=msg)))
    for _ in range(20):
        await asyncio.sleep(0)
    assert tr.paused
    held = len(tr.out)
    assert held < 8192 + 256 * 300  # at most one batch beyond the high-water mark
    for _ in range(20):
        await asyncio.sleep(0)
    assert len(tr.out) == held  # nothing generated while the client does not read
    # while paused, client messages are not processed either (no unbounded error replies)
    proto.data_received(client.send(TextMessage(data="{bad")))
    assert not tr.reading
    received = tr.drain_client()
    head, _, frames = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ")
    client.receive_data(frames)
    types: list[str] = []
    for _ in range(5000):
        types += [json.loads(ev.data)["type"] for ev in client.events()
                  if isinstance(ev, TextMessage)]
        if "error" in types and types[-1] in ("response.completed", "response.incomplete"):
            break
        await asyncio.sleep(0)
        client.receive_data(tr.drain_client())
    assert types.count("response.output_text.delta") == 3000
    assert types.count("error") == 1  # the bad message was answered once reading resumed
    assert tr.reading
    proto.connection_lost(None)
    st = server.app.stats
    assert st.active_websockets == 0 and st.active_streams == 0


def _texts(tr: Any, head: bool = True) -> list[dict[str, Any]]:
    """The text events the server wrote since the last read (after the 101 head if
    ``head``)."""
    frames = tr.drain_client()
    if head:
        got, _, frames = frames.partition(b"\r\n\r\n")
        assert got.startswith(b"HTTP/1.1 101 ")
    client = Connection(ConnectionType.CLIENT)
    client.receive_data(frames)
    return [json.loads(ev.data) for ev in client.events() if isinstance(ev, TextMessage)]


async def test_a_create_starts_on_the_next_pass_without_a_task() -> None:
    """A create is started on the loop pass after the one that read it, as an HTTP request
    is (protocol.start_handler): its first step outside a Task, which a create that needs no
    waiting never gets; a connection gone before that pass starts nothing."""
    server = mem_server(latency="realistic", ttft_ms=1000, itl_ms=1000)
    ws_fake.install(server.app)
    st = server.app.stats
    for gone in (False, True):
        proto, tr = connect(server)
        client = Connection(ConnectionType.CLIENT)
        proto.data_received(handshake())
        for _ in range(5):
            await asyncio.sleep(0)
        assert _texts(tr) == []  # (the 101)
        msg = json.dumps({"type": "response.create", **BASE})
        proto.data_received(client.send(TextMessage(data=msg)))
        assert _texts(tr, head=False) == []  # not inside the read
        (job,) = proto.upgraded.mode._jobs
        if gone:
            proto.connection_lost(None)
        await asyncio.sleep(0)
        if gone:
            assert _texts(tr, head=False) == [] and job.done and job.task is None
            assert (st.active_requests, st.active_streams, st.active_websockets) == (0, 0, 0)
            continue
        assert [e["type"] for e in _texts(tr, head=False)] == ["response.created",
                                                              "response.in_progress"]
        assert job.task is None and st.active_streams == 1
        proto.connection_lost(None)
        await asyncio.sleep(0)
        assert (st.active_requests, st.active_streams, st.active_websockets) == (0, 0, 0)


async def test_an_upgrade_is_handled_on_the_next_pass_without_a_task() -> None:
    """The WebSocket upgrade is handled as an HTTP request is: on the loop pass after the
    one that read it, its first step outside a Task (it never waits); a connection gone
    before that pass is not upgraded."""
    server = mem_server()
    for gone in (False, True):
        proto, tr = connect(server)
        proto.data_received(handshake())
        assert proto.upgraded is None and not tr.out  # not inside the read
        if gone:
            proto.connection_lost(None)
        await asyncio.sleep(0)
        if gone:
            assert proto.upgraded is None and not tr.out
            assert server.app.stats.active_requests == 0
            continue
        assert proto.upgraded is not None and proto._task is None
        assert tr.out.startswith(b"HTTP/1.1 101 ")
        proto.connection_lost(None)
        await asyncio.sleep(0)
    assert (server.app.stats.active_requests, server.app.stats.active_websockets) == (0, 0)


async def test_creates_that_end_at_once_are_answered_in_turn() -> None:
    """Creates queued on a lane behind a running response, each ending at once (an error
    event), are all answered, in order, once it ends (each starts when the one before
    ended: no recursion, however many)."""
    from llmsim.streaming.clock import FakeClock

    server = mem_server(clock=FakeClock(), latency="realistic", ttft_ms=10, itl_ms=10,
                        output_tokens_mean=3, output_tokens_sigma=0,
                        # (no time limit: the fake clock would jump to it whenever a
                        # loop pass arms no timer)
                        websocket=WebSocketConfig(max_queued=1000,
                                                  connection_time_limit_s=0))
    ws_fake.install(server.app)
    proto, tr = connect(server)
    client = Connection(ConnectionType.CLIENT)
    good = json.dumps({"type": "response.create", **BASE})
    bad = json.dumps({"type": "response.create", **BASE, "temperature": 9})
    proto.data_received(handshake() + client.send(TextMessage(data=good)) + b"".join(
        client.send(TextMessage(data=bad)) for _ in range(600)))
    evs: list[dict[str, Any]] = []
    first = True
    for _ in range(20000):  # (bounded; ends as soon as every create is answered)
        await asyncio.sleep(0)
        evs += _texts(tr, head=first)
        first = False
        if sum(e["type"] == "error" for e in evs) == 600:
            break
    types = [e["type"] for e in evs]
    done = types.index("response.completed")
    assert types[done + 1:] == ["error"] * 600  # all queued behind the first, in order
    assert evs[-1]["error"]["param"] == "temperature"
    st = server.app.stats
    assert (st.active_requests, st.active_streams, st.active_websockets) == (0, 0, 1)
    proto.connection_lost(None)


def _opcodes(frames: bytes) -> list[int]:
    """The opcodes of a run of unmasked server frames, in order."""
    out, i = [], 0
    while i < len(frames):
        n, i0 = frames[i + 1] & 0x7F, i + 2
        if n == 126:
            n, i0 = int.from_bytes(frames[i + 2:i + 4], "big"), i + 4
        elif n == 127:
            n, i0 = int.from_bytes(frames[i + 2:i + 10], "big"), i + 10
        out.append(frames[i] & 0x0F)
        i = i0 + n
    assert i == len(frames)
    return out


@pytest.mark.parametrize("who", ["client", "server", "gone"])
async def test_no_text_frame_after_the_close_frame(who: str) -> None:
    """Once a close frame was received or sent (or the connection is gone), the session's
    wire writes no text frame: not a response's event, not an error event."""
    server = mem_server(latency="realistic", ttft_ms=1000, itl_ms=1000)
    ws_fake.install(server.app)
    proto, tr = connect(server)
    client = Connection(ConnectionType.CLIENT)
    msg = json.dumps({"type": "response.create", **BASE})
    proto.data_received(handshake() + client.send(TextMessage(data=msg)))
    for _ in range(5):
        await asyncio.sleep(0)
    session = proto.upgraded
    assert session.wire.open
    if who == "client":  # the client starts the close handshake
        proto.data_received(client.send(CloseConnection(code=1000)))
    elif who == "server":
        session.close(1000, "bye")
    else:
        proto.connection_lost(None)
    assert not session.wire.open
    session.send_event({"type": "error", "error": {"message": "late"}})
    session.wire.write_events([b'{"type":"late"}'])
    head, _, frames = tr.drain_client().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ")
    ops = _opcodes(frames)
    assert ops[0] == 0x1  # the response had started (response.created)
    if who == "gone":
        assert 0x8 not in ops
    else:
        assert ops[-1] == 0x8 and ops.count(0x8) == 1  # nothing after the close frame
    proto.connection_lost(None)


# -- tier 1: the hand-written frame equals wsproto's ----------------------------------------

@pytest.mark.parametrize("n", [0, 1, 125, 126, 127, 65535, 65536, 70000])
def test_text_frame_matches_wsproto(n: int) -> None:
    from llmsim.streaming.encode import ws_text_frame

    payload = ("é" * (n // 2) + "x" * (n % 2)).encode()
    server = Connection(ConnectionType.SERVER)
    assert ws_text_frame(payload) == server.send(TextMessage(data=payload.decode()))
    client = Connection(ConnectionType.CLIENT)
    client.receive_data(ws_text_frame(payload))
    (ev,) = list(client.events())
    assert isinstance(ev, TextMessage) and ev.data == payload.decode() and ev.message_finished


# -- lanes, cache, shutdown ----------------------------------------------------------------

def test_lanes_run_concurrently_up_to_max_active(make_server: Any) -> None:
    srv = make_server(latency="realistic", ttft_ms=1, itl_ms=3,
                      websocket=WebSocketConfig(max_active=2), **SHORT)
    ws_fake.install(srv.app)
    c = RawWS(srv.url)
    for sid in ("a", "b", "c", "a"):
        c.send_json({"type": "response.create", **BASE, "stream_id": sid})
    order: list[tuple[str, str]] = []
    done = 0
    while done < 4:
        ev = c.recv_json()
        order.append((ev["stream_id"], ev["type"]))
        done += ev["type"] in TERMINAL
    assert all(t != "error" for _, t in order)
    started = [sid for sid, t in order if t == "response.created"]
    ended = [sid for sid, t in order if t == "response.completed"]
    # a and b run together (interleaved); c waits for a free slot; a's second waits for a's first
    first_end = next(i for i, (_, t) in enumerate(order) if t == "response.completed")
    assert {sid for sid, t in order[:first_end] if t == "response.created"} == {"a", "b"}
    assert started[2] == "c"  # FIFO across lanes: c was waiting before a's second create
    assert sorted(started) == sorted(ended) == ["a", "a", "b", "c"]
    for sid in ("a", "b", "c"):  # per lane: created → ... → completed, never overlapping
        lane = [t for s, t in order if s == sid]
        opened = 0
        for t in lane:
            opened += t == "response.created"
            opened -= t == "response.completed"
            assert opened in (0, 1)
    c.close()
    assert wait_for(lambda: quiet(srv))


def test_failed_same_lane_continuation_evicts_parent(wsrv: Any) -> None:
    c = RawWS(wsrv.url)
    c.send_json({"type": "response.create", **BASE, "store": False, "stream_id": "s"})
    rid = c.until_terminal()[-1]["response"]["id"]
    # a fork on another lane that fails keeps the parent for its own lane
    c.send_json({"type": "response.create", "input": "x", "previous_response_id": rid,
                 "stream_id": "t"})  # no model: 400
    assert c.recv_json()["status"] == 400
    c.send_json({"type": "response.create", "input": "x", "store": False, "stream_id": "s",
                 "previous_response_id": rid})  # same lane, no model: 400
    assert c.recv_json()["status"] == 400
    c.send_json({"type": "response.create", **BASE, "store": False, "stream_id": "s",
                 "previous_response_id": rid})
    e = c.recv_json()
    assert e["error"]["code"] == "previous_response_not_found" and e["stream_id"] == "s"
    c.close()


def test_graceful_shutdown_closes_1001(make_server: Any) -> None:
    srv = make_server(**SHORT)
    ws_fake.install(srv.app)
    c = RawWS(srv.url)
    c.send_json({"type": "response.create", **BASE})
    assert c.until_terminal()[-1]["type"] == "response.completed"
    srv.stop()
    ev = c.next_event()
    assert isinstance(ev, CloseConnection) and ev.code == 1001
    c.close()


async def test_flooding_creates_stops_reading() -> None:
    server = mem_server(latency="realistic", ttft_ms=1000, itl_ms=1000, output_tokens_mean=12,
                        output_tokens_sigma=0, websocket=WebSocketConfig(max_queued=3))
    ws_fake.install(server.app)
    proto, tr = connect(server)
    client = Connection(ConnectionType.CLIENT)
    msg = json.dumps({"type": "response.create", **BASE})
    proto.data_received(handshake() + b"".join(client.send(TextMessage(data=msg))
                                                 for _ in range(10)))
    for _ in range(10):
        await asyncio.sleep(0)
    assert not tr.reading  # 1 running + 3 waiting; the other 6 stay unread
    session = proto.upgraded
    assert session.mode.lanes.queued == 3 and session.mode.lanes.active == 1
    proto.connection_lost(None)
    for _ in range(10):
        await asyncio.sleep(0)
    st = server.app.stats
    assert (st.active_websockets, st.active_streams, st.active_requests) == (0, 0, 0)
    assert server.app.clock.pending == 0


def test_closed_session_is_not_kept_alive_by_stored_responses(wsrv: Any) -> None:
    import gc
    import weakref

    c = RawWS(wsrv.url)
    c.send_json({"type": "response.create", **BASE})  # stored (store defaults to true)
    assert c.until_terminal()[-1]["type"] == "response.completed"
    (session,) = wsrv.app.feature(WEBSOCKET).sessions
    ref = weakref.ref(session)
    del session
    c.close()
    assert wait_for(lambda: quiet(wsrv))
    wsrv.call(gc.collect)
    assert ref() is None


def test_api_key_checked_at_the_handshake(make_server: Any) -> None:
    """With --api-key, a wrong key is refused before the upgrade (401), a right one upgrades."""
    srv = make_server(**SHORT, api_key=("sk-test",))
    head, body = http_once(srv.url, handshake().replace(b"Bearer sk-test", b"Bearer sk-nope"))
    assert head.startswith(b"HTTP/1.1 401 "), head
    assert orjson.loads(body)["error"]["code"] == "invalid_api_key"
    ok = RawWS(srv.url)
    assert ok.status == 101
    ok.close()


def test_steer_answer_is_numbered_by_the_steered_stream(make_server: Any) -> None:
    """``response.steer.failed`` for a response streaming on this connection takes the next
    number of that response's stream: the client sees one gap-free sequence 0, 1, 2, ...;
    for a response not running here it takes the connection's own stream's (the first: 0)."""
    srv = make_server(latency="realistic", ttft_ms=1, itl_ms=5)
    c = RawWS(srv.url)
    try:
        c.send_json({"type": "response.create", **BASE, "max_output_tokens": 400})
        first = c.recv_json()
        assert first["type"] == "response.created"
        rid = first["response"]["id"]
        seen = [first]
        while sum(e["type"] == "response.output_text.delta" for e in seen) < 3:
            seen.append(c.recv_json())
        c.send_json({"type": "response.steer", "previous_response_id": rid, "input": "shorter"})
        while seen[-1]["type"] not in TERMINAL:
            seen.append(c.recv_json())
        steer = [e for e in seen if e["type"] == "response.steer.failed"]
        assert len(steer) == 1 and steer[0]["steer"]["previous_response_id"] == rid
        assert steer[0]["error"]["code"] == "steering_not_supported"  # (running here)
        assert [e["sequence_number"] for e in seen] == list(range(len(seen)))
        c.send_json({"type": "response.steer", "previous_response_id": "resp_gone",
                     "input": "x"})
        ev = c.recv_json()
        assert ev["type"] == "response.steer.failed" and ev["sequence_number"] == 0
    finally:
        c.close()


def test_a_create_gets_a_request_id_like_an_http_request(make_server: Any) -> None:
    """A WebSocket create's request id (the access log's) is the HTTP one's form, ``req_``
    and 32 hex digits, from the same id stream (no system call per create)."""
    import logging
    import re

    from llmsim.state.logs import setup_logging

    srv = make_server(**SHORT)
    buf = io.StringIO()
    h = setup_logging("info", "json", buf)
    try:
        c = RawWS(srv.url)
        try:
            c.send_json({"type": "response.create", "model": "gpt-4o-mini", "input": "Hi",
                         "max_output_tokens": 16})
            assert c.until_terminal()[-1]["type"] == "response.incomplete"
        finally:
            c.close()
        assert wait_for(lambda: '"transport": "ws"' in buf.getvalue()
                        or '"transport":"ws"' in buf.getvalue())
    finally:
        logging.getLogger("llmsim").removeHandler(h)
        logging.getLogger("llmsim").setLevel(logging.WARNING)
    lines = [json.loads(ln) for ln in buf.getvalue().splitlines() if '"llmsim.access"' in ln]
    ws = [ln for ln in lines if ln["transport"] == "ws"]
    assert len(ws) == 1
    assert re.fullmatch(r"req_[0-9a-f]{32}", ws[0]["request_id"]), ws[0]["request_id"]
