"""EventStream: the one place where stream events get their order and sequence numbers.

Theory of operation. An API handler decides everything a stream will say and when *before*
the first byte (sans-IO, from a seeded RNG), and expresses it as a *plan*: a plain (sync)
iterator of ``(offset, type, data)`` where ``offset`` is seconds after the previous event's
scheduled time. A plain iterator keeps the per-token cost at one ``next()`` call, and
lazy generation keeps memory per stream small however long the output is.

:class:`EventStream` wraps the plan, turns offsets into absolute deadlines anchored at the
stream's start (so delays never accumulate lateness), and, for Responses-style streams,
stamps ``sequence_number`` 0, 1, 2, ... on every event in the order the transport will emit
them. The same EventStream feeds SSE (HTTP) and WebSocket text frames: the transports only
choose an encoder.

``meta`` carries what generic layers (faults, capacity, stats) need to know about a stream
without knowing its API family: ``endpoint`` and ``model`` (strings), ``is_token(type, data)``
(does this event carry one generated token?) and ``error_events(APIError)`` (the events that
report a mid-stream failure in this stream's dialect: chat's ``data: {"error": ...}`` chunk,
Responses' ``response.failed``).

Control types (never sent to the client): :data:`DISCONNECT` drops the connection at that
point without a terminal event (fault injection), :data:`STOP` ends the stream cleanly at that
point (a "truncated" stream: the HTTP body ends properly but the terminal event is missing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

__all__ = ["EventStream", "DISCONNECT", "STOP", "Plan", "PlanItem"]

DISCONNECT = "__disconnect__"
STOP = "__stop__"

PlanItem = tuple[float, str, Any]
Plan = Iterable[PlanItem]


class EventStream:
    """A sequence-numbered stream of ``(type, data)`` events with absolute deadlines.

    ``kind`` is ``"chat"`` (Chat Completions chunks: no sequence numbers, ``[DONE]`` at the
    end) or ``"responses"`` (every event gets ``sequence_number``).
    """

    __slots__ = ("_it", "kind", "seq", "start", "deadline", "finished", "on_event",
                 "meta", "_numbered")

    def __init__(self, plan: Plan, kind: str = "responses", *,
                 on_event: Callable[[str, Any], None] | None = None,
                 meta: dict[str, Any] | None = None) -> None:
        self._it: Iterator[PlanItem] = iter(plan)
        self.kind = kind
        self._numbered = kind == "responses"
        self.seq = 0
        self.start: float | None = None
        self.deadline = 0.0
        self.finished = False
        self.on_event = on_event  # observes every event as it is pulled (e.g. a store)
        self.meta = meta if meta is not None else {}

    def begin(self, now: float) -> None:
        """Anchor the schedule at ``now`` (the moment the stream is handed to a transport)."""
        if self.start is None:
            self.start = now
            self.deadline = now

    def shift(self, seconds: float) -> None:
        """Push the remaining schedule later (a paused reader pauses generation)."""
        self.deadline += seconds

    def pull(self) -> tuple[float, str, Any] | None:
        """The next event as ``(deadline, type, data)``, numbered; None when the plan ends."""
        if self.finished:
            return None
        try:
            offset, etype, data = next(self._it)
        except StopIteration:
            self.finished = True
            return None
        self.deadline += offset
        if self._numbered and etype[0] != "_" and type(data) is dict:
            data["sequence_number"] = self.seq
            self.seq += 1
        if self.on_event is not None and etype[0] != "_":
            self.on_event(etype, data)
        return self.deadline, etype, data

    def wrap(self, fn: Callable[[Iterator[PlanItem]], Iterable[PlanItem]]) -> None:
        """Replace the plan by ``fn(plan)`` (a generator around it: faults, capacity pacing).

        Call before the stream starts; ``fn`` must close the inner plan when it is closed
        (a generator's ``finally: inner.close()``) so the plan's cleanup still runs.
        """
        self._it = iter(fn(self._it))

    def close(self) -> None:
        """Stop the plan (the client is gone); runs the plan's ``finally`` blocks."""
        self.finished = True
        close = getattr(self._it, "close", None)
        if close is not None:
            close()

    def drain(self) -> list[tuple[str, Any]]:
        """Pull every remaining event without timing (tests, non-streamed collection)."""
        out = []
        while (ev := self.pull()) is not None:
            out.append((ev[1], ev[2]))
        return out
