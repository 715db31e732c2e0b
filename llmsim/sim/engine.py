"""A serving engine per model, sans-IO: continuous batching in steps, as vLLM's V1 scheduler.

Theory of operation. An :class:`Engine` holds *running* sequences (at most ``max_num_seqs``)
and a FIFO *waiting* queue (at most ``max_waiting``: one more is refused, the caller answers
429/503). It works in *steps*. Forming a step (:meth:`Engine._schedule`) walks the running
sequences first, oldest first, giving each the tokens it still has to compute (one for a
decoding sequence; the rest of its prompt, in chunks, for a prefilling one) under a budget
of ``max_num_batched_tokens`` tokens per step; then it admits waiting sequences in arrival
order while the budget, the sequence cap and the KV cache allow. Every sequence holds KV
blocks of ``block_size`` tokens for the tokens it has computed; when a running sequence needs
a block and none is free, the newest running sequence is *preempted* (its blocks freed, put
back at the head of the queue, its tokens recomputed when it is admitted again), as vLLM
does. A step of ``T`` tokens of ``S`` sequences lasts ``t = (t0^p + (c*T + d*S)^p)^(1/p)``:
flat while the step is memory-bound (``t0``: the weights read once per step), linear once
the work outgrows it (``c`` per token: the matrix products; ``d`` per sequence: attention
over its KV cache and sampling); a smooth maximum of the two. (``d = 0`` is the pure token
model; a published decode sweep needs ``d``: see ``data/engines.json``.) When a step ends, every sequence whose tokens are all computed has one
more output token, timed at the step's end; a sequence with its last token finishes.

Nothing here awaits or reads a clock: :meth:`Engine.advance` is called with ``now`` (by a
timer at :attr:`Engine.step_end`, and by anyone who asks about a sequence), processes every
step that has ended by then and forms the next. Prompt tokens already in the prefix cache
(``cached``, from :mod:`llmsim.sim.cache`, the one prompt cache) skip prefill compute, whole
blocks only.

A hosted model's engine (:func:`hosted_profile`, for ``--capacity-max-seqs``) is derived from
its latency profile: one decoding sequence's step is the model's inter-token latency, prefill
costs its prefill rate. Its requests carry a ``lead``: the part of their own time to first
token that is not the engine's work (the provider's fixed overhead), spent holding a sequence
slot before their first step (``ready_at``), so a request alone is timed as without the engine.
A request with ``max_out == 0`` is prefill-only (an embedding): it finishes when its prompt is
computed, with no output token.
"""

from __future__ import annotations

import heapq
import json
import random
import statistics
from bisect import bisect_left
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, fields
from importlib import resources
from typing import Any

from .. import config

__all__ = ["EngineProfile", "Engine", "Seq", "PROFILES", "profile", "HIST_BUCKETS", "closed_loop",
           "medians",
           "MAX_OUTPUT"]

MAX_OUTPUT = 1 << 20  # tokens one sequence may be asked to generate (a work bound)
_EPS = 1e-9  # a step "has ended" this close to its end (float sums of deadlines)


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """One GPU/model serving configuration (values and sources in ``data/engines.json``)."""

    name: str
    source: str
    t0_ms: float  # step time of a memory-bound step (a few tokens)
    c_ms: float  # step time per token once compute-bound
    d_ms: float  # step time per sequence in the step (attention over its KV, sampling)
    p: float  # sharpness of the knee between the two
    block_size: int  # tokens per KV block
    num_blocks: int  # KV blocks the GPU holds
    max_num_seqs: int
    max_num_batched_tokens: int
    max_waiting: int  # queued requests before new ones are refused
    max_model_len: int
    hosted: bool = False  # derived from a hosted model's latency profile (hosted_profile)

    def step_time(self, tokens: int, seqs: int = 1) -> float:
        """Seconds one step of ``tokens`` tokens of ``seqs`` sequences takes."""
        a = self.t0_ms
        b = self.c_ms * tokens + self.d_ms * seqs
        p = self.p
        return (a ** p + b ** p) ** (1.0 / p) / 1000.0

    def solo(self, uncached: int, k: int) -> float:
        """Seconds a request alone takes to output token ``k`` (0-based; -1: its prompt
        only) when ``uncached`` prompt tokens are computed: its prefill chunks, then one
        decode step per token."""
        budget = self.max_num_batched_tokens
        n = max(1, uncached)
        full, rest = divmod(n, budget)
        t = full * self.step_time(budget) + (self.step_time(rest) if rest else 0.0)
        return t + max(0, k) * self.step_time(1)


