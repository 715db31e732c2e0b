"""Pure encoders: stream events → SSE bytes or WebSocket text. The only place that knows frame
syntax. Prefixes are precomputed; payloads are serialised with orjson once per event. A payload
may also arrive as ``bytes`` that are already JSON (a token event the stream rendered from its
dialect's template), which is written as is."""

from __future__ import annotations

from typing import Any

import orjson

# (the wire's syntax, HTTP chunks and WebSocket text frames: framed there, re-exported)
from .wire import CHUNK, ws_text_frame

__all__ = ["sse_chat", "sse_responses", "sse_error_chat", "sse_error_responses", "ws_text", "ws_text_frame", "DONE_FRAME",
           "KEEPALIVE_FRAME", "chunk"]

_dumps = orjson.dumps
DONE_FRAME = b"data: [DONE]\n\n"

# The JSON of a token's text (a run's piece), rendered afresh for each token: a table of
# renderings, read instead, was dearer live (its entries were cold cache lines by the time a
# stream's next token read one; orjson renders into memory the allocator just freed).
piece_json = _dumps

KEEPALIVE_FRAME = b": keep-alive\n\n"
_EVENT_PREFIX: dict[str, bytes] = {}


def sse_chat(etype: str, data: Any) -> bytes:
    """Chat Completions SSE: ``data: {json}\\n\\n``; the ``done`` event is ``data: [DONE]``."""
    if etype == "done":
        return DONE_FRAME
    return b"data: " + (data if type(data) is bytes else _dumps(data)) + b"\n\n"


def _chat_frame(etype: str | None) -> tuple[bytes, bytes]:
    return b"data: ", b"\n\n"


sse_chat.bytes_frame = _chat_frame  # type: ignore[attr-defined]
# ``bytes_frame(type)`` (an encoder's declaration, flow.Pump's hot path): the frame of an
# event of that type (the dialect's token_type) whose JSON is ``payload`` is
# ``prefix + payload + suffix``; None: no fixed frame, the encoder frames each payload


def sse_responses(etype: str, data: Any) -> bytes:
    """Responses SSE: ``event: <type>\\ndata: {json}\\n\\n`` (the event line equals data.type)."""
    prefix = _EVENT_PREFIX.get(etype)
    if prefix is None:
        prefix = _EVENT_PREFIX[etype] = b"event: " + etype.encode() + b"\ndata: "
    return prefix + (data if type(data) is bytes else _dumps(data)) + b"\n\n"


def _responses_frame(etype: str | None) -> tuple[bytes, bytes] | None:
    # (the event line names the type: a frame only for payloads of one known type)
    return None if etype is None else (b"event: " + etype.encode() + b"\ndata: ", b"\n\n")


sse_responses.bytes_frame = _responses_frame  # type: ignore[attr-defined]


def sse_error_chat(err: dict[str, Any], seq: int) -> bytes:
    """The terminal frames of a chat SSE stream that failed after its first byte, from the
    error envelope's fields ``err``: the error chunk then ``[DONE]`` (as the real API ends a
    failed stream). Chat chunks are not numbered: ``seq`` is ignored."""
    return sse_chat("chunk", {"error": err}) + DONE_FRAME


def sse_error_responses(err: dict[str, Any], seq: int) -> bytes:
    """The terminal frame of a Responses SSE stream that failed after its first byte: the
    ``error`` event (the SDK's ResponseErrorEvent) numbered ``seq``."""
    return sse_responses("error", {"type": "error", "code": err.get("code"),
                                   "message": err.get("message"), "param": err.get("param"),
                                   "sequence_number": seq})


def ws_text(etype: str, data: Any) -> bytes:
    """A WebSocket text frame payload: the event's JSON (UTF-8)."""
    return data if type(data) is bytes else _dumps(data)


def _ws_frame(etype: str | None) -> tuple[bytes, bytes]:
    return b"", b""


ws_text.bytes_frame = _ws_frame  # type: ignore[attr-defined]


def chunk(payload: bytes) -> bytes:
    """One HTTP/1.1 chunked-transfer chunk (written by hand after h11 sent the head)."""
    return CHUNK % (len(payload), payload)
