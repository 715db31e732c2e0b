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
- ``token_type`` and ``token_json``: the one template of the family's token event. A plan
  hands its tokens over as :class:`~llmsim.streaming.stream.TokenRun` items of type
  ``token_type`` (the pieces, their gaps and a ``key``: what varies from run to run, e.g. the
  choice index or the output item); ``token_json(key)`` gives the JSON around one token's
  piece, ``(pre, post)``, rendered once per run (in a numbering dialect ``post`` stops just
  before the ``sequence_number`` value, which the stream's number completes). Families build
  no token bytes: :meth:`Dialect.template` frames this JSON for the encoder in use (SSE or
  WebSocket, the encoder's ``bytes_frame``) and the pump renders each token from it;
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
                 "error_events", "sse_error", "token_type", "token_json",
                 "token_types", "stream_headers")

    def __init__(self, endpoint: str, *, numbered: bool,
                 sse: Callable[[str, Any], bytes],
                 sse_error: Callable[[APIError, int], bytes],
                 error_events: Callable[[APIError], Events],
                 is_token: Callable[[str, Any], bool] = _no_token,
                 terminals: frozenset[str] = frozenset(),
                 ws: Callable[[str, Any], bytes] | None = None,
                 token_type: str | None = None,
                 token_json: Callable[[Any], tuple[bytes, bytes]] | None = None,
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
        if (token_type is None) != (token_json is None):
            raise ValueError("give token_type and token_json together")
        self.token_type = token_type
        self.token_json = token_json
        # the streamed response's content headers (``name: value\r\n`` lines; None: SSE's)
        self.stream_headers = stream_headers

    def template(self, key: Any, frame: tuple[bytes, bytes]) -> tuple[bytes, bytes, bytes]:
        """The token event of a run with ``key`` in an encoder's ``frame`` (its
        ``bytes_frame(token_type)``: the bytes around an event's JSON) as ``(head, post,
        tail)``: a token is ``head + piece JSON + tail`` in a dialect that does not number
        (``post`` empty), ``head + piece JSON + post + number + b"}" + tail`` in one that
        does. Rendered once per run."""
        pre, post = self.token_json(key)  # type: ignore[misc]  # (token_type: set)
        if self.numbered:
            return frame[0] + pre, post, frame[1]
        return frame[0] + pre, b"", post + frame[1]

    def __repr__(self) -> str:
        return f"Dialect({self.endpoint!r})"
