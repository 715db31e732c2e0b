"""Stores that every worker process sees: the rule for ``--workers > 1``.

With one process, stored responses and conversations live in a :class:`BoundedStore` in memory.
With several workers sharing one port, a follow-up request (``previous_response_id``,
``GET /v1/responses/{id}``, a conversation) may land on any worker and none can route by id, so
:func:`open_store` returns a :class:`SharedStore` instead: the same interface (and the same
bounds: ``max_entries`` newest entries, ``ttl`` seconds each), backed by one sqlite database
in the supervisor's temporary state directory. Values are pickled (they are the server's own
objects, never client bytes). TTLs use wall-clock time, the only clock the processes share.

``on_evict`` is called for entries *this* process drops for a bound (the entry's owner may be
another worker; a running background response is stopped by the worker running it when it
finds its entry gone).
"""

from __future__ import annotations

import os
import pickle
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from .store import BoundedStore

__all__ = ["SharedStore", "open_store", "configure", "shared_dir", "prepare", "connect"]

V = TypeVar("V")
_DIR: list[str] = []


def configure(state_dir: str | None) -> None:
    """Called in each worker process: stores opened from now on are shared in ``state_dir``."""
    _DIR.clear()
    if state_dir:
        _DIR.append(state_dir)


def shared_dir() -> str | None:
    return _DIR[0] if _DIR else None


def open_store(name: str, max_entries: int, ttl: float, now: Callable[[], float],
               on_evict: Callable[[str, Any], None] | None = None) -> Any:
    """A :class:`BoundedStore` (one process) or a :class:`SharedStore` (``--workers > 1``)."""
    d = shared_dir()
    if d is None:
        return BoundedStore(max_entries, ttl, now, on_evict)
    return SharedStore(os.path.join(d, "store.sqlite3"), name, max_entries, ttl, on_evict)


def connect(path: str) -> sqlite3.Connection:
    """Open the shared database in WAL mode.

    Switching a database to WAL takes an exclusive lock that sqlite's busy timeout does not
    cover, so workers starting together could fail with "database is locked" (and a worker
    that dies at start resets the connections queued on its socket). The supervisor calls this
    once before forking (WAL is then a property of the file) and workers retry briefly."""
    db = sqlite3.connect(path, timeout=10, isolation_level=None, check_same_thread=False)
    for attempt in range(50):
        try:
            if db.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                db.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError:
            if attempt == 49:
                raise
            time.sleep(0.02)
    db.execute("PRAGMA synchronous=OFF")
    return db


def prepare(state_dir: str) -> None:
    """Create the shared database in WAL mode before any worker opens it (supervisor)."""
    connect(os.path.join(state_dir, "store.sqlite3")).close()


class SharedStore(Generic[V]):
    """A bounded TTL key/value table shared by processes (sqlite, WAL mode)."""

    def __init__(self, path: str, name: str, max_entries: int, ttl: float,
                 on_evict: Callable[[str, V], None] | None = None) -> None:
        self.max_entries = max(0, int(max_entries))
        self.ttl = float(ttl)
        self.on_evict = on_evict
        self.evicted = 0
        self.table = "s_" + "".join(c if c.isalnum() else "_" for c in name)
        self._db = connect(path)
        self._db.execute(f"CREATE TABLE IF NOT EXISTS {self.table} (k TEXT PRIMARY KEY, "
                         "born REAL NOT NULL, seq INTEGER NOT NULL, v BLOB NOT NULL)")
        self._db.execute(f"CREATE INDEX IF NOT EXISTS {self.table}_seq ON {self.table}(seq)")
        # purge() runs after every put: without this index it scans the table (~1 ms at 1024)
        self._db.execute(f"CREATE INDEX IF NOT EXISTS {self.table}_born ON {self.table}(born)")

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        self.purge()
        return int(self._db.execute(f"SELECT COUNT(*) FROM {self.table}").fetchone()[0])

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def _drop(self, rows: list[tuple[str, bytes]]) -> None:
        for k, v in rows:
            self._db.execute(f"DELETE FROM {self.table} WHERE k = ?", (k,))
            self.evicted += 1
            if self.on_evict is not None:
                self.on_evict(k, pickle.loads(v))

    def purge(self) -> None:
        """Drop expired entries."""
        if self.ttl <= 0:
            return
        rows = self._db.execute(f"SELECT k, v FROM {self.table} WHERE born <= ?",
                                (time.time() - self.ttl,)).fetchall()
        self._drop(rows)

    def put(self, key: str, value: V) -> bool:
        if self.max_entries <= 0:
            return False
        db = self._db
        db.execute("BEGIN IMMEDIATE")
        try:
            seq = db.execute(f"SELECT COALESCE(MAX(seq), 0) + 1 FROM {self.table}").fetchone()[0]
            db.execute(f"INSERT OR REPLACE INTO {self.table} (k, born, seq, v) VALUES (?,?,?,?)",
                       (key, time.time(), seq, pickle.dumps(value, pickle.HIGHEST_PROTOCOL)))
            n = db.execute(f"SELECT COUNT(*) FROM {self.table}").fetchone()[0]
            over = db.execute(f"SELECT k, v FROM {self.table} ORDER BY seq LIMIT ?",
                              (max(0, n - self.max_entries),)).fetchall()
            self._drop(over)
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        self.purge()
        return True

    def get(self, key: str) -> V | None:
        row = self._db.execute(f"SELECT born, v FROM {self.table} WHERE k = ?",
                               (key,)).fetchone()
        if row is None:
            return None
        if self.ttl > 0 and row[0] <= time.time() - self.ttl:
            self.purge()
            return None
        return pickle.loads(row[1])  # type: ignore[no-any-return]

    def pop(self, key: str) -> V | None:
        value = self.get(key)
        self._db.execute(f"DELETE FROM {self.table} WHERE k = ?", (key,))
        return value

    def values(self) -> Iterator[V]:
        self.purge()
        for (v,) in self._db.execute(f"SELECT v FROM {self.table} ORDER BY seq").fetchall():
            yield pickle.loads(v)

    def clear(self) -> None:
        self._db.execute(f"DELETE FROM {self.table}")
