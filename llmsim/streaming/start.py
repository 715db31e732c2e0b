"""Starting a handler (both transports, every WebSocket mode): its first step runs outside
a Task, and only a handler that suspends gets one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

__all__ = ["Stepped", "start_handler"]


class _Resume:
    """A handler coroutine that suspended in its first step (run outside a Task by
    :func:`start_handler`), as a coroutine a Task drives from there on.

    Everything the Task does goes straight to the handler: its first ``send`` gets back what
    the handler awaited (``awaited``: a future, or None for a bare yield), so the Task waits
    for it exactly as if it had driven the handler from the start; later sends resume the
    handler; what the Task throws in (a cancellation, even one before its first step) is
    thrown into the handler, whose ``except CancelledError`` runs as in a Task of its own.
    (A coroutine function awaiting the handler would lose a cancellation that comes before
    the Task's first step: the wrapper would end without the handler ever seeing it.)"""

    __slots__ = ("coro", "awaited", "started")

    def __init__(self, coro: Coroutine[Any, Any, None], awaited: Any) -> None:
        self.coro = coro
        self.awaited = awaited
        self.started = False

    def send(self, value: Any) -> Any:
        if not self.started:
            self.started = True
            awaited, self.awaited = self.awaited, None
            return awaited
        return self.coro.send(value)

    def throw(self, exc: Any, *rest: Any) -> Any:
        self.started = True
        self.awaited = None
        return self.coro.throw(exc, *rest)

    def close(self) -> None:
        self.coro.close()

    def __next__(self) -> Any:
        return self.send(None)

    def __iter__(self) -> _Resume:
        return self

    def __await__(self) -> _Resume:
        return self


Coroutine.register(_Resume)  # (what asyncio.iscoroutine checks: a Task may run it)


class Stepped(Protocol):
    """What a handler runs for (an HTTP :class:`Exchange`, a WebSocket job): ``first_step``
    is True while the handler runs its first step, i.e. has not suspended."""

    first_step: bool


def start_handler(coro: Coroutine[Any, Any, None], wanted: Callable[[], bool],
                  owner: Stepped) -> asyncio.Task[None] | None:
    """Run a handler coroutine's first step now, outside a Task: most answers (instant
    latency, no waiting hook, a stream handed to its pump) complete without suspending and
    need no Task. One that suspends continues in a Task (:class:`_Resume`), returned, if
    ``wanted()`` still holds; else it is closed. Both transports start every handler so, on
    the loop pass after the one that read its request (:meth:`HTTPProtocol._handle`).
    ``owner.first_step`` is True during the first step: a stream started then counts from
    its request's read (flow.Pump.start), one started after a wait from its start."""
    owner.first_step = True
    try:
        awaited = coro.send(None)
    except StopIteration:
        return None
    finally:
        owner.first_step = False
    if wanted():
        return asyncio.get_running_loop().create_task(_Resume(coro, awaited))
    coro.close()
    return None
