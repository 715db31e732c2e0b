"""One asyncio protocol object per TCP connection: h11 reads requests, one function writes.

Theory of operation. Bytes come in through ``data_received`` → ``h11.receive_data``; events
come out of ``next_event()`` until h11 says ``NEED_DATA`` (wait for bytes) or ``PAUSED`` (a
request is in flight; pipelined bytes stay in h11's buffer). A complete request becomes a
frozen :class:`Request`; its handler runs on the loop's next pass (:meth:`HTTPProtocol._handle`:
after the events due meanwhile, and together with the other requests of the same read), in a
Task only if it suspends; its Result goes out through :meth:`_out`.

The connection is in one :class:`Phase` (``IDLE`` → ``READING`` → ``HANDLING`` →
[``STREAMING``] → ``IDLE`` …, or ``UPGRADED`` / ``CLOSED``), and what belongs to the request
in flight (its head, id, keep-alive, framing, gauges) is one :class:`Exchange`, dropped when
its response ends.

One outbound function. Every byte of an HTTP response (an informational head, a response
head, a fixed body, a stream's frames with their chunk framing, the last chunk) is written by
:meth:`HTTPProtocol._out`, which decides in one place, when the head goes out: the framing
(Content-Length for a complete body; chunked for a stream on HTTP/1.1; on HTTP/1.0, which has
no chunked encoding, a body delimited by closing the connection), ``connection: close``
(HTTP/1.0, a client's ``Connection: close``, a Content-Length + Transfer-Encoding request,
shutdown), and whether a body may follow at all: never to ``HEAD`` (which still gets the head
GET would get, Content-Length included) nor with 1xx/204/304 (RFC 9110 §9.3.2, §15). The
head is assembled from precomputed bytes (status lines, the constant headers, the Date of the
current second) instead of being validated header by header by h11; headers that handlers
add are checked for CR/LF/NUL once. Stream frames are framed by hand
(``b"%x\\r\\n…\\r\\n"``, ~0.1 µs; h11's framing costs ~1.7 µs a token). h11 keeps the reading
side: after each response a fresh ``h11.Connection`` takes over the bytes that arrived behind
the request (pipelining), so h11's writer state never has to be kept in step.

Limits and timeouts: the request head is capped (431), bodies are capped (413, decided from
Content-Length before reading when possible), pipelined input is bounded (reading pauses while
a request is in flight and more than ``PIPELINE_BUFFER`` bytes or ``--max-pipelined`` request
heads wait), a connection that does not deliver a request head within ``header_timeout_s`` or
stays idle for ``idle_timeout_s`` is closed. The deadlines are times on the app's clock
(``app.clock``), checked by one periodic sweep per server (``Server._sweep``): arming one is a
float store and a closed connection leaves no timer behind. Backpressure: ``pause_writing``
marks the protocol paused, the stream's pump stops pulling events; ``resume_writing`` restarts
it. A client that stays paused (reads nothing) for ``write_stall_timeout_s`` is cut: the
connection is aborted (a graceful close would wait for the unread buffer forever) and its
stream, request and connection counters are released. ``connection_lost`` cancels the handler
task and the pump, releasing every counter exactly once.

Failures. Any exception between dispatch and the last byte (rendering, JSON encoding, a
broken hook) is caught in ``_run``/``_upgrade`` (the first step and the Task alike) and in
the stream's pump (``flow.Pump``): before the head it becomes the OpenAI 500 envelope, after
it a terminal error event and a clean end; the connection never stays busy with no answer.

A request carrying both Content-Length and Transfer-Encoding (the request smuggling shape,
RFC 9112 §6.1) is answered with ``connection: close`` and the connection is closed.

A WebSocket upgrade (``GET /v1/responses`` with ``Upgrade: websocket``) is handed to
``transport.ws.upgrade``, which answers 101 via :meth:`switch_protocol` and then receives all
further bytes, starting with h11's trailing data.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
import struct
import time
from collections.abc import Callable
from email.utils import formatdate
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import parse_qs

import h11

from ..app import App
from ..errors import APIError, E, server_error
from ..messages import JSONResponse, RawResponse, Request, Result, StreamResponse, error_result
from ..sim.rng import new_request_id
from ..state import accounting
from ..streaming import encode
from ..streaming.flow import Pump, Sink
from ..streaming.start import start_handler
from ..streaming.wire import HTTPWire


class Server(Protocol):
    """What a connection needs of its server (:class:`llmsim.transport.server.Server`)."""

    app: App
    connections: set[HTTPProtocol]
    # what was deferred to the next loop pass (HTTPProtocol.defer: the requests read and
    # not yet handled), and the loop whose next pass runs it (_run_handlers)
    due: list[tuple[Callable[[Any, Any], Any], Any, Any]]
    due_loop: asyncio.AbstractEventLoop | None

    def loop_time(self) -> float: ...

    def _conn_closed(self) -> None: ...

__all__ = ["HTTPProtocol", "Phase", "Exchange"]

log = logging.getLogger("llmsim")
_INF = float("inf")
PIPELINE_BUFFER = 256 * 1024  # unread pipelined bytes before we stop reading the socket

# the second, and what every response head has in it from the Date to the request id
_date_cache: list[Any] = [0, b""]
_time = time.time


def _date_second(now: int) -> None:
    _date_cache[0] = now
    _date_cache[1] = (b"date: " + formatdate(now, usegmt=True).encode() + b"\r\n" + _COMMON
                      + b"x-request-id: ")


_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_REASONS[529] = b"Site Overloaded"


def reason(status: int) -> bytes:
    return _REASONS.get(status, b"")


_STATUS_LINES: dict[int, bytes] = {}


def _status_line(status: int) -> bytes:
    line = _STATUS_LINES.get(status)
    if line is None:
        if not 100 <= status <= 999:
            raise ValueError(f"invalid HTTP status {status}")
        line = b"HTTP/1.1 %d %s\r\n" % (status, reason(status))
        if len(_STATUS_LINES) < 1000:  # (bounded: statuses are three digits)
            _STATUS_LINES[status] = line
    return line


_JSON_CT = b"content-type: application/json\r\n"
_SSE_HEADERS = (b"content-type: text/event-stream; charset=utf-8\r\ncache-control: no-cache\r\n"
                b"x-accel-buffering: no\r\n")
# access-control-allow-origin: the real API allows browser callers (dangerouslyAllowBrowser)
_COMMON = b"server: llmsim\r\nopenai-version: 2020-10-01\r\naccess-control-allow-origin: *\r\n"
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# a response head: the status line, the Date to the request id (_date_cache), the request
# id, [the processing time], the response's own header lines, the blank line
_HEAD = b"%b%b%b\r\n%b\r\n"
_HEAD_TIMED = b"%b%b%b\r\nopenai-processing-ms: %d\r\n%b\r\n"


def header_bytes(headers: list[tuple[str, str]]) -> bytes:
    """``name: value\\r\\n`` lines for headers a handler added; a name or value that would
    split the head (CR, LF, NUL) or a name with a colon is refused (ValueError → the 500)."""
    if not headers:
        return b""
    text = "".join([f"{k}: {v}\r\n" for k, v in headers])
    n = len(headers)
    if (text.count("\n") != n or text.count("\r") != n or "\0" in text
            or any(":" in k or not k for k, _ in headers)):
        raise ValueError(f"invalid response header in {headers!r:.200}")
    return text.encode("latin-1")


# response framing, decided once per response in HTTPProtocol._out
_UNSENT = 0  # no head written yet
_LENGTH = 1  # Content-Length
_CHUNKED = 2  # Transfer-Encoding: chunked (HTTP/1.1 streams)
_CLOSE = 3  # the body ends when the connection closes (HTTP/1.0 streams)
_NOBODY = 4  # HEAD, 204, 304: the head alone
_CHUNK = encode.CHUNK  # one chunk of a chunked body
_CYCLE_DONE = (h11.DONE, h11.MIGHT_SWITCH_PROTOCOL)  # h11's states of a request read whole
# h11's sentinels and event types, compared per event read (a module global, not an
# attribute of the h11 module read each time)
_NEED_DATA, _PAUSED = h11.NEED_DATA, h11.PAUSED
_REQUEST, _DATA, _END, _CLOSED_EVENT = h11.Request, h11.Data, h11.EndOfMessage, h11.ConnectionClosed


class Phase(enum.Enum):
    """Where a connection is; every transition is in :class:`HTTPProtocol`."""

    IDLE = "idle"  # waiting for a request head (header / idle timeout armed)
    READING = "reading"  # a head arrived, its body is arriving (body timeout armed)
    HANDLING = "handling"  # a complete request is with its handler, nothing sent yet
    STREAMING = "streaming"  # the response head is out, the stream's body is being written
    CLOSING = "closing"  # the last response is written, the transport is closing
    UPGRADED = "upgraded"  # a WebSocket session owns the connection
    CLOSED = "closed"  # connection_lost ran


# The phases as module constants: the connection's hot paths compare them per request and
# per event, and an Enum member read through its class costs ~70 ns on CPython 3.11.
_IDLE, _READING, _HANDLING, _STREAMING = Phase.IDLE, Phase.READING, Phase.HANDLING, Phase.STREAMING
_CLOSING, _UPGRADED, _CLOSED = Phase.CLOSING, Phase.UPGRADED, Phase.CLOSED


class Exchange:
    """One request and its response on a connection: created with the request head (or for a
    protocol error before any), dropped when the response's last byte is written."""

    __slots__ = ("head", "method", "http11", "keep_alive", "ambiguous", "rid", "t0", "headers",
                 "body", "body_len",
                 "endpoint", "counted", "framing", "status", "req", "track",
                 "on_close", "first_step", "upgrade")

    def __init__(self, head: h11.Request | None, rid: str, t0: float) -> None:
        self.head = head
        self.method = head.method if head is not None else b""
        self.http11 = head is None or head.http_version == b"1.1"
        # HTTP/1.0 has no keep-alive here (as in h11); "Connection: close" ends it too;
        # a head that did not parse is answered and closed
        self.keep_alive = self.http11 and head is not None
        self.ambiguous = False  # framed by both Content-Length and Transfer-Encoding
        self.rid = rid
        self.t0 = t0  # perf_counter at the head (0: none parsed, no processing time)
        self.headers: dict[str, str] = {}  # lower-case names, repeats joined with ", "
        self.body: list[bytes] = []
        self.body_len = 0
        self.endpoint = ""  # route name (stats label)
        self.counted = False  # the request gauge is open (app.stats.request_open)
        self.framing = _UNSENT
        self.status = 0
        self.req: Request | None = None  # the request whose stream is being written
        self.track: Any = None  # its StreamTrack while the stream gauges are open
        self.on_close: Any = None  # its StreamResponse.on_close, until released
        self.first_step = False  # its handler runs its first step (start_handler)
        self.upgrade = False  # a WebSocket upgrade: handled by HTTPProtocol._upgrade


