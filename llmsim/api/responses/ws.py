"""The Responses API's WebSocket mode (``GET /v1/responses`` with ``Upgrade: websocket``), as
the official SDK's ``client.responses.connect()`` speaks it: a mode of the generic WebSocket
connection (:mod:`llmsim.transport.ws`, which owns the socket, the framing and the budgets).

Each ``response.create`` becomes ``Request(method="POST", path="/v1/responses",
transport="ws", ...)`` and goes through ``app.dispatch`` exactly like HTTP (auth, rate-limit,
fault and capacity hooks apply), started as HTTP starts a handler
(:func:`~llmsim.streaming.start.start_handler`, on the loop pass after the read); there is no second
implementation of the Responses logic here. The resulting ``EventStream`` is paced by a
:class:`~llmsim.streaming.flow.Pump` writing through the connection's wire, with ``stream_id`` appended
when the create named a lane. Errors decided before the first event (a ``RawResponse``) become
the SDK's nested ``ResponseWsError`` event and the connection stays open.

Ordering. A *lane* is a ``stream_id`` (or the default lane when none is given). A lane runs one
response at a time, FIFO. Up to ``max_active`` responses of different lanes run at once; the
rest wait in arrival order. Named lanes are capped per connection (``max_lanes`` distinct ids,
as the real service: the count never goes down). Waiting creates are capped (``max_queued``):
beyond it the mode is *busy* and the connection stops reading the socket, so a client that
floods creates is slowed by TCP instead of growing a queue (all decided by the
``LaneScheduler``).

Cache. The most recent completed response of each lane (the whole connection, when no lanes
are used) is kept in the connection's ``ConnectionCache``; each create carries its lane's view
of it as ``Request.context`` (typed ``PreviousResponses``), which the Responses handler
consults for ``previous_response_id`` before its global store (so ``store: false`` chains
work). A same-lane continuation that fails evicts its parent, as the real service does.

Failures. An exception while a response runs (rendering, encoding: anything after dispatch)
never wedges its lane: before the first event it is answered as a 500 error event, after it
the pump writes a terminal error event (with the lane's ``stream_id``); the job ends and the
lane moves on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import APIError, E, server_error
from ...messages import JSONResponse, RawResponse, Request, Result, StreamResponse
from ...routing import WSMode
from ...sim.rng import new_request_id
from ...state import accounting  # per-request accounting shared with HTTP (stats, access log)
from ...streaming.flow import Pump
from ...streaming.start import start_handler
from ...streaming.stream import EventStream
from .render import RESPONSES
from .state import state
from .ws_cache import ConnectionCache
from .ws_events import STREAM_ID_RE, Create, EventError, Steer, parse_client_event
from .ws_lanes import LaneLimitError, LaneScheduler

if TYPE_CHECKING:
    from ..services import Host

__all__ = ["ResponsesWS", "error_event", "STREAM_ID_RE", "PATHS"]

log = logging.getLogger("llmsim")
PATHS = ("/v1/responses", "/openai/v1/responses")
CLIENT_EVENTS = ("response.create", "response.steer")


def error_event(status: int | None, etype: str, message: str, code: str | None = None,
                param: str | None = None, stream_id: str | None = None,
                headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The SDK's ``ResponseWsError``: ``{"type": "error", "status", "error": {...}}``. The
    Open Responses WebSocket error schema requires a string ``code``: an error without one
    gives its type."""
    err: dict[str, Any] = {"type": etype, "code": code if code is not None else etype,
                           "message": message, "param": param}
    if headers:
        err["headers"] = dict(headers)
    ev: dict[str, Any] = {"type": "error", "error": err}
    if status is not None:
        ev["status"] = status
    if stream_id is not None:
        ev["stream_id"] = stream_id
    return ev


