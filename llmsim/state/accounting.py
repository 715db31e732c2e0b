"""Per-request accounting shared by the transports (HTTP in ``protocol.py``, WebSocket).

One call per request outcome: :func:`response_sent` for a complete response,
:func:`stream_started` / :func:`stream_ended` around a stream (the returned
:class:`~llmsim.state.stats.StreamTrack` observes every write through the pump), and
:func:`request_gone` when the client left before any answer. Each counts the request once in
:class:`~llmsim.state.stats.Stats` and writes the access-log line when that log is enabled.

Billed tokens are counted here too, never by the simulation: an answer carries its decided
:class:`~llmsim.sim.decide.Usage` (``JSONResponse.usage`` / ``StreamResponse.usage``) and
bills it when it is delivered whole (a JSON answer sent, a stream ended ``"completed"``);
a background response, which no transport writes, bills through :func:`billed` when its
pump completes.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..errors import APIError
from ..messages import JSONResponse, Key, Request, StreamResponse
from .logs import ACCESS, INFO, access
from .stats import StreamTrack, error_kind, usage_tokens

if TYPE_CHECKING:
    from ..config import Config
    from ..sim.decide import Usage
    from ..streaming.clock import Clock
    from .stats import Stats


class RequestWatch(Protocol):
    """What watches every answer (the client verdict and journal, api/clients.py)."""

    watched: int
    journal: Any
    chains: Any

    def answered(self, req: Request, status: int, headers: Sequence[tuple[str, str]],
                 stream: bool = False) -> None: ...

    def gone(self, req: Request) -> None: ...

    def stream_ended(self, req: Request, reason: str) -> None: ...


T = TypeVar("T")


class Host(Protocol):
    """The app as accounting needs it (``llmsim.app.App`` is one)."""

    @property
    def config(self) -> Config: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def stats(self) -> Stats: ...

    def feature(self, key: Key[T]) -> T | None: ...


# the RequestWatch, when something watches every answer (App.features)
WATCH: Key[RequestWatch] = Key("accounting.watch")


def _watch(app: Host) -> RequestWatch | None:
    return app.feature(WATCH)

__all__ = ["response_sent", "stream_started", "stream_ended", "request_gone", "billed"]

QUIET = frozenset({"llmsim.stats", "llmsim.stats.reset", "metrics", "llmsim.dashboard"})
"""Endpoints left out of the request counters: they observe the load, they are not load."""
GONE_STATUS = 499  # nginx's "client closed request": the client left before the answer


def response_sent(app: Host, req: Request, endpoint: str, status: int, res: Any,
                  transport: str = "http") -> None:
    """A complete response (JSON or raw) was written; ``res`` may be None (protocol errors)."""
    watch = _watch(app)
    if watch is not None and (watch.watched or status >= 400 or watch.journal is not None
                              or not status):
        watch.answered(req, status, getattr(res, "headers", None) or [])
    if endpoint in QUIET:
        if ACCESS.isEnabledFor(INFO):
            access(req.method, req.path, None, status, 0, 0, None,
                   app.clock.now() - req.received_at, transport, req.request_id, req.client)
        return
    model = None
    pt = ot = 0
    err = None
    if type(res) is JSONResponse:
        model = res.model
        data = res.data
        if type(data) is dict:
            if model is None:
                m = data.get("model")
                model = m if type(m) is str else None
            u = data.get("usage")
            if u is not None:
                pt, ot = usage_tokens(u)
            if status >= 400:
                err = error_kind(status, data)
        if res.usage is not None and status < 400:
            billed(app, res.usage)
    elif status >= 400:
        e = getattr(res, "error", None)
        err = (e.code or e.type)[:64] if e is not None and (e.code or e.type) else \
            error_kind(status, getattr(res, "body", None))
    if model is None and status >= 400:  # refused before generation: keep the model label
        model = request_model(req)
    stats = app.stats
    stats.record(endpoint, model, transport, status, err)
    now = app.clock.now()
    if model:
        stats.delivered(model, pt, ot, now - req.received_at if status < 400 else None)
    if ACCESS.isEnabledFor(INFO):
        access(req.method, req.path, model, status, pt, ot, None, now - req.received_at,
               transport, req.request_id, req.client)


MODEL_PEEK_BYTES = 64 * 1024  # a refused request's body is read for its model up to this size


def request_model(req: Request) -> str | None:
    """The ``model`` a request named (for the stats label of an answer that has none: a
    validation 400, an injected 429/500): the request's one parse (``Request.json``; a body
    nobody parsed yet is parsed only when small), else a ``{model}`` path parameter (Gemini,
    Bedrock, Azure deployments)."""
    path_model = req.params.get("model") or None
    if not req.body or (not req.parsed and len(req.body) > MODEL_PEEK_BYTES):
        return path_model
    try:
        body = req.json()
    except APIError:
        return path_model
    m = body.get("model") if type(body) is dict else None
    return m if type(m) is str and m else path_model


def request_gone(app: Host, req: Request, endpoint: str, transport: str = "http") -> None:
    """The client went away before any byte of the answer (counted as status 499)."""
    watch = _watch(app)
    if watch is not None:
        watch.gone(req)
    app.stats.record(endpoint, None, transport, GONE_STATUS, "client_disconnect")
    if ACCESS.isEnabledFor(INFO):
        access(req.method, req.path, None, GONE_STATUS, 0, 0, None,
               app.clock.now() - req.received_at, transport, req.request_id, req.client)


def stream_started(app: Host, req: Request, endpoint: str, res: StreamResponse,
                   transport: str = "sse") -> StreamTrack:
    """The stream's head was written: count the request, open the stream gauges and return
    the track whose ``observe`` the pump must call for every written event."""
    stream = res.stream
    u = stream.usage
    track = app.stats.stream_started(endpoint, stream.model, transport, res.status,
                                     req.received_at, stream.dialect.is_token,
                                     u.prompt_tokens if u is not None else 0)
    track.usage = res.usage
    watch = app.feature(WATCH)
    if watch is not None and (watch.watched or watch.journal is not None):
        watch.answered(req, res.status, res.headers, stream=True)
    return track


def stream_ended(app: Host, req: Request, track: StreamTrack, reason: str,
                 status: int = 200) -> None:
    """The stream ended (any reason): close its gauges, record e2e, log it. Idempotent."""
    if track.done:
        return
    now = app.clock.now()
    track.finish(reason, now)
    watch = app.feature(WATCH)
    if watch is not None and (reason != "completed" or watch.journal is not None
                              or watch.chains):
        watch.stream_ended(req, reason)
    u = track.usage
    if u is not None and reason == "completed":
        app.stats.usage(u.prompt_tokens, u.output_tokens, u.reasoning_tokens)  # (billed)
    if ACCESS.isEnabledFor(INFO):
        access(req.method, req.path, track.key or None, status, track.prompt, track.tokens,
               track.ttft, now - track.t0, track.transport, req.request_id, req.client,
               end=reason)



class StreamJob(Protocol):
    """A WebSocket job whose answer streams (the Responses and Realtime modes)."""

    streaming: bool
    track: Any  # the StreamTrack while streaming
    res: StreamResponse | None

    @property
    def req(self) -> Request | None: ...


def close_job_stream(app: Host, job: StreamJob, reason: str) -> None:
    """A WebSocket job's stream ended: close its accounting, then release what its response
    holds (``on_close``), each at most once."""
    if job.streaming:
        job.streaming = False
        assert job.req is not None
        stream_ended(app, job.req, job.track, reason)
        job.track = None
    res, job.res = job.res, None
    cb = res.on_close if res is not None else None
    if cb is not None:
        try:
            cb(reason)
        except Exception:
            logging.getLogger("llmsim").exception("stream close callback failed")


def billed(app: Host, usage: Usage) -> None:
    """An answer was delivered whole: count the tokens it bills."""
    app.stats.usage(usage.prompt_tokens, usage.output_tokens, usage.reasoning_tokens)
