"""Live counters, gauges and latency histograms; mergeable across worker processes.

Theory of operation. Everything is a plain number, a dict of numbers or a fixed-bucket
histogram (a list of counts), so the whole state snapshots to a plain dict (:meth:`Stats.raw`)
and N snapshots merge by addition (:func:`merge`): counters sum, gauges sum, histograms sum
bucket by bucket. :func:`render` turns a (merged) raw snapshot into the ``/llmsim/stats`` JSON
view (percentiles, rates, per-model breakdown); ``state/prom.py`` turns it into Prometheus text.

Hot path. Per streamed token the cost is an append of the write's time to the stream's list
(:class:`StreamTrack`); every ``FOLD_EVERY`` tokens, and when the stream ends, the list is
folded into the histograms, one :func:`bucket` per bucket its gaps fall in. Everything else
(request counts, e2e latency, rates) happens once per request. Rates need no per-event
clock read: once per second (driven by requests or by reads of the stats) the cumulative totals
are copied into a bounded ring, and a rate over the window is the difference of two copies.

Bounded. Label values that come from clients (model ids) are capped at ``MAX_KEYS`` distinct
values, the rest are counted under ``"other"``; error kinds are capped the same way; the ring
holds ``RING_S`` one-second entries. Every label value is also capped in length where it enters
(:func:`label`, called by :meth:`Stats.model_key` and :meth:`Stats.error`): one longer than
``MAX_LABEL`` characters keeps its head and ends in ``~`` and a hash of the whole value, so two
distinct long ids stay two distinct labels of ``MAX_LABEL`` characters. Every view (the
``/llmsim/stats`` JSON keys, ``/metrics`` labels, the dashboard) reads these bounded keys, so
64 model ids of 64 KiB cost 64 × 128 characters per series, not 4 MiB.

Gauges never leak: every ``*_open`` has exactly one ``*_close`` (callers use try/finally or
``on_close``); a :class:`StreamTrack` closes its gauges once, whatever ends the stream.
"""

from __future__ import annotations

import hashlib
import time
from bisect import bisect_left, bisect_right
from collections import Counter, deque
from collections.abc import Callable, Iterable
from itertools import chain
from math import exp as _exp
from math import log as _log
from operator import add as _add
from operator import sub as _sub
from typing import TYPE_CHECKING, Any

import orjson

if TYPE_CHECKING:
    from ..sim.decide import Usage

__all__ = ["Stats", "StreamTrack", "BOUNDS", "EXPORT_BOUNDS", "HISTS", "merge", "render",
           "quantile", "MAX_KEYS", "MAX_LABEL", "label", "usage_tokens", "error_kind"]

MAX_KEYS = 64  # distinct model ids / error kinds kept as labels; more → "other"
MAX_LABEL = 128  # characters of a label value; longer: head + "~" + 8 hex digits of a hash
RING_S = 64  # one-second snapshots of the totals kept for windowed rates
WINDOW_S = 10.0  # the "recent" window for rates and windowed percentiles
HISTS = ("ttft", "itl", "e2e")  # time to first token, inter-token gap, end-to-end

# Fine log-spaced bucket upper bounds (seconds), each at most BUCKET_RATIO times the one
# below, from 100 µs to 1000 s: a percentile interpolated inside a bucket is within
# BUCKET_RATIO - 1 = 2% of the true value (relative error, every percentile, any load).
# Prometheus gets the 1-2.5-5 subset (also bounds here: exact cumulative counts at those
# bounds; few series).
BUCKET_RATIO = 1.02
PERCENTILE_RELATIVE_ERROR = BUCKET_RATIO - 1.0
_EXPORTED = tuple(round(m * 10.0 ** e, 10) for e in range(-4, 4) for m in (1.0, 2.5, 5.0))


def _bounds() -> tuple[float, ...]:
    out = set(_EXPORTED)
    b = 1e-4
    while b < 1000.0:
        out.add(float(f"{b:.6g}"))
        b *= BUCKET_RATIO * 0.9999  # (rounding never widens a bucket past the ratio)
    return tuple(sorted(x for x in out if x <= 1000.0))


BOUNDS: tuple[float, ...] = _bounds()
NB = len(BOUNDS) + 1  # counts per histogram, the last is the +Inf bucket; then the sum

