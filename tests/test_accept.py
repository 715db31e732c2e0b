"""Accepting connections (issue 15): the server accepts up to ``ACCEPT_BATCH`` pending
connections each time its listening socket is readable, on asyncio's loop and on uvloop (whose
libuv accepts one per loop pass since libuv#3696: a busy server left a load test's ramp waiting
in the kernel's accept queue for hundreds of milliseconds). Out of descriptors, it pauses and
tries again; closed, it refuses; a port in use is a clear error."""

from __future__ import annotations

import asyncio
import errno
import socket
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from llmsim import Config
from llmsim.transport import server as server_mod
from llmsim.transport.server import ACCEPT_BATCH, Listener, Server


def _run(loop_kind: str, coro: Callable[[], Coroutine[Any, Any, None]]) -> None:
    if loop_kind == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(coro())
    else:
        asyncio.run(coro())


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_burst_of_connections_is_accepted_in_a_few_loop_passes(loop_kind: str) -> None:
    n = 96

    async def main() -> None:
        srv = Server(Config(port=0, quiet=True))
        await srv.start()
        passes = [0]
        busy = [True]
        loop = asyncio.get_running_loop()

        def spin() -> None:  # a busy loop: every pass does ~1 ms of other work
            t = time.monotonic()
            while time.monotonic() - t < 0.001:
                pass
            passes[0] += 1
            if busy[0]:
                loop.call_soon(spin)

        clients = []
        try:
            loop.call_soon(spin)
            await asyncio.sleep(0)  # (busy from here on)
            for _ in range(n):  # the kernel completes each handshake; the server has to accept
                c = socket.socket()
                c.setblocking(False)
                try:
                    c.connect(("127.0.0.1", srv.port))
                except BlockingIOError:
                    pass
                clients.append(c)
            passes[0] = 0
            while len(srv.connections) < n and passes[0] < 4 * n:
                await asyncio.sleep(0)
            busy[0] = False
            assert len(srv.connections) == n
            # one accept per pass would take n passes; the batch takes n / ACCEPT_BATCH
            # (each pass also starts the transports the previous one accepted)
            assert passes[0] <= n // ACCEPT_BATCH + 8, passes[0]
        finally:
            busy[0] = False
            for c in clients:
                c.close()
            await srv.close(grace=0)

    _run(loop_kind, main)


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_closed_server_refuses_connections(loop_kind: str) -> None:
    async def main() -> None:
        srv = Server(Config(port=0, quiet=True))
        await srv.start()
        port = srv.port
        _, w = await asyncio.open_connection("127.0.0.1", port)
        w.close()
        await srv.close(grace=0)
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)

    _run(loop_kind, main)


async def test_a_port_in_use_is_a_clear_error() -> None:
    a = Server(Config(port=0, quiet=True))
    await a.start()
    try:
        b = Server(Config(port=a.port, quiet=True))
        with pytest.raises(OSError) as exc:
            await b.start()
        assert exc.value.errno == errno.EADDRINUSE
        assert "bind" in str(exc.value)
    finally:
        await a.close(grace=0)


async def test_out_of_descriptors_it_pauses_then_accepts_again(monkeypatch: Any) -> None:
    monkeypatch.setattr(server_mod, "ACCEPT_RETRY_S", 0.01)
    loop = asyncio.get_running_loop()
    socks = server_mod.listening_sockets("127.0.0.1", 0)
    made: list[asyncio.BaseTransport] = []

    class P(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
            made.append(transport)

    lst = Listener(loop, socks, P)
    lst.start()

    class Exhausted:  # a listening socket whose accept finds no descriptor left
        def accept(self) -> Any:
            raise OSError(errno.EMFILE, "Too many open files")

    try:
        lst._accept(Exhausted())  # type: ignore[arg-type]
        assert lst._retry is not None  # paused: no reader on the socket, a retry armed
        c = socket.create_connection(socks[0].getsockname()[:2])
        await asyncio.sleep(0.005)
        assert made == []  # (waits in the kernel's queue meanwhile)
        for _ in range(200):
            if made:
                break
            await asyncio.sleep(0.005)
        assert len(made) == 1 and lst._retry is None  # accepted once the retry came
        c.close()
    finally:
        lst.close()
        for t in made:
            t.close()
    assert all(s.fileno() == -1 for s in socks)


async def test_a_connection_accepted_as_the_server_closes_is_closed_too() -> None:
    """Close while a just-accepted connection is still being set up: it joins the server's
    connections before the shutdown, which closes it (it is not left open, unserved)."""
    srv = Server(Config(port=0, quiet=True))
    await srv.start()
    lst = srv._listener
    assert lst is not None
    lsock = lst.sockets[0]
    asyncio.get_running_loop().remove_reader(lsock.fileno())  # (accepted by hand below)
    client = socket.create_connection(("127.0.0.1", srv.port))
    client.settimeout(5)
    try:
        lst._accept(lsock)  # a pass accepted it: its transport is made on a later pass
        assert srv.connections == set() and len(lst._adopting) == 1
        await srv.close(grace=0)
        assert srv.connections == set()
        assert await asyncio.to_thread(client.recv, 1) == b""  # closed by the shutdown
    finally:
        client.close()
