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

from typing import TYPE_CHECKING, cast

from ...errors import E
from ...state.store import BoundedStore

if TYPE_CHECKING:
    from ..services import Host, Services
from .conversations import ItemIndex, RedisConversations, _min_bound, value_limit
from .record import (
    CONVERSATION_BYTES,
    FAILED_CODES,
    RESPONSES,
    Conversation,
    Item,
    PreviousResponses,
    Record,
    Snapshot,
    input_bytes,
    item_bytes,
    record_bytes,
)
from .store import CANCEL, DELETED, SharedResponses, fail_orphans
from .ws_cache import ConnectionCache, LaneCache

__all__ = ["Record", "Snapshot", "SharedResponses", "Conversation", "ResponsesState", "state",
           "FAILED_CODES", "fail_orphans", "record_bytes", "input_bytes", "item_bytes", "ItemIndex",
           "RedisConversations", "value_limit", "PreviousResponses", "ConnectionCache",
           "LaneCache", "RESPONSES", "DELETED", "CANCEL", "CONVERSATION_BYTES", "Item"]


class ResponsesState:
    """Per-app Responses state: the stored responses and conversations, background count.

    Byte accounting of stored responses: a stored record keeps its ``previous_response_id``
    chain alive (up to ``max_chain_depth`` turns and ``chain_max_bytes``) even after the older
    records were evicted, so the store's budget counts every record it keeps *reachable*,
    once: ``Record.refs`` is 1 for the store's own hold plus one per reachable child, a record
    evicted while a stored descendant still holds it moves from ``store.bytes`` to
    ``store.extra_bytes``, and it leaves the count when its last holder does.
    """

    def __init__(self, app: Host) -> None:
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
        elif type(rec.parent) is Record:
            self._acquire(rec.parent)
        rec.refs += 1
        return store.put(rec.id, rec, nbytes=rec.nbytes)

    def _removed(self, key: str, rec: Record) -> None:
        """``rec`` left the store (evicted, expired, deleted): drop the store's hold."""
        rec.refs -= 1
        if rec.refs:
            self.store.extra_bytes += rec.nbytes  # a stored descendant still holds it
        elif type(rec.parent) is Record:
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




def state(app: Services) -> ResponsesState:
    """The app's Responses state (made by :func:`install` when the family registers)."""
    st: ResponsesState | None = app.feature(RESPONSES)  # (RESPONSES is a Key[Any]: no cast)
    assert st is not None, "the Responses family is not installed"
    return st


def install(app: Host) -> ResponsesState:
    """Give the app its Responses state (once: a second call keeps the first)."""
    st = cast("ResponsesState | None", app.feature(RESPONSES))
    if st is None:
        st = ResponsesState(app)
        app.set_feature(RESPONSES, st)
    return st


# -- the previous-response cache of a WebSocket connection ----------------------------------
