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
import errno
import gc
import logging
import socket
import threading
from collections.abc import Callable, Collection
from typing import Any

from ..app import App
from ..config import Config
from ..sim import tokens
from ..streaming.clock import Clock
from .http import HTTPProtocol

# The collector's young-generation threshold a serving process runs with (``Server.settle``;
# CPython's default is 700). Measured at 1000 streams (issue 15, RESULTS.md): 0.20-0.28 µs of
# collection per event at 700, 0.015-0.05 at 5000, with no longer pauses (see settle).
GC_YOUNG_THRESHOLD = 5000

BACKLOG = 4096  # pending connections the kernel holds for each listening socket
# Connections accepted at most per readiness of a listening socket (one loop pass): 16 a pass
# is ~16,000 a second on a busy loop, and ~0.3 ms of work (a connection costs ~20 µs to take
# over), so a flood of connects cannot stall the streams in flight.
ACCEPT_BATCH = 16
ACCEPT_RETRY_S = 0.1  # out of file descriptors (or memory): accept again after this long

__all__ = ["Server", "ServerThread"]

log = logging.getLogger("llmsim")


def bound_socket(family: int, sockaddr: Any, *, reuse_port: bool = False,
                 listen: bool = True) -> socket.socket:
    """A TCP socket bound to ``sockaddr`` as ``loop.create_server`` binds one
    (``SO_REUSEADDR``, an IPv6 socket IPv6-only; ``SO_REUSEPORT`` for the workers), and
    with ``listen`` listening and non-blocking. Every server socket is made here."""
    s = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6 and hasattr(socket, "IPPROTO_IPV6"):
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        s.bind(sockaddr)
        if listen:
            s.listen(BACKLOG)
            s.setblocking(False)
    except BaseException:
        s.close()
        raise
    return s


