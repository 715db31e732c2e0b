"""The writing end of a connection that streams: HTTP chunks and WebSocket text frames.

Theory of operation. A streamed response's events reach the client through a :class:`Wire`,
the :class:`~llmsim.streaming.flow.Sink` its pump writes to: one object per connection that knows the
bytes around each event and writes them in one ``transport.write``. This module is the one
place that knows that syntax:

- **HTTP/1.1 chunked bodies** (:data:`CHUNK`, re-exported by :mod:`llmsim.streaming.encode`):
  :class:`HTTPWire` gives a pump the parts of a chunk around an event
  (:meth:`Wire.wire_frame`) and writes the parts of a write with one join. The HTTP protocol owns it (one per connection)
  and decides, with the response head, whether the body is chunked and a stream is on the
  wire (:attr:`Wire.open`).
- **WebSocket text frames** (:func:`ws_text_frame`, re-exported by :mod:`llmsim.streaming.encode`):
  every event the server sends on a WebSocket (a streamed response's events, errors) is one
  unfragmented, unmasked text frame (RFC 6455 §5.2). :class:`WSWire` is what a session's
  pumps write through, with the same parts (the frame header for the payload's length)
  as an HTTP chunk's. wsproto still parses every client frame and writes every control
  frame (ping answers, the close handshake); its state is unaffected, because a complete
  message never leaves an open fragment behind. Whether text may still be written is the
  session's to decide (it owns the wsproto connection): it sets :attr:`Wire.open` whenever
  the connection's state may have changed.

The per-event path reads two plain flags of one object (``paused``, ``open``) and makes one
call, instead of reading the protocol object's attributes and method generically (issue 15).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

__all__ = ["CHUNK", "Framing", "HTTPWire", "WSWire", "Wire", "chunk_lead", "ws_lead",
           "ws_text_frame"]

CHUNK = b"%x\r\n%b\r\n"  # one chunk of a chunked body: CHUNK % (len(payload), payload)

_LEN7 = [bytes((i,)) for i in range(126)]  # the one-byte lengths, rendered once


def chunk_lead(n: int) -> bytes:
    """What starts an HTTP chunk of ``n`` bytes (its size line)."""
    return b"%x\r\n" % n


def ws_lead(n: int) -> bytes:
    """What starts a WebSocket text frame of ``n`` payload bytes: FIN + text opcode, then the
    minimal length encoding RFC 6455 §5.2 requires (server → client: unmasked)."""
    if n < 126:
        return b"\x81" + _LEN7[n]
    if n < 65536:
        return b"\x81\x7e" + n.to_bytes(2, "big")
    return b"\x81\x7f" + n.to_bytes(8, "big")


# the leads of the lengths most events have, rendered once (a list read per event, not a
# format or a call; ~2 x 180 KB)
LEADS = 4096
_CHUNK_LEADS = [chunk_lead(n) for n in range(LEADS)]
_WS_LEADS = [ws_lead(n) for n in range(LEADS)]


def ws_text_frame(payload: bytes) -> bytes:
    """One unfragmented, unmasked WebSocket text frame (server → client, no extensions), RFC
    6455 §5.2, with the minimal length encoding the RFC requires. ``payload`` must be UTF-8
    (orjson output is). ~0.7 µs a frame against ~15 µs through ``wsproto``'s ``send``."""
    n = len(payload)
    return (_WS_LEADS[n] if n < LEADS else ws_lead(n)) + payload


Framing = tuple[list[bytes], Callable[[int], bytes], int, bytes, bytes]
"""How a wire frames the events ``prefix + payload + suffix`` (:meth:`Wire.wire_frame`):
``(leads, lead, extra, head, tail)``, the event's wire bytes being ``lead(n) + head + payload +
tail`` with ``n = len(payload) + extra`` and ``lead(n)`` read as ``leads[n]`` for ``n <
len(leads)``."""


