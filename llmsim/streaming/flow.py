"""Pacing and backpressure: drive an EventStream on the shared clock into a sink.

Theory of operation. A :class:`Pump` owns one stream. Each time the clock fires it, it pulls
the event whose deadline has come, encodes it and hands the bytes to its sink, then arms one
timer for the next deadline. Events share a write only when they are due at the same instant
or when the pump is behind by more than ``Clock.catch_up`` (the one coalescing rule, see
:class:`~llmsim.streaming.clock.Clock`): on time, every event is its own write at its own deadline. No
task and no ``sleep`` per stream: the per-token cost is a ``next()``, an encode and a heap push.
A run of tokens the plan hands over whole (:class:`~llmsim.streaming.stream.TokenRun`) costs less: the
pump renders each token from the dialect's token template (``Dialect.template``, in the
encoder's frame and the wire's chunk or WebSocket frame, compiled once per run) as the parts
around the token's JSON, joined once per write, with no ``next()`` of the plan, no tuple and
no concatenation per token (a numbered token adds its number, taken from the stream's
count), under the same coalescing rule. The common tick, on time, writes one token of a run
with equal gaps into a connection's wire and nothing else: it has a short path of its own
(:meth:`Pump.fire`), whose write the clock's pass holds and makes with the pass's others
(:attr:`~llmsim.streaming.clock.Clock.outbox`); every other path of the pump writes what the
pass holds first.

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
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import APIError, server_error
from ..sim.latency import ConstantGaps
from .clock import Clock, Timer, holds_writes
from .encode import piece_json
from .stream import _STAMP, DISCONNECT, STOP, EventStream, TokenRun, stamped_suffixes
from .wire import Framing, Wire

if TYPE_CHECKING:
    from .dialect import Dialect

__all__ = ["Pump", "Sink", "NullSink"]

log = logging.getLogger("llmsim")

MAX_BATCH = 256  # events per write before the pump re-checks backpressure
_FULL = ""  # Pump._tick: the write ended at MAX_BATCH (no event type is empty)
_NO_PIECES: list[str] = []  # Pump: no token run (never changed)
_NO_LEADS: list[bytes] = []  # Pump._leads without a wire frame (never read)
_NO_KEY = object()  # Pump._run_key before a run
MAX_TEMPLATES = 16  # templates a pump keeps for the keys of its stream (then starts again)


class Sink(Protocol):
    """Where a pump writes: a connection's :class:`~llmsim.streaming.wire.Wire` (an HTTP stream's
    chunks, a WebSocket session's text frames; the pump calls it natively), the HTTP
    protocol itself for a body that is not chunked, or :class:`NullSink`.
    ``write_events`` consumes the list before it returns (the pump reuses it).

    A sink that frames every event the same way may also offer ``wire_frame(prefix,
    suffix)``: the parts of the wire bytes of the event ``prefix + payload + suffix`` around
    the payload (:data:`~llmsim.streaming.wire.Framing`: a lead that depends on the length,
    a head, a tail; the sink's type's, the same for all its sinks), and
    ``write_wire(parts)``, which writes the parts of events so framed with one join. The pump then renders each event once, not framed twice (HTTP chunked:
    the SSE frame, then the chunk around it; WebSocket: the JSON, then the frame)."""

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


# What a pump reads once from its encoder, its stream's dialect and its sink (Pump.__init__):
# (the encoder's frame of the dialect's token event or None, the sink is a Wire, the sink has
# a wire frame, its leads, its lead, its tail, len(leads)). Kept for the dialects' own
# encoders (the same facts for every stream of a family on one kind of sink; a sink's wire
# frame is its type's), computed for any other.
_Facts = tuple[tuple[bytes, bytes] | None, bool, bool, list[bytes], Any, bytes, int]
_FACTS: dict[tuple[Any, Dialect, type], _Facts] = {}
MAX_FACTS = 64  # (bounded: encoders and sink types are the code's, never the clients')


def _facts(encode: Callable[[str, Any], bytes], dialect: Dialect, sink: Sink,
           keep: bool) -> _Facts:
    frame_of = (getattr(encode, "bytes_frame", None) if dialect.token_type is not None
                else None)
    frame: tuple[bytes, bytes] | None = (
        frame_of(dialect.token_type) if frame_of is not None else None)
    wire_frame = getattr(sink, "wire_frame", None)
    if wire_frame is not None:
        framing: Framing = wire_frame(b"", b"")
        leads, lead, _, _, tail = framing
        facts: _Facts = (frame, isinstance(sink, Wire), True, leads, lead, tail, len(leads))
    else:
        facts = (frame, isinstance(sink, Wire), False, _NO_LEADS, None, b"", 0)
    if keep:
        if len(_FACTS) >= MAX_FACTS:
            _FACTS.clear()
        _FACTS[(encode, dialect, type(sink))] = facts
    return facts


class Pump(Timer):
    """Paces one stream into one sink. ``on_done(reason)`` fires once: ``"completed"``,
    ``"stopped"`` (truncated by plan), ``"disconnect"`` (fault), ``"error"`` (the pump
    failed: see the module doc), or the reason given to :meth:`cancel` (``"cancelled"``).
    ``error_frame(err, sequence_number)`` renders the terminal error frame written when the
    pump fails (None: write nothing, e.g. no client)."""

    # (the fast tick's fields first, in the order it reads them: the fewest cache lines of
    # a pump per token, thousands of pumps taking turns)
    __slots__ = ("_fast", "_nw", "clock", "_run_at", "_run_i", "_run_gap", "_same", "_run_lim",
                 "_run_pieces", "_run_stamps", "_run_extra", "_nleads", "_leads", "_run_head",
                 "_run_tail", "_times", "held_write", "stream", "_run_nstamps", "_run_post",
                 "_done", "_in_run", "_wired", "sink", "_now", "_catch_up", "_run_n",
                 "_fold_every", "_pending",
                 "encode", "on_done", "observer", "error_frame", "_paused_at", "_per_write",
                 "_is_token", "_unobserved", "_frame", "_token_types", "_fold", "_each",
                 "_lead", "_tail", "_run_gaps", "_run_key", "_templates")

    def __init__(self, stream: EventStream, clock: Clock,
                 encode: Callable[[str, Any], bytes], sink: Sink,
                 on_done: Callable[[str], None] | None = None,
                 observer: Callable[[str, Any, float], None] | None = None,
                 error_frame: Callable[[APIError, int], bytes] | None = None) -> None:
        # The pump is its own clock timer (the clock calls its fire): no Timer object and no
        # bound method between the clock and the pump (issue 15).
        # (Timer.__init__, inlined: once per stream.) Timer.cancelled is "not in a slot of
        # the clock": True until a tick arms the pump (Clock.recall clears it), set again
        # when the clock fires it or a finish cancels it
        self.deadline = 0.0
        self.callback = holds_writes
        self.cancelled = True
        self._done = False
        self._in_run = False  # a TokenRun is being written (its state in the _run_ fields)
        self._fast = False  # in a run the tick's one-token path can write (see _start_run)
        self.sink = sink
        self.stream = stream
        dialect = stream.dialect
        # what the encoder, the dialect and the sink's type say (see _facts): the dialect's
        # own encoders' are computed once
        if encode is dialect.sse or encode is dialect.ws:
            facts = _FACTS.get((encode, dialect, type(sink)))
            if facts is None:
                facts = _facts(encode, dialect, sink, True)
        else:
            facts = _facts(encode, dialect, sink, False)
        # the encoder's frame of the dialect's token event (in which the pump renders runs
        # from the dialect's template; None: every event is encoded), whether the sink is a
        # connection's Wire, and the sink's wire frame (see Sink: an encoded event ``x``
        # goes out as the parts ``lead(len(x)), x, tail``, a run's tokens with the run's
        # own head and tail, written by write_wire; ``wired``: it has one)
        (self._frame, is_wire, self._wired, self._leads, self._lead, self._tail,
         self._nleads) = facts
        # the sink when it is a connection's Wire (HTTP chunks, WebSocket frames): its flag
        # and its write read directly, not looked up through the protocol object
        nw: Wire | None = sink if is_wire else None  # type: ignore[assignment]
        self._nw = nw
        # the wire's transport's write, for the writes a clock pass holds (Clock.outbox)
        self.held_write: Callable[[bytes], Any] | None = (
            nw.transport.write if nw is not None and nw.transport is not None else None)
        self._now = clock.now_fn()
        self._same = clock.coalesce
        self._catch_up = clock.catch_up
        # a TokenRun being written (see _start_run): the deadline of its next event, the
        # event's index, the run's length, its gap when constant, its pieces, its frame:
        # ``lead(len(payload) + extra) + head + payload + tail`` with the wire (the lead
        # read from ``leads``, ``nleads`` long: a field read per event, not a len() call),
        # ``head + payload + tail`` without; the payload is the token's JSON, in a
        # numbering dialect followed by ``post`` and the number the stream's count gives
        # (``stamps[seq]``, or rendered past the table)
        self._run_at = 0.0
        self._run_i = self._run_n = 0
        # the fast tick's bound on the next token's index (see _tick's end): the run's end, or
        # sooner, where the token times held reach fold_every (folded by the tick there)
        self._run_lim = 0
        self._run_gap = -1.0  # the run's gaps when all equal (ConstantGaps), else -1.0
        self._run_pieces: list[str] = _NO_PIECES
        self._run_stamps: list[bytes] | None = None
        self._run_nstamps = 0  # len(_run_stamps), read per token instead of a len() call
        self._run_extra = 0
        self._run_head = self._run_tail = b""
        # the per-write observer protocol (StreamTrack.observe): the write's time appended
        # to ``times`` once per token, ``fold()`` called when ``fold_every`` of them are held
        self._times: list[float] | None = getattr(observer, "times", None)
        self._fold_every: int = getattr(observer, "fold_every", 0)
        self._pending: tuple[float, str, Any] | None = None
        self.clock = clock
        self.encode = encode
        self.on_done = on_done
        self.observer = observer
        self.error_frame = error_frame
        self._paused_at: float | None = None
        # an observer that counts tokens per write (StreamTrack.observe): called once per
        # write with the number of token events in it, instead of once per event
        per_write = self._per_write = getattr(observer, "per_write", None)
        self._fold: Callable[[], None] | None = getattr(observer, "fold", None)
        self._is_token = dialect.is_token
        self._token_types = dialect.token_types
        # the per-event observer call, for an observer without the per-write protocol
        self._each: Callable[[str, Any, float], None] | None = (
            observer if per_write is None else None)
        self._unobserved = 0  # token events encoded but not yet observed (failure path)
        self._run_gaps: Any = None  # (the run's gaps when they vary)
        self._run_post = b""
        # the key whose template the _run_ fields hold, and the templates of the stream's
        # other keys (made at a second key: runs of one token of choices taking turns)
        self._run_key: Any = _NO_KEY
        self._templates: dict[int, tuple[Any, ...]] | None = None
        # runs are rendered here when the token event has a frame and there is no per-event
        # observer (else the stream hands the run's events over one by one)
        stream.take_runs = self._frame is not None and self._each is None

    def start(self, received_at: float | None = None) -> None:
        """Begin the stream: its schedule counts from ``received_at`` (clock time), when the
        request was read, if given and not later than now, else from now. A transport gives
        it when nothing was waited for on purpose between the read and this start (the
        handler never suspended), so the loop pass a request waits to be handled, and the
        handlers of the requests read with it, do not add to its time to first token
        (issue 15); a handler that waited (a capacity queue, a delay fault, a hook) begins
        when it is done waiting, its wait part of what the client sees."""
        now = self._now()
        self.stream.begin(now if received_at is None or received_at > now else received_at)
        self._tick()

    def resume(self) -> None:
        """The sink drained below its low-water mark: continue, later by the pause."""
        if self._done or self._paused_at is None:
            return
        paused_for = self._now() - self._paused_at
        self._paused_at = None
        self.stream.shift(paused_for)
        if self._pending is not None:
            d, t, x = self._pending
            self._pending = (d + paused_for, t, x)
        if self._in_run:
            self._run_at += paused_for
        self._tick()

    def cancel(self, reason: str = "cancelled") -> None:
        """The client went away (or was cut): stop everything, release the plan."""
        self._finish(reason)

    def _finish(self, reason: str) -> None:
        if self._done:
            return
        self._done = True
        self._in_run = self._fast = False
        self._run_gaps = None
        self._run_pieces = _NO_PIECES
        # armed: the clock drops the entry when its slot comes, or compacts (a no-op if not)
        self.clock.cancel(self)
        try:
            self.stream.close()
        except Exception:  # a plan's cleanup failed: on_done must still release everything
            log.exception("stream plan failed while closing")
        if self.on_done is not None:
            self.on_done(reason)

    def claim(self) -> int:
        """A sequence number for an event of this stream written now, ahead of the event
        the pump holds until its deadline (:meth:`EventStream.claim`; a run's next token
        has no number yet: it takes the stream's next)."""
        n, self._pending = self.stream.claim_ahead(self._pending)
        return n

    def _fail(self, frames: list[bytes]) -> None:
        """Called from an ``except`` block: end the stream with a terminal error frame."""
        if self._done:  # raised by on_done (the stream had ended): nothing left to end
            log.exception("stream end callback failed")
            return
        log.exception("stream failed after its first byte")
        if self.clock.outbox:  # (this stream's held token goes before its error)
            self.clock.flush()
        nw = self._nw
        if nw is not None and nw.last is not None:  # (its last events, left to the owner)
            frames = [*nw.last, *frames]
            nw.last = None
        # the number of the first event not written (the one that failed, if it had one)
        seq = self.claim()
        self._pending = None
        out = frames  # encoded before the failure: valid events
        if self.error_frame is not None:
            try:
                last = self.error_frame(server_error(), seq)
                if self._wired:
                    out = [*frames, self._lead(len(last)), last, self._tail]
                else:
                    out = [*frames, last]
            except Exception:
                log.exception("cannot render the terminal error frame")
        try:
            if out:
                self._write(out)
        except Exception:  # the sink itself is broken: drop the connection instead
            log.exception("cannot write the terminal error frame")
            self.sink.abort()
        if self._unobserved and self._per_write is not None:
            n, self._unobserved = self._unobserved, 0
            try:
                self._per_write(n, self._now())
            except Exception:
                log.exception("stream observer failed")
        self._finish("error")

    def _fail_unwritten(self) -> None:
        """The one-token tick failed before writing anything (call from its ``except``
        block): the general tick's failure, nothing left unobserved."""
        self._unobserved = 0
        self._fail([])

    def held_write_failed(self, data: bytes) -> None:
        """A write the clock held for this stream's tick raised (called from the clock's
        ``except`` block): end the stream as when the tick's own write raises, the event
        written again before the terminal error frame (it was observed when held)."""
        self._fail([data])

    def _start_run(self, run: TokenRun, deadline: float) -> None:
        """Take over ``run``, its first event due at ``deadline`` (see TokenRun)."""
        self._run_pieces = run.pieces  # (not their JSON in a list of the run's own: no
        # faster per token, and a pointer more per token for every stream in flight)
        self._run_n = len(run.pieces)
        self._run_i = self._run_lim = 0  # (the lim: set where the tick that took it ends)
        self._run_at = deadline
        gaps = self._run_gaps = run.gaps
        # equal gaps (a constant latency): taken at once, a float added per token instead of
        # a next() on an iterator (and the objects behind it) per token
        self._run_gap = (gaps.value if type(gaps) is ConstantGaps
                         and gaps.take(self._run_n - 1) else -1.0)
        self._in_run = self._run_n > 0
        # the tick's one-token path (see fire): equal gaps, wire parts into a Wire with a
        # transport (whose writes a clock pass holds), the per-write observer's times or no
        # per-write observer
        self._fast = (self._in_run and self._run_gap >= 0.0 and self._wired
                      and self._nw is not None and self.held_write is not None
                      and (self._times is not None or self._per_write is None))
        key = run.key
        if key is self._run_key:  # (the template the run before used)
            return
        cache = self._templates
        if cache is not None or self._run_key is not _NO_KEY:  # a second key
            if cache is None:
                cache = self._templates = {}
            got = cache.get(id(key))
            if got is not None and got[0] is key:
                (_, self._run_head, self._run_tail, self._run_extra, self._run_stamps,
                 self._run_post) = got
                self._run_nstamps = len(self._run_stamps or ())
                self._run_key = key
                return
        head, post, tail = self.stream.dialect.template(
            key, self._frame)  # type: ignore[arg-type]  # (take_runs: set)
        if self.stream.dialect.numbered:  # the payload: the token, ``post``, the number
            self._run_post = post
            self._run_stamps = stamped_suffixes(post)
        else:
            self._run_stamps = None
        self._run_nstamps = len(self._run_stamps or ())
        if self._wired:  # (else a sink that frames each event itself: head + x + tail)
            framing: Framing = self.sink.wire_frame(head, tail)  # type: ignore[attr-defined]
            _, _, self._run_extra, head, tail = framing
        self._run_head, self._run_tail = head, tail
        self._run_key = key
        if cache is not None:  # (the entry holds the key: its id is not reused meanwhile)
            if len(cache) >= MAX_TEMPLATES:
                cache.clear()
            cache[id(key)] = (key, head, tail, self._run_extra, self._run_stamps,
                              self._run_post)

    def _write(self, frames: list[bytes]) -> None:
        # (a method call on the sink: no bound method object of this stream's to read, one
        # cold cache line fewer per write)
        nw = self._nw
        if nw is not None:
            if self._wired:
                nw.write_wire(frames)
            else:
                nw.write_events(frames)
        elif self._wired:
            self.sink.write_wire(frames)  # type: ignore[attr-defined]
        else:
            self.sink.write_events(frames)

    def _counts(self, etype: str, data: Any) -> bool:
        """Whether an event the encoder framed is a token (the dialect's declaration)."""
        types = self._token_types
        return etype in types if types is not None else self._is_token(etype, data)

    def _tick(self) -> None:
        """Write what is due, then arm the timer for the next deadline (or end the stream).

        The per-event path of every stream (issue 15): one call per firing, the plan's
        ``next()``, the encode, one write and one observation per write, one heap push; a
        run's token costs its parts (:meth:`_start_run`) instead of the ``next()`` and the
        encode. With the sink's wire frame (:class:`Sink`: the HTTP chunk, the WebSocket
        frame) an event is framed for the wire in the same step: ``frames`` then holds the
        parts of the write's events, one join in the sink renders them."""
        if self._done:
            return
        frames: list[bytes] = []
        tokens = 0  # token events in ``frames`` (observed once per write)
        try:
            nw = self._nw
            if self.clock.outbox:  # writes held by this pass go first (Clock.outbox)
                self.clock.flush()
            if nw.paused if nw is not None else self.sink.paused:
                if self._paused_at is None:
                    self._paused_at = self._now()
                return
            now = self._now()
            same = self._same
            limit = now + same
            last = None  # deadline of the last event encoded in this pass
            left = MAX_BATCH
            while True:  # one write per turn
                end: str | None = None  # why the turn ended: None = the next event is not due
                while True:
                    in_run = self._in_run
                    if not in_run:
                        ev = self._pending
                        if ev is None:
                            ev = self.stream.pull()
                            if ev is None:
                                end = "completed"
                                break
                            self._pending = ev  # until written (a failure reports its number)
                        deadline, etype, data = ev
                    else:  # the next token of a run (TokenRun): no pull, no tuple
                        deadline = self._run_at
                    # the coalescing rule (Clock.catch_up): a later event joins this write
                    # only when it is due at the same instant as the last one or already late
                    # (late: due before now - catch_up; read only for a second event)
                    if deadline > limit or (last is not None and deadline - last > same
                                            and deadline >= now - self._catch_up):
                        break
                    if in_run:
                        # the token's parts, joined with the rest of the write (no bytes
                        # built per token but its JSON and, when numbered, its number's)
                        i = self._run_i
                        x = piece_json(self._run_pieces[i])
                        stamps = self._run_stamps
                        if stamps is not None:  # numbered: the stream's next number
                            st = self.stream
                            seq = st.seq
                            st.seq = seq + 1
                            y = (stamps[seq] if seq < self._run_nstamps
                                 else self._run_post + (_STAMP % seq))
                            if self._wired:
                                n = len(x) + len(y) + self._run_extra
                                frames += (self._leads[n] if n < self._nleads
                                           else self._lead(n),
                                           self._run_head, x, y, self._run_tail)
                            else:
                                frames.append(b"".join((self._run_head, x, y,
                                                        self._run_tail)))
                        elif self._wired:
                            n = len(x) + self._run_extra
                            frames += (self._leads[n] if n < self._nleads
                                       else self._lead(n),
                                       self._run_head, x, self._run_tail)
                        else:
                            frames.append(self._run_head + x + self._run_tail)
                        tokens += 1
                        i += 1
                        if i < self._run_n:
                            self._run_i = i
                            g = self._run_gap
                            nxt = self._run_at = deadline + (
                                g if g >= 0.0 else next(self._run_gaps, 0.0))
                            if nxt > limit:  # (the loop's first test, at once: on time,
                                deadline = nxt  # a run's next token is not due yet)
                                break
                        else:  # the run is over: the plan's next offset counts from here
                            self._in_run = self._fast = False
                            self._run_gaps = None
                            self.stream.deadline = deadline
                    elif type(data) is TokenRun:  # taken whole: its first token is this one
                        self._pending = None
                        self._start_run(data, deadline)
                        continue
                    elif etype[0] == "_":
                        self._pending = None
                        end = etype
                        break
                    else:
                        x = self.encode(etype, data)
                        if self._wired:
                            n = len(x)
                            frames += (self._leads[n] if n < self._nleads
                                       else self._lead(n), x, self._tail)
                        else:
                            frames.append(x)
                        if self._per_write is not None and self._counts(etype, data):
                            tokens += 1
                        observer = self._each
                        if observer is not None:
                            observer(etype, data, now)
                        self._pending = None
                    last = deadline
                    left -= 1
                    if not left:
                        end = _FULL
                        left = MAX_BATCH
                        break
                if frames:
                    if nw is not None and self._wired:  # (_write, inlined: once per write)
                        if end is not None and nw.ends and (end == "completed" or end == STOP):
                            if nw.open:  # the last write: the owner makes it (Wire.ends)
                                nw.last = frames
                        else:
                            nw.write_wire(frames)
                    else:
                        self._write(frames)
                    frames = []
                    if tokens:
                        times = self._times
                        if times is not None:
                            if tokens == 1:
                                times.append(now)
                            else:
                                times.extend([now] * tokens)
                            tokens = 0
                            if len(times) >= self._fold_every:
                                self._fold()  # type: ignore[misc]  # (set with times)
                        else:
                            n, tokens = tokens, 0
                            if self._per_write is not None:
                                self._per_write(n, now)
                if end is None:
                    if self._fast:  # the fast tick's bound, after these writes
                        self._run_lim = self._run_bound()
                    if not self._done and self.cancelled:  # (armed: a tick comes anyway)
                        self.clock.recall(self, deadline)
                    return
                if end == _FULL:  # re-check backpressure, then go on
                    if self.sink.paused and not self._done:
                        self._paused_at = now
                        return
                elif end == "completed":
                    self._finish("completed")
                elif end == DISCONNECT:
                    self.sink.abort()
                    self._finish("disconnect")
                elif end == STOP:
                    self._finish("stopped")
                if self._done:
                    return
                # (a full batch, or an unknown control item, which is ignored: carry on)
        except Exception:
            self._unobserved = tokens  # the frames _fail writes still count
            self._fail(frames)

    def _run_bound(self) -> int:
        """The one-token tick's bound on the next token's index (``_run_lim``): the run's
        end, or sooner, where the token times held reach ``fold_every``."""
        lim = self._run_n
        times = self._times
        if times is not None:
            room = self._run_i + self._fold_every - len(times)
            if room < lim:
                lim = room
        return lim

    def fire(self) -> float | None:
        """The clock's call at the deadline the last tick armed (:meth:`Timer.fire`). The
        common tick, on time (one token of a run with equal gaps due, the next one not, into
        a connection's wire) has this short path: what :meth:`_tick` does for it without its
        bookkeeping for several events, plan events and other sinks (the same bytes, state
        and statistics); the write is held by the clock's pass (``Clock.outbox``) and the
        next deadline returned for the clock to arm. Anything else: the general tick."""
        if self._fast:  # (never once done: _finish clears it)
            nw: Wire = self._nw  # type: ignore[assignment]  # (_fast: a Wire)
            clock = self.clock
            now = clock.pass_at  # (fire: only ever called by the clock's pass)
            deadline = self._run_at
            i = self._run_i + 1
            nxt = deadline + self._run_gap
            if deadline <= now + self._same < nxt and not nw.paused:  # (due, writable)
                if i < self._run_lim:
                    try:
                        x = piece_json(self._run_pieces[i - 1])
                        stamps = self._run_stamps
                        if stamps is None:
                            n = len(x) + self._run_extra
                            out: tuple[bytes, ...] = (
                                self._leads[n] if n < self._nleads else self._lead(n),
                                self._run_head, x, self._run_tail)
                        else:  # numbered: the stream's next number
                            st = self.stream
                            seq = st.seq
                            st.seq = seq + 1
                            y = (stamps[seq] if seq < self._run_nstamps
                                 else self._run_post + (_STAMP % seq))
                            n = len(x) + len(y) + self._run_extra
                            out = (self._leads[n] if n < self._nleads else self._lead(n),
                                   self._run_head, x, y, self._run_tail)
                    except Exception:
                        self._fail_unwritten()
                        return None
                    self._run_i = i
                    self._run_at = nxt
                    if nw.open:  # (the wire's own test) held: written as the pass ends
                        clock.outbox.append(  # type: ignore[union-attr]
                            (self, b"".join(out)))  # type: ignore[arg-type]
                    times = self._times
                    if times is not None:  # (below fold_every: _run_lim)
                        times.append(now)
                    if self.cancelled:  # (not armed meanwhile; never done on this path)
                        return nxt  # (the clock arms it: Clock._run_due)
                    return None
                if i == self._run_lim < self._run_n and self._times is not None:
                    # the bound is the fold's, not the run's end: fold the times held
                    # here, not in a general tick (a cold pass through it)
                    try:
                        self._fold()  # type: ignore[misc]  # (set with times)
                    except Exception:
                        self._fail_unwritten()
                        return None
                    lim = self._run_bound()
                    if lim > i:
                        self._run_lim = lim
                        return self.fire()
        self._tick()
        return None
