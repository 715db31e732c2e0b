"""Responses over WebSocket: one wsproto session per upgraded connection (thin glue).

The decisions live elsewhere, pure and tested without sockets: the handshake and the
connection cap in :mod:`llmsim.ws_handshake`, client events in :mod:`llmsim.ws_events`,
which create runs when in
:class:`llmsim.ws_lanes.LaneScheduler`, the ``previous_response_id`` cache of a connection in
the Responses state (:class:`llmsim.api.responses.state.ConnectionCache`). This module feeds
bytes to wsproto, turns client events into requests, and writes events back.

Theory of operation. ``protocol.py`` hands a request carrying ``Upgrade: websocket`` to
:func:`upgrade`. It validates the handshake (RFC 6455 §4.2.1) and the connection cap and
answers any problem as an ordinary HTTP error in the OpenAI envelope, *before* switching.
Otherwise it answers 101 through h11 (:meth:`HTTPProtocol.switch_protocol`), which returns the
bytes that arrived behind the upgrade request; they are the first bytes fed to a fresh
``wsproto`` connection (no extension is negotiated: no permessage-deflate, like the SDK).

From then on the protocol forwards ``data_received``/``eof_received``/``connection_lost``/
``resume_writing`` to the :class:`WebSocketSession`. Text messages are reassembled from
wsproto's partial frames under a size cap (close 1009 above it), a server-wide budget for the
bytes of all unfinished messages (close 1013, try again later) and a deadline for finishing
one (close 1008); see :meth:`WebSocketSession._on_data`. Each ``response.create``
becomes ``Request(method="POST", path="/v1/responses", transport="ws", ...)`` and goes through
``app.dispatch`` exactly like HTTP (auth, rate-limit, fault and capacity hooks apply), started
as HTTP starts a handler (:func:`~llmsim.protocol.start_handler`, on the loop pass after the
read); there is no second implementation of the Responses logic here. The resulting
``EventStream`` is paced by a :class:`~llmsim.flow.Pump` whose sink is the session's
:class:`~llmsim.wire.WSWire`: every event becomes one JSON text frame (framed by hand there,
20x cheaper than ``wsproto.send``), with ``stream_id`` appended when the create named a lane.
Errors decided before the first event (a ``RawResponse``) become the SDK's nested ``ResponseWsError`` event and the
connection stays open.

Ordering. A *lane* is a ``stream_id`` (or the default lane when none is given). A lane runs one
response at a time, FIFO. Up to ``max_active`` responses of different lanes run at once; the
rest wait in arrival order. Named lanes are capped per connection (``max_lanes`` distinct ids,
as the real service: the count never goes down). Waiting creates are capped (``max_queued``):
beyond it the session stops reading the socket, so a client that floods creates is slowed by
TCP instead of growing a queue (all decided by the ``LaneScheduler``).

Cache. The most recent completed response of each lane (the whole connection, when no lanes
are used) is kept in the connection's ``ConnectionCache``; each create carries its lane's view
of it as ``Request.context`` (typed ``PreviousResponses``), which the Responses handler
consults for ``previous_response_id`` before its global store (so ``store: false`` chains
work). A same-lane continuation that fails evicts its parent, as the real service does.

Backpressure and lifetime. Pumps check ``paused`` (the transport is above its high-water mark)
and stop pulling events; ``resume_writing`` resumes them. While paused the session also stops
reading client messages, so error replies to a client that does not read cannot pile up. A
connection lives ``connection_time_limit_s``: then a ``websocket_connection_limit_reached``
error event and a close (1001). Every timer (time limit, close timeout, fragment timeout) is
on ``app.clock``, so a FakeClock drives them in tests. A vanished client cancels every pump
and task and releases every gauge exactly once; so does a client that reads nothing for
``write_stall_timeout_s`` (the protocol cuts it, :meth:`WebSocketSession.cut`).

Failures. An exception while a response runs (rendering, encoding: anything after dispatch)
never wedges its lane: before the first event it is answered as a 500 error event, after it
the pump writes a terminal error event (with the lane's ``stream_id``); the job ends and the
lane moves on. An exception while handling a client frame closes the connection with 1011.
Client messages nested deeper than :data:`~llmsim.messages.MAX_JSON_DEPTH` are refused with
an error event (they could not be echoed).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import orjson
from wsproto.connection import Connection, ConnectionState, ConnectionType
from wsproto.events import (
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    Pong,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError

from .api.responses.state import ConnectionCache
from .errors import APIError, E, server_error
from .flow import Pump
from .messages import (
    JSONResponse,
    RawResponse,
    Request,
    Result,
    StreamResponse,
)
from .protocol import start_handler
from .sim.rng import new_id
from .state import accounting  # per-request accounting shared with HTTP (stats, access log)
from .wire import WSWire
from .ws_events import STREAM_ID_RE, Create, EventError, Steer, parse_client_event
from .ws_handshake import WS_PATHS, check_capacity, check_handshake, ws_path
from .ws_lanes import LaneLimitError, LaneScheduler

if TYPE_CHECKING:
    from .app import App
    from .clock import Timer
    from .protocol import HTTPProtocol

__all__ = ["upgrade", "WebSocketSession", "WebSocketState", "WS_PATHS", "error_event",
           "STREAM_ID_RE", "check_handshake"]

_OPEN = ConnectionState.OPEN  # (an Enum member read through its class: ~70 ns)
log = logging.getLogger("llmsim")

CLIENT_EVENTS = ("response.create", "response.steer")
_MAX_CLOSE_REASON = 120  # a close frame's reason must fit in 123 bytes
# what one held fragment costs beyond its text (a str object and a list slot): counted in
# pending_bytes, so a flood of 1-byte fragments is bounded by memory, not by payload bytes
FRAGMENT_OVERHEAD = 64


# ------------------------------------------------------------------------------------------
# Shared state and the upgrade
# ------------------------------------------------------------------------------------------

class WebSocketState:
    """Per-app WebSocket state (``app.websocket``): the live sessions."""

    def __init__(self) -> None:
        self.sessions: set[WebSocketSession] = set()
        self.total = 0  # connections accepted since start
        self.pending_bytes = 0  # memory of unfinished client messages held, all sessions


def state(app: App) -> WebSocketState:
    st = app.websocket
    if st is None:
        st = app.websocket = WebSocketState()
    return st


async def upgrade(protocol: HTTPProtocol, req: Request) -> Result | None:
    """``app.ws_handler``: switch to a WebSocket session, or return the HTTP error Result."""
    from .app import error_result

    if protocol.transport is None or protocol.transport.is_closing():
        return None
    try:
        return _upgrade(protocol, req)
    except Exception:  # a bug must still get an answer, not a hung connection
        log.exception("websocket upgrade failed")
        if protocol.upgraded is not None:
            protocol.force_close()
            return None
        return error_result(server_error(code=None))


def _upgrade(protocol: HTTPProtocol, req: Request) -> Result | None:
    app = protocol.app
    from .app import error_result

    try:
        if ws_path(req.path) not in WS_PATHS:
            app.router.resolve(req.method, ws_path(req.path))  # an unknown path: its 404
    except APIError as exc:
        if exc.status == 404:
            return error_result(exc)
    try:
        accept = check_handshake(req.method, req.path, req.headers,
                                 getattr(protocol.conn, "their_http_version", b"1.1"))
        authenticate = app.authenticate
        if authenticate is not None:
            authenticate(req)  # a missing/wrong key is refused before the upgrade (401)
        check_capacity(len(state(app).sessions), app.config.websocket.max_connections)
    except APIError as exc:
        return error_result(exc)
    session = WebSocketSession(protocol, app, req)
    trailing = protocol.switch_protocol(
        [(b"sec-websocket-accept", accept), (b"server", b"llmsim"),
         (b"x-request-id", req.request_id.encode())], session)
    session.start(trailing)
    return None


# ------------------------------------------------------------------------------------------
# Events
# ------------------------------------------------------------------------------------------

def error_event(status: int | None, etype: str, message: str, code: str | None = None,
                param: str | None = None, stream_id: str | None = None,
                headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The SDK's ``ResponseWsError``: ``{"type": "error", "status", "error": {...}}``. The
    Open Responses WebSocket error schema requires a string ``code``: an error without one
    gives its type."""
    err: dict[str, Any] = {"type": etype, "code": code if code is not None else etype,
                           "message": message, "param": param}
    if headers:
        err["headers"] = dict(headers)
    ev: dict[str, Any] = {"type": "error", "error": err}
    if status is not None:
        ev["status"] = status
    if stream_id is not None:
        ev["stream_id"] = stream_id
    return ev