class Wire:
    """Where a connection's pumps write (a :class:`~llmsim.streaming.flow.Sink`): its transport, and
    two flags its owner keeps current. ``paused``: the transport's write buffer is above its
    high-water mark (the connection's backpressure; set by the protocol's
    ``pause_writing`` / ``resume_writing``). ``open``: a stream may write now (the owner's
    word: see the subclasses); nothing is written while it is False.

    ``ends``: the owner ends each stream's body itself and makes the stream's last write
    with that end (an HTTP body's terminating chunk: one write, not two). A pump that writes
    a stream's last events (the plan is exhausted or stopped) then leaves their parts in
    ``last`` instead of writing them, and ends the stream: the owner's ``on_done`` writes
    them, joined, with the body's end."""

    __slots__ = ("paused", "open", "transport", "ends", "last")

    def __init__(self, transport: asyncio.Transport | None, paused: bool = False) -> None:
        self.paused = paused
        self.open = False
        self.transport = transport
        self.ends = False
        self.last: list[bytes] | None = None

    def write_events(self, frames: list[bytes]) -> None:
        """Frame each event payload and write them in one write (flow.Sink)."""
        raise NotImplementedError

    def wire_frame(self, prefix: bytes, suffix: bytes) -> Framing:
        """The parts of the wire bytes of an event ``prefix + payload + suffix`` around the
        payload (:data:`Framing`; flow.Sink): a pump appends them to what it writes, one
        join per write renders them."""
        raise NotImplementedError

    def write_wire(self, frames: list[bytes]) -> None:
        """Write the parts of events framed with :meth:`wire_frame`, joined (flow.Sink)."""
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

    __slots__ = ("head",)

    def __init__(self, transport: asyncio.Transport | None, paused: bool = False) -> None:
        super().__init__(transport, paused)
        # the response head, while the protocol holds it for the stream's first write (the
        # events due at once, e.g. response.created, go out with it: one write, not two)
        self.head: bytes | None = None

    def take_head(self) -> bytes | None:
        """The held head, if any, no longer held (whoever takes it writes it first)."""
        head, self.head = self.head, None
        return head

    def wire_frame(self, prefix: bytes, suffix: bytes) -> Framing:
        """The chunk of a streamed event ``prefix + payload + suffix``: its size line, the
        event, the chunk's CRLF."""
        return _CHUNK_LEADS, chunk_lead, len(prefix) + len(suffix), prefix, suffix + b"\r\n"

    def write_wire(self, frames: list[bytes]) -> None:
        """Chunks framed with :meth:`wire_frame`, in one write."""
        if self.open and self.transport is not None:
            if self.head is not None:  # (take_head: only a stream's first write)
                frames = [self.take_head(), *frames]  # type: ignore[list-item]
            self.transport.write(b"".join(frames))

    def write_events(self, frames: list[bytes]) -> None:
        """Each payload as one chunk, in one write."""
        if not self.open or self.transport is None:
            return
        self.write_wire([CHUNK % (len(f), f) for f in frames])


class WSWire(Wire):
    """Text frames onto one connection's transport (a :class:`~llmsim.streaming.flow.Sink`); writes
    nothing once :attr:`open` is False (the session's word: a close frame was sent or
    received, or the connection is gone) or the transport is closing."""

    __slots__ = ()

    def __init__(self, transport: asyncio.Transport | None, paused: bool = False) -> None:
        super().__init__(transport, paused)
        self.open = transport is not None

    def wire_frame(self, prefix: bytes, suffix: bytes) -> Framing:
        """The text frame of an event ``prefix + payload + suffix``: its header, the event."""
        return _WS_LEADS, ws_lead, len(prefix) + len(suffix), prefix, suffix

    def write_wire(self, frames: list[bytes]) -> None:
        """Text frames framed with :meth:`wire_frame`, in one write."""
        tr = self.transport
        if not self.open or tr is None or tr.is_closing():
            return
        tr.write(b"".join(frames))

    def write_events(self, frames: list[bytes]) -> None:
        """One text frame per event payload, in one write (flow.Sink)."""
        tr = self.transport
        if not self.open or tr is None or tr.is_closing():
            return
        if len(frames) == 1:
            tr.write(ws_text_frame(frames[0]))
        else:
            tr.write(b"".join([ws_text_frame(f) for f in frames]))