def _from_result(res: Result, stream_id: str | None) -> dict[str, Any]:
    """An error Result (decided before the first event) as a WebSocket error event."""
    status = res.status
    e = res.error if type(res) is RawResponse else None
    if e is not None:  # the error object itself: nothing to parse back
        hdrs = {k.lower(): v for k, v in res.headers} if res.headers else None
        return error_event(status, e.type, e.message, e.code, e.param, stream_id, hdrs)
    body: Any = None
    if type(res) is RawResponse:
        try:
            body = orjson.loads(res.body)
        except orjson.JSONDecodeError:
            body = None
    elif type(res) is JSONResponse:
        body = res.data
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        text = res.body.decode("utf-8", "replace") if type(res) is RawResponse else ""
        err = {"message": text or f"Request failed with status {status}.",
               "type": "invalid_request_error" if status < 500 else "server_error"}
    hdrs = {k.lower(): v for k, v in res.headers} if res.headers else None
    return error_event(status, str(err.get("type") or "invalid_request_error"),
                       str(err.get("message") or ""), err.get("code"), err.get("param"),
                       stream_id, hdrs)


# (the frozen slots' setters, as Request.http uses them)
_set_transport = Request.transport.__set__  # type: ignore[attr-defined,misc]
_set_context = Request.context.__set__  # type: ignore[attr-defined,misc]


# ------------------------------------------------------------------------------------------
# The session
# ------------------------------------------------------------------------------------------

class Job:
    """One response running on a lane: the dispatch task, then its pump."""

    __slots__ = ("lane", "req", "prev_id", "task", "pump", "res", "done", "streaming",
                 "endpoint", "track", "answered", "first_step")

    def __init__(self, lane: str | None, req: Request, prev_id: str | None) -> None:
        self.lane = lane  # the stream_id (None: the default lane)
        self.req = req
        self.prev_id = prev_id
        self.task: asyncio.Task[None] | None = None
        self.pump: Pump | None = None
        self.res: StreamResponse | None = None
        self.done = False
        self.streaming = False
        self.endpoint = "responses"
        self.track: Any = None  # the stats StreamTrack while streaming
        self.answered = False  # counted in stats (stream started or error sent)
        self.first_step = False  # its handler runs its first step (start_handler)

    def running(self) -> bool:
        """Not ended (its handler is still wanted)."""
        return not self.done


