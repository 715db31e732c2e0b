"""A bounded TTL key/value store in Redis: what :class:`~llmsim.state.shared.SharedStore` is
for ``--workers`` on one machine, for replicas sharing ``--state redis://...``.

The same interface and bounds as the sqlite store: at most ``max_entries`` newest entries, at
most ``max_bytes`` of serialized values in all (oldest evicted first; the entry just written is
always kept), each entry for ``ttl`` seconds, and no value bigger than ``max_value`` bytes
(refused: :meth:`RedisStore.put` returns False). A store named ``N`` keeps

- ``<prefix>N:v:<key>``: the value (pickled by the caller's server; Redis must be trusted),
  with the TTL as a Redis expiry, so a read never sees an expired value;
- ``<prefix>N:z``: key → birth time (ms, Redis's clock) — the eviction order;
- ``<prefix>N:s``: key → size, and ``<prefix>N:b``: the sum of the sizes.

Every write is one Lua script (atomic across replicas): it drops index entries past their TTL,
writes the value, and evicts the oldest entries until both bounds hold. Values are pickled
objects of this server's own classes, never client bytes — anyone who can write to this Redis
can run code in every replica that reads it (so Redis must be private to the deployment).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from .redisconn import SharedState

__all__ = ["RedisStore"]

V = TypeVar("V")

# KEYS: none (one Redis, not a cluster: the keys are built from ARGV[1], the store's prefix)
# ARGV: prefix, key, blob, max_entries, max_bytes, ttl_ms, mode ("put" | "update")
# put: insert or replace as the newest entry; update: replace in place (age and TTL kept),
# only if present. Returns 1 if written, 0 if not (update of a missing key). Evicts oldest
# entries (never `key`) until at most max_entries and max_bytes (0 = no byte bound) hold.
_WRITE = """
local p, k, blob = ARGV[1], ARGV[2], ARGV[3]
local max_n, max_b, ttl, mode = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[7]
local z, s, b = p .. 'z', p .. 's', p .. 'b'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local evicted = 0
local function drop(m)
  local size = tonumber(redis.call('HGET', s, m) or '0')
  redis.call('DEL', p .. 'v:' .. m)
  redis.call('ZREM', z, m)
  redis.call('HDEL', s, m)
  redis.call('DECRBY', b, size)
  evicted = evicted + 1
end
if ttl > 0 then
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', z, '-inf', now - ttl)) do drop(m) end
end
local old = redis.call('HGET', s, k)
if mode == 'update' then
  if not old or redis.call('EXISTS', p .. 'v:' .. k) == 0 then return {0, evicted} end
  redis.call('SET', p .. 'v:' .. k, blob, 'KEEPTTL')
else
  if ttl > 0 then
    redis.call('SET', p .. 'v:' .. k, blob, 'PX', ttl)
  else
    redis.call('SET', p .. 'v:' .. k, blob)
  end
  redis.call('ZADD', z, now, k)
