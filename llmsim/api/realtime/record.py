"""Record and replay Realtime sessions (docs/record-replay.md, "The Realtime API").

**Record** (:class:`RealtimeProxy`, the mode of ``/v1/realtime`` when recording): the client's
WebSocket is joined to the upstream's (``ws://`` or ``wss://`` as the base URL is http or
https, :class:`~llmsim.api.upstream.WSLink`) with the headers of :data:`FORWARD_HEADERS` and
the query. Events pass through both ways as they come. The client's events feed the session's
:class:`~.tape.Tape`; each upstream response (``response.created`` to ``response.done``) is
kept with its events' offsets from the event that asked for it (the client's
``response.create``, or the server VAD's commit). When either side leaves, the session is
written as one cassette. Bounded: the stored bytes (client events and server events) by
``--record-max-bytes`` per session and ``--record-budget-bytes`` per recording run, the
events by :data:`~.tape.MAX_EVENTS`, one upstream message by the WebSocket message limit.

**Replay** (:class:`RealtimeReplay`): the simulated Realtime session (session, conversation,
audio buffer and VAD run as without cassettes) answers each response from the recorded one
whose key matches the session's client events so far, its events at their recorded offsets
divided by ``--replay-speed``, with fresh response and item ids (the same recorded id always
becomes the same new one, the first item's ``previous_item_id`` the conversation's last);
a miss is the response's ``error`` event naming the nearest recorded session.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import APIError, E
from ...messages import Request, Result, StreamResponse
from ...routing import Route, WSMode
from ...sim.decide import Usage
from ...sim.rng import new_id
from ...streaming.stream import EventStream
from ..cassette import KEEP_REQUEST, RECORDER, Recorder
from ..upstream import WSLink
from . import DIALECT, ENDPOINT, PATHS, Item, Job, RealtimeWS, _fail, error_event
from . import tape as _tape
from .audio import bytes_per_ms
from .tape import MAX_EVENTS, Tape, file_name

if TYPE_CHECKING:
    from ..services import Host, Services

__all__ = ["RealtimeProxy", "RealtimeReplay", "register", "FORWARD_HEADERS"]

log = logging.getLogger("llmsim.cassette")

# the handshake headers sent on to the upstream (credentials among them; none is stored)
FORWARD_HEADERS = frozenset(("authorization", "api-key", "openai-organization",
                             "openai-project", "openai-beta", "user-agent"))
QUEUE_MAX = 256  # client messages held while the upstream handshake runs
HIGH_WATER = 1 << 20  # bytes queued for the upstream before the client is read no further
REMAPPED = frozenset(("id", "item_id", "response_id", "previous_item_id"))
# client events an upstream error must be matched to (given an event_id when they have none)
TRACKED = frozenset(("response.create", "input_audio_buffer.commit"))


def _query_model(handshake: Request) -> str:
    return (handshake.query.get("model") or [""])[0][:256]


def _path(handshake: Request) -> str:
    p = handshake.path
    return p.rstrip("/") if len(p) > 1 else p


# ------------------------------------------------------------------------------------------
# Record
# ------------------------------------------------------------------------------------------

class _Trigger:
    """What asked for a response: the key then, where the tape stood, when."""

    __slots__ = ("key", "cut", "t0", "event_id")

    def __init__(self, key: str, cut: int, t0: float, event_id: str | None) -> None:
        self.key, self.cut, self.t0, self.event_id = key, cut, t0, event_id


class _Capture:
    """One upstream response being recorded."""

    __slots__ = ("trigger", "events", "items")

    def __init__(self, trigger: _Trigger) -> None:
        self.trigger = trigger
        self.events: list[list[Any]] = []
        self.items: set[str] = set()


class RealtimeProxy(WSMode):
    """The recording mode of one connection (see the module doc)."""

    def __init__(self, app: Host, handshake: Request) -> None:
        rec = app.feature(RECORDER)
        assert rec is not None
        self.app = app
        self.rec: Recorder = rec
        self.handshake = handshake
        self.path = _path(handshake)
        self.model = _query_model(handshake)
        self.tape = Tape(self.path, self.model, rec.store.ignore)
        self.link: WSLink | None = None
        self.opened = False  # the upstream accepted the handshake
        self.task: asyncio.Task[None] | None = None
        self.drainer: asyncio.Task[None] | None = None
        self.queue: list[str] = []  # client messages before the upstream is open
        self.queued = 0
        self.triggers: deque[_Trigger] = deque()  # client response.create events, in order
        self.auto: _Trigger | None = None  # the last turn the server VAD committed
        self.commits: deque[str | None] = deque()  # client commits not yet acknowledged
        self.captures: dict[str, _Capture] = {}
        self.saved: list[tuple[_Trigger, list[list[Any]]]] = []
        self.stored = 0  # bytes of server events kept
        self.events = 0
        self.resumed = asyncio.Event()
        self.resumed.set()
        self.ended = False
        self.ids = 0  # event ids given to the client's tracked events

    # -- WSMode ------------------------------------------------------------------------------
    def attach(self, conn: Any) -> None:
        super().attach(conn)
        self.task = self._spawn(self._run())

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self.rec.tasks.add(task)
        task.add_done_callback(self.rec.tasks.discard)
        return task

    def error_event(self, err: APIError, **extra: Any) -> dict[str, Any]:
        return error_event(err, extra.get("event_id"))

    def resume(self) -> None:
        self.resumed.set()

    def stop(self, reason: str) -> None:
        for t in (self.task, self.drainer):
            if t is not None and not t.done() and t is not asyncio.current_task():
                t.cancel()

    def gone(self) -> None:
        self._end()

    @property
    def busy(self) -> bool:
        if not self.opened:
            return len(self.queue) >= QUEUE_MAX or self.queued > HIGH_WATER
        return self.link is not None and self.link.buffered() > HIGH_WATER

    @property
    def idle(self) -> bool:
        return not self.captures and not self.triggers

    # -- client → upstream -------------------------------------------------------------------
    def message(self, text: str) -> None:
        if self.ended:
            return
        try:
            msg = orjson.loads(text)
        except orjson.JSONDecodeError:
            msg = None  # (passed on: the upstream answers it)
        if isinstance(msg, dict):
            if msg.get("type") in TRACKED and "event_id" not in msg:
                # an id of ours, so an error the upstream answers it with names it
                self.ids += 1
                msg["event_id"] = f"event_llmsim_{self.ids}"
                text = orjson.dumps(msg).decode()
            try:
                self._client(msg)
            except APIError as err:
                self._abort(err)
                return
        if not self.opened:
            self.queue.append(text)
            self.queued += len(text)
            return
        link = self.link
        assert link is not None
        link.send(text)
        if link.buffered() > HIGH_WATER and (self.drainer is None or self.drainer.done()):
            self.drainer = self._spawn(self._drain(link))

    def _client(self, msg: dict[str, Any]) -> None:
        try:
            self.tape.client(msg)
        except OverflowError:
            raise E.realtime_record_too_long.at(what="client events",
                                                limit=_tape.MAX_TAPE_EVENTS) from None
        t = msg.get("type")
        eid = msg.get("event_id") if isinstance(msg.get("event_id"), str) else None
        if t == "response.create":
            key = self.tape.cut()
            self.triggers.append(_Trigger(key, len(self.tape.events), time.monotonic(), eid))
        elif t == "input_audio_buffer.commit":
            self.commits.append(eid)
        self._check()

    def _check(self) -> None:
        if self.tape.size + self.stored > self.rec.max_bytes:
            raise E.cassette_too_large.at(limit=self.rec.max_bytes)
        if self.events > MAX_EVENTS:
            raise E.realtime_record_too_long.at(what="server events", limit=MAX_EVENTS)

    async def _drain(self, link: WSLink) -> None:
        await link.drain()
        if not self.ended:
            self.conn.maybe_resume_reading()

    # -- upstream → client -------------------------------------------------------------------
    async def _run(self) -> None:
        code, reason = 1011, "the upstream connection ended"
        try:
            up = self.rec.upstream(self.path)
            self.link = link = WSLink(up, self.app.config.websocket.max_message_bytes)
            headers = [(k, v) for k, v in self.handshake.headers.items()
                       if k in FORWARD_HEADERS]
            await link.open(up.target(self.path, self.handshake.query), headers)
            self.opened = True
            for held in self.queue:
                link.send(held)
            self.queue, self.queued = [], 0
            self.conn.maybe_resume_reading()
            while True:
                text = await link.recv()
                if text is None:
                    break
                self._upstream(text)
                if self.conn.closing:
                    return
                if self.conn.paused:  # the client reads slowly: so do we
                    self.resumed.clear()
                    await self.resumed.wait()
            code = link.close_code or 1006
            reason = link.close_reason
            if self.captures:
                self.conn.reject(E.upstream_error.at(
                    base=up.base, reason="it closed the connection mid-response"))
        except APIError as err:
            if not self.conn.closing:
                self.conn.reject(err)
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug: the session ends, never hangs
            log.exception("recording a Realtime session failed")
        finally:
            self._end()
        if not self.conn.closing:
            # the upstream's own close code when a client may see it, else 1011
            ok = code in (1000, 1001, 1008, 1009, 1011) or 3000 <= code <= 4999
            self.conn.close(code if ok else 1011, reason or "the upstream connection ended")

    def _upstream(self, text: str) -> None:
        self.conn.wire.write_events([text.encode()])  # live, before anything else
        try:
            ev = orjson.loads(text)
        except orjson.JSONDecodeError:
            return
        if not isinstance(ev, dict):
            return
        t = ev.get("type")
        now = time.monotonic()
        if t == "input_audio_buffer.committed":
            if self.commits:
                self.commits.popleft()
            else:  # the server VAD ended a turn
                self.tape.server_turn()
                self.auto = _Trigger(self.tape.cut(), len(self.tape.events), now, None)
            return
        if t == "error":
            err = ev.get("error")
            eid = err.get("event_id") if isinstance(err, dict) else None
            if eid is not None:
                self.triggers = deque(x for x in self.triggers if x.event_id != eid)
                if eid in self.commits:
                    self.commits.remove(eid)
                return
        resp = ev.get("response")
        rid = resp.get("id") if isinstance(resp, dict) else ev.get("response_id")
        if t == "response.created" and isinstance(rid, str):
            if self.triggers:
                trig = self.triggers.popleft()
            elif self.auto is not None:
                trig, self.auto = self.auto, None
            else:  # (a response nothing visible asked for)
                trig = _Trigger(self.tape.cut(), len(self.tape.events), now, None)
            self.captures[rid] = _Capture(trig)
        cap = self.captures.get(rid) if isinstance(rid, str) else None
        if cap is None and self.captures:
            if t in ("conversation.item.added", "conversation.item.done"):
                item = ev.get("item")
                iid = item.get("id") if isinstance(item, dict) else None
                cap = next((c for c in self.captures.values() if iid in c.items), None)
            elif t in ("rate_limits.updated", "error"):
                cap = next(reversed(self.captures.values()))
        if cap is None:
            return
        if t == "response.output_item.added":
            item = ev.get("item")
            if isinstance(item, dict) and isinstance(item.get("id"), str):
                cap.items.add(item["id"])
        cap.events.append([round(min(now - cap.trigger.t0, 3600.0), 6), ev])
        self.stored += len(text) + 16
        self.events += 1
        self._check()
        if t == "response.done" and isinstance(rid, str):
            del self.captures[rid]
            status = resp.get("status") if isinstance(resp, dict) else None
            if status != "failed" or self.rec.record_errors:
                self.saved.append((cap.trigger, cap.events))
            conn = self.conn
            if conn.draining and not conn.closing and self.idle:  # a graceful shutdown
                conn.close(1001, "server shutting down")

    # -- the end ------------------------------------------------------------------------------
    def _abort(self, err: APIError) -> None:
        """A bound was hit: the client gets ``err``, then the session closes."""
        if not self.conn.closing:
            self.conn.reject(err)
            self.conn.close(1011, "recording bound reached")
        self._end()

    def _end(self) -> None:
        """Close the upstream, stop the tasks, write the session (once, on every path)."""
        if self.ended:
            return
        self.ended = True
        self.stop("ended")
        if self.link is not None:
            self.link.close()
        self.queue, self.queued = [], 0
        self.captures.clear()
        self.triggers.clear()
        saved, self.saved = sorted(self.saved, key=lambda s: s[0].cut), []
        if not saved:
            return
        store = self.rec.store
        if self.rec.mode in ("new_episodes", "once") and all(
                trig.key in store.realtime for trig, _ in saved):
            return  # nothing new
        responses = []
        last = 0
        for trig, events in saved:
            responses.append({"client": self.tape.events[last:trig.cut], "events": events})
            last = trig.cut
        entry = {"version": 2, "kind": "realtime", "path": self.path, "model": self.model,
                 "headers": {k: v for k, v in self.handshake.headers.items()
                             if k in KEEP_REQUEST},
                 "responses": responses}
        try:
            self.rec.write(file_name(self.model, saved[-1][0].key), entry)
        except RuntimeError:  # (the loop or its executor is shutting down)
            log.warning("the Realtime session %s was not written: the server is stopping",
                        saved[-1][0].key[:12])


# ------------------------------------------------------------------------------------------
# Replay
# ------------------------------------------------------------------------------------------

async def _replayed(req: Request, app: Services) -> Result:
    """The replay route's handler: the recorded response whose key this one has."""
    job: Job = req.context
    mode = job.mode
    assert isinstance(mode, RealtimeReplay)
    key, cut = mode.keys.pop(job.id, ("", 0))
    store = mode.rec.store
    hit = store.realtime.get(key)
    if hit is None:
        raise E.realtime_cassette_not_found.at(
            key=key, nearest=store.realtime_nearest(mode.path, mode.qmodel,
                                                    mode.tape.events[:cut]))
    recorded = hit[0]["events"]
    u = recorded[-1][1]["response"].get("usage")
    u = u if isinstance(u, dict) else {}

    def num(d: Any, k: str) -> int:
        v = d.get(k) if isinstance(d, dict) else None
        return v if type(v) is int and v >= 0 else 0

    usage = Usage(num(u, "input_tokens"), num(u, "output_tokens"), 0,
                  num(u.get("input_token_details"), "cached_tokens"))
    stream = EventStream(_replay_plan(job, mode, recorded, mode.rec.speed), DIALECT,
                         model=job.model, usage=usage, fail=lambda err: _fail(job, err))
    return StreamResponse(stream, usage=usage)


