"""Rate limits, sans-IO: token buckets for requests and tokens per minute.

Theory of operation. Each (API key, model) pair owns up to two buckets, one for requests
(``rpm``) and one for tokens (``tpm``). A bucket holds at most its per-minute limit and refills
continuously at ``limit / 60`` per second, which is how the real API behaves ("a limit of 60
RPM may be enforced as 1 request per second"). A request is admitted only when *every* bucket
has room; admission takes 1 request and its estimated tokens (prompt estimate + the requested
maximum output tokens, as the real API's limiter counts before generating). A refused request
takes nothing and learns how long until it would fit (``retry-after``).

Limits resolve as: per-key table > per-model table > the global ``rpm``/``tpm`` (0 = no limit).
Buckets are bounded (:data:`MAX_BUCKETS`, least recently used dropped first: a dropped bucket
simply starts full again).
"""

from __future__ import annotations

import datetime as _dt
import math
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..config import RateLimitConfig
from ..errors import E
from .faults import fmt_duration, rate_limit_error

__all__ = ["Bucket", "RateLimiter", "Snapshot", "estimate_tokens", "judge", "MAX_BUCKETS"]

MAX_BUCKETS = 10_000  # (key, model) pairs tracked; API keys and model ids come from clients


class Bucket:
    """A token bucket of ``limit`` per minute, full at creation."""

    __slots__ = ("limit", "level", "t")

    def __init__(self, limit: int, now: float) -> None:
        self.limit = limit
        self.level = float(limit)
        self.t = now

    def refill(self, now: float) -> None:
        if now > self.t:
            self.level = min(float(self.limit), self.level + (now - self.t) * self.limit / 60.0)
            self.t = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` fits (after :meth:`refill`); 0 if it fits now."""
        if self.level >= amount:
            return 0.0
        return (amount - self.level) * 60.0 / self.limit

    def reset_in(self) -> float:
        """Seconds until the bucket is full again (the ``x-ratelimit-reset-*`` value)."""
        return max(0.0, (self.limit - self.level) * 60.0 / self.limit)

    @property
    def remaining(self) -> int:
        return max(0, int(math.floor(self.level + 1e-9)))


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What the ``x-ratelimit-*`` headers say after a decision."""

    req: Bucket | None
    tok: Bucket | None

    def headers(self, anthropic_at: float | None = None) -> list[tuple[str, str]]:
        """OpenAI's ``x-ratelimit-*`` headers; with ``anthropic_at`` (the wall time now),
        Anthropic's ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}`` (reset
        as an RFC 3339 time)."""
        out: list[tuple[str, str]] = []
        for name, b in (("requests", self.req), ("tokens", self.tok)):
            if b is None:
                continue
            if anthropic_at is not None:
                at = _dt.datetime.fromtimestamp(anthropic_at + b.reset_in(), _dt.UTC)
                out += [(f"anthropic-ratelimit-{name}-limit", str(b.limit)),
                        (f"anthropic-ratelimit-{name}-remaining", str(b.remaining)),
                        (f"anthropic-ratelimit-{name}-reset",
                         at.strftime("%Y-%m-%dT%H:%M:%SZ"))]
                continue
            out += [(f"x-ratelimit-limit-{name}", str(b.limit)),
                    (f"x-ratelimit-remaining-{name}", str(b.remaining)),
                    (f"x-ratelimit-reset-{name}", fmt_duration(b.reset_in()))]
        return out


class RateLimiter:
    """Admission decisions for (API key, model) pairs (see module doc)."""

    def __init__(self, config: RateLimitConfig) -> None:
        self.config = config
        self._buckets: OrderedDict[tuple[str, str], tuple[Bucket | None, Bucket | None]] = \
            OrderedDict()

    def limits(self, key: str, model: str) -> tuple[int, int]:
        c = self.config
        rpm, tpm = c.rpm, c.tpm
        for table, name in ((c.models, model), (c.keys, key)):
            lim = table.get(name)
            if lim is not None:
                rpm = lim.rpm if lim.rpm is not None else rpm
                tpm = lim.tpm if lim.tpm is not None else tpm
        return rpm, tpm

    def _get(self, key: str, model: str, now: float) -> tuple[Bucket | None, Bucket | None]:
        k = (key, model)
        pair = self._buckets.get(k)
        if pair is None:
            rpm, tpm = self.limits(key, model)
            pair = (Bucket(rpm, now) if rpm else None, Bucket(tpm, now) if tpm else None)
            self._buckets[k] = pair
            if len(self._buckets) > MAX_BUCKETS:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(k)
        for b in pair:
            if b is not None:
                b.refill(now)
        return pair

    def admit(self, key: str, model: str, tokens: int, now: float) -> Snapshot:
        """Take one request and ``tokens`` or raise the real 429 (with the headers)."""
        req, tok = self._get(key, model, now)
        snap = judge(model, req, tok, tokens)
        if req is not None:
            req.level -= 1
        if tok is not None:
            tok.level -= tokens
        return snap

    def charge(self, key: str, model: str, tokens: int, now: float) -> None:
        """Charge tokens known only afterwards (output of a request without a max): the
        bucket may go below zero, delaying later requests, as a real limiter's debt does."""
        pair = self._buckets.get((key, model))
        if pair is not None and pair[1] is not None and tokens > 0:
            pair[1].refill(now)
            pair[1].level = max(-pair[1].limit, pair[1].level - tokens)


def judge(model: str, req: Bucket | None, tok: Bucket | None, tokens: int) -> Snapshot:
    """The one admission rule: raise the real 429 (with the ``x-ratelimit-*`` headers) unless
    every bucket (refilled to now) has room for one request and ``tokens``; else the snapshot
    whose headers the answer carries. The shared limiter (``--state redis://``) takes the same
    decision atomically in Redis and calls this to word a refusal."""
    snap = Snapshot(req, tok)
    if tok is not None and tokens > tok.limit:
        raise E.request_too_large_tpm.at(model=model, limit=tok.limit, requested=tokens,
                                         headers=snap.headers())
    if req is not None and (w := req.wait_for(1)) > 0:
        raise rate_limit_error(model, "requests", req.limit, req.limit - req.remaining, 1,
                               w, snap.headers())
    if tok is not None and (w := tok.wait_for(tokens)) > 0:
        raise rate_limit_error(model, "tokens", tok.limit, tok.limit - tok.remaining,
                               tokens, w, snap.headers())
    return snap


_TEXT_KEYS = ("messages", "input", "instructions", "tools", "prompt", "functions")
_MAX_KEYS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def _chars(obj: Any, depth: int = 0) -> int:
    if isinstance(obj, str):
        return len(obj)
    if depth > 32:
        return 0
    if isinstance(obj, Mapping):
        return sum(_chars(v, depth + 1) for v in obj.values())
    if isinstance(obj, list):
        return sum(_chars(v, depth + 1) for v in obj)
    return 0


def estimate_tokens(body: Any) -> tuple[int, int | None]:
    """``(prompt estimate, requested max output)`` of a request body: prompt characters / 4
    (rounded up), like the real limiter's estimate, and the body's max-token limit if any."""
    if not isinstance(body, Mapping):
        return 0, None
    chars = sum(_chars(body.get(k)) for k in _TEXT_KEYS)
    mx = None
    for k in _MAX_KEYS:
        v = body.get(k)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            mx = v
            break
    return (chars + 3) // 4, mx
