"""Rate-limit buckets, fault rules and script cursors shared across replicas on Redis.

With ``--state redis://...`` several llmsim replicas behave as one server for the parts of
the simulation that count:

- :class:`SharedLimiter`: each take of a (key, model) pair's RPM/TPM buckets is one Lua
  script (atomic; refilled from elapsed time by Redis ``TIME``, so the replicas' clocks do not
  matter). The decision and its ``x-ratelimit-*`` values are the ones a single server gives;
  the wording of a refusal is :func:`llmsim.sim.ratelimit.judge`'s, as in memory.
- :class:`SharedRules`: scenario fault rules installed on any replica are stored in Redis;
  each replica caches the list under a version token (one small round trip a request while
  nothing changes) and a rule's ``seen``/``fired`` counters move in one Lua script, so a
  ``count: 2`` rule fires twice in total and ``every: K`` counts the pair's requests.
- :class:`SharedCursors`: a script's per-session cursors (and the ``previous_response_id`` →
  session links), so a scripted conversation continues on another replica. The script itself
  is loaded by every replica (same file or admin call); its cursors live under a digest of
  its rules.

Bounds: bucket keys expire :data:`BUCKET_TTL_S` after their last take (a bucket refills in a
minute, so nothing is lost), cursors and links :data:`CURSOR_TTL_S` after their last use,
rules are at most :data:`llmsim.sim.faults.MAX_RULES` (checked in the same script that adds
one, each field at most :data:`llmsim.sim.faults.MAX_RULE_STR` characters). API keys, models
and session names enter keys only as fixed-size digests.

Redis down: a rate-limited request or a scripted one is answered 503
``shared_state_unavailable`` (:func:`llmsim.state.redisconn.unavailable`), never let through
silently; fault rules are taken from the last list this replica read, and only a request that
matches one (its counter needs Redis) gets the 503. Everything recovers with Redis.

The scripts compute some key names inside Lua (one Redis, not a Redis Cluster).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Iterable, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import APIError, E
from ..sim.faults import MAX_RULES, Fault, FaultEngine, Rule, build_rule, too_many_rules
from ..sim.ratelimit import Bucket, RateLimiter, Snapshot, judge
from ..sim.script import SESSION_HEADER, session_key
from .redisconn import Lua, SharedState

if TYPE_CHECKING:
    from ..sim.decide import Ask
    from ..sim.script import Script, Turn

__all__ = ["SharedLimiter", "SharedRules", "SharedCursors", "BUCKET_TTL_S", "CURSOR_TTL_S"]

log = logging.getLogger("llmsim")

BUCKET_TTL_S = 180  # a few windows: an idle bucket is full again after one minute
CURSOR_TTL_S = 3600  # a script session's cursor and response links, after last use
EPOCH_TTL_S = 7 * 86400  # a script's restart counter (one key per script installed by POST)
MAX_PENDING_CHARGES = 10_000  # late token charges in flight to Redis (more are dropped)
UNAVAILABLE = "shared_state_unavailable"


def _digest(*parts: str) -> str:
    h = hashlib.blake2b(digest_size=16)
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.hexdigest()


def _token() -> str:
    """A fresh version token (random, so a restarted, emptied Redis never repeats one)."""
    return os.urandom(8).hex()


# ------------------------------------------------------------------------------------------
# Rate limits
# ------------------------------------------------------------------------------------------

# KEYS: request bucket, token bucket. ARGV: rpm, tpm (0 = none), tokens, ttl ms, charge (1:
# only charge late tokens to an existing token bucket). A bucket is a hash {l: level, t: time
# of that level, m: its limit}; a changed limit starts the bucket full, as in memory.
_TAKE = Lua("""
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local rpm, tpm, n, ttl = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local function level(k, limit)
  local v = redis.call('HMGET', k, 'l', 't', 'm')
  local l, ts = tonumber(v[1]), tonumber(v[2])
  if l == nil or tonumber(v[3]) ~= limit then return limit, false end
  if now > ts then l = math.min(limit, l + (now - ts) * limit / 60) end
  return l, true
end
local function save(k, limit, l)
  redis.call('HSET', k, 'l', string.format('%.17g', l), 't', string.format('%.17g', now),
             'm', limit)
  redis.call('PEXPIRE', k, ttl)