# indices into BOUNDS exposed as Prometheus ``le`` buckets
EXPORT_BOUNDS: tuple[int, ...] = tuple(BOUNDS.index(b) for b in _EXPORTED if b <= 1000.0)

# bucket(): the log of a value names a cell of _CELLS_PER_E per unit, narrower than a
# bucket, and _FIRST[cell] the lowest bucket the cell's values can fall in: a step or two
# from there, not a binary search of ten probes through BOUNDS (a cold cache line each)
_CELLS_PER_E = 128
_LOG_B0 = _log(BOUNDS[0])
_B0 = BOUNDS[0]
_BLAST = BOUNDS[-1]
_FIRST: list[int] = [
    bisect_left(BOUNDS, _exp(_LOG_B0 + c / _CELLS_PER_E) * (1.0 - 1e-9))
    for c in range(int((_log(_BLAST) - _LOG_B0) * _CELLS_PER_E) + 2)]


def bucket(v: float) -> int:
    """The histogram bucket of ``v``: ``bisect_left(BOUNDS, v)``, in a step or two."""
    if not v > _B0:  # (NaN too: bisect_left's 0)
        return 0
    if v > _BLAST:
        return NB - 1
    i = _FIRST[int((_log(v) - _LOG_B0) * _CELLS_PER_E)]
    while BOUNDS[i] < v:
        i += 1
    return i


def label(value: str) -> str:
    """``value`` bounded to ``MAX_LABEL`` characters: unchanged when it fits, else its first
    ``MAX_LABEL - 9`` characters, ``~`` and 8 hex digits of a hash of the whole value (distinct
    long values stay distinct)."""
    if len(value) <= MAX_LABEL:
        return value
    h = hashlib.blake2b(value.encode("utf-8", "surrogatepass"), digest_size=4).hexdigest()
    return f"{value[:MAX_LABEL - 9]}~{h}"


def usage_tokens(u: Any) -> tuple[int, int]:
    """``(prompt tokens, visible output tokens)`` of a Chat or Responses ``usage`` object."""
    if type(u) is not dict:
        return 0, 0
    p = u.get("prompt_tokens", u.get("input_tokens")) or 0
    o = u.get("completion_tokens", u.get("output_tokens")) or 0
    d = u.get("completion_tokens_details") or u.get("output_tokens_details")
    r = d.get("reasoning_tokens") or 0 if type(d) is dict else 0
    try:
        return int(p), int(o) - int(r)
    except (TypeError, ValueError):
        return 0, 0


def error_kind(status: int, body: Any) -> str:
    """The error kind of an error response: its envelope's ``code``, else its ``type``, else
    ``http_<status>``. ``body`` is the JSON bytes or the parsed dict."""
    try:
        if type(body) is bytes:
            body = orjson.loads(body)
        err = body["error"]
        kind = err.get("code") or err.get("type")
        if isinstance(kind, str) and kind:
            return kind[:64]
    except Exception:
        pass
    return f"http_{status}"


_INF = float("inf")


def _new_hist() -> list[Any]:
    h: list[Any] = [0] * NB
    h.append(0.0)
    return h


FOLD_EVERY = 128
"""Token-write times a stream keeps before folding them into its histograms (see
:class:`StreamTrack`): a bound on the buffer (a pointer each), not on what a read sees (every
read folds the live streams first). A fold's cost is mostly its first touch of the times and
buckets, not their number: fewer, larger folds cost less per token."""


