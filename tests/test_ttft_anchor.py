"""A stream's schedule counts from when its request was read (issue 15): the loop pass a
request waits to be handled, and the handlers of the requests read with it, are the
simulator's own time and do not add to the client's time to first token. A handler that
waits on purpose (here: one that suspends) begins when it is done waiting."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import orjson
import pytest

from llmsim.streaming.clock import FakeClock

from .memtransport import MemTransport, connect, mem_server

TTFT, ITL = 0.050, 0.010
BODY = orjson.dumps({"model": "gpt-4o", "stream": True, "max_tokens": 3,
                     "messages": [{"role": "user", "content": "hi"}]})
RAW = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
       % (len(BODY), BODY))


class TimedTransport(MemTransport):
    """Records the clock time of every write."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.times: list[tuple[float, bytes]] = []

    def write(self, data: bytes) -> None:
        self.times.append((self.clock.now(), bytes(data)))
        super().write(data)


def _setup() -> tuple[FakeClock, Any, TimedTransport]:
    clock = FakeClock(start=100.0)
    server = mem_server(clock=clock, latency="realistic", ttft_ms=TTFT * 1000,
                        itl_ms=ITL * 1000)
    proto, _ = connect(server)
    tr = TimedTransport(clock)
    tr.protocol = proto
    proto.connection_made(tr)
    return clock, proto, tr


async def _first_token_at(tr: TimedTransport) -> float:
    for _ in range(20000):
        for t, data in tr.times:
            if re.search(rb'"content":"[^"]', data):  # (a token, not the role's empty one)
                return t
        await asyncio.sleep(0)
    raise AssertionError("no token written")


@pytest.mark.parametrize("handled_after", [0.0, 0.005, 0.030])
async def test_the_first_token_counts_from_the_read(handled_after: float) -> None:
    clock, proto, tr = _setup()
    read_at = clock.now()
    proto.data_received(RAW)  # read (and dispatched) now; handled on the next pass
    clock.advance(handled_after)  # the simulator's own delay before the handler runs
    assert await _first_token_at(tr) == pytest.approx(read_at + TTFT, abs=1e-9)
    proto.connection_lost(None)


async def test_a_handler_that_waited_begins_when_it_is_done(monkeypatch: Any) -> None:
    clock, proto, tr = _setup()
    app = proto.app
    dispatch = app.dispatch

    async def waiting(req: Any, route: Any) -> Any:
        await asyncio.sleep(0)  # (suspends: the rest runs in a Task, later)
        clock.advance(0.005)  # what it waited for took 5 ms
        return await dispatch(req, route)

    monkeypatch.setattr(app, "dispatch", waiting)
    read_at = clock.now()
    proto.data_received(RAW)
    assert await _first_token_at(tr) == pytest.approx(read_at + 0.005 + TTFT, abs=1e-9)
    proto.connection_lost(None)


async def test_a_websocket_create_counts_from_its_arrival() -> None:
    from wsproto.connection import Connection, ConnectionType
    from wsproto.events import TextMessage

    from .test_websocket_raw import handshake

    clock, proto, tr = _setup()
    proto.data_received(handshake())
    for _ in range(1000):
        if b"\r\n\r\n" in tr.out:
            break
        await asyncio.sleep(0)
    _, _, rest = tr.drain_client().partition(b"\r\n\r\n")
    client = Connection(ConnectionType.CLIENT)
    client.receive_data(rest)
    n = len(tr.times)
    create = orjson.dumps({"type": "response.create", "model": "gpt-4o", "input": "hi",
                           "max_output_tokens": 16}).decode()
    read_at = clock.now()
    proto.data_received(client.send(TextMessage(data=create)))
    clock.advance(0.005)  # before the job starts (it starts on a later pass)
    for _ in range(20000):
        firsts = [t for t, d in tr.times[n:] if b'"response.output_text.delta"' in d]
        if firsts:
            break
        await asyncio.sleep(0)
    assert firsts and firsts[0] == pytest.approx(read_at + TTFT, abs=1e-9)
    proto.connection_lost(None)
