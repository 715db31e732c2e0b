"""Garbage-collector pauses (issue 15): an ended stream's objects are freed by reference
counting, not left as cycles for a full collection (a pause every stream in flight sees), and
``Server.settle`` freezes what start-up leaves alive."""

from __future__ import annotations

import asyncio
import gc

import orjson
import pytest

from llmsim.state.stats import StreamTrack
from llmsim.streaming.clock import FakeClock
from llmsim.streaming.flow import Pump
from llmsim.streaming.stream import EventStream
from llmsim.transport.server import GC_YOUNG_THRESHOLD, Server

from .memtransport import connect, mem_server


def _post(path: str, body: dict) -> bytes:
    data = orjson.dumps(body)
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def _alive(kinds: tuple[type, ...]) -> list[object]:
    return [o for o in gc.get_objects() if type(o) in kinds]


@pytest.mark.parametrize("path, body, done", [
    ("/v1/chat/completions", {"model": "gpt-4o-mini", "stream": True, "max_tokens": 20,
                              "messages": [{"role": "user", "content": "Hi"}]},
     b"data: [DONE]"),
    ("/v1/responses", {"model": "gpt-4o-mini", "stream": True, "max_output_tokens": 20,
                       "input": "Hi", "store": False}, b"response.incomplete"),
])
async def test_an_ended_stream_is_freed_without_a_collection(path, body, done) -> None:
    clock = FakeClock()
    server = mem_server(clock=clock, latency="realistic", ttft_ms=20, itl_ms=5)
    proto, tr = connect(server)
    gc.collect()
    gc.disable()
    try:
        proto.data_received(_post(path, body))
        await asyncio.sleep(0)  # (a request is handled on the loop's next pass)
        assert proto._pump is not None
        kinds = (Pump, EventStream, StreamTrack, type(proto._pump.observer))
        assert len(_alive(kinds)) == 4
        for _ in range(10_000):
            if done in tr.out:
                break
            await asyncio.sleep(0)
        assert done in tr.out
        for _ in range(5):
            await asyncio.sleep(0)
        assert _alive(kinds) == []  # no collection ran: freed by reference counting
    finally:
        gc.enable()
        proto.connection_lost(None)


async def test_settle_freezes_what_start_up_left() -> None:
    server = Server(mem_server().config)
    await server.start()
    thresholds = gc.get_threshold()
    try:
        before = gc.get_freeze_count()
        await server.settle()
        assert gc.get_freeze_count() > before
        assert gc.get_threshold() == (GC_YOUNG_THRESHOLD, *thresholds[1:])
    finally:
        gc.unfreeze()  # (the test process goes on: give the collector its objects back)
        gc.set_threshold(*thresholds)
        await server.close()
