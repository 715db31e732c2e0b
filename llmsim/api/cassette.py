"""Record/replay: proxy a real OpenAI-compatible API once, serve the exchanges offline.

**Record** (``llmsim record --upstream URL --cassettes DIR``): the generation endpoints
forward each request to the upstream (the client's ``Authorization`` / ``api-key`` /
``x-api-key`` headers are passed through and never written), read the whole answer — a JSON
body, or every SSE frame with its time offset from the request — save it as one cassette file
``DIR/<key>.json`` and answer the client (a stream is replayed to the client at its recorded
timing once the upstream finished: recording adds the upstream's duration to what the client
sees).

**Replay** (``--replay DIR [--replay-speed X]``): the same endpoints answer from the
cassettes, matched by the request's *key*: a hash of the method, the path and the body as
canonical JSON without the fields that do not change the answer's shape
(:data:`VOLATILE`: ``user``, ``metadata``, ``safety_identifier``, ``prompt_cache_key``,
``stream_options``). Fallback when no key matches: the first cassette of the same path and
model; else a 404 ``cassette_not_found`` naming the key. Streams are paced at the recorded
offsets divided by X (X=0: as fast as possible); JSON answers wait their recorded duration /
X. Faults, rate limits, capacity and stats apply as to simulated answers.

Bounds: cassettes of at most :data:`MAX_CASSETTE_BYTES`, at most :data:`MAX_CASSETTES` loaded,
upstream answers read up to :data:`MAX_CASSETTE_BYTES` (a larger one is a 502).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import h11
import orjson

from ..config import ConfigError
from ..dialect import Dialect
from ..errors import E
from ..messages import RawResponse, Request, StreamResponse
from ..stream import EventStream

if TYPE_CHECKING:
    from ..app import App

__all__ = ["register", "cassette_key", "PATHS", "REPLAY"]

PATHS = ("/v1/chat/completions", "/v1/responses", "/v1/completions", "/v1/embeddings",
         "/v1/messages", "/anthropic/v1/messages")
VOLATILE = frozenset(("user", "metadata", "safety_identifier", "prompt_cache_key",
                      "stream_options"))
SECRET_HEADERS = frozenset(("authorization", "api-key", "x-api-key", "cookie"))
PASS_HEADERS = ("authorization", "api-key", "x-api-key", "anthropic-version", "openai-beta",
                "content-type")
MAX_CASSETTE_BYTES = 64 * 1024 * 1024
MAX_CASSETTES = 100_000
UPSTREAM_TIMEOUT_S = 600.0


def cassette_key(method: str, path: str, body: bytes) -> str:
    """The match key of a request (see the module doc)."""
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        data = body.decode("utf-8", "replace")
    if isinstance(data, dict):
        data = {k: v for k, v in data.items() if k not in VOLATILE}
    canon = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(f"{method} {path.removeprefix('/openai')}\n{canon}".encode()
                          ).hexdigest()[:32]


def _raw_sse(etype: str, data: Any) -> bytes:
    return data if type(data) is bytes else b""


def _replayed_token(etype: str, data: Any) -> bool:
    return etype == "frame"


REPLAY = Dialect("replay", numbered=False, sse=_raw_sse,
                 sse_error=lambda err, seq: b"data: " + orjson.dumps({"error": err.to_dict()})
                 + b"\n\n",
                 error_events=lambda err: [("frame", b"data: " + orjson.dumps(
                     {"error": err.to_dict()}) + b"\n\n")],
                 is_token=_replayed_token, terminals=frozenset())
"""A recorded stream: every frame as it was received (every frame counts as a token for the
stats: the recording does not say which carried one)."""


# ------------------------------------------------------------------------------------------
# Upstream (record)
# ------------------------------------------------------------------------------------------

async def _upstream(base: str, req: Request) -> tuple[int, list[tuple[str, str]],
                                                      list[tuple[float, bytes]]]:
    """Send ``req`` to ``base`` (an http:// URL) and read the whole answer: status, headers,
    and the body chunks with their offsets from the request."""
    u = urlsplit(base)
    if u.scheme != "http":
        raise E.cassette_https.at()
    port = u.port or 80
    path = (u.path.rstrip("/") + req.path.removeprefix("/openai")) or "/"
    t0 = time.monotonic()
    reader, writer = await asyncio.wait_for(asyncio.open_connection(u.hostname, port), 30)
    try:
        conn = h11.Connection(h11.CLIENT)
        hs = [("host", u.netloc), ("content-length", str(len(req.body))),
              ("connection", "close")]
        hs += [(k, v) for k, v in req.headers.items() if k in PASS_HEADERS]
        writer.write(conn.send(h11.Request(method=req.method, target=path, headers=hs))
                     + conn.send(h11.Data(data=req.body)) + conn.send(h11.EndOfMessage()))
        await writer.drain()
        status = 0
        headers: list[tuple[str, str]] = []
        chunks: list[tuple[float, bytes]] = []
        size = 0
        while True:
            ev = conn.next_event()
            if ev is h11.NEED_DATA:
                data = await asyncio.wait_for(reader.read(65536), UPSTREAM_TIMEOUT_S)
                conn.receive_data(data)
                continue
            if isinstance(ev, h11.Response):
                status = ev.status_code
                headers = [(k.decode(), v.decode()) for k, v in ev.headers]
            elif isinstance(ev, h11.Data):
                size += len(ev.data)
                if size > MAX_CASSETTE_BYTES:
                    raise E.cassette_too_large.at(limit=MAX_CASSETTE_BYTES)
                chunks.append((time.monotonic() - t0, bytes(ev.data)))
            elif isinstance(ev, (h11.EndOfMessage, h11.ConnectionClosed)):
                return status, headers, chunks
    except (TimeoutError, OSError, h11.ProtocolError) as exc:
        raise E.upstream_error.at(base=base, reason=repr(exc)) from None
    finally:
        writer.close()


def _frames(chunks: list[tuple[float, bytes]]) -> list[tuple[float, str]]:
    """SSE frames (text up to and including the blank line) with the offset of the chunk
    that completed each."""
    out: list[tuple[float, str]] = []
    buf = b""
    for t, data in chunks:
        buf += data.replace(b"\r\n", b"\n")
        while b"\n\n" in buf:
            frame, buf = buf.split(b"\n\n", 1)
            out.append((round(t, 6), frame.decode("utf-8", "replace") + "\n\n"))
    if buf.strip():
        out.append((round(chunks[-1][0], 6), buf.decode("utf-8", "replace")))
    return out


def _record_handler(app: App, base: str, directory: str) -> Any:
    os.makedirs(directory, exist_ok=True)

    async def handler(req: Request, app_: App) -> RawResponse | StreamResponse:
        status, headers, chunks = await _upstream(base, req)
        ctype = next((v for k, v in headers if k.lower() == "content-type"),
                     "application/json")
        body = b"".join(c for _, c in chunks)
        entry: dict[str, Any] = {
            "request": {"method": req.method, "path": req.path,
                        "headers": {k: v for k, v in req.headers.items()
                                    if k not in SECRET_HEADERS},
                        "body": req.body.decode("utf-8", "replace")},
            "response": {"status": status, "content_type": ctype,
                         "duration_s": round(chunks[-1][0], 6) if chunks else 0.0}}
        stream = ctype.startswith("text/event-stream")
        if stream:
            entry["response"]["events"] = _frames(chunks)
        else:
            entry["response"]["body"] = body.decode("utf-8", "replace")
        key = cassette_key(req.method, req.path, req.body)
        tmp = os.path.join(directory, f".{key}.tmp")
        with open(tmp, "wb") as f:
            f.write(orjson.dumps(entry, option=orjson.OPT_INDENT_2))
        os.replace(tmp, os.path.join(directory, f"{key}.json"))
        return _answer(entry, speed=0.0)

    return handler


# ------------------------------------------------------------------------------------------
# Replay
# ------------------------------------------------------------------------------------------

class Cassettes:
    """The loaded cassettes: by key, and the first of each (path, model) for the fallback."""

    def __init__(self, directory: str) -> None:
        self.by_key: dict[str, dict[str, Any]] = {}
        self.by_model: dict[tuple[str, str], dict[str, Any]] = {}
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
        if len(names) > MAX_CASSETTES:
            raise ValueError(f"{directory}: more than {MAX_CASSETTES} cassettes")
        for name in names:
            full = os.path.join(directory, name)
            if os.path.getsize(full) > MAX_CASSETTE_BYTES:
                raise ValueError(f"{full}: larger than {MAX_CASSETTE_BYTES} bytes")
            with open(full, "rb") as f:
                entry = orjson.loads(f.read())
            rq = entry["request"]
            body = rq.get("body", "").encode()
            self.by_key[cassette_key(rq["method"], rq["path"], body)] = entry
            model = _model(body)
            self.by_model.setdefault((rq["path"].removeprefix("/openai"), model), entry)

    def find(self, req: Request) -> dict[str, Any]:
        key = cassette_key(req.method, req.path, req.body)
        hit = self.by_key.get(key)
        if hit is None:
            hit = self.by_model.get((req.path.removeprefix("/openai"), _model(req.body)))
        if hit is None:
            raise E.cassette_not_found.at(key=key)
        return hit


def _model(body: bytes) -> str:
    try:
        m = orjson.loads(body).get("model") if body else None
    except (orjson.JSONDecodeError, AttributeError):
        m = None
    return m if isinstance(m, str) else ""


def _answer(entry: dict[str, Any], speed: float) -> RawResponse | StreamResponse:
    r = entry["response"]
    if "events" in r:
        def plan() -> Iterator[tuple[float, str, Any]]:
            last = 0.0
            for t, frame in r["events"]:
                off = 0.0 if speed <= 0 else max(0.0, (t - last) / speed)
                last = t
                yield off, "frame", frame.encode()
        return StreamResponse(EventStream(plan(), REPLAY, model=_model(
            entry["request"].get("body", "").encode()) or None), status=r["status"])
    return RawResponse(r.get("body", "").encode(), r["status"], r.get("content_type",
                                                                        "application/json"))


def _replay_handler(cassettes: Cassettes, speed: float) -> Any:
    async def handler(req: Request, app: App) -> RawResponse | StreamResponse:
        entry = cassettes.find(req)
        res = _answer(entry, speed)
        if type(res) is RawResponse and speed > 0:
            await app.clock.sleep(entry["response"].get("duration_s", 0.0) / speed)
        return res

    return handler


def register(app: App) -> None:
    """Replace the generation endpoints with the recorder or the player, when configured."""
    cfg = app.config
    if cfg.record_upstream:
        handler = _record_handler(app, cfg.record_upstream, cfg.cassettes or "cassettes")
    elif cfg.replay:
        try:
            cassettes = Cassettes(cfg.replay)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ConfigError(f"replay: cannot load the cassettes in {cfg.replay}: {exc}") \
                from None
        handler = _replay_handler(cassettes, cfg.replay_speed)
    else:
        return
    for path in PATHS:
        app.router.add("POST", path, handler, "cassette", stream_capable=True)
