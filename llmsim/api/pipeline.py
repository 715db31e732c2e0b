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

A new family is one module: a ``Family`` subclass and ``register(app)`` calling
:func:`register` (plus its line in :data:`llmsim.api.MODULES`). The test-only echo family in
``tests/echo_family.py`` proves it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..errors import APIError
from ..messages import JSONResponse, Request, Result, StreamResponse
from ..sim.cache import OPENAI_MIN_TOKENS, Segments
from ..sim.decide import Ask, Decision
from ..sim.rng import new_id, request_seed, rng_of
from ..streaming.dialect import Dialect
from ..streaming.stream import EventStream
from .caching import openai_cached, openai_segments
from .validate import SERVING, BodyMemo, deliver_after

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["Family", "Parsed", "Meta", "generate", "register", "steps_of"]

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
    """What the pipeline decides for the answer besides the decision: its id and creation
    time (epoch seconds on the app's clock)."""

    id: str
    created: int


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
    attributes and implement :meth:`parse`, :meth:`render` and :meth:`plan`."""

    endpoint: str = ""  # the stats and script label, e.g. "gemini.generate"
    seed_path: str = ""  # the path the request's seed is derived with (stable per family)
    dialect: Dialect
    id_prefix: str = "gen_"
    errors: Callable[[APIError], Any] | None = None  # the family's error envelope
    # keep validated bodies by their bytes (BodyMemo: a resent body is not parsed, counted or
    # hashed again); only for a parse that reads nothing but the body and the config
    memo: bool = False

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


async def _prepare(req: Request, app: Services, fam: Family
                   ) -> tuple[Parsed, int | None, Segments | None]:
    """The request parsed, its seed and its prompt-cache segments: values of the body
    (with ``fam.memo``, kept by its bytes)."""
    memo = app.memos.get(fam.endpoint) if fam.memo else None
    if memo is not None:
        hit = memo.get(req.body, app.config)
        if hit is not None:
            return hit  # type: ignore[no-any-return]
    p = await fam.parse(req, app)
    seed = request_seed(app.config.seed, fam.seed_path, p.body)
    seg = None
    if p.cache_blocks is not None:
        seg = openai_segments(app, p.ask.profile, p.body if isinstance(p.body, dict) else {},
                              p.cache_blocks, p.ask.prompt_tokens)
    if memo is not None:
        memo.put(req.body, app.config, (p, seed, seg))
    return p, seed, seg


async def generate(req: Request, app: Services, fam: Family) -> Result:
    """Parse, decide and deliver one request of ``fam`` (see the module doc)."""
    p, seed, seg = await _prepare(req, app, fam)
    a = p.ask
    rng = rng_of(seed)
    if seg is not None or p.cache_blocks is None and a.prompt_tokens >= OPENAI_MIN_TOKENS:
        cached = fam.cached(app, p, seg)
        if cached:
            a = replace(a, cached_tokens=cached)
    lat = app.latency(a.profile)
    d = app.answer_now(a, rng, lat) or await app.answer(req, fam.endpoint, a, rng, lat)
    meta = Meta(new_id(fam.id_prefix), int(app.clock.time()))
    if p.stream:
        stream = EventStream(fam.plan(p, d, meta), p.dialect or fam.dialect, model=p.model,
                             usage=d.usage)
        return StreamResponse(stream, headers=list(p.headers), usage=d.usage)
    wait = d.timing.duration(fam.steps(d))
    if wait > 0 or app.feature(SERVING) is not None:  # (instant, no engine: no coroutine to run)
        await deliver_after(app, p.model, wait, d.usage, req)
    return JSONResponse(fam.render(p, d, meta), 200, list(p.headers), p.model, d.usage)


def register(app: Host, fam: Family, routes: Sequence[tuple[str, str]], *,
             streaming: bool | None = None, aliases: bool = False) -> None:
    """Serve ``fam`` at ``routes`` (``(method, pattern)``; a ``{model}`` path parameter names
    the model for the generic hooks). ``streaming``: these paths always (True) or never
    (False) stream; None: the body's ``stream`` field says."""

    async def handler(req: Request, app: Services) -> Result:
        return await generate(req, app, fam)

    if fam.memo and fam.endpoint not in app.memos:
        app.memos[fam.endpoint] = BodyMemo()
    for method, pattern in routes:
        app.router.add(method, pattern, handler, fam.endpoint, aliases=aliases,
                       stream_capable=streaming is not False, errors=fam.errors,
                       streaming=streaming)