REPLAY_ROUTE = Route("POST", "/v1/realtime", _replayed, ENDPOINT, stream_capable=True,
                     streaming=True)


def _remap(obj: Any, ids: dict[str, str | None]) -> Any:
    if isinstance(obj, dict):
        return {k: (ids[v] if k in REMAPPED and isinstance(v, str) and v in ids
                    else _remap(v, ids)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_remap(x, ids) for x in obj]
    return obj


def _text_of(item: dict[str, Any]) -> str:
    if item.get("type") == "function_call":
        return f"{item.get('name', '')} {item.get('arguments', '')}"
    parts = item.get("content")
    out = []
    for p in parts if isinstance(parts, list) else []:
        if isinstance(p, dict):
            v = p.get("text") or p.get("transcript")
            if isinstance(v, str):
                out.append(v)
    return "\n".join(out)


def _replay_plan(job: Job, mode: RealtimeReplay, recorded: list[Any],
                 speed: float) -> Iterator[tuple[float, str, Any]]:
    """The recorded events with fresh ids, at their offsets / ``speed``; the output items
    join the conversation as they do when simulated."""
    ids: dict[str, str | None] = {}
    prev_local = mode.last_id() if job.write else None
    for _, ev in recorded:
        t = ev["type"]
        r = ev.get("response")
        if t == "response.created" and isinstance(r, dict) and isinstance(r.get("id"), str):
            ids[r["id"]] = job.id
        elif t == "response.output_item.added" and isinstance(ev.get("item"), dict):
            iid = ev["item"].get("id")
            if isinstance(iid, str) and iid not in ids:
                ids[iid] = new_id("item_")
    for _, ev in recorded:  # what the first item followed there, it follows here
        p = ev.get("previous_item_id")
        if isinstance(p, str) and p not in ids:
            ids[p] = prev_local
    per_ms = bytes_per_ms(job.fmt.get("type", "audio/pcm"))
    last = 0.0
    for t, ev in recorded:
        wait = 0.0 if speed <= 0 else max(0.0, (t - last) / speed)
        last = t
        data = _remap(ev, ids)
        etype = data.pop("type")
        data.pop("event_id", None)
        item = data.get("item")
        if etype == "response.output_item.added" and isinstance(item, dict) and job.write \
                and isinstance(item.get("id"), str) and item["id"] not in mode.items:
            mode.add_item(Item(dict(item), ""), emit=False)
        elif etype == "response.output_audio.delta" and isinstance(data.get("delta"), str):
            it = mode.items.get(data.get("item_id"))  # type: ignore[arg-type]
            if it is not None:  # (so a client can truncate what it has played)
                b64 = data["delta"]
                it.audio_ms += (len(b64) * 3 // 4 - b64[-2:].count("=")) // per_ms
        elif etype == "response.output_item.done" and isinstance(item, dict):
            mode.fill_item(item)
            job.output.append(item)
        elif etype == "response.done":
            job.ended = True
        yield wait, etype, data


class RealtimeReplay(RealtimeWS):
    """The simulated Realtime session whose responses come from the cassettes."""

    route = REPLAY_ROUTE

    def __init__(self, app: Host, handshake: Request) -> None:
        super().__init__(app, handshake)
        rec = app.feature(RECORDER)
        assert rec is not None
        self.rec: Recorder = rec
        self.path = _path(handshake)
        self.qmodel = _query_model(handshake)
        self.tape = Tape(self.path, self.qmodel, rec.store.ignore)
        self.keys: dict[str, tuple[str, int]] = {}  # job id → its key and tape position
        self._client_commit = False

    def message(self, text: str) -> None:
        try:
            msg = orjson.loads(text)
        except orjson.JSONDecodeError:
            msg = None
        if isinstance(msg, dict):
            try:
                self.tape.client(msg)
            except OverflowError:
                self.conn.reject(E.realtime_record_too_long.at(
                    what="client events", limit=_tape.MAX_TAPE_EVENTS))
                self.conn.close(1008, "more client events than a cassette key holds")
                return
        self._client_commit = isinstance(msg, dict) and msg.get(
            "type") == "input_audio_buffer.commit"
        try:
            super().message(text)
        finally:
            self._client_commit = False

    def _commit(self, speech_ms: int) -> None:
        if not self._client_commit:  # the VAD's turn (as the recorder saw it)
            self.tape.server_turn()
        super()._commit(speech_ms)

    def _create(self, r: dict[str, Any], auto: bool = False) -> None:
        before = self.job
        super()._create(r, auto)
        job = self.job
        if job is not None and job is not before:
            self.keys[job.id] = (self.tape.cut(), len(self.tape.events))

    def _job_done(self, job: Job, reason: str) -> None:
        self.keys.pop(job.id, None)
        super()._job_done(job, reason)

    def fill_item(self, data: dict[str, Any]) -> None:
        """A replayed output item is done: its final form in the conversation."""
        it = self.items.get(data.get("id"))  # type: ignore[arg-type]
        if it is None:
            return
        it.data = data
        it.text = _text_of(data)
        chars = len(it.text) + 64
        self.chars += chars - it.chars
        it.chars = chars


def register(app: Host) -> None:
    """With record/replay configured, the Realtime paths record (a proxy) or replay."""
    rec = app.feature(RECORDER)
    if rec is None:
        return
    app.router.add_ws(PATHS, RealtimeReplay if rec.replay_only else RealtimeProxy)
