"""Small frozen values passed between the transport, the router and the API handlers."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import orjson

from .errors import APIError, E

if TYPE_CHECKING:
    from .sim.decide import Usage
    from .sim.faults import Fault
    from .sim.ratelimit import Snapshot
    from .streaming.stream import EventStream

__all__ = ["Key", "Request", "Notes", "JSONResponse", "RawResponse", "StreamResponse", "Result",
           "MAX_JSON_DEPTH", "check_json_depth"]

MAX_JSON_DEPTH = 128
"""Deepest nesting (objects and arrays) accepted in a request body or WebSocket message. The
encoder writes at most 254 levels and responses echo body fields a few levels deeper (a tool's
schema inside ``response.tools``), so an unbounded body could be accepted and then fail to
render. 128 leaves a JSON Schema its own 64 levels (``sim.schema.MAX_SCHEMA_DEPTH``, reached
three or four levels into the body) and keeps every recursive walk far from Python's limit."""

T = TypeVar("T")


class Key(Generic[T]):
    """A typed slot for one feature's state in :attr:`App.features`, defined by the module
    that owns the feature (``FAULTS: Key[Faults] = Key("faults")``): the app names no feature
    and imports none."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Key({self.name!r})"



def check_json_depth(data: Any, raw: bytes | bytearray | str) -> None:
    """400 naming the top-level key (or null) when ``data`` (parsed from ``raw``) nests deeper
    than :data:`MAX_JSON_DEPTH`. Cheap: a body with at most that many brackets (nearly every
    request) is not walked at all."""
    if isinstance(raw, str):
        brackets = raw.count("{") + raw.count("[")
    else:  # bytes, or h11's bytearray
        brackets = raw.count(b"{") + raw.count(b"[")
    if brackets <= MAX_JSON_DEPTH:
        return
    if type(data) is dict:
        for key, value in data.items():
            if _deeper(value, MAX_JSON_DEPTH - 1):
                _too_deep(key)
    elif _deeper(data, MAX_JSON_DEPTH):
        _too_deep(None)


def _deeper(root: Any, limit: int) -> bool:
    """Whether ``root`` nests more than ``limit`` levels of objects/arrays (a scalar: 0)."""
    t = type(root)
    if t is not dict and t is not list:
        return False
    if limit < 1:
        return True
    stack = [(root, 1)]
    while stack:
        node, depth = stack.pop()
        for child in (node.values() if type(node) is dict else node):
            ct = type(child)
            if ct is dict or ct is list:
                if depth >= limit:
                    return True
                if child:
                    stack.append((child, depth + 1))
    return False


def _too_deep(key: str | None) -> None:
    where = f"'{key[:64]}'" if key is not None else "request body"
    raise E.nested_too_deep.at(None if key is None else key[:64], where=where,
                               depth=MAX_JSON_DEPTH)


_UNPARSED: Any = object()


@dataclass(slots=True)
class Notes:
    """What the hooks and the handler learn about one request and pass on (the request is
    frozen, its notes are not; they die with the request, so nothing needs cleaning up)."""

    parsed: Any = _UNPARSED  # the parsed body, or the APIError parsing raised (Request.json)
    fault: Fault | None = None  # a mid-stream fault for the fault stream hook
    ratelimit: Snapshot | None = None  # the buckets as admitted (x-ratelimit-* headers)
    ratelimit_charge: tuple[str, str] | None = None  # (key, model) charged output at the end
    slot: Any = None  # the capacity sequence held (api.faults.Slot; released at the end)


@dataclass(frozen=True, slots=True)
class Request:
    """One parsed HTTP request (or one WebSocket client event turned into a request)."""

    method: str
    path: str  # without the query string
    query: Mapping[str, list[str]]
    headers: Mapping[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes
    request_id: str
    transport: str = "http"  # "http" | "ws"
    client: str = ""
    params: Mapping[str, str] = field(default_factory=dict)  # path parameters
    received_at: float = 0.0  # clock time the request was complete
    context: Any = None  # transport-specific context ("ws": its lane's PreviousResponses cache)
    notes: Notes = field(default_factory=Notes)  # what hooks pass on (typed: see Notes)

    def json(self) -> Any:
        """The body parsed as JSON (once per request: the hooks and the handler share it), or
        a 400 in the real API's wording."""
        notes = self.notes
        hit = notes.parsed
        if hit is not _UNPARSED:
            if type(hit) is APIError:
                raise hit
            return hit
        try:
            data = self._parse()
        except APIError as exc:
            notes.parsed = exc
            raise
        notes.parsed = data
        return data

    @property
    def parsed(self) -> bool:
        """The body was parsed already (:meth:`json` is free now)."""
        return self.notes.parsed is not _UNPARSED

    def _parse(self) -> Any:
        if not self.body:
            raise E.empty_body.at()
        ctype = self.headers.get("content-type", "")
        if ctype[:19].lower() == "multipart/form-data":  # the upload endpoints' forms
            from .multipart import parse_form
            form = parse_form(self.body, ctype)
            if form.get("stream") in ("true", "false"):  # the generic hooks read a boolean
                form["stream"] = form["stream"] == "true"
            return form
        try:
            data = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            raise E.invalid_json.at() from None
        check_json_depth(data, self.body)
        return data

    @classmethod
    def http(cls, method: str, path: str, query: Mapping[str, list[str]],
             headers: Mapping[str, str], body: bytes, request_id: str, client: str,
             received_at: float) -> Request:
        """A request of the HTTP transport, every other field at its default: the same value
        the constructor builds, in half its time (the slots are filled directly rather than
        through the frozen class's ``object.__setattr__``, ~0.8 µs a request)."""
        r = _new_request(cls)
        (s_method, s_path, s_query, s_headers, s_body, s_id, s_transport, s_client, s_params,
         s_received, s_context, s_notes) = _REQUEST_SLOTS
        s_method(r, method)
        s_path(r, path)
        s_query(r, query)
        s_headers(r, headers)
        s_body(r, body)
        s_id(r, request_id)
        s_transport(r, "http")
        s_client(r, client)
        s_params(r, {})
        s_received(r, received_at)
        s_context(r, None)
        s_notes(r, Notes())
        return r

    def json_object(self) -> dict[str, Any]:
        data = self.json()
        if not isinstance(data, dict):
            raise E.body_not_object.at()
        return data

    def query_one(self, name: str, default: str | None = None) -> str | None:
        v = self.query.get(name)
        return v[-1] if v else default

    @property
    def api_key(self) -> str | None:
        auth = self.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            return auth[7:].strip() or None
        if auth.startswith("AWS4-HMAC-SHA256 "):  # SigV4 (Bedrock): its access key id
            cred = auth.partition("Credential=")[2]
            return cred.partition("/")[0] or None
        # Azure's api-key, Anthropic's x-api-key, Google's x-goog-api-key or ?key=
        return (self.headers.get("api-key") or self.headers.get("x-api-key")
                or self.headers.get("x-goog-api-key") or self.query_one("key") or None)


