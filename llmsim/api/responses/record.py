"""One response's lifecycle record (:class:`Record`), its published form for other workers
or replicas (:class:`Snapshot`), a conversation transcript (:class:`Conversation`), and their
sizes. (The package's state: :mod:`.state`; the shared stores: :mod:`.store`.)"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast

import orjson

from ...errors import APIError, E
from ...messages import Key
from ...state.store import approx_bytes, json_bytes
from ...streaming.stream import EventStream, expand_runs
from . import render
from .render import CallOut, HostedOut, MessageOut, ReasoningOut, RespOut

if TYPE_CHECKING:
    from ...streaming.flow import Pump
    from ..services import Services


__all__ = ["Record", "Snapshot", "Conversation", "PreviousResponses", "Publisher", "Item",
           "FAILED_CODES", "record_bytes", "input_bytes", "item_bytes", "RESPONSES", "ChainBudget"]


class Publisher(Protocol):
    """Where a record is published for other workers (:class:`.store.SharedResponses`)."""

    def publish(self, rec: Record) -> bool: ...

    def turns(self, rid: str, max_depth: int) -> list[list[Item]]: ...


class ChainBudget(Protocol):
    """What a record asks of the responses state (:class:`.state.ResponsesState`)."""

    chain_max_bytes: int

    def unlink(self, rec: Record) -> None: ...


# the responses state in App.features (set by .state.state)
RESPONSES: Key[Any] = Key("responses")


def _budget(app: Services) -> ChainBudget:
    return cast(ChainBudget, app.feature(RESPONSES))


class PreviousResponses(Protocol):
    """What a transport offers the Responses handler besides the store for
    ``previous_response_id`` (``Request.context`` of a WebSocket ``response.create``): the
    handler looks there first (so ``store: false`` chains work) and reports every completed
    response back."""

    def cached_response(self, response_id: str) -> Any | None:
        """The cached record (a :class:`Record`) of ``response_id``, or None."""

    def cache_response(self, record: Any) -> None:
        """``record`` completed: keep it as its lane's most recent response."""


Item = dict[str, Any]
# ResponseError.code is a closed Literal in the SDK: anything else is reported as server_error
FAILED_CODES = frozenset((
    "server_error", "rate_limit_exceeded", "invalid_prompt", "data_residency_mismatch",
    "bio_policy", "misalignment_policy_violation", "vector_store_timeout", "invalid_image",
    "invalid_image_format", "invalid_base64_image", "invalid_image_url", "image_too_large",
    "image_too_small", "image_parse_error", "image_content_policy_violation",
    "invalid_image_mode", "image_file_too_large", "unsupported_image_media_type",
    "empty_image_file", "failed_to_download_image", "image_file_not_found"))
ACTIVE = ("queued", "in_progress")

# -- size estimates (the byte budgets of the store, chains and conversations) -----------------
# Measured with tracemalloc (tests/test_hostile_bytes.py keeps them honest): a normalized input
# item costs ~500 bytes beyond its JSON (new dicts, ids, status); an output token ~20-60 bytes
# (its piece, its gap, the final text); a logprob alternative ~340 bytes (dicts and byte lists).
ITEM_OVERHEAD = 512
TOKEN_BYTES = 64
LOGPROB_BYTES = 400
RECORD_BYTES = 4096  # the record, the Response object around the output, usage, the plan
CONVERSATION_BYTES = 16384  # a conversation and its metadata (at most 16 short pairs)


def record_bytes(rec: Record, body: bytes, held: int | None = None) -> int:
    """An honest estimate of what ``rec`` holds, without serializing anything: its input and
    request echo (``held``: :func:`input_bytes` of ``body``, when not given), and its decided
    output's memory (plan and rendered items) from its numbers."""
    n = RECORD_BYTES + (input_bytes(rec, body) if held is None else held)
    for it in rec.out.items:
        if type(it) is MessageOut:
            n += TOKEN_BYTES * len(it.pieces)
            lps = it.logprobs
            if lps:
                n += LOGPROB_BYTES * len(lps) * (1 + len(lps[0].get("top_logprobs") or ()))
        elif type(it) is CallOut:
            n += TOKEN_BYTES * len(it.pieces) + 2 * len(it.arguments)
        elif type(it) is ReasoningOut:
            n += TOKEN_BYTES * sum(map(len, it.parts)) + len(it.encrypted or "")
        elif type(it) is HostedOut:  # its JSON twice (added, done) and the events between
            n += 3 * len(orjson.dumps(it.done)) + ITEM_OVERHEAD * (2 + len(it.steps))
    return n


