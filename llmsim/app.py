"""The application: config, clock, model registry, router, state, and the dispatch step that
turns a Request into a Result (JSON, raw or stream) with errors decided in one place."""

from __future__ import annotations

import logging
import os
import random
from collections.abc import Awaitable, Callable, Collection
from dataclasses import replace
from typing import Any, TypeVar

from .config import Config, ConfigError
from .errors import APIError, E, missing, not_found_model, server_error
from .messages import Key, RawResponse, Request, Result, StreamResponse, error_result
from .routing import Route, Router
from .sim import lengths, tokens
from .sim import schema as sch
from .sim.cache import ENTRY_BYTES, OPENAI_TTL_24H_S, PromptCache
from .sim.decide import Ask, Decision, decide
from .sim.faults import fault_error
from .sim.latency import Latency
from .sim.models import DEFAULT_EMBEDDING, ModelProfile, Registry
from .sim.script import Script, Turn, decision_of, load_script
from .state.redis_limits import SharedCursors
from .state.redis_store import RedisStore
from .state.redisconn import SharedState, open_shared_state
from .state.shared import SharedStore
from .state.stats import Stats
from .state.store import SnapshotStore
from .streaming.clock import Clock, RealClock

__all__ = ["App", "Key", "install_with"]

T = TypeVar("T")

log = logging.getLogger("llmsim")
LATENCY_CACHE = 1024  # latency models kept (App.latency)
PROMPT_CACHE_TTL_S = OPENAI_TTL_24H_S  # the shared table's bound; each entry has its own expiry

# A hook runs before the handler; it may return a Result (e.g. an injected fault) or raise
# APIError (auth, rate limit) to answer instead of the handler. A plain function may
# return None when it has nothing to do (no coroutine made), else what it awaits.
BeforeHook = Callable[[Request, Route, "App"], Awaitable[Result | None] | None]
# An after-hook may add headers to any result (rate-limit headers, ...).
AfterHook = Callable[[Request, Route, Result], None]
# A stream hook sees every StreamResponse before it reaches a transport (SSE or WebSocket):
# it may wrap ``res.stream`` (mid-stream faults, capacity pacing) or chain ``res.on_close``.
StreamHook = Callable[[Request, Route, StreamResponse], None]
# An abort hook runs when dispatch is cancelled before it produced a Result (the client went
# away while the handler waited): hooks that took something in ``before`` give it back here.
AbortHook = Callable[[Request], None]
# A server lifecycle hook (start, stop), awaited with the app.
LifecycleHook = Callable[["App"], Awaitable[None]]

# what installs the API families, hooks and WebSocket modes into a new App: set once by the
# composition root (llmsim.assemble, imported with the package), so App imports no family
_INSTALL: list[Callable[[App], None]] = []


def install_with(install: Callable[[App], None]) -> None:
    """Make ``install`` what every new :class:`App` is assembled with."""
    _INSTALL[:] = [install]


def cors_preflight(req: Request) -> RawResponse:
    """The answer to a browser's OPTIONS preflight on any path: every origin, method and
    requested header is allowed, as the real API does for browser SDK use."""
    asked = req.headers.get("access-control-request-headers", "")
    return RawResponse(b"", 200, headers=[
        ("access-control-allow-methods", "GET, POST, DELETE, OPTIONS"),
        ("access-control-allow-headers", asked or "authorization, content-type"),
        ("access-control-max-age", "86400")])


