"""``--engine PROFILE``: the serving engine (:mod:`llmsim.sim.engine`) behind the API routes.

Theory of operation. Each model gets an :class:`~llmsim.sim.engine.Engine` of the chosen
profile (``[capacity.models."id"] engine = "..."`` overrides it per model). A generation
request that finds the engine's waiting queue full is refused in ``before`` (the capacity
model's error: 429 or 503 as ``--capacity-reject-status``). Otherwise the handler decides the
answer as always, and the answer joins the engine as a sequence of its prompt (the prompt
cache's ``cached_tokens`` skip prefill) and its output tokens:

- a stream's plan is wrapped (:func:`_paced`): each token event (the dialect's
  ``is_token``) waits for the step that produces its token, its offset rewritten so its
  deadline is that step's end; the pump writes it then, as it writes any event. An event
  the plan spaced out that carries no token (the role chunk at the first token, a tool
  call's head) waits for the next token's step and goes with it. While that step is not yet known (the sequence is queued, prefilling in
  chunks or preempted) the wrapper hands the pump a control item due when the step in flight
  ends, and looks again then (the pump ignores control items it does not know). The hidden
  reasoning tokens come first: the first visible event is the engine's token
  ``reasoning_tokens``.
- a non-streamed answer waits for its sequence to finish (``deliver_after``).
- an embeddings request (:data:`PREFILL_ONLY` routes) is a prefill-only sequence: its answer
  is held until its prompt is computed.

Hosted models on the scheduler. Without ``--engine``, a model with capacity on
(``--capacity-max-seqs``, not ``--latency instant``) gets an engine derived from its own
latency profile (:func:`~llmsim.sim.engine.hosted_profile`). Each request joins it with a
*lead*: its own time to the first token (the plan's, jitter included; for a held answer, its
whole time) less what the engine would take for it alone, so a request alone is timed as
without the engine and one among many waits for the steps it shares. The slot model
(``api/faults.Capacity``) keeps the requests this scheduler does not take (:meth:`takes`).

The engine itself never reads the clock: a timer at each step's end advances it, and every
question about a sequence advances it first, so the order in which the clock fires the two
does not matter. The stream's end (completed, cancelled, disconnected) ends the sequence.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import APIError, E
from ..messages import JSONResponse, Request, Result, StreamResponse
from ..routing import Route
from ..sim.engine import DONE, Engine, EngineProfile, Seq, hosted_profile, profile
from ..sim.faults import retry_headers
from ..streaming.stream import TokenRun, close_plan
from .faults import CAPACITY, _body
from .validate import SERVING

if TYPE_CHECKING:
    from ..sim.decide import Usage
    from ..streaming.clock import Timer
    from ..streaming.stream import EventStream, PlanItem
    from .services import Host, Services

__all__ = ["SERVING", "Serving", "register", "ENGINE_WAIT", "max_tokens_of", "PREFILL_ONLY"]

ENGINE_WAIT = "_engine"  # the control item a paced stream waits on (flow.Pump ignores it)
MAX_ENGINES = 1024  # models with engines (ids come from clients: the rest share one set)
RANK_HEADER = "x-data-parallel-rank"  # vLLM's: which data-parallel engine serves a request
_MAX_TOKEN_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
PREFILL_ONLY = frozenset(("embeddings",))  # routes whose requests only prefill (by name)
PEEK = 64  # plan events read ahead for a stream's time to first token (a work bound)


def max_tokens_of(body: Any) -> int | None:
    """The request's output limit, for the finish reason (``length``) in the metrics."""
    if isinstance(body, dict):
        for k in _MAX_TOKEN_KEYS:
            v = body.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                return v
    return None


