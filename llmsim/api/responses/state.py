"""Stored responses and conversations (bounded), and the per-response lifecycle record.

A :class:`Record` is one response: its request echo, its decided output (:class:`RespOut`),
its input items, its parent in a ``previous_response_id`` chain, and how far its live stream
has got. The live stream (foreground SSE, WebSocket, or a background pump) reports every
event to :meth:`Record.observe`; everything else (GET, cancel, resume-by-replay) reads the
record. Replays re-render the plan (see :mod:`.render`) and pace the events that are still in
the future on the live stream's schedule, so a resumed stream sees the same events with the
same sequence numbers at the same moments as the original.

With ``--workers > 1`` (``App.state_dir`` set) a stored record is also
published as a :class:`Snapshot` (plain, picklable data) in a :class:`SharedResponses` store
every worker reads: when it is created, when it starts (background), when it reaches a
terminal state, and when it is deleted (a tombstone). The worker that created a response stays
its owner (it runs it and keeps the live record); other workers answer from the snapshot when
their own store misses. A snapshot holds only its own turn (input and output items) and the id
of its previous response: a ``previous_response_id`` chain is read by following those ids
through the shared store (at most ``max_chain_depth`` of them), never copied into each
snapshot, so a chain costs its items once. Every worker, the owner included, reads the
published part of a chain from the shared store, so a turn evicted there is forgotten by all
alike; a deleted response stays there as a hidden link of its descendants' chains (as a
deleted record does in memory). When a worker dies, the supervisor marks the unfinished
responses it owned ``failed`` (:meth:`SharedResponses.fail_owner`), so every worker answers
the same for them. With one process none of this exists (``ResponsesState.shared is None``).

With ``--state redis://...`` the same two shared tables live in Redis
(:class:`~llmsim.state.redis_store.RedisStore`), shared by replicas on any machine, and so do
conversations (:class:`RedisConversations`). A snapshot's owner is then the replica's name
(:attr:`SharedState.replica`); a replica finds a dead owner by its expired liveness key when it
reads an unfinished snapshot, and marks it failed there (there is no supervisor). A
publication that fails while Redis is down is retried after each heartbeat.
"""

from __future__ import annotations

import os
import pickle
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from ...errors import APIError, E
from ...messages import Key
from ...state import shared
from ...state.redis_store import RedisStore
from ...state.store import BoundedStore, approx_bytes, json_bytes
from ...streaming.stream import EventStream, expand_runs, numbered
from . import render
from .render import CallOut, HostedOut, MessageOut, ReasoningOut, RespOut

if TYPE_CHECKING:
    from ...app import App
    from ...config import ResponsesConfig
    from ...state.redisconn import SharedState
    from ...streaming.flow import Pump

__all__ = ["Record", "Snapshot", "SharedResponses", "Conversation", "ResponsesState", "state",
           "FAILED_CODES", "fail_orphans", "record_bytes", "item_bytes", "ItemIndex",
           "RedisConversations", "value_limit", "PreviousResponses", "ConnectionCache",
           "LaneCache"]

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


def _output_bytes(out: RespOut) -> int:
    """The decided output's memory (plan and rendered items), from its numbers."""
    n = 0
    for it in out.items:
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


def record_bytes(rec: Record, body: bytes) -> int:
    """An honest estimate of what ``rec`` holds, without serializing anything: its output from
    token counts, and its input and request echo either measured (:func:`approx_bytes`) when
    the body is a few objects holding long strings (walking them costs microseconds, where
    counting a 4 MB body costs milliseconds), or else bounded from the request ``body``
    (:func:`json_bytes`, ~0.3 ms a MB, plus each item's normalization overhead)."""
    items = len(rec.input_items)
    held = None
    if len(body) > 4096 * (items + 4):
        held = approx_bytes((rec.input_items, rec.echo))  # None: too many objects after all
    if held is None:
        held = json_bytes(body) + ITEM_OVERHEAD * items
    return RECORD_BYTES + held + _output_bytes(rec.out)


def item_bytes(item: Item) -> int:
    """One conversation item's memory: measured (a normal item is a dozen objects, ~2 us), or
    bounded from its JSON when it holds too many objects to walk."""
    held = approx_bytes(item)
    return held if held is not None else json_bytes(orjson.dumps(item))


