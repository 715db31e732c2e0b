"""Shared state across replicas on Redis (``--state redis://HOST:PORT/DB``): the connection.

Several llmsim replicas behind a load balancer share stored responses, conversations,
background status, rate-limit buckets, fault-rule counters and script cursors through one
Redis. This module owns the connection and the one rule for failures: any Redis error
(refused, reset, timed out) while a request needs shared state becomes
:func:`unavailable` — a 503 naming the reason — and the next request simply tries again
(the client reconnects by itself, so the server recovers when Redis is back).

The ``redis`` package is an optional extra (``pip install 'llmsim[redis]'``); it is imported
only when ``--state`` names a Redis URL. Every key this server writes starts with
:attr:`SharedState.prefix` (``llmsim:`` by default) so replicas of one deployment find each
other's keys and nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import APIError, E

__all__ = ["SharedState", "open_shared_state", "unavailable", "TIMEOUT_S"]

T = TypeVar("T")

TIMEOUT_S = 2.0
"""Connect and per-command timeout: a request that needs shared state waits at most this long
for Redis before it is answered 503."""


def unavailable(reason: str) -> APIError:
    """The answer to a request that needs shared state while Redis cannot be reached."""
    return E.shared_state_unavailable.at(reason=reason, headers=[("retry-after", "1")])


class SharedState:
    """One Redis connection pool per :class:`~llmsim.app.App` (created on first use)."""

    def __init__(self, url: str, prefix: str = "llmsim:") -> None:
        self.url = url
        self.prefix = prefix
        self._client: Any = None

    @property
    def client(self) -> Any:
        """The ``redis.asyncio.Redis`` client (lazy: no connection is made before first use)."""
        if self._client is None:
            try:
                import redis.asyncio as aioredis
            except ImportError as e:  # pragma: no cover - checked at start-up by the CLI
                raise RuntimeError("--state redis:// needs the redis extra: "
                                   "pip install 'llmsim[redis]'") from e
            self._client = aioredis.Redis.from_url(
                self.url, socket_timeout=TIMEOUT_S, socket_connect_timeout=TIMEOUT_S,
                health_check_interval=0, decode_responses=False)
        return self._client

    def key(self, *parts: str) -> str:
        """A key in this deployment's namespace: ``key("resp", id)`` → ``llmsim:resp:<id>``."""
        return self.prefix + ":".join(parts)

    async def run(self, op: Callable[[Any], Awaitable[T]]) -> T:
        """``await op(client)``; a Redis connection or timeout error becomes a 503
        (:func:`unavailable`) for the request that needed it."""
        from redis.exceptions import ConnectionError as RConnErr
        from redis.exceptions import TimeoutError as RTimeout

        if asyncio.current_task() is None:
            # the protocol runs a handler's first step eagerly, outside any Task, and the
            # client's timeouts need one: yield once, and the rest runs in the Task
            await asyncio.sleep(0)
        try:
            return await op(self.client)
        except (RConnErr, RTimeout, OSError) as e:
            raise unavailable(type(e).__name__) from None

    async def close(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()


def open_shared_state(url: str | None) -> SharedState | None:
    """The shared state for ``--state``: None (embedded, the default) or Redis."""
    if not url:
        return None
    return SharedState(url)


class Lua:
    """A Lua script run with EVALSHA (loaded by EVAL on a ``NOSCRIPT`` miss, e.g. after a
    Redis restart): ``await script(client, keys, args)``. Redis runs a script atomically,
    which is how several replicas share a counter or a bucket without a race."""

    __slots__ = ("src", "sha")

    def __init__(self, src: str) -> None:
        import hashlib

        self.src = src
        self.sha = hashlib.sha1(src.encode()).hexdigest()

    async def __call__(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        from redis.exceptions import NoScriptError

        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await client.eval(self.src, len(keys), *keys, *args)
