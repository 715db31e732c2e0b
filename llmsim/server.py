"""The embeddable server: ``async with Server(config) as srv: ... srv.url``.

``Server`` binds on ``start()`` (port 0 allowed: the real port is read back from the socket),
serves until ``close()``, which stops accepting, lets in-flight requests finish for up to
``grace`` seconds, then aborts what is left. :class:`ServerThread` runs one in a background
thread with its own loop for synchronous test code::

    with ServerThread(Config(port=0, latency="instant")) as srv:
        client = OpenAI(base_url=srv.url + "/v1", api_key="x")
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import threading
from collections.abc import Collection
from typing import Any

from .app import App
from .clock import Clock
from .config import Config
from .protocol import HTTPProtocol
from .sim import tokens

# The collector's young-generation threshold a serving process runs with (``Server.settle``;
# CPython's default is 700). Measured at 1000 streams (issue 15, RESULTS.md): 0.19-0.28 µs of
# collection per event at 700, 0.08 at 5000, with no longer pauses (see settle).
GC_YOUNG_THRESHOLD = 5000

__all__ = ["Server", "ServerThread"]

log = logging.getLogger("llmsim")


class Server:
    """An llmsim server bound to ``config.host:config.port``."""

    def __init__(self, config: Config | None = None, *, clock: Clock | None = None,
                 sock: socket.socket | None = None, state_dir: str | None = None) -> None:
        self.config = config or Config()
        self.app = App(self.config, clock=clock, state_dir=state_dir)
        self.connections: set[HTTPProtocol] = set()
        self._server: asyncio.base_events.Server | None = None
        self._sock = sock
        self._idle: asyncio.Event | None = None  # created on start (needs a loop)
        self.host = self.config.host
        self.port = self.config.port
        # connection deadlines (header, idle, write stall) are times on the app's clock
        self._loop_time = self.app.clock.now
        self._sweeper: asyncio.TimerHandle | None = None
        c = self.config
        # check deadlines often enough that a timeout fires at most ~50% late (≥ 20 ms)
        timeouts = [t for t in (c.header_timeout_s, c.idle_timeout_s, c.write_stall_timeout_s)
                    if t > 0]
        self._sweep_every = max(0.02, min([1.0, *(t / 2 for t in timeouts)]))
        self.app.drop_departed = self.drop_departed
        self._warming: list[asyncio.Future[Any]] = []  # start-up loads (settle awaits them)
        self._settling: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """``http://host:port`` of the bound socket (IPv6 hosts in brackets)."""
        host = self.host
        if ":" in host:
            host = f"[{host}]"
        if host in ("0.0.0.0", "[::]"):
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"

    async def start(self) -> Server:
        loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._idle.set()
        kwargs: dict[str, Any] = {"backlog": 4096}
        if self._sock is not None:
            self._server = await loop.create_server(lambda: HTTPProtocol(self),
                                                    sock=self._sock, **kwargs)
        else:
            self._server = await loop.create_server(lambda: HTTPProtocol(self),
                                                    self.config.host, self.config.port,
                                                    reuse_address=True, **kwargs)
        # load the tokenizer files off the loop now; the first request waits only if needed
        if self.config.tokenizer == "auto":
            self._warming = [loop.run_in_executor(None, tokens.get_encoding, enc)
                             for enc in ("o200k_base", "cl100k_base")]
        # the sweep is polled by one loop timer, not put on the app clock's heap: a FakeClock
        # would jump to it whenever the loop is idle, and the heap must hold stream timers only
        self._sweeper = loop.call_later(self._sweep_every, self._sweep)
        s = self._server.sockets[0]
        addr = s.getsockname()
        self.host, self.port = addr[0], addr[1]
        for hook in self.app.on_start:
            await hook(self.app)
        return self

    async def settle(self) -> None:
        """Finish the start-up work (the tokenizer files, the lorem text ring), then take
        every object alive now out of the garbage collector's sight (``gc.freeze``).

        What a process holds after start-up (modules, tokenizer tables, the ring) lives as
        long as the process; left in the collector's oldest generation, each full collection
        walks it: a pause of ~15-30 ms that every stream in flight sees (TTFT p99 at 500
        streams). Frozen, a full collection takes ~3 ms. ``python -m llmsim`` and each
        ``--workers`` process call this once started; a harness embedding :class:`Server`
        may call it too (it freezes the whole process: objects alive now are never
        collected, so call it once, after start-up).

        It also raises the young generation's threshold to :data:`GC_YOUNG_THRESHOLD`
        (process-wide too). A stream's objects live for its whole reply, so under steady load
        the young count (allocations minus deallocations, of any generation) wanders up to
        the threshold while the young *list* keeps every stream started since the last
        collection: at 700 a young collection walks either a few hundred objects or, often,
        every stream in flight (~15 ms at 1000 streams), 17 times a second. At 5000 it runs
        a tenth as often, with pauses no longer (they are bounded by what is alive), and
        cyclic garbage (error paths) still waits for at most that many allocations."""
        for fut in self._warming:
            try:
                await fut
            except Exception:  # (a tokenizer that cannot load is the request's business)
                log.debug("tokenizer warm-up failed", exc_info=True)
        tokens.lorem_ring()
        gc.collect()
        gc.freeze()
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(GC_YOUNG_THRESHOLD, older, oldest)

    def settle_soon(self) -> None:
        """Run :meth:`settle` in the background (the server keeps the task)."""
        self._settling = asyncio.get_running_loop().create_task(self.settle())

    def loop_time(self) -> float:
        """Now on the app's clock: what connection deadlines are measured in."""
        return self._loop_time()

    def _sweep(self) -> None:
        """Close connections whose header/idle deadline has passed and cut those that have
        read nothing for the write-stall timeout (one timer per server; the deadlines are on
        the app's clock, so a FakeClock test moves them with ``clock.advance``)."""
        now = self._loop_time()
        for c in [c for c in self.connections
                  if c._deadline <= now or c._stall_deadline <= now]:
            try:
                if c._stall_deadline <= now:
                    c._on_write_stall()
                else:
                    c._on_timeout()
            except Exception:  # one broken connection must not stop the sweep for all
                log.exception("connection timeout failed")
                c.force_close()
        if self._server is not None:
            self._sweeper = asyncio.get_running_loop().call_later(self._sweep_every,
                                                                  self._sweep)

    def drop_departed(self, clients: Collection[str]) -> int:
        """Close the HTTP connections of ``clients`` (peer addresses whose request waits, e.g.
        queued for a capacity sequence) that have sent EOF: the client left, and closing
        cancels its waiting request at once instead of when its turn comes. Returns how many.
        (A client that only half-closed its side is treated as gone too, as nginx does.)"""
        n = 0
        for c in [c for c in self.connections if c.peer in clients]:
            if c.upgraded is None and c.conn.trailing_data[1]:
                c.force_close()
                n += 1
        return n

    def _conn_closed(self) -> None:
        if not self.connections and self._idle is not None:
            self._idle.set()

    async def close(self, grace: float | None = None) -> None:
        """Stop accepting; let in-flight requests finish within ``grace`` s; close the rest."""
        if self._server is None:
            return
        grace = self.config.shutdown_grace_s if grace is None else grace
        self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for hook in self.app.on_stop:
            try:
                await hook(self.app)
            except Exception:  # pragma: no cover - best effort
                pass
        if self.connections:
            assert self._idle is not None
            self._idle.clear()
            for c in list(self.connections):
                c.shutdown()
            if self.connections:
                try:
                    await asyncio.wait_for(self._idle.wait(), timeout=grace)
                except TimeoutError:
                    pass
            for c in list(self.connections):
                c.force_close()
            # let connection_lost callbacks run
            for _ in range(3):
                if not self.connections:
                    break
                await asyncio.sleep(0)
        await self._server.wait_closed() if not self.connections else None
        self._server = None

    async def serve_forever(self, stop: asyncio.Event | None = None) -> None:
        """Start (if needed) and serve until ``stop`` is set, then close gracefully."""
        if self._server is None:
            await self.start()
        stop = stop or asyncio.Event()
        await stop.wait()
        await self.close()

    async def __aenter__(self) -> Server:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close(grace=0.5)


class ServerThread:
    """Run a :class:`Server` in a daemon thread (its own event loop) for synchronous code."""

    def __init__(self, config: Config | None = None, **kwargs: Any) -> None:
        self.config = config or Config(port=0)
        self._kwargs = kwargs
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self.server: Server | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url

    @property
    def app(self) -> App:
        assert self.server is not None
        return self.server.app

    def start(self) -> ServerThread:
        self._thread = threading.Thread(target=self._main, name="llmsim", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)

        async def run() -> None:
            self._stop = asyncio.Event()
            try:
                self.server = Server(self.config, **self._kwargs)
                await self.server.start()
            except BaseException as exc:
                self._error = exc
                self._ready.set()
                return
            self._ready.set()
            await self._stop.wait()
            await self.server.close(grace=0.5)

        try:
            loop.run_until_complete(run())
        finally:
            loop.close()

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the server's loop and return its result (thread-safe)."""
        assert self._loop is not None
        fut: Any = asyncio.run_coroutine_threadsafe(_call(fn, *args), self._loop)
        return fut.result(10)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


async def _call(fn: Any, *args: Any) -> Any:
    res = fn(*args)
    if asyncio.iscoroutine(res):
        res = await res
    return res