class Record:
    """One response's state (stored, WebSocket-cached, or only live while streaming)."""

    __slots__ = ("id", "echo", "out", "input_items", "parent", "depth", "status", "background",
                 "stream", "pump", "cancel_seq", "failed_event", "done_output",
                 "final", "conversation", "ws_context", "app", "warmup", "_finished", "shared",
                 "nbytes", "refs")

    def __init__(self, app: App, echo: dict[str, Any], out: RespOut, input_items: list[Item],
                 parent: Record | Snapshot | None, *, background: bool = False,
                 conversation: Conversation | None = None,
                 ws_context: PreviousResponses | None = None,
                 warmup: bool = False) -> None:
        self.app = app
        self.warmup = warmup  # WebSocket generate: false
        self.id = out.id
        self.echo = echo
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
        self.done_output: list[Item] = []
        self.final: dict[str, Any] | None = None
        self.conversation = conversation
        self.ws_context = ws_context
        self._finished = False
        self.shared: SharedResponses | None = None  # set when published to other workers
        self.nbytes = 0  # estimated size (record_bytes), set by the creator
        self.refs = 0  # holds on it: the store's, and each reachable child's (ResponsesState)

    # -- views --------------------------------------------------------------------------------
    @property
    def terminal(self) -> bool:
        return self.final is not None

    def response(self) -> dict[str, Any]:
        """The current Response object (what GET returns)."""
        if self.final is not None:
            return self.final
        return render.snapshot(self.echo, self.out, self.status, list(self.done_output))

    def output_items(self) -> list[Item]:
        return list(self.final["output"]) if self.final is not None else list(self.done_output)

    def turns(self, max_depth: int) -> list[list[Item]]:
        """Input and output items of each turn of the chain up to and including this response
        (oldest first). Chains longer than ``max_depth`` turns or holding more than
        ``responses.chain_max_bytes`` forget their oldest turns for good."""
        chain: list[Record] = []
        base: list[list[Item]] = []
        max_bytes = state(self.app).chain_max_bytes
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
                state(self.app).unlink(r)  # bound the memory a long chain keeps alive
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

    @property
    def emitted(self) -> int:
        """Events the live stream has numbered (pulled for sending) so far."""
        return self.stream.seq if self.stream is not None else 0

    def observe(self, etype: str, data: Any) -> None:
        """The live stream's events of the :data:`OBSERVED` types, as they are sent
        (updates status/output/terminal)."""
        if type(data) is not dict:
            return
        if etype == "response.output_item.done":
            self.done_output.append(data["item"])
        elif etype == "response.in_progress":
            if self.status == "queued":
                self.status = "in_progress"
                if self.shared is not None:  # other workers answer in_progress too
                    self.shared.publish(self)
        elif etype in ("response.completed", "response.incomplete"):
            self.finish(data["response"])
        elif etype == "response.failed" and self.failed_event is None:
            self.failed_event = data
            self.finish(data["response"])

    def finish(self, response: dict[str, Any]) -> None:
        """The response reached a terminal state: record it, update state (its billed tokens
        are counted where it is delivered, :mod:`llmsim.state.accounting`)."""
        if self._finished:
            return
        self._finished = True
        self.final = response
        self.status = response["status"]
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
        resp = render.snapshot(self.echo, self.out, "failed", list(self.done_output),
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
        self.finish(render.snapshot(self.echo, self.out, "cancelled", list(self.done_output)))
        pump, self.pump = self.pump, None
        if pump is not None:
            pump.cancel()

    def live_plan(self, background: bool = False) -> Iterator[tuple[float, str, Any]]:
        """The plan of the live stream (its stream calls :meth:`live_ended` when it ends)."""
        return render.plan(self.echo, self.out, background=background, warmup=self.warmup)

    def live_ended(self) -> None:
        """The live stream's plan ended (run out, or closed): one that ended early marks
        the response cancelled (client gone: the real API stops generating a non-background
        response)."""
        if not self.terminal and not self.background:
            self.cancel()

    def follow_plan(self, after: int, now: float) -> Iterator[tuple[float, str, Any]]:
        """Replay events with ``sequence_number > after``: those already sent at once, the
        rest on the live stream's schedule; stops where a cancel or failure ended it. The
        plan is rendered again; ``k`` follows the live stream's numbering by the stream's own
        rule (:func:`llmsim.streaming.stream.numbered`) and the replay stream continues it from
        ``after + 1`` (``EventStream(first_seq=…)``)."""
        live = self.stream
        origin = live.start if live is not None and live.start is not None else now
        # background streams were shifted by backpressure never (NullSink never pauses)
        cum = 0.0
        sent = 0.0
        k = 0
        for off, etype, data in expand_runs(render.plan(
                self.echo, self.out, background=self.background, warmup=self.warmup)):
            cum += off
            if self.cancel_seq is not None and k >= self.cancel_seq:
                return
            fe = self.failed_event
            if fe is not None and k >= fe.get("sequence_number", k):
                if k > after:
                    yield 0.0, "response.failed", {"type": "response.failed",
                                                   "response": fe["response"]}
                return
            if k > after:
                target = 0.0 if self.terminal else max(0.0, origin + cum - now)
                d = max(0.0, target - sent)
                sent += d
                yield d, etype, data
            if numbered(etype, data):  # k: the number the live stream gave this event
                k += 1


class Snapshot:
    """A stored response as every worker sees it (``--workers > 1``): plain data, pickled.

    ``response`` is the Response object at the last publication (created, started, terminal),
    ``input_items`` this turn's input, ``parent_id`` the previous response in the shared store
    (its chain is followed from there, see :meth:`turns`), ``local_turns`` the turns of
    previous responses that are not in the shared store (WebSocket ``store=false`` turns
    cached by the connection; oldest first), ``echo``/``out``/``cancel_seq``/``failed_event``
    what a terminal replay (``GET ?stream=true``) re-renders from, ``owner`` the pid of the
    worker running it while it is unfinished, ``deleted`` a hidden chain link.
    ``source`` (not pickled) is the :class:`SharedResponses` it was read from.
    """

    __slots__ = ("id", "response", "input_items", "parent_id", "local_turns", "depth",
                 "background", "warmup", "echo", "out", "cancel_seq", "failed_event", "owner",
                 "deleted", "source")

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
        self.owner: int | str | None = None if rec.terminal else owner
        self.deleted = False
        self.source: SharedResponses | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__slots__ if k != "source"}

    def __setstate__(self, state: dict[str, Any]) -> None:
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

    def replay(self, app: App) -> Record:
        """A detached, terminal :class:`Record` that re-renders this response's events (the
        replay of ``GET ?stream=true`` on a worker that did not run it)."""
        rec = Record(app, self.echo, self.out, self.input_items, None,
                     background=self.background, warmup=self.warmup)
        rec._finished = True
        rec.final = self.response
        rec.status = self.status
        rec.cancel_seq = self.cancel_seq
        rec.failed_event = self.failed_event
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
        # created (+ queued if background) (+ in_progress if it had started), then failed
        seq = 1 + int(self.background) + int(self.status == "in_progress")
        self.failed_event = {"type": "response.failed", "sequence_number": seq,
                             "response": resp}
        self.response = resp
        self.owner = None
        return self


