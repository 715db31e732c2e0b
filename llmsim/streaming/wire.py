"""The writing end of a connection that streams: HTTP chunks and WebSocket text frames.

Theory of operation. A streamed response's events reach the client through a :class:`Wire`,
the :class:`~llmsim.streaming.flow.Sink` its pump writes to: one object per connection that knows the
bytes around each event and writes them in one ``transport.write``. This module is the one
place that knows that syntax:

- **HTTP/1.1 chunked bodies** (:data:`CHUNK`, re-exported by :mod:`llmsim.streaming.encode`):
  :class:`HTTPWire` renders a whole chunk with one bytes format (:meth:`HTTPWire.wire_format`)
  and writes chunks so rendered as they are. The HTTP protocol owns it (one per connection)
  and decides, with the response head, whether the body is chunked and a stream is on the
  wire (:attr:`Wire.open`).
- **WebSocket text frames** (:func:`ws_text_frame`, re-exported by :mod:`llmsim.streaming.encode`):
  every event the server sends on a WebSocket (a streamed response's events, errors) is one
  unfragmented, unmasked text frame (RFC 6455 §5.2). :class:`WSWire` is what a session's
  pumps write through. wsproto still parses every client frame and writes every control
  frame (ping answers, the close handshake); its state is unaffected, because a complete
  message never leaves an open fragment behind. Whether text may still be written is the
  session's to decide (it owns the wsproto connection): it sets :attr:`Wire.open` whenever
  the connection's state may have changed.

The per-event path reads two plain flags of one object (``paused``, ``open``) and makes one
call, instead of reading the protocol object's attributes and method generically (issue 15).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

__all__ = ["CHUNK", "HTTPWire", "WSWire", "Wire", "ws_text_frame"]

CHUNK = b"%x\r\n%b\r\n"  # one chunk of a chunked body: CHUNK % (len(payload), payload)

_LEN7 = [bytes((i,)) for i in range(126)]  # the one-byte lengths, rendered once


def ws_text_frame(payload: bytes) -> bytes:
    """One unfragmented, unmasked WebSocket text frame (server → client, no extensions), RFC
    6455 §5.2, with the minimal length encoding the RFC requires. ``payload`` must be UTF-8
    (orjson output is). ~0.7 µs a frame against ~15 µs through ``wsproto``'s ``send``."""
    n = len(payload)
    if n < 126:
        return b"\x81" + _LEN7[n] + payload
    if n < 65536:
        return b"\x81\x7e" + n.to_bytes(2, "big") + payload
    return b"\x81\x7f" + n.to_bytes(8, "big") + payload


class Wire:
    """Where a connection's pumps write (a :class:`~llmsim.streaming.flow.Sink`): its transport, and
    two flags its owner keeps current. ``paused``: the transport's write buffer is above its
    high-water mark (the connection's backpressure; set by the protocol's
    ``pause_writing`` / ``resume_writing``). ``open``: a stream may write now (the owner's
    word: see the subclasses); nothing is written while it is False."""

    __slots__ = ("paused", "open", "transport")

    def __init__(self, transport: asyncio.Transport | None, paused: bool = False) -> None:
        self.paused = paused
        self.open = False
        self.transport = transport

    def write_events(self, frames: list[bytes]) -> None:
        """Frame each event payload and write them in one write (flow.Sink)."""
        raise NotImplementedError

    def write_wire(self, frames: list[bytes]) -> None:
        """Write frames already rendered to wire bytes (flow.Sink's ``wire_format``)."""
        raise NotImplementedError

    def abort(self) -> None:
        """Drop the connection now (a DISCONNECT fault, a broken stream)."""
        if self.transport is not None:
            self.transport.abort()


class HTTPWire(Wire):
    """The chunks of a streamed HTTP/1.1 response body. The protocol sets :attr:`open`
    when a stream's chunked head is out and clears it when the stream ends, whatever ended
    it (a lost connection too), before the terminating chunk: nothing is written outside
    the body."""

    __slots__ = ()

    def wire_format(self, prefix: bytes, suffix: bytes) -> tuple[bytes, int]:
        """The chunk of a streamed event ``prefix + payload + suffix`` as one bytes format
        (flow.Sink): ``fmt % (len(payload) + extra, payload)``."""
        return (b"%x\r\n" + prefix.replace(b"%", b"%%") + b"%b" + suffix.replace(b"%", b"%%")
                + b"\r\n", len(prefix) + len(suffix))

    def write_wire(self, frames: list[bytes]) -> None:
        """Chunks rendered with :meth:`wire_format`, written as they are."""
        if self.open and self.transport is not None:
            self.transport.write(frames[0] if len(frames) == 1 else b"".join(frames))

    def write_events(self, frames: list[bytes]) -> None:
        """Each payload as one chunk, in one write."""
        if not self.open or self.transport is None:
            return
        if len(frames) == 1:
            data = frames[0]
            self.transport.write(CHUNK % (len(data), data))
        else:
            self.transport.write(b"".join([CHUNK % (len(f), f) for f in frames]))


class WSWire(Wire):
    """Text frames onto one connection's transport (a :class:`~llmsim.streaming.flow.Sink`); writes
    nothing once :attr:`open` is False (the session's word: a close frame was sent or
    received, or the connection is gone) or the transport is closing."""

    __slots__ = ()

    def __init__(self, transport: asyncio.Transport | None, paused: bool = False) -> None:
        super().__init__(transport, paused)
        self.open = transport is not None

    def write_events(self, frames: list[bytes]) -> None:
        """One text frame per event payload, in one write (flow.Sink)."""
        tr = self.transport
        if not self.open or tr is None or tr.is_closing():
            return
        if len(frames) == 1:
            tr.write(ws_text_frame(frames[0]))
        else:
            tr.write(b"".join([ws_text_frame(f) for f in frames]))