end
if ARGV[5] == '1' then
  local l, found = level(KEYS[2], tpm)
  if found then save(KEYS[2], tpm, math.max(-tpm, l - n)) end
  return 1
end
local rl, tl = 0, 0
if rpm > 0 then rl = level(KEYS[1], rpm) end
if tpm > 0 then tl = level(KEYS[2], tpm) end
local ok = (rpm == 0 or rl >= 1) and (tpm == 0 or (n <= tpm and tl >= n))
if ok then
  if rpm > 0 then rl = rl - 1; save(KEYS[1], rpm, rl) end
  if tpm > 0 then tl = tl - n; save(KEYS[2], tpm, tl) end
end
return {ok and 1 or 0, string.format('%.17g', rl), string.format('%.17g', tl)}
""")


def _bucket(limit: int, level: float) -> Bucket | None:
    if not limit:
        return None
    b = Bucket(limit, 0.0)
    b.level = level
    return b


class SharedLimiter:
    """The RPM/TPM buckets of :class:`~llmsim.sim.ratelimit.RateLimiter`, kept in Redis."""

    def __init__(self, shared: SharedState, limiter: RateLimiter) -> None:
        self.shared = shared
        self.limiter = limiter  # its limits() resolves the per-key/per-model tables
        self._pending: set[asyncio.Task[None]] = set()

    def _keys(self, key: str, model: str) -> list[str]:
        k = self.shared.key("rl", _digest(key, model))
        return [k + ":r", k + ":t"]

    async def admit(self, key: str, model: str, tokens: int) -> Snapshot:
        """Take one request and ``tokens`` for the pair, atomically across replicas, or raise
        the 429 a single server would (503 if Redis cannot be reached)."""
        rpm, tpm = self.limiter.limits(key, model)
        if not rpm and not tpm:
            return Snapshot(None, None)
        keys = self._keys(key, model)
        args = [rpm, tpm, tokens, BUCKET_TTL_S * 1000, 0]
        ok, rl, tl = await self.shared.run(lambda c: _TAKE(c, keys, args))
        req, tok = _bucket(rpm, float(rl)), _bucket(tpm, float(tl))
        if int(ok):
            return Snapshot(req, tok)
        judge(model, req, tok, tokens)  # raises the refusal in the in-memory words
        raise E.rate_limited_shared.at()  # pragma: no cover

    def charge(self, key: str, model: str, tokens: int) -> None:
        """Charge output tokens known only at the end (see ``RateLimiter.charge``), in the
        background: the answer is already on its way, and a lost charge (Redis down) only
        makes the limit a little looser."""
        if tokens <= 0 or len(self._pending) >= MAX_PENDING_CHARGES:
            return
        rpm, tpm = self.limiter.limits(key, model)
        if not tpm:
            return
        keys = self._keys(key, model)
        args = [rpm, tpm, tokens, BUCKET_TTL_S * 1000, 1]

        async def run() -> None:
            try:
                await self.shared.run(lambda c: _TAKE(c, keys, args))
            except APIError:
                pass  # Redis unreachable: this charge is dropped

        task = asyncio.get_running_loop().create_task(run())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)


# ------------------------------------------------------------------------------------------
# Fault rules
# ------------------------------------------------------------------------------------------

# KEYS: version. ARGV: the caller's version token → {version} if unchanged, else
# {version, id1, rule1, id2, rule2, ...} (KEYS[2]: the rules hash).
_FETCH = Lua("""
local v = redis.call('GET', KEYS[1]) or ''
if v == ARGV[1] then return {v} end
local out = redis.call('HGETALL', KEYS[2])
table.insert(out, 1, v)
return out
""")

# KEYS: rules, version, id counter. ARGV: max rules, new version, rule JSON → id or 0 (full).
_ADD = Lua("""
if redis.call('HLEN', KEYS[1]) >= tonumber(ARGV[1]) then return 0 end
local id = 'fault_' .. redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], id, ARGV[3])
redis.call('SET', KEYS[2], ARGV[2])
return id
""")

# KEYS: rules, version, the rule's counters. ARGV: id, every, count (0 = none), drawn (1: the
# probability let it fire), new version → -1 (rule gone), 0 (not this time), 1 (fires).
_FIRE = Lua("""
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return -1 end
local seen = redis.call('HINCRBY', KEYS[3], 'seen', 1)
if seen % tonumber(ARGV[2]) ~= 0 or ARGV[4] ~= '1' then return 0 end
local fired = redis.call('HINCRBY', KEYS[3], 'fired', 1)
local count = tonumber(ARGV[3])
if count > 0 and fired >= count then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[3])
  redis.call('SET', KEYS[2], ARGV[5])