DELETED = "deleted"
CANCEL = "cancel"


class SharedResponses:
    """Stored responses published to every worker (see the module doc).

    Two shared tables with the local store's bounds: ``snapshots`` (id → :class:`Snapshot`,
    also bounded to ``max_bytes``) and ``control`` (id → ``"deleted"`` tombstone or
    ``"cancel"`` request for the owner). Ordering makes deletes race-free without locks: a
    delete writes its tombstone *before* hiding the snapshot, and a publication checks for a
    tombstone *after* writing. ``owner`` is this worker's pid (what the supervisor knows).
    """

    def __init__(self, max_entries: int, ttl: float, max_depth: int, max_bytes: int = 0, *,
                 state_dir: str | None = None, redis: SharedState | None = None,
                 max_value: int = 0) -> None:
        now = time.time
        self.max_depth = max_depth
        self.redis = redis
        self.owner: int | str = os.getpid()
        # publications that failed while Redis was down (retried after each heartbeat)
        self.pending: dict[str, Record] = {}
        self.max_pending = max(1, max_entries)
        if redis is not None:
            self.owner = redis.replica
            self.snapshots: Any = RedisStore(redis, "responses", max_entries, ttl,
                                             max_bytes=max_bytes, max_value=max_value)
            self.control: Any = RedisStore(redis, "responses_ctl", max_entries, ttl)
            redis.on_heartbeat.append(self.retry_pending)
            return
        self.snapshots = shared.open_store("responses", max_entries, ttl, now,
                                           max_bytes=max_bytes, state_dir=state_dir)
        self.control = shared.open_store("responses_ctl", max_entries, ttl, now,
                                         state_dir=state_dir)

    def check(self) -> None:
        """Redis mode: raise the 503 now if Redis cannot be reached (a create that would be
        stored asks before it starts, instead of losing its publications)."""
        if self.redis is not None:
            self.redis.call(lambda r: r.ping())

    def publish(self, rec: Record) -> bool:
        """Write ``rec``'s snapshot; False (and hidden) when it was deleted meanwhile. With
        Redis down the publication is kept for :meth:`retry_pending` (the live record still
        answers on this replica; the others see the last state published)."""
        if self.redis is None:
            return self._publish(rec)
        try:
            return self._publish(rec)
        except APIError as e:
            if e.status != 503:
                raise
            self.pending.pop(rec.id, None)
            self.pending[rec.id] = rec
            while len(self.pending) > self.max_pending:  # oldest first
                del self.pending[next(iter(self.pending))]
            return True

    def retry_pending(self) -> None:
        """Publish again what failed while Redis was down (oldest first; stops at the first
        failure, raising its 503)."""
        while self.pending:
            rid, rec = next(iter(self.pending.items()))
            self._publish(rec)
            self.pending.pop(rid, None)

    def _publish(self, rec: Record) -> bool:
        snap = Snapshot(rec, self.owner, self.max_depth)
        if self.redis is not None:  # the write, then the tombstone check: one round trip
            cmd = self.snapshots.put_then_get(rec.id, snap, self.control, rec.id)
        else:
            self.snapshots.put(rec.id, snap, snap.owner)
            cmd = self.control.get(rec.id)
        if cmd == DELETED:
            self._hide(snap)
            return False
        return True

    def _hide(self, snap: Snapshot) -> None:
        snap.deleted = True
        snap.owner = None
        self.snapshots.update(snap.id, snap)

    def link(self, rid: str, snap: Snapshot | None | bool = True) -> Snapshot | None:
        """The snapshot of ``rid`` as a link of a chain (a deleted one too); ``snap``: the
        value already read (None: not stored), else it is read here."""
        if snap is True:
            snap = self.snapshots.get(rid)
        if not isinstance(snap, Snapshot):
            return None
        snap.source = self
        red = self.redis
        if red is not None and snap.owner is not None and not snap.terminal and \
                not red.alive(str(snap.owner)):
            # the replica running it is gone (no heartbeat for OWNER_TTL_S): nobody will
            # finish it, so it is failed for everyone (as the supervisor does for workers)
            snap.orphaned()
            self.snapshots.update(rid, snap)
        return snap

    def turns(self, rid: str, max_depth: int) -> list[list[Item]]:
        """The turns of ``rid``'s chain (:meth:`Snapshot.turns`); none if it is not stored."""
        snap = self.link(rid)
        return snap.turns(max_depth) if snap is not None else []

    def get(self, rid: str) -> Snapshot | None:
        """The published snapshot of ``rid`` (None if unknown or deleted)."""
        if self.redis is not None:  # the snapshot and its control entry in one round trip
            got, cmd = self.snapshots.get_with(rid, self.control, rid)
            snap = self.link(rid, got)
        else:
            snap = self.link(rid)
            cmd = None if snap is None or snap.deleted else self.control.get(rid)
        if snap is None or snap.deleted or cmd == DELETED:
            return None
        return snap

    def _command_and_has(self, rid: str) -> tuple[str | None, bool]:
        """``rid``'s control entry and whether its snapshot is stored (Redis: one round
        trip)."""
        if self.redis is not None:
            return self.control.get_and_has(rid, self.snapshots, rid)
        return self.control.get(rid), self.snapshots.has(rid)

    def gone(self, rid: str) -> bool:
        """``rid`` (published by this worker) was deleted or evicted from the shared store:
        no worker can answer for it any more, so its owner must not either."""
        cmd, has = self._command_and_has(rid)
        return cmd == DELETED or not has

    def deleted(self, rid: str) -> bool:
        return bool(self.control.get(rid) == DELETED)

    def command(self, rid: str) -> str | None:
        """The pending control entry of ``rid`` (``"deleted"``, ``"cancel"`` or None); an
        entry evicted from the shared store reads as ``"deleted"``."""
        cmd, has = self._command_and_has(rid)
        if cmd is None and not has:
            return DELETED
        return cmd

    def delete(self, rid: str, known: bool) -> bool:
        """Tombstone ``rid`` everywhere (``known``: this worker has it); True if it was
        published. Unknown ids leave no tombstone (they must not push real ones out). The
        snapshot stays as a hidden link of the chains that continue it."""
        snap = self.snapshots.get(rid)
        if not known and (snap is None or snap.deleted):
            return False
        self.control.put(rid, DELETED)
        if snap is None or snap.deleted:
            return False
        self._hide(snap)
        return True

    def request_cancel(self, rid: str) -> None:
        if self.control.get(rid) != DELETED:
            self.control.put(rid, CANCEL)

    def fail_owner(self, owner: int | str) -> int:
        """The worker ``owner`` died (supervisor): mark its unfinished responses ``failed``
        (:meth:`Snapshot.orphaned`); returns how many."""
        return int(self.snapshots.update_owned(owner, Snapshot.orphaned))

    def close(self) -> None:
        self.snapshots.close()
        self.control.close()


