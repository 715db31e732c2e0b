"""The writing end of an upgraded WebSocket connection: text frames, framed by hand.

Theory of operation. Every event the server sends on a WebSocket (a streamed response's
events, errors) is one unfragmented, unmasked text frame (RFC 6455 §5.2). This module is the
one place that knows that frame's syntax (:func:`ws_text_frame`, re-exported by
:mod:`llmsim.encode`), and :class:`WSWire` is what a session's pumps write through (the
:class:`~llmsim.flow.Sink` of every response on the connection): it frames each event and
writes them in one ``transport.write``. wsproto still parses every client frame and writes
every control frame (ping answers, the close handshake); its state is unaffected, because a
complete message never leaves an open fragment behind.

Whether text may still be written is the session's to decide (it owns the wsproto
connection): it sets :attr:`WSWire.open` whenever the connection's state may have changed, so
the per-event path reads one flag instead of wsproto's ``state`` property. One of the modules
of the optional compiled build (:data:`llmsim.native.MODULES`): it runs once per streamed
WebSocket event.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio

    from .protocol import HTTPProtocol

__all__ = ["WSWire", "ws_text_frame"]

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


class WSWire:
    """Text frames onto one connection's transport (a :class:`~llmsim.flow.Sink`); writes
    nothing once :attr:`open` is False (the session's word: a close frame was sent or
    received, or the connection is gone) or the transport is closing."""

    __slots__ = ("paused", "open", "transport")

    def __init__(self, protocol: HTTPProtocol, transport: asyncio.Transport | None) -> None:
        # the transport's write buffer is above its high-water mark (the connection's
        # backpressure, shared by every response on it): the protocol's flag, copied here
        # by the protocol's pause_writing / resume_writing (a pump reads it per tick: one
        # object, not two)
        self.paused = protocol.paused
        self.open = transport is not None
        self.transport = transport

    def write_events(self, frames: list[bytes]) -> None:
        """One text frame per event payload, in one write (flow.Sink)."""
        tr = self.transport
        if not self.open or tr is None or tr.is_closing():
            return
        if len(frames) == 1:
            tr.write(ws_text_frame(frames[0]))
        else:
            tr.write(b"".join([ws_text_frame(f) for f in frames]))

    def abort(self) -> None:
        """Drop the connection now (a DISCONNECT fault, a broken stream)."""
        if self.transport is not None:
            self.transport.abort()
