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

Two clients share the URL: the asyncio one (:meth:`SharedState.run`) for code that can await,
and a blocking one (:meth:`SharedState.call`) for the stores of stored responses and
conversations, whose interface is synchronous (as the sqlite store of ``--workers`` is). Each
replica also renews a liveness key (:meth:`SharedState.start_heartbeat`) so the others can
tell when it died (:meth:`SharedState.alive`).
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from ..errors import APIError, E

__all__ = ["SharedState", "open_shared_state", "unavailable", "TIMEOUT_S", "SYNC_TIMEOUT_S",
           "HEARTBEAT_S", "OWNER_TTL_S"]

T = TypeVar("T")

TIMEOUT_S = 2.0
"""Connect and per-command timeout: a request that needs shared state waits at most this long
for Redis before it is answered 503."""

SYNC_TIMEOUT_S = 0.25
"""Timeout of the blocking client the stores use (:meth:`SharedState.call`): it runs on the
event loop, as the sqlite store of ``--workers`` does, so a Redis that stops answering may
stall every connection of this replica this long (a loopback or LAN Redis answers in well
under a millisecond). After a failure the client is not tried again for :data:`RETRY_S`."""

RETRY_S = 1.0  # after a failed command, answer 503 at once for this long (the retry-after)

HEARTBEAT_S = 1.0
"""How often each replica renews its liveness key (:meth:`SharedState.alive`)."""

OWNER_TTL_S = 5.0
"""A replica whose liveness key is this old is dead: the others fail the unfinished
background responses it owned (a GC pause or a busy loop shorter than this is no death)."""


def unavailable(reason: str) -> APIError:
    """The answer to a request that needs shared state while Redis cannot be reached."""
    return E.shared_state_unavailable.at(reason=reason, headers=[("retry-after", "1")])


class SharedState:
    """One Redis connection pool per :class:`~llmsim.app.App` (created on first use)."""

    def __init__(self, url: str, prefix: str = "llmsim:") -> None:
        self.url = url
        self.prefix = prefix
        self._client: Any = None
        self._sync: Any = None
        self._down_until = 0.0  # monotonic time before which call() fails fast
        self._down_reason = ""
        # this replica's name in owner fields and its liveness key (random per process)
        self.replica = "r" + secrets.token_hex(8)
        self._heartbeat: asyncio.Task[None] | None = None
        self._up_since: float | None = None  # monotonic time of the first beat of this run
        self.on_heartbeat: list[Callable[[], None]] = []  # run after each renewal (sync)

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

    @property
    def sync_client(self) -> Any:
        """A blocking ``redis.Redis`` client for the stores (see :data:`SYNC_TIMEOUT_S`)."""
        if self._sync is None:
            import redis

            self._sync = redis.Redis.from_url(
                self.url, socket_timeout=SYNC_TIMEOUT_S,
                socket_connect_timeout=SYNC_TIMEOUT_S, health_check_interval=0,
                decode_responses=False)
        return self._sync

    def call(self, op: Callable[[Any], T]) -> T:
        """``op(sync_client)`` now, on the caller's thread; a Redis connection or timeout
        error becomes a 503 (:func:`unavailable`), and for :data:`RETRY_S` afterwards every
        call fails the same way at once instead of waiting for the timeout again."""
        from redis.exceptions import ConnectionError as RConnErr
        from redis.exceptions import TimeoutError as RTimeout

        if self._down_until and time.monotonic() < self._down_until:
            raise unavailable(self._down_reason)
        try:
            result = op(self.sync_client)
        except (RConnErr, RTimeout, OSError) as e:
            self._down_reason = type(e).__name__
            self._down_until = time.monotonic() + RETRY_S
            raise unavailable(self._down_reason) from None
        self._down_until = 0.0
        return result

    # -- replica liveness ------------------------------------------------------------------
    def alive(self, replica: str) -> bool:
        """Whether ``replica`` renewed its liveness key in the last :data:`OWNER_TTL_S`. Until
        this replica's own beats have reached Redis for that long without a miss, every
        replica is taken as alive: after an outage (or at start) the others may not have
        beaten yet, and a live replica's responses must not be failed."""
        if replica == self.replica:
            return True
        up = self._up_since
        if up is None or time.monotonic() - up < OWNER_TTL_S:
            return True
        return bool(self.call(lambda r: r.exists(self.key("replica", replica))))

    def start_heartbeat(self) -> None:
        """Renew this replica's liveness key every :data:`HEARTBEAT_S` (on the running loop)
        until :meth:`close`; Redis being down only skips beats."""
        if self._heartbeat is None:
            self._heartbeat = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        key = self.key("replica", self.replica)
        ms = int(OWNER_TTL_S * 1000)
        while True:
            try:
                await self.run(lambda r: r.set(key, b"1", px=ms))
            except APIError:
                self._up_since = None
            else:
                if self._up_since is None:
                    self._up_since = time.monotonic()
                for hook in list(self.on_heartbeat):
                    try:
                        hook()
                    except APIError:
                        break
            await asyncio.sleep(HEARTBEAT_S)

    def key(self, *parts: str) -> str:
        """A key in this deployment's namespace: ``key("resp", id)`` → ``llmsim:resp:<id>``."""
        return self.prefix + ":".join(parts)

    async def run(self, op: Callable[[Any], Awaitable[T]]) -> T:
        """``await op(client)``; a Redis connection or timeout error becomes a 503
        (:func:`unavailable`) for the request that needed it."""
        from redis.exceptions import ConnectionError as RConnErr
        from redis.exceptions import TimeoutError as RTimeout

        if asyncio.current_task() is None:
            # a handler's first step runs outside any Task (protocol.start_handler), and the
            # client's timeouts need one: yield once, and the rest runs in the Task
            await asyncio.sleep(0)
        try:
            return await op(self.client)
        except (RConnErr, RTimeout, OSError) as e:
            raise unavailable(type(e).__name__) from None

    async def close(self) -> None:
        beat, self._heartbeat = self._heartbeat, None
        if beat is not None:
            beat.cancel()
        if self._sync is not None:
            sync, self._sync = self._sync, None
            sync.close()
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