def fail_orphans(cfg: ResponsesConfig, state_dir: str, owner: int) -> int:
    """``--workers`` supervisor: the worker ``owner`` (a pid) died; mark the unfinished
    responses it owned failed in the shared store (0 when storage is disabled)."""
    if cfg.store_max_entries <= 0:
        return 0
    sh = SharedResponses(cfg.store_max_entries, cfg.store_ttl_s, cfg.max_chain_depth,
                         cfg.shared_store_max_bytes, state_dir=state_dir)
    try:
        return sh.fail_owner(owner)
    finally:
        sh.close()


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


class _SavedIn:
    """The store of a conversation read from Redis: a change writes it back in place."""

    __slots__ = ("store", "conv")

    def __init__(self, store: RedisStore[Conversation], conv: Conversation) -> None:
        self.store = store
        self.conv = conv

    def resize(self, key: str, nbytes: int) -> None:
        self.store.update(key, self.conv)


class RedisConversations:
    """Conversations in Redis (``--state``), with the interface ``ResponsesState`` uses of
    its in-memory store. A conversation is read at the start of a request and written back
    whole when it changes (the last writer wins if two requests extend it at once)."""

    def __init__(self, redis: SharedState, max_entries: int, ttl: float, max_bytes: int,
                 max_value: int) -> None:
        self.store: RedisStore[Conversation] = RedisStore(
            redis, "conversations", max_entries, ttl, max_bytes=max_bytes,
            max_value=max_value, dumps=self._dumps, loads=self._loads)

    @property
    def enabled(self) -> bool:
        return self.store.enabled

    @staticmethod
    def _dumps(c: Conversation) -> bytes:
        return pickle.dumps((c.id, c.created_at, c.metadata, list(c.items), list(c.sizes),
                             c.nbytes, c.max_items, c.max_bytes), pickle.HIGHEST_PROTOCOL)

    @staticmethod
    def _loads(blob: bytes) -> Conversation:
        cid, created_at, metadata, items, sizes, nbytes, max_items, max_bytes = \
            pickle.loads(blob)
        conv = Conversation(cid, created_at, metadata, max_items, max_bytes)
        conv.items.extend(items)
        conv.sizes.extend(sizes)
        conv.nbytes = nbytes
        return conv

    def get(self, cid: str) -> Conversation | None:
        conv = self.store.get(cid)
        if conv is not None:
            conv.store = _SavedIn(self.store, conv)
        return conv

    def put(self, cid: str, conv: Conversation, *, nbytes: int = 0) -> bool:
        conv.store = _SavedIn(self.store, conv)
        return self.store.put(cid, conv)

    def pop(self, cid: str) -> Conversation | None:
        return self.store.pop(cid)

    def resize(self, key: str, nbytes: int) -> None:
        """A new conversation changed before it was first stored: :meth:`put` writes it."""