def _run_handlers(server: Server) -> None:
    """The loop pass after a read: run what was deferred since the last such pass
    (:meth:`HTTPProtocol.defer`: the handlers of the requests read, the WebSocket creates),
    in the order it was deferred; one scheduled callback for them all, not a Handle and a
    context copy each. What is deferred meanwhile waits for the next pass."""
    due = server.due
    server.due = []
    for fn, a, b in due:
        try:
            fn(a, b)
        except Exception as exc:  # (reported as the loop reports a failed callback)
            asyncio.get_running_loop().call_exception_handler({
                "message": f"Exception in callback {fn!r}", "exception": exc})


class HTTPProtocol(asyncio.Protocol):
    """HTTP/1.1 over h11 for one connection (see module doc)."""

    # slots, not a __dict__: a connection's state in one object (its hot fields, ``phase``
    # and ``transport``, read on every streamed event), and less memory per idle connection
    __slots__ = ("server", "app", "cfg", "conn", "transport", "peer", "phase", "exchange",
                 "upgraded", "_buffered", "_deadline", "_heads", "_pump",
                 "_reading_paused", "_shutdown", "_stall_deadline", "_task", "_timer_kind",
                 "wire", "loop", "__weakref__")

    def __init__(self, server: Server) -> None:
        self.server = server
        self.app = server.app
        self.cfg = server.app.config
        self.transport: asyncio.Transport | None = None
        self.conn = self._new_conn()
        self.phase = _IDLE
        self.exchange: Exchange | None = None  # the request in flight (None between them)
        # what a chunked stream's pump writes through: open while its body is on the wire
        # (from the head to the stream's end); its ``paused`` is the connection's write-side
        # backpressure (:attr:`paused`)
        self.wire = HTTPWire(None)
        self.wire.ends = True  # (_stream_done writes a stream's last events: Wire.ends)
        self._reading_paused = False  # mirrors transport.pause_reading()
        self._shutdown = False  # graceful shutdown: no request after the one in flight
        self._buffered = 0  # pipelined bytes received while a request is in flight
        self._heads = 0  # … and the request heads among them (approximately)
        self._task: asyncio.Task[None] | None = None
        self._pump: Pump | None = None
        self._deadline = _INF  # clock time when the current timeout fires (see Server sweep)
        self._timer_kind: str | None = None
        self._stall_deadline = _INF  # clock time when a client that stopped reading is cut
        self.upgraded: Any = None  # the WebSocket session after a 101
        self.peer = ""
        # the loop the connection runs on (connection_made): asyncio.get_running_loop() is
        # a getpid() system call on Python 3.11, not a call to make per request
        self.loop: asyncio.AbstractEventLoop | None = None

    def _new_conn(self) -> h11.Connection:
        return h11.Connection(h11.SERVER, max_incomplete_event_size=self.cfg.max_header_bytes)

    @property
    def _busy(self) -> bool:
        """A request is being answered: input waits in h11's buffer."""
        return self.phase is _HANDLING or self.phase is _STREAMING

    # ------------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        self.transport = transport  # type: ignore[assignment]
        self.wire.transport = self.transport
        self.loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else ""
        self.server.connections.add(self)
        self.app.stats.conn_open()
        self._arm("header", self.cfg.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.phase is _CLOSED:
            return
        self.phase = _CLOSED
        self._cancel_timer()
        if self.upgraded is not None:
            self.upgraded.connection_lost(exc)
        if self._pump is not None:
            self._pump.cancel()  # → _stream_done("cancelled") releases the stream gauge
        ex = self.exchange
        if ex is not None:
            self._release_stream(ex, "cancelled")  # (a no-op unless no pump got the stream)
            self._release_request(ex)
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.server.connections.discard(self)
        self.app.stats.conn_close()
        self.server._conn_closed()

    def data_received(self, data: bytes) -> None:
        if self.upgraded is not None:
            self.upgraded.data_received(data)
            return
        try:
            self.conn.receive_data(data)
        except RuntimeError:  # data after a close
            return
        if self._busy:
            self._buffered += len(data)
            self._heads += data.count(b"\r\n\r\n")  # request heads waiting (approximately)
            if (self._buffered > PIPELINE_BUFFER or self._heads >= self.cfg.max_pipelined) \
                    and not self._reading_paused:
                self._reading_paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]
            return
        if self._timer_kind == "idle":
            self._arm("header", self.cfg.header_timeout_s)
        self._process()

    def eof_received(self) -> bool:
        if self.upgraded is not None:
            return bool(self.upgraded.eof_received())
        try:
            self.conn.receive_data(b"")
        except RuntimeError:
            pass
        if not self._busy:
            self._process()
        # keep our write side open while a response is still being produced
        return self._busy

    @property
    def paused(self) -> bool:
        """The write side is paused (backpressure from the client): the transport's buffer
        is above its high-water mark. Kept by the connection's wire, which a chunked
        stream's pump reads (flow.Sink)."""
        return self.wire.paused

    def pause_writing(self) -> None:
        self.wire.paused = True
        if self.upgraded is not None:
            self.upgraded.wire.paused = True
        stall = self.cfg.write_stall_timeout_s
        if stall > 0:
            self._stall_deadline = self.server.loop_time() + stall

    def resume_writing(self) -> None:
        self.wire.paused = False
        self._stall_deadline = _INF
        if self.upgraded is not None:
            self.upgraded.wire.paused = False
            self.upgraded.resume_writing()
        elif self._pump is not None:
            self._pump.resume()

    # ------------------------------------------------------------------ timers
    # Timeouts are a deadline per connection on the app's clock, checked by the server's
    # periodic sweep (Server._sweep), not a timer per request: arming one is a float store.
    def _arm(self, kind: str, seconds: float) -> None:
        self._timer_kind = kind
        self._deadline = self.server.loop_time() + seconds if seconds > 0 else _INF

    def _cancel_timer(self) -> None:
        self._deadline = _INF
        self._timer_kind = None

    def _on_timeout(self) -> None:
        """The header, body or idle deadline passed: close (a request being answered is
        never timed out here; a stalled reader is, by ``_on_write_stall``)."""
        self._deadline = _INF
        if self._busy or self.transport is None:
            return
        self._close()

    def _on_write_stall(self) -> None:
        """The client has read nothing for ``write_stall_timeout_s`` (the transport stayed
        paused): cut it, so a client that never reads cannot hold a stream, its capacity slot
        and its buffered bytes. Abort, not close: close() waits for the unread buffer."""
        self._stall_deadline = _INF
        if self.phase is _CLOSED or not self.paused or self.transport is None:
            return
        log.info("cutting %s: it read nothing for %gs", self.peer or "a client",
                 self.cfg.write_stall_timeout_s)
        self.app.stats.error("write_stall")
        if self.upgraded is not None:
            self.upgraded.cut("write_stall")
        elif self._pump is not None:
            self._pump.cancel("write_stall")  # → _stream_done("write_stall")
        self.force_close()

    # ------------------------------------------------------------------ request parsing
    def _process(self) -> None:
        while self.phase is _IDLE or self.phase is _READING:
            try:  # (self.conn: a response finished in this loop starts a fresh one)
                ev = self.conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._protocol_error(exc)
                return
            if ev is _NEED_DATA or ev is _PAUSED:
                if self.phase is _READING and self._timer_kind != "body":
                    # a head whose body is still to come: the body deadline, from now (armed
                    # here, not with the head, so a request that arrived whole arms none)
                    self._arm("body", self.cfg.header_timeout_s)
                return
            t = type(ev)
            if t is _REQUEST:
                self._on_request(ev)  # type: ignore[arg-type]
            elif t is _DATA:
                ex = self.exchange
                assert ex is not None
                ex.body_len += len(ev.data)  # type: ignore[union-attr]
                if ex.body_len > self.cfg.max_body_bytes:
                    self._too_large()
                    return
                ex.body.append(ev.data)  # type: ignore[union-attr]
            elif t is _END:
                self._dispatch()
            elif t is _CLOSED_EVENT:
                self._close()
                return

    def _on_request(self, ev: h11.Request) -> None:
        self._deadline = _INF  # (_cancel_timer, inlined: once per request)
        self._timer_kind = None
        ex = self.exchange = Exchange(ev, new_request_id(), time.perf_counter())
        self.phase = _READING
        # h11 only caps a head that arrives incomplete; a complete one in one read is
        # measured here so the limit holds however the bytes were split
        # (one pass over the headers: the size, the framing headers, the Request's dict)
        size = len(ev.target) + 16
        headers = ex.headers
        te = cl = False
        length = b""
        # (h11's own (raw name, name, value) list when it has one: its Sequence view costs
        # ~0.3 µs a header through collections.abc)
        items = getattr(ev.headers, "_full_items", None)
        if items is None:
            items = [(name, name, value) for name, value in ev.headers]
        for _raw, name, value in items:
            size += len(name) + len(value) + 4
            k = name.decode("latin-1")
            v = value.decode("latin-1")
            headers[k] = headers[k] + ", " + v if k in headers else v
            if name == b"content-length":
                cl = True
                length = value
            elif name == b"transfer-encoding":
                te = True
            elif name == b"connection" and b"close" in value.lower():
                ex.keep_alive = False
        if size > self.cfg.max_header_bytes:
            self._protocol_error(h11.RemoteProtocolError("headers too large",
                                                         error_status_hint=431))
            return
        if cl and length.isdigit() and int(length) > self.cfg.max_body_bytes:
            self._too_large()
            return
        # RFC 9112 §6.1: h11 reads the body by Transfer-Encoding; the server MUST close the
        # connection after answering (a front end may have framed it by Content-Length)
        if cl and te:
            ex.keep_alive = False
            ex.ambiguous = True
        # (h11 waits for a 100 Continue only after an Expect header: no property chain else)
        if "expect" in headers and self.conn.they_are_waiting_for_100_continue:
            self._out(status=100)

    def _too_large(self) -> None:
        err = E.body_too_large.at(limit=self.cfg.max_body_bytes)
        ex = self.exchange
        head = ex.head if ex is not None else None
        if head is not None:  # in the envelope of the path's family (Gemini, Ollama, ...)
            try:
                route, _ = self.app.router.resolve(head.method.decode("latin-1"),
                                                   head.target.decode("latin-1").partition(
                                                       "?")[0])
            except APIError:
                route = None
            if route is not None and route.errors is not None:
                res = route.errors(err)
                if type(res) is RawResponse:
                    self._send_error(err, close=True, res=res)
                    return
        self._send_error(err, close=True)

    def _protocol_error(self, exc: h11.RemoteProtocolError) -> None:
        status = exc.error_status_hint or 400
        if status == 431:
            err = E.headers_too_large.at(limit=self.cfg.max_header_bytes)
        else:
            err = E.malformed_http.at(status=status, reason=exc)
        self._send_error(err, close=True)

    def _dispatch(self) -> None:
        ex = self.exchange
        assert ex is not None and ex.head is not None
        ev = ex.head
        # (h11's event and its header tuples are read: not kept for the exchange's life,
        # a stream's, where the collector would walk them)
        ex.head = None
        self._deadline = _INF  # (_cancel_timer)
        self._timer_kind = None
        self.phase = _HANDLING
        self._buffered = 0
        self._heads = 0
        target = ev.target.decode("latin-1")
        path, _, qs = target.partition("?")
        headers = ex.headers
        parts = ex.body
        body = b"".join(parts)  # (bytes, as Request.body says: h11 hands out bytearrays)
        parts.clear()
        req = Request.http(ev.method.decode("ascii"), path,
                           parse_qs(qs, keep_blank_values=True) if qs else {}, headers, body,
                           ex.rid, self.peer, self.app.clock.now())
        self.app.stats.request_open()
        ex.counted = True
        if "upgrade" in headers and headers["upgrade"].lower() == "websocket" \
                and not ex.ambiguous:
            ex.upgrade = True
        self.defer(self._handle, req, ex)

    def defer(self, fn: Callable[[Any, Any], Any], a: Any, b: Any) -> None:
        """Call ``fn(a, b)`` on the loop's next pass, with everything else deferred until
        then (:func:`_run_handlers`): a request's handler (:meth:`_handle`), a WebSocket
        create's (the modes, through their connection's ``defer``)."""
        srv = self.server
        due = srv.due
        loop = self.loop
        if loop is None:
            loop = self.loop = asyncio.get_running_loop()
        if not due or srv.due_loop is not loop:
            if due:  # (deferred on a loop that stopped before running them: never run)
                due.clear()
            srv.due_loop = loop
            loop.call_soon(_run_handlers, srv)
        due.append((fn, a, b))

    def _handle(self, req: Request, ex: Exchange) -> None:
        """Run the handler of ``req``, on the loop pass after the one that read it.

        Not inside the read: a request waits one loop pass, so the events due meanwhile are
        written first (a new request does not delay every running stream), and the requests
        read in one pass are handled together, then answered together (non-streaming chat:
        1.16-1.33x the bare h11 server's requests a second, against 0.87-0.91x handled
        inside the read; bench/RESULTS.md). Not in a Task either, unless it suspends
        (:func:`start_handler`)."""
        tr = self.transport
        if not self._serving(ex) or tr is None or tr.is_closing():
            return  # (the connection went meanwhile: connection_lost releases the request)
        task = start_handler(self._upgrade(req) if ex.upgrade else self._run(req, ex),
                             lambda: self._serving(ex), ex)
        if task is not None:
            self._task = task

    def _serving(self, ex: Exchange) -> bool:
        """``ex`` is still this open connection's request in flight."""
        return self.exchange is ex and self.phase is not _CLOSED

    async def _run(self, req: Request, ex: Exchange) -> None:
        app = self.app
        try:
            try:  # resolve here (not in dispatch) to know the endpoint for stats
                route, params = app.resolve(req)
            except APIError:
                route = None  # dispatch answers 404/405
            else:
                if params:
                    object.__setattr__(req, "params", params)
            ex.endpoint = route.name if route is not None else "unmatched"
            try:
                res = await app.dispatch(req, route)
            except asyncio.CancelledError:
                accounting.request_gone(app, req, ex.endpoint)
                return
            if self.phase is _CLOSED:
                accounting.request_gone(app, req, ex.endpoint)
                if type(res) is StreamResponse and res.on_close is not None:
                    res.on_close("cancelled")  # never pumped: still release what it holds
                return
            self._send(req, res)
        except Exception:  # rendering, encoding, accounting: never leave the client hanging
            self._failed(req)

    async def _upgrade(self, req: Request) -> None:
        try:
            if not self.app.router.ws_modes:
                self._send_error(E.websocket_unsupported.at())
                return
            from .ws import upgrade  # (the WebSocket half of the transport)

            try:
                res = await upgrade(self, req)
            except asyncio.CancelledError:
                return
            if res is not None and self.phase is not _CLOSED:
                self._send(req, res)
        except Exception:
            self._failed(req)

    def _failed(self, req: Request) -> None:
        """An exception escaped between dispatch and the last byte of ``req``'s answer (call
        from the ``except`` block). Nothing sent yet: the OpenAI 500 envelope. The head
        already sent (streams end their own failures in the pump; this is anything else):
        release the stream and drop the connection. The counters are released either way."""
        log.exception("request failed after dispatch: %s %s", req.method, req.path)
        if self.phase is _CLOSED:
            return  # connection_lost released everything
        ex = self.exchange
        try:
            if (self.upgraded is None and ex is not None and ex.rid == req.request_id
                    and ex.framing == _UNSENT):
                self._release_stream(ex, "error")  # a stream whose head could not be sent
                self._send(req, error_result(server_error()))
                return
        except Exception:
            log.exception("cannot answer the failed request")
        if self._pump is not None:
            self._pump.cancel("error")
        if ex is not None:
            self._release_stream(ex, "error")
        self.force_close()

    def switch_protocol(self, headers: list[tuple[bytes, bytes]], session: Any) -> bytes:
        """Answer 101, hand the connection to ``session``; returns the bytes that arrived
        behind the upgrade request (feed them to the session first)."""
        extra = header_bytes([(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers])
        self._out(status=101, headers=b"upgrade: websocket\r\nconnection: Upgrade\r\n" + extra)
        self.upgraded = session
        self.phase = _UPGRADED
        self._cancel_timer()
        ex = self.exchange
        if ex is not None:
            self._release_request(ex)
            self.exchange = None
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        trailing, _closed = self.conn.trailing_data
        return bytes(trailing)

    # ------------------------------------------------------------------ responses
    def _send(self, req: Request, res: Result) -> None:
        ex = self.exchange
        if ex is None or ex.rid != req.request_id:
            return  # (the connection moved on: nothing of this request may be written)
        if not 200 <= res.status <= 999:  # (before any accounting: the failure path answers)
            raise ValueError(f"{res.status} cannot be a final response")
        if type(res) is StreamResponse:
            self._start_stream(ex, req, res)  # type: ignore[arg-type]
            return
        if type(res) is JSONResponse:
            body = encode._dumps(res.data)  # type: ignore[union-attr]
            hs = header_bytes(res.headers) + _JSON_CT  # type: ignore[union-attr]
        else:
            assert isinstance(res, RawResponse)
            if res.abort:
                accounting.response_sent(self.app, req, ex.endpoint, 0, res)
                self.reset()
                return
            body = res.body
            hs = header_bytes([*res.headers, ("content-type", res.content_type)])
        accounting.response_sent(self.app, req, ex.endpoint, res.status, res)
        self._out(body, status=res.status, headers=hs, length=len(body), end=True)

    def _send_error(self, err: APIError, close: bool = False,
                    res: RawResponse | None = None) -> None:
        """Answer a transport-level error (413, 431, 400 for a malformed request, a refused
        upgrade); ``close``: and close the connection after it; ``res``: the error as its
        family renders it."""
        ex = self.exchange
        if ex is None:  # nothing parsed yet: an exchange for the answer alone
            ex = self.exchange = Exchange(None, new_request_id(), 0.0)
        if close:
            ex.keep_alive = False
        self.phase = _HANDLING
        self.app.stats.record("invalid", None, "http", err.status, err.code or err.type)
        if res is not None:
            self._out(res.body, status=res.status, headers=header_bytes(
                [*res.headers, ("content-type", res.content_type)]), length=len(res.body),
                end=True)
            return
        body = err.body()
        self._out(body, status=err.status, headers=header_bytes(err.headers) + _JSON_CT,
                  length=len(body), end=True)

    def _start_stream(self, ex: Exchange, req: Request, res: StreamResponse) -> None:
        ex.req = req
        ex.on_close = res.on_close  # released by _release_stream on every path
        stream = res.stream
        if not self._out(status=res.status, headers=header_bytes(res.headers)
                         + (stream.dialect.stream_headers or _SSE_HEADERS), hold=True):
            # HEAD: the head GET would get, no events
            stream.close()
            accounting.response_sent(self.app, req, ex.endpoint, res.status, res)
            self._release_stream(ex, "completed")
            self._out(end=True)
            return
        self.phase = _STREAMING
        dialect = stream.dialect
        sink: Sink = self
        if ex.framing is _CHUNKED:
            sink = self.wire
            self.wire.open = True
        try:
            ex.track = accounting.stream_started(self.app, req, ex.endpoint, res)
            self._pump = Pump(stream, self.app.clock, dialect.sse, sink, self._stream_done,
                              ex.track.observe, dialect.sse_error)
        except Exception:  # the head is out: a terminal error event and a clean end
            log.exception("cannot start the stream")
            stream.close()
            self.write_events([dialect.sse_error(server_error(), stream.claim())])
            self._stream_done("error")
            self._flush_head()
            return
        # (a handler that has not suspended: the schedule counts from the read, Pump.start)
        self._pump.start(req.received_at if ex.first_step else None)  # never raises
        self._flush_head()

    def _flush_head(self) -> None:
        """Write the held response head (``_out(hold=True)``) if nothing took it along."""
        head = self.wire.take_head()
        if head is not None and self.transport is not None and self.phase is not _CLOSED:
            self.transport.write(head)

    def _out(self, data: bytes = b"", *, status: int = 0, headers: bytes = b"",
             length: int = -1, end: bool = False, framed: list[bytes] | None = None,
             hold: bool = False) -> bool:
        """THE outbound path of HTTP: every byte of a response is written here.

        ``status`` (with ``headers``: the response's own header lines) starts a response: a
        1xx is written alone; otherwise this decides, once, the framing (``length`` ≥ 0:
        Content-Length; else chunked on HTTP/1.1, close-delimited on HTTP/1.0), whether a
        body may follow at all (not to HEAD, not with 204/304), and ``connection: close``.
        ``data`` is body bytes, framed accordingly (or dropped when no body is allowed);
        ``end`` finishes the response (the last chunk) and the exchange; ``framed``: the
        parts of chunks a stream's pump framed (Wire.last), written ahead of the last chunk
        in its write; ``hold``: a chunked head is held (``HTTPWire.head``) for the stream's
        first write to carry (``_flush_head`` writes it if none did). Returns whether the
        response carries a body."""
        tr = self.transport
        ex = self.exchange
        if tr is None or ex is None or self.phase is _CLOSED:
            return False
        if status:
            line = _status_line(status)  # (an invalid status raises before anything)
            if status < 200:  # informational: 100 Continue, 101 Switching Protocols
                if end or data or length >= 0:
                    raise ValueError(f"{status} cannot be a final response")
                tr.write(_CONTINUE if status == 100 else line + headers + b"\r\n")
                return False
            if ex.framing != _UNSENT:
                raise RuntimeError("a second response head for one request")
            no_body = status == 204 or status == 304
            if length >= 0:
                framing = _LENGTH
                if not no_body:  # (HEAD too: the length GET would get)
                    headers += b"content-length: %d\r\n" % length
            elif ex.http11:
                framing = _CHUNKED
                headers += b"transfer-encoding: chunked\r\n"
            else:  # HTTP/1.0 has no chunked encoding: the body ends with the connection
                framing = _CLOSE
                ex.keep_alive = False
            if no_body or ex.method == b"HEAD":
                framing = _NOBODY
            if not ex.keep_alive or self._shutdown:
                headers += b"connection: close\r\n"
            now = int(_time())
            if _date_cache[0] != now:  # (a new second: its Date)
                _date_second(now)
            if ex.t0:  # a request head was parsed (none for a malformed request)
                head = _HEAD_TIMED % (line, _date_cache[1], ex.rid.encode(),
                                      int((time.perf_counter() - ex.t0) * 1000), headers)
            else:
                head = _HEAD % (line, _date_cache[1], ex.rid.encode(), headers)
            if data and framing is not _NOBODY:
                head += data if framing is not _CHUNKED else _CHUNK % (len(data), data)
            if end and framing is _CHUNKED:
                head += b"0\r\n\r\n"
            ex.framing = framing  # (set with the write: a failure above is answered 500)
            ex.status = status
            if end:  # released before the last byte leaves: a client that has it sees it
                self._release_request(ex)
            if hold and framing is _CHUNKED:
                self.wire.head = head
            else:
                tr.write(head)
        else:
            framing = ex.framing
            if end:
                self._release_request(ex)
            # the body's bytes of this call, in one write; first the head of a stream that
            # ends or fails in its start, if it is still held
            held = self.wire.take_head()
            parts = [held] if held is not None else []
            if data and framing is not _NOBODY:
                parts.append(data if framing is not _CHUNKED else _CHUNK % (len(data), data))
                if end and framing is _CHUNKED:
                    parts.append(b"0\r\n\r\n")
            elif end and framing is _CHUNKED:
                if framed:
                    parts += framed
                parts.append(b"0\r\n\r\n")
            if parts:
                tr.write(parts[0] if len(parts) == 1 else b"".join(parts))
        if end:
            self._end_cycle(ex)
        return framing is not _NOBODY

    # Sink interface for the pump of a stream whose body is not chunked (an HTTP/1.0
    # client's: the body ends with the connection), framed by _out; a chunked stream's
    # pump writes through the connection's HTTPWire
    def write_events(self, frames: list[bytes]) -> None:
        self._out(frames[0] if len(frames) == 1 else b"".join(frames))

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _stream_done(self, reason: str) -> None:
        self._pump = None
        wire = self.wire
        wire.open = False  # (before the terminating chunk: nothing after it)
        last = wire.last  # the stream's last events, written with the terminating chunk
        if last is not None:
            wire.last = None
        ex = self.exchange
        if ex is None:
            return
        self._release_stream(ex, reason)
        if reason in ("completed", "stopped", "error") and self.phase is not _CLOSED:
            self._out(end=True, framed=last)

    def _release_stream(self, ex: Exchange, reason: str) -> None:
        """Close the stream's gauges and run its ``on_close`` (capacity, rate-limit charge):
        exactly once, whatever ended it (idempotent)."""
        track = ex.track
        if track is not None:
            ex.track = None
            try:
                accounting.stream_ended(self.app, ex.req, track, reason)  # type: ignore[arg-type]
            except Exception:
                log.exception("stream accounting failed")
        ex.req = None
        cb = ex.on_close
        if cb is not None:
            ex.on_close = None
            try:
                cb(reason)
            except Exception:
                log.exception("stream close callback failed")

    def _release_request(self, ex: Exchange) -> None:
        if ex.counted:
            ex.counted = False
            self.app.stats.request_close()

    def _end_cycle(self, ex: Exchange) -> None:
        """The response's last byte is written: release the request, then close (no
        keep-alive, shutdown, a body h11 did not finish reading) or start the next cycle on
        a fresh h11 connection fed the bytes that arrived behind this request."""
        self.exchange = None
        self._task = None
        if ex.counted:  # (_release_request, inlined: _out released it, as a rule)
            self._release_request(ex)
        conn = self.conn
        if (not ex.keep_alive or self._shutdown
                or conn.their_state not in _CYCLE_DONE):
            self.phase = _CLOSING
            self._close()
            return
        trailing, closed = conn.trailing_data
        conn = self.conn = self._new_conn()
        if trailing:
            conn.receive_data(bytes(trailing))
        if closed:
            conn.receive_data(b"")
        self.phase = _IDLE
        self._buffered = 0
        self._heads = 0
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        self._arm("idle", self.cfg.idle_timeout_s)
        if trailing or closed:  # (a fresh connection fed nothing has no event but NEED_DATA)
            self._process()

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Graceful: close now if idle, else after the in-flight response."""
        self._shutdown = True
        if self.upgraded is not None:
            self.upgraded.shutdown()
        elif not self._busy:
            self._close()

    def reset(self) -> None:
        """Drop the connection with a TCP RST (fault injection: "connection reset by peer")."""
        if self.transport is None or self.phase is _CLOSED:
            return
        sock = self.transport.get_extra_info("socket")
        if sock is not None:
            try:  # SO_LINGER {on, 0 s}: close() sends RST instead of FIN
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        self.transport.abort()

    def force_close(self) -> None:
        if self.transport is not None:
            self.transport.abort()