end
redis.call('HSET', s, k, #blob)
local total = redis.call('INCRBY', b, #blob - tonumber(old or '0'))
local n = redis.call('ZCARD', z)
local i = 0
while (n > max_n or (max_b > 0 and total > max_b)) do
  local m = redis.call('ZRANGE', z, i, i)[1]
  if not m then break end
  if m == k then
    i = i + 1
  else
    drop(m)
    n = n - 1
    total = tonumber(redis.call('GET', b) or '0')
  end
end
return {1, evicted}
"""

_WRITE_SHA = hashlib.sha1(_WRITE.encode()).hexdigest()

_POP = """
local p, k = ARGV[1], ARGV[2]
local v = redis.call('GET', p .. 'v:' .. k)
local size = redis.call('HGET', p .. 's', k)
redis.call('DEL', p .. 'v:' .. k)
redis.call('ZREM', p .. 'z', k)
redis.call('HDEL', p .. 's', k)
if size then redis.call('DECRBY', p .. 'b', tonumber(size)) end
return v
"""


class RedisStore(Generic[V]):
    """``max_entries`` newest entries, ``max_bytes`` of values in all, each for ``ttl`` s."""

    def __init__(self, shared: SharedState, name: str, max_entries: int, ttl: float, *,
                 max_bytes: int = 0, max_value: int = 0,
                 dumps: Callable[[V], bytes] | None = None,
                 loads: Callable[[bytes], V] | None = None) -> None:
        self.shared = shared
        self.name = name
        self.max_entries = max(0, int(max_entries))
        self.max_bytes = max(0, int(max_bytes))
        self.max_value = max(0, int(max_value))
        self.ttl = float(ttl)
        self.evicted = 0  # entries this replica's writes evicted (for tests and stats)
        self.refused = 0  # values bigger than max_value (not stored)
        self._p = shared.key(name) + ":"
        self._dumps = dumps or (lambda v: pickle.dumps(v, pickle.HIGHEST_PROTOCOL))
        self._loads: Callable[[bytes], V] = loads or pickle.loads
        self._pop: Any = None

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def _vkey(self, key: str) -> str:
        return self._p + "v:" + key

    def _run_write(self, key: str, value: V, mode: str,
                   then_get: tuple[RedisStore[Any], str] | None = None) -> tuple[bool, Any]:
        """The write script, and (``then_get``) a read of another store's key after it in
        the same round trip; returns (written, that value or None)."""
        blob = self._dumps(value)
        if self.max_value and len(blob) > self.max_value:
            self.refused += 1
            blob = b""
        if not blob:  # refused: only the read, if any
            if then_get is None:
                return False, None
            return False, then_get[0].get(then_get[1])

        args = [self._p, key, blob, self.max_entries, self.max_bytes, int(self.ttl * 1000),
                mode]

        def op(r: Any) -> Any:
            # EVALSHA in a plain pipeline: one round trip (redis-py's Script objects make a
            # pipeline ask SCRIPT EXISTS first); a Redis that lost the script (restarted)
            # gets it loaded once and the pipeline sent again (the read is idempotent)
            from redis.exceptions import NoScriptError

            for attempt in (0, 1):
                pipe = r.pipeline(transaction=False)
                pipe.evalsha(_WRITE_SHA, 0, *args)
                if then_get is not None:
                    pipe.get(then_get[0]._vkey(then_get[1]))
                try:
                    return pipe.execute()
                except NoScriptError:
                    if attempt:
                        raise
                    r.script_load(_WRITE)
            raise AssertionError("unreachable")  # pragma: no cover

        res = self.shared.call(op)
        done, evicted = res[0]
        self.evicted += int(evicted)
        if then_get is None or res[1] is None:
            return bool(done), None
        return bool(done), then_get[0]._loads(res[1])

    def put(self, key: str, value: V, owner: object = None) -> bool:
        """Insert or replace ``key`` as the newest entry; False when not kept (disabled, or
        the value alone is bigger than ``max_value``). ``owner`` is for the sqlite store's
        interface only: here an owner is part of the value (a dead replica is found by its
        expired liveness key, :meth:`SharedState.alive`)."""
        if self.max_entries <= 0:
            return False
        return self._run_write(key, value, "put")[0]

    def put_then_get(self, key: str, value: V, other: RedisStore[Any], other_key: str,
                     owner: object = None) -> Any:
        """:meth:`put`, then ``other.get(other_key)`` after it, in one round trip."""
        if self.max_entries <= 0:
            return other.get(other_key)
        return self._run_write(key, value, "put", (other, other_key))[1]

    def update(self, key: str, value: V, owner: object = None) -> bool:
        """Replace the value of ``key`` in place (same age, rank and TTL); False if absent.
        Other entries are evicted if the new size breaks ``max_bytes``."""
        return self._run_write(key, value, "update")[0]

    def resize(self, key: str, nbytes: int, value: V | None = None) -> None:
        """(:class:`~llmsim.state.store.BoundedStore` interface) ``value`` grew or shrank:
        write it back in place (the size is its serialized length here)."""
        if value is not None:
            self.update(key, value)

    def get(self, key: str) -> V | None:
        blob = self.shared.call(lambda r: r.get(self._vkey(key)))
        return None if blob is None else self._loads(blob)

    def _two(self, key: str, other: RedisStore[Any], other_key: str, exists: bool) -> Any:
        def op(r: Any) -> Any:
            pipe = r.pipeline(transaction=False)
            pipe.get(self._vkey(key))
            (pipe.exists if exists else pipe.get)(other._vkey(other_key))
            return pipe.execute()

        return self.shared.call(op)

    def get_and_has(self, key: str, other: RedisStore[Any],
                    other_key: str) -> tuple[V | None, bool]:
        """``(get(key), other.has(other_key))`` in one round trip."""
        blob, n = self._two(key, other, other_key, True)
        return (None if blob is None else self._loads(blob)), bool(n)

    def get_with(self, key: str, other: RedisStore[Any], other_key: str) -> tuple[V | None, Any]:
        """``(get(key), other.get(other_key))`` in one round trip."""
        blob, oblob = self._two(key, other, other_key, False)
        return ((None if blob is None else self._loads(blob)),
                (None if oblob is None else other._loads(oblob)))

    def has(self, key: str) -> bool:
        return bool(self.shared.call(lambda r: r.exists(self._vkey(key))))

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.has(key)

    def pop(self, key: str) -> V | None:
        def op(r: Any) -> Any:
            if self._pop is None:
                self._pop = r.register_script(_POP)
            return self._pop(args=[self._p, key])

        blob = self.shared.call(op)
        return None if blob is None else self._loads(blob)

    def __len__(self) -> int:
        return int(self.shared.call(lambda r: r.zcard(self._p + "z")))

    @property
    def nbytes(self) -> int:
        """The serialized size of every entry (what ``max_bytes`` bounds)."""
        return int(self.shared.call(lambda r: r.get(self._p + "b")) or 0)

    def update_owned(self, owner: object, fn: Callable[[V], V]) -> int:
        """(sqlite interface) Owners are found dead by their liveness key instead: 0."""
        return 0

    def close(self) -> None:
        """The connection belongs to the :class:`SharedState`: nothing to do."""
