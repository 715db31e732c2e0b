"""Record/replay: proxy a real provider once, serve the exchanges offline (docs/record-replay.md).

**Record** (``llmsim record --upstream URL --cassettes DIR``): the generation endpoints
(:data:`PATHS`) forward each request to its upstream (:class:`~.upstream.Upstream`: http or
https, kept-alive, deadlines on every read; ``--record-route NAME=URL`` gives a family or a
path prefix its own) with the client's headers, credentials included, and stream the answer
through as it arrives: the client sees the upstream's pacing live while each frame is stored
with its offset from the request (:data:`FRAMINGS`: SSE frames, Ollama's NDJSON lines,
Gemini's JSON array elements, and the AWS event stream's messages, kept decoded as their
headers and JSON payload; each checked before it is passed on, see :mod:`.framing`). Bedrock
requests signed with SigV4 are signed again for the upstream's host when ``--aws-keys`` holds
their key's secret. An exchange read to its end becomes one file,
``DIR/<endpoint>-<model>-<stream|json>-<key>.json``, holding only the headers of
:data:`KEEP_REQUEST` and :data:`KEEP_RESPONSE` (an allow-list: no credential reaches a
cassette). An upstream error status (>= 400) is passed to the client and saved only with
``--record-errors``. Failures are 502/504 in the family's envelope; a client that leaves
cancels the upstream request.

**Replay** (``--replay DIR``, or ``--record-mode``): a request matches the cassette with the
same *key*: the method, the path as sent, and the body as canonical JSON without the fields
that do not select an answer (:data:`VOLATILE` plus ``--match-ignore``); ``stream`` is part
of the body, so a stream never gets a JSON answer or the reverse. Mode ``none`` falls back to
the first cassette of the same path, model and ``stream``; else a 404
``cassette_not_found`` in the family's error shape names the nearest cassette and how it
differs. Streams are replayed frame by frame (an event-stream message framed again with its
CRCs) at the recorded offsets divided by ``--replay-speed`` (0: at once),
JSON answers wait their recorded duration likewise.

Uploads and binary answers (the media routes): a ``multipart/form-data`` body is keyed and
kept as its parts (:func:`describe_form`: text values, each file by name, content type, size
and SHA-256 — never its bytes, never the random boundary), a non-UTF-8 body by its digest
(``raw``); an answer that is not UTF-8 text is kept in base64 (``body_b64``), a binary one
sent without a length (chunked audio) streamed through live and kept as timed ``chunks``; an
images ``url`` answer's files are fetched while recording (``files``) and served from the
replaying server's file store under a local URL. Modes (VCR's): ``none`` replays only;
``once`` replays when the directory held cassettes at start-up, else records everything;
``new_episodes`` replays what matches and records the rest; ``all`` always records.

Bounds: every cassette is validated at load (file and field named in the error) with its
status, headers, offsets and sizes bounded; :data:`MAX_CASSETTES` files of at most
:data:`MAX_CASSETTE_BYTES`, :data:`MAX_REPLAY_BYTES` in all; a recording reads at most
``--record-max-bytes`` per answer (an event-stream message announcing more is refused from
its prelude) and writes ``--record-budget-bytes`` per session; framing is incremental
(each byte scanned once, :class:`SSEFramer` and :mod:`.framing`).

A Realtime session (``/v1/realtime``) is one cassette of ``"kind": "realtime"``, validated and
indexed here (:meth:`Cassettes.add_realtime`, keys by :class:`~.realtime.tape.Tape`); the
proxy that records it and the session that replays it are :mod:`.realtime.record`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import logging
import math
import os
import re
import ssl
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol
from urllib.parse import unquote, urlsplit

import orjson

from ..config import ConfigError
from ..errors import APIError, E, bounded
from ..messages import Key, RawResponse, Request, StreamResponse
from ..multipart import MAX_PARTS, MAX_TEXT_FIELD, Upload, is_multipart
from ..streaming.dialect import Dialect
from ..streaming.stream import DISCONNECT, EventStream
from . import bedrock, gemini, ollama
from .framing import (
    MAX_EVENT_HEADERS,
    ArrayFramer,
    EventStreamFramer,
    FrameError,
    NDJSONFramer,
    array_piece,
    decode_message,
    ndjson_line,
)
from .media import file_url, files_of
from .realtime import tape as rt_tape
from .upstream import HOP_HEADERS, Exchange, Upstream

if TYPE_CHECKING:
    from ..streaming.clock import Timer
    from .services import Host, Services

__all__ = ["register", "preflight", "RECORDER", "Recorder", "cassette_key", "load_cassettes",
           "Cassettes", "CassetteError", "SSEFramer", "PATHS", "REPLAY", "VOLATILE",
           "KEEP_REQUEST", "KEEP_RESPONSE"]

log = logging.getLogger("llmsim.cassette")
RECORDER: Key[Recorder] = Key("cassette.recorder")  # in App.features when configured

PATHS = ("/v1/chat/completions", "/v1/responses", "/v1/completions", "/v1/embeddings",
         "/v1/messages", "/anthropic/v1/messages", "/v1/images/generations", "/v1/moderations",
         "/v1/images/edits", "/v1/images/variations", "/v1/audio/speech",
         "/v1/audio/transcriptions", "/v1/audio/translations")
IMAGE_PATHS = ("/v1/images/generations", "/v1/images/edits", "/v1/images/variations")
STREAMING_PATHS = ("/v1/audio/speech",)  # always streamed (chunked audio or SSE)
ANTHROPIC_PATHS = ("/v1/messages", "/anthropic/v1/messages")
# the other families' generation paths (their streams framed by FRAMINGS)
GEMINI_PATHS = tuple(f"{v}/models/{{model}}:{m}" for v in ("/v1beta", "/v1") for m in (
    "generateContent", "streamGenerateContent", "embedContent"))
OLLAMA_PATHS = ("/api/chat", "/api/generate", "/api/embed")
BEDROCK_PATHS = tuple(f"/model/{{model}}/{m}" for m in (
    "converse", "converse-stream", "invoke", "invoke-with-response-stream"))
BEDROCK_STREAMS = ("/converse-stream", "/invoke-with-response-stream")
VOLATILE = frozenset(("user", "metadata", "safety_identifier", "prompt_cache_key",
                      "stream_options"))
# the headers a cassette keeps (an allow-list: anything else, credentials included, is dropped)
KEEP_REQUEST = frozenset(("content-type", "accept", "anthropic-version", "anthropic-beta",
                          "openai-beta"))
KEEP_RESPONSE = frozenset(("openai-model", "openai-version", "openai-processing-ms",
                           "x-request-id", "request-id", "retry-after", "retry-after-ms",
                           "x-amzn-requestid", "x-amzn-errortype"))
KEEP_RESPONSE_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-", "x-amzn-bedrock-")
# kept in the cassette but not sent again: the transport sets its own
SERVER_SET = frozenset(("x-request-id", "openai-version", "openai-processing-ms"))
MAX_CASSETTE_BYTES = 64 * 1024 * 1024
MAX_CASSETTES = 100_000
MAX_REPLAY_BYTES = 2 * 1024 * 1024 * 1024
MAX_DURATION_S = 3600.0
MAX_EVENTS = 1 << 20
MAX_HEADERS = 64
MAX_HEADER_VALUE = 8192
MAX_PATH = 2048
HASH_INLINE = 1 << 20  # a form larger than this is hashed off the event loop
MAX_FILES = 16  # image URLs fetched and kept a cassette (the API's n is at most 10)
CHUNK_MERGE_S = 0.001  # binary pieces that arrive this close are one recorded chunk
# answers kept as text in a cassette (when they are UTF-8); anything else is base64
TEXT_TYPES = ("text/", "application/json", "application/x-ndjson", "application/xml")
NEAREST_SCAN = 1000  # cassettes of the same path compared for the not-found diff
# how often a stream being recorded looks for the upstream's next frame: every POLL_S for
# POLL_EVEN looks after a frame (a token's gap: the client sees it within POLL_S), then
# doubling while none comes, up to POLL_MAX_S
POLL_S = 0.002
POLL_EVEN = 25
POLL_MAX_S = 0.02
WATCH_S = 0.05  # how often a recording looks for a client that left (EOF)
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}$")
_METHOD = re.compile(r"^[A-Z]{1,16}$")


# ------------------------------------------------------------------------------------------
# Keys and the cassettes' shape
# ------------------------------------------------------------------------------------------

def _normalised(body: bytes | str, ignore: frozenset[str]) -> Any:
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in ignore}
    return data


def _canon(data: Any) -> str:
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def cassette_key(method: str, path: str, body: bytes | str,
                 ignore: frozenset[str] = VOLATILE) -> str:
    """The match key of a request (see the module doc)."""
    return fields_key(method, path, {"body": body}, ignore)


def fields_key(method: str, path: str, fields: dict[str, Any],
               ignore: frozenset[str] = VOLATILE) -> str:
    """The match key of a request given as its cassette fields (:func:`request_fields`): a
    body's canonical JSON (or text), a form's parts, a binary body's digest."""
    form = fields.get("form")
    if form is not None:
        canon = "multipart/form-data\n" + _canon({k: v for k, v in form.items()
                                                  if k not in ignore})
    elif "raw" in fields:
        canon = "raw\n" + _canon(fields["raw"])
    else:
        canon = _canon(_normalised(fields.get("body", ""), ignore))
    return hashlib.sha256(f"{method} {path}\n{canon}".encode()).hexdigest()[:32]


