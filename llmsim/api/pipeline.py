"""One request pipeline for the generating API families: a family parses and renders, the
pipeline does everything between, once.

A :class:`Family` supplies its routes, its :class:`~llmsim.streaming.dialect.Dialect` (stream wire
format), its error envelope, ``parse`` (validation → a :class:`Parsed`: the decision core's
:class:`~llmsim.sim.decide.Ask`, the model id as asked, the stream flag, the body the seed is
derived from) and two renderers (``render`` for the whole answer, ``plan`` for the stream).
:func:`generate` owns the rest: the seed and the request's RNG, the latency model, the prompt
cache (OpenAI's automatic rule, when the family gives the prompt's blocks), the answer (scripts,
replay seam and script faults through :meth:`~llmsim.app.App.answer`), and delivery — a stream,
or the whole answer held until its generation would have finished while counted as running
(``vllm:num_requests_running``). Generic hooks (auth, rate limits, faults, capacity, stats,
metrics) apply to every route registered through :func:`register`, as to any route.

A family with state of its own hooks into the pipeline instead of copying it (each hook a
:class:`Family` method that does nothing by default; the Responses API uses them all):
``keep``/``reuse`` (what the body memo keeps of a parse, and a kept parse made ready for one
more request), ``admit`` (after the parse and the prompt cache, before the answer: refuse on
the family's own state, or answer without the model), ``after_decide`` (the answer is decided
and has its id: keep what the family keeps of it — ``Meta.state``, what it bills and how long
it takes — or deliver it itself, e.g. on the clock with no client: :func:`run_detached`),
``open_stream`` (the stream's construction), ``on_complete`` and ``on_abandon`` (a held answer
delivered, or its client gone). ``chained``: the answer's id is known to the script (later
requests continue it).

A new family is one module: a ``Family`` subclass and ``register(app)`` calling
:func:`register` (plus its line in :data:`llmsim.api.MODULES`). The test-only echo family in
``tests/echo_family.py`` proves it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import TYPE_CHECKING, Any

from ..errors import APIError
from ..messages import JSONResponse, Request, Result, StreamResponse
from ..sim.cache import OPENAI_MIN_TOKENS, Segments
from ..sim.decide import Ask, Decision, Usage
from ..sim.latency import Latency
from ..sim.rng import new_id, request_seed, rng_of
from ..streaming.dialect import Dialect
from ..streaming.flow import NullSink, Pump
from ..streaming.stream import EventStream
from .caching import openai_cached, openai_segments
from .validate import SERVING, BodyMemo, deliver_after

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["Family", "Parsed", "Meta", "generate", "register", "steps_of", "run_detached"]

Plan = Iterator[tuple[float, str, Any]]


@dataclass(slots=True)
class Parsed:
    """A validated request, as the pipeline needs it: the decision core's ``ask``, the model
    id as the client wrote it (echoed, stats label), whether to stream, the JSON the seed is
    derived from, and ``info``: the family's own view, handed back to its renderers.
    ``cache_blocks`` (the prompt in reading order) turns on OpenAI's automatic prompt caching
    for this request; ``headers`` are added to the answer."""

    ask: Ask
    model: str
    stream: bool
    body: Any
    info: Any = None
    cache_blocks: Callable[[], Sequence[object]] | None = None
    retention: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    dialect: Dialect | None = None  # this request's stream format, when not the family's


@dataclass(slots=True)
class Meta:
    """What the pipeline decides for one answer besides the decision: its id and creation
    time (epoch seconds on the app's clock), the ``ask`` as decided (prompt cache applied),
    the request's ``rng`` after the decision and its latency model ``lat`` (for seeded work a
    family does after the decision). A family's ``after_decide`` may set ``state`` (its own
    object for this answer, e.g. a stored record), ``usage`` (what the answer bills) and
    ``wait`` (seconds a held answer takes) when they are not the decision's."""

    id: str
    created: int
    ask: Ask | None = None
    rng: random.Random | None = None
    lat: Latency | None = None
    state: Any = None
    usage: Usage | None = None
    wait: float | None = None


def steps_of(d: Decision) -> int:
    """Delivery steps of an answer (one token each, choices side by side): the longest
    choice's text, tool-call argument and reasoning-summary pieces."""
    best = 1
    for c in d.choices:
        n = len(c.pieces or ()) + sum(len(t.pieces) for t in c.calls)
        if c.reasoning is not None:
            n += sum(len(p) for p in c.reasoning.summary)
        best = max(best, n)
    return best


