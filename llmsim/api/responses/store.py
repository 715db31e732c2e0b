"""Stored responses shared by ``--workers`` (sqlite) or replicas (Redis):
:class:`SharedResponses` over one :class:`~llmsim.state.store.SnapshotStore` interface both
back ends implement."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...errors import APIError
from ...state import shared
from ...state.redis_store import RedisStore
from ...state.store import SnapshotStore

if TYPE_CHECKING:
    from ...config import ResponsesConfig
    from ...state.redisconn import SharedState
from .record import Item, Record, Snapshot

__all__ = ["SharedResponses", "fail_orphans", "DELETED", "CANCEL"]


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
        self.max_depth = max_depth
        self.redis = redis
        self.owner: int | str = os.getpid()
        # publications that failed while Redis was down (retried after each heartbeat)
        self.pending: dict[str, Record] = {}
        self.max_pending = max(1, max_entries)
        if redis is not None:
            self.owner = redis.replica
            self.snapshots: SnapshotStore[Snapshot] = RedisStore(
                redis, "responses", max_entries, ttl, max_bytes=max_bytes, max_value=max_value)
            self.control: SnapshotStore[str] = RedisStore(redis, "responses_ctl", max_entries,
                                                          ttl)
            redis.on_heartbeat.append(self.retry_pending)
            return
        if state_dir is None:
            raise ValueError("shared responses need the workers' state_dir or Redis")
        self.snapshots = shared.SharedStore(shared.store_path(state_dir), "responses",
                                            max_entries, ttl, max_bytes=max_bytes)
        self.control = shared.SharedStore(shared.store_path(state_dir), "responses_ctl",
                                          max_entries, ttl)

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
        # the write, then the tombstone check (Redis: one round trip)
        cmd = self.snapshots.put_then_get(rec.id, snap, self.control, rec.id, snap.owner)
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
        return self.control.get_and_has(rid, self.snapshots, rid)

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
