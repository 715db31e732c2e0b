"""Stores that every worker process sees: the rule for ``--workers > 1``.

With one process, stored responses and conversations live in a :class:`BoundedStore` in memory.
With several workers sharing one port, a follow-up request (``previous_response_id``,
``GET /v1/responses/{id}``, a conversation) may land on any worker and none can route by id, so
:func:`open_store` returns a :class:`SharedStore` instead: the same interface (and the same
bounds: ``max_entries`` newest entries, ``ttl`` seconds each), backed by one sqlite database
in the supervisor's temporary state directory. Values are pickled (they are the server's own
objects, never client bytes). TTLs use wall-clock time, the only clock the processes share.

A shared store also has a byte budget (``max_bytes``, 0 = none): the pickled sizes of its
entries are summed and the oldest entries are evicted until the sum fits (the newest entry is
always kept, so one entry may exceed it: entries are bounded by the request body limit). An
entry may name an ``owner`` (the pid of the worker that must still finish it): when a worker
dies, the supervisor rewrites the entries it owned (:meth:`SharedStore.update_owned`).

``on_evict`` is called for entries *this* process drops for a bound (the entry's owner may be
another worker; a running background response is stopped by the worker running it when it
finds its entry gone).
"""

from __future__ import annotations

import contextlib
import os
import pickle
import sqlite3
import time
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

from .store import BoundedStore

__all__ = ["SharedStore", "open_store", "prepare", "connect"]

V = TypeVar("V")


def store_path(state_dir: str) -> str:
    """The sqlite file the workers' shared stores live in."""
    return os.path.join(state_dir, "store.sqlite3")


def open_store(name: str, max_entries: int, ttl: float, now: Callable[[], float],
               on_evict: Callable[[str, Any], None] | None = None, *, max_bytes: int = 0,
               state_dir: str | None = None) -> Any:
    """A :class:`BoundedStore` (one process: ``state_dir`` None) or a :class:`SharedStore` in
    ``state_dir`` (``--workers > 1``: the app's ``state_dir``, or the supervisor's own view).
    ``max_bytes`` bounds a shared store only."""
    if not state_dir:
        return BoundedStore(max_entries, ttl, now, on_evict)
    return SharedStore(store_path(state_dir), name, max_entries, ttl,
                       on_evict, max_bytes=max_bytes)


PURGE_EVERY_S = 1.0
"""How often :meth:`SharedStore.put` drops expired entries (at most)."""

WAL_LIMIT_BYTES = 64 * 1024 * 1024
"""The write-ahead log is truncated back to this size after a checkpoint (sqlite otherwise keeps
the file at its largest size: big entries written between checkpoints would stay on disk)."""


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
    db.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
    return db


LOCK_WAIT_S = 10.0
"""How long a statement of a :class:`SharedStore` waits for another process's write lock."""


class _Conn:
    """A store's connection that waits for the write lock in sub-millisecond steps.

    sqlite's own busy handler (``connect(timeout=…)``) sleeps 1, 2, 5, 10, … 100 ms between
    tries while another worker holds the write lock, and this worker's event loop waits with
    it: two workers publishing a thousand stored responses a second saw TTFT p99 tails of
    200+ ms. Here sqlite does not wait (``busy_timeout`` 0); a statement found busy is tried
    again after 50 µs, doubling to 1 ms, for up to :data:`LOCK_WAIT_S` in all, then raises
    as sqlite would. Only statements that failed to start are tried again (a busy
    ``BEGIN IMMEDIATE`` or autocommit write changed nothing)."""

    __slots__ = ("db",)

    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db
        db.execute("PRAGMA busy_timeout=0")

    def execute(self, sql: str, params: Any = ()) -> sqlite3.Cursor:
        try:
            return self.db.execute(sql, params)
        except sqlite3.OperationalError as e:
            if not _busy(e):
                raise
        deadline = time.monotonic() + LOCK_WAIT_S
        delay = 0.00005
        while True:
            time.sleep(delay)
            delay = min(delay * 2, 0.001)
            try:
                return self.db.execute(sql, params)
            except sqlite3.OperationalError as e:
                if not _busy(e) or time.monotonic() > deadline:
                    raise

    @contextlib.contextmanager
    def transaction(self) -> Iterator[None]:
        """A write transaction: ``BEGIN IMMEDIATE`` (this worker waits for the others' write
        lock here), committed at the end, rolled back on any exception."""
        self.execute("BEGIN IMMEDIATE")
        try:
            yield
            self.execute("COMMIT")
        except BaseException:
            self.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.db.close()