class ResponsesWS(WSMode):
    """The Responses mode of one connection: its lanes, its jobs, its previous-response
    cache."""

    def __init__(self, app: Host, handshake: Request) -> None:
        self.app = app
        cfg = app.config.websocket
        # which create runs when (pure: ws_lanes); the jobs it started
        self.lanes: LaneScheduler[tuple[Request, str | None]] = LaneScheduler(
            cfg.max_lanes, cfg.max_active, cfg.max_queued)
        self._jobs: set[Job] = set()
        # previous_response_id cache (owned by the Responses state): one per named lane plus
        # the default lane
        self.cache = ConnectionCache(cfg.max_lanes + 1)
        # the connection's own stream, of no events: a numbered event of no response
        # running here (a steer answer) claims its number from it (0, 1, 2, ...); made at
        # the first such event (most connections never steer)
        self._own: EventStream | None = None

    @property
    def own(self) -> EventStream:
        own = self._own
        if own is None:
            own = self._own = EventStream((), RESPONSES)
        return own

    @property
    def busy(self) -> bool:
        return self.lanes.full

    @property
    def idle(self) -> bool:
        return not self._jobs and self.lanes.idle

    def resume(self) -> None:
        for job in list(self._jobs):
            if job.pump is not None:
                job.pump.resume()

    def gone(self) -> None:
        self.cache.clear()

    def error_event(self, err: APIError, **extra: Any) -> dict[str, Any]:
        return error_event(err.status, err.type, err.message, err.code, err.param,
                           extra.get("stream_id"))

    def _reject(self, err: APIError, stream_id: str | None = None) -> None:
        self.conn.send_event(self.error_event(err, stream_id=stream_id))

    def message(self, text: str) -> None:
        try:
            ev = parse_client_event(text)  # (pure: ws_events)
        except EventError as exc:
            self.conn.send_event(error_event(exc.status, exc.type, exc.message, exc.code,
                                             exc.param, exc.stream_id))
            return
        if type(ev) is Create:
            self._on_create(ev)
        else:
            self._on_steer(ev)  # type: ignore[arg-type]

    def _running_stream(self, rid: str) -> Pump | None:
        """The pump of response ``rid`` if it is streaming on this connection (≤ 16 jobs)."""
        for job in self._jobs:
            if (job.streaming and job.pump is not None and job.res is not None
                    and job.res.stream.id == rid):
                return job.pump
        return None

    def _on_steer(self, ev: Steer) -> None:
        """Steering is not simulated: answer with the SDK's ``response.steer.failed``, its
        code as the real API's for the target: ``steering_not_supported`` while it runs
        here, ``response_already_completed`` once it has ended (this connection's cache or
        the store), else ``response_not_found``."""
        # the answer belongs to the steered response's stream when it is running here (the
        # stream numbers it); else to the connection's own stream
        rid = ev.previous_id
        running = self._running_stream(rid)
        if running is not None:
            err = E.steering_not_supported.at()
        elif self.cache.get(rid) is not None or state(self.app).store.get(rid) is not None:
            err = E.steer_response_completed.at(id=rid)
        else:
            err = E.steer_response_not_found.at(id=rid)
        self.conn.send_event({
            "type": "response.steer.failed",
            "sequence_number": running.claim() if running is not None else self.own.claim(),
            "error": {k: v for k, v in err.to_dict().items() if k != "param"},
            "steer": {"input": ev.input, "previous_response_id": rid}})

    def _on_create(self, ev: Create) -> None:
        sid = ev.stream_id
        conn = self.conn
        if conn.draining:
            self._reject(E.server_shutting_down.at(), stream_id=sid)
            return
        hs = conn.handshake
        # (Request.http's fast construction, then the two fields a WebSocket create differs
        # in: the frozen class's constructor sets every field through object.__setattr__)
        req = Request.http("POST", "/v1/responses", hs.query, hs.headers,
                           orjson.dumps(ev.body), new_request_id(), hs.client,
                           self.app.clock.now())
        _set_transport(req, "ws")
        _set_context(req, self.cache.lane(sid))
        try:
            self.lanes.admit(sid, (req, ev.previous_id))
        except LaneLimitError as exc:
            self._reject(E.too_many_websocket_streams.at("stream_id", limit=exc.limit),
                         stream_id=sid)
            return
        self._run_next()

    # -- scheduling --------------------------------------------------------------------------
    def _run_next(self) -> None:
        if self.conn.closing:
            return
        for lane, (req, prev) in self.lanes.take_ready():
            job = Job(lane, req, prev)
            self._jobs.add(job)
            self.app.stats.request_open()
            # (on the next loop pass, with the HTTP requests read meanwhile)
            self.conn.defer(self._start_job, job, None)
        self.conn.maybe_resume_reading()

    def _start_job(self, job: Job, _: None = None) -> None:
        if not job.done:  # (not cancelled meanwhile: _cancel_all ends a job with no task)
            job.task = start_handler(self._run(job), job.running, job)

    async def _run(self, job: Job) -> None:
        app = self.app
        route = None
        try:  # resolve here (not in dispatch) to know the endpoint for stats, as HTTP does
            route, _params = app.resolve(job.req)
            job.endpoint = route.name
        except APIError:
            job.endpoint = "unmatched"  # dispatch answers 404/405
        try:
            res = await app.dispatch(job.req, route)
        except asyncio.CancelledError:
            self._job_done(job, "cancelled")
            return
        except Exception:  # dispatch decides errors itself; this is a bug guard
            log.exception("websocket dispatch failed")
            res = RawResponse(server_error().body(), status=500)
        job.task = None
        try:
            self._answer(job, res)
        except Exception:  # rendering, encoding, accounting: the lane must move on
            log.exception("websocket response failed")
            self._job_failed(job)

    def _job_failed(self, job: Job) -> None:
        """An exception after dispatch: a 500 error event (terminal: its stream, if it had
        started, is over) and the job ends, releasing its stream and request gauges."""
        if job.done:
            return
        err = server_error()
        ev = error_event(500, err.type, err.message, err.code, stream_id=job.lane)
        if job.streaming and job.res is not None:
            ev["sequence_number"] = (job.pump.claim() if job.pump is not None
                                     else job.res.stream.claim())
        try:
            self.conn.send_event(ev)
            if job.pump is not None:
                job.pump.cancel("error")  # → _pump_done: releases the stream and the job
            self._close_stream(job, "error")
            if not job.answered:
                self._account(job, RawResponse(err.body(), status=500))
        except Exception:
            log.exception("cannot end the failed response")
        finally:
            self._job_done(job, "error")

    def _answer(self, job: Job, res: Result) -> None:
        sid = job.lane
        if type(res) is StreamResponse:
            job.res = res  # type: ignore[assignment]
            if job.done or self.conn.closing:
                res.stream.close()  # type: ignore[union-attr]
                self._close_stream(job, "cancelled")  # never pumped: still release it
                self._job_done(job, "cancelled")
                return
            self._start_pump(job, res)  # type: ignore[arg-type]
            return
        if job.done or self.conn.closing:
            self._job_done(job, "cancelled")
            return
        if getattr(res, "abort", False):  # fault injection: drop the connection
            self._account(job, res)
            self._job_done(job, "disconnect")
            self.conn.wire.abort()
            return
        if res.status < 400:
            log.error("the Responses handler answered a WebSocket create without a stream")
            res = RawResponse(server_error().body(), status=500)
        self.cache.continuation_failed(sid, job.prev_id)
        self._account(job, res)
        self.conn.send_event(_from_result(res, sid))
        self._job_done(job, "error")

    def _account(self, job: Job, res: Result) -> None:
        job.answered = True
        accounting.response_sent(self.app, job.req, job.endpoint, res.status, res,
                                 transport="ws")

    def _start_pump(self, job: Job, res: StreamResponse) -> None:
        sid = job.lane
        suffix = b',"stream_id":"' + sid.encode() + b'"}' if sid is not None else None
        ws_text = res.stream.dialect.ws
        if ws_text is None:  # (only families with a WebSocket mode are dispatched here)
            raise TypeError(f"{res.stream.dialect} has no WebSocket mode")
        prev = job.prev_id
        enc: Callable[[str, Any], bytes]
        if suffix is None and prev is None:
            # nothing to add to the dialect's frames and no continuation to evict at a
            # response.failed: its encoder itself (the pump's facts for it are cached)
            enc = ws_text
        else:
            def enc(etype: str, data: Any) -> bytes:
                b = ws_text(etype, data)
                if etype == "response.failed":
                    self.cache.continuation_failed(sid, prev)
                if suffix is not None and b[-1:] == b"}":
                    return b[:-1] + suffix if len(b) > 2 else b"{" + suffix[1:]
                return b

            if suffix is None and hasattr(ws_text, "bytes_frame"):
                # a token event (the dialect's template, never response.failed) is its own
                # payload then: the pump renders runs without calling enc (issue 15)
                enc.bytes_frame = ws_text.bytes_frame  # type: ignore[attr-defined]

        def error_frame(err: APIError, seq: int) -> bytes:
            ev = error_event(500, err.type, err.message, err.code, stream_id=sid)
            ev["sequence_number"] = seq
            return orjson.dumps(ev)

        job.streaming = True
        job.answered = True
        job.track = accounting.stream_started(self.app, job.req, job.endpoint, res,
                                              transport="ws")
        job.pump = Pump(res.stream, self.app.clock, enc, self.conn.wire,
                        lambda reason: self._pump_done(job, reason), job.track.observe,
                        error_frame)
        # (a handler that has not suspended: the schedule counts from the create's arrival,
        # Pump.start)
        job.pump.start(job.req.received_at if job.first_step else None)  # never raises

    def _pump_done(self, job: Job, reason: str) -> None:
        self._close_stream(job, reason)
        self._job_done(job, reason)

    def _close_stream(self, job: Job, reason: str) -> None:
        accounting.close_job_stream(self.app, job, reason)

    def _job_done(self, job: Job, reason: str) -> None:
        if job.done:
            return
        job.done = True
        job.pump = None
        if not job.answered:
            accounting.request_gone(self.app, job.req, job.endpoint, transport="ws")
        self._jobs.discard(job)
        self.app.stats.request_close()
        self.lanes.finish(job.lane)
        conn = self.conn
        if not conn.closing:
            self._run_next()
            if conn.draining and self.idle:
                conn.close(1001, "server shutting down")

    def stop(self, reason: str = "cancelled") -> None:
        """Stop every running response and forget queued ones (client gone or closing)."""
        self.lanes.drop_queued()
        for job in list(self._jobs):
            if job.pump is not None:
                job.pump.cancel(reason)  # → _pump_done(reason)
            elif job.task is not None and not job.task.done():
                job.task.cancel()  # → _run sees CancelledError → _job_done
            if not job.task and job.pump is None and not job.done:
                self._job_done(job, reason)
