"""Fault injection, sans-IO: which fault a request gets, and what it looks like.

Theory of operation. One :class:`FaultEngine` serves every API family and transport. For each
request it decides at most one :class:`Fault`, from three triggers in this order:

1. the ``X-LLMSim-Fault`` header (an explicit per-request fault, grammar in :func:`parse_spec`);
2. scenario rules installed at run time (``POST /llmsim/faults``): "the next N matching
   requests", "every Kth", "between t1 and t2". Rules are ordered by nature (they count), so
   their counters are plain integers;
3. configured probabilities per kind (``[faults]``, optionally per model or endpoint).

Probabilistic decisions are reproducible with a server seed: the draw is derived from the seed,
the request content and how many times that same content has been seen (its *occurrence*), never
from a shared counter. Identical requests are interchangeable, so "the 3rd identical request
fails" is the same outcome whatever runs concurrently, and an SDK retry (another occurrence) gets
a fresh draw. Without a seed the draws are random.

The transport glue (``llmsim/api/faults.py``) applies the decision: statuses and resets before
the first byte, and :func:`inject` wraps a stream's plan for the mid-stream kinds.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..config import FAULT_KINDS, FaultRates, FaultsConfig
from ..errors import APIError, E, server_error

__all__ = ["Fault", "FaultEngine", "Rule", "parse_spec", "fault_error", "mid_stream_error",
           "SPEC_HELP", "MID_STREAM", "MAX_RULES"]

MID_STREAM = frozenset({"disconnect", "stall", "error", "truncate"})
STATUSES = (429, 500, 502, 503, 504, 529)
MAX_RULES = 256  # installed scenario rules; a scripted test never needs more
MAX_RULE_STR = 1024  # characters of a rule's string field (model, api_key, fault spec, ...)
MAX_OCCURRENCES = 65536  # distinct request contents remembered for occurrence counting
EPOCH_THRESHOLD = 1_000_000_000  # rule times at or above this are epoch seconds
SPEC_HELP = ("one of 429, 429:tokens, 429:quota, 500, 502, 503, 504, 529, reset, hang:MS, "
             "hang:MS:STATUS, disconnect-after:N, stall-after:N:MS, error-after:N, "
             "error-after:N:STATUS, truncate-after:N")


@dataclass(frozen=True, slots=True)
class Fault:
    """One decided fault.

    ``kind``: ``"status"`` (answer ``status`` now), ``"reset"``, ``"hang"`` (wait ``ms``, then
    drop, or answer ``status`` if set), or a mid-stream kind (``disconnect``, ``stall``,
    ``error``, ``truncate``) acting after ``after`` tokens.
    """

    kind: str
    status: int = 0
    after: int = 0
    ms: float = 0.0
    variant: str = ""  # 429: "requests" | "tokens" | "quota"
    retry_after_ms: float | None = None
    source: str = ""  # "header" | rule id | "random"

    @property
    def mid_stream(self) -> bool:
        return self.kind in MID_STREAM

    def spec(self) -> str:
        """The fault in header grammar (round-trips through :func:`parse_spec`)."""
        k = self.kind
        if k == "status":
            return f"{self.status}:{self.variant}" if self.variant not in ("", "requests") \
                else str(self.status)
        if k == "reset":
            return "reset"
        if k == "hang":
            return f"hang:{_num(self.ms)}" + (f":{self.status}" if self.status else "")
        if k == "stall":
            return f"stall-after:{self.after}:{_num(self.ms)}"
        if k == "error":
            return f"error-after:{self.after}" + (f":{self.status}" if self.status != 500
                                                   else "")
        return f"{k}-after:{self.after}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def _int(s: str, what: str, lo: int = 0) -> int:
    try:
        v = int(s)
    except ValueError:
        raise ValueError(f"{what} must be an integer, got {s!r}") from None
    if v < lo:
        raise ValueError(f"{what} must be >= {lo}")
    return v


def _ms(s: str, what: str) -> float:
    try:
        v = float(s)
    except ValueError:
        raise ValueError(f"{what} must be a number of milliseconds, got {s!r}") from None
    if not 0 <= v <= 3_600_000 or math.isnan(v):
        raise ValueError(f"{what} must be between 0 and 3600000 ms")
    return v


def _status(s: str) -> int:
    v = _int(s, "STATUS")
    if not 400 <= v <= 599:
        raise ValueError("STATUS must be an HTTP error status (400-599)")
    return v


def parse_spec(spec: str, *, source: str = "") -> Fault:
    """Parse the fault grammar shared by the header, scenario rules and docs.

    ``429[:requests|tokens|quota]``, ``500``, ``502``, ``503``, ``504``, ``529`` → that status
    now; ``reset`` → TCP reset before any byte; ``hang:MS[:STATUS]`` → wait, then drop (or
    answer STATUS); ``disconnect-after:N``, ``stall-after:N:MS``, ``error-after:N[:STATUS]``,
    ``truncate-after:N`` → mid-stream after N tokens. Raises ValueError with a reason.
    """
    if not isinstance(spec, str):
        raise ValueError("expected a string")
    parts = spec.strip().lower().split(":")
    head, args = parts[0], parts[1:]

    def nargs(lo: int, hi: int) -> None:
        if not lo <= len(args) <= hi:
            raise ValueError(f"'{head}' takes {lo if lo == hi else f'{lo}-{hi}'} argument(s)")

    if head.isdigit():
        status = int(head)
        if status not in STATUSES:
            raise ValueError(f"unsupported status {status}")
        if status == 429:
            nargs(0, 1)
            variant = args[0] if args else "requests"
            if variant not in ("requests", "tokens", "quota"):
                raise ValueError("429 variant must be requests, tokens or quota")
            return Fault("status", 429, variant=variant, source=source)
        nargs(0, 0)
        return Fault("status", status, source=source)
    if head == "reset":
        nargs(0, 0)
        return Fault("reset", source=source)
    if head == "hang":
        nargs(1, 2)
        return Fault("hang", _status(args[1]) if len(args) > 1 else 0,
                     ms=_ms(args[0], "MS"), source=source)
    if head == "disconnect-after":
        nargs(1, 1)
        return Fault("disconnect", after=_int(args[0], "N"), source=source)
    if head == "truncate-after":
        nargs(1, 1)
        return Fault("truncate", after=_int(args[0], "N"), source=source)
    if head == "stall-after":
        nargs(2, 2)
        return Fault("stall", after=_int(args[0], "N"), ms=_ms(args[1], "MS"), source=source)
    if head == "error-after":
        nargs(1, 2)
        return Fault("error", _status(args[1]) if len(args) > 1 else 500,
                     after=_int(args[0], "N"), source=source)
    raise ValueError(f"unknown fault {head!r}")


# ------------------------------------------------------------------------------------------
# Error bodies and headers, in the real API's words
# ------------------------------------------------------------------------------------------



def fmt_duration(seconds: float) -> str:
    """A duration as the real API prints it (Go style): ``120ms``, ``1s``, ``8.64s``,
    ``6m0s``, ``1h2m3s``."""
    ms = max(0, int(math.ceil(seconds * 1000 - 1e-9)))
    if ms < 1000:
        return f"{ms}ms"
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    if h:
        return f"{h}h{m}m{s}s"
    if m:
        return f"{m}m{s}s"
    return f"{s}s"


def retry_headers(ms: float) -> list[tuple[str, str]]:
    """``retry-after`` (whole seconds, rounded up, at least 1) and ``retry-after-ms``."""
    return [("retry-after", str(max(1, math.ceil(ms / 1000 - 1e-9)))),
            ("retry-after-ms", str(max(0, int(round(ms)))))]


def rate_limit_error(model: str, variant: str, limit: int, used: int, requested: int,
                     wait_s: float, headers: list[tuple[str, str]] | None = None) -> APIError:
    """The real 429 for an exceeded RPM/TPM bucket (type ``requests`` or ``tokens``)."""
    what = "requests per min (RPM)" if variant == "requests" else "tokens per min (TPM)"
    return E.rate_limited.at(type=variant, model=model, what=what, limit=limit, used=used,
                             requested=requested, wait=fmt_duration(wait_s),
                             headers=(headers or []) + retry_headers(wait_s * 1000))


def fault_error(fault: Fault, model: str | None, retry_after_ms: float,
                request_id: str = "") -> APIError:
    """The error a status fault (or a hang ending in a status) answers with."""
    status = fault.status
    model = model or "gpt-4o"
    ra = fault.retry_after_ms if fault.retry_after_ms is not None else retry_after_ms
    if status == 429:
        if fault.variant == "quota":
            return E.insufficient_quota.at()
        if fault.variant == "tokens":
            return rate_limit_error(model, "tokens", 30000, 30000, 1000, ra / 1000)
        return rate_limit_error(model, "requests", 500, 500, 1, ra / 1000)
    retry = [("x-should-retry", "true")]
    if status == 500:
        return server_error(500, None, retry)
    if status == 502:
        return E.bad_gateway.at(headers=retry)
    if status == 503:
        return E.engine_overloaded.at(headers=retry + retry_headers(ra))
    if status == 504:
        return E.gateway_timeout.at(headers=retry)
    if status == 529:
        return E.overloaded_529.at(headers=retry)
    if status >= 500:
        return server_error(status, None, retry)
    return E.injected.at(status=status)


# ------------------------------------------------------------------------------------------
# Scenario rules
# ------------------------------------------------------------------------------------------

@dataclass(slots=True)
class Rule:
    """A scenario rule: when it matches and is due, the request gets ``fault``."""

    id: str
    fault: Fault
    spec: str
    count: int | None = None  # fire at most this many times (then the rule is removed)
    every: int = 1  # fire on every Kth matching request
    probability: float = 1.0
    model: str | None = None
    endpoint: str | None = None
    api_key: str | None = None
    transport: str | None = None
    start: float | None = None  # absolute wall-clock window
    end: float | None = None
    created: float = 0.0
    seen: int = 0  # matching requests inside the window
    fired: int = 0

    def matches(self, model: str | None, endpoint: str, path: str, api_key: str | None,
                transport: str, now: float) -> bool:
        if self.model is not None and self.model != model:
            return False
        if self.endpoint is not None and self.endpoint not in (endpoint, path):
            return False
        if self.api_key is not None and self.api_key != api_key:
            return False
        if self.transport is not None and self.transport != transport:
            return False
        if self.start is not None and now < self.start:
            return False
        return self.end is None or now < self.end

    @property
    def exhausted(self) -> bool:
        return self.count is not None and self.fired >= self.count

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "object": "llmsim.fault_rule", "fault": self.spec,
                "count": self.count, "every": self.every, "probability": self.probability,
                "model": self.model, "endpoint": self.endpoint, "api_key": self.api_key,
                "transport": self.transport, "start": self.start, "end": self.end,
                "created": self.created, "seen": self.seen, "fired": self.fired,
                "retry_after_ms": self.fault.retry_after_ms}


def too_many_rules() -> OverflowError:
    """The refusal of a rule beyond :data:`MAX_RULES` (answered 429 ``too_many_rules``)."""
    return OverflowError(f"too many fault rules (limit {MAX_RULES}); delete some first")


class RuleError(ValueError):
    """An invalid scenario rule; ``param`` names the rule field at fault (None: the rule)."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