def _busy(e: sqlite3.OperationalError) -> bool:
    """SQLITE_BUSY or SQLITE_LOCKED (extended codes too): another connection holds the lock."""
    return (e.sqlite_errorcode & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def prepare(state_dir: str) -> None:
    """Create the shared database in WAL mode before any worker opens it (supervisor)."""
    connect(os.path.join(state_dir, "store.sqlite3")).close()


class SharedStore(Generic[V]):
    """A bounded TTL key/value table shared by processes (sqlite, WAL mode)."""

    def __init__(self, path: str, name: str, max_entries: int, ttl: float,
                 on_evict: Callable[[str, V], None] | None = None, *,
                 max_bytes: int = 0) -> None:
        self.max_entries = max(0, int(max_entries))
        self.max_bytes = max(0, int(max_bytes))
        self.ttl = float(ttl)
        self.on_evict = on_evict
        self.evicted = 0
        self._purge_after = 0.0  # time.monotonic() before which put() does not purge
        self.table = "s_" + "".join(c if c.isalnum() else "_" for c in name)
        self._db = _Conn(connect(path))
        t = self.table
        db = self._db
        with db.transaction():  # (workers open the store together: one at a time)
            db.execute(f"CREATE TABLE IF NOT EXISTS {t} (k TEXT PRIMARY KEY, "
                       "born REAL NOT NULL, seq INTEGER NOT NULL, v BLOB NOT NULL, "
                       "size INTEGER NOT NULL, owner INTEGER)")
            # (seq, size): eviction order, oldest first, with the sizes the byte bound reads
            db.execute(f"CREATE INDEX IF NOT EXISTS {t}_seq ON {t}(seq, size)")
            # purge() would otherwise scan the table (~1 ms at 1024 entries)
            db.execute(f"CREATE INDEX IF NOT EXISTS {t}_born ON {t}(born)")
            db.execute(f"CREATE INDEX IF NOT EXISTS {t}_owner ON {t}(owner) "
                       "WHERE owner IS NOT NULL")
            # the entry count and the byte sum, kept by triggers on every insert, delete and
            # resize from any process: put() reads one row instead of COUNT(*) and SUM(size)
            # over the table (~30 us of a 75 us put at 1024 entries)
            db.execute(f"CREATE TABLE IF NOT EXISTS {t}_sum (id INTEGER PRIMARY KEY "
                       "CHECK (id = 0), n INTEGER NOT NULL, size INTEGER NOT NULL)")
            db.execute(f"INSERT OR IGNORE INTO {t}_sum VALUES (0, (SELECT COUNT(*) FROM {t}), "
                       f"(SELECT COALESCE(SUM(size), 0) FROM {t}))")
            db.execute(f"CREATE TRIGGER IF NOT EXISTS {t}_ins AFTER INSERT ON {t} BEGIN "
                       f"UPDATE {t}_sum SET n = n + 1, size = size + new.size; END")
            db.execute(f"CREATE TRIGGER IF NOT EXISTS {t}_del AFTER DELETE ON {t} BEGIN "
                       f"UPDATE {t}_sum SET n = n - 1, size = size - old.size; END")
            db.execute(f"CREATE TRIGGER IF NOT EXISTS {t}_upd AFTER UPDATE OF size ON {t} "
                       f"BEGIN UPDATE {t}_sum SET size = size - old.size + new.size; END")

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        self.purge()
        return int(self._db.execute(f"SELECT n FROM {self.table}_sum").fetchone()[0])

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.has(key)

    @property
    def nbytes(self) -> int:
        """The pickled size of every entry (what ``max_bytes`` bounds)."""
        return int(self._db.execute(f"SELECT size FROM {self.table}_sum").fetchone()[0])

    def _drop(self, keys: list[str]) -> None:
        for k in keys:
            row = None
            if self.on_evict is not None:
                row = self._db.execute(f"SELECT v FROM {self.table} WHERE k = ?",
                                       (k,)).fetchone()
            self._db.execute(f"DELETE FROM {self.table} WHERE k = ?", (k,))
            self.evicted += 1
            if self.on_evict is not None and row is not None:
                self.on_evict(k, pickle.loads(row[0]))

    def purge(self) -> None:
        """Drop expired entries."""
        if self.ttl <= 0:
            return
        rows = self._db.execute(f"SELECT k FROM {self.table} WHERE born <= ?",
                                (time.time() - self.ttl,)).fetchall()
        self._drop([k for (k,) in rows])

    def put(self, key: str, value: V, owner: int | None = None) -> bool:
        """Insert or replace ``key`` as the newest entry (``owner``: see the module doc)."""
        if self.max_entries <= 0:
            return False
        db = self._db
        t = self.table
        blob = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        with db.transaction():
            seq = db.execute(f"SELECT COALESCE(MAX(seq), 0) + 1 FROM {t}").fetchone()[0]
            # (an upsert, not INSERT OR REPLACE: a replaced row's delete fires no trigger)
            db.execute(f"INSERT INTO {t} (k, born, seq, v, size, owner) VALUES (?,?,?,?,?,?) "
                       "ON CONFLICT (k) DO UPDATE SET born = excluded.born, "
                       "seq = excluded.seq, v = excluded.v, size = excluded.size, "
                       "owner = excluded.owner",
                       (key, time.time(), seq, blob, len(blob), owner))
            n, total = db.execute(f"SELECT n, size FROM {t}_sum").fetchone()
            over: list[str] = []
            if n > self.max_entries:
                over = [k for (k,) in db.execute(f"SELECT k FROM {t} ORDER BY seq LIMIT ?",
                                                 (n - self.max_entries,)).fetchall()]
            excess = total - self.max_bytes if self.max_bytes else 0
            if excess > 0:  # oldest first, never the entry just written
                counted = set(over)
                for k, size in db.execute(f"SELECT k, size FROM {t} WHERE seq < ? "
                                          "ORDER BY seq", (seq,)).fetchall():
                    if excess <= 0:
                        break
                    excess -= size
                    if k not in counted:
                        over.append(k)
            self._drop(over)
        # expired entries dropped at most once a second from here (a statement and a WAL
        # read per put, 4% of a worker publishing 1000 stored responses a second); readers
        # (get, has, len, values) never see an expired entry either way
        mono = time.monotonic()
        if mono >= self._purge_after:
            self._purge_after = mono + PURGE_EVERY_S
            self.purge()
        return True

    def update(self, key: str, value: V, owner: int | None = None) -> bool:
        """Replace the value of ``key`` in place (same age and eviction rank); False if absent.
        Not bounded by ``max_bytes`` (use it for values no bigger than the old one)."""
        blob = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
        cur = self._db.execute(f"UPDATE {self.table} SET v = ?, size = ?, owner = ? "
                               "WHERE k = ?", (blob, len(blob), owner, key))
        return cur.rowcount > 0

    def update_owned(self, owner: int, fn: Callable[[V], V]) -> int:
        """Replace every entry ``owner`` holds by ``fn(value)`` (no owner any more), atomically
        (another process writing one of them meanwhile waits); returns how many."""
        db = self._db
        t = self.table
        with db.transaction():
            rows = db.execute(f"SELECT k, v FROM {t} WHERE owner = ?", (owner,)).fetchall()
            for k, v in rows:
                blob = pickle.dumps(fn(pickle.loads(v)), pickle.HIGHEST_PROTOCOL)
                db.execute(f"UPDATE {t} SET v = ?, size = ?, owner = NULL WHERE k = ?",
                           (blob, len(blob), k))
        return len(rows)

    def has(self, key: str) -> bool:
        """``key`` is stored (and not expired), without reading its value."""
        row = self._db.execute(f"SELECT born FROM {self.table} WHERE k = ?", (key,)).fetchone()
        return row is not None and not (self.ttl > 0 and row[0] <= time.time() - self.ttl)

    def get(self, key: str) -> V | None:
        row = self._db.execute(f"SELECT born, v FROM {self.table} WHERE k = ?",
                               (key,)).fetchone()
        if row is None:
            return None
        if self.ttl > 0 and row[0] <= time.time() - self.ttl:
            self.purge()
            return None
        return pickle.loads(row[1])  # type: ignore[no-any-return]

    def put_then_get(self, key: str, value: V, other: SharedStore[Any], other_key: str,
                     owner: int | None = None) -> Any:
        """:meth:`put`, then ``other.get(other_key)`` (:class:`~llmsim.state.store.SnapshotStore`;
        on one machine two calls cost what one does)."""
        self.put(key, value, owner)
        return other.get(other_key)

    def get_with(self, key: str, other: SharedStore[Any], other_key: str) -> tuple[V | None, Any]:
        """``(get(key), other.get(other_key))``."""
        return self.get(key), other.get(other_key)

    def get_and_has(self, key: str, other: SharedStore[Any],
                    other_key: str) -> tuple[V | None, bool]:
        """``(get(key), other.has(other_key))``."""
        return self.get(key), other.has(other_key)

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

    def close(self) -> None:
        self._db.close()