_new_request = object.__new__
# each field's slot setter, in field order (Request.http)
_REQUEST_SLOTS = tuple(getattr(Request, f.name).__set__ for f in fields(Request))
assert tuple(f.name for f in fields(Request)) == (
    "method", "path", "query", "headers", "body", "request_id", "transport", "client", "params",
    "received_at", "context", "notes")  # (Request.http fills them in this order)


@dataclass(slots=True)
class JSONResponse:
    """A complete response whose body is ``orjson.dumps(data)``."""

    data: Any
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    # the model this response is for (stats labels, access log); None: taken from
    # ``data["model"]`` when that is a string
    model: str | None = None
    # the tokens this answer bills once it is sent whole (None: it generated nothing)
    usage: Usage | None = None


@dataclass(slots=True)
class RawResponse:
    """A complete response with a ready body."""

    body: bytes
    status: int = 200
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)
    # fault injection: drop the connection (TCP reset) instead of sending this response; a
    # transport that cannot abort sends it as an ordinary error
    abort: bool = False
    # the error this body renders, carried to the edge as an object (stats and the WebSocket
    # read it instead of parsing the bytes back)
    error: APIError | None = None


def error_result(exc: APIError) -> RawResponse:
    """The complete answer for ``exc``: its status, headers and envelope, with the error
    object attached (stats and the WebSocket read it, never the bytes)."""
    return RawResponse(exc.body(), status=exc.status, content_type="application/json",
                       headers=list(exc.headers), error=exc)


@dataclass(slots=True)
class StreamResponse:
    """A streamed response: the transport renders ``stream`` as SSE (or WS frames).

    ``on_close`` runs exactly once when the stream ends for any reason (finished, failed,
    client gone), so handlers can release capacity slots and counters. ``usage`` is what the
    answer bills when the stream is delivered to its end (None: a replay, or nothing billed).
    """

    stream: EventStream
    status: int = 200
    headers: list[tuple[str, str]] = field(default_factory=list)
    on_close: Callable[[str], None] | None = None
    usage: Usage | None = None


Result = JSONResponse | RawResponse | StreamResponse
