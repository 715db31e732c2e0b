"""Dialect: what is specific to one API family's wire format, in one small object.

The streaming core (:class:`~llmsim.streaming.stream.EventStream` → :class:`~llmsim.streaming.flow.Pump` →
encoder → transport) and the generic layers around it (faults, capacity, rate limits, stats,
the access log) never name an API family. Each stream carries its :class:`Dialect`, and those
layers ask it:

- ``endpoint``: the stats/route label (``"chat.completions"``, ``"responses"``);
- ``numbered``: whether events carry ``sequence_number`` (stamped by the EventStream alone);
- ``sse(type, data)``: the SSE frame of one event; ``ws(type, data)``: its WebSocket text
  payload (None: the family has no WebSocket mode);
- ``is_token(type, data)``: does this event carry one generated token (pacing, TTFT/ITL,
  "fail after N tokens");
- ``token_types``: when given, exactly the events of these types are token events (then
  ``is_token`` is derived from it, and the pump checks the type without a call);
- ``bytes_tokens``: a ``bytes`` payload in this family's plans is always one token's event,
  already rendered as JSON by the plan (the hot path: the pump frames it with the encoder's
  ``bytes_frame`` without calling the encoder or ``is_token``, see :class:`~llmsim.streaming.flow.Pump`);
  ``bytes_type``: the event type of every such payload (None: any), for an encoder whose
  frame names the type (Responses SSE: ``event: <type>``; the encoder's ``bytes_frame``);
- ``terminals``: the event types that end a stream (a fault due after the last token fires
  before these);
- ``error_events(err)``: a mid-stream failure as events of the family (chat: the error chunk
  then ``[DONE]``; Responses: ``response.failed`` — a stream may override it with its own, see
  ``EventStream.fail``);
- ``sse_error(err, seq)``: the terminal frame written when the server itself fails after the
  head is out (chat: error chunk + ``[DONE]``; Responses: the ``error`` event numbered ``seq``);
- ``stream_headers``: the streamed body's content headers when it is not SSE (Ollama's NDJSON,
  Gemini's JSON array); ``sse`` then renders that format's frames.

Adding an API family: its module (a :class:`~llmsim.api.pipeline.Family` with its parse,
renderers and one ``Dialect(...)`` value), and one line in :data:`llmsim.api.MODULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..errors import APIError

__all__ = ["Dialect", "Events"]

Events = list[tuple[str, Any]]


def _no_token(etype: str, data: Any) -> bool:
    return False


class Dialect:
    """One API family's wire format (see the module doc). Plain ``__slots__`` attributes, set
    once at import; tests may monkeypatch one (e.g. an encoder that fails)."""

    __slots__ = ("endpoint", "numbered", "sse", "ws", "is_token", "terminals",
                 "error_events", "sse_error", "bytes_tokens", "bytes_type",
                 "token_types", "stream_headers")

    def __init__(self, endpoint: str, *, numbered: bool,
                 sse: Callable[[str, Any], bytes],
                 sse_error: Callable[[APIError, int], bytes],
                 error_events: Callable[[APIError], Events],
                 is_token: Callable[[str, Any], bool] = _no_token,
                 terminals: frozenset[str] = frozenset(),
                 ws: Callable[[str, Any], bytes] | None = None,
                 bytes_tokens: bool = False, bytes_type: str | None = None,
                 token_types: frozenset[str] | None = None,
                 stream_headers: bytes | None = None) -> None:
        self.endpoint = endpoint
        self.numbered = numbered
        self.sse = sse
        self.ws = ws
        if token_types is not None:
            if is_token is not _no_token:
                raise ValueError("give token_types or is_token, not both")
            types = token_types

            def is_token(etype: str, data: Any) -> bool:
                return etype in types
        self.token_types = token_types
        self.is_token = is_token
        self.terminals = terminals
        self.error_events = error_events
        self.sse_error = sse_error
        self.bytes_tokens = bytes_tokens
        self.bytes_type = bytes_type
        # the streamed response's content headers (``name: value\r\n`` lines; None: SSE's)
        self.stream_headers = stream_headers

    def __repr__(self) -> str:
        return f"Dialect({self.endpoint!r})"
