"""The recorder's HTTP/1.1 and WebSocket client: one base URL (``http://`` or ``https://``), kept-alive
connections, and deadlines on every wait.

TLS uses the standard library's :mod:`ssl` with the system trust store, plus ``ca`` (a PEM
file of extra roots, ``--upstream-ca``) for a private CA; the host name is sent as SNI and
checked against the certificate. Each read waits at most ``read_timeout`` seconds and the
whole exchange (connect, request, every read) ends ``total_timeout`` seconds after it began:
a timeout is a 504 ``upstream_timeout``, any other failure (refused, reset, TLS, a malformed
answer) a 502 ``upstream_error``. An exchange read to its end returns its connection to the
pool (at most :data:`POOL_SIZE` idle ones); one abandoned midway (the client left, a bound was
hit) closes it.

:class:`WSLink` is one WebSocket connection to the upstream (a recorded Realtime session,
``ws://`` or ``wss://`` as the base is http or https, with the same TLS): the handshake within
the read deadline, then text messages reassembled under a size bound.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncGenerator, Mapping
from urllib.parse import urlencode, urlsplit

import h11
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from ..errors import APIError, E

__all__ = ["Upstream", "Exchange", "HOP_HEADERS", "WSLink"]

POOL_SIZE = 8
READ_BYTES = 65536
YIELD_EVERY = 512  # body pieces parsed from buffered bytes between two turns of the loop
# headers that describe one connection (RFC 9110 §7.6.1) or that this client sets itself
HOP_HEADERS = frozenset(("connection", "keep-alive", "proxy-connection", "te", "trailer",
                         "transfer-encoding", "upgrade", "host", "content-length",
                         "accept-encoding", "expect"))


class Upstream:
    """One base URL and its idle connections."""

    def __init__(self, base: str, *, ca: str | None = None, read_timeout: float = 60.0,
                 total_timeout: float = 600.0) -> None:
        u = urlsplit(base)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError(f"{base!r}: an http:// or https:// URL")
        self.base = base
        self.host = u.hostname
        self.port = u.port or (443 if u.scheme == "https" else 80)
        self.netloc = u.netloc.rpartition("@")[2]  # (never forward URL credentials)
        self.prefix = u.path.rstrip("/")
        self.ssl: ssl.SSLContext | None = None
        if u.scheme == "https":
            ctx = ssl.create_default_context()  # the system trust store, host name checked
            if ca:
                ctx.load_verify_locations(cafile=ca)
            self.ssl = ctx
        self.read_timeout = read_timeout
        self.total_timeout = total_timeout
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    def target(self, path: str, query: Mapping[str, list[str]]) -> str:
        """The upstream path for a request llmsim received at ``path``: llmsim's own family
        prefixes (``/openai`` before ``/v1``, ``/anthropic``) dropped, the base URL's path in
        front (a base ending in ``/v1`` does not double it). Azure's own paths
        (``/openai/deployments/...``) are the upstream's paths as they are."""
        for alias in ("/openai/v1/", "/anthropic/"):
            if path.startswith(alias):
                path = path[len(alias.split("/")[1]) + 1:]
                break
        prefix = self.prefix
        if prefix.endswith("/v1") and path.startswith("/v1/"):
            prefix = prefix[:-3]
        qs = urlencode([(k, v) for k, vs in query.items() for v in vs])
        return (prefix + path or "/") + (f"?{qs}" if qs else "")

    async def open(self, method: str, target: str, headers: list[tuple[str, str]],
                   body: bytes) -> Exchange:
        """Send the request and read the answer's head; the body is read with
        :meth:`Exchange.body`."""
        ex = Exchange(self, time.monotonic() + self.total_timeout)
        try:
            await ex.send(method, target, headers, body)
            await ex.head()
        except APIError as err:
            ex.close()
            if not (ex.reused and ex.fresh) or err.code == "upstream_timeout":
                raise
            # a kept-alive connection the upstream had closed (not one that went quiet: the
            # request may be running there): once more on a new one
            ex = Exchange(self, ex.deadline)
            try:
                await ex.send(method, target, headers, body, pooled=False)
                await ex.head()
            except BaseException:
                ex.close()
                raise
        except BaseException:
            ex.close()
            raise
        return ex

    def _take(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        while self._idle:
            reader, writer = self._idle.pop()
            if not writer.is_closing() and not reader.at_eof():
                return reader, writer
            writer.close()
        return None

    def _give(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._idle) < POOL_SIZE and not writer.is_closing():
            self._idle.append((reader, writer))
        else:
            writer.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()


class Exchange:
    """One request/answer on one connection."""

    def __init__(self, up: Upstream, deadline: float) -> None:
        self.up = up
        self.deadline = deadline
        self.started = time.monotonic()
        self.conn = h11.Connection(h11.CLIENT)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.fresh = True  # nothing of an answer received yet
        self.reused = False  # sent on a kept-alive connection
        self.done = False

    def elapsed(self) -> float:
        """Seconds since the request was sent."""
        return time.monotonic() - self.started

    def _left(self, what: str) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self._timeout("total")
        return min(left, self.up.read_timeout) if what == "read" else left

    def _timeout(self, which: str) -> APIError:
        up = self.up
        if which == "total":
            return E.upstream_timeout.at(base=up.base, what="the total deadline",
                                         seconds=up.total_timeout,
                                         flag="--upstream-timeout-s")
        return E.upstream_timeout.at(base=up.base, what="the per-read deadline",
                                     seconds=up.read_timeout, flag="--upstream-read-timeout-s")

    def _failed(self, exc: BaseException) -> APIError:
        reason = type(exc).__name__ + (f": {exc}" if str(exc) else "")
        return E.upstream_error.at(base=self.up.base, reason=reason)

    async def send(self, method: str, target: str, headers: list[tuple[str, str]],
                   body: bytes, pooled: bool = True) -> None:
        up = self.up
        got = up._take() if pooled else None
        self.reused = got is not None
        if got is None:
            try:
                self.reader, self.writer = await asyncio.wait_for(asyncio.open_connection(
                    up.host, up.port, ssl=up.ssl,
                    server_hostname=up.host if up.ssl is not None else None,
                    limit=READ_BYTES), self._left("read"))
            except TimeoutError:
                raise self._timeout("read") from None
            except (OSError, ssl.SSLError, ValueError) as exc:
                raise self._failed(exc) from None
        else:
            self.reader, self.writer = got
        hs = [("host", up.netloc), ("content-length", str(len(body))),
              ("accept-encoding", "identity"), *headers]
        writer = self.writer
        assert writer is not None
        try:
            writer.write(self.conn.send(h11.Request(method=method, target=target,
                                                         headers=hs))
                              + self.conn.send(h11.Data(data=body))
                              + self.conn.send(h11.EndOfMessage()))
            await asyncio.wait_for(writer.drain(), self._left("read"))
        except TimeoutError:
            raise self._timeout("read") from None
        except (OSError, h11.LocalProtocolError) as exc:
            raise self._failed(exc) from None

    async def _event(self) -> object:
        conn = self.conn
        while True:
            try:
                ev = conn.next_event()
            except h11.RemoteProtocolError as exc:
                raise self._failed(exc) from None
            if ev is not h11.NEED_DATA:
                return ev
            assert self.reader is not None
            try:
                data = await asyncio.wait_for(self.reader.read(READ_BYTES), self._left("read"))
            except TimeoutError:
                raise self._timeout("total" if self.deadline <= time.monotonic()
                                    else "read") from None
            except (OSError, ssl.SSLError) as exc:
                raise self._failed(exc) from None
            if data:
                self.fresh = False
            elif self.fresh:  # closed before answering (a stale kept-alive connection)
                raise self._failed(ConnectionResetError("closed before answering"))
            try:
                conn.receive_data(data)
            except h11.RemoteProtocolError as exc:
                raise self._failed(exc) from None

    async def head(self) -> None:
        while True:
            ev = await self._event()
            if isinstance(ev, h11.Response):
                self.status = ev.status_code
                self.headers = [(k.decode("latin-1"), v.decode("latin-1"))
                                for k, v in ev.headers]
                return
            if isinstance(ev, h11.ConnectionClosed):
                raise self._failed(ConnectionResetError("closed before answering"))

    async def body(self) -> AsyncGenerator[tuple[float, bytes], None]:
        """The body's pieces as they arrive, each with its offset (seconds) from the
        request; the connection goes back to the pool when the body ends."""
        n = 0
        while True:
            ev = await self._event()
            if isinstance(ev, h11.Data):
                n += 1
                if n % YIELD_EVERY == 0:  # many tiny chunks in one read: let others run
                    await asyncio.sleep(0)
                yield time.monotonic() - self.started, bytes(ev.data)
            elif isinstance(ev, (h11.EndOfMessage, h11.ConnectionClosed)):
                self.done = True
                self.close()
                return

    def close(self) -> None:
        """Release the connection: back to the pool after a whole exchange, else closed."""
        writer, reader = self.writer, self.reader
        if writer is None or reader is None:
            return
        self.writer = self.reader = None
        c = self.conn
        if self.done and c.our_state is h11.DONE and c.their_state is h11.DONE:
            self.up._give(reader, writer)
        else:
            writer.close()


class WSLink:
    """One WebSocket connection to the upstream: :meth:`open`, then :meth:`send` and
    :meth:`recv` text messages, :meth:`close` (every path). A message above ``max_bytes``
    or a binary one is a 502 ``upstream_error``."""

    def __init__(self, up: Upstream, max_bytes: int) -> None:
        self.up = up
        self.max_bytes = max_bytes
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.close_code: int | None = None  # the upstream's close code (1006: no close frame)
        self.close_reason = ""
        self._parts: list[str] = []
        self._size = 0
        self._events: list[object] = []

    def _failed(self, reason: str) -> APIError:
        return E.upstream_error.at(base=self.up.base, reason=reason)

    async def open(self, target: str, headers: list[tuple[str, str]]) -> None:
        """Connect and shake hands: each read within the per-read deadline, all of it within
        the total one."""
        up = self.up
        try:
            async with asyncio.timeout(up.total_timeout):
                await self._open(target, headers)
        except TimeoutError:
            raise E.upstream_timeout.at(base=up.base, what="the total deadline",
                                        seconds=up.total_timeout,
                                        flag="--upstream-timeout-s") from None

    async def _open(self, target: str, headers: list[tuple[str, str]]) -> None:
        up = self.up
        try:
            self.reader, self.writer = await asyncio.wait_for(asyncio.open_connection(
                up.host, up.port, ssl=up.ssl,
                server_hostname=up.host if up.ssl is not None else None,
                limit=READ_BYTES), up.read_timeout)
        except TimeoutError:
            raise E.upstream_timeout.at(base=up.base, what="the per-read deadline",
                                        seconds=up.read_timeout,
                                        flag="--upstream-read-timeout-s") from None
        except (OSError, ssl.SSLError, ValueError) as exc:
            raise self._failed(type(exc).__name__ + (f": {exc}" if str(exc) else "")) from None
        self._write(self.ws.send(Request(host=up.netloc, target=target,
                                         extra_headers=[(k.encode(), v.encode())
                                                        for k, v in headers])))
        status = 0
        body = b""
        while True:
            ev = await self._next(up.read_timeout)
            if isinstance(ev, AcceptConnection):
                return
            if isinstance(ev, RejectConnection):
                status = ev.status_code
                if not ev.has_body:
                    break
            elif isinstance(ev, RejectData):
                body += ev.data[:4096 - len(body)]
                if ev.body_finished or len(body) >= 4096:
                    break
            elif ev is None:
                break
        detail = body.decode("utf-8", "replace").strip()[:300]
        raise self._failed(f"the WebSocket upgrade was refused with status {status}"
                           + (f": {detail}" if detail else "") if status
                           else "the connection closed during the WebSocket upgrade")

    def _write(self, data: bytes) -> None:
        w = self.writer
        if w is not None and not w.is_closing():
            w.write(data)

    async def _next(self, timeout: float | None = None) -> object:
        """The next wsproto event (None: the connection ended)."""
        while not self._events:
            if self.reader is None:
                return None
            try:
                data = await asyncio.wait_for(self.reader.read(READ_BYTES), timeout)
            except TimeoutError:
                raise E.upstream_timeout.at(base=self.up.base, what="the per-read deadline",
                                            seconds=self.up.read_timeout,
                                            flag="--upstream-read-timeout-s") from None
            except (OSError, ssl.SSLError) as exc:
                raise self._failed(type(exc).__name__) from None
            try:
                self.ws.receive_data(data or None)
                self._events.extend(self.ws.events())
            except (RemoteProtocolError, LocalProtocolError) as exc:
                raise self._failed(f"a WebSocket protocol error ({exc})") from None
            if not data and not self._events:
                return None
        return self._events.pop(0)

    async def recv(self) -> str | None:
        """The next text message; None when the upstream closed (:attr:`close_code`)."""
        while True:
            ev = await self._next()
            if ev is None:
                if self.close_code is None:
                    self.close_code = 1006
                return None
            if isinstance(ev, TextMessage):
                data = ev.data
                self._size += len(data) if data.isascii() else len(data.encode())
                if self._size > self.max_bytes:
                    raise self._failed(f"a message larger than {self.max_bytes} bytes")
                self._parts.append(data)
                if ev.message_finished:
                    text = "".join(self._parts)
                    self._parts = []
                    self._size = 0
                    return text
            elif isinstance(ev, BytesMessage):
                raise self._failed("a binary message (the Realtime API sends text)")
            elif isinstance(ev, Ping):
                self._write(self.ws.send(ev.response()))
            elif isinstance(ev, CloseConnection):
                self.close_code, self.close_reason = ev.code, ev.reason or ""
                try:
                    self._write(self.ws.send(ev.response()))
                except LocalProtocolError:
                    pass
                return None

    def send(self, text: str) -> None:
        try:
            self._write(self.ws.send(TextMessage(data=text)))
        except LocalProtocolError:  # (closed meanwhile: the reader reports it)
            pass

    def buffered(self) -> int:
        """Bytes written and not yet taken by the socket."""
        w = self.writer
        return w.transport.get_write_buffer_size() if w is not None else 0

    async def drain(self) -> None:
        w = self.writer
        if w is not None and not w.is_closing():
            try:
                await w.drain()
            except (OSError, ssl.SSLError):
                pass

    def close(self, code: int = 1000) -> None:
        """Say goodbye (a close frame when the connection is open) and close the socket."""
        w, self.writer, self.reader = self.writer, None, None
        if w is None:
            return
        try:
            if self.ws.state is ConnectionState.OPEN and not w.is_closing():
                w.write(self.ws.send(CloseConnection(code=code)))
        except LocalProtocolError:
            pass
        w.close()