end
return 1
""")

# KEYS: rules, version. ARGV: new version, counters key prefix, ids to remove (none: all)
# → how many were removed.
_REMOVE = Lua("""
local ids = {}
if #ARGV > 2 then
  for i = 3, #ARGV do ids[#ids + 1] = ARGV[i] end
else
  ids = redis.call('HKEYS', KEYS[1])
end
local n = 0
for _, id in ipairs(ids) do
  n = n + redis.call('HDEL', KEYS[1], id)
  redis.call('DEL', ARGV[2] .. id)
end
if n > 0 then redis.call('SET', KEYS[2], ARGV[1]) end
return n
""")


def _rule_order(rule: Rule) -> int:
    return int(rule.id.rpartition("_")[2] or 0)


class SharedRules:
    """The scenario rules of a :class:`~llmsim.sim.faults.FaultEngine`, kept in Redis (the
    engine keeps deciding the header and the configured probabilities)."""

    def __init__(self, shared: SharedState, engine: FaultEngine) -> None:
        self.shared = shared
        self.engine = engine
        k = shared.key
        self._rules_key, self._ver_key = k("faults", "rules"), k("faults", "ver")
        self._next_key, self._n_prefix = k("faults", "next"), k("faults", "n", "")
        self._ver = "\0"  # no version read yet
        self.rules: list[Rule] = []  # the last list read (ordered by creation)

    def _parse(self, rid: str, raw: bytes) -> Rule | None:
        try:
            d = orjson.loads(raw)
            return build_rule(d["body"], rid, float(d["created"]))
        except (ValueError, KeyError, TypeError):  # not ours (or a newer format): skip it
            return None

    async def current(self) -> list[Rule]:
        """The installed rules, read again only when their version changed. Redis down: the
        last list read (a request that matches none needs nothing from Redis)."""
        keys = [self._ver_key, self._rules_key]
        try:
            out = await self.shared.run(lambda c: _FETCH(c, keys, [self._ver]))
        except APIError as e:
            if e.code != UNAVAILABLE:
                raise  # pragma: no cover
            return self.rules
        ver = out[0].decode()
        if ver != self._ver:
            rules = [self._parse(out[i].decode(), out[i + 1]) for i in range(1, len(out), 2)]
            self.rules = sorted((r for r in rules if r is not None), key=_rule_order)
            self._ver = ver
        return self.rules

    async def decide(self, *, model: str | None, endpoint: str, path: str,
                     api_key: str | None, transport: str, now: float,
                     key: bytes) -> Fault | None:
        """The first due rule's fault (its counters moved in Redis), or None."""
        for rule in await self.current():
            if rule.end is not None and now >= rule.end:
                continue  # expired: removed by the next list or add
            if not rule.matches(model, endpoint, path, api_key, transport, now):
                continue
            keys = [self._rules_key, self._ver_key, self._n_prefix + rule.id]
            args = [rule.id, rule.every, rule.count or 0,
                    1 if self.engine.draw(rule, key) else 0, _token()]
            r = int(await self.shared.run(partial(_FIRE.__call__, keys=keys, args=args)))
            if r == 1:
                return rule.fault
            if r < 0:
                self._ver = "\0"  # deleted meanwhile: read the list again next time
        return None

    async def _remove(self, ids: Iterable[str]) -> int:
        keys, args = [self._rules_key, self._ver_key], [_token(), self._n_prefix, *ids]
        return int(await self.shared.run(lambda c: _REMOVE(c, keys, args)))

    async def expire(self, now: float) -> None:
        gone = [r.id for r in await self.current() if r.end is not None and now >= r.end]
        if gone:
            await self._remove(gone)

    async def add(self, body: Any, now: float) -> Rule:
        """Validate and install a rule for every replica (RuleError / OverflowError as the
        in-memory engine raises them)."""
        build_rule(body, "fault_0", now)  # validation first: nothing invalid is stored
        await self.expire(now)
        raw = orjson.dumps({"body": body, "created": now})
        keys = [self._rules_key, self._ver_key, self._next_key]
        rid = await self.shared.run(lambda c: _ADD(c, keys, [MAX_RULES, _token(), raw]))
        if not rid:
            raise too_many_rules()
        return build_rule(body, rid.decode(), now)

    async def listed(self, now: float) -> list[Rule]:
        """The rules with their shared ``seen``/``fired`` counters."""
        await self.expire(now)
        rules = list(await self.current())

        async def counters(c: Any) -> Any:
            pipe = c.pipeline(transaction=False)
            for r in rules:
                pipe.hmget(self._n_prefix + r.id, "seen", "fired")
            return await pipe.execute()

        for r, (seen, fired) in zip(rules, await self.shared.run(counters), strict=True):
            r.seen, r.fired = int(seen or 0), int(fired or 0)
        return rules

    async def clear(self) -> int:
        return await self._remove(())

    async def remove(self, rule_id: str) -> bool:
        return await self._remove((rule_id,)) > 0