class _Observer:
    """:attr:`StreamTrack.observe`: called per event written (``observe(type, data, now)``);
    ``times``, ``fold``, ``fold_every`` and ``per_write`` are the per-write protocol the pump
    uses instead (see StreamTrack). A small object rather than closures: a stream creates one,
    and its fold runs once per ``fold_every`` tokens."""

    __slots__ = ("is_token", "track", "ttft_h", "itl_h", "times", "last")
    fold_every = FOLD_EVERY

    def __init__(self, track: StreamTrack, is_token: Callable[[str, Any], bool],
                 ttft_h: list[Any], itl_h: list[Any]) -> None:
        self.is_token = is_token
        self.track = track
        self.ttft_h = ttft_h
        self.itl_h = itl_h
        self.times: list[float] = []
        self.last = -1.0

    def fold(self) -> None:
        """Turn the held token-write times into the histograms and counts."""
        times = self.times
        n = len(times)
        if not n:
            return
        track = self.track
        start = self.last
        if start < 0.0:  # the first token: its time is the TTFT
            start = times[0]
            track.first = start
            v = start - track.t0
            self.ttft_h[bucket(v)] += 1
            self.ttft_h[-1] += v
            gaps = map(_sub, times[1:], times)
        else:
            gaps = map(_sub, times, chain((start,), times))
        # the gaps sorted (in C), then one step per bucket they fall in: the bucket of the
        # smallest gap not yet counted, and how many gaps it holds (paced gaps: a few steps)
        g = sorted(gaps)
        m = len(g)
        bounds = BOUNDS
        nb = len(bounds)
        itl_h = self.itl_h
        i = 0
        while i < m:
            idx = bucket(g[i])
            j = bisect_right(g, bounds[idx], i + 1) if idx < nb else m
            itl_h[idx] += j - i
            i = j
        last = times[-1]
        itl_h[-1] += last - start  # (the gaps' sum: they add up to the span)
        self.last = last
        track.tokens += n
        times.clear()

    def per_write(self, n: int, now: float) -> None:
        """``n`` (≥ 1) token events written together at ``now``."""
        times = self.times
        if n == 1:
            times.append(now)
        else:
            times.extend([now] * n)
        if len(times) >= FOLD_EVERY:
            self.fold()

    def __call__(self, etype: str, data: Any, now: float) -> None:
        if self.is_token(etype, data):
            self.per_write(1, now)


class StreamTrack:
    """Latency and gauge bookkeeping for one stream, whatever transport writes it.

    Pass :attr:`observe` as the :class:`~llmsim.streaming.flow.Pump` observer (called for every event
    written, with the clock time of the write; None when the stream cannot tell tokens). It
    carries the cheaper per-write protocol the pump uses instead: ``observe.times``, a list
    the pump appends the write time to once per token written, calling ``observe.fold()``
    when it holds ``observe.fold_every`` times; ``observe.per_write(n, now)`` does both for
    ``n`` tokens written together. :meth:`fold` turns the times into the histograms (TTFT:
    the first token write − ``t0``, the request's ``received_at``; the inter-token gap: the
    time between consecutive token writes, 0 within one write), the counts and
    :attr:`first`; :class:`Stats` folds its live streams before it reads them, and
    :meth:`finish` (call it when the stream ends for any reason; idempotent) folds the rest.
    Batched, a token costs an append here, not a call with a bucket search (issue 15).
    """

    __slots__ = ("stats", "key", "t0", "first", "tokens", "base", "_e2e", "done", "transport",
                 "prompt", "observe", "usage")

    def __init__(self, stats: Stats, key: str, t0: float, transport: str,
                 is_token: Callable[[str, Any], bool] | None) -> None:
        self.stats = stats
        self.key = key
        self.t0 = t0
        self.transport = transport
        self.first: float | None = None
        self.tokens = 0
        self.base = 0  # tokens already counted before a stats reset
        self.prompt = 0
        self.usage: Usage | None = None  # what the stream bills if it ends "completed"
        self.done = False
        ttft_h, itl_h, self._e2e = stats._hist(key)
        self.observe: _Observer | None = None
        if is_token is not None:
            self.observe = _Observer(self, is_token, ttft_h, itl_h)

    def fold(self) -> None:
        """Fold the token writes the observer holds (see the class doc)."""
        if self.observe is not None:
            self.observe.fold()

    @property
    def ttft(self) -> float | None:
        """Seconds from request to first token write, or None (no token written)."""
        return None if self.first is None else self.first - self.t0

    def finish(self, reason: str, now: float) -> None:
        """The stream ended (``completed``/``stopped``/``disconnect``/``cancelled``/``error``/
        ``write_stall``)."""
        if self.done:
            return
        obs = self.observe
        if obs is not None and obs.times:  # (fold, when there is anything to fold)
            obs.fold()
        # the observer holds this track: let go of it, so the stream's objects are freed
        # when it ends, not by a full garbage collection a few seconds later (a pause every
        # stream in flight sees; issue 15)
        self.observe = None
        self.done = True
        st = self.stats
        st.active_streams -= 1
        running = st.running
        running[self.key] = running.get(self.key, 1) - 1
        st.stream_ends[reason] += 1
        st._live.discard(self)
        st.tokens_delivered += self.tokens - self.base
        if reason == "cancelled":
            st.error("client_disconnect")
        v = now - self.t0
        h = self._e2e
        h[bucket(v)] += 1
        h[-1] += v
        m = st.models.get(self.key)
        if m is not None:
            m[1] += self.tokens - self.base


