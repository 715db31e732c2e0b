"""EventStream: the one place where stream events get their order and sequence numbers.

Theory of operation. An API handler decides everything a stream will say and when *before*
the first byte (sans-IO, from a seeded RNG), and expresses it as a *plan*: a plain (sync)
iterator of ``(offset, type, data)`` where ``offset`` is seconds after the previous event's
scheduled time. A plain iterator keeps the per-token cost at one ``next()`` call, and
lazy generation keeps memory per stream small however long the output is.

:class:`EventStream` wraps the plan, turns offsets into absolute deadlines anchored at the
stream's start (so delays never accumulate lateness), and, when its
:class:`~llmsim.streaming.dialect.Dialect` numbers events (Responses), stamps ``sequence_number`` on
every event in the order the transport will emit them. A plan's payload is a dict, a
:class:`TokenRun` (plans build no token bytes) or an event rendered already, ``bytes``: its
JSON, in a numbering dialect cut before its number, which the stream appends as it does to
a token's (a Responses plan's lifecycle and item events: each Response object rendered once
for all the events that carry it). It is the only place that decides a sequence number:
``seq``, the next number, is the one count of the stream. A resumed stream starts at
``first_seq``; an out-of-band event that belongs to the stream (a WebSocket error or steer
answer, the terminal error frame of a failed stream) takes :meth:`EventStream.claim` (the
stream keeps the numbers so taken, ``claimed``); a pump writing a run takes its tokens' numbers
from ``seq`` as it writes them; a replay of what a stream told is a stream of the same plan
numbered again from 0 (:meth:`EventStream.replay`: it passes over the numbers the first one
claimed and hands over the events after ``starting_after``). An event of no stream that must
carry a number (a WebSocket steer answer for a response not running there) claims it from a
stream of no events its connection keeps. The same EventStream feeds SSE (HTTP) and WebSocket
text frames: the transports ask ``stream.dialect`` for the encoder.

What generic layers (faults, capacity, rate limits, stats) need to know about a stream without
knowing its API family is typed: ``dialect`` (token events, terminal events, error events),
``model``, ``usage`` (the decided :class:`~llmsim.sim.decide.Usage`: prompt and output tokens,
for pacing and late rate-limit charges; billing is the transport's, from the response), and
``fail`` (this stream's own error events, e.g. a Responses ``response.failed`` carrying the
output so far; default: the dialect's).

A plan hands its tokens over as runs: an item ``(offset, type, TokenRun(...))`` stands for
one token event per piece of text, the first ``offset`` after the previous event, each later
one a gap after it (:class:`TokenRun`); the event is the dialect's token event (its one
template, :attr:`Dialect.token_json <llmsim.streaming.dialect.Dialect>`). A pump that renders
runs itself (it set ``take_runs``) gets the run as one item and writes its tokens without a
``next()``, a tuple or a concatenation per token (issue 15). Everyone else
(:meth:`EventStream.drain`, an encoder without a token frame, a stream that observes that
type) gets the same events one by one from :meth:`EventStream.pull`, the payloads rendered
from the template as ``bytes`` (JSON; in a numbering dialect with its number), the offsets
and numbers the same. A reader of a plan itself (a wrapper, a replay) sees each token as a
run of one (:func:`expand_runs`).

Control types (never sent to the client): :data:`DISCONNECT` drops the connection at that
point without a terminal event (fault injection), :data:`STOP` ends the stream cleanly at that
point (a "truncated" stream: the HTTP body ends properly but the terminal event is missing).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from .encode import piece_json

if TYPE_CHECKING:
    from ..errors import APIError
    from ..sim.decide import Usage
    from .dialect import Dialect, Events

__all__ = ["EventStream", "DISCONNECT", "STOP", "Plan", "PlanItem", "numbered", "TokenRun",
           "expand_runs", "close_plan", "stamped_suffixes"]

DISCONNECT = "__disconnect__"
STOP = "__stop__"

PlanItem = tuple[float, str, Any]
Plan = Iterable[PlanItem]


def numbered(etype: str, data: Any) -> bool:
    """Does this plan event take a sequence number (in a numbering dialect)? Every event the
    client sees (not a control type) whose payload is an object: a dict, a token (a
    :class:`TokenRun` of one piece, as :func:`expand_runs` yields them) or a rendering
    (``bytes``, see :class:`EventStream`: a token's, or an event a plan rendered)."""
    return etype[0] != "_" and (type(data) is dict or type(data) is TokenRun
                                or type(data) is bytes)


def _stamped(data: bytes, seq: int) -> bytes:
    """A token event rendered from its template (JSON cut just before its
    ``sequence_number`` value) numbered."""
    return data + (_STAMPS[seq] if seq < _NSTAMPS else _STAMP % seq)


_STAMP = b"%d}"  # what numbers a token event (EventStream.pull inlines _stamped)
# the stamps of the first numbers, rendered once (~80 KB): a token's stamp is a list read,
# not a bytes format (issue 15)
_NSTAMPS = 2048
_STAMPS = [_STAMP % i for i in range(_NSTAMPS)]
# the claimed numbers a stream keeps for its replays (past them a replay numbers the events
# after the last kept one as if no claim had come)
MAX_CLAIMED = 1024
_ENDED: Iterator[Any] = iter(())  # the plan of an ended stream (EventStream._release)
_NO_GAPS: Iterator[float] = iter(())  # the gaps of a run of one token (never drawn)


class TokenRun:
    """A run of the dialect's token events, handed over by a plan as one item ``(offset,
    token_type, run)``: event ``k`` is the token ``pieces[k]`` in the dialect's template for
    ``key`` (``Dialect.token_json(key)``: what varies from run to run, e.g. the choice index
    or the output item; the plan renders nothing). Event 0 waits ``offset`` after the
    previous event, each later one ``next(gaps, 0.0)`` after the one before it, drawn only
    when that event comes (a plan may share ``gaps`` with what follows the run). ``pieces``
    must not be empty and must not change while the run is read."""

    __slots__ = ("pieces", "gaps", "key")

    def __init__(self, pieces: list[str], gaps: Iterator[float] = _NO_GAPS,
                 key: Any = None) -> None:
        self.pieces = pieces
        self.gaps = gaps
        self.key = key

    def split(self, etype: str, offset: float) -> Iterator[PlanItem]:
        """The run as runs of one token, one item each, as a plan would yield them."""
        key, gaps = self.key, self.gaps
        first = True
        for piece in self.pieces:
            yield (offset if first else next(gaps, 0.0)), etype, TokenRun([piece], _NO_GAPS, key)
            first = False

    def events(self, etype: str, offset: float, dialect: Dialect) -> Iterator[PlanItem]:
        """The run's events one by one, each payload rendered from ``dialect``'s template
        (in a numbering dialect cut before the number, which the stream appends)."""
        pre, post = dialect.token_json(self.key)  # type: ignore[misc]  # (a token dialect)
        gaps = self.gaps
        first = True
        for piece in self.pieces:
            yield (offset if first else next(gaps, 0.0)), etype, pre + piece_json(piece) + post
            first = False


def close_plan(plan: Iterable[Any]) -> None:
    """Close ``plan`` if it can be closed (a generator: its ``finally`` blocks run)."""
    close = getattr(plan, "close", None)
    if close is not None:
        close()


def expand_runs(plan: Iterable[PlanItem]) -> Iterator[PlanItem]:
    """``plan`` with every :class:`TokenRun` item replaced by runs of one token, one item
    each (for a reader that needs every event as an item: a wrapper, a replay; still no
    bytes). Closing it closes ``plan``."""
    it = iter(plan)
    try:
        for item in it:
            data = item[2]
            if type(data) is TokenRun and len(data.pieces) > 1:
                yield from data.split(item[1], item[0])
            else:
                yield item
    finally:
        close_plan(it)


def _then(first: Iterator[PlanItem], rest: Iterator[PlanItem]) -> Iterator[PlanItem]:
    """``first``, then ``rest`` (a run expanded in front of the rest of a plan); closing it
    closes ``rest``."""
    try:
        yield from first
        yield from rest
    finally:
        close_plan(rest)


# the numbers of a numbering dialect's pre-rendered payloads, with the run's ``post`` in front
# (a token of a run is ``tj + table[seq]``: one concatenation): a table per distinct ``post``,
# at most _MAX_SUFFIXES of them, each ~_NSTAMPS × (len(post) + 5) bytes
_SUFFIXES: dict[bytes, list[bytes]] = {}
_MAX_SUFFIXES = 8
_MAX_SUFFIX_BYTES = 64


def stamped_suffixes(post: bytes) -> list[bytes]:
    """``post`` followed by each of the first numbers' stamps, ``[post + stamp(0), …]``; an
    empty list once the table is full or for a long ``post`` (the caller stamps each event)."""
    table = _SUFFIXES.get(post)
    if table is None:
        if len(_SUFFIXES) >= _MAX_SUFFIXES or len(post) > _MAX_SUFFIX_BYTES:
            return []
        table = _SUFFIXES[post] = [post + st for st in _STAMPS]
    return table


class EventStream:
    """A stream of ``(type, data)`` events with absolute deadlines, numbered when its dialect
    numbers events (see the module doc)."""

    __slots__ = ("_it", "dialect", "model", "id", "usage", "fail", "seq", "start", "deadline",
                 "finished", "on_event", "_numbered", "_observed", "_on_end", "take_runs",
                 "_wrapped", "claimed")

    def __init__(self, plan: Plan, dialect: Dialect, *, model: str | None = None,
                 id: str | None = None, usage: Usage | None = None,
                 fail: Callable[[APIError], Events] | None = None,
                 on_event: Callable[[str, Any], None] | None = None,
                 observed: frozenset[str] | None = None,
                 first_seq: int = 0, on_end: Callable[[], None] | None = None) -> None:
        self._it: Iterator[PlanItem] = iter(plan)
        self.dialect = dialect
        self.model = model
        self.id = id  # the response this stream tells (out-of-band events find it by id)
        self.usage = usage
        self.fail = fail if fail is not None else dialect.error_events
        self._numbered = dialect.numbered
        self.seq = first_seq  # the number the next numbered event gets
        self.start: float | None = None
        self.deadline = 0.0
        self.finished = False
        self.on_event = on_event  # observes events as they are pulled (e.g. a store) …
        self._observed = observed  # … of these types only (None: every event)
        # called once when the plan ends, run out or closed (what a ``finally`` around the
        # plan would do, without a generator layer on every event)
        self._on_end = on_end
        self.take_runs = False  # set by a pump that renders a TokenRun itself (see pull)
        self._wrapped = False  # a wrapper reads the plan: runs are expanded under it
        self.claimed: list[int] | None = None  # the numbers claim() gave, in order (if any)

    def claim(self, unsent: Any = None) -> int:
        """A sequence number for an event of this stream sent now, outside its plan (a
        WebSocket steer answer or error). ``unsent`` is the payload of an event already
        pulled (numbered) but not yet written, if any: the claimer takes its number and it
        moves one up, so the client still sees 0, 1, 2, ... in order."""
        n = self.seq
        if not self._numbered:
            return n
        self.seq = n + 1
        if type(unsent) is dict and type(unsent.get("sequence_number")) is int:
            n = unsent["sequence_number"]
            unsent["sequence_number"] = n + 1
        self._claimed(n)
        return n

    def _claimed(self, n: int) -> None:
        if self.claimed is None:
            self.claimed = []
        if len(self.claimed) < MAX_CLAIMED:  # (a client that floods steers: a bound)
            self.claimed.append(n)

    def claim_ahead(self, unsent: PlanItem | None) -> tuple[int, PlanItem | None]:
        """:meth:`claim` ahead of ``unsent``, the ``(deadline, type, data)`` pulled but not
        yet written: returns the number and ``unsent`` as it must now be written (an event
        rendered already, a token's or a plan's, cannot be renumbered in place: it comes
        back re-rendered)."""
        if unsent is None or type(unsent[2]) is not bytes or not self._numbered:
            return self.claim(unsent[2] if unsent is not None else None), unsent
        data = unsent[2]
        cut = data.rindex(b":") + 1  # (the number and the brace _stamped appended)
        n = int(data[cut:-1])
        self.seq += 1
        self._claimed(n)
        return n, (unsent[0], unsent[1], _stamped(data[:cut], n + 1))

    def replay(self, starting_after: int, claimed: Sequence[int] = (),
               ended: Callable[[], tuple[int, PlanItem | None] | None] | None = None) -> None:
        """Make this stream a replay of one that tells the same plan: it numbers the plan's
        events from ``seq`` as that one does, passing over ``claimed`` (the numbers that one
        gave events outside its plan, ascending: its :attr:`claimed`, read as it grows), and
        hands over only the events numbered after ``starting_after``; the offsets of those
        it keeps back count towards the next one it hands over. ``ended()``, asked before
        each event, is where that one ended early (a cancel, a failure), if it did: the
        number ``end`` this one stops before, or hands ``last`` over at (numbered ``end``).
        Call before the stream starts."""
        self._it = self._replayed(expand_runs(self._it), starting_after, claimed, ended)

    def _replayed(self, plan: Iterator[PlanItem], after: int, claimed: Sequence[int],
                  ended: Callable[[], tuple[int, PlanItem | None] | None] | None
                  ) -> Iterator[PlanItem]:
        held = 0.0
        i = 0  # claimed[:i] are behind the count
        try:
            for offset, etype, data in plan:
                if not (self._numbered and numbered(etype, data)):
                    yield offset, etype, data
                    continue
                while i < len(claimed) and claimed[i] <= self.seq:
                    if claimed[i] == self.seq:
                        self.seq += 1
                    i += 1
                n = self.seq  # the number pull gives this event
                stop = ended() if ended is not None else None
                if stop is not None and n >= stop[0]:
                    if stop[1] is not None and n > after:
                        yield stop[1]
                    return
                if n <= after:  # told already: numbered, not handed over
                    self.seq = n + 1
                    held += offset
                    continue
                yield held + offset, etype, data
                held = 0.0
        finally:
            close_plan(plan)

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
            self._release()
            return None
        if type(data) is TokenRun:
            if etype != self.dialect.token_type:  # (the template is of that type only)
                raise ValueError(f"a TokenRun of {etype!r} in a {self.dialect} stream")
            if not (self.take_runs and (
                    self.on_event is None or (
                        self._observed is not None and etype not in self._observed))):
                # not taken whole: its events one by one, in front of the rest of the plan
                self._it = _then(data.events(etype, offset, self.dialect), self._it)
                return self.pull()
            # the pump renders the run (numbering its events from ``seq`` as it writes them);
            # its offset counts here, the later gaps in the pump, which sets ``deadline`` to
            # the last token's when the run ends
            self.deadline += offset
            return self.deadline, etype, data
        self.deadline += offset
        if self._numbered and etype[0] != "_":  # numbered(), inlined
            seq = self.seq
            if type(data) is bytes:  # a rendering (_stamped, inlined)
                data = data + (_STAMPS[seq] if seq < _NSTAMPS else _STAMP % seq)
                self.seq = seq + 1
            elif type(data) is dict:
                data["sequence_number"] = seq
                self.seq = seq + 1
        if self.on_event is not None and etype[0] != "_" and (
                self._observed is None or etype in self._observed):
            self.on_event(etype, data)
        return self.deadline, etype, data

    def wrap(self, fn: Callable[[Iterator[PlanItem]], Iterable[PlanItem]],
             runs: bool = False) -> None:
        """Replace the plan by ``fn(plan)`` (a generator around it: faults, capacity pacing).

        Call before the stream starts; ``fn`` must close the inner plan when it is closed
        (a generator's ``finally: inner.close()``) so the plan's cleanup still runs. The
        wrapper sees every event one by one (a :class:`TokenRun` is expanded under it), or
        with ``runs`` the plan's runs whole: then ``fn`` must hand over no run itself.
        """
        inner = self._it if self._wrapped or runs else expand_runs(self._it)
        self._wrapped = True
        self._it = iter(fn(inner))

    def close(self) -> None:
        """Stop the plan (the client is gone); runs the plan's ``finally`` blocks."""
        self.finished = True
        try:
            close_plan(self._it)
        finally:
            self._release()

    def _release(self) -> None:
        """An ended stream lets go of its plan and its callbacks: they often hold the object
        that holds the stream (a stored response's record), a cycle only a full garbage
        collection would free, seconds later, in a pause every stream in flight sees."""
        self._it = _ENDED
        self.on_event = None
        self.fail = self.dialect.error_events
        on_end, self._on_end = self._on_end, None
        if on_end is not None:
            on_end()

    def drain(self) -> list[tuple[str, Any]]:
        """Pull every remaining event without timing (tests, non-streamed collection)."""
        out = []
        while (ev := self.pull()) is not None:
            out.append((ev[1], ev[2]))
        return out
