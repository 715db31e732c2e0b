"""A WebSocket connection (RFC 6455 over wsproto) that serves one WebSocket *mode*.

The transport is generic; what the messages mean is the mode's. ``http.py`` hands a request
carrying ``Upgrade: websocket`` to :func:`upgrade`, which finds the mode the router has for the
path (:meth:`llmsim.routing.Router.add_ws`: e.g. the Responses API's at ``/v1/responses``), validates the handshake (RFC 6455 §4.2.1), the API key and the connection
cap, and answers any problem as an ordinary HTTP error *before* switching. Otherwise it answers
101 through h11 (:meth:`HTTPProtocol.switch_protocol`) and the :class:`WSConnection` takes the
connection over: the bytes that arrived behind the upgrade request are its first read. Reads
go to a fresh ``wsproto`` connection (no extension is negotiated: no permessage-deflate),
except while every read has been whole masked text frames: those the connection unmasks
itself (``_read_direct``), and the first read that is anything else hands wsproto the rest
of the connection from that frame on.

The connection owns everything a mode should not have to know: text messages reassembled from
wsproto's partial frames under a size cap (close 1009), a server-wide budget for the bytes of
all unfinished messages (close 1013), a deadline for finishing one (close 1008), binary
messages refused, ping/pong, the close handshake (``close_timeout_s``), the connection time
limit (an error event, then close 1001), reading paused while the transport is above its
high-water mark or the mode is busy (TCP backpressure), a stalled client cut, and the gauges,
each released exactly once. Every timer is on ``app.clock`` (a FakeClock drives them in
tests). Events are written through the connection's :class:`~llmsim.streaming.wire.WSWire`: one JSON
text frame each, framed by hand.

A mode (:class:`llmsim.routing.WSMode`) gets each complete text message, says how it reports an error, stops
its work when the connection closes or goes, and says whether it is busy (stop reading) or
idle (a graceful shutdown may close now).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

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

from ..errors import APIError, E, server_error
from ..messages import Key, Request, Result, error_result
from ..routing import WSMode
from ..streaming.wire import WSWire
from .handshake import check_capacity, check_handshake, ws_path

if TYPE_CHECKING:
    import asyncio

    from ..app import App
    from ..streaming.clock import Timer


class HTTPProtocol(Protocol):
    """What the upgrade needs of the HTTP connection it takes over
    (:class:`llmsim.transport.http.HTTPProtocol`)."""

    app: App
    conn: Any  # its h11 connection (the request's HTTP version)
    transport: asyncio.Transport | None
    upgraded: Any

    @property
    def paused(self) -> bool: ...

    def switch_protocol(self, headers: list[tuple[bytes, bytes]], session: Any) -> bytes: ...

    def force_close(self) -> None: ...

    def defer(self, fn: Callable[[Any, Any], Any], a: Any, b: Any) -> None: ...

__all__ = ["upgrade", "WSConnection", "WebSocketState", "state", "WEBSOCKET",
           "FRAGMENT_OVERHEAD"]

_OPEN = ConnectionState.OPEN  # (an Enum member read through its class: ~70 ns)
log = logging.getLogger("llmsim")

_MAX_CLOSE_REASON = 120  # a close frame's reason must fit in 123 bytes
# what one held fragment costs beyond its text (a str object and a list slot): counted in
# pending_bytes, so a flood of 1-byte fragments is bounded by memory, not by payload bytes
FRAGMENT_OVERHEAD = 64


class WebSocketState:
    """Per-app WebSocket state (``App.features[WEBSOCKET]``): the live connections."""

    def __init__(self) -> None:
        self.sessions: set[WSConnection] = set()
        self.total = 0  # connections accepted since start
        self.pending_bytes = 0  # memory of unfinished client messages held, all sessions


def state(app: App) -> WebSocketState:
    st = app.feature(WEBSOCKET)
    if st is None:
        st = WebSocketState()
        app.set_feature(WEBSOCKET, st)
    return st


WEBSOCKET: Key[WebSocketState] = Key("websocket")  # in App.features


async def upgrade(protocol: HTTPProtocol, req: Request) -> Result | None:
    """Switch to a WebSocket connection (http.py calls it), or return the HTTP error."""
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
    st = state(app)
    path = ws_path(req.path)
    modes = app.router.ws_modes
    try:
        if path not in modes:
            app.router.resolve(req.method, path)  # an unknown path: its 404
    except APIError as exc:
        if exc.status == 404:
            return error_result(exc)
    try:
        accept = check_handshake(req.method, req.path, req.headers, modes,
                                 getattr(protocol.conn, "their_http_version", b"1.1"))
        authenticate = app.authenticate
        if authenticate is not None:
            authenticate(req)  # a missing/wrong key is refused before the upgrade (401)
        check_capacity(len(st.sessions), app.config.websocket.max_connections)
    except APIError as exc:
        return error_result(exc)
    conn = WSConnection(protocol, app, req, modes[path](app, req))
    trailing = protocol.switch_protocol(
        [(b"sec-websocket-accept", accept), (b"server", b"llmsim"),
         (b"x-request-id", req.request_id.encode())], conn)
    conn.start(trailing)
    return None


class WSConnection:
    """One upgraded connection (see the module doc), serving one :class:`WSMode`."""

    def __init__(self, protocol: HTTPProtocol, app: App, handshake: Request,
                 mode: WSMode) -> None:
        self.protocol = protocol
        self.app = app
        self.cfg = app.config.websocket
        self.handshake = handshake
        self.mode = mode
        self.ws = Connection(ConnectionType.SERVER)  # no extensions: no compression
        self.transport = protocol.transport
        self.closed = False  # the transport is gone
        self.closing = False  # a close frame was sent or received: no new work
        # what every event is written through (the mode's pumps' sink): open while text may
        # be sent, i.e. while wsproto's state is OPEN and the transport is here (_sync)
        self.wire = WSWire(protocol.transport, protocol.paused)
        self.draining = False  # graceful shutdown: finish in-flight, then close
        self._counted = False
        self._msg: list[str] = []  # fragments of the unfinished text message
        self._msg_bytes = 0  # bytes of the message so far (text or binary)
        self._held = 0  # memory of self._msg, counted in WebSocketState.pending_bytes
        self._frag_timer: Timer | None = None  # fragment_timeout_s of the unfinished message
        self._read_paused = False
        # every read so far was whole text frames, handled without wsproto (_read_direct):
        # wsproto has been fed nothing
        self._direct = True
        self._timer: Timer | None = None  # connection_time_limit_s
        self._close_timer: Timer | None = None  # close_timeout_s after our close frame
        self.opened_at = app.clock.now()
        # ``defer(fn, a, b)``: ``fn(a, b)`` on the loop's next pass, with the requests read
        # meanwhile (HTTPProtocol.defer): how a mode starts the work a message asks for
        self.defer = protocol.defer
        mode.attach(self)

    @property
    def paused(self) -> bool:
        """The transport is above its high-water mark (the mode should not write more)."""
        return bool(self.protocol.paused)

    def maybe_resume_reading(self) -> None:
        """The mode's queue may have room again: resume reading the socket if it was
        paused for it."""
        self._maybe_resume_reading()

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
        self._stop("cancelled")
        self.mode.gone()
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
        """The client drained our writes: resume the mode's streams and reading."""
        self.mode.resume()
        self._maybe_resume_reading()

    def shutdown(self) -> None:
        """Graceful server shutdown: finish what runs, accept nothing new, close 1001."""
        self.draining = True  # work already queued still runs; the mode refuses new work
        if self.mode.idle:
            self.close(1001, "server shutting down")

    def cut(self, reason: str) -> None:
        """Drop the connection now (the client stopped reading): end every response with
        ``reason`` and release it; the protocol aborts the transport."""
        if self.closed:
            return
        self.closing = True
        self._stop(reason)

    def close(self, code: int, reason: str = "") -> None:
        """Start the close handshake; the transport closes when the client answers (or after
        ``close_timeout_s``)."""
        if self.closed:
            return
        self.closing = True
        self._drop_message()
        self._stop("cancelled")
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
        self._stop("cancelled")
        minutes = self.cfg.connection_time_limit_s / 60
        span = (f"{minutes:g} minutes" if minutes >= 1
                else f"{self.cfg.connection_time_limit_s:g} seconds")
        self.reject(E.websocket_time_limit.at(span=span))
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
        """Send one server event (errors and other events outside a stream)."""
        self.wire.write_events([orjson.dumps(event)])

    def reject(self, err: APIError, **extra: Any) -> None:
        """Send ``err`` as the mode's error event (the connection stays open)."""
        self.send_event(self.mode.error_event(err, **extra))

    def _stop(self, reason: str) -> None:
        """The connection is closing or gone: the mode ends all its work (again, if work
        started since: each path that closes calls this)."""
        self.mode.stop(reason)

    # -- reading -----------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        if self._direct:
            data = self._read_direct(data)
            if not data:
                return
        try:
            self.ws.receive_data(data)
        except LocalProtocolError:  # bytes after the close handshake
            return
        self._process()

    def _read_direct(self, data: bytes) -> bytes:
        """The connection's reads while each has been whole text frames (what clients send
        a create as): the messages handled here, without wsproto's general parser (about 40
        Python calls a frame). Anything else (a control, fragmented, unmasked, non-minimal,
        long or non-UTF-8 frame, a frame split over reads, a close under way, reading paused)
        hands wsproto the rest of the connection for good, from the first byte of that frame:
        wsproto then holds everything it would have, and answers every protocol error as
        before. What is returned is that rest (empty: all handled here)."""
        at = 0
        end = len(data)
        while at < end:
            if self.closing or self._read_paused:
                break
            b0 = data[at]
            if b0 != 0x81 or end - at < 6:  # FIN, no RSV bits, a text frame; a mask key
                break
            b1 = data[at + 1]
            n = b1 & 0x7F
            if b1 < 0x80:  # unmasked: a client MUST mask (wsproto closes 1002)
                break
            head = 6
            if n == 126:
                if end - at < 8:
                    break
                n = (data[at + 2] << 8) | data[at + 3]
                if n < 126:  # (not the minimal length encoding: wsproto's error)
                    break
                head = 8
            elif n == 127:
                break
            stop = at + head + n
            if stop > end:  # split over reads
                break
            mask = data[at + head - 4:at + head]
            raw = (int.from_bytes(data[at + head:stop], "little")
                   ^ int.from_bytes((mask * ((n >> 2) + 1))[:n], "little")).to_bytes(n, "little")
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:  # (wsproto closes 1007)
                break
            at = stop
            if n > self.cfg.max_message_bytes:
                self._too_big()
                return b""
            if not self._handled(self.mode.message, text):
                if self.closing:
                    return b""
                break  # (paused: wsproto holds the rest until reading resumes)
        if at < end:
            self._direct = False
            return data[at:]
        return b""

    def _pause_reading(self) -> None:
        if not self._read_paused:
            self._read_paused = True
            if self.transport is not None and not self.transport.is_closing():
                self.transport.pause_reading()

    def _maybe_resume_reading(self) -> None:
        if (self._read_paused and not self.closed and not self.protocol.paused
                and not self.mode.busy):
            self._read_paused = False
            if self.transport is not None and not self.transport.is_closing():
                self.transport.resume_reading()
            self._process()

    def _process(self) -> None:
        """Handle every complete wsproto event, unless backpressure says stop."""
        if self.closed or self._read_paused:
            return
        for ev in self.ws.events():
            if not self._handled(self._handle, ev):
                return  # (paused: the rest stays in wsproto's buffer, at most one read)

    def _handled(self, handle: Callable[[Any], None], item: Any) -> bool:
        """``handle(item)`` for one thing read (a wsproto event, a message): a bug closes
        1011 (it must not kill the loop's callback). False: read no further now, the
        connection being closed or reading paused (the transport above its high-water mark,
        or the mode busy)."""
        try:
            handle(item)
        except Exception:
            log.exception("websocket event handling failed")
            self.close(1011, "internal error")
            return False
        if self.closed:
            return False
        if self.protocol.paused or self.mode.busy:
            self._pause_reading()
            return False
        return True

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
        self._stop("cancelled")
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
            self._too_big()
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
            self.reject(E.websocket_binary_message.at())
            return
        if self._msg:
            self._msg.append(data)  # type: ignore[arg-type]
            text = "".join(self._msg)
            self._drop_message()
        else:  # the whole message in one piece (the common case): nothing was held
            text = data  # type: ignore[assignment]
            self._msg_bytes = 0
        self.mode.message(text)

    def _too_big(self) -> None:
        self.close(1009, f"message too big: the limit is {self.cfg.max_message_bytes} bytes")

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