def value_limit(app: App) -> int:
    """The largest value one entry may write to Redis: a stored response holds one request's
    items (at most the body limit) and its output; twice the body limit bounds both."""
    return 2 * app.config.max_body_bytes


def _min_bound(*caps: int) -> int:
    """The tightest of several byte bounds (0 = none)."""
    return min((c for c in caps if c), default=0)


class ItemIndex:
    """Item id → where a stored response holds it, so ``item_reference`` resolves with one
    dict lookup instead of a scan of every stored response (20,000 references against 1,000
    stored responses took 11.8 s). Entries of responses that have left the store are dropped
    when met, and swept whenever the index has doubled since the last sweep (amortised O(1)
    per item; the index stays within about twice the stored items)."""

    __slots__ = ("_where", "_sweep_at")

    def __init__(self) -> None:
        self._where: dict[str, tuple[str, int]] = {}  # item id → (response id, position)
        self._sweep_at = 4096

    def __len__(self) -> int:
        return len(self._where)

    def add(self, rec: Record, output_ids: list[str], store: BoundedStore[Record]) -> None:
        """Index a stored response's input items (position i) and its output items (-1 - j,
        in ``rec.output_items()`` once it has them)."""
        where = self._where
        for i, it in enumerate(rec.input_items):
            iid = it.get("id")
            if isinstance(iid, str):
                where[iid] = (rec.id, i)
        for j, oid in enumerate(output_ids):
            where[oid] = (rec.id, -1 - j)
        if len(where) > self._sweep_at:
            self._where = where = {k: v for k, v in where.items() if v[0] in store}
            self._sweep_at = max(4096, 2 * len(where))

    def find(self, item_id: str, store: BoundedStore[Record]) -> Item | None:
        """The stored item with this id (from the newest stored response that has it)."""
        hit = self._where.get(item_id)
        if hit is None:
            return None
        rec = store.get(hit[0])
        if rec is None:
            del self._where[item_id]
            return None
        pos = hit[1]
        items = rec.input_items if pos >= 0 else rec.output_items()
        k = pos if pos >= 0 else -1 - pos
        if k < len(items) and items[k].get("id") == item_id:
            return items[k]
        return None  # an output item the response has not produced (yet, or at all)