def input_bytes(rec: Record, body: bytes) -> int:
    """What ``rec``'s input items and request echo hold, a function of the request ``body``:
    measured (:func:`approx_bytes`) when the body is a few objects holding long strings
    (walking them costs microseconds, where counting a 4 MB body costs milliseconds), or else
    bounded from ``body`` (:func:`json_bytes`, ~0.3 ms a MB, plus each item's normalization
    overhead)."""
    items = len(rec.input_items)
    held = None
    if len(body) > 4096 * (items + 4):
        held = approx_bytes((rec.input_items, rec.echo))  # None: too many objects after all
    if held is None:
        held = json_bytes(body) + ITEM_OVERHEAD * items
    return held


def item_bytes(item: Item) -> int:
    """One conversation item's memory: measured (a normal item is a dozen objects, ~2 us), or
    bounded from its JSON when it holds too many objects to walk."""
    held = approx_bytes(item)
    return held if held is not None else json_bytes(orjson.dumps(item))


class Record:
    """One response's state (stored, WebSocket-cached, or only live while streaming)."""

    __slots__ = ("id", "echo", "out", "input_items", "parent", "depth", "status", "background",
                 "stream", "pump", "cancel_seq", "failed_event", "done",
                 "_final", "conversation", "ws_context", "app", "warmup", "_finished", "shared",
                 "nbytes", "refs", "claimed", "echo_json")

    def __init__(self, app: Services, echo: dict[str, Any], out: RespOut, input_items: list[Item],
                 parent: Record | Snapshot | None, *, background: bool = False,
                 conversation: Conversation | None = None,
                 ws_context: PreviousResponses | None = None,
                 warmup: bool = False) -> None:
        self.app = app
        self.warmup = warmup  # WebSocket generate: false
        self.id = out.id
        self.echo = echo
        self.echo_json: bytes | None = None  # render.echo_json(echo), when the creator has it
        self.out = out
        self.input_items = input_items
        self.parent = parent
        self.depth: int = parent.depth + 1 if parent is not None else 0
        self.status = "queued" if background else "in_progress"
        self.background = background
        self.stream: EventStream | None = None  # the live stream (its schedule anchors replays)
        self.pump: Pump | None = None  # background only
        self.cancel_seq: int | None = None
        self.failed_event: dict[str, Any] | None = None
        # the numbers the live stream gave events outside its plan (a record replayed from
        # a Snapshot has no live stream: they come with it)
        self.claimed: tuple[int, ...] = ()
        self.done = 0  # output items done (the live stream's output_item.done events)
        # the terminal Response object: None while running, and when it is the plan's own
        # (``final_snapshot``: rendered when read, see :attr:`final`)
        self._final: dict[str, Any] | None = None
        self.conversation = conversation
        self.ws_context = ws_context
        self._finished = False
        self.shared: Publisher | None = None  # set when published to other workers
        self.nbytes = 0  # estimated size (record_bytes), set by the creator
        self.refs = 0  # holds on it: the store's, and each reachable child's (ResponsesState)

    # -- views --------------------------------------------------------------------------------
    @property
    def terminal(self) -> bool:
        return self._finished

    @property
    def final(self) -> dict[str, Any] | None:
        """The terminal Response object (None while the response runs)."""
        if self._final is None and self._finished:  # the plan's terminal event's
            self._final = render.final_snapshot(self.echo, self.out)
        return self._final

    def response(self) -> dict[str, Any]:
        """The current Response object (what GET returns)."""
        final = self.final
        if final is not None:
            return final
        return render.snapshot(self.echo, self.out, self.status, self.done_output())

    def done_output(self) -> list[Item]:
        """The output items done so far."""
        return [render.item_json(i) for i in self.out.items[:self.done]]

    def output_items(self) -> list[Item]:
        final = self.final
        return list(final["output"]) if final is not None else self.done_output()

    def turns(self, max_depth: int) -> list[list[Item]]:
        """Input and output items of each turn of the chain up to and including this response
        (oldest first). Chains longer than ``max_depth`` turns or holding more than
        ``responses.chain_max_bytes`` forget their oldest turns for good."""
        chain: list[Record] = []
        base: list[list[Item]] = []
        max_bytes = _budget(self.app).chain_max_bytes
        held = 0
        r: Record | Snapshot | None = self
        while r is not None:
            if type(r) is Snapshot:  # a parent created on another worker
                base = r.turns(max_depth - len(chain))
                break
            assert type(r) is Record
            if chain and r.shared is not None:
                # --workers > 1: a published parent; read the rest of the chain from the
                # shared store as every other worker does (same context on every worker)
                base = r.shared.turns(r.id, max_depth - len(chain))
                break
            chain.append(r)
            held += r.nbytes
            p = r.parent
            if p is not None and (len(chain) >= max_depth or (
                    max_bytes and type(p) is Record and held + p.nbytes > max_bytes)):
                _budget(self.app).unlink(r)  # bound the memory a long chain keeps alive
                break
            r = p
        for r in reversed(chain):
            base.append(r.input_items + r.output_items())
        return base

    def context(self, max_depth: int) -> list[Item]:
        """The items of :meth:`turns`, flattened (what ``previous_response_id`` chains)."""
        items: list[Item] = []
        for turn in self.turns(max_depth):
            items.extend(turn)
        return items

    # -- the live stream reports here ---------------------------------------------------------
    # the event types :meth:`observe` acts on (the live stream calls it for these only: not
    # once per token)
    OBSERVED = frozenset(("response.output_item.done", "response.in_progress",
                          "response.completed", "response.incomplete", "response.failed"))
    # (a foreground response is in_progress from the start: its in_progress changes nothing)
    OBSERVED_FOREGROUND = OBSERVED - {"response.in_progress"}

    @property
    def emitted(self) -> int:
        """Events the live stream has numbered (pulled for sending) so far."""
        return self.stream.seq if self.stream is not None else 0

    def observe(self, etype: str, data: Any) -> None:
        """The live stream's events of the :data:`OBSERVED` types, as they are sent
        (updates status/output/terminal; the plan's events are rendered, ``bytes``: what
        they tell is :attr:`out`'s)."""
        if etype == "response.output_item.done":
            self.done += 1
        elif etype == "response.in_progress":
            if self.status == "queued":
                self.status = "in_progress"
                if self.shared is not None:  # other workers answer in_progress too
                    self.shared.publish(self)
        elif etype in ("response.completed", "response.incomplete"):
            self.finish(data["response"] if type(data) is dict else None)
        elif etype == "response.failed" and self.failed_event is None and type(data) is dict:
            self.failed_event = data
            self.finish(data["response"])

    def finish(self, response: dict[str, Any] | None) -> None:
        """The response reached a terminal state: record it (None: the plan's terminal
        Response, :func:`render.final_snapshot`), update state (its billed tokens are
        counted where it is delivered, :mod:`llmsim.state.accounting`)."""
        if self._finished:
            return
        self._finished = True
        self._final = response
        self.status = response["status"] if response is not None else self.out.status
        # let go of the conversation: a stored record must not keep a deleted or evicted
        # conversation (up to conversation_max_bytes) alive outside its store's budget
        conv, self.conversation = self.conversation, None
        if conv is not None and self.status != "cancelled":
            try:
                conv.extend(self.input_items + self.output_items())
            except APIError:  # --state redis and Redis went down since the request read
                pass  # the conversation: this turn is not added (the response still ends)
        ctx, self.ws_context = self.ws_context, None  # (a stored record keeps no cache)
        if ctx is not None and self.status in ("completed", "incomplete"):
            ctx.cache_response(self)
        if self.shared is not None:
            self.shared.publish(self)

    def failed(self, err: APIError) -> list[tuple[str, Any]]:
        """A mid-stream failure as the Responses API reports it: a terminal
        ``response.failed`` event with the full Response object (status failed, error)."""
        code = err.code if err.code in FAILED_CODES else (
            "rate_limit_exceeded" if err.status == 429 else "server_error")
        resp = render.snapshot(self.echo, self.out, "failed", self.done_output(),
                               error={"code": code, "message": err.message})
        data = {"type": "response.failed", "response": resp}
        self.failed_event = data
        self.finish(resp)
        return [("response.failed", data)]

    def cancel(self) -> None:
        """Stop a running response now (status cancelled, output so far)."""
        if self.terminal:
            return
        self.cancel_seq = self.emitted
        self.finish(render.snapshot(self.echo, self.out, "cancelled", self.done_output()))
        pump, self.pump = self.pump, None
        if pump is not None:
            pump.cancel()

    def live_plan(self, background: bool = False) -> Iterator[tuple[float, str, Any]]:
        """The plan of the live stream (its stream calls :meth:`live_ended` when it ends)."""
        return render.plan(self.echo, self.out, background=background, warmup=self.warmup,
                           rendered=self.echo_json)

    def live_ended(self) -> None:
        """The live stream's plan ended (run out, or closed): one that ended early marks
        the response cancelled (client gone: the real API stops generating a non-background
        response)."""
        if not self._finished and not self.background:
            self.cancel()

    def follow_plan(self, now: float) -> Iterator[tuple[float, str, Any]]:
        """The live stream's plan rendered again on its schedule: the events it has sent
        at once, the rest when it sends them (a stream of it numbers them and hands over
        those the follower asked for: :meth:`follow`)."""
        live = self.stream
        origin = live.start if live is not None and live.start is not None else now
        # background streams were shifted by backpressure never (NullSink never pauses)
        cum = 0.0
        sent = 0.0
        for off, etype, data in expand_runs(render.plan(  # (each token on its own time)
                self.echo, self.out, background=self.background, warmup=self.warmup,
                rendered=self.echo_json)):
            cum += off
            target = 0.0 if self.terminal else max(0.0, origin + cum - now)
            d = max(0.0, target - sent)
            sent += d
            yield d, etype, data

    def follow(self, stream: EventStream, after: int) -> None:
        """Make ``stream`` (of :meth:`follow_plan`) replay the events numbered after
        ``after``, numbered as the live stream numbers them (:meth:`EventStream.replay`);
        it stops where a cancel or failure ended the live stream, even one still to come."""
        live = self.stream
        claimed: Sequence[int] = self.claimed
        if live is not None:
            if live.claimed is None and not live.finished:
                live.claimed = []  # (the live stream's claims to come, read as they come)
            claimed = live.claimed or ()
        stream.replay(after, claimed, self._ended)

    def _ended(self) -> tuple[int, tuple[float, str, Any] | None] | None:
        """Where the live stream ended early, for a replay: before the number a cancel
        stopped it at, or at its ``response.failed`` (the event then)."""
        end, last = self.cancel_seq, None
        fe = self.failed_event
        if fe is not None:
            at = fe.get("sequence_number", self.emitted)  # (not yet numbered: the next)
            if end is None or at < end:
                end = at
                last = (0.0, "response.failed", {"type": "response.failed",
                                                  "response": fe["response"]})
        return (end, last) if end is not None else None