def _file(f: Upload) -> dict[str, Any]:
    return {"filename": f.filename, "content_type": f.content_type, "size": len(f.data),
            "sha256": hashlib.sha256(f.data).hexdigest()}


def describe_form(form: dict[str, Any]) -> dict[str, Any]:
    """A parsed form as a cassette keeps it: text fields as their values, each file as its
    filename, content type, size and SHA-256 (never its bytes)."""
    def one(v: Any) -> Any:
        return _file(v) if isinstance(v, Upload) else v

    return {k: [one(x) for x in v] if isinstance(v, list) else one(v) for k, v in form.items()}


def request_fields(req: Request) -> dict[str, Any]:
    """What a cassette keeps of ``req``'s body, and its key is made from: ``form`` for a
    multipart body (the boundary, random per client, is no part of it), ``body`` for UTF-8
    text (JSON), else ``raw``: the size and digest of the bytes. A malformed form is its
    400 (``Request.json``: the form is parsed once for the hooks and this)."""
    if is_multipart(req.headers.get("content-type", "")):
        return {"form": describe_form(req.json_object())}
    return _body_fields(req.body)


async def _request_fields(req: Request) -> dict[str, Any]:
    """:func:`request_fields`, a large upload's digest taken in a worker thread (hashlib
    releases the GIL): the loop is not held while megabytes are hashed."""
    if is_multipart(req.headers.get("content-type", "")) and len(req.body) > HASH_INLINE:
        form = req.json_object()
        got = await asyncio.get_running_loop().run_in_executor(None, describe_form, form)
        return {"form": got}
    return request_fields(req)


def _body_fields(body: bytes) -> dict[str, Any]:
    try:
        return {"body": body.decode("utf-8")}
    except UnicodeDecodeError:
        return {"raw": {"size": len(body), "sha256": hashlib.sha256(body).hexdigest()}}


def _fields(rq: dict[str, Any]) -> dict[str, Any]:
    """The body fields of a cassette's (validated) request."""
    for k in ("form", "raw"):
        if k in rq:
            return {k: rq[k]}
    return {"body": rq.get("body", "")}


def _endpoint(path: str) -> str:
    last = path.rpartition("/")[2]
    if path.startswith("/model/"):  # Bedrock and Gemini: the model is the name's next part
        return "bedrock." + _slug(last)
    if ":" in last:
        return "gemini." + _slug(last.partition(":")[2])
    fam = "anthropic." if path.startswith("/anthropic/") else (
        "openai." if path.startswith("/openai/") else "")
    return fam + _slug(path.rsplit("/v1/", 1)[-1].lstrip("/").replace("/", "."))


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", s)[:64].strip("._") or "none"


def file_name(path: str, model: str, stream: bool, key: str) -> str:
    """A cassette's readable file name: endpoint, model, kind and the key's first digits."""
    return f"{_endpoint(path)}-{_slug(model)}-{'stream' if stream else 'json'}-{key[:12]}.json"


class CassetteError(ValueError):
    """A cassette that cannot be served; the message names the file and the field."""


def _fail(name: str, where: str, what: str) -> CassetteError:
    return CassetteError(f"{name}: {where}: {what}")


def _headers(h: Any, name: str, where: str, response: bool = False) -> dict[str, str]:
    if h is None:
        return {}
    if not isinstance(h, dict) or len(h) > MAX_HEADERS:
        raise _fail(name, where, f"an object of at most {MAX_HEADERS} headers")
    out = {}
    for k, v in h.items():
        if not _TOKEN.match(k):
            raise _fail(name, f"{where}.{k[:64]!r}", "not a header name")
        if response and (k.lower() in HOP_HEADERS or k.lower() == "content-type"):
            raise _fail(name, f"{where}.{k}", "a header the server sets itself")
        if type(v) is not str or len(v) > MAX_HEADER_VALUE or any(
                c in v for c in "\r\n\0") or not v.replace("\t", " ").isprintable():
            raise _fail(name, f"{where}.{k}", f"a printable string of at most "
                        f"{MAX_HEADER_VALUE} characters")
        out[k.lower()] = v
    return out


def _seconds(v: Any, name: str, where: str) -> float:
    if type(v) not in (int, float) or not math.isfinite(v) or not 0 <= v <= MAX_DURATION_S:
        raise _fail(name, where, f"a number of seconds, 0 to {MAX_DURATION_S:g}")
    return float(v)


class Framer(Protocol):
    def feed(self, data: bytes) -> list[bytes]: ...

    def flush(self) -> bytes | list[bytes]: ...


class Framing(NamedTuple):
    """How a recorded stream is cut into frames, kept in a cassette and sent again."""

    name: str
    framer: Callable[[int], Framer]  # (the most bytes one frame may hold)
    keep: Callable[[bytes], Any]  # a frame as received → its cassette form (or FrameError)
    wire: Callable[[Any], bytes]  # its cassette form → the bytes a replay sends


def _rest(framer: Framer) -> list[bytes]:
    """What a framer holds when its stream ends (a FrameError when that is malformed)."""
    rest = framer.flush()
    return ([rest] if rest else []) if isinstance(rest, bytes) else list(rest)


def _event_kept(raw: bytes) -> dict[str, Any]:
    headers, payload = decode_message(raw)
    out: dict[str, Any] = {"headers": headers}
    if payload:
        try:
            out["payload"] = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise FrameError("an event-stream payload that is not JSON") from None
    return out


def _event_wire(ev: dict[str, Any]) -> bytes:
    payload = orjson.dumps(ev["payload"]) if "payload" in ev else b""
    return bedrock.frame(list(ev["headers"].items()), payload)


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "replace")


def _encoded(text: str) -> bytes:
    return text.encode()


SSE = Framing("sse", lambda limit: SSEFramer(), _text, _encoded)
FRAMINGS = {f.name: f for f in (
    SSE,
    Framing("ndjson", lambda limit: NDJSONFramer(), ndjson_line, _encoded),
    Framing("json-array", lambda limit: ArrayFramer(), array_piece, _encoded),
    Framing("eventstream", EventStreamFramer, _event_kept, _event_wire))}


