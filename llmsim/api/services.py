"""What the API families see of the application: two structural interfaces.

:class:`Services` is what a request handler (and a family's ``parse``) may use: the config, the
clock, the model registry and resolution, the latency model, the answer (scripts and the
simulation), the prompt cache, the statistics, the validated-body memos and a feature's state
by its typed :class:`~llmsim.messages.Key`. :class:`Host` adds what a module's ``register``
needs to install itself: the router, the hook lists, lifecycle hooks, feature slots and the
few transport seams. :class:`llmsim.app.App` implements both; no module under ``llmsim.api``
imports it (an import-linter contract in ``pyproject.toml``), so a family can be driven by any
object of this shape (a test double, another composition).
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from ..config import Config
    from ..messages import Key, Request, Result
    from ..routing import Route, Router
    from ..sim.cache import PromptCache
    from ..sim.decide import Ask, Decision
    from ..sim.latency import Latency
    from ..sim.models import ModelProfile, Registry
    from ..sim.script import Script, Turn
    from ..state.redis_limits import SharedCursors
    from ..state.redisconn import SharedState
    from ..state.stats import Stats
    from ..streaming.clock import Clock

__all__ = ["Services", "Host"]

T = TypeVar("T")


class Services(Protocol):
    """What a request handler may use (see the module doc)."""

    @property
    def config(self) -> Config: ...
    @property
    def clock(self) -> Clock: ...
    @property
    def registry(self) -> Registry: ...
    @property
    def stats(self) -> Stats: ...
    @property
    def memos(self) -> dict[str, Any]: ...
    @property
    def prompt_cache(self) -> PromptCache: ...
    @property
    def length_source(self) -> str: ...
    @property
    def script(self) -> Script: ...

    def feature(self, key: Key[T]) -> T | None: ...

    def model(self, name: Any, param: str = "model", kind: str = "chat") -> ModelProfile: ...

    def latency(self, profile: ModelProfile) -> Latency: ...

    def answer_now(self, ask: Ask, rng: random.Random, lat: Latency) -> Decision | None: ...

    async def answer(self, req: Request, endpoint: str, ask: Ask, rng: random.Random,
                     lat: Latency, response_id: str | None = None) -> Decision: ...

    async def script_turn(self, req: Request, endpoint: str, ask: Ask,
                          response_id: str | None = None) -> Turn | None: ...


class Host(Services, Protocol):
    """What a module's ``register`` (and the few handlers that re-dispatch or reach the
    transport) may use besides :class:`Services` (see the module doc)."""

    router: Router
    before: list[Callable[[Request, Route, Any], Awaitable[Result | None] | None]]
    after: list[Callable[[Request, Route, Result], None]]
    stream_hooks: list[Callable[[Request, Route, Any], None]]
    abort_hooks: list[Callable[[Request], None]]
    on_start: list[Callable[[Any], Awaitable[None]]]
    on_stop: list[Callable[[Any], Awaitable[None]]]
    features: dict[Key[Any], Any]
    authenticate: Callable[[Request], None] | None
    drop_departed: Callable[[Collection[str]], int] | None
    stats_collect: Callable[[Any], Awaitable[dict[str, Any]]] | None
    stats_reset: Callable[[Any], Awaitable[None]] | None

    @property
    def script_cursors(self) -> SharedCursors | None: ...
    @property
    def shared_state(self) -> SharedState | None: ...
    @property
    def state_dir(self) -> str | None: ...

    def set_feature(self, key: Key[T], value: T | None) -> None: ...

    def resolve(self, req: Request) -> tuple[Route, dict[str, str]]: ...

    async def dispatch(self, req: Request, route: Route | None = None) -> Result: ...