def listening_sockets(host: str, port: int) -> list[socket.socket]:
    """Bound, listening, non-blocking sockets for ``host:port``, one per address the name
    resolves to (as ``loop.create_server`` binds them)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                               flags=socket.AI_PASSIVE)
    socks: list[socket.socket] = []
    seen: set[tuple[int, Any]] = set()
    try:
        for family, _, _, _, sockaddr in infos:
            if (family, sockaddr) in seen:
                continue
            seen.add((family, sockaddr))
            try:
                socks.append(bound_socket(family, sockaddr))
            except OSError as exc:
                raise OSError(exc.errno, f"error while attempting to bind on address "
                                         f"{sockaddr!r}: {exc.strerror}") from None
    except BaseException:
        for s in socks:
            s.close()
        raise
    return socks


class Listener:
    """Accepts the connections of a server's listening sockets, up to :data:`ACCEPT_BATCH`
    each time one is readable, and hands each to ``loop.connect_accepted_socket``.

    Why not ``loop.create_server``: libuv (under uvloop) accepts one connection per loop
    pass since 1.45 (libuv#3696). A busy simulator runs a pass every millisecond or so, so a
    load test that opens a thousand connections at once waited in the kernel's accept queue:
    228 connections queued and the last accepted 280 ms late at 1000 WebSocket streams
    (TTFT error p99 +150-260 ms; issue 15). asyncio's own loop accepts up to its backlog per
    pass; this does the same on every loop, bounded."""

    def __init__(self, loop: asyncio.AbstractEventLoop, socks: list[socket.socket],
                 factory: Callable[[], asyncio.Protocol]) -> None:
        self.loop = loop
        self.sockets = socks
        self.factory = factory
        self._adopting: set[asyncio.Task[Any]] = set()
        self._retry: asyncio.TimerHandle | None = None
        self.closed = False

    def start(self) -> None:
        for s in self.sockets:
            self.loop.add_reader(s.fileno(), self._accept, s)

    def _accept(self, lsock: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _addr = lsock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:  # the client gave up while it waited: next
                continue
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # no descriptor (or memory) for one more: the connections wait in the
                    # kernel's queue until some close; try again shortly, not in a busy loop
                    log.warning("cannot accept a connection: %s; retrying in %gs",
                                exc.strerror, ACCEPT_RETRY_S)
                    self._pause()
                    return
                log.exception("accept failed")
                return
            try:
                conn.setblocking(False)
                task = self.loop.create_task(self._adopt(conn))
            except Exception:  # (the loop is closing)
                conn.close()
                return
            self._adopting.add(task)
            task.add_done_callback(self._adopting.discard)

    async def _adopt(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self.factory, conn)
        except Exception as exc:  # the client reset it before its transport was made
            log.debug("dropped an accepted connection: %r", exc)
            conn.close()

    def _pause(self) -> None:
        for s in self.sockets:
            self.loop.remove_reader(s.fileno())
        self._retry = self.loop.call_later(ACCEPT_RETRY_S, self._resume)

    def _resume(self) -> None:
        self._retry = None
        if not self.closed:
            self.start()

    async def adopted(self) -> None:
        """Wait until every connection accepted so far has its transport and protocol."""
        while self._adopting:
            await asyncio.gather(*self._adopting, return_exceptions=True)

    def close(self) -> None:
        """Stop accepting and close the listening sockets (connections stay)."""
        if self.closed:
            return
        self.closed = True
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        for s in self.sockets:
            if s.fileno() >= 0:
                self.loop.remove_reader(s.fileno())
            s.close()


class Server:
    """An llmsim server bound to ``config.host:config.port``."""

    def __init__(self, config: Config | None = None, *, clock: Clock | None = None,
                 sock: socket.socket | None = None, state_dir: str | None = None) -> None:
        self.config = config or Config()
        self.app = App(self.config, clock=clock, state_dir=state_dir)
        self.connections: set[HTTPProtocol] = set()
        # the requests its connections read, to handle on the loop's next pass (http.py)
        self.due: list[tuple[Callable[[Any, Any], Any], Any, Any]] = []
        self.due_loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None  # (a loop without add_reader)
        self._listener: Listener | None = None
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
        if self._sock is not None:  # (given: listening may not have been asked of it)
            self._sock.listen(BACKLOG)
            self._sock.setblocking(False)
            socks = [self._sock]
        else:
            socks = listening_sockets(self.config.host, self.config.port)
        listener = Listener(loop, socks, lambda: HTTPProtocol(self))
        try:
            listener.start()
            self._listener = listener
        except NotImplementedError:  # a loop without add_reader (Windows' proactor)
            listener.closed = True
            for s in socks[1:]:
                s.close()
            self._server = await loop.create_server(lambda: HTTPProtocol(self), sock=socks[0],
                                                    backlog=BACKLOG)
        # load the tokenizer files off the loop now; the first request waits only if needed
        if self.config.tokenizer == "auto":
            self._warming = [loop.run_in_executor(None, tokens.get_encoding, enc)
                             for enc in ("o200k_base", "cl100k_base")]
        # the sweep is polled by one loop timer, not put on the app clock's heap: a FakeClock
        # would jump to it whenever the loop is idle, and the heap must hold stream timers only
        self._sweeper = loop.call_later(self._sweep_every, self._sweep)
        addr = socks[0].getsockname()
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
        if self._serving:
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

    @property
    def _serving(self) -> bool:
        return self._listener is not None or self._server is not None

    async def close(self, grace: float | None = None) -> None:
        """Stop accepting; let in-flight requests finish within ``grace`` s; close the rest."""
        if not self._serving:
            return
        grace = self.config.shutdown_grace_s if grace is None else grace
        if self._listener is not None:
            self._listener.close()
            # connections accepted just before are being set up: let them join
            # self.connections, so the shutdown below closes them too
            await self._listener.adopted()
        if self._server is not None:
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
        if self._server is not None and not self.connections:
            await self._server.wait_closed()
        self._server = None
        self._listener = None

    async def serve_forever(self, stop: asyncio.Event | None = None) -> None:
        """Start (if needed) and serve until ``stop`` is set, then close gracefully."""
        if not self._serving:
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


def run_loop(coro: Any, cfg: Config) -> Any:
    """Run ``coro`` on the event loop chosen by ``--loop`` (auto: uvloop when installed)."""
    if cfg.loop != "asyncio":
        try:
            import uvloop  # type: ignore[import-not-found]
        except ImportError:
            if cfg.loop == "uvloop":
                coro.close()
                raise SystemExit("llmsim: error: --loop uvloop needs uvloop "
                                 "(pip install 'llmsim[fast]')") from None
        else:
            return uvloop.run(coro)
    return asyncio.run(coro)