class _Pieces:
    """A binary body's framer: each piece as it arrives (joined into chunks when saved)."""

    def feed(self, data: bytes) -> list[bytes]:
        return [data]

    def flush(self) -> bytes:
        return b""


CHUNKS = Framing("chunks", lambda limit: _Pieces(), bytes, base64.b64decode)
"""A binary body sent without a length (chunked audio), kept as timed base64 ``chunks``
(:func:`_merged`) rather than ``events``: not one of :data:`FRAMINGS`."""


def framing_of(content_type: str, path: str, status: int, sized: bool) -> Framing | None:
    """How an upstream answer is recorded, decided here only: a stream cut into frames by its
    media type (Gemini's JSON array by its path: ``alt=sse`` is SSE's media type), a binary
    body sent without a length (``sized`` false) as :data:`CHUNKS`, else None: a body read
    whole and kept as text or base64 (:func:`_kept_body`)."""
    ctype = content_type.partition(";")[0].strip().lower()
    if ctype == "text/event-stream":
        return SSE
    if ctype == "application/x-ndjson":
        return FRAMINGS["ndjson"]
    if ctype == "application/vnd.amazon.eventstream":
        return FRAMINGS["eventstream"]
    if ctype == "application/json" and status < 400 and path.endswith(
            ":streamGenerateContent"):
        return FRAMINGS["json-array"]
    if not sized and not _is_text(content_type):
        return CHUNKS
    return None


def _kept_body(body: bytes | bytearray, ctype: str) -> dict[str, str]:
    """A whole answer as a cassette keeps it: ``body`` when it is UTF-8 text, else
    ``body_b64``."""
    if _is_text(ctype):
        with contextlib.suppress(UnicodeDecodeError):
            return {"body": body.decode("utf-8")}
    return {"body_b64": base64.b64encode(body).decode()}


def _event_frame(ev: Any, name: str, where: str) -> dict[str, Any]:
    """An event-stream frame of a cassette: its string headers (``:message-type`` among
    them) and its JSON payload, which must encode within the format's limits."""
    if not isinstance(ev, dict) or not set(ev) <= {"headers", "payload"}:
        raise _fail(name, where, "an object with headers and payload (an event-stream frame)")
    hs = ev.get("headers")
    if not isinstance(hs, dict) or not 0 < len(hs) <= MAX_EVENT_HEADERS:
        raise _fail(name, f"{where}.headers", f"an object of 1 to {MAX_EVENT_HEADERS} headers")
    for k, v in hs.items():
        if not 0 < len(k.encode()) < 256 or not k.isprintable():
            raise _fail(name, f"{where}.headers", "header names of 1 to 255 bytes")
        if type(v) is not str or len(v.encode()) > 32767:
            raise _fail(name, f"{where}.headers.{k[:64]}", "a string of at most 32767 bytes")
    if hs.get(":message-type") not in ("event", "exception", "error"):
        raise _fail(name, f"{where}.headers.:message-type", "event, exception or error")
    try:
        _event_wire(ev)
    except orjson.JSONEncodeError as exc:
        raise _fail(name, f"{where}.payload", f"a JSON value ({exc})") from None
    return ev


def _timed(items: Any, name: str, where: str, what: str, shape: str
           ) -> Iterator[tuple[str, list[Any]]]:
    """The ``[offset_s, x]`` pairs of a recorded list (at most MAX_EVENTS), each with its
    place in the cassette."""
    if not isinstance(items, list) or len(items) > MAX_EVENTS:
        raise _fail(name, where, f"a list of at most {MAX_EVENTS} {what}")
    for i, item in enumerate(items):
        w = f"{where}[{i}]"
        if not isinstance(item, list) or len(item) != 2:
            raise _fail(name, w, shape)
        yield w, item


def _frames(events: Any, framing: Framing, name: str) -> list[tuple[float, Any]]:
    out = []
    for w, ev in _timed(events, name, "response.events", "frames", "[offset_s, frame]"):
        frame = ev[1]
        if framing.name == "eventstream":
            frame = _event_frame(frame, name, f"{w}[1]")
        elif type(frame) is not str or not frame:
            raise _fail(name, f"{w}[1]", f"a non-empty string (one {framing.name} frame)")
        elif framing is not SSE:
            try:
                framing.keep(frame.encode())
            except FrameError as exc:
                raise _fail(name, f"{w}[1]", str(exc)) from None
        out.append((_seconds(ev[0], name, f"{w}[0]"), frame))
    if framing.name == "json-array":  # the frames are the array cut where the recorder cuts
        whole = "".join(f for _t, f in out).encode()
        try:
            framer = ArrayFramer()
            again = framer.feed(whole) + framer.flush()
        except FrameError as exc:
            raise _fail(name, "response.events", str(exc)) from None
        if [f.decode() for f in again] != [f for _t, f in out]:
            raise _fail(name, "response.events", "frames that each end one array element")
    return out


_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_FILE_KEYS = frozenset(("filename", "content_type", "size", "sha256"))


def _digest(v: Any, name: str, where: str) -> dict[str, Any]:
    """A file part's or binary body's description: size and SHA-256 (and a file's name and
    content type)."""
    if not isinstance(v, dict) or not set(v) <= _FILE_KEYS or "size" not in v \
            or "sha256" not in v:
        raise _fail(name, where, "an object with size and sha256 (and a file's filename "
                    "and content_type)")
    size, digest = v["size"], v["sha256"]
    if type(size) is not int or not 0 <= size <= MAX_REPLAY_BYTES:
        raise _fail(name, f"{where}.size", "a number of bytes")
    if type(digest) is not str or not _HEX64.match(digest):
        raise _fail(name, f"{where}.sha256", "64 lower-case hex digits (SHA-256)")
    for k in ("filename", "content_type"):
        if k in v and (type(v[k]) is not str or len(v[k]) > 256 or not v[k].isprintable()):
            raise _fail(name, f"{where}.{k}", "a printable string of at most 256 characters")
    return dict(v)


def _form_value(v: Any, name: str, where: str) -> Any:
    if type(v) is str:
        if len(v) > MAX_TEXT_FIELD:
            raise _fail(name, where, f"a text field of at most {MAX_TEXT_FIELD} characters")
        return v
    if type(v) is bool:  # (stream: true, as the hooks read it)
        return v
    return _digest(v, name, where)


def _form(form: Any, name: str) -> dict[str, Any]:
    if not isinstance(form, dict) or len(form) > MAX_PARTS:
        raise _fail(name, "request.form", f"an object of at most {MAX_PARTS} form fields")
    out: dict[str, Any] = {}
    for k, v in form.items():
        w = f"request.form.{k[:64]}"
        if not 0 < len(k) <= 256 or not k.isprintable():
            raise _fail(name, w, "a field name of 1-256 printable characters")
        if isinstance(v, list):
            if len(v) > MAX_PARTS:
                raise _fail(name, w, f"at most {MAX_PARTS} values")
            out[k] = [_form_value(x, name, f"{w}[{i}]") for i, x in enumerate(v)]
        elif k == "stream" and v in ("true", "false"):  # (as Request.json reads a form)
            out[k] = v == "true"
        else:
            out[k] = _form_value(v, name, w)
    return out


def _b64(v: Any, name: str, where: str, empty: bool = True) -> str:
    """A base64 string, checked (decoded when served)."""
    if type(v) is not str or (not empty and not v):
        raise _fail(name, where, "a base64 string" + ("" if empty else ", not empty"))
    try:
        base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise _fail(name, where, "valid base64 (the bytes as received)") from None
    return v


def _ctype(v: Any, name: str, where: str) -> str:
    if type(v) is not str or not 0 < len(v) <= 256 or not v.isprintable():
        raise _fail(name, where, "a media type of at most 256 characters")
    return v


