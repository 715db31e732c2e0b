"""Pacing and backpressure: drive an EventStream on the shared clock into a sink.

Theory of operation. A :class:`Pump` owns one stream. Each time the clock fires it, it pulls
the event whose deadline has come, encodes it and hands the bytes to its sink, then arms one
timer for the next deadline. Events share a write only when they are due at the same instant
or when the pump is behind by more than ``Clock.catch_up`` (the one coalescing rule, see
:class:`~llmsim.clock.Clock`): on time, every event is its own write at its own deadline. No
task and no ``sleep`` per stream: the per-token cost is a ``next()``, an encode and a heap push.

Backpressure is real: when the sink's transport buffer is above its high-water mark the sink
reports ``paused`` and the pump stops pulling, so the simulated model stops generating instead
of growing a buffer. ``resume()`` (called from ``resume_writing``) shifts the remaining schedule
by the time spent paused and carries on. A vanished client calls ``cancel()``: the timer is
dropped, the plan is closed (its ``finally`` blocks run) and ``on_done`` fires exactly once.

Failures. The stream has started (its head is on the wire), so nothing that goes wrong inside
the pump (the plan raising, an event the encoder cannot represent, a broken observer) may
escape: it would be lost in a clock callback and leave the stream open forever. Any exception
writes the frames already encoded, then the terminal error frame ``error_frame`` renders in the
transport's dialect (SSE ``error`` event, chat error chunk, WebSocket error event), and ends
the stream with reason ``"error"``, so ``on_done`` releases everything as on any other end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from .clock import Clock, Timer
from .errors import APIError, server_error
from .stream import DISCONNECT, STOP, EventStream

__all__ = ["Pump", "Sink", "NullSink"]

log = logging.getLogger("llmsim")

MAX_BATCH = 256  # events per write before the pump re-checks backpressure


class Sink(Protocol):
    """Where a pump writes: the HTTP protocol (chunked SSE) or a WebSocket session.
    ``write_events`` consumes the list before it returns (the pump reuses it)."""

    @property
    def paused(self) -> bool: ...

    def write_events(self, frames: list[bytes]) -> None: ...

    def abort(self) -> None: ...


class NullSink:
    """A sink with no client (background responses): never pauses, discards bytes."""

    paused = False

    def write_events(self, frames: list[bytes]) -> None:
        pass

    def abort(self) -> None:
        pass


class Pump:
    """Paces one stream into one sink. ``on_done(reason)`` fires once: ``"completed"``,
    ``"stopped"`` (truncated by plan), ``"disconnect"`` (fault), ``"error"`` (the pump
    failed: see the module doc), or the reason given to :meth:`cancel` (``"cancelled"``).
    ``error_frame(err, sequence_number)`` renders the terminal error frame written when the
    pump fails (None: write nothing, e.g. no client)."""

    __slots__ = ("stream", "clock", "encode", "sink", "on_done", "observer", "error_frame",
                 "_timer", "_pending", "_paused_at", "_done", "_per_write", "_is_token",
                 "_unobserved")

    def __init__(self, stream: EventStream, clock: Clock,
                 encode: Callable[[str, Any], bytes], sink: Sink,
                 on_done: Callable[[str], None] | None = None,
                 observer: Callable[[str, Any, float], None] | None = None,
                 error_frame: Callable[[APIError, int], bytes] | None = None) -> None:
        self.stream = stream
        self.clock = clock
        self.encode = encode
        self.sink = sink
        self.on_done = on_done
        self.observer = observer
        self.error_frame = error_frame
        self._timer: Timer | None = None
        self._pending: tuple[float, str, Any] | None = None
        self._paused_at: float | None = None
        self._done = False
        # an observer that counts tokens per write (StreamTrack.observe): called once per
        # write with the number of token events in it, instead of once per event
        self._per_write: Callable[[int, float], None] | None = getattr(observer, "per_write",
                                                                       None)
        self._is_token = stream.dialect.is_token
        self._unobserved = 0  # token events encoded but not yet observed (failure path)

    def start(self) -> None:
        self.stream.begin(self.clock.now())
        self._tick()

    def resume(self) -> None:
        """The sink drained below its low-water mark: continue, later by the pause."""
        if self._done or self._paused_at is None:
            return
        paused_for = self.clock.now() - self._paused_at
        self._paused_at = None
        self.stream.shift(paused_for)
        if self._pending is not None:
            d, t, x = self._pending
            self._pending = (d + paused_for, t, x)
        self._tick()

    def cancel(self, reason: str = "cancelled") -> None:
        """The client went away (or was cut): stop everything, release the plan."""
        self._finish(reason)

    def _finish(self, reason: str) -> None:
        if self._done:
            return
        self._done = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        try:
            self.stream.close()
        except Exception:  # a plan's cleanup failed: on_done must still release everything
            log.exception("stream plan failed while closing")
        if self.on_done is not None:
            self.on_done(reason)

    def claim(self) -> int:
        """A sequence number for an event of this stream written now, ahead of the event
        the pump holds until its deadline (:meth:`EventStream.claim`)."""
        ev = self._pending
        return self.stream.claim(ev[2] if ev is not None else None)

    def _fail(self, frames: list[bytes]) -> None:
        """Called from an ``except`` block: end the stream with a terminal error frame."""
        if self._done:  # raised by on_done (the stream had ended): nothing left to end
            log.exception("stream end callback failed")
            return
        log.exception("stream failed after its first byte")
        # the number of the first event not written (the one that failed, if it had one)
        seq = self.claim()
        self._pending = None
        out = frames  # encoded before the failure: valid events
        if self.error_frame is not None:
            try:
                out = [*frames, self.error_frame(server_error(), seq)]
            except Exception:
                log.exception("cannot render the terminal error frame")
        try:
            if out:
                self.sink.write_events(out)
        except Exception:  # the sink itself is broken: drop the connection instead
            log.exception("cannot write the terminal error frame")
            self.sink.abort()
        if self._unobserved and self._per_write is not None:
            n, self._unobserved = self._unobserved, 0
            try:
                self._per_write(n, self.clock.now())
            except Exception:
                log.exception("stream observer failed")
        self._finish("error")

    def _tick(self) -> None:
        fired = self._timer  # (None when called by start or resume)
        self._timer = None
        if self._done:
            return
        frames: list[bytes] = []
        try:
            self._step(frames, fired)
        except Exception:
            self._fail(frames)

    def _step(self, frames: list[bytes], fired: Timer | None) -> None:
        sink = self.sink
        if sink.paused:
            if self._paused_at is None:
                self._paused_at = self.clock.now()
            return
        clock = self.clock
        now = clock.now()
        same = clock.coalesce
        limit = now + same
        behind = now - clock.catch_up  # an event due before this is late: catch up
        stream = self.stream
        encode = self.encode
        per_write = self._per_write
        is_token = self._is_token
        observer = self.observer if per_write is None else None
        tokens = 0  # token events in ``frames`` (per_write observation)
        last = None  # deadline of the last event encoded in this pass
        try:
            while True:
                ev = self._pending
                if ev is None:
                    ev = stream.pull()
                    if ev is None:
                        if frames:
                            self._write(frames, tokens, now)
                            tokens = 0
                        self._finish("completed")
                        return
                    self._pending = ev  # until written (a failure reports its number)
                deadline = ev[0]
                # the coalescing rule (Clock.catch_up): a later event joins this write
                # only when it is due at the same instant as the last one or already late
                if deadline > limit or (last is not None and deadline - last > same
                                        and deadline >= behind):
                    if frames:
                        self._write(frames, tokens, now)
                        tokens = 0
                    if not self._done:
                        self._timer = (clock.call_at(deadline, self._tick)
                                       if fired is None or not fired.cancelled
                                       else clock.recall(fired, deadline))
                    return
                etype = ev[1]
                if etype[0] == "_":
                    self._pending = None
                    if frames:
                        self._write(frames, tokens, now)
                        tokens = 0
                    if etype == DISCONNECT:
                        sink.abort()
                        self._finish("disconnect")
                    elif etype == STOP:
                        self._finish("stopped")
                    if self._done:
                        return
                    continue  # unknown control items are ignored
                data = ev[2]
                frames.append(encode(etype, data))
                self._pending = None
                last = deadline
                if per_write is not None:
                    if is_token(etype, data):
                        tokens += 1
                elif observer is not None:
                    observer(etype, data, now)
                if len(frames) >= MAX_BATCH:
                    self._write(frames, tokens, now)
                    tokens = 0
                    if sink.paused or self._done:
                        if not self._done:
                            self._paused_at = now
                        return
        except BaseException:
            self._unobserved = tokens  # the frames _fail writes still count
            raise

    def _write(self, frames: list[bytes], tokens: int, now: float) -> None:
        """Write ``frames`` (then empty the list for reuse) and observe the ``tokens``
        token events among them, once for the write."""
        self.sink.write_events(frames)
        frames.clear()
        if tokens and self._per_write is not None:
            self._per_write(tokens, now)
