"""The capacity model's slot count, sans-IO: a simulated serving engine per model for the
requests the serving scheduler does not run (capacity on puts hosted models' chat, streams
and embeddings on :mod:`llmsim.sim.engine`; this keeps ``--latency instant`` and the media
endpoints).

Theory of operation. An :class:`Engine` runs at most ``max_seqs`` sequences at once. A request
that finds every sequence busy waits in a FIFO queue of at most ``queue`` entries; one that
finds the queue full is rejected (429 or 503, decided by the caller). When a sequence ends its
slot passes straight to the oldest waiter, so admission order is arrival order and the count
of active sequences never dips between two requests. While ``active`` sequences decode,
inter-token gaps are multiplied by ``1 + itl_slope * (active - 1)`` (batching slows every
sequence down a little), and time to first token grows by ``prefill_ms_per_1k`` per 1000
prompt tokens. The engine never awaits: the transport glue parks waiters and wakes the one
:meth:`release` returns.
"""

from __future__ import annotations

from collections import deque
from typing import Any

__all__ = ["Engine"]


class Engine:
    """Sequences and queue of one model (see module doc)."""

    __slots__ = ("name", "max_seqs", "queue", "itl_slope", "prefill_ms_per_1k", "active",
                 "waiting", "admitted", "rejected", "peak_waiting")

    def __init__(self, name: str, max_seqs: int, queue: int, itl_slope: float = 0.0,
                 prefill_ms_per_1k: float = 0.0) -> None:
        self.name = name
        self.max_seqs = max_seqs  # 0 = unlimited
        self.queue = queue
        self.itl_slope = itl_slope
        self.prefill_ms_per_1k = prefill_ms_per_1k
        self.active = 0
        self.waiting: deque[Any] = deque()
        self.admitted = 0
        self.rejected = 0
        self.peak_waiting = 0

    def try_admit(self) -> bool:
        """Take a sequence now if one is free and nobody waits before us."""
        if self.max_seqs and (self.active >= self.max_seqs or self.waiting):
            return False
        self.active += 1
        self.admitted += 1
        return True

    def enqueue(self, waiter: Any) -> bool:
        """Park ``waiter``; False (and counted as rejected) when the queue is full."""
        if len(self.waiting) >= self.queue:
            self.rejected += 1
            return False
        self.waiting.append(waiter)
        self.peak_waiting = max(self.peak_waiting, len(self.waiting))
        return True

    def forget(self, waiter: Any) -> None:
        """A waiter gave up (its client left) before it got a sequence."""
        try:
            self.waiting.remove(waiter)
        except ValueError:
            pass

    def release(self) -> Any | None:
        """A sequence ended. Returns the waiter that now owns it (already counted active),
        or None if the sequence went idle."""
        if self.waiting:
            self.admitted += 1
            return self.waiting.popleft()
        self.active = max(0, self.active - 1)
        return None

    def factor(self) -> float:
        """The current inter-token slowdown."""
        return 1.0 + self.itl_slope * max(0, self.active - 1)

    def prefill(self, prompt_tokens: int) -> float:
        """Extra seconds before the first token for a prompt of this size."""
        return self.prefill_ms_per_1k * prompt_tokens / 1_000_000.0

    def public(self) -> dict[str, Any]:
        return {"model": self.name, "max_seqs": self.max_seqs, "queue": self.queue,
                "active": self.active, "waiting": len(self.waiting),
                "admitted": self.admitted, "rejected": self.rejected,
                "peak_waiting": self.peak_waiting, "itl_factor": round(self.factor(), 4)}