def _files(files: Any, name: str) -> list[dict[str, str]]:
    if not isinstance(files, list) or len(files) > MAX_FILES:
        raise _fail(name, "response.files", f"a list of at most {MAX_FILES} files")
    out = []
    for i, f in enumerate(files):
        w = f"response.files[{i}]"
        if not isinstance(f, dict):
            raise _fail(name, w, "an object with url, content_type and body_b64")
        url = f.get("url")
        if type(url) is not str or not url.startswith(("http://", "https://")) \
                or len(url) > MAX_HEADER_VALUE:
            raise _fail(name, f"{w}.url", "the http(s) URL the upstream answered")
        out.append({"url": url, "content_type": _ctype(f.get("content_type"), name,
                                                       f"{w}.content_type"),
                    "body_b64": _b64(f.get("body_b64"), name, f"{w}.body_b64")})
    return out


def validate(entry: Any, name: str) -> dict[str, Any]:
    """``entry`` checked field by field (the cassette as it will be served), or a
    CassetteError naming ``name`` and the field."""
    if not isinstance(entry, dict):
        raise _fail(name, "(top level)", "an object with request and response")
    if entry.get("kind") == "realtime":
        try:
            session = rt_tape.validate(entry)
        except rt_tape.RealtimeError as exc:
            raise CassetteError(f"{name}: {exc}") from None
        session["headers"] = _headers(entry.get("headers"), name, "headers")
        return session
    rq, rs = entry.get("request"), entry.get("response")
    if not isinstance(rq, dict):
        raise _fail(name, "request", "an object")
    if not isinstance(rs, dict):
        raise _fail(name, "response", "an object")
    method, path = rq.get("method"), rq.get("path")
    if type(method) is not str or not _METHOD.match(method):
        raise _fail(name, "request.method", "an HTTP method such as POST")
    if type(path) is not str or not path.startswith("/") or len(path) > MAX_PATH \
            or not path.isprintable() or " " in path:
        raise _fail(name, "request.path", f"a path starting with / (at most {MAX_PATH} "
                    "characters)")
    req: dict[str, Any] = {"method": method, "path": path,
                           "headers": _headers(rq.get("headers"), name, "request.headers")}
    if sum(k in rq for k in ("body", "form", "raw")) > 1:
        raise _fail(name, "request", "one of body, form and raw")
    if "form" in rq:
        req["form"] = _form(rq["form"], name)
    elif "raw" in rq:
        raw = _digest(rq["raw"], name, "request.raw")
        if set(raw) != {"size", "sha256"}:
            raise _fail(name, "request.raw", "an object with size and sha256 only")
        req["raw"] = raw
    else:
        body = rq.get("body", "")
        if type(body) is not str:
            raise _fail(name, "request.body", "a string (the JSON body as sent)")
        req["body"] = body
    status = rs.get("status")
    if type(status) is not int or not 200 <= status <= 599:
        raise _fail(name, "response.status", f"an HTTP status 200-599, got {bounded(status, 32)}")
    ctype = _ctype(rs.get("content_type", "application/json"), name, "response.content_type")
    res: dict[str, Any] = {
        "status": status, "content_type": ctype,
        "duration_s": _seconds(rs.get("duration_s", 0.0), name, "response.duration_s"),
        "headers": _headers(rs.get("headers"), name, "response.headers", response=True)}
    if sum(k in rs for k in ("body_b64", "events", "chunks")) > 1:  # (body: when none is)
        raise _fail(name, "response", "one of body, body_b64, events and chunks")
    if "files" in rs:
        res["files"] = _files(rs["files"], name)
    events = rs.get("events")
    chunks = rs.get("chunks")
    if chunks is not None:
        got = []
        for w, ch in _timed(chunks, name, "response.chunks", "chunks",
                            "[offset_s, base64 bytes]"):
            got.append((_seconds(ch[0], name, f"{w}[0]"), _b64(ch[1], name, f"{w}[1]",
                                                               empty=False)))
        res["chunks"] = got
    elif "body_b64" in rs:
        res["body_b64"] = _b64(rs["body_b64"], name, "response.body_b64")
    elif events is not None:
        kind = rs.get("framing", "sse")
        if kind not in FRAMINGS:
            raise _fail(name, "response.framing", f"one of {', '.join(FRAMINGS)}")
        res["framing"] = kind
        res["events"] = _frames(events, FRAMINGS[kind], name)
    else:
        text = rs.get("body", "")
        if type(text) is not str:
            raise _fail(name, "response.body", "a string")
        res["body"] = text
    return {"version": 2, "request": req, "response": res}


def _is_text(ctype: str) -> bool:
    c = ctype.lower()
    return c.startswith(TEXT_TYPES) or "+json" in c


def matched_path(req: Request) -> str:
    """The path a cassette is matched and saved by: Gemini's ``?alt=sse`` (an SSE stream,
    else a JSON array) is part of it."""
    return req.path + "?alt=sse" if req.query_one("alt") == "sse" else req.path


def _data(fields: dict[str, Any]) -> Any:
    """The request's body as data: the form, or the JSON body (None: neither)."""
    if "form" in fields:
        return fields["form"]
    body = fields.get("body")
    try:
        return orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return None


def _model(path: str, fields: dict[str, Any]) -> str:
    """The model of a request: in Bedrock's and Gemini's path, else the body's ``model``."""
    path = path.partition("?")[0]
    if path.startswith("/model/"):  # /model/{modelId}/converse
        return unquote(path.split("/")[2])
    i = path.rfind("/models/")
    if i >= 0 and ":" in path[i:]:  # .../models/{model}:generateContent
        return unquote(path[i + 8:].partition(":")[0])
    data = _data(fields)
    m = data.get("model") if isinstance(data, dict) else None
    return m if isinstance(m, str) else ""


def _is_stream(path: str, fields: dict[str, Any]) -> bool:
    """Whether a request asks for a stream: by the path for Bedrock and Gemini, by
    ``stream`` in the body or form elsewhere (Ollama's chat and generate stream unless it is
    false)."""
    path = path.partition("?")[0]
    if path.startswith("/model/"):
        return path.endswith(BEDROCK_STREAMS)
    if ":" in path.rpartition("/")[2]:
        return path.endswith(":streamGenerateContent")
    data = _data(fields)
    if path in ("/api/chat", "/api/generate"):
        return not (isinstance(data, dict) and data.get("stream") is False)
    return isinstance(data, dict) and data.get("stream") in (True, "true")


# ------------------------------------------------------------------------------------------
# The loaded cassettes
# ------------------------------------------------------------------------------------------