class Stats:
    """Counters, gauges and histograms of one process (see the module doc).

    The API used by the transports and handlers: ``conn_open/close``, ``request_open/close``,
    ``stream_open/close``, ``ws_open/close`` (gauges); :meth:`record` (one per request, at
    response time); :meth:`usage` (billed tokens); :meth:`error` (an error by kind, e.g. an
    injected fault); :meth:`set_gauge` (e.g. ``queue_depth`` per model for the capacity model);
    :meth:`track` (a stream's latency observer); :meth:`raw` / :func:`merge` / :func:`render`.
    """

    def __init__(self, time_fn: Callable[[], float] = time.time) -> None:
        self._time = time_fn
        self.started = time_fn()
        self.active_connections = 0
        self.active_requests = 0
        self.active_streams = 0
        self.active_websockets = 0
        self.running: dict[str, int] = {}  # model key → requests generating (streams + JSON)
        self.gauges: dict[str, dict[str, float]] = {}  # name → model key → value
        self._live: set[StreamTrack] = set()  # open streams (their tokens count as delivered)
        # --engine: each serving engine's state, counters and histograms (api/serving.py;
        # vLLM's own counters: a stats reset leaves them, as restarting vLLM would not)
        self.engines_view: Callable[[], list[dict[str, Any]]] | None = None
        self.reset()

    def reset(self) -> None:
        """Zero every counter and histogram; live gauges (active, running, queue) stay."""
        now = self._time()
        self.reset_at = now
        self.requests: Counter[tuple[str, str, str, int]] = Counter()  # endpoint,model,tr,status
        self.requests_n = 0
        self.errors: Counter[str] = Counter()
        self.errors_n = 0
        self.stream_ends: Counter[str] = Counter()
        self.tokens_in = 0
        self.tokens_out = 0
        self.tokens_reasoning = 0
        self.tokens_delivered = 0
        self.cache_queries = 0  # prompt tokens looked up in the prompt cache
        self.cache_hits = 0  # of those, found cached (read)
        self.cache_writes = 0  # written by cache_control (Anthropic)
        self.connections_total = 0
        self.streams_total = 0
        self.websockets_total = 0
        self.models: dict[str, list[int]] = {}  # key → [prompt_tokens, delivered_tokens]
        self.hists: dict[str, tuple[list[Any], list[Any], list[Any]]] = {}
        for t in self._live:
            t.fold()
            t.base = t.tokens
        live = {k for k, v in self.running.items() if v}
        for g in self.gauges.values():
            live.update(k for k, v in g.items() if v)
        self._models: set[str] = live
        self._ring: deque[tuple[Any, ...]] = deque(maxlen=RING_S)
        self._ring_sec = int(now)
        self._ring.append(self._totals(now))

    # -- gauges ----------------------------------------------------------------------------
    def conn_open(self) -> None:
        self.active_connections += 1
        self.connections_total += 1

    def conn_close(self) -> None:
        self.active_connections -= 1

    def request_open(self) -> None:
        self.active_requests += 1

    def request_close(self) -> None:
        self.active_requests -= 1

    def stream_open(self) -> None:
        self.active_streams += 1
        self.streams_total += 1

    def stream_close(self) -> None:
        self.active_streams -= 1

    def ws_open(self) -> None:
        """A WebSocket session was established (101 sent)."""
        self.active_websockets += 1
        self.websockets_total += 1

    def ws_close(self) -> None:
        self.active_websockets -= 1

    def running_open(self, model: str | None) -> str:
        """A non-streamed request started generating for ``model``; returns the key to pass
        to :meth:`running_close` (vLLM's ``num_requests_running``)."""
        key = self.model_key(model)
        self.running[key] = self.running.get(key, 0) + 1
        return key

    def running_close(self, key: str) -> None:
        self.running[key] = self.running.get(key, 1) - 1

    def set_gauge(self, name: str, model: str | None, value: float) -> None:
        """Set a per-model gauge, e.g. ``set_gauge("queue_depth", "gpt-4o", 3)``; exported as
        ``llmsim_<name>{model}`` (``queue_depth`` also as ``vllm:num_requests_waiting``)."""
        g = self.gauges.get(name)
        if g is None:
            g = self.gauges[name] = {}
        g[self.model_key(model)] = value

    # -- counters --------------------------------------------------------------------------
    def model_key(self, model: str | None) -> str:
        """The label value for ``model``: itself (bounded in length by :func:`label`) for the
        first ``MAX_KEYS`` ids, else ``"other"``; ``""`` when unknown."""
        if not model:
            return ""
        if len(model) > MAX_LABEL:
            model = label(model)
        if model in self._models:
            return model
        if len(self._models) < MAX_KEYS:
            self._models.add(model)
            return model
        return "other"

    def record(self, endpoint: str, model: str | None, transport: str, status: int,
               error: str | None = None) -> None:
        """Count one request (at response time). ``transport``: http | sse | ws."""
        self._count(endpoint, self.model_key(model), transport, status, error)

    def _count(self, endpoint: str, key: str, transport: str, status: int,
               error: str | None = None) -> None:
        """:meth:`record` for a model already made a label (``key``: :meth:`model_key`)."""
        self.requests[(endpoint, key, transport, status)] += 1
        self.requests_n += 1
        if error:
            self.error(error)
        now = self._time()
        if int(now) != self._ring_sec:
            self._tick(now)

    def error(self, kind: str, n: int = 1) -> None:
        """Count an error by kind (``rate_limit_exceeded``, ``fault_disconnect``, ...)."""
        errors = self.errors
        if len(kind) > MAX_LABEL:
            kind = label(kind)
        if kind not in errors and len(errors) >= MAX_KEYS:
            kind = "other"
        errors[kind] += n
        self.errors_n += n

    def prompt_cache(self, queried: int, read: int, written: int = 0) -> None:
        """One prompt-cache lookup: ``queried`` prompt tokens, ``read`` of them cached,
        ``written`` newly cached (vLLM's prefix_cache_queries/hits count tokens too)."""
        self.cache_queries += queried
        self.cache_hits += read
        self.cache_writes += written

    def usage(self, tokens_in: int, tokens_out: int, reasoning: int = 0) -> None:
        """Billed tokens of one response (streams: when the plan reaches its usage)."""
        self.tokens_in += tokens_in
        self.tokens_out += tokens_out
        self.tokens_reasoning += reasoning

    def delivered(self, model: str | None, prompt_tokens: int, tokens: int,
                  e2e: float | None = None) -> None:
        """A complete (non-streamed) response with ``tokens`` output tokens was written;
        ``e2e`` is its end-to-end latency in seconds."""
        key = self.model_key(model)
        m = self.models.get(key)
        if m is None:
            m = self.models[key] = [0, 0]
        m[0] += prompt_tokens
        m[1] += tokens
        self.tokens_delivered += tokens
        if e2e is not None:
            h = self._hist(key)[2]
            h[bucket(e2e)] += 1
            h[-1] += e2e

    def track(self, model: str | None, t0: float, transport: str,
              is_token: Callable[[str, Any], bool] | None,
              prompt_tokens: int = 0) -> StreamTrack:
        """Open a stream's gauges (active streams, running per model) and return its
        :class:`StreamTrack`; its ``finish`` closes them."""
        return self._track(self.model_key(model), t0, transport, is_token, prompt_tokens)

    def stream_started(self, endpoint: str, model: str | None, transport: str, status: int,
                       t0: float, is_token: Callable[[str, Any], bool] | None,
                       prompt_tokens: int = 0) -> StreamTrack:
        """A stream's head was written: :meth:`record` the request and :meth:`track` the
        stream, the model's label looked up once (once per streamed request)."""
        key = self.model_key(model)
        self._count(endpoint, key, transport, status)
        return self._track(key, t0, transport, is_token, prompt_tokens)

    def _track(self, key: str, t0: float, transport: str,
               is_token: Callable[[str, Any], bool] | None, prompt_tokens: int) -> StreamTrack:
        self.active_streams += 1  # (stream_open)
        self.streams_total += 1
        self.running[key] = self.running.get(key, 0) + 1
        m = self.models.get(key)
        if m is None:
            m = self.models[key] = [0, 0]
        m[0] += prompt_tokens
        t = StreamTrack(self, key, t0, transport, is_token)
        t.prompt = prompt_tokens
        self._live.add(t)
        return t

    def delivered_total(self) -> int:
        """Output tokens written so far: finished responses plus streams in flight."""
        self.fold_live()
        return self._delivered()

    def _delivered(self) -> int:
        return self.tokens_delivered + sum(t.tokens - t.base for t in self._live)

    def fold_live(self) -> None:
        """Fold the token writes the live streams hold (:class:`StreamTrack`) into the
        counts and histograms: every read of them calls this first."""
        for t in self._live:  # (StreamTrack.fold, inlined: once per live stream)
            obs = t.observe
            if obs is not None and obs.times:
                obs.fold()

    def _hist(self, key: str) -> tuple[list[Any], list[Any], list[Any]]:
        h = self.hists.get(key)
        if h is None:
            h = self.hists[key] = (_new_hist(), _new_hist(), _new_hist())
        return h

    # -- windows ---------------------------------------------------------------------------
    def _totals(self, now: float) -> tuple[Any, ...]:
        """The running totals (the caller folded the live streams)."""
        hs = []
        for i in range(3):
            tot: list[Any] = [0] * (NB + 1)  # counts and the sum
            for h in self.hists.values():
                tot = list(map(_add, tot, h[i]))  # (bucket by bucket, in C)
            hs.append(tot)
        return (now, self.requests_n, self._delivered(), self.tokens_in, self.errors_n, hs)

    def _tick(self, now: float) -> None:
        self._ring_sec = int(now)
        self.fold_live()
        self._ring.append(self._totals(now))

    def _window(self, now: float) -> dict[str, Any]:
        cur = self._totals(now)  # (raw folded the live streams)
        if int(now) != self._ring_sec:
            self._ring_sec = int(now)
            self._ring.append(cur)
        base = self._ring[0]
        for e in reversed(self._ring):
            if e[0] <= now - WINDOW_S:
                base = e
                break
        dt = max(now - base[0], 1e-9)
        d = [cur[i] - base[i] for i in range(1, 5)]
        return {"seconds": round(now - base[0], 3),
                "requests": d[0], "tokens": d[1], "input_tokens": d[2], "errors": d[3],
                "rates": {"requests_per_s": d[0] / dt, "tokens_per_s": d[1] / dt,
                          "input_tokens_per_s": d[2] / dt, "errors_per_s": d[3] / dt},
                "hist": {name: [a - b for a, b in zip(cur[5][i], base[5][i], strict=True)]
                         for i, name in enumerate(HISTS)}}

    # -- snapshots -------------------------------------------------------------------------
    def raw(self) -> dict[str, Any]:
        """A plain, JSON-able, mergeable snapshot (see :func:`merge`, :func:`render`)."""
        self.fold_live()
        now = self._time()
        return {
            "v": 1, "workers": 1, "time": now, "started": self.started,
            "reset_at": self.reset_at,
            "counters": {"connections_total": self.connections_total,
                         "requests_total": self.requests_n, "errors_total": self.errors_n,
                         "streams_total": self.streams_total,
                         "websockets_total": self.websockets_total,
                         "tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
                         "tokens_reasoning": self.tokens_reasoning,
                         "tokens_delivered": self._delivered(),
                         "prompt_cache_queries": self.cache_queries,
                         "prompt_cache_hits": self.cache_hits,
                         "prompt_cache_writes": self.cache_writes},
            "gauges": {"connections": self.active_connections,
                       "requests": self.active_requests, "streams": self.active_streams,
                       "websockets": self.active_websockets},
            "requests": [[ep, m, tr, st, n] for (ep, m, tr, st), n in self.requests.items()],
            "errors": dict(self.errors),
            "stream_ends": dict(self.stream_ends),
            "models": {k: list(v) for k, v in self.models.items()},
            "running": dict(self.running),
            "model_gauges": {name: dict(g) for name, g in self.gauges.items()},
            "hist": {k: {name: list(h[i]) for i, name in enumerate(HISTS)}
                     for k, h in self.hists.items()},
            "window": self._window(now),
            "engines": self.engines_view() if self.engines_view is not None else [],
        }

    def snapshot(self) -> dict[str, Any]:
        """The ``/llmsim/stats`` JSON view of this process."""
        return render(self.raw())

    @staticmethod
    def merge(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any]:
        """Merge raw snapshots of several workers (see :func:`merge`)."""
        return merge(snapshots)


