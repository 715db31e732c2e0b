"""Helpers for fault/rate-limit/capacity tests: one HTTP exchange over the in-memory transport
(the real protocol stack, optionally on a FakeClock), parsed with an h11 client."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import h11
import orjson

from llmsim.streaming.clock import FakeClock
from llmsim.transport.server import Server

from .memtransport import connect, mem_server
from .rawhttp import parse_sse

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello there"}]}


@dataclass
class Exchange:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    complete: bool = False  # the response ended properly (EndOfMessage)
    aborted: bool = False  # the server dropped the connection (transport.abort)
    closed: bool = False
    times: list[float] = field(default_factory=list)  # clock time of each body chunk
    chunks: list[bytes] = field(default_factory=list)

    def json(self) -> Any:
        return orjson.loads(self.body)

    def sse(self) -> list[tuple[str | None, Any]]:
        """(event, data) pairs; data parsed as JSON except ``[DONE]``."""
        return [(ev, d if d == "[DONE]" else orjson.loads(d)) for ev, d in parse_sse(self.body)]

    def chat_tokens(self) -> list[str]:
        return [d["choices"][0]["delta"]["content"] for _e, d in self.sse()
                if isinstance(d, dict) and d.get("choices")
                and d["choices"][0]["delta"].get("content")]


def server(clock: FakeClock | None = None, **kw: Any) -> Server:
    return mem_server(clock=clock, **kw)


async def exchange(srv: Server, body: Any, headers: list[tuple[str, str]] | None = None,
                   path: str = "/v1/chat/completions", method: str = "POST",
                   max_passes: int = 200_000) -> Exchange:
    """Send one request through the protocol; run the loop until the response is complete
    or the connection is gone."""
    proto, tr = connect(srv)
    cl = h11.Connection(h11.CLIENT)
    raw = b"" if body is None else (body if isinstance(body, bytes) else orjson.dumps(body))
    hs = [("host", "x"), ("content-length", str(len(raw)))] + list(headers or [])
    proto.data_received(cl.send(h11.Request(method=method, target=path, headers=hs))
                        + cl.send(h11.Data(data=raw)) + cl.send(h11.EndOfMessage()))
    ex = Exchange()
    clock = srv.app.clock
    for _ in range(max_passes):
        await asyncio.sleep(0)
        if tr.out:
            cl.receive_data(bytes(tr.out))
            tr.out.clear()
            while True:
                ev = cl.next_event()
                if ev is h11.NEED_DATA or ev is h11.PAUSED:
                    break
                if isinstance(ev, h11.Response):
                    ex.status = ev.status_code
                    ex.headers = {k.decode(): v.decode() for k, v in ev.headers}
                elif isinstance(ev, h11.Data):
                    ex.body += bytes(ev.data)
                    ex.chunks.append(bytes(ev.data))
                    ex.times.append(clock.now())
                elif isinstance(ev, h11.EndOfMessage):
                    ex.complete = True
                    break
        if ex.complete or tr.closed:
            break
    ex.aborted = tr.aborted
    ex.closed = tr.closed
    if not tr.closed:
        tr.close()
    await asyncio.sleep(0)
    return ex
