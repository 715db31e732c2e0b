"""Stored responses and conversations (bounded), and the per-response lifecycle record.

A :class:`Record` is one response: its request echo, its decided output (:class:`RespOut`),
its input items, its parent in a ``previous_response_id`` chain, and how far its live stream
has got. The live stream (foreground SSE, WebSocket, or a background pump) reports every
event to :meth:`Record.observe`; everything else (GET, cancel, resume-by-replay) reads the
record. Replays re-render the plan (see :mod:`.render`) and pace the events that are still in
the future on the live stream's schedule, so a resumed stream sees the same events with the
same sequence numbers at the same moments as the original.

With ``--workers > 1`` (:func:`llmsim.state.shared.shared_dir` set) a stored record is also
published as a :class:`Snapshot` (plain, picklable data) in a :class:`SharedResponses` store
every worker reads: when it is created, when it reaches a terminal state, and when it is
deleted (a tombstone). The worker that created a response stays its owner (it runs it and
keeps the live record); other workers answer from the snapshot when their own store misses.
With one process none of this exists (``ResponsesState.shared is None``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ...errors import APIError
from ...state import shared
from ...state.store import BoundedStore
from ...stream import EventStream
from . import render
from .sim import RespOut

if TYPE_CHECKING:
    from ...app import App
    from ...flow import Pump

__all__ = ["Record", "Snapshot", "SharedResponses", "Conversation", "ResponsesState", "state",
           "FAILED_CODES", "ItemIndex"]

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


class Record:
    """One response's state (stored, WebSocket-cached, or only live while streaming)."""

    __slots__ = ("id", "echo", "out", "input_items", "parent", "depth", "status", "background",
                 "stream", "pump", "emitted", "cancel_seq", "failed_event", "done_output",
                 "final", "conversation", "ws_context", "app", "warmup", "_finished", "shared")

    def __init__(self, app: App, echo: dict[str, Any], out: RespOut, input_items: list[Item],
                 parent: Record | Snapshot | None, *, background: bool = False,
                 conversation: Conversation | None = None, ws_context: Any = None,
                 warmup: bool = False) -> None:
        self.app = app
        self.warmup = warmup  # WebSocket generate: false
        self.id = out.id
        self.echo = echo
        self.out = out
        self.input_items = input_items
        self.parent = parent
        self.depth = parent.depth + 1 if parent is not None else 0
        self.status = "queued" if background else "in_progress"
        self.background = background
        self.stream: EventStream | None = None  # the live stream (its schedule anchors replays)
        self.pump: Pump | None = None  # background only
        self.emitted = 0  # events the live stream has sent
        self.cancel_seq: int | None = None
        self.failed_event: dict[str, Any] | None = None
        self.done_output: list[Item] = []
        self.final: dict[str, Any] | None = None
        self.conversation = conversation
        self.ws_context = ws_context
        self._finished = False
        self.shared: SharedResponses | None = None  # set when published to other workers

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
        (oldest first). Chains longer than ``max_depth`` forget their oldest turns for good."""
        chain: list[Record] = []
        base: list[list[Item]] = []
        r: Record | Snapshot | None = self
        while r is not None:
            if type(r) is Snapshot:  # a parent created on another worker
                base = list(r.turns[-(max_depth - len(chain)):])
                break
            assert type(r) is Record
            chain.append(r)
            if len(chain) >= max_depth and r.parent is not None:
                r.parent = None  # bound the memory a long chain keeps alive
                break
            r = r.parent
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
    def observe(self, etype: str, data: Any) -> None:
        """Every event of the live stream, as it is sent (updates status/output/terminal)."""
        if type(data) is not dict:
            return
        seq = data.get("sequence_number")
        if type(seq) is int:
            self.emitted = seq + 1
        if etype == "response.output_item.done":
            self.done_output.append(data["item"])
        elif etype == "response.in_progress":
            if self.status in ACTIVE:
                self.status = "in_progress"
        elif etype in ("response.completed", "response.incomplete"):
            self.finish(data["response"])
        elif etype == "response.failed" and self.failed_event is None:
            self.failed_event = data
            self.finish(data["response"])

    def finish(self, response: dict[str, Any]) -> None:
        """The response reached a terminal state: record it, count usage, update state."""
        if self._finished:
            return
        self._finished = True
        self.final = response
        self.status = response["status"]
        usage = response.get("usage")
        if usage:
            self.app.stats.usage(usage["input_tokens"], usage["output_tokens"],
                                 usage["output_tokens_details"]["reasoning_tokens"])
        if self.conversation is not None and self.status != "cancelled":
            self.conversation.extend(self.input_items + self.output_items())
        ctx = self.ws_context
        if ctx is not None and self.status in ("completed", "incomplete"):
            cache = getattr(ctx, "cache_response", None)
            if cache is not None:
                cache(self)
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
        """The plan of the live stream; a stream that ends early marks the response
        cancelled (client gone: the real API stops generating a non-background response)."""
        try:
            yield from render.plan(self.echo, self.out, background=background,
                                   warmup=self.warmup)
        finally:
            if not self.terminal and not self.background:
                self.cancel()

    def follow_plan(self, after: int, now: float) -> Iterator[tuple[float, str, Any]]:
        """Replay events with ``sequence_number > after``: those already sent at once, the
        rest on the live stream's schedule; stops where a cancel or failure ended it."""
        live = self.stream
        origin = live.start if live is not None and live.start is not None else now
        # background streams were shifted by backpressure never (NullSink never pauses)
        cum = 0.0
        sent = 0.0
        k = 0
        for off, etype, data in render.plan(self.echo, self.out, background=self.background,
                                            warmup=self.warmup):
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
            k += 1