class Snapshot:
    """A stored response as every worker sees it (``--workers > 1``): plain data, pickled.

    ``response`` is the Response object at the last publication (created, started, terminal),
    ``input_items`` this turn's input, ``parent_id`` the previous response in the shared store
    (its chain is followed from there, see :meth:`turns`), ``local_turns`` the turns of
    previous responses that are not in the shared store (WebSocket ``store=false`` turns
    cached by the connection; oldest first), ``echo``/``out``/``cancel_seq``/``failed_event``
    and ``claimed`` (the numbers the live stream gave events outside its plan) what a
    terminal replay (``GET ?stream=true``) re-renders from, ``owner`` the pid of the
    worker running it while it is unfinished, ``deleted`` a hidden chain link.
    ``source`` (not pickled) is the :class:`SharedResponses` it was read from.
    """

    __slots__ = ("id", "response", "input_items", "parent_id", "local_turns", "depth",
                 "background", "warmup", "echo", "out", "cancel_seq", "failed_event", "claimed",
                 "owner", "deleted", "source")

    def __init__(self, rec: Record, owner: int | str, max_depth: int) -> None:
        self.id = rec.id
        self.response = rec.response()
        self.input_items = rec.input_items
        self.local_turns: list[list[Item]] = []
        p = rec.parent
        while type(p) is Record and p.shared is None:
            if len(self.local_turns) >= max_depth - 1:
                p = None  # the chain is longer than the context keeps
                break
            self.local_turns.append(p.input_items + p.output_items())
            p = p.parent
        self.local_turns.reverse()
        self.parent_id = p.id if p is not None else None
        self.depth = rec.depth
        self.background = rec.background
        self.warmup = rec.warmup
        self.echo = rec.echo
        self.out = rec.out
        self.cancel_seq = rec.cancel_seq
        self.failed_event = rec.failed_event
        live = rec.stream
        self.claimed = tuple(live.claimed or ()) if live is not None else rec.claimed
        self.owner: int | str | None = None if rec.terminal else owner
        self.deleted = False
        self.source: Any = None  # (store.SharedResponses)

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if k != "source"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.claimed = ()  # (a snapshot pickled before it had them)
        for k, v in state.items():
            setattr(self, k, v)
        self.source = None

    @property
    def status(self) -> str:
        return str(self.response["status"])

    @property
    def terminal(self) -> bool:
        return self.status not in ACTIVE

    def output_items(self) -> list[Item]:
        return list(self.response["output"])

    def turns(self, max_depth: int) -> list[list[Item]]:
        """The chain's turns up to and including this one, oldest first, at most
        ``max_depth``: earlier turns are read by following ``parent_id`` through the shared
        store (a turn evicted from it ends the chain there)."""
        out: list[list[Item]] = []
        s: Snapshot | None = self
        while s is not None and len(out) < max_depth:
            out.append(s.input_items + s.output_items())
            for turn in reversed(s.local_turns):
                if len(out) >= max_depth:
                    break
                out.append(turn)
            src = s.source
            s = src.link(s.parent_id) if src is not None and s.parent_id is not None else None
        out.reverse()
        return out

    def context(self, max_depth: int) -> list[Item]:
        """The chained items (as :meth:`Record.context`)."""
        items: list[Item] = []
        for turn in self.turns(max_depth):
            items.extend(turn)
        return items

    def replay(self, app: Services) -> Record:
        """A detached, terminal :class:`Record` that re-renders this response's events (the
        replay of ``GET ?stream=true`` on a worker that did not run it)."""
        rec = Record(app, self.echo, self.out, self.input_items, None,
                     background=self.background, warmup=self.warmup)
        rec._finished = True
        rec._final = self.response
        rec.status = self.status
        rec.cancel_seq = self.cancel_seq
        rec.failed_event = self.failed_event
        rec.claimed = self.claimed
        return rec

    def orphaned(self) -> Snapshot:
        """This unfinished response as ``failed``, because the worker running it died: the
        real API's failed background response (``error.code`` server_error, the output known
        so far). A replay shows the events up to its last published status, then
        ``response.failed``."""
        if self.terminal:
            return self
        err = E.response_orphaned.at()
        resp = render.snapshot(self.echo, self.out, "failed", self.output_items(),
                               error={"code": err.code, "message": err.message})
        # failed follows the events its last published status was told by: created
        # (+ queued if background) (+ in_progress if it had started); its number is claimed
        # from a stream of the plan read that far (the one numbering owner)
        last = ("response.in_progress" if self.status == "in_progress"
                else "response.queued" if self.background else "response.created")
        told = EventStream(render.plan(self.echo, self.out, background=self.background,
                                       warmup=self.warmup), render.RESPONSES)
        while (ev := told.pull()) is not None and ev[1] != last:
            pass
        seq = told.claim()
        told.close()
        self.failed_event = {"type": "response.failed", "sequence_number": seq,
                             "response": resp}
        self.response = resp
        self.owner = None
        return self