class Cassettes:
    """Cassettes by key; the first of each (path, model, stream) for the replay fallback;
    the normalised bodies of each path for the not-found diff."""

    def __init__(self, ignore: frozenset[str] = VOLATILE) -> None:
        self.ignore = ignore
        self.by_key: dict[str, dict[str, Any]] = {}
        self.by_model: dict[tuple[str, str, str, bool], dict[str, Any]] = {}
        self.names: dict[str, str] = {}  # key → file name
        self.by_path: dict[tuple[str, str], list[str]] = {}  # (method, path) → keys
        self.loaded = 0  # how many came from the directory at start-up
        # Realtime: each recorded response by its key (with its cassette's name); each
        # session's client events and where its responses cut them (the not-found diff)
        self.realtime: dict[str, tuple[dict[str, Any], str]] = {}
        self.sessions: list[tuple[str, str, str, list[dict[str, Any]]]] = []

    def key(self, method: str, path: str, fields: dict[str, Any]) -> str:
        return fields_key(method, path, fields, self.ignore)

    def add(self, entry: dict[str, Any], name: str) -> str:
        if entry.get("kind") == "realtime":
            return self.add_realtime(entry, name)
        rq = entry["request"]
        fields = _fields(rq)
        key = self.key(rq["method"], rq["path"], fields)
        if key not in self.by_key:
            self.by_path.setdefault((rq["method"], rq["path"]), []).append(key)
        self.by_key[key] = entry
        self.names[key] = name
        self.by_model.setdefault((rq["method"], rq["path"], _model(rq["path"], fields),
                                  _is_stream(rq["path"], fields)), entry)
        return key

    def add_realtime(self, entry: dict[str, Any], name: str) -> str:
        """Index a Realtime session's responses by their keys (:class:`~.realtime.tape.Tape`,
        fed the recorded client events as the live session is)."""
        tape = rt_tape.Tape(entry["path"], entry["model"], self.ignore)
        key = ""
        for r in entry["responses"]:
            for ev in r["client"]:
                tape.add(ev)
            key = tape.cut()
            self.realtime[key] = (r, name)
        if len(self.sessions) < NEAREST_SCAN:
            self.sessions.append((name, entry["path"], entry["model"], tape.events))
        return key

    def realtime_nearest(self, path: str, model: str, events: list[dict[str, Any]]) -> str:
        """Which recorded session this one follows longest, and where it parts from it."""
        best: tuple[int, str, list[dict[str, Any]]] | None = None
        for name, p, m, theirs in self.sessions:
            if (p, m) != (path, model):
                continue
            n = 0
            for a, b in zip(events, theirs, strict=False):
                if a != b:
                    break
                n += 1
            if best is None or n > best[0]:
                best = (n, name, theirs)
        if best is None:
            return f"No Realtime session was recorded for {path} with model {model!r}."
        n, name, theirs = best
        here = events[n] if n < len(events) else None
        there = theirs[n] if n < len(theirs) else None
        if here is not None and there is not None and here.get("type") == there.get("type"):
            how = f"{here['type']} with {', '.join(_diff(here, there)) or 'nothing'} differing"
        else:
            how = (f"{here['type'] if here else 'no event'} here, "
                   f"{there['type'] if there else 'no event'} there")
        return (f"Nearest: {name}, which has the same first {n} client events, then at "
                f"event {n}: {how}.")

    def find(self, req: Request, fields: dict[str, Any], key: str,
             fallback: bool) -> dict[str, Any]:
        hit = self.by_key.get(key)
        if hit is None and fallback:
            path = matched_path(req)
            hit = self.by_model.get((req.method, path, _model(path, fields),
                                     _is_stream(path, fields)))
        if hit is None:
            raise E.cassette_not_found.at(key=key, nearest=self.nearest(req, fields))
        return hit

    def _compared(self, fields: dict[str, Any]) -> Any:
        if "form" in fields:
            return {k: v for k, v in fields["form"].items() if k not in self.ignore}
        if "raw" in fields:
            return {"(binary body)": fields["raw"]}
        return _normalised(fields.get("body", ""), self.ignore)

    def nearest(self, req: Request, fields: dict[str, Any]) -> str:
        """Which cassette this request comes closest to, and the fields that differ."""
        mine = self._compared(fields)
        best: tuple[int, str, list[str]] | None = None
        for key in self.by_path.get((req.method, matched_path(req)), [])[:NEAREST_SCAN]:
            theirs = self._compared(_fields(self.by_key[key]["request"]))
            diff = _diff(mine, theirs)
            if best is None or len(diff) < best[0]:
                best = (len(diff), self.names.get(key, key), diff)
        if best is None:
            return f"No cassette was recorded for {req.method} {matched_path(req)}."
        return f"Nearest: {best[1]}, which differs in {', '.join(best[2]) or 'nothing'}."


def _diff(a: Any, b: Any) -> list[str]:
    if not isinstance(a, dict) or not isinstance(b, dict):
        return [] if a == b else ["the body"]
    out = []
    for k in sorted(set(a) | set(b), key=str):
        if k not in b:
            out.append(f"{k} (not in the cassette)")
        elif k not in a:
            out.append(f"{k} (only in the cassette)")
        elif a[k] != b[k]:
            va, vb = a[k], b[k]
            if isinstance(va, dict) and isinstance(vb, dict) and "sha256" in va:
                what = [f for f in ("filename", "content_type", "size", "sha256")
                        if va.get(f) != vb.get(f)]
                out.append(f"{k} (another file: {', '.join(what)})")
                continue
            if isinstance(va, (dict, list)) or isinstance(vb, (dict, list)):
                out.append(str(k))  # (a message list is not repeated in an error)
                continue
            ta, tb = json.dumps(va), json.dumps(vb)
            out.append(f"{k} ({ta} here, {tb} there)" if len(ta) + len(tb) < 60 else str(k))
    return out


def load_cassettes(directory: str, ignore: frozenset[str] = VOLATILE) -> Cassettes:
    """Every ``*.json`` of ``directory``, validated (CassetteError names file and field)."""
    store = Cassettes(ignore)
    try:
        names = sorted(n for n in os.listdir(directory)
                       if n.endswith(".json") and not n.startswith("."))
    except OSError as exc:
        raise CassetteError(f"{directory}: {exc.strerror or exc}") from None
    if len(names) > MAX_CASSETTES:
        raise CassetteError(f"{directory}: more than {MAX_CASSETTES} cassettes")
    total = 0
    for name in names:
        full = os.path.join(directory, name)
        try:
            with open(full, "rb") as f:
                raw = f.read(MAX_CASSETTE_BYTES + 1)
        except OSError as exc:
            raise CassetteError(f"{full}: {exc.strerror or exc}") from None
        if len(raw) > MAX_CASSETTE_BYTES:
            raise CassetteError(f"{full}: larger than {MAX_CASSETTE_BYTES} bytes")
        total += len(raw)
        if total > MAX_REPLAY_BYTES:
            raise CassetteError(f"{directory}: more than {MAX_REPLAY_BYTES} bytes of cassettes")
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise CassetteError(f"{full}: not valid JSON ({exc})") from None
        store.add(validate(data, full), name)
    store.loaded = len(store.by_key) + len(store.realtime)
    return store


# ------------------------------------------------------------------------------------------
# Replay
# ------------------------------------------------------------------------------------------

def _raw_sse(etype: str, data: Any) -> bytes:
    return data if type(data) is bytes else b""


def _replayed_token(etype: str, data: Any) -> bool:
    return etype == "frame"


def _openai_frame(err: APIError) -> bytes:
    return b"data: " + orjson.dumps({"error": err.to_dict()}) + b"\n\n"


def _anthropic_frame(err: APIError) -> bytes:
    from .anthropic import _error_object

    return b"event: error\ndata: " + orjson.dumps(_error_object(err)) + b"\n\n"


# the families' own error frames (a failure after the stream began: recording or a fault)
def _gemini_sse_frame(err: APIError) -> bytes:
    return gemini.GEMINI_SSE.sse_error(err, 0)


def _array_frame(err: APIError) -> bytes:
    return gemini.GEMINI_ARRAY.sse_error(err, 0)


def _ndjson_frame(err: APIError) -> bytes:
    return ollama.OLLAMA.sse_error(err, 0)


def _exception_frame(err: APIError) -> bytes:
    return bedrock.CONVERSE_STREAM.sse_error(err, 0)


def _dialect(name: str, frame: Callable[[APIError], bytes],
             headers: bytes | None = None) -> Dialect:
    return Dialect(name, numbered=False, sse=_raw_sse, sse_error=lambda err, seq: frame(err),
                   error_events=lambda err: [("frame", frame(err))],
                   is_token=_replayed_token, terminals=frozenset(), stream_headers=headers)


REPLAY = _dialect("replay", _openai_frame)
"""A recorded stream: every frame as it was received (every frame counts as a token for the
stats: the recording does not say which carried one); the others differ in their error frame
and, for the streams that are not SSE, the family's media type."""
REPLAY_ANTHROPIC = _dialect("replay", _anthropic_frame)
REPLAY_GEMINI = _dialect("replay", _gemini_sse_frame)
REPLAY_BY_FRAMING = {
    "ndjson": (_dialect("replay", _ndjson_frame, ollama.OLLAMA.stream_headers), _ndjson_frame),
    "json-array": (_dialect("replay", _array_frame, gemini.GEMINI_ARRAY.stream_headers),
                   _array_frame),
    "eventstream": (_dialect("replay", _exception_frame,
                             bedrock.CONVERSE_STREAM.stream_headers), _exception_frame)}


