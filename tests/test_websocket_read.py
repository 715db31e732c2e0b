"""How a WebSocket connection reads frames (transport/ws.py): while every read is whole text
frames, the connection takes the messages itself (``_read_direct``); anything else hands
wsproto the rest of the connection. Both must give the same messages, and every frame the
direct reader does not take must get wsproto's answer (tier 2: an in-memory transport and a
test-only echo mode, so nothing but the transport is under test)."""

from __future__ import annotations

import asyncio
import os
import random
import struct
from typing import Any

import orjson
import pytest
from wsproto.connection import Connection, ConnectionType
from wsproto.events import CloseConnection, Ping, Pong, TextMessage

from llmsim.config import WebSocketConfig
from llmsim.routing import WSMode

from .memtransport import MemTransport, connect, mem_server

PATH = "/test/echo"


class Echo(WSMode):
    """Keeps every message and answers each with its length."""

    def __init__(self, app: Any, handshake: Any) -> None:
        self.got: list[str] = []

    def message(self, text: str) -> None:
        self.got.append(text)
        self.conn.send_event({"type": "echo", "n": len(text)})

    def error_event(self, err: Any, **extra: Any) -> dict[str, Any]:
        return {"type": "error", "message": err.message}


def handshake() -> bytes:
    return (f"GET {PATH} HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\nAuthorization: Bearer sk-test\r\n\r\n").encode()


async def opened(**ws: Any) -> tuple[Any, MemTransport, Echo]:
    server = mem_server(websocket=WebSocketConfig(**ws)) if ws else mem_server()
    server.app.router.add_ws((PATH,), Echo)
    proto, tr = connect(server)
    proto.data_received(handshake())
    for _ in range(4):
        await asyncio.sleep(0)
    assert proto.upgraded is not None, bytes(tr.out)
    head, _, rest = bytes(tr.out).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101") and not rest
    tr.out.clear()
    return proto, tr, proto.upgraded.mode


def frame(payload: bytes, opcode: int = 1, fin: bool = True, rsv: int = 0,
          mask: bytes | None = None, long16: bool = False) -> bytes:
    """A client frame built by hand (``long16``: a 16-bit length even when 7 bits do)."""
    mask = os.urandom(4) if mask is None else mask
    n = len(payload)
    b0 = (0x80 if fin else 0) | rsv << 4 | opcode
    if n < 126 and not long16:
        head = bytes((b0, 0x80 | n))
    elif n < 65536:
        head = bytes((b0, 0x80 | 126)) + struct.pack("!H", n)
    else:
        head = bytes((b0, 0x80 | 127)) + struct.pack("!Q", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def server_events(tr: MemTransport) -> list[Any]:
    client = Connection(ConnectionType.CLIENT)
    # (a client that has done the handshake: wsproto's client starts in OPEN state)
    client.receive_data(bytes(tr.out))
    return list(client.events())


PAYLOADS = ["", "{}", "x" * 125, "y" * 126, "é" * 70, "z" * 300, "日本語 🙂 text",
            "a" * 65535]


async def test_whole_frames_give_the_messages_wsproto_gives() -> None:
    # the same frames, once in one read (the direct reader) and once a byte at a time (a
    # frame split over reads: wsproto), give the same messages in the same order
    rnd = random.Random(5)
    data = b"".join(frame(p.encode(), mask=rnd.randbytes(4)) for p in PAYLOADS)
    proto, tr, direct = await opened()
    proto.data_received(data)
    assert direct.got == PAYLOADS
    assert proto.upgraded._direct  # (every read so far was taken directly)
    proto2, tr2, split = await opened()
    for i in range(len(data)):
        proto2.data_received(data[i:i + 1])
    assert split.got == PAYLOADS
    assert not proto2.upgraded._direct
    assert [orjson.loads(e.data)["n"] for e in server_events(tr)] == [len(p) for p in PAYLOADS]


@pytest.mark.parametrize("bad, code", [
    (frame(b"\xff\xfe"), 1007),  # not UTF-8
    (frame(b"hi", rsv=4), 1002),  # RSV1 set, no extension negotiated
    (frame(b"hi", long16=True), 1002),  # not the minimal length encoding
    (b"\x81\x02hi", 1002),  # unmasked
    (frame(b"hi", opcode=3), 1002),  # a reserved opcode
], ids=["not-utf8", "rsv1", "non-minimal-length", "unmasked", "reserved-opcode"])
async def test_a_frame_the_direct_reader_does_not_take_gets_wsproto_s_answer(
        bad: bytes, code: int) -> None:
    proto, tr, mode = await opened()
    proto.data_received(frame(b"first") + bad + frame(b"never"))
    assert mode.got == ["first"]
    evs = server_events(tr)
    assert isinstance(evs[-1], CloseConnection) and evs[-1].code == code


async def test_a_whole_frame_over_the_message_cap_closes_1009() -> None:
    proto, tr, mode = await opened(max_message_bytes=100)
    proto.data_received(frame(b"x" * 100) + frame(b"y" * 101))
    assert mode.got == ["x" * 100]
    evs = server_events(tr)
    assert isinstance(evs[-1], CloseConnection) and evs[-1].code == 1009


async def test_after_a_control_frame_wsproto_reads_the_rest() -> None:
    # a message, a ping and a fragmented message in one read, then a whole frame: all
    # answered in order, the pong too
    proto, tr, mode = await opened()
    proto.data_received(frame(b"one") + frame(b"ping!", opcode=9)
                        + frame(b"tw", fin=False) + frame(b"o", opcode=0))
    assert not proto.upgraded._direct
    proto.data_received(frame(b"three"))
    assert mode.got == ["one", "two", "three"]
    evs = server_events(tr)
    assert [type(e) for e in evs] == [TextMessage, Pong, TextMessage, TextMessage]
    assert not any(isinstance(e, Ping) for e in evs)


async def test_a_connection_closed_by_the_direct_reader_releases_everything() -> None:
    # a whole frame over the cap, then the client goes: the gauges and the server-wide
    # budget of unfinished messages are back to zero, no timer left armed for it
    from llmsim.transport.ws import state

    proto, tr, mode = await opened(max_message_bytes=100)
    proto.data_received(frame(b"x" * 101) + frame(b"never"))
    assert isinstance(server_events(tr)[-1], CloseConnection)
    proto.connection_lost(None)
    for _ in range(4):
        await asyncio.sleep(0)
    st = proto.app.stats
    assert (st.active_websockets, st.active_requests, st.active_connections) == (0, 0, 0)
    assert state(proto.app).pending_bytes == 0 and not state(proto.app).sessions
    assert mode.got == []