class Snapshot:
    """A stored response as every worker sees it (``--workers > 1``): plain data, pickled.

    ``response`` is the Response object at the last publication (created, terminal),
    ``turns`` the chain's items per turn (terminal only; what ``previous_response_id``
    needs), ``echo``/``out``/``cancel_seq``/``failed_event`` what a terminal replay
    (``GET ?stream=true``) re-renders from, ``t0`` the wall-clock creation time.
    """

    __slots__ = ("id", "response", "input_items", "turns", "depth", "background", "warmup",
                 "echo", "out", "cancel_seq", "failed_event")

    def __init__(self, rec: Record, turns: list[list[Item]] | None) -> None:
        self.id = rec.id
        self.response = rec.response()
        self.input_items = rec.input_items
        self.turns = turns
        self.depth = rec.depth
        self.background = rec.background
        self.warmup = rec.warmup
        self.echo = rec.echo
        self.out = rec.out
        self.cancel_seq = rec.cancel_seq
        self.failed_event = rec.failed_event

    @property
    def status(self) -> str:
        return str(self.response["status"])

    @property
    def terminal(self) -> bool:
        return self.status not in ACTIVE

    def output_items(self) -> list[Item]:
        return list(self.response["output"])

    def context(self, max_depth: int) -> list[Item]:
        """The chained items (as :meth:`Record.context`), from the published turns."""
        items: list[Item] = []
        for turn in (self.turns or [])[-max_depth:]:
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


DELETED = "deleted"
CANCEL = "cancel"


class SharedResponses:
    """Stored responses published to every worker (see the module doc).

    Two shared tables with the local store's bounds: ``snapshots`` (id → :class:`Snapshot`)
    and ``control`` (id → ``"deleted"`` tombstone or ``"cancel"`` request for the owner).
    Ordering makes deletes race-free without locks: a delete writes its tombstone *before*
    dropping the snapshot, and a publication checks for a tombstone *after* writing.
    """

    def __init__(self, max_entries: int, ttl: float, max_depth: int) -> None:
        now = time.time
        self.max_depth = max_depth
        self.snapshots: Any = shared.open_store("responses", max_entries, ttl, now)
        self.control: Any = shared.open_store("responses_ctl", max_entries, ttl, now)

    def publish(self, rec: Record) -> bool:
        """Write ``rec``'s snapshot; False (and nothing kept) when it was deleted meanwhile."""
        turns = rec.turns(self.max_depth) if rec.terminal else None
        self.snapshots.put(rec.id, Snapshot(rec, turns))
        if self.control.get(rec.id) == DELETED:
            self.snapshots.pop(rec.id)
            return False
        return True

    def get(self, rid: str) -> Snapshot | None:
        """The published snapshot of ``rid`` (None if unknown or deleted)."""
        snap = self.snapshots.get(rid)
        if snap is None or self.control.get(rid) == DELETED:
            return None
        return snap  # type: ignore[no-any-return]

    def deleted(self, rid: str) -> bool:
        return bool(self.control.get(rid) == DELETED)

    def command(self, rid: str) -> str | None:
        """The pending control entry of ``rid`` (``"deleted"``, ``"cancel"`` or None)."""
        return self.control.get(rid)  # type: ignore[no-any-return]

    def delete(self, rid: str, known: bool) -> bool:
        """Tombstone ``rid`` everywhere (``known``: this worker has it); True if it was
        published. Unknown ids leave no tombstone (they must not push real ones out)."""
        if not known and self.snapshots.get(rid) is None:
            return False
        self.control.put(rid, DELETED)
        return self.snapshots.pop(rid) is not None

    def request_cancel(self, rid: str) -> None:
        if self.control.get(rid) != DELETED:
            self.control.put(rid, CANCEL)


class Conversation:
    """An in-memory conversation transcript, bounded to ``max_items`` (oldest dropped)."""

    __slots__ = ("id", "created_at", "metadata", "items")

    def __init__(self, cid: str, created_at: int, metadata: dict[str, str],
                 max_items: int) -> None:
        self.id = cid
        self.created_at = created_at
        self.metadata = metadata
        self.items: deque[Item] = deque(maxlen=max(1, max_items))

    def extend(self, items: list[Item]) -> None:
        self.items.extend(items)

    def json(self) -> dict[str, Any]:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at,
                "metadata": self.metadata}


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
    """Per-app Responses state: the stored responses and conversations, background count."""

    def __init__(self, app: App) -> None:
        cfg = app.config.responses
        now = app.clock.now
        self.store: BoundedStore[Record] = BoundedStore(cfg.store_max_entries, cfg.store_ttl_s,
                                                        now, on_evict=self._evicted)
        self.conversations: BoundedStore[Conversation] = BoundedStore(
            cfg.conversations_max_entries, cfg.conversation_ttl_s, now)
        self.active_background = 0
        self.items = ItemIndex()  # item_reference lookups
        self.shared: SharedResponses | None = None
        if shared.shared_dir() is not None and cfg.store_max_entries > 0:
            self.shared = SharedResponses(cfg.store_max_entries, cfg.store_ttl_s,
                                          cfg.max_chain_depth)

    @staticmethod
    def _evicted(key: str, rec: Record) -> None:
        # an evicted background response can no longer be read or cancelled: stop it
        if rec.pump is not None:
            rec.cancel()


def state(app: App) -> ResponsesState:
    st = app.extensions.get("responses")
    if st is None:
        st = app.extensions["responses"] = ResponsesState(app)
    return st