def _raw_bytes(etype: str, data: Any) -> bytes:
    return data if type(data) is bytes else b""


def _dropped(err: APIError) -> list[tuple[str, Any]]:
    return [(DISCONNECT, None)]  # a binary body has no error frame: the connection drops


def binary_dialect(ctype: str) -> Dialect:
    """A recorded binary stream (chunked audio): each chunk as received, under the recorded
    content type."""
    return Dialect("replay", numbered=False, sse=_raw_bytes, sse_error=lambda e, s: b"",
                   error_events=_dropped, token_types=frozenset({"chunk"}),
                   stream_headers=f"content-type: {ctype}\r\n".encode("latin-1", "replace"))


def _family(path: str, framing: str = "sse") -> tuple[Dialect, Callable[[APIError], bytes]]:
    if framing in REPLAY_BY_FRAMING:
        return REPLAY_BY_FRAMING[framing]
    if path in ANTHROPIC_PATHS:
        return REPLAY_ANTHROPIC, _anthropic_frame
    if ":" in path.partition("?")[0].rpartition("/")[2]:
        return REPLAY_GEMINI, _gemini_sse_frame
    return REPLAY, _openai_frame


def _sent(headers: dict[str, str]) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers.items() if k not in SERVER_SET]


def _answer(entry: dict[str, Any], speed: float, app: Services | None = None,
            req: Request | None = None) -> RawResponse | StreamResponse:
    r = entry["response"]
    headers = _sent(r.get("headers", {}))
    rq = entry["request"]
    model = _model(rq["path"], _fields(rq)) or None
    if "events" in r or "chunks" in r:
        framing = CHUNKS if "chunks" in r else FRAMINGS[r.get("framing", "sse")]
        etype = "chunk" if framing is CHUNKS else "frame"

        def plan() -> Iterator[tuple[float, str, Any]]:
            last = 0.0
            for t, frame in r["chunks"] if framing is CHUNKS else r["events"]:
                off = 0.0 if speed <= 0 else max(0.0, (t - last) / speed)
                last = t
                yield off, etype, framing.wire(frame)
        dialect = binary_dialect(r.get("content_type", "application/octet-stream")) \
            if framing is CHUNKS else _family(rq["path"], framing.name)[0]
        return StreamResponse(EventStream(plan(), dialect, model=model),
                              status=r["status"], headers=headers)
    if "body_b64" in r:
        body = base64.b64decode(r["body_b64"])
    else:
        body = r.get("body", "").encode()
        if r.get("files") and app is not None and req is not None:
            body = _local_urls(body, r["files"], app, req)
    return RawResponse(body, r["status"], r.get("content_type", "application/json"), headers)


def _local_urls(body: bytes, files: list[dict[str, str]], app: Services,
                req: Request) -> bytes:
    """An images answer's upstream URLs (expired, or offline) pointed at this server: each
    recorded image is put in its file store (``GET /llmsim/files/{name}``)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return body
    store = files_of(app)
    now = app.clock.time()
    local = {}
    for f in files:
        ctype = f["content_type"]
        ext = _slug(ctype.partition("/")[2].partition(";")[0]) or "bin"
        local[f["url"]] = file_url(req, store.put(now, ext, ctype,
                                                  base64.b64decode(f["body_b64"])))
    for item in items:
        if isinstance(item, dict) and item.get("url") in local:
            item["url"] = local[item["url"]]
    return orjson.dumps(data)


# ------------------------------------------------------------------------------------------
# Record
# ------------------------------------------------------------------------------------------

class SSEFramer:
    """SSE frames (text up to and including the blank line) cut from pieces as they arrive:
    each byte is scanned once (a ``\\r\\n`` split across pieces is held back a byte)."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._start = 0  # where the frame being collected begins in _buf
        self._scan = 0  # where to look for the next separator
        self._cr = False  # the last piece ended in \\r

    def feed(self, data: bytes) -> list[bytes]:
        if self._cr:
            data = b"\r" + data
            self._cr = False
        if data.endswith(b"\r"):
            data = data[:-1]
            self._cr = True
        buf = self._buf
        buf += data.replace(b"\r\n", b"\n")
        out = []
        while True:
            i = buf.find(b"\n\n", self._scan)
            if i < 0:
                self._scan = max(self._start, len(buf) - 1)
                break
            out.append(bytes(buf[self._start:i + 2]))
            self._start = self._scan = i + 2
        if self._start > 65536 and self._start * 2 > len(buf):
            del buf[:self._start]  # (amortised: each byte moved at most once more)
            self._scan -= self._start
            self._start = 0
        return out

    def flush(self) -> bytes:
        """What is left after the last separator (a stream that did not end its frame)."""
        rest = bytes(self._buf[self._start:]) + (b"\r" if self._cr else b"")
        self._buf = bytearray()
        self._start = self._scan = 0
        self._cr = False
        return rest if rest.strip() else b""


def _forwarded(req: Request) -> list[tuple[str, str]]:
    return [(k, v) for k, v in req.headers.items() if k not in HOP_HEADERS]


