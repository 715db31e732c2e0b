"""Realism under failure and load, transport side: auth, faults, rate limits, capacity.

One set of hooks serves every API family and transport (HTTP/SSE and WebSocket frames both go
through ``app.dispatch``). The decisions live in the sans-IO ``llmsim.sim.faults``,
``llmsim.sim.ratelimit`` and ``llmsim.sim.capacity``; this module only awaits, wraps stream
plans and renders headers. Hook order (``app.before``): admin-key auth → API-key auth → fault
injection → rate limit → capacity, so a refused or faulted request never takes a rate-limit
token or a sequence. With ``--state redis://...`` the scenario rules, their counters and the
rate-limit buckets are shared by the replicas (``llmsim.state.redis_limits``); the header,
the probabilities and capacity stay per replica.

Scope: only the OpenAI API paths (``/v1/...``, ``/openai/v1/...``) are authenticated with the
API keys, faulted, limited and queued. ``/health`` and ``/llmsim/*`` are never faulted.

Admin protection (:func:`check_admin_key`, one rule for every route): a change under
``/llmsim/`` (any method but GET, HEAD and OPTIONS: installing or deleting fault rules,
resetting the stats) needs one of ``--admin-key``'s keys when any is set, else one of
``--api-key``'s keys when any is set, else nothing (a laptop keeps today's open behaviour). The
key travels as ``Authorization: Bearer KEY``, ``X-LLMSim-Admin-Key: KEY`` or ``api-key: KEY``;
wrong or missing → 401 in the API's envelope. Reads stay open: ``GET /llmsim/stats``,
``/metrics``, ``/llmsim/capacity``, ``/llmsim/faults`` and the dashboard change nothing, a
Prometheus scraper or a browser opening the dashboard cannot easily send a key, and the one
credential a read could show (a fault rule's ``api_key``) is masked when keys are configured.

Scenario API::

    POST   /llmsim/faults        {"fault": "429", "count": 2, "model": "gpt-4o", ...} → rule
    GET    /llmsim/faults        → {"object": "list", "data": [rules], "fired": {...}}
    GET    /llmsim/faults/{id}   → rule
    DELETE /llmsim/faults        → delete every rule
    DELETE /llmsim/faults/{id}   → delete one rule
    GET    /llmsim/capacity      → the per-model engines (active, waiting, rejected, ...)
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import TYPE_CHECKING, Any

from ..errors import APIError, E
from ..messages import (
    JSONResponse,
    Key,
    RawResponse,
    Request,
    Result,
    StreamResponse,
    error_result,
)
from ..routing import Route
from ..sim.capacity import Engine
from ..sim.faults import SPEC_HELP, Fault, FaultEngine, fault_error, retry_headers
from ..sim.ratelimit import RateLimiter, estimate_tokens
from ..state.redis_limits import SharedLimiter, SharedRules
from ..streaming.inject import inject
from ..streaming.stream import close_plan
from .azure import is_entra_token

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterator

    from ..sim.decide import Usage
    from ..streaming.clock import Timer
    from ..streaming.stream import PlanItem
    from .services import Host, Services

__all__ = ["register", "FAULT_HEADER", "is_api_path"]

FAULT_HEADER = "x-llmsim-fault"
ADMIN_HEADER = "x-llmsim-admin-key"
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})  # what /llmsim/* serves without a key
MAX_ENGINES = 1024  # per-model engines; model ids come from clients, the rest share one
QUEUE_WATCH_S = 0.05  # while requests queue for a sequence: how often to look for gone clients


CONTROL_PATHS = frozenset(("/health", "/metrics", "/tokenize", "/detokenize"))


def is_api_path(path: str) -> bool:
    """Paths that are authenticated, faulted, rate limited and queued: every API family's
    (``/v1/…``, ``/anthropic/…``, and any family's own prefix), never the server's own
    ``/health``, ``/metrics``, ``/llmsim/…`` or vLLM's ``/tokenize``/``/detokenize``."""
    return not (path in CONTROL_PATHS or path.startswith("/llmsim") or path == "/")


def _body(req: Request) -> dict[str, Any]:
    """The request body as a dict ({} if absent or not a JSON object): the one parse the
    handler uses too (``Request.json``, depth-checked), never a second one."""
    if not req.body:
        return {}
    try:
        b = req.json()
    except APIError:
        return {}
    return b if isinstance(b, dict) else {}


def _model(req: Request) -> str | None:
    """The request's model: the body's ``model``, or a ``{model}`` path parameter (the
    families that name it in the path: Gemini, Bedrock, Azure deployments)."""
    m = _body(req).get("model") or req.params.get("model")
    return m if isinstance(m, str) and m else None


def _streaming(req: Request, route: Route) -> bool:
    if route.streaming is not None:  # a path that always or never streams
        return route.streaming or req.transport == "ws"
    return req.transport == "ws" or (route.stream_capable and _body(req).get(
        "stream", route.stream_default) is True)


# ------------------------------------------------------------------------------------------
# API-key auth
# ------------------------------------------------------------------------------------------

def _mask(key: str) -> str:
    if len(key) <= 8:
        return "*" * len(key)
    return key[:3] + "*" * min(len(key) - 7, 40) + key[-4:]


def check_api_key(keys: frozenset[str], req: Request) -> None:
    """Raise the real API's 401 unless ``req`` carries one of ``keys`` (API paths only)."""
    if not is_api_path(req.path):
        return
    key = req.api_key
    if key is None:
        raise E.api_key_missing.at()
    if key not in keys and not is_entra_token(req, key):
        raise E.api_key_invalid.at(key=_mask(key))


def _auth_hook(keys: frozenset[str]) -> Any:
    async def auth(req: Request, route: Route, app: Services) -> Result | None:
        check_api_key(keys, req)
        return None

    return auth


def is_admin_change(req: Request) -> bool:
    """A request that changes simulator state under ``/llmsim/`` (see the module doc)."""
    return req.path.startswith("/llmsim/") and req.method not in READ_METHODS


def check_admin_key(keys: frozenset[str], admin: bool, req: Request) -> None:
    """Raise a 401 unless ``req`` (an admin change) carries one of ``keys``; ``admin`` says
    whether they are ``--admin-key`` keys (else ``--api-key`` keys stand in for them)."""
    if not is_admin_change(req):
        return
    key = req.headers.get(ADMIN_HEADER, "").strip() or req.api_key
    name, flag = ("admin key", "--admin-key") if admin else ("API key", "--api-key")
    if key is None:
        raise E.admin_key_missing.at(name=name, flag=flag)
    if key not in keys:
        entry = E.admin_key_invalid if admin else E.admin_api_key_invalid
        raise entry.at(name=name, key=_mask(key), flag=flag)


def _admin_hook(keys: frozenset[str], admin: bool) -> Any:
    async def admin_auth(req: Request, route: Route, app: Services) -> Result | None:
        check_admin_key(keys, admin, req)
        return None

    return admin_auth


# ------------------------------------------------------------------------------------------
# Faults
# ------------------------------------------------------------------------------------------

def _reset_result() -> RawResponse:
    # what a transport that cannot drop the connection shows instead
    res = error_result(E.connection_reset.at())
    res.abort = True
    return res


class Faults:
    """The fault engine bound to an app: the before hook, the stream hook and the routes."""

    def __init__(self, app: Host, mask_keys: bool = False) -> None:
        self.app = app
        self.engine = FaultEngine(app.config.faults, app.config.seed)
        # --state: the scenario rules and their counters live in Redis (shared by replicas)
        self.shared = SharedRules(app.shared_state, self.engine) \
            if app.shared_state is not None else None
        self.mask_keys = mask_keys  # keys are configured: reads must not show a rule's key

    def _view(self, rule: Any) -> dict[str, Any]:
        d: dict[str, Any] = rule.public()
        if self.mask_keys and isinstance(d.get("api_key"), str):
            d["api_key"] = _mask(d["api_key"])
        return d

    def _key(self, req: Request) -> bytes:
        h = hashlib.blake2b(digest_size=16)
        h.update(f"{req.method} {req.path}\n".encode())
        h.update(req.body)
        return h.digest()

    def before(self, req: Request, route: Route,
               app: Services) -> Awaitable[Result | None] | None:
        """The before-hook (App.BeforeHook): None, with no coroutine made, when no fault can
        apply (no header, no rule, no probability, no shared rules), else the decision."""
        if not is_api_path(req.path):
            return None
        header = req.headers.get(FAULT_HEADER)
        eng = self.engine
        if header is None and not eng.rules and not eng.has_random and self.shared is None:
            return None
        if header is not None and header.strip().lower() == "none":
            return None  # explicitly no fault (bypasses rules and probabilities)
        return self._before(req, route, app, header)

    async def _before(self, req: Request, route: Route, app: Services,
                      header: str | None) -> Result | None:
        eng = self.engine
        fault = None
        where: dict[str, Any] = {
            "model": _model(req), "endpoint": route.name,
            "path": req.path.removeprefix("/openai"), "api_key": req.api_key,
            "transport": req.transport, "now": app.clock.time(), "key": self._key(req)}
        if self.shared is not None and (header is None or not eng.config.header):
            fault = await self.shared.decide(**where)  # the shared rules, unless the header
            if fault is not None:
                eng.count(fault)
        if fault is None:
            try:
                fault = eng.decide(**where, header=header)
            except ValueError as exc:
                raise E.fault_header_invalid.at("X-LLMSim-Fault", value=repr(header),
                                                reason=exc, help=SPEC_HELP) from None
        if fault is None:
            return None
        if fault.mid_stream and not _streaming(req, route):
            # a non-streamed answer has no "middle": act at the start instead
            if fault.kind == "error":
                fault = Fault("status", fault.status, source=fault.source)
            elif fault.kind == "stall":
                await app.clock.sleep(fault.ms / 1000.0)
                return None
            else:
                return _reset_result()
        return await self.apply(req, fault, app)

    async def apply(self, req: Request, fault: Fault, app: Services) -> Result | None:
        k = fault.kind
        cfg = app.config.faults
        if k == "status":
            raise fault_error(fault, _model(req), cfg.retry_after_ms, req.request_id)
        if k == "reset":
            app.stats.error("fault_reset")
            return _reset_result()
        if k == "hang":
            await app.clock.sleep(fault.ms / 1000.0)
            if fault.status:
                raise fault_error(Fault("status", fault.status), _model(req), cfg.retry_after_ms)
            app.stats.error("fault_reset")
            return _reset_result()
        req.notes.fault = fault  # mid-stream: applied by stream_hook
        return None

    def stream_hook(self, req: Request, route: Route, res: StreamResponse) -> None:
        fault = req.notes.fault
        if fault is None:
            return
        req.notes.fault = None
        s = res.stream
        stats = self.app.stats
        s.wrap(lambda plan: inject(plan, fault, s.dialect, s.fail,
                                   lambda kind: stats.error("fault_" + kind)))

    # -- scenario API ----------------------------------------------------------------------
    async def _add(self, body: Any) -> dict[str, Any]:
        now = self.app.clock.time()
        try:
            rule = self.engine.add_rule(body, now) if self.shared is None else \
                await self.shared.add(body, now)
        except OverflowError as exc:
            raise E.too_many_fault_rules.at(reason=exc) from None
        except ValueError as exc:  # a RuleError names its field; nothing is parsed back
            raise E.fault_rule_invalid.at(getattr(exc, "param", None), reason=exc) from None
        return self._view(rule)

    async def post(self, req: Request, app: Services) -> JSONResponse:
        body = req.json()
        if isinstance(body, dict) and "rules" in body and "fault" not in body:
            body = body["rules"]
        if isinstance(body, list):
            return JSONResponse({"object": "list", "data": [await self._add(b) for b in body]})
        return JSONResponse(await self._add(body))

    async def _rules(self) -> list[Any]:
        now = self.app.clock.time()
        if self.shared is not None:
            return await self.shared.listed(now)
        self.engine.expire(now)
        return self.engine.rules

    async def list(self, req: Request, app: Services) -> JSONResponse:
        rules = await self._rules()
        return JSONResponse({"object": "list", "data": [self._view(r) for r in rules],
                             "fired": dict(self.engine.fired)})

    async def _find(self, rid: str) -> Any:
        for r in await self._rules():
            if r.id == rid:
                return r
        raise E.fault_rule_not_found.at("id", id=rid)

    async def get_one(self, req: Request, app: Services) -> JSONResponse:
        return JSONResponse(self._view(await self._find(req.params["id"])))

    async def delete_all(self, req: Request, app: Services) -> JSONResponse:
        n = self.engine.clear() if self.shared is None else await self.shared.clear()
        return JSONResponse({"object": "list", "deleted": n})

    async def delete_one(self, req: Request, app: Services) -> JSONResponse:
        rid = req.params["id"]
        await self._find(rid)
        if self.shared is None:
            self.engine.remove_rule(rid)
        else:
            await self.shared.remove(rid)
        return JSONResponse({"id": rid, "object": "llmsim.fault_rule", "deleted": True})


# ------------------------------------------------------------------------------------------
# Rate limits
# ------------------------------------------------------------------------------------------

def _output_tokens(usage: Usage | None) -> int:
    return usage.output_tokens if usage is not None else 0


class Limits:
    """Rate-limit hooks: admit in ``before``, headers in ``after``, late charges on close."""

    def __init__(self, app: Host) -> None:
        self.app = app
        self.limiter = RateLimiter(app.config.ratelimit)
        # --state: the buckets live in Redis (one atomic take across replicas)
        self.shared = SharedLimiter(app.shared_state, self.limiter) \
            if app.shared_state is not None else None

    def charge(self, key: str, model: str, tokens: int) -> None:
        if self.shared is None:
            self.limiter.charge(key, model, tokens, self.app.clock.now())
        else:
            self.shared.charge(key, model, tokens)

    async def before(self, req: Request, route: Route, app: Services) -> Result | None:
        if not is_api_path(req.path):
            return None
        model = _model(req)
        if model is None:
            return None
        prompt, mx = estimate_tokens(_body(req))
        key = req.api_key or ""
        # raises the 429 (with x-ratelimit-* and retry-after headers) when a bucket is empty
        tokens = prompt + (mx or 0)
        req.notes.ratelimit = self.limiter.admit(key, model, tokens, app.clock.now()) \
            if self.shared is None else await self.shared.admit(key, model, tokens)
        if mx is None:
            req.notes.ratelimit_charge = (key, model)
        return None

    def after(self, req: Request, route: Route, res: Result) -> None:
        snap = req.notes.ratelimit
        if snap is None:
            return
        anthropic = route.name.startswith("anthropic")
        res.headers.extend(snap.headers(self.app.clock.time() if anthropic else None))
        late, req.notes.ratelimit_charge = req.notes.ratelimit_charge, None
        if late is not None and type(res) is JSONResponse and isinstance(res.data, dict):
            self.charge(*late, _output_tokens(res.usage))

    def stream_hook(self, req: Request, route: Route, res: StreamResponse) -> None:
        late, req.notes.ratelimit_charge = req.notes.ratelimit_charge, None
        if late is None:
            return
        usage = res.stream.usage

        def charge(reason: str) -> None:
            self.charge(*late, _output_tokens(usage))

        _chain_close(res, charge)


def _chain_close(res: StreamResponse, fn: Any) -> None:
    prev = res.on_close

    def on_close(reason: str) -> None:
        try:
            fn(reason)
        finally:
            if prev is not None:
                prev(reason)

    res.on_close = on_close


# ------------------------------------------------------------------------------------------
# Capacity
# ------------------------------------------------------------------------------------------

class Slot:
    """One admitted sequence; :meth:`release` is idempotent (stream end, close, abort)."""

    __slots__ = ("engine", "cap", "done")

    def __init__(self, engine: Engine, cap: Capacity) -> None:
        self.engine = engine
        self.cap = cap
        self.done = False

    def release(self, *_: Any) -> None:
        if self.done:
            return
        self.done = True
        self.cap.release(self.engine)


class Capacity:
    """Capacity hooks: wait for a sequence in ``before``, pace and release in the stream.

    A queued request whose client left is dropped at once, not when its turn comes: a reset
    connection cancels the wait directly (``connection_lost`` cancels the handler), and one
    the client closed (EOF, which the transport keeps open for half-closing clients) is
    found by a watch that runs every ``QUEUE_WATCH_S`` while anybody waits and asks the
    server (``app.drop_departed``) to close the connections of waiting clients
    that sent EOF; that close cancels the wait the same way, so the queue slot and the
    ``queue_depth`` gauge are freed within one watch period.
    """

    def __init__(self, app: Host) -> None:
        self.app = app
        self.config = app.config.capacity
        self.engines: dict[str, Engine] = {}
        # queued HTTP waiter (anything with done(): a future, a scheduler's queued request)
        # → its client
        self.waiting: dict[Any, str] = {}
        self._watch: Timer | None = None
        # the requests the serving scheduler runs instead (set by api/serving.py when
        # capacity puts hosted models on it)
        self.skip: Callable[[Request, Route], bool] | None = None

    def engine(self, model: str) -> Engine:
        eng = self.engines.get(model)
        if eng is None:
            if len(self.engines) >= MAX_ENGINES:
                model = ""  # shared overflow engine
                eng = self.engines.get(model)
            if eng is None:
                c = self.config
                spec = c.models.get(model)

                def pick(name: str) -> Any:
                    v = getattr(spec, name, None) if spec is not None else None
                    return getattr(c, name) if v is None else v

                eng = Engine(model, pick("max_seqs"), pick("queue"), pick("itl_slope"),
                             pick("prefill_ms_per_1k"))
                self.engines[model] = eng
        return eng

    def _gauge(self, eng: Engine) -> None:
        self.app.stats.set_gauge("queue_depth", eng.name or None, len(eng.waiting))

    def release(self, eng: Engine) -> None:
        """A sequence ended: it passes to the oldest live waiter, or goes idle."""
        while (waiter := eng.release()) is not None:
            if not waiter.done():
                waiter.set_result(None)
                break
            # that waiter's client left after being handed the sequence: pass it on
        self._gauge(eng)

    async def before(self, req: Request, route: Route, app: Services) -> Result | None:
        if not is_api_path(req.path):
            return None
        model = _model(req)
        if model is None or self.skip is not None and self.skip(req, route):
            return None
        eng = self.engine(model)
        if not eng.try_admit():
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            if not eng.enqueue(fut):
                raise self.overloaded(req)
            self._gauge(eng)
            if req.transport == "http" and req.client:
                self.waiting[fut] = req.client
                self._arm_watch()
            try:
                await fut
            except BaseException:
                if fut.done() and not fut.cancelled():
                    self.release(eng)  # handed a sequence but gone before using it
                else:
                    eng.forget(fut)
                    self._gauge(eng)
                raise
            finally:
                self.waiting.pop(fut, None)
        req.notes.slot = Slot(eng, self)
        return None

    def watch(self, waiter: Any, req: Request) -> bool:
        """Watch the client of ``req`` while ``waiter.done()`` is False (queued): the
        serving scheduler's queue has the same departure check. False: nothing to watch."""
        if req.transport != "http" or not req.client:
            return False
        self.waiting[waiter] = req.client
        self._arm_watch()
        return True

    def unwatch(self, waiter: Any) -> None:
        self.waiting.pop(waiter, None)

    def _arm_watch(self) -> None:
        if self._watch is None and self.app.drop_departed is not None:
            self._watch = self.app.clock.call_later(QUEUE_WATCH_S, self._tick)

    def _tick(self) -> None:
        self._watch = None
        clients = {c for f, c in self.waiting.items() if not f.done()}
        drop = self.app.drop_departed
        if not clients or drop is None:
            return
        try:
            drop(clients)
        finally:
            self._arm_watch()

    def overloaded(self, req: Request) -> APIError:
        status = self.config.reject_status
        return E.capacity_overloaded.at(status=status, request_id=req.request_id,
                                        headers=retry_headers(1000.0))

    def stream_hook(self, req: Request, route: Route, res: StreamResponse) -> None:
        slot, req.notes.slot = req.notes.slot, None
        if slot is None:
            return
        s = res.stream
        usage = s.usage
        prompt = usage.prompt_tokens if usage is not None else estimate_tokens(_body(req))[0]
        prefill = slot.engine.prefill(prompt)
        is_token = s.dialect.is_token
        s.wrap(lambda plan: _pace(plan, slot, prefill, is_token))
        _chain_close(res, slot.release)

    def after(self, req: Request, route: Route, res: Result) -> None:
        slot, req.notes.slot = req.notes.slot, None
        if slot is not None:  # a complete (JSON or error) answer: the sequence is done
            slot.release()

    def abort(self, req: Request) -> None:
        slot, req.notes.slot = req.notes.slot, None
        if slot is not None:
            slot.release()

    async def status(self, req: Request, app: Services) -> JSONResponse:
        return JSONResponse({"object": "list",
                             "data": [e.public() for e in self.engines.values()]})


def _pace(plan: Iterator[PlanItem], slot: Slot, prefill: float,
          is_token: Any) -> Iterator[PlanItem]:
    """Add prefill time before the first token, then stretch every later gap by the
    engine's current slowdown (read when the event is pulled, so it follows the load)."""
    eng = slot.engine
    started = False
    try:
        for off, etype, data in plan:
            if started:
                if off:
                    off *= eng.factor()
            elif off > 0 or is_token(etype, data):
                started = True
                off += prefill
            yield off, etype, data
    finally:
        close_plan(plan)
        slot.release()


# ------------------------------------------------------------------------------------------

def _keys(value: str | tuple[str, ...]) -> frozenset[str]:
    return frozenset((value,) if isinstance(value, str) else value)


def register(app: Host) -> None:
    cfg = app.config
    admin_keys = _keys(cfg.admin_key) or _keys(cfg.api_key)
    if admin_keys:  # first: a refused change runs no other hook
        app.before.append(_admin_hook(admin_keys, bool(cfg.admin_key)))
    if cfg.api_key:
        keys = frozenset(cfg.api_key)
        app.before.append(_auth_hook(keys))
        # the WebSocket upgrade checks the key at the handshake, as the real API does
        app.authenticate = lambda req: check_api_key(keys, req)
    faults = Faults(app, mask_keys=bool(admin_keys))
    app.set_feature(FAULTS, faults)
    app.before.append(faults.before)
    if cfg.ratelimit.enabled:
        limits = Limits(app)
        app.set_feature(LIMITS, limits)
        app.before.append(limits.before)
        app.after.append(limits.after)
        app.stream_hooks.append(limits.stream_hook)
    cap = Capacity(app)
    app.set_feature(CAPACITY, cap)
    if cfg.capacity.enabled and not cfg.engine:  # (--engine replaces the slot model)
        app.before.append(cap.before)
        app.after.append(cap.after)
        app.stream_hooks.append(cap.stream_hook)
        app.abort_hooks.append(cap.abort)
    app.stream_hooks.append(faults.stream_hook)  # last: fault timing is not stretched
    r = app.router
    r.add("POST", "/llmsim/faults", faults.post, "llmsim.faults")
    r.add("GET", "/llmsim/faults", faults.list, "llmsim.faults")
    r.add("DELETE", "/llmsim/faults", faults.delete_all, "llmsim.faults")
    r.add("GET", "/llmsim/faults/{id}", faults.get_one, "llmsim.faults")
    r.add("DELETE", "/llmsim/faults/{id}", faults.delete_one, "llmsim.faults")
    r.add("GET", "/llmsim/capacity", cap.status, "llmsim.capacity")


# each feature's state in App.features (set by register)
FAULTS: Key[Faults] = Key("faults")
LIMITS: Key[Limits] = Key("ratelimit")
CAPACITY: Key[Capacity] = Key("capacity")
