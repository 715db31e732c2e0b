"""The latency model: time to first token and inter-token gaps, sans-IO.

Realistic mode draws TTFT from a log-normal around the model's median, plus prefill time that
grows with the prompt (``prefill_ms_per_1k`` for uncached tokens, ``cached_prefill_ms_per_1k``
for tokens read from the prompt cache), and each inter-token gap from a log-normal
around the model's median gap (clipped to [0.25x, 4x] so one draw cannot stall a stream).
Hidden reasoning tokens are "thought" at ``reasoning_itl_ms`` before the first visible token.
Fixed mode (``--ttft-ms``/``--itl-ms``) uses exactly the given numbers with no jitter and no
prefill term; instant mode makes every delay zero. Nothing here awaits: callers get seconds.
"""

from __future__ import annotations

import itertools
import math
import operator
import random
from collections.abc import Iterator
from dataclasses import dataclass

from .models import ModelProfile
from .rng import seeded

__all__ = ["Latency", "ConstantGaps"]


class ConstantGaps(itertools.repeat):  # type: ignore[type-arg]
    """``n`` equal gaps: ``itertools.repeat(value, n)`` (the same iterator, at C speed) whose
    ``value`` can be read. A pump that writes a run of tokens (flow.Pump) takes the run's
    gaps from it at once (:meth:`take`) and adds ``value`` per token, reading no iterator
    and touching no per-stream object beyond itself (issue 15)."""

    __slots__ = ("value",)
    value: float

    def __new__(cls, value: float, n: int) -> ConstantGaps:
        self = super().__new__(cls, value, n)
        self.value = value
        return self

    def take(self, k: int) -> bool:
        """Consume the next ``k`` gaps at once; False (nothing consumed) when fewer are
        left (the reader must then take them one by one: past the end they are 0.0)."""
        if k <= 0:
            return True
        if operator.length_hint(self) < k:
            return False
        next(itertools.islice(self, k - 1, k), None)
        return True


@dataclass(frozen=True, slots=True)
class Latency:
    """Latency for one request: ``ttft(rng)``, ``gap(rng)`` in seconds."""

    profile: ModelProfile
    instant: bool = False
    fixed_ttft_ms: float | None = None
    fixed_itl_ms: float | None = None

    def ttft(self, rng: random.Random, prompt_tokens: int = 0, cached_tokens: int = 0) -> float:
        """Seconds from request to the first token (reasoning time not included): the
        model's base time, then prefill of the uncached prompt tokens at the model's rate and
        of the cached ones at its (much lower) cached rate."""
        if self.instant:
            return 0.0
        if self.fixed_ttft_ms is not None:
            return self.fixed_ttft_ms / 1000.0
        p = self.profile
        base = p.ttft_ms * _lognorm(rng, p.ttft_jitter)
        cached = min(cached_tokens, prompt_tokens)
        return (base + (p.prefill_ms_per_1k * (prompt_tokens - cached)
                        + p.cached_prefill_ms_per_1k * cached) / 1000.0) / 1000.0

    def gap(self, rng: random.Random) -> float:
        """Seconds between two visible tokens."""
        return next(self.gaps(rng, 1))

    def constant_gap(self) -> float | None:
        """The gap between tokens when it never varies (instant, ``--itl-ms``, a profile
        without jitter), in seconds; None when each gap is drawn."""
        if self.instant:
            return 0.0
        if self.fixed_itl_ms is not None:
            return self.fixed_itl_ms / 1000.0
        p = self.profile
        return p.itl_ms * 1.0 / 1000.0 if p.itl_jitter <= 0 else None

    def gaps(self, rng: random.Random, n: int) -> Iterator[float]:
        """``n`` gaps, the values ``n`` calls of :meth:`gap` give, drawn lazily: one generator
        with its draws inlined, as a stream's schedule reads one per token (hot path)."""
        c = self.constant_gap()
        return ConstantGaps(c, n) if c is not None else self._drawn(rng, n)

    def seeded_gaps(self, seed: int, n: int) -> Iterator[float]:
        """``gaps(Random(seed), n)``, with the generator seeded only when a gap is drawn
        (seeding one costs ~1.5 µs a request)."""
        c = self.constant_gap()
        return ConstantGaps(c, n) if c is not None else self._drawn(seeded(seed), n)

    def _drawn(self, rng: random.Random, n: int) -> Iterator[float]:
        p = self.profile
        itl, sigma = p.itl_ms, p.itl_jitter
        gauss, exp = rng.gauss, math.exp  # (the draw of _lognorm, inlined)
        return (itl * min(4.0, max(0.25, exp(gauss(0.0, sigma)))) / 1000.0 for _ in range(n))

    def mean_gap(self) -> float:
        if self.instant:
            return 0.0
        if self.fixed_itl_ms is not None:
            return self.fixed_itl_ms / 1000.0
        return self.profile.itl_ms / 1000.0

    def reasoning_time(self, rng: random.Random, tokens: int) -> float:
        """Seconds spent on ``tokens`` hidden reasoning tokens (no per-token draws)."""
        if self.instant or tokens <= 0:
            return 0.0
        if self.fixed_itl_ms is not None:
            return tokens * self.fixed_itl_ms / 1000.0
        p = self.profile
        per = p.reasoning_itl_ms if p.reasoning_itl_ms is not None else p.itl_ms
        # the mean of many log-normal gaps: little jitter left over a long reasoning run
        return tokens * per * _lognorm(rng, p.itl_jitter / math.sqrt(max(tokens, 1))) / 1000.0

    @property
    def is_zero(self) -> bool:
        return self.instant or (self.fixed_itl_ms == 0 and self.fixed_ttft_ms == 0)


def _lognorm(rng: random.Random, sigma: float) -> float:
    if sigma <= 0:
        return 1.0
    return min(4.0, max(0.25, math.exp(rng.gauss(0.0, sigma))))