def _kept_response(headers: list[tuple[str, str]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in headers:
        k = k.lower()
        if (k in KEEP_RESPONSE or k.startswith(KEEP_RESPONSE_PREFIXES)) and len(out) < \
                MAX_HEADERS and len(v) <= MAX_HEADER_VALUE and v.isprintable():
            out[k] = v
    return out


class _Departed:
    """While a recording waits on the upstream: every WATCH_S, close this client's connection
    if it sent EOF (``App.drop_departed``), which cancels the request and its upstream."""

    def __init__(self, app: Host, req: Request) -> None:
        self.app = app
        self.client = req.client
        self.timer: Timer | None = None
        if app.drop_departed is not None and req.transport == "http" and req.client:
            self.timer = app.clock.call_later(WATCH_S, self._check)

    def _check(self) -> None:
        self.timer = None
        drop = self.app.drop_departed
        if drop is not None and not drop((self.client,)):
            self.timer = self.app.clock.call_later(WATCH_S, self._check)

    def stop(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


class _Live:
    """A stream being recorded: frames as the upstream sends them (read by the plan)."""

    def __init__(self) -> None:
        self.frames: list[tuple[float, bytes]] = []
        self.kept: list[Any] = []  # each frame in its cassette form
        self.done = False
        self.error: APIError | None = None
        self.size = 0


class Recorder:
    """The record/replay handler of every cassette path."""

    def __init__(self, app: Host, directory: str, mode: str, store: Cassettes) -> None:
        cfg = app.config
        self.app = app
        self.dir = directory
        self.mode = mode
        self.store = store
        self.speed = cfg.replay_speed
        # "once" on a directory that already held cassettes is a replay
        self.replay_only = mode == "none" or (mode == "once" and store.loaded > 0)
        self.record_errors = cfg.record_errors
        self.max_bytes = cfg.record_max_bytes
        self.budget = cfg.record_budget_bytes
        self.written = 0
        self.aws = bedrock.aws_secrets(app)  # to sign Bedrock requests again (--aws-keys)

        def upstream(url: str) -> Upstream:
            return Upstream(url, ca=cfg.upstream_ca, read_timeout=cfg.upstream_read_timeout_s,
                            total_timeout=cfg.upstream_timeout_s)

        self.routes: list[tuple[str, Upstream]] = []
        for r in cfg.record_route:
            name, _, url = r.partition("=")
            self.routes.append((name, upstream(url)))
        self.default = upstream(cfg.record_upstream) if cfg.record_upstream else None
        self.tasks: set[asyncio.Task[None]] = set()

    def upstream(self, path: str) -> Upstream:
        family = "anthropic" if path in ANTHROPIC_PATHS else "ollama" if path.startswith(
            "/api/") else "bedrock" if path.startswith("/model/") else "gemini" if ":" in \
            path.rpartition("/")[2] else "openai"
        for name, up in self.routes:
            if name == family or (name.startswith("/") and path.startswith(name)):
                return up
        if self.default is None:
            raise E.no_upstream.at(path=path)
        return self.default

    async def handle(self, req: Request, app: Services) -> RawResponse | StreamResponse:
        fields = await _request_fields(req)
        key = self.store.key(req.method, matched_path(req), fields)
        if self.replay_only:
            return await self._replay(self.store.find(req, fields, key,
                                                      fallback=self.mode == "none"), req)
        if self.mode == "new_episodes" or self.mode == "once":
            hit = self.store.by_key.get(key)
            if hit is not None:
                return await self._replay(hit, req)
        return await self._record(req, fields, key)

    async def _replay(self, entry: dict[str, Any], req: Request) -> RawResponse | StreamResponse:
        res = _answer(entry, self.speed, self.app, req)
        if type(res) is RawResponse and self.speed > 0:
            await self.app.clock.sleep(entry["response"]["duration_s"] / self.speed)
        return res

    async def _record(self, req: Request, fields: dict[str, Any],
                      key: str) -> RawResponse | StreamResponse:
        if self.budget and self.written >= self.budget:
            raise E.record_budget_spent.at(limit=self.budget)
        up = self.upstream(req.path)
        watch = _Departed(self.app, req)
        target = up.target(req.path, req.query)
        headers = _forwarded(req)
        if self.aws and req.path.startswith("/model/"):
            headers = bedrock.resigned(req.method, target.partition("?")[0], req.query,
                                       [("host", up.netloc), *headers], req.body,
                                       self.aws)[1:]
        try:
            ex = await up.open(req.method, target, headers, req.body)
        finally:
            watch.stop()
        ctype = next((v for k, v in ex.headers if k.lower() == "content-type"),
                     "application/json")
        if not 200 <= ex.status <= 599:
            ex.close()
            raise E.upstream_error.at(base=up.base, reason=f"an answer with status {ex.status}")
        coding = next((v for k, v in ex.headers if k.lower() == "content-encoding"), "")
        if coding.strip().lower() not in ("", "identity"):
            ex.close()
            raise E.upstream_error.at(base=up.base, reason=f"a body in content-encoding "
                                      f"{coding[:32]!r} (identity was asked for)")
        kept = _kept_response(ex.headers)
        save = ex.status < 400 or self.record_errors
        sized = any(k.lower() == "content-length" for k, _ in ex.headers)
        framing = framing_of(ctype, req.path, ex.status, sized)
        if framing is not None:  # (chunked audio among them: chunk by chunk, live)
            return self._stream_through(req, fields, key, ex, ctype, kept, save, framing)
        watch = _Departed(self.app, req)
        try:
            body = bytearray()
            async with contextlib.aclosing(ex.body()) as pieces:
                async for _t, data in pieces:
                    body += data
                    if len(body) > self.max_bytes:
                        raise E.cassette_too_large.at(limit=self.max_bytes)
        finally:
            watch.stop()
            ex.close()
        duration = round(min(ex.elapsed(), MAX_DURATION_S), 6)
        if save:
            answer: dict[str, Any] = {"duration_s": duration, **_kept_body(body, ctype)}
            if req.path.removeprefix("/openai") in IMAGE_PATHS and ex.status < 400:
                files = await self._fetch_files(body, self.max_bytes - len(body))
                if files is None:
                    save = False
                elif files:
                    answer["files"] = files
        if save:
            done = self._save(req, fields, key, kept, ex.status, ctype, answer)
            if done is not None:
                await done  # (the cassette exists when the client has the answer)
        return RawResponse(bytes(body), ex.status, ctype, _sent(kept))

    async def _fetch_files(self, body: bytes | bytearray, room: int) -> list[dict[str, str]] | None:
        """The images a ``url`` answer points to, fetched now (the upstream's URLs expire;
        the replay serves them itself): at most :data:`MAX_FILES`, ``room`` bytes in all.
        None (and a warning): one could not be fetched, so the exchange is not recorded."""
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            return []
        items = data.get("data") if isinstance(data, dict) else None
        urls = list(dict.fromkeys(
            it["url"] for it in items or () if isinstance(it, dict)
            and isinstance(it.get("url"), str) and it["url"].startswith(("http://", "https://"))
        )) if isinstance(items, list) else []
        if len(urls) > MAX_FILES:
            log.warning("an images answer with more than %d URLs: not recorded", MAX_FILES)
            return None
        cfg = self.app.config
        out = []
        for url in urls:
            u = urlsplit(url)
            try:
                up = Upstream(f"{u.scheme}://{u.netloc}", ca=cfg.upstream_ca,
                              read_timeout=cfg.upstream_read_timeout_s,
                              total_timeout=cfg.upstream_timeout_s)
            except ValueError as exc:
                log.warning("image URL %.200s: %s: not recorded", url, exc)
                return None
            try:
                ex = await up.open("GET", (u.path or "/") + (f"?{u.query}" if u.query else ""),
                                   [], b"")
                got = bytearray()
                try:
                    async with contextlib.aclosing(ex.body()) as pieces:
                        async for _t, piece in pieces:
                            got += piece
                            if len(got) > room:
                                raise E.cassette_too_large.at(limit=self.max_bytes)
                finally:
                    ex.close()
                if ex.status != 200:
                    raise E.upstream_error.at(base=up.base, reason=f"status {ex.status}")
            except APIError as exc:
                log.warning("image URL %.200s: %s: not recorded", url, exc.message)
                return None
            finally:
                up.close()
            room -= len(got)
            ctype = next((v for k, v in ex.headers if k.lower() == "content-type"),
                         "application/octet-stream")
            out.append({"url": url, "content_type": ctype[:256],
                        "body_b64": base64.b64encode(got).decode()})
        return out

    def _stream_through(self, req: Request, fields: dict[str, Any], key: str, ex: Exchange,
                        ctype: str, kept: dict[str, str], save: bool,
                        framing: Framing) -> StreamResponse:
        live = _Live()
        task = asyncio.get_running_loop().create_task(self._read_stream(ex, live, framing))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        binary = framing is CHUNKS
        if binary:
            dialect, etype = binary_dialect(ctype), "chunk"
        else:
            dialect, frame_of = _family(req.path, framing.name)
            etype = "frame"
        clock = self.app.clock
        app = self.app

        def plan() -> Iterator[tuple[float, str, Any]]:
            watch = _Departed(app, req)
            sched = clock.now()
            i = idle = 0
            try:
                while True:
                    if i < len(live.frames):
                        yield 0.0, etype, live.frames[i][1]
                        i += 1
                        idle = 0
                        sched = max(sched, clock.now())
                        continue
                    if live.done:
                        break
                    # nothing yet: look again shortly (a skipped control event), less
                    # often the longer the upstream is quiet
                    now = clock.now()
                    wait = max(0.0, now - sched) + (POLL_S if idle < POLL_EVEN else min(
                        POLL_S * 2 ** (idle - POLL_EVEN + 1), POLL_MAX_S))
                    idle = min(idle + 1, POLL_EVEN + 8)
                    sched += wait
                    yield wait, "_wait", None
                if live.error is not None:
                    if binary:  # no error frame in audio: the client sees a cut body
                        log.warning("recording %s: %s", req.path, live.error.message)
                        yield 0.0, DISCONNECT, None
                    else:
                        last = frame_of(live.error)
                        if framing.name == "json-array" and not live.frames:
                            last = b"[" + last.lstrip(b",\r\n")  # (the array was not opened)
                        yield 0.0, "frame", last
                elif save:
                    duration = round(min(ex.elapsed(), MAX_DURATION_S), 6)
                    answer: dict[str, Any] = {"chunks": _merged(live.frames)} if binary else {
                        "framing": framing.name,
                        "events": [(round(t, 6), f) for (t, _raw), f in zip(
                            live.frames, live.kept, strict=True)]}
                    done = self._save(req, fields, key, kept, ex.status, ctype,
                                      {**answer, "duration_s": duration})
                    while done is not None and not done.done():  # the file, then the end
                        yield POLL_S, "_wait", None
            finally:
                watch.stop()
                if not task.done():
                    task.cancel()  # the client left: so does the upstream request

        def ended() -> None:  # (also when the stream is dropped before its plan ran)
            if not task.done():
                task.cancel()

        return StreamResponse(EventStream(plan(), dialect,
                                          model=_model(req.path, fields) or None,
                                          on_end=ended),
                              status=ex.status, headers=_sent(kept))

    async def _read_stream(self, ex: Exchange, live: _Live, framing: Framing) -> None:
        """Frame the upstream's stream as it arrives: each frame checked and kept in its
        cassette form before the client gets it; a malformed one ends the stream with the
        family's error (and nothing is saved)."""
        framer = framing.framer(self.max_bytes)

        def take(t: float, frames: list[bytes]) -> None:
            for frame in frames:
                if len(live.frames) >= MAX_EVENTS:
                    raise E.cassette_too_large.at(limit=self.max_bytes)
                live.kept.append(framing.keep(frame))
                live.frames.append((min(t, MAX_DURATION_S), frame))

        try:
            async with contextlib.aclosing(ex.body()) as pieces:
                async for t, data in pieces:
                    live.size += len(data)
                    if live.size > self.max_bytes:
                        raise E.cassette_too_large.at(limit=self.max_bytes)
                    take(t, framer.feed(data))
            take(ex.elapsed(), _rest(framer))
        except FrameError as exc:
            live.error = E.upstream_error.at(base=ex.up.base, reason=str(exc))
        except APIError as exc:
            live.error = exc
        except Exception as exc:  # never a silent hang: the stream ends with the error
            log.exception("recording the upstream stream failed")
            live.error = E.upstream_error.at(base=ex.up.base, reason=type(exc).__name__)
        finally:
            ex.close()
            live.done = True

    def _save(self, req: Request, fields: dict[str, Any], key: str, kept: dict[str, str],
              status: int, ctype: str, answer: dict[str, Any]) -> asyncio.Future[bool] | None:
        """Write the cassette (the file in a worker thread: a large one is not copied to the
        page cache on the event loop); the future is done once it is written and loaded."""
        headers = {k: v for k, v in req.headers.items() if k in KEEP_REQUEST}
        if "form" in fields:
            headers["content-type"] = "multipart/form-data"  # (the boundary is random)
        entry: dict[str, Any] = {
            "version": 2,
            "request": {"method": req.method, "path": matched_path(req), "headers": headers,
                        **fields},
            "response": {"status": status, "content_type": ctype, "headers": kept,
                         **answer}}
        return self.write(file_name(req.path, _model(req.path, fields),
                                    _is_stream(req.path, fields) or "chunks" in answer, key),
                          entry)

    def write(self, name: str, entry: dict[str, Any]) -> asyncio.Future[bool] | None:
        """Write ``entry`` as ``name`` within the session's budget (None: over it); it
        joins the loaded cassettes once written."""
        data = orjson.dumps(entry, option=orjson.OPT_INDENT_2)
        if self.budget and self.written + len(data) > self.budget:
            log.warning("record budget spent: %s not written", name)
            self.written = self.budget
            return None
        self.written += len(data)  # (reserved now: writes in flight count)
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(None, _write_file, self.dir, name, data)

        def written(fut: asyncio.Future[bool]) -> None:
            if not fut.cancelled() and fut.exception() is None and fut.result():
                self.store.add(entry, name)

        done.add_done_callback(written)
        return done


def _merged(frames: list[tuple[float, bytes]]) -> list[tuple[float, str]]:
    """A binary stream's pieces as recorded chunks: the pieces that arrived within
    :data:`CHUNK_MERGE_S` of a chunk's first joined to it, each chunk in base64."""
    out: list[tuple[float, bytearray]] = []
    for t, data in frames:
        if out and t - out[-1][0] < CHUNK_MERGE_S:
            out[-1][1].extend(data)
        else:
            out.append((t, bytearray(data)))
    return [(round(t, 6), base64.b64encode(b).decode()) for t, b in out]


def _write_file(directory: str, name: str, data: bytes) -> bool:
    tmp = os.path.join(directory, f".{name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(directory, name))
    except OSError:
        log.exception("cannot write the cassette %s", name)
        return False
    return True


def _setup(cfg: Any) -> tuple[str, str, Cassettes] | None:
    """The cassette directory, the mode and the loaded cassettes for ``cfg`` (None: neither
    record nor replay); ConfigError names what is wrong."""
    recording = cfg.record_upstream is not None or bool(cfg.record_route)
    if not recording and cfg.replay is None and cfg.record_mode is None:
        return None
    directory = cfg.replay or cfg.cassettes or "cassettes"
    mode = cfg.record_mode or ("all" if recording else "none")
    ignore = VOLATILE | frozenset(cfg.match_ignore)
    if mode == "none" or os.path.isdir(directory):
        try:
            store = load_cassettes(directory, ignore)
        except CassetteError as exc:
            raise ConfigError(f"replay: cannot load the cassettes: {exc}") from None
    else:
        store = Cassettes(ignore)
    if cfg.upstream_ca is not None:
        try:
            ssl.create_default_context().load_verify_locations(cafile=cfg.upstream_ca)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"upstream_ca: cannot load {cfg.upstream_ca}: {exc}") from None
    return directory, mode, store


def preflight(cfg: Any) -> None:
    """What :func:`register` would refuse, checked before the server starts (the CLI prints
    it as a start-up error instead of a traceback)."""
    _setup(cfg)


def register(app: Host) -> None:
    """Replace the generation endpoints with the recorder or the player, when configured."""
    got = _setup(app.config)
    if got is None:
        return
    directory, mode, store = got
    if mode != "none":
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cassettes: cannot create {directory}: {exc}") from None
    try:
        rec = Recorder(app, directory, mode, store)
    except (ValueError, OSError) as exc:  # an unusable URL
        raise ConfigError(f"record: {exc}") from None
    from .anthropic import anthropic_error

    async def stop(app_: Host) -> None:  # idle upstream connections and unfinished readers
        for task in list(rec.tasks):
            task.cancel()
        for up in [rec.default, *(u for _, u in rec.routes)]:
            if up is not None:
                up.close()

    app.on_stop.append(stop)
    app.set_feature(RECORDER, rec)
    for path in PATHS:
        app.router.add("POST", path, rec.handle, "cassette", stream_capable=True,
                       aliases=path not in ANTHROPIC_PATHS,
                       errors=anthropic_error if path in ANTHROPIC_PATHS else None,
                       streaming=True if path in STREAMING_PATHS else None)
    for path in GEMINI_PATHS:
        app.router.add("POST", path, rec.handle, "cassette", aliases=False,
                       errors=gemini.gemini_error,
                       stream_capable=True, streaming=path.endswith("streamGenerateContent"))
    for path in OLLAMA_PATHS:
        app.router.add("POST", path, rec.handle, "cassette", aliases=False,
                       errors=ollama.ollama_error,
                       stream_capable=True, stream_default=path != "/api/embed")
    for path in BEDROCK_PATHS:
        streams = path.endswith(BEDROCK_STREAMS)
        app.router.add("POST", path, rec.handle, "cassette", aliases=False,
                       errors=bedrock.bedrock_error, stream_capable=streams, streaming=streams)