def _from_result(res: Result, stream_id: str | None) -> dict[str, Any]:
    """An error Result (decided before the first event) as a WebSocket error event."""
    status = res.status
    e = res.error if type(res) is RawResponse else None
    if e is not None:  # the error object itself: nothing to parse back
        hdrs = {k.lower(): v for k, v in res.headers} if res.headers else None
        return error_event(status, e.type, e.message, e.code, e.param, stream_id, hdrs)
    body: Any = None
    if type(res) is RawResponse:
        try:
            body = orjson.loads(res.body)
        except orjson.JSONDecodeError:
            body = None
    elif type(res) is JSONResponse:
        body = res.data
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        text = res.body.decode("utf-8", "replace") if type(res) is RawResponse else ""
        err = {"message": text or f"Request failed with status {status}.",
               "type": "invalid_request_error" if status < 500 else "server_error"}
    hdrs = {k.lower(): v for k, v in res.headers} if res.headers else None
    return error_event(status, str(err.get("type") or "invalid_request_error"),
                       str(err.get("message") or ""), err.get("code"), err.get("param"),
                       stream_id, hdrs)


# ------------------------------------------------------------------------------------------
# The session
# ------------------------------------------------------------------------------------------

class Job:
    """One response running on a lane: the dispatch task, then its pump."""

    __slots__ = ("lane", "req", "prev_id", "task", "pump", "res", "done", "streaming",
                 "endpoint", "track", "answered", "first_step")

    def __init__(self, lane: str | None, req: Request, prev_id: str | None) -> None:
        self.lane = lane  # the stream_id (None: the default lane)
        self.req = req
        self.prev_id = prev_id
        self.task: asyncio.Task[None] | None = None
        self.pump: Pump | None = None
        self.res: StreamResponse | None = None
        self.done = False
        self.streaming = False
        self.endpoint = "responses"
        self.track: Any = None  # the stats StreamTrack while streaming
        self.answered = False  # counted in stats (stream started or error sent)
        self.first_step = False  # its handler runs its first step (start_handler)

    def running(self) -> bool:
        """Not ended (its handler is still wanted)."""
        return not self.done


