"""One asyncio protocol object per TCP connection, owning an ``h11.Connection``.

Theory of operation. Bytes come in through ``data_received`` → ``h11.receive_data``; events
come out of ``next_event()`` until h11 says ``NEED_DATA`` (wait for bytes) or ``PAUSED`` (a
request is in flight; pipelined bytes stay in h11's buffer). A complete request becomes a
frozen :class:`Request` and runs as one task; its Result goes out through ``_send``, the only
caller of ``transport.write`` for HTTP. Complete responses go through h11 in one write. Streams
send their head through h11, then chunked frames written by hand (h11 framing costs ~1.7 µs a
token, ``b"%x\\r\\n…\\r\\n"`` ~0.1 µs), and end through h11 so its state stays right.

Limits and timeouts: the request head is capped (431), bodies are capped (413, decided from
Content-Length before reading when possible), pipelined input is bounded (reading pauses while
a request is in flight and more than ``PIPELINE_BUFFER`` bytes or ``--max-pipelined`` request
heads wait), a connection that does not
deliver a request head within ``header_timeout_s`` or stays idle for ``idle_timeout_s`` is
closed. Backpressure: ``pause_writing`` marks the protocol paused, the stream's pump stops
pulling events; ``resume_writing`` restarts it. A client that stays paused (reads nothing) for
``write_stall_timeout_s`` is cut: the connection is aborted (a graceful close would wait for the
unread buffer forever) and its stream, request and connection counters are released.
``connection_lost`` cancels the handler task and the pump, releasing every counter exactly once.

Failures. Any exception between dispatch and the last byte (rendering, JSON encoding, a
broken hook) is caught in ``_run``/``_upgrade`` (both the eager first step and the Task) and in
the stream's pump (``flow.Pump``): before the head it becomes the OpenAI 500 envelope, after
it a terminal error event and a clean end; the connection never stays busy with no answer.

HTTP hygiene: a request carrying both Content-Length and Transfer-Encoding (the request
smuggling shape, RFC 9112 §6.1) is answered with ``connection: close`` and the connection is
closed; whether a response may carry a body (not to HEAD, not 1xx/204/304) is decided in
``_body_allowed`` and applied to complete responses and streams alike.

A WebSocket upgrade (``GET /v1/responses`` with ``Upgrade: websocket``) is handed to
``app.ws_handler``, which answers 101 through h11 via :meth:`switch_protocol` and then receives
all further bytes, starting with h11's trailing data.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs

import h11

from . import encode
from .errors import APIError, E, server_error
from .flow import Pump
from .messages import JSONResponse, RawResponse, Request, Result, StreamResponse, error_result
from .sim.rng import new_request_id
from .state import accounting

if TYPE_CHECKING:
    from .server import Server

__all__ = ["HTTPProtocol"]

log = logging.getLogger("llmsim")
_INF = float("inf")
PIPELINE_BUFFER = 256 * 1024  # unread pipelined bytes before we stop reading the socket

_date_cache: list[Any] = [0, b""]


def http_date() -> bytes:
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache[0] = now
        _date_cache[1] = formatdate(now, usegmt=True).encode()
    return _date_cache[1]




_JSON = (b"content-type", b"application/json")
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
_REASONS[529] = b"Site Overloaded"


def reason(status: int) -> bytes:
    return _REASONS.get(status, b"")

_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
# access-control-allow-origin: the real API allows browser callers (dangerouslyAllowBrowser)
_COMMON = [(b"server", b"llmsim"), (b"openai-version", b"2020-10-01"),
           (b"access-control-allow-origin", b"*")]


class _Resume:
    """Continue a handler coroutine that suspended during its eager first step.

    The coroutine yielded ``awaited`` (a future, or None for a bare yield) with no Task to
    catch it. Awaiting this object re-yields that value to the new Task, which waits for the
    future exactly as if the coroutine had been its own from the start, then resumes the
    coroutine; what the Task throws in (cancellation) is thrown into the coroutine."""

    __slots__ = ("coro", "awaited")

    def __init__(self, coro: Any, awaited: Any) -> None:
        self.coro = coro
        self.awaited = awaited

    def __await__(self) -> Any:
        coro, awaited = self.coro, self.awaited
        while True:
            try:
                yield awaited
            except BaseException as exc:  # the Task throws cancellation in: pass it on
                try:
                    awaited = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
                continue
            try:
                awaited = coro.send(None)
            except StopIteration as stop:
                return stop.value


async def _resume(coro: Any, awaited: Any) -> None:
    await _Resume(coro, awaited)


class HTTPProtocol(asyncio.Protocol):
    """HTTP/1.1 over h11 for one connection (see module doc)."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.app = server.app
        self.cfg = server.app.config
        self.transport: asyncio.Transport | None = None
        self.conn = h11.Connection(h11.SERVER,
                                   max_incomplete_event_size=self.cfg.max_header_bytes)
        self.paused = False  # write side (backpressure from the client)
        self._reading_paused = False
        self._busy = False  # a request is being handled
        self._closing = False  # graceful shutdown requested
        self._closed = False
        self._request: h11.Request | None = None
        self._body: list[bytes] = []
        self._body_len = 0
        self._buffered = 0
        self._heads = 0
        self._task: asyncio.Task[None] | None = None
        self._pump: Pump | None = None
        self._deadline = _INF  # loop time when the current timeout fires (see Server sweep)
        self._timer_kind: str | None = None
        self._stall_deadline = _INF  # loop time when a client that stopped reading is cut
        self._close_after = False  # close after this response (Content-Length + TE request)
        self._chunked = True
        self._request_open = False
        self._stream_open = False
        self._rid = ""
        self._t0 = 0.0
        self._endpoint = ""  # route name of the request in flight (stats label)
        self._req: Request | None = None  # the request whose stream is being written
        self._track: Any = None  # its StreamTrack (latency at the socket write)
        self._on_stream_close: Any = None  # its StreamResponse.on_close, until released
        self.upgraded: Any = None  # the WebSocket session after a 101
        self._eager = False  # inside the synchronous first step of a handler
        self.peer = ""

    # ------------------------------------------------------------------ asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        self.transport = transport  # type: ignore[assignment]
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
        if self._closed:
            return
        self._closed = True
        self._cancel_timer()
        if self.upgraded is not None:
            self.upgraded.connection_lost(exc)
        if self._pump is not None:
            self._pump.cancel()  # → _stream_done("cancelled") releases the stream gauge
        self._release_stream("cancelled")  # (a no-op unless a stream never got its pump)
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self._release_request()
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

    def pause_writing(self) -> None:
        self.paused = True
        stall = self.cfg.write_stall_timeout_s
        if stall > 0:
            self._stall_deadline = self.server.loop_time() + stall

    def resume_writing(self) -> None:
        self.paused = False
        self._stall_deadline = _INF
        if self.upgraded is not None:
            self.upgraded.resume_writing()
        elif self._pump is not None:
            self._pump.resume()

    # ------------------------------------------------------------------ timers
    # Timeouts are a deadline per connection checked by the server's periodic sweep
    # (Server._sweep), not a loop timer per request: arming one is a float store.
    def _arm(self, kind: str, seconds: float) -> None:
        self._timer_kind = kind
        self._deadline = self.server.loop_time() + seconds if seconds > 0 else _INF

    def _cancel_timer(self) -> None:
        self._deadline = _INF
        self._timer_kind = None

    def _on_timeout(self) -> None:
        self._deadline = _INF
        if self._busy or self.transport is None:
            return
        if self._timer_kind == "header" and self.conn.their_state is h11.SEND_BODY:
            pass  # body still arriving: give up the same way
        self._close()

    def _on_write_stall(self) -> None:
        """The client has read nothing for ``write_stall_timeout_s`` (the transport stayed
        paused): cut it, so a client that never reads cannot hold a stream, its capacity slot
        and its buffered bytes. Abort, not close: close() waits for the unread buffer."""
        self._stall_deadline = _INF
        if self._closed or not self.paused or self.transport is None:
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
        conn = self.conn
        while not self._busy and not self._closed and self.upgraded is None:
            try:
                ev = conn.next_event()
            except h11.RemoteProtocolError as exc:
                self._protocol_error(exc)
                return
            if ev is h11.NEED_DATA or ev is h11.PAUSED:
                return
            t = type(ev)
            if t is h11.Request:
                self._on_request(ev)  # type: ignore[arg-type]
            elif t is h11.Data:
                self._body_len += len(ev.data)  # type: ignore[union-attr]
                if self._body_len > self.cfg.max_body_bytes:
                    self._too_large()
                    return
                self._body.append(ev.data)  # type: ignore[union-attr]
            elif t is h11.EndOfMessage:
                self._dispatch()
            elif t is h11.ConnectionClosed:
                self._close()
                return

    def _on_request(self, ev: h11.Request) -> None:
        self._cancel_timer()
        self._request = ev
        self._body = []
        self._body_len = 0
        self._rid = new_request_id()
        self._t0 = time.perf_counter()
        # h11 only caps a head that arrives incomplete; a complete one in one read is
        # measured here so the limit holds however the bytes were split
        size = len(ev.target) + 16
        for name, value in ev.headers:
            size += len(name) + len(value) + 4
        if size > self.cfg.max_header_bytes:
            self._protocol_error(h11.RemoteProtocolError("headers too large",
                                                         error_status_hint=431))
            return
        te = cl = False
        for name, value in ev.headers:
            if name == b"content-length":
                cl = True
                try:
                    if int(value) > self.cfg.max_body_bytes:
                        self._too_large()
                        return
                except ValueError:
                    pass
            elif name == b"transfer-encoding":
                te = True
        # RFC 9112 §6.1: h11 reads the body by Transfer-Encoding; the server MUST close the
        # connection after answering (a front end may have framed it by Content-Length)
        self._close_after = cl and te
        if self.conn.they_are_waiting_for_100_continue:
            self._write(self.conn.send(h11.InformationalResponse(status_code=100, headers=[])))
        self._arm("body", self.cfg.header_timeout_s)

    def _too_large(self) -> None:
        self._busy = True
        err = E.body_too_large.at(limit=self.cfg.max_body_bytes)
        self._send_error(err, close=True)

    def _protocol_error(self, exc: h11.RemoteProtocolError) -> None:
        status = exc.error_status_hint or 400
        if status == 431:
            err = E.headers_too_large.at(limit=self.cfg.max_header_bytes)
        else:
            err = E.malformed_http.at(status=status, reason=exc)
        self._busy = True
        self._send_error(err, close=True)

    def _dispatch(self) -> None:
        ev = self._request
        assert ev is not None
        self._cancel_timer()
        self._busy = True
        self._buffered = 0
        self._heads = 0
        target = ev.target.decode("latin-1")
        path, _, qs = target.partition("?")
        headers: dict[str, str] = {}
        for name, value in ev.headers:
            k = name.decode("latin-1")
            v = value.decode("latin-1")
            headers[k] = headers[k] + ", " + v if k in headers else v
        body = b"".join(self._body) if len(self._body) != 1 else self._body[0]
        self._body = []
        self._chunked = ev.http_version == b"1.1"
        req = Request(method=ev.method.decode("ascii"), path=path,
                      query=parse_qs(qs, keep_blank_values=True) if qs else {},
                      headers=headers, body=body, request_id=self._rid, client=self.peer,
                      received_at=self.app.clock.now())
        self.app.stats.request_open()
        self._request_open = True
        if headers.get("upgrade", "").lower() == "websocket" and not self._close_after:
            self._task = asyncio.get_running_loop().create_task(self._upgrade(req))
            return
        # Run the handler eagerly: most answers (instant latency, no waiting hook) complete
        # without ever suspending, and then need no Task and no extra loop pass. Only a
        # handler that really waits continues in a Task (see _resume).
        coro = self._run(req)
        self._eager = True
        try:
            awaited = coro.send(None)
        except StopIteration:
            return
        finally:
            self._eager = False
        if not self._closed and self._busy:
            self._task = asyncio.get_running_loop().create_task(_resume(coro, awaited))
        else:
            coro.close()

    async def _run(self, req: Request) -> None:
        app = self.app
        try:
            try:  # resolve here (not in dispatch) to know the endpoint for stats
                route, params = app.resolve(req)
            except APIError:
                route = None  # dispatch answers 404/405
            else:
                if params:
                    object.__setattr__(req, "params", params)
            self._endpoint = route.name if route is not None else "unmatched"
            try:
                res = await app.dispatch(req, route)
            except asyncio.CancelledError:
                accounting.request_gone(app, req, self._endpoint)
                return
            if self._closed:
                accounting.request_gone(app, req, self._endpoint)
                if type(res) is StreamResponse and res.on_close is not None:
                    res.on_close("cancelled")  # never pumped: still release what it holds
                return
            self._send(req, res)
        except Exception:  # rendering, encoding, accounting: never leave the client hanging
            self._failed(req)

    async def _upgrade(self, req: Request) -> None:
        try:
            handler = self.app.ws_handler
            if handler is None:
                self._send_error(E.websocket_unsupported.at())
                return
            try:
                res = await handler(self, req)
            except asyncio.CancelledError:
                return
            if res is not None and not self._closed:
                self._send(req, res)
        except Exception:
            self._failed(req)

    def _failed(self, req: Request) -> None:
        """An exception escaped between dispatch and the last byte of ``req``'s answer (call
        from the ``except`` block). Nothing sent yet: the OpenAI 500 envelope. The head
        already sent (streams end their own failures in the pump; this is anything else):
        release the stream and drop the connection. The counters are released either way."""
        log.exception("request failed after dispatch: %s %s", req.method, req.path)
        if self._closed:
            return  # connection_lost released everything
        try:
            if (self.upgraded is None and self._rid == req.request_id
                    and self.conn.our_state is h11.SEND_RESPONSE):
                self._release_stream("error")  # a stream whose head could not be sent
                self._send(req, error_result(server_error()))
                return
        except Exception:
            log.exception("cannot answer the failed request")
        if self._pump is not None:
            self._pump.cancel("error")
        self._release_stream("error")
        self.force_close()

    def switch_protocol(self, headers: list[tuple[bytes, bytes]], session: Any) -> bytes:
        """Answer 101 through h11, hand the connection to ``session``; returns the bytes that
        arrived behind the upgrade request (feed them to the session first)."""
        self._write(self.conn.send(h11.InformationalResponse(
            status_code=101, reason=b"Switching Protocols", headers=[(b"upgrade", b"websocket"), (b"connection", b"Upgrade"),
                                      *headers])))
        self.upgraded = session
        self._busy = False
        self._cancel_timer()
        self._release_request()
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        trailing, _closed = self.conn.trailing_data
        return bytes(trailing)

    # ------------------------------------------------------------------ responses
    def _headers(self, extra: list[tuple[str, str]],
                 close: bool = False) -> list[tuple[bytes, bytes]]:
        hs = [(b"date", http_date()), *_COMMON, (b"x-request-id", self._rid.encode())]
        if self._t0:  # a request head was parsed (none for a malformed request)
            hs.append((b"openai-processing-ms",
                       str(int((time.perf_counter() - self._t0) * 1000)).encode()))
        for k, v in extra:
            hs.append((k.encode("latin-1"), v.encode("latin-1")))
        if close or self._closing or self._close_after:
            hs.append((b"connection", b"close"))
        return hs

    def _body_allowed(self, status: int) -> bool:
        """Whether this response may carry content: never for a HEAD request, nor with
        1xx/204/304 (RFC 9110 §9.3.2, §15). The one place that decides it, for complete
        responses (``_complete``) and streams (``_start_stream``) alike."""
        if status < 200 or status == 204 or status == 304:
            return False
        ev = self._request
        return ev is None or ev.method != b"HEAD"

    def _send(self, req: Request, res: Result) -> None:
        if type(res) is StreamResponse:
            self._start_stream(req, res)  # type: ignore[arg-type]
            return
        if type(res) is JSONResponse:
            body = encode._dumps(res.data)  # type: ignore[union-attr]
            ctype = _JSON
        else:
            assert isinstance(res, RawResponse)
            if res.abort:
                accounting.response_sent(self.app, req, self._endpoint, 0, res)
                self.reset()
                return
            body = res.body
            ctype = (b"content-type", res.content_type.encode())
        hs = self._headers(res.headers)
        hs.append(ctype)
        accounting.response_sent(self.app, req, self._endpoint, res.status, res)
        self._complete(res.status, hs, body)

    def _send_error(self, err: APIError, close: bool = False) -> None:
        if self._rid == "":
            self._rid = new_request_id()
        hs = self._headers(err.headers, close)
        hs.append(_JSON)
        self.app.stats.record("invalid", None, "http", err.status,
                              err.code or err.type)
        self._complete(err.status, hs, err.body())

    def _complete(self, status: int, headers: list[tuple[bytes, bytes]],
                  body: bytes) -> None:
        """Send a complete response: head (with Content-Length), body unless not allowed."""
        conn = self.conn
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            self._close()
            return
        if status >= 200 and status != 204:  # (1xx and 204 carry no Content-Length)
            headers.append((b"content-length", str(len(body)).encode()))
        try:
            out = conn.send(h11.Response(status_code=status, headers=headers,
                                          reason=reason(status)))
            if body and self._body_allowed(status):
                out += conn.send(h11.Data(data=body))
            out += conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:
            log.exception("cannot send response")
            self._close()
            return
        self._write(out)
        self._end_cycle()

    def _start_stream(self, req: Request, res: StreamResponse) -> None:
        self._req = req
        self._on_stream_close = res.on_close  # released by _release_stream on every path
        hs = self._headers(res.headers)
        hs.extend(_SSE_HEADERS)
        if self._chunked:
            hs.append((b"transfer-encoding", b"chunked"))
        self._write(self.conn.send(h11.Response(status_code=res.status, headers=hs,
                                               reason=reason(res.status))))
        stream = res.stream
        if not self._body_allowed(res.status):  # HEAD: the head GET would send, no events
            stream.close()
            accounting.response_sent(self.app, req, self._endpoint, res.status, res)
            self._stream_done("completed")
            return
        dialect = stream.dialect
        try:
            self._track = accounting.stream_started(self.app, req, self._endpoint, res)
            self._stream_open = True
            self._pump = Pump(stream, self.app.clock, dialect.sse, self, self._stream_done,
                              self._track.observe, dialect.sse_error)
        except Exception:  # the head is out: a terminal error event and a clean end
            log.exception("cannot start the stream")
            stream.close()
            self.write_events([dialect.sse_error(server_error(), stream.claim())])
            self._stream_done("error")
            return
        self._pump.start()  # never raises: the pump ends its own failures (flow.Pump)

    # Sink interface for the pump
    def write_events(self, frames: list[bytes]) -> None:
        payload = frames[0] if len(frames) == 1 else b"".join(frames)
        if self._chunked:
            payload = b"%x\r\n%b\r\n" % (len(payload), payload)
        self.transport.write(payload)  # type: ignore[union-attr]

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def _stream_done(self, reason: str) -> None:
        self._pump = None
        self._release_stream(reason)
        if reason in ("completed", "stopped", "error") and not self._closed:
            try:
                self._write(self.conn.send(h11.EndOfMessage()))
            except h11.LocalProtocolError:
                log.exception("cannot end the stream")
                self.force_close()
                return
            self._end_cycle()

    def _release_stream(self, reason: str) -> None:
        """Close the stream's gauges and run its ``on_close`` (capacity, rate-limit charge):
        exactly once, whatever ended it (idempotent)."""
        if self._stream_open:
            self._stream_open = False
            try:
                accounting.stream_ended(self.app, self._req,  # type: ignore[arg-type]
                                        self._track, reason)
            except Exception:
                log.exception("stream accounting failed")
            self._track = None
        self._req = None
        cb = self._on_stream_close
        if cb is not None:
            self._on_stream_close = None
            try:
                cb(reason)
            except Exception:
                log.exception("stream close callback failed")

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self._closed:
            self.transport.write(data)

    def _release_request(self) -> None:
        if self._request_open:
            self._request_open = False
            self.app.stats.request_close()

    def _end_cycle(self) -> None:
        self._busy = False
        self._task = None
        self._t0 = 0.0  # (a protocol error before the next head has no processing time)
        self._rid = ""
        self._request = None
        self._release_request()
        conn = self.conn
        if (self._closing or conn.our_state is not h11.DONE
                or conn.their_state is not h11.DONE):
            self._close()
            return
        try:
            conn.start_next_cycle()
        except h11.LocalProtocolError:
            self._close()
            return
        self._buffered = 0
        self._heads = 0
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()  # type: ignore[union-attr]
        self._arm("idle", self.cfg.idle_timeout_s)
        if not self._eager:  # inside an eager dispatch the caller's _process loop goes on
            self._process()

    def _close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    # ------------------------------------------------------------------ shutdown
    def shutdown(self) -> None:
        """Graceful: close now if idle, else after the in-flight response."""
        self._closing = True
        if self.upgraded is not None:
            self.upgraded.shutdown()
        elif not self._busy:
            self._close()

    def reset(self) -> None:
        """Drop the connection with a TCP RST (fault injection: "connection reset by peer")."""
        if self.transport is None or self._closed:
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