def _opt_str(body: Mapping[str, Any], key: str) -> str | None:
    v = body.get(key)
    if v is not None and (not isinstance(v, str) or not v):
        raise RuleError(key, f"'{key}' must be a non-empty string")
    if v is not None and len(v) > MAX_RULE_STR:
        raise RuleError(key, f"'{key}' must be at most {MAX_RULE_STR} characters")
    return v


def _opt_num(body: Mapping[str, Any], key: str) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or math.isnan(v) or v < 0:
        raise RuleError(key, f"'{key}' must be a number >= 0")
    return float(v)


def build_rule(body: Any, rule_id: str, now: float) -> Rule:
    """A Rule from a ``POST /llmsim/faults`` object; ValueError ``(param, message)`` style
    messages start with the offending key in quotes."""
    if not isinstance(body, dict):
        raise RuleError(None, "a rule must be a JSON object")
    known = {"fault", "count", "every", "probability", "model", "endpoint", "api_key",
             "transport", "start", "end", "retry_after_ms"}
    for k in body:
        if k not in known:
            raise RuleError(k, f"'{k}' is not a rule field (known: {', '.join(sorted(known))})")
    spec = body.get("fault")
    if spec is None:
        raise RuleError("fault", "'fault' is required")
    if isinstance(spec, str) and len(spec) > MAX_RULE_STR:
        raise RuleError("fault", f"'fault' must be at most {MAX_RULE_STR} characters")
    try:
        fault = parse_spec(spec, source=rule_id)
    except ValueError as exc:
        raise RuleError("fault", f"'fault' is invalid: {exc}; expected {SPEC_HELP}") from None
    count = body.get("count")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                              or count < 1):
        raise RuleError("count", "'count' must be an integer >= 1 (or null for no limit)")
    every = body.get("every", 1)
    if isinstance(every, bool) or not isinstance(every, int) or every < 1:
        raise RuleError("every", "'every' must be an integer >= 1")
    prob = _opt_num(body, "probability")
    if prob is not None and prob > 1:
        raise RuleError("probability", "'probability' must be between 0 and 1")
    ra = _opt_num(body, "retry_after_ms")
    if ra is not None:
        fault = Fault(fault.kind, fault.status, fault.after, fault.ms, fault.variant, ra,
                      fault.source)
    transport = _opt_str(body, "transport")
    if transport not in (None, "http", "ws"):
        raise RuleError("transport", "'transport' must be 'http' or 'ws'")

    def when(key: str) -> float | None:
        v = _opt_num(body, key)
        if v is None:
            return None
        return v if v >= EPOCH_THRESHOLD else now + v

    start, end = when("start"), when("end")
    if start is not None and end is not None and end <= start:
        raise RuleError("end", "'end' must be after 'start'")
    return Rule(rule_id, fault, fault.spec(), count, every, 1.0 if prob is None else prob,
                _opt_str(body, "model"), _opt_str(body, "endpoint"), _opt_str(body, "api_key"),
                transport, start, end, now)