class ResponsesState:
    """Per-app Responses state: the stored responses and conversations, background count.

    Byte accounting of stored responses: a stored record keeps its ``previous_response_id``
    chain alive (up to ``max_chain_depth`` turns and ``chain_max_bytes``) even after the older
    records were evicted, so the store's budget counts every record it keeps *reachable*,
    once: ``Record.refs`` is 1 for the store's own hold plus one per reachable child, a record
    evicted while a stored descendant still holds it moves from ``store.bytes`` to
    ``store.extra_bytes``, and it leaves the count when its last holder does.
    """

    def __init__(self, app: App) -> None:
        cfg = app.config.responses
        now = app.clock.now
        self.store: BoundedStore[Record] = BoundedStore(
            cfg.store_max_entries, cfg.store_ttl_s, now, on_evict=self._evicted,
            max_bytes=cfg.store_max_bytes, on_remove=self._removed)
        self.conversations: BoundedStore[Conversation] | RedisConversations
        redis = app.shared_state
        if redis is not None:  # --state redis://: shared by every replica
            self.conversations = RedisConversations(
                redis, cfg.conversations_max_entries, cfg.conversation_ttl_s,
                cfg.conversations_max_bytes, value_limit(app))
        else:
            self.conversations = BoundedStore(
                cfg.conversations_max_entries, cfg.conversation_ttl_s, now,
                max_bytes=cfg.conversations_max_bytes)
        # a chain or a conversation bigger than its store could never be kept whole
        self.chain_max_bytes = _min_bound(cfg.chain_max_bytes, cfg.store_max_bytes)
        self.conversation_max_bytes = _min_bound(
            cfg.conversation_max_bytes,
            cfg.conversations_max_bytes - CONVERSATION_BYTES if cfg.conversations_max_bytes
            else 0)
        if redis is not None:  # a conversation is one Redis value: within its bound
            self.conversation_max_bytes = _min_bound(self.conversation_max_bytes,
                                                     value_limit(app) // 2)
        self._max_items = cfg.conversation_max_items
        self.unstored = 0  # responses too big to store on their own (answered, not kept)
        self.active_background = 0
        self.items = ItemIndex()  # item_reference lookups
        self.shared: SharedResponses | None = None
        if redis is not None and cfg.store_max_entries > 0:
            self.shared = SharedResponses(cfg.store_max_entries, cfg.store_ttl_s,
                                          cfg.max_chain_depth, cfg.store_max_bytes,
                                          redis=redis, max_value=value_limit(app))
        elif app.state_dir is not None and cfg.store_max_entries > 0:
            self.shared = SharedResponses(cfg.store_max_entries, cfg.store_ttl_s,
                                          cfg.max_chain_depth, cfg.shared_store_max_bytes,
                                          state_dir=app.state_dir)

    @staticmethod
    def _evicted(key: str, rec: Record) -> None:
        # an evicted background response can no longer be read or cancelled: stop it
        if rec.pump is not None:
            rec.cancel()

    # -- stored responses: byte accounting (see the class doc) ---------------------------------
    @staticmethod
    def measure(rec: Record, body: bytes) -> None:
        """Set ``rec.nbytes`` (every record: an unstored one can still be held by a chain)."""
        rec.nbytes = record_bytes(rec, body)

    def put(self, rec: Record) -> bool:
        """Store ``rec`` (``rec.nbytes`` set); False when it is not kept: storage disabled or
        the response alone bigger than ``store_max_bytes`` (it is still answered; a later GET
        is a 404, as for any evicted response)."""
        store = self.store
        if not store.fits(rec.nbytes):
            if store.enabled:
                self.unstored += 1
            return False
        if rec.refs:  # already kept alive by a stored descendant: now an entry itself
            store.extra_bytes -= rec.nbytes
        else:
            self._acquire(rec.parent)
        rec.refs += 1
        return store.put(rec.id, rec, nbytes=rec.nbytes)

    def _removed(self, key: str, rec: Record) -> None:
        """``rec`` left the store (evicted, expired, deleted): drop the store's hold."""
        rec.refs -= 1
        if rec.refs:
            self.store.extra_bytes += rec.nbytes  # a stored descendant still holds it
        else:
            self._release(rec.parent)

    def _acquire(self, p: Record | Snapshot | None) -> None:
        """A record just became reachable: hold its parent (and up the chain while new)."""
        while type(p) is Record:
            p.refs += 1
            if p.refs > 1:
                return
            self.store.extra_bytes += p.nbytes
            p = p.parent

    def _release(self, p: Record | Snapshot | None) -> None:
        """A record is no longer reachable: drop its hold on its parent (and up the chain)."""
        while type(p) is Record:
            p.refs -= 1
            if p.refs:
                return
            self.store.extra_bytes -= p.nbytes
            p = p.parent

    def unlink(self, rec: Record) -> None:
        """Cut ``rec`` from its parent (a chain bound): the older turns can be freed."""
        p, rec.parent = rec.parent, None
        if rec.refs:
            self._release(p)

    # -- conversations -----------------------------------------------------------------------
    def new_conversation(self, cid: str, created_at: int,
                         metadata: dict[str, str]) -> Conversation:
        """A conversation bounded by this server's item and byte limits (not stored yet)."""
        return Conversation(cid, created_at, metadata, self._max_items,
                            self.conversation_max_bytes, self.conversations)

    def conversation_item_sizes(self, items: list[Item], param: str) -> list[int]:
        """The sizes of client items going into a conversation; 400 ``request_too_large``
        naming ``param[i]`` for an item bigger than a conversation may hold."""
        sizes = [item_bytes(it) for it in items]
        cap = self.conversation_max_bytes
        if cap:
            for i, n in enumerate(sizes):
                if n > cap:
                    raise E.conversation_item_too_large.at(f"{param}[{i}]", size=n, cap=cap)
        return sizes


RESPONSES: Key[ResponsesState] = Key("responses")  # in App.features


def state(app: App) -> ResponsesState:
    st = app.feature(RESPONSES)
    if st is None:
        st = ResponsesState(app)
        app.set_feature(RESPONSES, st)
    return st


# -- the previous-response cache of a WebSocket connection ----------------------------------

class PreviousResponses(Protocol):
    """What a transport offers the Responses handler besides the store for
    ``previous_response_id`` (``Request.context`` of a WebSocket ``response.create``): the
    handler looks there first (so ``store: false`` chains work) and reports every completed
    response back."""

    def cached_response(self, response_id: str) -> Any | None:
        """The cached record (a :class:`Record`) of ``response_id``, or None."""

    def cache_response(self, record: Any) -> None:
        """``record`` completed: keep it as its lane's most recent response."""


def _cached_id(record: Any) -> str | None:
    rid = record.id if isinstance(record, Record) else (
        record.get("id") if isinstance(record, dict) else None)
    return rid if isinstance(rid, str) else None


class ConnectionCache:
    """The most recent completed response of each lane of one WebSocket connection (the whole
    connection when no lanes are used): at most ``limit`` entries (one per named lane plus the
    default lane). The session owns it and hands each create a :class:`LaneCache`; it holds no
    reference to the session, so a stored record that keeps its lane view keeps only this
    (emptied by :meth:`clear` when the connection ends)."""

    __slots__ = ("limit", "_by_id", "_by_lane", "closed")

    def __init__(self, limit: int) -> None:
        self.limit = max(1, limit)
        self._by_id: OrderedDict[str, Any] = OrderedDict()
        self._by_lane: dict[str | None, str] = {}
        self.closed = False

    def __len__(self) -> int:
        return len(self._by_id)

    def lane(self, stream_id: str | None) -> LaneCache:
        """The view of lane ``stream_id`` (a create's ``Request.context``)."""
        return LaneCache(self, stream_id)

    def get(self, response_id: str) -> Any | None:
        return self._by_id.get(response_id)

    def put(self, stream_id: str | None, record: Any) -> None:
        """Remember ``record`` as lane ``stream_id``'s most recent completed response."""
        rid = _cached_id(record)
        if self.closed or rid is None:
            return
        old = self._by_lane.get(stream_id)
        if old is not None and old != rid:
            self._by_id.pop(old, None)
        self._by_id[rid] = record
        self._by_id.move_to_end(rid)
        self._by_lane[stream_id] = rid
        while len(self._by_id) > self.limit:
            self.evict(next(iter(self._by_id)))

    def continuation_failed(self, stream_id: str | None, previous_id: str | None) -> None:
        """A continuation of ``previous_id`` on lane ``stream_id`` failed: as the real
        service, a failed same-lane continuation evicts its parent."""
        if previous_id is not None and self._by_lane.get(stream_id) == previous_id:
            self.evict(previous_id)

    def evict(self, response_id: str) -> None:
        self._by_id.pop(response_id, None)
        for k in [k for k, v in self._by_lane.items() if v == response_id]:
            del self._by_lane[k]

    def clear(self) -> None:
        """The connection ended: forget everything, accept nothing more."""
        self.closed = True
        self._by_id.clear()
        self._by_lane.clear()


class LaneCache:
    """:class:`PreviousResponses` of one lane of a :class:`ConnectionCache`."""

    __slots__ = ("cache", "stream_id")

    def __init__(self, cache: ConnectionCache, stream_id: str | None) -> None:
        self.cache = cache
        self.stream_id = stream_id

    def cached_response(self, response_id: str) -> Any | None:
        return self.cache.get(response_id)

    def cache_response(self, record: Any) -> None:
        self.cache.put(self.stream_id, record)