class Serving:
    """The engines of one app and the hooks that put requests through them."""

    def __init__(self, app: Host) -> None:
        self.app = app
        cfg = app.config
        self.default = cfg.engine
        self.per_model = {m: s.engine for m, s in cfg.capacity.models.items()
                          if s.engine is not None}
        self.ranks = app.config.data_parallel
        self.capacity = cfg.capacity
        self.watcher = app.feature(CAPACITY)  # the queue's departure watch
        self.engines: dict[str, list[Engine]] = {}  # model → its engine per rank
        self._armed: dict[Engine, float] = {}  # engine → deadline of its armed timer
        self._timers: dict[Engine, Timer] = {}
        # a step "has ended" when it ends within the clock's coalescing window: the clock
        # runs timers (the engine's, the pumps') that early, and nothing must wait on them
        self.slack = float(getattr(app.clock, "coalesce", 0.0)) + 1e-9

    # -- engines ---------------------------------------------------------------------------

    def ranks_of(self, model: str) -> list[Engine] | None:
        """The engines of ``model``, one per data-parallel rank (None: not served by one)."""
        engs = self.engines.get(model)
        if engs is not None:
            return engs
        name = self.per_model.get(model, self.default)
        prof = profile(name) if name else self.hosted(model)
        if prof is None:
            return None
        ranks = self.ranks if name else 1
        if len(self.engines) >= MAX_ENGINES:
            model = ""  # one shared overflow set
            engs = self.engines.get(model)
            if engs is not None:
                return engs
        engs = self.engines[model] = [Engine(prof, model, r) for r in range(ranks)]
        return engs

    def hosted(self, model: str) -> EngineProfile | None:
        """The engine profile of hosted model ``model`` under the capacity options (None:
        capacity off for it, instant latency, or no inter-token time to build steps of)."""
        c = self.capacity
        spec = c.models.get(model)

        def pick(name: str) -> Any:
            v = getattr(spec, name, None) if spec is not None else None
            return getattr(c, name) if v is None else v

        max_seqs = pick("max_seqs")
        if not max_seqs:
            return None
        mp = self.app.registry.get(model)
        if mp is None:
            return None
        lat = self.app.latency(mp)
        itl = lat.mean_gap() * 1000.0
        if lat.instant or itl <= 0.0:
            return None
        # the model's prefill rate is in its TTFT only when that is drawn (not --ttft-ms)
        rate = pick("prefill_ms_per_1k") + (mp.prefill_ms_per_1k
                                            if lat.fixed_ttft_ms is None else 0.0)
        return hosted_profile(model, itl, rate, pick("itl_slope"), max_seqs, pick("queue"),
                              mp.context_window + mp.max_output_tokens)

    def cap_prefill(self, model: str, prompt: int) -> float:
        """The capacity option's extra time to first token for a stream (seconds)."""
        spec = self.capacity.models.get(model)
        v = spec.prefill_ms_per_1k if spec is not None else None
        rate = self.capacity.prefill_ms_per_1k if v is None else v
        return rate * prompt / 1_000_000.0

    def takes(self, req: Request, route: Route) -> bool:
        """Does the scheduler run this request (the slot model then leaves it alone)? A
        stream or an embedding, yes; another held answer may be held by its handler without
        the engine (the Responses API's own create), so the slot model admits it and
        :meth:`wait` takes it over from its slot."""
        if self._route_engine(req, route) is None:
            return False
        if route.name in PREFILL_ONLY or route.streaming:
            return True
        body = _body(req)
        flag = body.get("stream") if isinstance(body, dict) else None
        return bool(route.stream_default if flag is None else flag)

    def engine(self, model: str, req: Request | None = None) -> Engine | None:
        """The engine that serves a request for ``model``: the rank its
        ``X-data-parallel-rank`` header names, else the least loaded (a 400 naming the
        header for a rank that does not exist)."""
        engs = self.ranks_of(model)
        if engs is None:
            return None
        if len(engs) == 1:
            return engs[0]
        raw = req.headers.get(RANK_HEADER) if req is not None else None
        if raw is not None:
            r = raw.strip()
            if not r.isdigit() or int(r) >= len(engs):
                raise E.out_of_range.at(RANK_HEADER, lo=0, hi=len(engs) - 1, value=raw[:32])
            return engs[int(r)]
        now = self.app.clock.now() + self.slack
        for e in engs:
            e.advance(now)
        return min(engs, key=lambda e: len(e.waiting) * 4 + len(e.running))

    def arm(self, eng: Engine) -> None:
        """A timer at the end of the engine's step in flight (one per step)."""
        end = eng.step_end
        if end < 0.0 or self._armed.get(eng) == end:
            return
        self._armed[eng] = end
        old = self._timers.get(eng)
        if old is not None:
            old.cancel()
        self._timers[eng] = self.app.clock.call_at(end, lambda: self._fire(eng))

    def _fire(self, eng: Engine) -> None:
        self._armed.pop(eng, None)
        self._timers.pop(eng, None)
        eng.advance(self.app.clock.now() + self.slack)
        self.arm(eng)
        self._gauge(eng)

    def _gauge(self, eng: Engine) -> None:
        engs = self.engines.get(eng.name, (eng,))
        self.app.stats.set_gauge("queue_depth", eng.name or None,
                                 sum(len(e.waiting) for e in engs))

    def add(self, eng: Engine, usage: Usage, body: Any, on_done: Any = None,
            lead: float = 0.0) -> Seq:
        now = self.app.clock.now()
        seq = eng.add(usage.prompt_tokens, usage.cached_tokens, usage.output_tokens, now,
                      on_done, max_tokens_of(body), lead)
        eng.advance(now)
        self.arm(eng)
        self._gauge(eng)
        return seq

    def end(self, eng: Engine, seq: Seq) -> None:
        # (the stream's last token may be written within the clock's window before its
        # step's end: that step counts as ended, the sequence as finished, not aborted)
        eng.abort(seq, self.app.clock.now() + self.slack)
        self.arm(eng)
        self._gauge(eng)

    # -- hooks -----------------------------------------------------------------------------

    def _route_engine(self, req: Request, route: Route) -> Engine | None:
        if not route.stream_capable and route.name not in PREFILL_ONLY:
            return None
        body = _body(req)
        model = body.get("model") if isinstance(body, dict) else None
        return self.engine(model, req) if isinstance(model, str) else None

    async def before(self, req: Request, route: Route, app: Services) -> Result | None:
        eng = self._route_engine(req, route)
        if eng is not None:
            eng.advance(app.clock.now())
            if eng.full():
                eng.rejected += 1
                raise self.overloaded(req)
        return None

    def overloaded(self, req: Request) -> APIError:
        return E.capacity_overloaded.at(status=self.app.config.capacity.reject_status,
                                        request_id=req.request_id,
                                        headers=retry_headers(1000.0))

    def pace(self, req: Request, res: StreamResponse) -> None:
        """Pace a stream with no client (``pipeline.run_detached``) as its route's are."""
        self.stream_hook(req, self.app.resolve(req)[0], res)

    def stream_hook(self, req: Request, route: Route, res: StreamResponse) -> None:
        s = res.stream
        if s.usage is None:
            return
        eng = self._route_engine(req, route)
        if eng is None:
            return
        first = s.usage.reasoning_tokens
        lead = 0.0
        if eng.profile.hosted:
            head: list[PlanItem] = []
            s.wrap(lambda plan: _peeked(plan, s, head), runs=True)
            # the plan's own time to first token (the first event _paced holds)
            ttft = head[-1][0] if head else 0.0
            k = min(first, max(0, s.usage.output_tokens - 1))
            lead = eng.lead(s.usage.prompt_tokens, s.usage.cached_tokens, k,
                            ttft + self.cap_prefill(eng.name, s.usage.prompt_tokens))
        seq = self.add(eng, s.usage, _body(req), lead=lead)
        s.wrap(lambda plan: _paced(plan, self, eng, seq, s, first), runs=True)
        prev = res.on_close
        queued = self._watch(seq, req)

        def on_close(reason: str) -> None:
            if queued is not None:
                self.watcher.unwatch(queued)  # type: ignore[union-attr]
            self.end(eng, seq)
            if prev is not None:
                prev(reason)

        res.on_close = on_close

    async def wait(self, model: str, usage: Usage, req: Request | None,
                   seconds: float = 0.0) -> bool:
        """Hold a non-streamed answer until the engine has generated it (an answer with no
        output tokens: until its prompt is computed); False when no engine serves ``model``.
        ``seconds``: the answer's own time, for a hosted model's engine."""
        eng = self.engine(model, req)
        if eng is None:
            return False
        if req is not None and req.notes.slot is not None:
            # admitted by the slot model (see takes): the engine holds it from here
            slot, req.notes.slot = req.notes.slot, None
            slot.release()
        eng.advance(self.app.clock.now())
        if eng.full() and req is not None:
            # (the queue filled while this request was parsed and decided: refused now)
            eng.rejected += 1
            raise self.overloaded(req)
        lead = 0.0
        if eng.profile.hosted:
            lead = eng.lead(usage.prompt_tokens, usage.cached_tokens,
                            usage.output_tokens - 1, seconds)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def done(_: Seq) -> None:
            if not fut.done():
                fut.set_result(None)

        seq = self.add(eng, usage, _body(req) if req is not None else None, done, lead)
        queued = self._watch(seq, req) if req is not None else None
        try:
            await fut
        finally:
            if queued is not None:
                self.watcher.unwatch(queued)  # type: ignore[union-attr]
            self.end(eng, seq)  # (a no-op once finished; a client gone frees its blocks)
        return True

    def _watch(self, seq: Seq, req: Request) -> _Queued | None:
        """While ``seq`` waits for admission, its client is watched as the slot model's
        queue is: a client that sent EOF is dropped, its connection closed, its
        sequence ended (the capacity model's ``QUEUE_WATCH_S``)."""
        if self.watcher is None or seq.admitted_at >= 0.0:
            return None
        q = _Queued(seq)
        return q if self.watcher.watch(q, req) else None

    # -- views -----------------------------------------------------------------------------

    def raw(self) -> list[dict[str, Any]]:
        """Each engine's state and vLLM's counters and histograms (JSON, mergeable)."""
        out = []
        for eng in self._all():
            eng.advance(self.app.clock.now())
            d = eng.public()
            d["cached_tokens"] = eng.cached_tokens
            d["queried_tokens"] = eng.queried_tokens
            d["prompt_tokens"] = eng.prompt_tokens
            d["generation_tokens"] = eng.generation_tokens
            d["success"] = dict(eng.success)
            d["hists"] = {k: [list(h.bounds), list(h.counts), h.sum]
                          for k, h in eng.hists.items()}
            out.append(d)
        return out

    def _all(self) -> list[Engine]:
        return [e for engs in self.engines.values() for e in engs]

    async def status(self, req: Request, app: Services) -> JSONResponse:
        for eng in self._all():
            eng.advance(app.clock.now())
        return JSONResponse({"object": "list", "data": [e.public() for e in self._all()]})