class App:
    """Everything a handler needs, passed explicitly (no globals)."""

    def __init__(self, config: Config | None = None, clock: Clock | None = None, *,
                 state_dir: str | None = None) -> None:
        self.config = config or Config()
        if clock is None and self.config.time_scale != 1.0:
            from .streaming.timescale import ScaledClock

            clock = ScaledClock(self.config.time_scale)
        self.clock: Clock = clock or RealClock()
        # the tokenizer of this app's requests ("auto" | "estimate"): dispatch makes it the
        # mode of the request's context (sim.tokens), so apps in one process never share it
        self.tokenizer: str = self.config.tokenizer
        # --workers > 1: the directory every worker's shared stores live in (None: one process)
        self.state_dir: str | None = state_dir or None
        self.registry = Registry(self.config.models, strict=self.config.strict_models,
                                 first=self.config.default_model,
                                 served=self.config.served_model_name)
        self.script = Script(load_script(self.config.script) if self.config.script else None)
        source, trace = lengths.parse_source(self.config.max_tokens_mode)
        if trace is not None:  # read (and checked) once, at start-up
            try:
                lengths.load_trace(trace)
            except lengths.TraceError as e:
                raise ConfigError(f"max_tokens_mode: {e}") from None
        elif self.config.max_tokens_mode == "cap":
            log.warning("--max-tokens-mode cap is retired: lengths are 'natural' (an answer "
                        "longer than max_tokens is cut there, finish_reason 'length')")
        self.length_source = source
        self.router = Router()
        self._latency: dict[str, tuple[Config, Latency]] = {}  # App.latency's, by model id
        # validated request bodies by their bytes, one memo per API family that keeps them
        # (api.validate.BodyMemo; bounded; e.g. "chat.completions")
        self.memos: dict[str, Any] = {}
        self.stats = Stats()
        self.before: list[BeforeHook] = []
        self.after: list[AfterHook] = []
        self.stream_hooks: list[StreamHook] = []
        self.abort_hooks: list[AbortHook] = []
        self.on_start: list[LifecycleHook] = []  # awaited when the server starts listening
        self.on_stop: list[LifecycleHook] = []  # awaited when it closes
        # shared state across replicas (--state redis://...): None = embedded (the default)
        self.shared_state: SharedState | None = open_shared_state(self.config.state)
        # the simulated prompt cache (sim.cache): prefixes' digests, bounded in bytes; shared
        # by --workers (sqlite) or replicas (--state: Redis), a table of the same bound
        self.prompt_cache = PromptCache(self.config.prompt_cache_bytes,
                                        self._shared_prompt_cache())
        if self.prompt_cache.shared is not None:
            self.on_stop.append(self._close_prompt_cache)
        # -- each feature's state, under a typed key owned by the feature's module ----------
        self.features: dict[Key[Any], Any] = {}
        # the API-key check a transport runs itself (WebSocket handshake); None = no keys
        self.authenticate: Callable[[Request], None] | None = None
        # set by the transport: close the connections of these departed clients (a count)
        self.drop_departed: Callable[[Collection[str]], int] | None = None
        # --workers > 1 (workers.py): every worker's statistics, and their reset
        self.stats_collect: Callable[[App], Awaitable[dict[str, Any]]] | None = None
        self.stats_reset: Callable[[App], Awaitable[None]] | None = None
        self.script_cursors: SharedCursors | None = None
        if self.shared_state is not None:
            self.script_cursors = SharedCursors(self.shared_state)
        for install in _INSTALL:
            install(self)

    def _shared_prompt_cache(self) -> SnapshotStore[Any] | None:
        entries = self.config.prompt_cache_bytes // ENTRY_BYTES
        if entries <= 0:
            return None
        if self.shared_state is not None:
            return RedisStore(self.shared_state, "prompt_cache", entries, PROMPT_CACHE_TTL_S)
        if self.state_dir is not None:
            # (a file of its own: its byte budget is not the stored responses')
            return SharedStore(os.path.join(self.state_dir, "prompt_cache.sqlite3"),
                               "prompt_cache", entries, PROMPT_CACHE_TTL_S)
        return None

    async def _close_prompt_cache(self, app: App) -> None:
        shared = self.prompt_cache.shared
        if shared is not None:
            shared.close()

    # -- feature state ------------------------------------------------------------------------
    def feature(self, key: Key[T]) -> T | None:
        """The state of the feature ``key`` names (None: not installed or not configured)."""
        return self.features.get(key)

    def set_feature(self, key: Key[T], value: T | None) -> None:
        if value is None:
            self.features.pop(key, None)
        else:
            self.features[key] = value

    # -- helpers for handlers ---------------------------------------------------------------
    def model(self, name: Any, param: str = "model", kind: str = "chat") -> ModelProfile:
        """Resolve a request's model or raise the real API's error. ``kind`` is what the
        endpoint needs: ``"chat"`` (text generation) or ``"embedding"``; a known model of the
        other kind is a 400, an unknown id (non-strict registry) is served as that kind."""
        if name is None or name == "":  # "" is a string: not a type error but no model
            raise missing(param)
        if not isinstance(name, str) or not name:
            raise E.invalid_type.at(param, expected="a string")
        prof = self.registry.get(name)
        if prof is None:
            raise not_found_model(name)
        if prof.kind != kind:
            if not prof.builtin and kind == "embedding":  # an unknown id: an embedding model
                return replace(DEFAULT_EMBEDDING, id=name)
            what = "embeddings" if kind == "embedding" else "this endpoint (it is an embedding " \
                "model: use /v1/embeddings)" if prof.kind == "embedding" else "this endpoint"
            raise E.model_not_supported.at(param, model=name, what=what)
        return prof

    def answer_now(self, ask: Ask, rng: random.Random, lat: Latency) -> Decision | None:
        """:meth:`answer` when it has nothing to await, without a coroutine (hot path): with
        no script rules, the simulation; None when a rule may apply (await :meth:`answer`)."""
        if self.script.rules:
            return None
        return decide(ask, self.config, rng, lat)

    async def answer(self, req: Request, endpoint: str, ask: Ask, rng: random.Random,
               lat: Latency, response_id: str | None = None) -> Decision:
        """The answer to ``ask``: a scripted turn when a script rule matches (its error or
        status fault raised, its mid-stream fault left for the stream hook), else the
        simulation (:func:`llmsim.sim.decide.decide`). Every API family calls this. With
        ``--state`` the script's cursors are shared by the replicas (in Redis)."""
        now = self.answer_now(ask, rng, lat)
        if now is not None:
            return now
        turn = await self.script_turn(req, endpoint, ask, response_id)
        if turn is not None and turn.fault is None:
            return decision_of(turn, ask, rng, lat, sch.Work())
        return decide(ask, self.config, rng, lat)

    async def script_turn(self, req: Request, endpoint: str, ask: Ask,
                          response_id: str | None = None) -> Turn | None:
        """The scripted turn for this request, if a rule matches: its error or status fault
        raised, its mid-stream fault left on the request for the stream hook (the turn is
        returned: the caller simulates)."""
        script = self.script
        if not script.rules:
            return None
        kw: dict[str, Any] = {"model": ask.profile.id, "endpoint": endpoint,
                              "api_key": req.api_key, "headers": req.headers,
                              "body": _body_of(req), "ask": ask, "response_id": response_id}
        cursors = self.script_cursors
        turn = script.turn(**kw) if cursors is None else await cursors.turn(script, **kw)
        if turn is None:
            return None
        if turn.error is not None:
            raise turn.error.copy()
        if turn.fault is not None:
            f = turn.fault
            if f.kind == "status":
                raise fault_error(f, ask.profile.id, self.config.faults.retry_after_ms,
                                  req.request_id)
            req.notes.fault = f  # applied by the fault stream hook
        return turn

    def latency(self, profile: ModelProfile) -> Latency:
        """The latency model of ``profile`` under this app's config (a value: built once per
        profile and config, ``LATENCY_CACHE`` of them)."""
        c = self.config
        hit = self._latency.get(profile.id)
        if hit is not None and hit[0] is c and hit[1].profile is profile:
            return hit[1]
        lat = Latency(profile, instant=c.latency == "instant", fixed_ttft_ms=c.ttft_ms,
                      fixed_itl_ms=c.itl_ms)
        if len(self._latency) >= LATENCY_CACHE:  # (bounded: model names come from clients)
            self._latency.clear()
        self._latency[profile.id] = (c, lat)
        return lat

    # -- dispatch --------------------------------------------------------------------------
    def resolve(self, req: Request) -> tuple[Route, dict[str, str]]:
        return self.router.resolve(req.method, req.path)

    async def dispatch(self, req: Request, route: Route | None = None) -> Result:
        """Run hooks and the handler; every failure becomes an error Result."""
        tokens.use_mode(self.tokenizer)  # this app's tokenizer for the rest of the request
        try:
            if req.method == "OPTIONS":  # CORS preflight: no auth, faults or limits apply
                return self._after(req, None, cors_preflight(req))
            if route is None:
                route, params = self.resolve(req)
                if params:
                    object.__setattr__(req, "params", params)
            for hook in self.before:
                step = hook(req, route, self)
                if step is not None:
                    res = await step
                    if res is not None:
                        return self._after(req, route, res)
            res = await route.handler(req, self)
            return self._after(req, route, res)
        except APIError as exc:
            return self._after(req, route, _render_error(route, exc))
        except Exception:  # a handler bug must not kill the connection without an answer
            log.exception("handler failed for %s %s", req.method, req.path)
            return self._after(req, route, _render_error(route, server_error()))
        except BaseException:  # cancelled: no Result will exist, so no after-hook will run
            for ahook in self.abort_hooks:
                try:
                    ahook(req)
                except Exception:
                    log.exception("abort hook failed")
            raise

    def _after(self, req: Request, route: Route | None, res: Result) -> Result:
        if route is not None:
            if type(res) is StreamResponse:
                for shook in self.stream_hooks:
                    shook(req, route, res)
            for hook in self.after:
                hook(req, route, res)
        return res


def _body_of(req: Request) -> dict[str, Any]:
    """The request's parsed body (``Request.json``: one parse shared by hooks and handler)."""
    try:
        body = req.json()
    except APIError:
        return {}
    return body if isinstance(body, dict) else {}


def _render_error(route: Route | None, exc: APIError) -> Any:
    """An error in the route's family's envelope (OpenAI's unless the route says)."""
    if route is not None and route.errors is not None:
        return route.errors(exc)
    return error_result(exc)