class Family:
    """An API family on the pipeline (see the module doc). Subclasses set the class
    attributes and implement :meth:`parse`, :meth:`render` and :meth:`plan`; the hooks
    (:meth:`keep` to :meth:`on_abandon`) are for a family with state of its own."""

    endpoint: str = ""  # the stats and script label, e.g. "gemini.generate"
    seed_path: str = ""  # the path the request's seed is derived with (stable per family)
    dialect: Dialect
    id_prefix: str = "gen_"
    errors: Callable[[APIError], Any] | None = None  # the family's error envelope
    # keep validated bodies by their bytes (BodyMemo: a resent body is not parsed, counted or
    # hashed again; one memo per transport); only for a parse that reads nothing but the
    # body, the transport and the config — or whose :meth:`keep` keeps only such parses
    memo: bool = False
    chained: bool = False  # the answer's id goes to the script (later requests continue it)

    async def parse(self, req: Request, app: Services) -> Parsed:
        raise NotImplementedError

    def render(self, p: Parsed, d: Decision, meta: Meta) -> Any:
        """The whole answer's JSON."""
        raise NotImplementedError

    def plan(self, p: Parsed, d: Decision, meta: Meta) -> Plan:
        """The stream: ``(delay after the previous event, type, data)``; the first event's
        delay counts from the request, so the first token is due at ``d.timing.first``."""
        raise NotImplementedError

    def steps(self, d: Decision) -> int:
        return steps_of(d)

    def cached(self, app: Services, p: Parsed, seg: Segments | None) -> int:
        """Prompt tokens this request reads from the prompt cache (OpenAI's automatic
        rule over ``seg``, the segments of ``p.cache_blocks``)."""
        return openai_cached(app, seg, p.ask.prompt_tokens, p.retention)

    # -- hooks (a family with state of its own) --------------------------------------------

    def keep(self, p: Parsed) -> Any:
        """What the body memo keeps of a fresh parse (None: not kept: it read stored
        state); :meth:`reuse` gets it back for each later request with the same bytes."""
        return p

    def reuse(self, kept: Any) -> Parsed:
        """A kept parse made ready for one more request (a copy of what a request may
        change)."""
        return kept  # type: ignore[no-any-return]

    def admit(self, req: Request, app: Services, p: Parsed) -> Result | None:
        """Before the answer (after the parse and the prompt cache): raise to refuse the
        request on the family's own state, return a Result to answer without the model."""
        return None

    def after_decide(self, req: Request, app: Services, p: Parsed, d: Decision,
                     meta: Meta) -> Result | None:
        """The answer is decided: keep what the family keeps of it (``meta.state``,
        ``meta.usage``, ``meta.wait``); a Result is a delivery of the family's own (None: the
        pipeline streams or holds the answer)."""
        return None

    def open_stream(self, p: Parsed, d: Decision, meta: Meta) -> EventStream:
        """The answer's stream (the :meth:`plan` in the request's dialect)."""
        return EventStream(self.plan(p, d, meta), p.dialect or self.dialect, model=p.model,
                           usage=d.usage)

    def on_complete(self, p: Parsed, d: Decision, meta: Meta, data: Any) -> None:
        """A held answer is delivered now: ``data`` is its :meth:`render`."""

    def on_abandon(self, p: Parsed, d: Decision, meta: Meta) -> None:
        """A held answer's client went away before it was delivered."""


def _memo(req: Request, app: Services, fam: Family) -> BodyMemo | None:
    """``fam``'s body memo for ``req``'s transport (None: the family keeps none)."""
    if not fam.memo:
        return None
    # one memo per transport: the same bytes may validate differently
    return app.memos.get(fam.endpoint if req.transport != "ws" else fam.endpoint + ".ws")


async def _prepare(req: Request, app: Services, fam: Family, looked: bool = False
                   ) -> tuple[Parsed, int | None, Segments | None]:
    """The request parsed, its seed and its prompt-cache segments: values of the body
    (with ``fam.memo``, kept by its bytes; ``looked``: the memo has no entry for them)."""
    memo = _memo(req, app, fam)
    if memo is not None and not looked:
        hit = memo.get(req.body, app.config)
        if hit is not None:
            return fam.reuse(hit[0]), hit[1], hit[2]
    p = await fam.parse(req, app)
    seed = request_seed(app.config.seed, fam.seed_path, p.body)
    seg = None
    if p.cache_blocks is not None:
        seg = openai_segments(app, p.ask.profile, p.body if isinstance(p.body, dict) else {},
                              p.cache_blocks, p.ask.prompt_tokens)
    if memo is not None:
        kept = fam.keep(p)
        if kept is not None:
            memo.put(req.body, app.config, (kept, seed, seg))
    return p, seed, seg