HOSTED_P = 10.0  # the knee's sharpness of a hosted model's engine (the H100 fit's)
HOSTED_BATCHED_TOKENS = 8192  # vLLM's default token budget per step
HOSTED_BLOCK = 16


def hosted_profile(model: str, itl_ms: float, prefill_ms_per_1k: float, slope: float,
                   max_seqs: int, queue: int, max_model_len: int) -> EngineProfile:
    """The engine of a hosted model under ``--capacity-max-seqs``: one decoding sequence's
    step lasts ``itl_ms`` (``t0`` solved for it), each token computed costs
    ``prefill_ms_per_1k / 1000`` and each sequence in a step ``slope * itl_ms`` once the
    step is compute-bound; ``max_seqs`` sequences, ``queue`` waiting, a KV cache that holds
    every sequence at ``max_model_len`` (hosted APIs show no preemption)."""
    c = max(0.0, prefill_ms_per_1k) / 1000.0
    d = max(0.0, slope) * itl_ms
    b1 = c + d
    # (c + d >= itl: even one sequence is compute-bound, its step is c + d)
    t0 = (itl_ms ** HOSTED_P - b1 ** HOSTED_P) ** (1.0 / HOSTED_P) if b1 < itl_ms else 0.0
    length = max(1, max_model_len)
    return EngineProfile(
        name=f"hosted:{model}", source="derived from the model's latency profile and the "
        "capacity options (--capacity-*)", t0_ms=t0, c_ms=c, d_ms=d, p=HOSTED_P,
        block_size=HOSTED_BLOCK, num_blocks=max(1, max_seqs) * -(-(length + 1) // HOSTED_BLOCK),
        max_num_seqs=max(1, max_seqs), max_num_batched_tokens=HOSTED_BATCHED_TOKENS,
        max_waiting=max(0, queue), max_model_len=length, hosted=True)


def _load() -> dict[str, EngineProfile]:
    raw = json.loads(resources.files("llmsim.data").joinpath("engines.json").read_text())
    names = {f.name for f in fields(EngineProfile)}
    out = {}
    for name, spec in raw["profiles"].items():
        vals = {k: v for k, v in spec.items() if k in names}
        out[name] = EngineProfile(name=name, **vals)
    return out


PROFILES: dict[str, EngineProfile] = _load()
config.ENGINE_PROFILES = PROFILES  # type: ignore[assignment]  # (--engine is checked against it)


def profile(name: str) -> EngineProfile:
    """The profile called ``name`` (KeyError naming the choices otherwise)."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown engine profile {name!r}; choose one of "
                       f"{', '.join(sorted(PROFILES))}") from None


# vLLM's Prometheus buckets (vllm/v1/metrics/loggers.py)
_REQUEST_LATENCY = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def _one_two_five(limit: int) -> tuple[float, ...]:
    out: list[float] = []
    e = 1
    while True:
        for m in (1, 2, 5):
            if m * e > limit:
                return tuple(out)
            out.append(float(m * e))
        e *= 10


_TPOT = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
         10.0, 20.0, 40.0, 80.0)
HIST_BUCKETS: dict[str, tuple[float, ...]] = {
    "time_to_first_token_seconds": (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
                                    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0,
                                    640.0, 2560.0),
    "inter_token_latency_seconds": _TPOT,
    "e2e_request_latency_seconds": _REQUEST_LATENCY,
    "iteration_tokens_total": (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
                               16384),
    "request_queue_time_seconds": _REQUEST_LATENCY,
    "request_inference_time_seconds": _REQUEST_LATENCY,
    "request_prefill_time_seconds": _REQUEST_LATENCY,
    "request_decode_time_seconds": _REQUEST_LATENCY,
    "request_time_per_output_token_seconds": _TPOT,
    "request_num_preemptions": (0, 1, 2, 5, 10, 20, 50),  # (count buckets)
}
_TOKEN_HISTS = ("request_prompt_tokens", "request_generation_tokens",
                "request_max_num_generation_tokens", "request_params_max_tokens",
                "request_prefill_kv_computed_tokens")


class Hist:
    """A Prometheus histogram: counts per bucket (cumulated when exported), sum, count."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.counts[bisect_left(self.bounds, v)] += 1
        self.sum += v


WAITING, RUNNING, DONE = 0, 1, 2


class Seq:
    """One request in the engine. ``produced`` output tokens so far; ``next_at`` is the end
    of the step in flight when that step gives it its next token, else -1."""

    __slots__ = ("id", "prompt", "cached", "max_out", "arrival", "computed", "produced",
                 "blocks", "state", "scheduled", "next_at", "first_at", "last_at",
                 "admitted_at", "preemptions", "on_done", "finished_at", "reason",
                 "kv_computed", "max_tokens", "lead", "ready_at")

    def __init__(self, id: int, prompt: int, cached: int, max_out: int, arrival: float,
                 on_done: Callable[[Seq], None] | None = None,
                 max_tokens: int | None = None, lead: float = 0.0) -> None:
        self.id = id
        self.prompt = max(1, prompt)
        self.cached = cached
        self.max_out = min(max(0, max_out), MAX_OUTPUT)  # (0: prefill only)
        self.arrival = arrival
        self.computed = 0  # tokens with KV (prompt and output)
        self.produced = 0
        self.blocks = 0
        self.state = WAITING
        self.scheduled = 0  # tokens in the step in flight
        self.next_at = -1.0
        self.first_at = -1.0
        self.last_at = -1.0
        self.admitted_at = -1.0
        self.preemptions = 0
        self.on_done = on_done
        self.finished_at = -1.0
        self.reason = ""
        self.kv_computed = 0  # prompt tokens whose KV was computed (not read from cache)
        self.max_tokens = max_tokens
        self.lead = lead  # seconds admitted before its first step (hosted engines)
        self.ready_at = -1.0  # when it may be scheduled (set when first admitted)

    @property
    def total(self) -> int:
        """Tokens known: the prompt and the output so far."""
        return self.prompt + self.produced

    def due(self, j: int, now: float) -> float | None:
        """When output token ``j`` (0-based) is (or was) ready: ``now`` if already produced,
        the step end if the step in flight gives it, None if not yet known."""
        if j < self.produced or self.state == DONE:
            return now
        if j == self.produced and self.next_at >= 0.0:
            return self.next_at
        return None


class Engine:
    """The scheduler of one model (see the module doc)."""

    def __init__(self, prof: EngineProfile, name: str = "", rank: int = 0) -> None:
        self.profile = prof
        self.name = name
        self.rank = rank
        self.free = prof.num_blocks
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self.step: list[Seq] = []  # the sequences in the step in flight
        self.step_end = -1.0  # when the step in flight ends (-1: idle)
        self.step_tokens = 0
        self._ids = 0
        self.leads = False  # has any request come with a lead (hosted engines)
        # vLLM's counters and histograms
        self.steps = 0
        self.preemptions = 0
        self.prompt_tokens = 0  # prefill tokens computed
        self.queried_tokens = 0  # prompt tokens looked up in the prefix cache
        self.cached_tokens = 0  # of those, found (whole blocks)
        self.generation_tokens = 0
        self.rejected = 0
        self.success: dict[str, int] = {}
        self.hists: dict[str, Hist] = {k: Hist(v) for k, v in HIST_BUCKETS.items()}
        tok = _one_two_five(prof.max_model_len)
        for k in _TOKEN_HISTS:
            self.hists[k] = Hist(tok)
        self.hists["request_params_n"] = Hist((1, 2, 5, 10, 20))
        self._ttft = self.hists["time_to_first_token_seconds"]
        self._itl = self.hists["inter_token_latency_seconds"]
        self.peak_running = 0
        self.peak_waiting = 0

    # -- requests --------------------------------------------------------------------------

    def full(self) -> bool:
        """Is the waiting queue full (a new request would be refused)? Queued requests that
        free sequence slots will take at the next step do not count."""
        p = self.profile
        return len(self.waiting) >= p.max_waiting + max(0, p.max_num_seqs - len(self.running))

    def add(self, prompt: int, cached: int, max_out: int, now: float,
            on_done: Callable[[Seq], None] | None = None,
            max_tokens: int | None = None, lead: float = 0.0) -> Seq:
        """Queue a request of ``prompt`` tokens (``cached`` of them in the prefix cache) that
        generates ``max_out`` tokens (0: prefill only), ``lead`` seconds admitted before its
        first step. The caller checked :meth:`full` first. An idle engine forms its next
        step at ``now`` (:meth:`advance`), with every request added by then."""
        while 0.0 <= self.step_end < now - _EPS:  # (steps over before it came)
            end = self.step_end  # (_end_step clears it)
            self._end_step(end)
            self._schedule(end)
        self._ids += 1
        prompt, hit = self._sizes(prompt, cached)
        # a request must fit the KV cache alone (vLLM refuses longer ones at max_model_len,
        # which the caller checks): its output is cut to what fits, so it can always run
        max_out = min(max(0, max_out), self.profile.num_blocks * self.profile.block_size - prompt)
        s = Seq(self._ids, prompt, hit, max_out, now, on_done, max_tokens, max(0.0, lead))
        s.computed = hit
        self.queried_tokens += prompt
        self.cached_tokens += hit
        if s.lead > 0.0:
            self.leads = True
        if s.lead > 0.0 and not self.waiting and len(self.running) < self.profile.max_num_seqs:
            # a free slot: its lead starts now, as it needs no step (hosted engines)
            s.state = RUNNING
            s.admitted_at = now
            s.ready_at = now + s.lead
            self.running.append(s)
        else:
            self.waiting.append(s)
            self.peak_waiting = max(self.peak_waiting, len(self.waiting))
        if self.step_end < 0.0 or not self.step:
            # idle (or only waiting for a lead to end): an empty step that ends now, the
            # next one is formed then
            self.step_end = now
        return s

    def _sizes(self, prompt: int, cached: int) -> tuple[int, int]:
        """The prompt as the engine holds it (cut to fit the KV cache alone) and its prefix
        hit: whole cached blocks only, the last prompt token always computed (vLLM)."""
        bs = self.profile.block_size
        prompt = min(max(1, prompt), self.profile.num_blocks * bs - 1)
        return prompt, min(max(0, cached), prompt - 1) // bs * bs

    def lead(self, prompt: int, cached: int, k: int, total: float) -> float:
        """The lead that makes a request alone output token ``k`` (-1: finish its prompt)
        ``total`` seconds after it arrives (0 when the engine alone takes longer)."""
        prompt, hit = self._sizes(prompt, cached)
        return max(0.0, total - self.profile.solo(prompt - hit, k))

    def abort(self, s: Seq, now: float, reason: str = "abort") -> None:
        """The request ended before the engine finished it (client gone, stream over)."""
        if s.state == DONE:
            return
        self.advance(now)
        if s.state == DONE:
            return
        if s.state == WAITING:
            try:
                self.waiting.remove(s)
            except ValueError:
                pass
        else:
            self.running.remove(s)
        self._finish(s, now, reason)

    # -- time ------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Process every step that has ended by ``now`` (forming the next each time)."""
        while 0.0 <= self.step_end <= now + _EPS:
            end = self.step_end
            self._end_step(end)
            self._schedule(end)

    def _end_step(self, end: float) -> None:
        for s in self.step:
            n, s.scheduled = s.scheduled, 0
            s.next_at = -1.0
            if s.state != RUNNING:
                continue  # aborted while in flight
            before = s.computed
            s.computed = before + n
            if before < s.prompt:
                k = min(s.computed, s.prompt) - before
                self.prompt_tokens += k
                s.kv_computed += k
                if not s.max_out:  # prefill only: done once its prompt is computed
                    if s.computed >= s.prompt:
                        self.running.remove(s)
                        self._finish(s, end, "stop")
                    continue
            if s.computed >= s.total:  # every known token computed: one more comes out
                s.produced += 1
                self.generation_tokens += 1
                if s.produced == 1:
                    s.first_at = end
                    self._ttft.observe(end - s.arrival)
                else:
                    self._itl.observe(end - s.last_at)
                s.last_at = end
                if s.produced >= s.max_out:
                    self.running.remove(s)
                    self._finish(s, end, "length" if s.max_tokens is not None
                                 and s.produced >= s.max_tokens else "stop")
        self.step = []
        self.step_end = -1.0

    def _finish(self, s: Seq, now: float, reason: str) -> None:
        s.state = DONE
        s.finished_at = now
        s.reason = reason
        s.next_at = -1.0
        self.free += s.blocks
        s.blocks = 0
        if reason != "abort":
            self.success[reason] = self.success.get(reason, 0) + 1
        h = self.hists
        h["e2e_request_latency_seconds"].observe(now - s.arrival)
        if s.admitted_at >= 0.0:
            h["request_queue_time_seconds"].observe(s.admitted_at - s.arrival)
            h["request_inference_time_seconds"].observe(now - s.admitted_at)
            if s.first_at >= 0.0:
                h["request_prefill_time_seconds"].observe(s.first_at - s.admitted_at)
                h["request_decode_time_seconds"].observe(now - s.first_at)
                if s.produced > 1:
                    h["request_time_per_output_token_seconds"].observe(
                        (now - s.first_at) / (s.produced - 1))
        else:
            h["request_queue_time_seconds"].observe(now - s.arrival)
        h["request_prompt_tokens"].observe(s.prompt)
        h["request_generation_tokens"].observe(s.produced)
        h["request_max_num_generation_tokens"].observe(s.max_out)
        h["request_params_n"].observe(1)
        if s.max_tokens is not None:
            h["request_params_max_tokens"].observe(s.max_tokens)
        h["request_num_preemptions"].observe(s.preemptions)
        h["request_prefill_kv_computed_tokens"].observe(s.kv_computed)
        if s.on_done is not None:
            cb, s.on_done = s.on_done, None
            cb(s)

    # -- scheduling ------------------------------------------------------------------------

    def _blocks_for(self, s: Seq, n: int) -> int:
        """Blocks ``s`` must add to hold ``n`` more computed tokens."""
        bs = self.profile.block_size
        return max(0, -(-(s.computed + n) // bs) - s.blocks)

    def _preempt(self, victim: Seq) -> None:
        self.running.remove(victim)
        self.free += victim.blocks
        victim.blocks = 0
        victim.state = WAITING
        victim.computed = victim.cached  # recomputed from the prefix cache's hit
        victim.scheduled = 0
        victim.next_at = -1.0
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)

    def _schedule(self, now: float) -> None:
        """Form the next step at ``now`` (see the module doc)."""
        prof = self.profile
        budget = prof.max_num_batched_tokens
        preempted = self.preemptions
        step: list[Seq] = []
        pending = -1.0  # the first lead that ends after now (hosted engines)
        leads = self.leads  # (a vLLM profile's engine skips the check)
        ready = now + _EPS
        i = 0
        while i < len(self.running) and budget > 0:
            s = self.running[i]
            n = min(s.total - s.computed, budget)
            if n <= 0:
                i += 1
                continue
            if leads and s.ready_at > ready:  # still in its lead
                if pending < 0.0 or s.ready_at < pending:
                    pending = s.ready_at
                i += 1
                continue
            need = self._blocks_for(s, n)
            victim_self = False
            while need > self.free:
                victim = self.running[-1]
                self._preempt(victim)
                if victim is s:
                    victim_self = True
                    break
            if victim_self:
                continue  # (s is gone from running: the same index is the next one)
            self.free -= need
            s.blocks += need
            s.scheduled = n
            budget -= n
            step.append(s)
            i += 1
        # no admission in a step that preempted (vLLM V1): the cache is short already
        while (self.preemptions == preempted and self.waiting and budget > 0
               and len(self.running) < prof.max_num_seqs):
            s = self.waiting[0]
            if s.admitted_at < 0.0 and s.lead > 0.0:
                # admitted into its lead: it holds a sequence slot, no tokens yet
                self.waiting.popleft()
                s.state = RUNNING
                s.admitted_at = now
                s.ready_at = now + s.lead
                self.running.append(s)
                if pending < 0.0 or s.ready_at < pending:
                    pending = s.ready_at
                continue
            n = min(s.total - s.computed, budget)
            need = self._blocks_for(s, n)
            if need > self.free:
                break  # FIFO: the head waits for blocks, and so does everyone behind it
            self.waiting.popleft()
            self.free -= need
            s.blocks += need
            s.state = RUNNING
            if s.admitted_at < 0.0:
                s.admitted_at = now
            s.scheduled = n
            budget -= n
            self.running.append(s)
            step.append(s)
        if not step:
            self.step = []
            # idle, or an empty step that ends when the first lead does
            self.step_end = pending
            self.peak_running = max(self.peak_running, len(self.running))
            return
        tokens = prof.max_num_batched_tokens - budget
        dur = prof.step_time(tokens, len(step))
        end = now + dur
        for s in step:
            if s.computed + s.scheduled >= s.total:
                s.next_at = end
        self.step = step
        self.step_end = end
        self.step_tokens = tokens
        self.steps += 1
        self.hists["iteration_tokens_total"].observe(tokens)
        self.peak_running = max(self.peak_running, len(self.running))

    # -- views -----------------------------------------------------------------------------

    def kv_usage(self) -> float:
        n = self.profile.num_blocks
        return (n - self.free) / n if n else 0.0

    def public(self) -> dict[str, Any]:
        p = self.profile
        return {"model": self.name, "engine": self.rank, "profile": p.name,
                "running": len(self.running), "waiting": len(self.waiting),
                "batch_tokens": self.step_tokens if self.step_end >= 0.0 else 0,
                "kv_cache_usage": round(self.kv_usage(), 4),
                "kv_blocks_free": self.free, "kv_blocks": p.num_blocks,
                "steps": self.steps, "preemptions": self.preemptions,
                "rejected": self.rejected, "peak_running": self.peak_running,
                "peak_waiting": self.peak_waiting,
                "max_num_seqs": p.max_num_seqs,
                "max_num_batched_tokens": p.max_num_batched_tokens}


# ------------------------------------------------------------------------------------------
# The calibration driver: clients in a closed loop on one engine, as the published sweeps
# measure (tests hold the profiles to the figures with it; bench/engine_burst.py explores)
# ------------------------------------------------------------------------------------------

def closed_loop(prof: EngineProfile, conc: int, rounds: int = 4, prompt: int = 1024,
                out: int = 128, rng: random.Random | None = None,
                think: float = 0.0) -> list[Seq]:
    """``conc`` clients in a closed loop (as ``vllm bench serve --max-concurrency``), each
    sending ``rounds`` requests of ``prompt`` tokens and ``out`` answer tokens: with ``rng``
    client ``i`` starts at a random point of a first request's lifetime and takes up to
    ``think`` seconds between requests; without, all start at once (a burst) and think none.
    Returns the sequences past the first round, in arrival order."""
    eng = Engine(prof)
    done: list[Seq] = []
    events: list[tuple[float, int]] = []
    life = out * prof.step_time(conc, conc) + prof.step_time(prompt, 1)
    for i in range(conc):
        heapq.heappush(events, (rng.uniform(0, life) if rng is not None else 0.0, i))
    left = dict.fromkeys(range(conc), rounds)

    def finished(s: Seq, i: int) -> None:
        done.append(s)
        left[i] -= 1
        if left[i] > 0:
            wait = rng.uniform(0, think) if rng is not None else 0.0
            heapq.heappush(events, (s.finished_at + wait, i))

    while events or eng.step_end >= 0.0:
        if events and (eng.step_end < 0.0 or events[0][0] <= eng.step_end):
            t, i = heapq.heappop(events)
            eng.advance(t)
            eng.add(prompt, 0, out, t, on_done=lambda s, i=i: finished(s, i))  # type: ignore[misc]
        else:
            eng.advance(eng.step_end)
    return sorted(done, key=lambda s: s.arrival)[conc:]


def medians(seqs: list[Seq]) -> tuple[float, float]:
    """The median TPOT and TTFT (seconds) of finished sequences."""
    tpot = statistics.median((s.finished_at - s.first_at) / (s.produced - 1) for s in seqs)
    ttft = statistics.median(s.first_at - s.arrival for s in seqs)
    return tpot, ttft