# ------------------------------------------------------------------------------------------
# Merging and rendering (pure functions over raw snapshots)
# ------------------------------------------------------------------------------------------

def _add_into(dst: dict[str, Any], src: dict[str, Any]) -> None:
    for k, v in src.items():
        dst[k] = dst.get(k, 0) + v


def _add_list(dst: list[Any] | None, src: list[Any]) -> list[Any]:
    if dst is None:
        return list(src)
    for i, v in enumerate(src):
        dst[i] += v
    return dst


def merge(snapshots: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Sum raw snapshots (from :meth:`Stats.raw`) of several processes into one raw snapshot.

    Counters, gauges, histogram buckets and windowed rates add up; ``started`` is the
    earliest; model keys beyond ``MAX_KEYS`` (across workers) fold into ``"other"``.
    """
    snaps = list(snapshots)
    if len(snaps) == 1:
        return snaps[0]
    out: dict[str, Any] = {"v": 1, "workers": 0, "time": 0.0, "started": float("inf"),
                           "reset_at": 0.0, "counters": {}, "gauges": {}, "requests": [],
                           "errors": {}, "stream_ends": {}, "models": {}, "running": {},
                           "model_gauges": {}, "hist": {},
                           "window": {"seconds": 0.0, "requests": 0, "tokens": 0,
                                      "input_tokens": 0, "errors": 0, "rates": {},
                                      "hist": {}}}
    reqs: Counter[tuple[Any, ...]] = Counter()
    keys: Counter[str] = Counter()
    for s in snaps:
        for row in s["requests"]:
            keys[row[1]] += row[4]
        for k in s["hist"]:
            keys[k] += 0
        for k in s["models"]:
            keys[k] += 0
    keep = {k for k, _ in keys.most_common(MAX_KEYS)} | {""}

    def fold(k: str) -> str:
        return k if k in keep else "other"

    for s in snaps:
        out["workers"] += s.get("workers", 1)
        out["time"] = max(out["time"], s["time"])
        out["started"] = min(out["started"], s["started"])
        out["reset_at"] = max(out["reset_at"], s["reset_at"])
        _add_into(out["counters"], s["counters"])
        _add_into(out["gauges"], s["gauges"])
        for ep, m, tr, st, n in s["requests"]:
            reqs[(ep, fold(m), tr, st)] += n
        _add_into(out["errors"], s["errors"])
        _add_into(out["stream_ends"], s["stream_ends"])
        for k, v in s["models"].items():
            out["models"][fold(k)] = _add_list(out["models"].get(fold(k)), v)
        for k, v in s["running"].items():
            out["running"][fold(k)] = out["running"].get(fold(k), 0) + v
        for name, g in s["model_gauges"].items():
            dst = out["model_gauges"].setdefault(name, {})
            for k, v in g.items():
                dst[fold(k)] = dst.get(fold(k), 0) + v
        for k, hs in s["hist"].items():
            dst = out["hist"].setdefault(fold(k), {})
            for name, h in hs.items():
                dst[name] = _add_list(dst.get(name), h)
        w, ow = s["window"], out["window"]
        ow["seconds"] = max(ow["seconds"], w["seconds"])
        for f in ("requests", "tokens", "input_tokens", "errors"):
            ow[f] += w[f]
        _add_into(ow["rates"], w["rates"])
        for name, h in w["hist"].items():
            ow["hist"][name] = _add_list(ow["hist"].get(name), h)
    out["requests"] = [[*k, n] for k, n in reqs.items()]
    out["engines"] = [e for s in snaps for e in s.get("engines", [])]
    return out


def quantile(h: list[Any], q: float) -> float | None:
    """Estimate the ``q`` quantile (seconds) of a histogram (counts per bucket; an optional
    trailing sum is ignored) by linear interpolation inside the bucket, as Prometheus'
    ``histogram_quantile`` does. None when empty."""
    counts = h[:NB]
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    cum = 0
    for i, c in enumerate(counts):
        if c and cum + c >= rank:
            if i >= len(BOUNDS):
                return BOUNDS[-1]
            lo = BOUNDS[i - 1] if i else 0.0
            hi = BOUNDS[i]
            return lo + (hi - lo) * max(rank - cum, 0.0) / c
        cum += c
    return BOUNDS[-1]


def _summary(h: list[Any] | None) -> dict[str, Any]:
    """count, mean and p50/p90/p99 in milliseconds."""
    if h is None:
        return {"count": 0, "mean": None, "p50": None, "p90": None, "p99": None}
    n = sum(h[:NB])
    out: dict[str, Any] = {"count": n,
                           "mean": round(h[NB] / n * 1000, 3) if n and len(h) > NB else None}
    for q, name in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
        v = quantile(h, q)
        out[name] = None if v is None else round(v * 1000, 3)
    return out


def render(raw: dict[str, Any]) -> dict[str, Any]:
    """The human/JSON view of a raw snapshot: totals, breakdowns, rates and percentiles
    (latencies in milliseconds)."""
    c = raw["counters"]
    by_status: Counter[str] = Counter()
    by_endpoint: Counter[str] = Counter()
    by_model: Counter[str] = Counter()
    by_transport: Counter[str] = Counter()
    model_errors: Counter[str] = Counter()
    rows = []
    for ep, m, tr, st, n in raw["requests"]:
        by_status[str(st)] += n
        by_endpoint[ep] += n
        by_transport[tr] += n
        if m:
            by_model[m] += n
            if st >= 400:
                model_errors[m] += n
        rows.append({"endpoint": ep, "model": m, "transport": tr, "status": st, "count": n})
    total_hist: dict[str, list[Any] | None] = {name: None for name in HISTS}
    for hs in raw["hist"].values():
        for name in HISTS:
            total_hist[name] = _add_list(total_hist[name], hs[name])
    qd = raw["model_gauges"].get("queue_depth", {})
    names = sorted(set(by_model) | {k for k in raw["hist"] if k} | {k for k in raw["models"]
                                                                      if k}
                   | {k for k, v in raw["running"].items() if k and v} | {k for k in qd if k})
    models = {}
    for k in names:
        hs = raw["hist"].get(k, {})
        pm = raw["models"].get(k, [0, 0])
        models[k] = {"requests": by_model.get(k, 0), "errors": model_errors.get(k, 0),
                     "prompt_tokens": pm[0], "delivered_tokens": pm[1],
                     "running": raw["running"].get(k, 0), "queue_depth": qd.get(k, 0),
                     "ttft_ms": _summary(hs.get("ttft")), "itl_ms": _summary(hs.get("itl")),
                     "e2e_ms": _summary(hs.get("e2e"))}
    w = raw["window"]
    g = raw["gauges"]
    return {
        "uptime_s": round(raw["time"] - raw["started"], 3),
        "since_reset_s": round(raw["time"] - raw["reset_at"], 3),
        "workers": raw.get("workers", 1),
        "active": {"connections": g.get("connections", 0), "requests": g.get("requests", 0),
                   "streams": g.get("streams", 0), "websockets": g.get("websockets", 0)},
        "running": sum(raw["running"].values()),
        "queue_depth": sum(qd.values()),
        "connections_total": c.get("connections_total", 0),
        "streams_total": c.get("streams_total", 0),
        "websockets_total": c.get("websockets_total", 0),
        "requests_total": c.get("requests_total", 0),
        "requests_by_status": dict(by_status),
        "requests_by_endpoint": dict(by_endpoint),
        "requests_by_transport": dict(by_transport),
        "requests_by_model": dict(by_model),
        "requests": rows,
        "tokens": {"input": c.get("tokens_in", 0), "output": c.get("tokens_out", 0),
                   "reasoning": c.get("tokens_reasoning", 0),
                   "delivered": c.get("tokens_delivered", 0)},
        "prompt_cache": {"queried_tokens": c.get("prompt_cache_queries", 0),
                         "hit_tokens": c.get("prompt_cache_hits", 0),
                         "written_tokens": c.get("prompt_cache_writes", 0)},
        "errors_total": c.get("errors_total", 0),
        "errors": dict(raw["errors"]),
        "stream_ends": dict(raw["stream_ends"]),
        "latency_ms": {"ttft": _summary(total_hist["ttft"]), "itl": _summary(total_hist["itl"]),
                       "e2e": _summary(total_hist["e2e"])},
        "window": {"seconds": w["seconds"], "requests": w["requests"], "tokens": w["tokens"],
                   "errors": w["errors"],
                   **{k: round(v, 3) for k, v in w["rates"].items()},
                   "ttft_ms": _summary(w["hist"].get("ttft")),
                   "itl_ms": _summary(w["hist"].get("itl")),
                   "e2e_ms": _summary(w["hist"].get("e2e"))},
        "models": models,
        "model_gauges": raw["model_gauges"],
        "engines": [{k: v for k, v in e.items() if k != "hists"}
                    for e in raw.get("engines", [])],
    }
