"""A tiny raw HTTP client over sockets with h11, for what the SDK hides."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from urllib.parse import urlparse

import h11
import orjson


@dataclass
class Resp:
    status: int
    headers: dict[str, str]
    body: bytes
    raw_chunks: list[bytes] = field(default_factory=list)

    def json(self):  # type: ignore[no-untyped-def]
        return orjson.loads(self.body)

    def sse(self) -> list[tuple[str | None, str]]:
        """(event, data) pairs of an SSE body."""
        return parse_sse(self.body)


def parse_sse(body: bytes) -> list[tuple[str | None, str]]:
    """(event, data) pairs of an SSE body (``data:`` lines joined, comments skipped)."""
    out = []
    for block in body.decode().split("\n\n"):
        if not block.strip():
            continue
        ev, data = None, []
        for line in block.split("\n"):
            if line.startswith("event: "):
                ev = line[7:]
            elif line.startswith("data: "):
                data.append(line[6:])
        if data:
            out.append((ev, "\n".join(data)))
    return out


def connect(url: str, timeout: float = 10.0) -> socket.socket:
    u = urlparse(url)
    s = socket.create_connection((u.hostname, u.port), timeout=timeout)
    return s


def request(url: str, method: str, path: str, body: bytes | dict | None = None,
            headers: list[tuple[str, str]] | None = None, sock: socket.socket | None = None,
            conn: h11.Connection | None = None) -> Resp:
    """One request/response on a (possibly reused) socket + h11 connection."""
    own = sock is None
    sock = sock or connect(url)
    conn = conn or h11.Connection(h11.CLIENT)
    if isinstance(body, dict):
        body = orjson.dumps(body)
    hs = [("host", "localhost")] + list(headers or [])
    if body is not None:
        hs.append(("content-type", "application/json"))
        hs.append(("content-length", str(len(body))))
    data = conn.send(h11.Request(method=method, target=path, headers=hs))
    if body:
        data += conn.send(h11.Data(data=body))
    data += conn.send(h11.EndOfMessage())
    sock.sendall(data)
    status, rh, chunks = 0, {}, []
    while True:
        ev = conn.next_event()
        if ev is h11.NEED_DATA:
            buf = sock.recv(65536)
            conn.receive_data(buf)
            continue
        if isinstance(ev, h11.Response):
            status = ev.status_code
            rh = {k.decode(): v.decode() for k, v in ev.headers}
        elif isinstance(ev, h11.Data):
            chunks.append(bytes(ev.data))
        elif isinstance(ev, (h11.EndOfMessage, h11.ConnectionClosed)):
            break
    if own:
        sock.close()
    elif conn.our_state is h11.DONE and conn.their_state is h11.DONE:
        conn.start_next_cycle()
    return Resp(status, rh, b"".join(chunks), chunks)


def raw(url: str, payload: bytes, timeout: float = 5.0) -> bytes:
    """Send raw bytes, read until the server closes (or timeout)."""
    s = connect(url, timeout)
    s.sendall(payload)
    out = b""
    try:
        while True:
            b = s.recv(65536)
            if not b:
                break
            out += b
    except TimeoutError:
        pass
    finally:
        s.close()
    return out