async def generate(req: Request, app: Services, fam: Family) -> Result:
    """Parse, decide and deliver one request of ``fam`` (see the module doc)."""
    memo = _memo(req, app, fam)
    hit = memo.get(req.body, app.config) if memo is not None else None
    if hit is not None:  # (a resent body: no parse, and no coroutine to await for it)
        p, seed, seg = fam.reuse(hit[0]), hit[1], hit[2]
    else:
        p, seed, seg = await _prepare(req, app, fam, looked=True)
    a = p.ask
    if seg is not None or p.cache_blocks is None and a.prompt_tokens >= OPENAI_MIN_TOKENS:
        cached = fam.cached(app, p, seg)
        if cached:
            a = replace(a, cached_tokens=cached)
    early = fam.admit(req, app, p)
    if early is not None:
        return early
    rng = rng_of(seed)
    lat = app.latency(a.profile)
    meta = Meta(new_id(fam.id_prefix), int(app.clock.time()), a, rng, lat)
    d = app.answer_now(a, rng, lat) or await app.answer(
        req, fam.endpoint, a, rng, lat, response_id=meta.id if fam.chained else None)
    own = fam.after_decide(req, app, p, d, meta)
    if own is not None:
        return own
    if p.stream:
        stream = fam.open_stream(p, d, meta)
        return StreamResponse(stream, headers=list(p.headers), usage=stream.usage)
    wait = meta.wait if meta.wait is not None else d.timing.duration(fam.steps(d))
    usage = meta.usage if meta.usage is not None else d.usage
    if wait > 0 or app.feature(SERVING) is not None:  # (instant, no engine: no coroutine to run)
        try:
            await deliver_after(app, p.model, wait, usage, req)
        except BaseException:
            fam.on_abandon(p, d, meta)
            raise
    data = fam.render(p, d, meta)
    fam.on_complete(p, d, meta, data)
    return JSONResponse(data, 200, list(p.headers), p.model, usage)


def _no_bytes(etype: str, data: Any) -> bytes:
    return b""


def run_detached(req: Request, app: Services, stream: EventStream,
                 on_done: Callable[[str], None],
                 observer: Callable[[str, Any, float], None] | None = None) -> Pump:
    """A delivery of a family's own (``after_decide``; a Responses background run): run
    ``stream`` on the shared clock with no client, from the next clock pass, counted as
    running for its model meanwhile (``vllm:num_requests_running``) and, with ``--engine``,
    paced by the engine as the route's client streams are. ``observer(type, data, now)``
    sees each event as it is due; ``on_done(reason)`` once it ends."""
    key = app.stats.running_open(stream.model)
    res = StreamResponse(stream, usage=stream.usage)
    serving = app.feature(SERVING)
    if serving is not None:
        serving.pace(req, res)

    def done(reason: str) -> None:
        app.stats.running_close(key)
        try:
            if res.on_close is not None:
                res.on_close(reason)
        finally:
            on_done(reason)

    pump = Pump(stream, app.clock, _no_bytes, NullSink(), on_done=done, observer=observer)
    app.clock.call_at(app.clock.now(), pump.start)
    return pump


def register(app: Host, fam: Family, routes: Sequence[tuple[str, str]], *,
             streaming: bool | None = None, aliases: bool = False) -> None:
    """Serve ``fam`` at ``routes`` (``(method, pattern)``; a ``{model}`` path parameter names
    the model for the generic hooks). ``streaming``: these paths always (True) or never
    (False) stream; None: the body's ``stream`` field says."""

    handler = partial(generate, fam=fam)  # (no coroutine layer of its own per request)
    if fam.memo and fam.endpoint not in app.memos:
        app.memos[fam.endpoint] = BodyMemo()
        if fam.dialect.ws is not None:  # (its creates may come over a WebSocket too)
            app.memos[fam.endpoint + ".ws"] = BodyMemo()
    for method, pattern in routes:
        app.router.add(method, pattern, handler, fam.endpoint, aliases=aliases,
                       stream_capable=streaming is not False, errors=fam.errors,
                       streaming=streaming)
