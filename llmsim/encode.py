"""Pure encoders: stream events → SSE bytes or WebSocket text. The only place that knows frame
syntax. Prefixes are precomputed; payloads are serialised with orjson once per event. A payload
may also arrive as ``bytes`` that are already JSON (hot per-token chunks rendered from a
precomputed prefix/suffix), which is written as is."""

from __future__ import annotations

from typing import Any

import orjson

__all__ = ["sse_chat", "sse_responses", "ws_text", "DONE_FRAME", "KEEPALIVE_FRAME", "chunk"]

_dumps = orjson.dumps
DONE_FRAME = b"data: [DONE]\n\n"
KEEPALIVE_FRAME = b": keep-alive\n\n"
_EVENT_PREFIX: dict[str, bytes] = {}


def sse_chat(etype: str, data: Any) -> bytes:
    """Chat Completions SSE: ``data: {json}\\n\\n``; the ``done`` event is ``data: [DONE]``."""
    if etype == "done":
        return DONE_FRAME
    return b"data: " + (data if type(data) is bytes else _dumps(data)) + b"\n\n"


def sse_responses(etype: str, data: Any) -> bytes:
    """Responses SSE: ``event: <type>\\ndata: {json}\\n\\n`` (the event line equals data.type)."""
    prefix = _EVENT_PREFIX.get(etype)
    if prefix is None:
        prefix = _EVENT_PREFIX[etype] = b"event: " + etype.encode() + b"\ndata: "
    return prefix + _dumps(data) + b"\n\n"


def ws_text(etype: str, data: Any) -> bytes:
    """A WebSocket text frame payload: the event's JSON (UTF-8)."""
    return data if type(data) is bytes else _dumps(data)


def chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunked-transfer chunk (written by hand after h11 sent the head)."""
    return b"%x\r\n%b\r\n" % (len(payload), payload)