class _Queued:
    """A sequence as a waiter of the departure watch: done once admitted."""

    __slots__ = ("seq",)

    def __init__(self, seq: Seq) -> None:
        self.seq = seq

    def done(self) -> bool:
        return self.seq.admitted_at >= 0.0 or self.seq.finished_at >= 0.0


def _peeked(plan: Iterator[PlanItem], stream: EventStream,
            head: list[PlanItem]) -> Iterator[PlanItem]:
    """The plan, its first items read now into ``head`` up to the first one
    :func:`_paced` holds for a token (at most :data:`PEEK`; a run of tokens whole), then
    handed on unchanged."""
    is_token = stream.dialect.is_token
    types = stream.dialect.token_types
    it = iter(plan)
    for item in it:
        head.append(item)
        off, etype, data = item
        tok = (type(data) is TokenRun or  # (a run is always the dialect's token event)
               (etype in types if types is not None else is_token(etype, data)))
        if off > 0.0 or tok or len(head) >= PEEK:
            break
    return _then_plan(head[:], it)


def _then_plan(head: list[PlanItem], rest: Iterator[PlanItem]) -> Iterator[PlanItem]:
    try:
        yield from head
        yield from rest
    finally:
        close_plan(rest)


def _paced(plan: Iterator[PlanItem], serving: Serving, eng: Engine, seq: Seq,
           stream: EventStream, first: int) -> Iterator[PlanItem]:
    """The plan with each spaced-out event due when the engine produces its token (see the
    module doc). A run of token events (a :class:`TokenRun` the plan hands over whole) is
    read here, not expanded by a generator under this one: per token, the deadline is the
    sequence's step end read straight from it, and the engine is asked more only when that
    step is not yet known."""
    now_fn = serving.app.clock.now_fn()
    slack = serving.slack
    is_token = stream.dialect.is_token
    types = stream.dialect.token_types  # (a set to look in, when the dialect declares one)
    last = seq.max_out - 1
    j = first
    try:
        for item in plan:
            run = item[2]
            if type(run) is TokenRun:  # (a run is always the dialect's token event)
                etype = item[1]
                key, gaps = run.key, run.gaps
                more = False
                for piece in run.pieces:
                    if more:
                        next(gaps, 0.0)  # (drawn as the run would: the plan may share gaps)
                    more = True
                    k = j if j <= last else last
                    j += 1
                    # the step that gives token k, known already (the common case), else
                    # asked of the engine until it is
                    now = now_fn()
                    if eng.step_end <= now + slack:
                        eng.advance(now + slack)
                        serving.arm(eng)
                    if k < seq.produced or seq.state == DONE:
                        t = now
                    elif k == seq.produced and seq.next_at >= 0.0:
                        t = seq.next_at
                    else:
                        t = yield from _wait(serving, eng, seq, stream, k, now)
                    yield (max(t - stream.deadline, 0.0), etype,
                           TokenRun([piece], key=key))
                continue
            off, etype, data = item
            tok = etype in types if types is not None else is_token(etype, data)
            if tok or off > 0.0:
                k = j if j <= last else last
                if tok:
                    j += 1
                t = yield from _wait(serving, eng, seq, stream, k, -1.0)
                off = max(t - stream.deadline, 0.0)
            yield off, etype, data
    finally:
        close_plan(plan)
        serving.end(eng, seq)