class WebSocketSession:
    """One upgraded connection (see the module doc); its pumps write through ``wire``."""

    def __init__(self, protocol: HTTPProtocol, app: App, handshake: Request) -> None:
        self.protocol = protocol
        self.app = app
        self.cfg = app.config.websocket
        self.handshake = handshake
        self.ws = Connection(ConnectionType.SERVER)  # no extensions: no compression
        self.transport = protocol.transport
        self.closed = False  # the transport is gone
        self.closing = False  # a close frame was sent or received: no new work
        # what every event is written through (the pumps' sink): open while text may be
        # sent, i.e. while wsproto's state is OPEN and the transport is here (_sync)
        self.wire = WSWire(protocol.transport, protocol.paused)
        self.draining = False  # graceful shutdown: finish in-flight, then close
        self._counted = False
        self._msg: list[str] = []  # fragments of the unfinished text message
        self._msg_bytes = 0  # bytes of the message so far (text or binary)
        self._held = 0  # memory of self._msg, counted in WebSocketState.pending_bytes
        self._frag_timer: Timer | None = None  # fragment_timeout_s of the unfinished message
        # which create runs when (pure: ws_lanes); the jobs it started
        self.lanes: LaneScheduler[tuple[Request, str | None]] = LaneScheduler(
            self.cfg.max_lanes, self.cfg.max_active, self.cfg.max_queued)
        self._jobs: set[Job] = set()
        # previous_response_id cache (owned by the Responses state): one per named lane plus
        # the default lane
        self.cache = ConnectionCache(self.cfg.max_lanes + 1)
        self._read_paused = False
        self._timer: Timer | None = None  # connection_time_limit_s
        self._close_timer: Timer | None = None  # close_timeout_s after our close frame
        self.opened_at = app.clock.now()

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, trailing: bytes) -> None:
        """Called right after the 101: count the connection, arm the time limit, feed the
        bytes that came behind the upgrade request."""
        st = state(self.app)
        st.sessions.add(self)
        st.total += 1
        stats = self.app.stats
        if hasattr(stats, "ws_open"):
            stats.ws_open()
        else:
            stats.active_websockets += 1
        self._counted = True
        limit = self.cfg.connection_time_limit_s
        if limit > 0:
            self._timer = self.app.clock.call_later(limit, self._on_time_limit)
        if trailing:
            self.data_received(trailing)

    def connection_lost(self, exc: Exception | None) -> None:
        """The TCP connection is gone: cancel everything, release every counter once."""
        if self.closed:
            return
        self.closed = True
        self.closing = True
        self._sync()
        for t in (self._timer, self._close_timer):
            if t is not None:
                self.app.clock.cancel(t)
        self._timer = self._close_timer = None
        self._drop_message()
        self._cancel_all()
        self.cache.clear()
        if self._counted:
            self._counted = False
            stats = self.app.stats
            if hasattr(stats, "ws_close"):
                stats.ws_close()
            else:
                stats.active_websockets -= 1
            state(self.app).sessions.discard(self)

    def eof_received(self) -> bool:
        """The client half-closed without a close frame (1006): end the connection."""
        try:
            self.ws.receive_data(None)
        except LocalProtocolError:
            pass
        self._sync()
        self._process()
        return False

    def resume_writing(self) -> None:
        """The client drained our writes: resume pumps and reading."""
        for job in list(self._jobs):
            if job.pump is not None:
                job.pump.resume()
        self._maybe_resume_reading()

    def shutdown(self) -> None:
        """Graceful server shutdown: finish what runs, accept nothing new, close 1001."""
        self.draining = True  # queued creates still run; new ones are refused
        if not self._jobs and self.lanes.idle:
            self.close(1001, "server shutting down")

    def cut(self, reason: str) -> None:
        """Drop the connection now (the client stopped reading): end every response with
        ``reason`` and release it; the protocol aborts the transport."""
        if self.closed:
            return
        self.closing = True
        self._cancel_all(reason)

    def close(self, code: int, reason: str = "") -> None:
        """Start the close handshake; the transport closes when the client answers (or after
        ``close_timeout_s``)."""
        if self.closed:
            return
        self.closing = True
        self._drop_message()
        self._cancel_all()
        if self.ws.state is ConnectionState.OPEN:
            self._write(self.ws.send(CloseConnection(code=code,
                                                     reason=reason[:_MAX_CLOSE_REASON])))
            self._sync()
            if self._close_timer is None:
                self._close_timer = self.app.clock.call_later(self.cfg.close_timeout_s,
                                                              self._close_transport)
        else:
            self._close_transport()

    def _close_transport(self) -> None:
        t, self._close_timer = self._close_timer, None
        if t is not None:
            self.app.clock.cancel(t)  # (a no-op when it is this timer firing)
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def _on_time_limit(self) -> None:
        self._timer = None
        if self.closing:
            return
        self.closing = True
        self._cancel_all()
        minutes = self.cfg.connection_time_limit_s / 60
        span = (f"{minutes:g} minutes" if minutes >= 1
                else f"{self.cfg.connection_time_limit_s:g} seconds")
        self._reject(E.websocket_time_limit.at(span=span))
        self.close(1001, "connection time limit reached")

    # -- writing -----------------------------------------------------------------------------
    def _sync(self) -> None:
        """wsproto's state or the transport may have changed: tell the wire whether text
        frames may still be written (called where the state can leave OPEN: a close frame
        received or sent, EOF, and when the connection goes)."""
        self.wire.open = not self.closed and self.ws.state is _OPEN

    def _write(self, data: bytes) -> None:
        """Bytes wsproto rendered (control frames)."""
        if not self.closed and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def send_event(self, event: dict[str, Any]) -> None:
        """Send one server event (errors and other events outside a response stream)."""
        self.wire.write_events([orjson.dumps(event)])

    # -- reading -----------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            self.ws.receive_data(data)
        except LocalProtocolError:  # bytes after the close handshake
            return
        self._process()

    def _pause_reading(self) -> None:
        if not self._read_paused:
            self._read_paused = True
            if self.transport is not None and not self.transport.is_closing():
                self.transport.pause_reading()

    def _maybe_resume_reading(self) -> None:
        if (self._read_paused and not self.closed and not self.protocol.paused
                and not self.lanes.full):
            self._read_paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
            self._process()

    def _process(self) -> None:
        """Handle every complete wsproto event, unless backpressure says stop."""
        if self.closed or self._read_paused:
            return
        for ev in self.ws.events():
            try:
                self._handle(ev)
            except Exception:  # a bug must not kill the loop's callback: close 1011
                log.exception("websocket event handling failed")
                self.close(1011, "internal error")
                return
            if self.closed:
                return
            if self.protocol.paused or self.lanes.full:
                # stop here: the rest stays in wsproto's buffer (at most one socket read)
                self._pause_reading()
                return

    def _handle(self, ev: Event) -> None:
        t = type(ev)
        if t is TextMessage or t is BytesMessage:
            self._on_data(ev)  # type: ignore[arg-type]
        elif t is Ping:
            if self.ws.state is _OPEN:
                self._write(self.ws.send(ev.response()))  # type: ignore[attr-defined]
        elif t is Pong:
            pass
        elif t is CloseConnection:
            self._on_close(ev)  # type: ignore[arg-type]

    def _on_close(self, ev: CloseConnection) -> None:
        self.closing = True
        self._drop_message()
        self._cancel_all()
        ws = self.ws
        if ws.state is ConnectionState.REMOTE_CLOSING:  # the client started the handshake
            self._write(ws.send(ev.response()))
        elif ws.state is _OPEN:  # wsproto found a protocol error (1002/1007)
            self._write(ws.send(CloseConnection(code=ev.code,
                                                reason=(ev.reason or "")[:_MAX_CLOSE_REASON])))
        self._sync()  # (the close frames received and sent: no text from here on)
        self._close_transport()

    def _on_data(self, ev: TextMessage | BytesMessage) -> None:
        """A message or a piece of one (wsproto hands over fragments and partial frames as
        they arrive). Bytes are counted as they come: the message against
        ``max_message_bytes`` (close 1009), the text held until it is complete against the
        server-wide ``max_pending_bytes`` (close 1013: a temporary condition, retry), and an
        unfinished message must complete within ``fragment_timeout_s`` (close 1008)."""
        if self.closing:
            return
        data = ev.data
        is_text = type(ev) is TextMessage
        if is_text:
            n = len(data) if data.isascii() else len(data.encode())  # type: ignore[union-attr]
        else:
            n = len(data)
        self._msg_bytes += n
        cfg = self.cfg
        if self._msg_bytes > cfg.max_message_bytes:
            self.close(1009, f"message too big: the limit is {cfg.max_message_bytes} bytes")
            return
        if not ev.message_finished:
            if self._frag_timer is None and cfg.fragment_timeout_s > 0:
                self._frag_timer = self.app.clock.call_later(cfg.fragment_timeout_s,
                                                             self._on_fragment_timeout)
            if is_text:  # binary payloads are counted, never held
                st = state(self.app)
                cap = cfg.max_pending_bytes
                held = n + FRAGMENT_OVERHEAD
                if cap and st.pending_bytes + held > cap:
                    self.close(1013, f"server busy: unfinished messages of all connections "
                               f"would pass {cap} bytes; retry later")
                    return
                st.pending_bytes += held
                self._held += held
                self._msg.append(data)  # type: ignore[arg-type]
            return
        if not is_text:
            self._drop_message()
            self._reject(E.websocket_binary_message.at())
            return
        if self._msg:
            self._msg.append(data)  # type: ignore[arg-type]
            text = "".join(self._msg)
            self._drop_message()
        else:  # the whole message in one piece (the common case): nothing was held
            text = data  # type: ignore[assignment]
            self._msg_bytes = 0
        self._on_message(text)

    def _drop_message(self) -> None:
        """Forget the unfinished message: release its bytes and its timer (every path)."""
        self._msg = []
        self._msg_bytes = 0
        if self._held:
            state(self.app).pending_bytes -= self._held
            self._held = 0
        t = self._frag_timer
        if t is not None:
            self._frag_timer = None
            self.app.clock.cancel(t)

    def _on_fragment_timeout(self) -> None:
        self._frag_timer = None
        if self.closing:
            return
        if self._read_paused:  # the server stopped reading (backpressure): not the client's
            self._frag_timer = self.app.clock.call_later(self.cfg.fragment_timeout_s,
                                                         self._on_fragment_timeout)
            return
        self.close(1008, f"message not completed within {self.cfg.fragment_timeout_s:g} s "
                   "of its first fragment")

    # -- client events -----------------------------------------------------------------------
    def _reject(self, err: APIError, stream_id: str | None = None) -> None:
        self.send_event(error_event(err.status, err.type, err.message, err.code, err.param,
                                    stream_id))

    def _on_message(self, text: str) -> None:
        try:
            ev = parse_client_event(text)  # (pure: ws_events)
        except EventError as exc:
            self.send_event(error_event(exc.status, exc.type, exc.message, exc.code, exc.param,
                                        exc.stream_id))
            return
        if type(ev) is Create:
            self._on_create(ev)
        else:
            self._on_steer(ev)  # type: ignore[arg-type]

    def _running_stream(self, rid: str) -> Pump | None:
        """The pump of response ``rid`` if it is streaming on this connection (≤ 16 jobs)."""
        for job in self._jobs:
            if (job.streaming and job.pump is not None and job.res is not None
                    and job.res.stream.id == rid):
                return job.pump
        return None

    def _on_steer(self, ev: Steer) -> None:
        """Steering is not simulated: answer with the SDK's ``response.steer.failed``."""
        # the answer belongs to the steered response's stream when it is running here (the
        # stream numbers it); a response not running on this connection has no stream: 0
        running = self._running_stream(ev.previous_id)
        self.send_event({
            "type": "response.steer.failed",
            "sequence_number": running.claim() if running is not None else 0,
            "error": {k: v for k, v in E.steering_not_supported.at().to_dict().items()
                      if k != "param"},
            "steer": {"input": ev.input, "previous_response_id": ev.previous_id}})

    def _on_create(self, ev: Create) -> None:
        sid = ev.stream_id
        if self.draining:
            self._reject(E.server_shutting_down.at(), stream_id=sid)
            return
        req = Request(method="POST", path="/v1/responses", query=self.handshake.query,
                      headers=self.handshake.headers, body=orjson.dumps(ev.body),
                      request_id="req_" + new_id("", 32), transport="ws",
                      client=self.handshake.client, received_at=self.app.clock.now(),
                      context=self.cache.lane(sid))
        try:
            self.lanes.admit(sid, (req, ev.previous_id))
        except LaneLimitError as exc:
            self._reject(E.too_many_websocket_streams.at("stream_id", limit=exc.limit),
                         stream_id=sid)
            return
        self._run_next()

    # -- scheduling --------------------------------------------------------------------------
    def _run_next(self) -> None:
        if self.closing:
            return
        for lane, (req, prev) in self.lanes.take_ready():
            job = Job(lane, req, prev)
            self._jobs.add(job)
            self.app.stats.request_open()
            # (on the next loop pass, as HTTP starts a handler: protocol.start_handler)
            asyncio.get_running_loop().call_soon(self._start_job, job)
        if self._read_paused:
            self._maybe_resume_reading()

    def _start_job(self, job: Job) -> None:
        if not job.done:  # (not cancelled meanwhile: _cancel_all ends a job with no task)
            job.task = start_handler(self._run(job), job.running, job)

    async def _run(self, job: Job) -> None:
        app = self.app
        route = None
        try:  # resolve here (not in dispatch) to know the endpoint for stats, as HTTP does
            route, _params = app.resolve(job.req)
            job.endpoint = route.name
        except APIError:
            job.endpoint = "unmatched"  # dispatch answers 404/405
        try:
            res = await app.dispatch(job.req, route)
        except asyncio.CancelledError:
            self._job_done(job, "cancelled")
            return
        except Exception:  # dispatch decides errors itself; this is a bug guard
            log.exception("websocket dispatch failed")
            res = RawResponse(server_error().body(), status=500)
        job.task = None
        try:
            self._answer(job, res)
        except Exception:  # rendering, encoding, accounting: the lane must move on
            log.exception("websocket response failed")
            self._job_failed(job)

    def _job_failed(self, job: Job) -> None:
        """An exception after dispatch: a 500 error event (terminal: its stream, if it had
        started, is over) and the job ends, releasing its stream and request gauges."""
        if job.done:
            return
        err = server_error()
        ev = error_event(500, err.type, err.message, err.code, stream_id=job.lane)
        if job.streaming and job.res is not None:
            ev["sequence_number"] = (job.pump.claim() if job.pump is not None
                                     else job.res.stream.claim())
        try:
            self.send_event(ev)
            if job.pump is not None:
                job.pump.cancel("error")  # → _pump_done: releases the stream and the job
            self._close_stream(job, "error")
            if not job.answered:
                self._account(job, RawResponse(err.body(), status=500))
        except Exception:
            log.exception("cannot end the failed response")
        finally:
            self._job_done(job, "error")

    def _answer(self, job: Job, res: Result) -> None:
        sid = job.lane
        if type(res) is StreamResponse:
            job.res = res  # type: ignore[assignment]
            if job.done or self.closing:
                res.stream.close()  # type: ignore[union-attr]
                self._close_stream(job, "cancelled")  # never pumped: still release it
                self._job_done(job, "cancelled")
                return
            self._start_pump(job, res)  # type: ignore[arg-type]
            return
        if job.done or self.closing:
            self._job_done(job, "cancelled")
            return
        if getattr(res, "abort", False):  # fault injection: drop the connection
            self._account(job, res)
            self._job_done(job, "disconnect")
            self.wire.abort()
            return
        if res.status < 400:
            log.error("the Responses handler answered a WebSocket create without a stream")
            res = RawResponse(server_error().body(), status=500)
        self.cache.continuation_failed(sid, job.prev_id)
        self._account(job, res)
        self.send_event(_from_result(res, sid))
        self._job_done(job, "error")

    def _account(self, job: Job, res: Result) -> None:
        job.answered = True
        accounting.response_sent(self.app, job.req, job.endpoint, res.status, res,
                                 transport="ws")

    def _start_pump(self, job: Job, res: StreamResponse) -> None:
        sid = job.lane
        suffix = b',"stream_id":"' + sid.encode() + b'"}' if sid is not None else None
        ws_text = res.stream.dialect.ws
        if ws_text is None:  # (only families with a WebSocket mode are dispatched here)
            raise TypeError(f"{res.stream.dialect} has no WebSocket mode")
        prev = job.prev_id

        def enc(etype: str, data: Any) -> bytes:
            b = ws_text(etype, data)
            if etype == "response.failed":
                self.cache.continuation_failed(sid, prev)
            if suffix is not None and b[-1:] == b"}":
                return b[:-1] + suffix if len(b) > 2 else b"{" + suffix[1:]
            return b

        if suffix is None and hasattr(ws_text, "bytes_frame"):
            # a token the plan rendered (bytes: never response.failed) is its own payload
            # then: the pump frames it without calling enc (issue 15)
            enc.bytes_frame = ws_text.bytes_frame  # type: ignore[attr-defined]

        def error_frame(err: APIError, seq: int) -> bytes:
            ev = error_event(500, err.type, err.message, err.code, stream_id=sid)
            ev["sequence_number"] = seq
            return orjson.dumps(ev)

        job.streaming = True
        job.answered = True
        job.track = accounting.stream_started(self.app, job.req, job.endpoint, res,
                                              transport="ws")
        job.pump = Pump(res.stream, self.app.clock, enc, self.wire,
                        lambda reason: self._pump_done(job, reason), job.track.observe,
                        error_frame)
        # (a handler that has not suspended: the schedule counts from the create's arrival,
        # Pump.start)
        job.pump.start(job.req.received_at if job.first_step else None)  # never raises

    def _pump_done(self, job: Job, reason: str) -> None:
        self._close_stream(job, reason)
        self._job_done(job, reason)

    def _close_stream(self, job: Job, reason: str) -> None:
        if job.streaming:
            job.streaming = False
            accounting.stream_ended(self.app, job.req, job.track, reason)
            job.track = None
        res, job.res = job.res, None
        cb = res.on_close if res is not None else None
        if cb is not None:
            try:
                cb(reason)
            except Exception:
                log.exception("stream close callback failed")

    def _job_done(self, job: Job, reason: str) -> None:
        if job.done:
            return
        job.done = True
        job.pump = None
        if not job.answered:
            accounting.request_gone(self.app, job.req, job.endpoint, transport="ws")
        self._jobs.discard(job)
        self.app.stats.request_close()
        self.lanes.finish(job.lane)
        if not self.closing:
            self._run_next()
            if self.draining and not self._jobs and self.lanes.idle:
                self.close(1001, "server shutting down")

    def _cancel_all(self, reason: str = "cancelled") -> None:
        """Stop every running response and forget queued ones (client gone or closing)."""
        self.lanes.drop_queued()
        for job in list(self._jobs):
            if job.pump is not None:
                job.pump.cancel(reason)  # → _pump_done(reason)
            elif job.task is not None and not job.task.done():
                job.task.cancel()  # → _run sees CancelledError → _job_done
            if not job.task and job.pump is None and not job.done:
                self._job_done(job, reason)
