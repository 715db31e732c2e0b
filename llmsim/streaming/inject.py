"""Mid-stream fault injection: a stream plan wrapper that makes a decided
:class:`~llmsim.sim.faults.Fault` happen after its Nth token (the decision of which fault,
when, is the sans-IO :mod:`llmsim.sim.faults`; this is how a stream carries it out)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ..errors import APIError
from ..sim.faults import Fault, mid_stream_error
from .dialect import Dialect
from .stream import DISCONNECT, STOP, PlanItem, close_plan

__all__ = ["inject"]


def inject(plan: Iterator[PlanItem], fault: Fault, dialect: Dialect,
           error_events: Callable[[APIError], list[tuple[str, Any]]],
           fired: Callable[[str], None] | None = None) -> Iterator[PlanItem]:
    """Wrap a stream plan so ``fault`` happens once ``fault.after`` tokens have been sent.

    The fault acts just before the next event after the Nth token (or before the stream's
    terminal event if the stream has fewer tokens), at the time that event was due:
    ``disconnect`` drops the connection, ``truncate`` ends the body cleanly without the rest,
    ``error`` sends the dialect's error events (chat: ``{"error": ...}`` chunk + ``[DONE]``;
    Responses: ``response.failed``) and ends, ``stall`` delays that event by ``ms``. Which
    events carry a token and which end the stream is the ``dialect``'s to say.
    """
    terminals = dialect.terminals
    is_token = dialect.is_token
    n = fault.after
    count = 0
    done = False
    try:
        for item in plan:
            off, etype, data = item
            if not done and etype[0] != "_" and (count >= n or etype in terminals):
                done = True
                k = fault.kind
                if fired is not None:  # counted when it takes effect (errors_total by kind)
                    fired(k)
                if k == "stall":
                    item = (off + fault.ms / 1000.0, etype, data)
                elif k == "disconnect":
                    yield off, DISCONNECT, None
                    return
                elif k == "truncate":
                    yield off, STOP, None
                    return
                elif k == "error":
                    err = mid_stream_error(fault.status)
                    evs = error_events(err)
                    first = True
                    for et, d in evs:
                        yield (off if first else 0.0), et, d
                        first = False
                    yield 0.0, STOP, None
                    return
            if not done and is_token(etype, data):
                count += 1
            yield item
    finally:
        close_plan(plan)