def _wait(serving: Serving, eng: Engine, seq: Seq, stream: EventStream, k: int,
          now: float) -> Generator[PlanItem, None, float]:
    """When output token ``k`` is due: while its step is not yet known (the sequence is
    queued, prefilling in chunks or preempted), a control item due when the step in flight
    ends, then a look again (``now`` >= 0: looked once already, at ``now``)."""
    now_fn = serving.app.clock.now_fn()
    slack = serving.slack
    looked = now >= 0.0
    while True:
        if not looked:
            now = now_fn()
            if eng.step_end <= now + slack:
                eng.advance(now + slack)
                serving.arm(eng)
            t = seq.due(k, now)
            if t is not None:
                return t
        if eng.step_end < 0.0:
            return now  # (an idle engine: nothing to wait for)
        looked = False
        yield max(eng.step_end - stream.deadline, 0.0), ENGINE_WAIT, None


def register(app: Host) -> None:
    cfg = app.config
    hosted = not cfg.engine and cfg.capacity.enabled and cfg.latency != "instant"
    if not cfg.engine and not any(s.engine for s in cfg.capacity.models.values()) \
            and not hosted:
        return
    serving = Serving(app)
    cap = app.feature(CAPACITY)
    if hosted and cap is not None:  # the slot model keeps what the scheduler does not take
        cap.skip = serving.takes
    app.set_feature(SERVING, serving)
    app.before.append(serving.before)
    # before the fault hook, which the capacity hooks keep last
    app.stream_hooks.insert(0, serving.stream_hook)
    app.stats.engines_view = serving.raw
    app.router.add("GET", "/llmsim/engines", serving.status, "llmsim.engines")


