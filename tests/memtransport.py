"""In-memory transport: drive an HTTPProtocol with bytes, collect what it writes (tier 2)."""

from __future__ import annotations

import asyncio
from typing import Any

from llmsim import Config
from llmsim.streaming.clock import Clock
from llmsim.transport.http import HTTPProtocol
from llmsim.transport.server import Server


class MemTransport(asyncio.Transport):
    def __init__(self, high_water: int | None = None) -> None:
        super().__init__()
        self.out = bytearray()
        self.closed = False
        self.aborted = False
        self.reading = True
        self.protocol: HTTPProtocol | None = None
        self.high_water = high_water
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name == "peername":
            return ("127.0.0.1", 50000)
        return default

    def write(self, data: bytes) -> None:
        assert not self.closed, "write after close"
        self.out += data
        if self.high_water is not None and len(self.out) > self.high_water and not self.paused:
            self.paused = True
            assert self.protocol is not None
            self.protocol.pause_writing()

    def drain_client(self) -> bytes:
        """The client reads everything written so far (resumes writing if paused)."""
        data = bytes(self.out)
        self.out.clear()
        if self.paused:
            self.paused = False
            assert self.protocol is not None
            self.protocol.resume_writing()
        return data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)

    def abort(self) -> None:
        self.aborted = True
        self.close()

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def mem_server(clock: Clock | None = None, **kw: Any) -> Server:
    base: dict[str, Any] = {"port": 0, "latency": "instant", "seed": 7, "quiet": True,
                            "max_tokens_mode": "exact"}  # (see conftest.cfg)
    base.update(kw)
    return Server(Config(**base), clock=clock)


def connect(server: Server, high_water: int | None = None) -> tuple[HTTPProtocol, MemTransport]:
    proto = HTTPProtocol(server)
    tr = MemTransport(high_water)
    tr.protocol = proto
    proto.connection_made(tr)
    return proto, tr