# ------------------------------------------------------------------------------------------
# The engine
# ------------------------------------------------------------------------------------------

@dataclass(slots=True)
class FaultEngine:
    """Decides faults for requests (see module doc). Owns the scenario rules."""

    config: FaultsConfig
    seed: int | None = None
    rules: list[Rule] = field(default_factory=list)
    _next_id: int = 1
    _occ: OrderedDict[bytes, int] = field(default_factory=OrderedDict)
    fired: dict[str, int] = field(default_factory=dict)  # totals per fault spec kind
    has_random: bool = False  # any probability configured (set in __post_init__)

    def __post_init__(self) -> None:
        c = self.config
        # decided once (the config is frozen): the per-request fast path is one attribute read
        self.has_random = any(getattr(c, "p_" + k) for k in FAULT_KINDS) or bool(
            c.models or c.endpoints)

    # -- rules ---------------------------------------------------------------------------
    def add_rule(self, body: Any, now: float) -> Rule:
        if len(self.rules) >= MAX_RULES:
            raise too_many_rules()
        rule = build_rule(body, f"fault_{self._next_id}", now)
        self._next_id += 1
        self.rules.append(rule)
        return rule

    def remove_rule(self, rule_id: str) -> bool:
        for i, r in enumerate(self.rules):
            if r.id == rule_id:
                del self.rules[i]
                return True
        return False

    def clear(self) -> int:
        n = len(self.rules)
        self.rules.clear()
        return n

    def expire(self, now: float) -> None:
        """Drop rules whose window has passed."""
        self.rules = [r for r in self.rules if r.end is None or now < r.end]

    # -- decisions -----------------------------------------------------------------------
    def rng(self, key: bytes) -> random.Random:
        """The RNG for one request content's next occurrence (see module doc)."""
        if self.seed is None:
            return random.Random(int.from_bytes(os.urandom(8), "little"))
        occ = self._occ
        n = occ.get(key, 0)
        occ[key] = n + 1
        occ.move_to_end(key)
        if len(occ) > MAX_OCCURRENCES:
            occ.popitem(last=False)
        h = hashlib.blake2b(key, digest_size=16, key=f"{self.seed}|faults|{n}".encode()[:64])
        return random.Random(int.from_bytes(h.digest(), "little"))

    def decide(self, *, model: str | None, endpoint: str, path: str, api_key: str | None,
               transport: str, now: float, key: bytes,
               header: str | None = None) -> Fault | None:
        """The fault for one request, or None. ``header`` is the X-LLMSim-Fault value
        (ValueError if malformed); ``now`` is wall-clock seconds; ``key`` identifies the
        request content (method, path, body) for reproducible draws."""
        if header is not None and self.config.header:
            hf = parse_spec(header, source="header")
            self.count(hf)
            return hf
        if self.rules:
            f = self._from_rules(model, endpoint, path, api_key, transport, now, key)
            if f is not None:
                self.count(f)
                return f
        if self.has_random:
            f = self._draw(model, endpoint, key)
            if f is not None:
                self.count(f)
            return f
        return None

    def count(self, f: Fault) -> None:
        k = f.spec().split(":")[0]
        if len(self.fired) < 64 or k in self.fired:
            self.fired[k] = self.fired.get(k, 0) + 1

    def _from_rules(self, model: str | None, endpoint: str, path: str, api_key: str | None,
                    transport: str, now: float, key: bytes) -> Fault | None:
        for rule in list(self.rules):
            if rule.end is not None and now >= rule.end:
                self.rules.remove(rule)
                continue
            if not rule.matches(model, endpoint, path, api_key, transport, now):
                continue
            rule.seen += 1
            if rule.seen % rule.every:
                continue
            if not self.draw(rule, key):
                continue
            rule.fired += 1
            if rule.exhausted:
                self.rules.remove(rule)
            return rule.fault
        return None

    def draw(self, rule: Rule, key: bytes) -> bool:
        """Whether a due ``rule`` fires by its ``probability`` (reproducible with a seed)."""
        return rule.probability >= 1.0 or \
            self.rng(key + rule.id.encode()).random() < rule.probability

    def rates(self, model: str | None, endpoint: str) -> dict[str, float]:
        """Effective probabilities: model table > endpoint table > global."""
        c = self.config
        out = {k: getattr(c, "p_" + k) for k in FAULT_KINDS}
        for table, name in ((c.endpoints, endpoint), (c.models, model)):
            over: FaultRates | None = table.get(name) if name else None
            if over is not None:
                for k in FAULT_KINDS:
                    v = getattr(over, "p_" + k)
                    if v is not None:
                        out[k] = v
        return out

    def _draw(self, model: str | None, endpoint: str, key: bytes) -> Fault | None:
        rates = self.rates(model, endpoint)
        if not any(rates.values()):
            return None
        rng = self.rng(key)
        u = rng.random()
        acc = 0.0
        for kind in FAULT_KINDS:
            acc += rates[kind]
            if u < acc:
                return self._make(kind, rng)
        return None

    def _make(self, kind: str, rng: random.Random) -> Fault:
        c = self.config
        if kind.isdigit():
            return Fault("status", int(kind), variant="requests" if kind == "429" else "",
                         source="random")
        if kind == "reset":
            return Fault("reset", source="random")
        if kind == "hang":
            return Fault("hang", c.hang_status, ms=c.hang_ms, source="random")
        after = rng.randint(c.after_min, c.after_max)
        if kind == "stall":
            return Fault("stall", after=after, ms=c.stall_ms, source="random")
        if kind == "error":
            return Fault("error", c.error_status, after=after, source="random")
        return Fault(kind, after=after, source="random")


def mid_stream_error(status: int) -> APIError:
    """The error object reported inside a stream that fails after it started."""
    if status == 429:
        return E.mid_stream_rate_limited.at()
    if status in (503, 529):
        return E.mid_stream_overloaded.at(status=status)
    if status >= 500:
        return server_error(status)
    return E.injected.at(status=status)