class _Resizable(Protocol):
    def resize(self, key: str, nbytes: int) -> None: ...


class Conversation:
    """An in-memory conversation transcript, bounded to ``max_items`` and ``max_bytes`` of
    items (oldest dropped first; an item bigger than ``max_bytes`` alone is not kept: client
    items are refused before, see :meth:`ResponsesState.conversation_item_sizes`). Its size
    is re-accounted in ``store`` (the conversations store) whenever it changes."""

    __slots__ = ("id", "created_at", "metadata", "items", "sizes", "nbytes", "max_items",
                 "max_bytes", "store")

    def __init__(self, cid: str, created_at: int, metadata: dict[str, str],
                 max_items: int, max_bytes: int = 0,
                 store: _Resizable | None = None) -> None:
        self.id = cid
        self.created_at = created_at
        self.metadata = metadata
        self.items: deque[Item] = deque()
        self.sizes: deque[int] = deque()  # item_bytes of each item, in the same order
        self.nbytes = CONVERSATION_BYTES  # what the conversations store accounts for it
        self.max_items = max(1, max_items)
        self.max_bytes = max_bytes
        self.store = store

    def extend(self, items: list[Item], sizes: list[int] | None = None) -> None:
        items = items[-self.max_items:]  # the rest would be dropped at once: never sized
        if sizes is None:
            sizes = [item_bytes(it) for it in items]
        else:
            sizes = sizes[-self.max_items:]
        self.items.extend(items)
        self.sizes.extend(sizes)
        self.nbytes += sum(sizes)
        cap = self.max_bytes + CONVERSATION_BYTES if self.max_bytes else 0
        while self.items and (len(self.items) > self.max_items or (cap and self.nbytes > cap)):
            self.items.popleft()
            self.nbytes -= self.sizes.popleft()
        self.save()

    def save(self) -> None:
        """Tell the store the conversation changed (re-accounted; written back to Redis)."""
        if self.store is not None:
            self.store.resize(self.id, self.nbytes)

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at,
                "metadata": self.metadata}