# ------------------------------------------------------------------------------------------
# Script cursors
# ------------------------------------------------------------------------------------------

# ARGV: namespace prefix, session, previous response id ('' none), this response id ('' none),
# ttl s, then (rule index, wanted turn or 0) pairs → {rule index, its cursor before} or nil.
_STEP = Lua("""
local p, key, prev, resp, ttl = ARGV[1], ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5])
if prev ~= '' then
  local c = redis.call('GET', p .. 'chain:' .. prev)
  if c then key = c end
end
if resp ~= '' then redis.call('SET', p .. 'chain:' .. resp, key, 'EX', ttl) end
local epoch = redis.call('GET', p .. 'epoch') or '0'
for j = 6, #ARGV, 2 do
  local ck = p .. 'cur:' .. epoch .. ':' .. ARGV[j] .. ':' .. key
  local n = tonumber(redis.call('GET', ck) or '0')
  local want = tonumber(ARGV[j + 1])
  if want == 0 or n + 1 == want then
    redis.call('SET', ck, n + 1, 'EX', ttl)
    return {tonumber(ARGV[j]), n}
  end
end
return false
""")


class SharedCursors:
    """Per-session script cursors in Redis (see :class:`~llmsim.sim.script.Script`)."""

    def __init__(self, shared: SharedState) -> None:
        self.shared = shared

    def _ns(self, script: Script) -> str:
        return self.shared.key("script", script.digest, "")

    async def step(self, script: Script, session: str, prev: str, response_id: str,
                   candidates: list[tuple[int, int | None]]) -> tuple[int, int] | None:
        """Move the cursor of the first candidate rule whose ``turn`` condition holds for
        ``session`` (or the session ``prev`` continues); → (rule index, cursor before)."""
        args: list[Any] = [self._ns(script), _digest(session), prev[:256], response_id,
                           CURSOR_TTL_S]
        for i, want in candidates:
            args += [i, want or 0]
        hit = await self.shared.run(lambda c: _STEP(c, [], args))
        return None if hit is None else (int(hit[0]), int(hit[1]))

    async def turn(self, script: Script, *, model: str, endpoint: str, api_key: str | None,
                   headers: Mapping[str, str], body: Mapping[str, Any], ask: Ask,
                   response_id: str | None = None) -> Turn | None:
        """``Script.turn`` with the cursors in Redis: the same choice, on any replica."""
        cands = list(script.candidates(model=model, endpoint=endpoint, api_key=api_key,
                                       headers=headers, ask=ask))
        if not cands and response_id is None:
            return None
        prev = body.get("previous_response_id")
        if not isinstance(prev, str) or headers.get(SESSION_HEADER):
            prev = ""  # the header names the session; else a follow-up continues its own
        hit = await self.step(script, session_key(headers, body, api_key), prev,
                              response_id or "", cands)
        return None if hit is None else script.reply(*hit)

    async def restart(self, script: Script) -> None:
        """Start this script's cursors over on every replica (a new install)."""
        key = self._ns(script) + "epoch"

        async def bump(c: Any) -> None:
            await c.incr(key)
            await c.expire(key, EPOCH_TTL_S)

        await self.shared.run(bump)
