"""Conversations kept in Redis (:class:`RedisConversations`), the item index of
``item_reference`` lookups (:class:`ItemIndex`) and the bound of one shared value."""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING

from ...state.redis_store import RedisStore
from ...state.store import BoundedStore

if TYPE_CHECKING:
    from ...state.redisconn import SharedState
    from ..services import Services
from .record import Conversation, Item, Record

__all__ = ["RedisConversations", "ItemIndex", "value_limit"]


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


def value_limit(app: Services) -> int:
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

    def add(self, rec: Record, store: BoundedStore[Record]) -> None:
        """Index a stored response's input items (position i) and its output items (-1 - j,
        in ``rec.output_items()`` once it has them: ``rec.out.items``, by their ids)."""
        where = self._where
        rid = rec.id
        for i, it in enumerate(rec.input_items):
            iid = it.get("id")
            if isinstance(iid, str):
                where[iid] = (rid, i)
        for j, o in enumerate(rec.out.items):
            where[o.id] = (rid, -1 - j)
        if len(where) > self._sweep_at:
            live = store.keys()  # (a dict view: a lookup each, no store call per item)
            self._where = where = {k: v for k, v in where.items() if v[0] in live}
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
