"""``--workers``: the supervisor restarts a killed worker, stats stay whole, SIGTERM ends all.

Not a timing test: every wait is a bounded wait for a condition, never a speed assertion.
Also unit tests for the shared (multi-process) store used for stored responses.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from llmsim.ops.workers import FLUSH_S, resolve_workers
from llmsim.state.shared import SharedStore, open_store
from llmsim.state.store import BoundedStore

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

BODY = json.dumps({"model": "gpt-4o-mini", "max_tokens": 3,
                   "messages": [{"role": "user", "content": "Hi"}]})


def children(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as fh:
            return {int(x) for x in fh.read().split()}
    except OSError:
        return set()


def wait_for(cond, timeout: float = 20.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def chat(port: int) -> int:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("POST", "/v1/chat/completions", BODY, {"Content-Type": "application/json"})
        r = c.getresponse()
        data = json.loads(r.read())
        assert data["object"] == "chat.completion"
        return r.status
    finally:
        c.close()


def stats(port: int) -> dict:  # type: ignore[type-arg]
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request("GET", "/llmsim/stats")
        return json.loads(c.getresponse().read())  # type: ignore[no-any-return]
    finally:
        c.close()


@pytest.fixture
def workers2():  # type: ignore[no-untyped-def]
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmsim", "--port", "0", "--latency", "instant", "--workers", "2",
         "--shutdown-grace-s", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, cwd=Path(__file__).resolve().parent.parent)
    found: dict[str, int] = {}
    seen = threading.Event()
    lines: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace")
            lines.append(line)
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if m and "port" not in found:
                found["port"] = int(m.group(1))
                seen.set()
        seen.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert seen.wait(30), "no start-up banner"
        assert "port" in found, "".join(lines)
        yield proc, found["port"], lines
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)  # the supervisor removes its state dir
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def test_supervisor_restarts_killed_worker_and_stats_stay_whole(workers2) -> None:  # type: ignore[no-untyped-def]
    proc, port, lines = workers2
    first = wait_for(lambda: children(proc.pid) if len(children(proc.pid)) == 2 else None,
                     what="2 workers")
    n = 30
    assert all(chat(port) == 200 for _ in range(n))
    wait_for(lambda: stats(port)["requests_total"] == n, what="stats of both workers")
    assert stats(port)["workers"] == 2

    victim = sorted(first)[0]
    # a SIGKILLed worker loses at most FLUSH_S of activity (documented): the stats request
    # above may have been answered by the victim from its live counters, so let its file catch up
    time.sleep(3 * FLUSH_S)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: victim not in children(proc.pid), what="the killed worker to be reaped")
    # requests keep succeeding while the slot restarts
    m = 20
    assert all(chat(port) == 200 for _ in range(m))
    again = wait_for(lambda: children(proc.pid) if len(children(proc.pid)) == 2 else None,
                     what="the restarted worker")
    assert victim not in again
    # the dead worker's counters are kept: nothing lost, nothing counted twice
    wait_for(lambda: stats(port)["requests_total"] == n + m, what="whole stats after restart")
    s = wait_for(lambda: (lambda s: s if s["workers"] == 2 else None)(stats(port)),
                 what="2 live workers in the stats")
    assert s["active"]["streams"] == 0
    assert any("restarting" in line for line in lines)

    # SIGTERM drains and ends every process
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(20) == 0
    for pid in again:
        wait_for(lambda pid=pid: not os.path.exists(f"/proc/{pid}") or
                 open(f"/proc/{pid}/stat").read().split(")")[1].split()[0] == "Z",
                 what=f"worker {pid} to exit")


def test_stats_reset_applies_to_every_worker(workers2) -> None:  # type: ignore[no-untyped-def]
    proc, port, _ = workers2
    wait_for(lambda: len(children(proc.pid)) == 2, what="2 workers")
    for _ in range(10):
        assert chat(port) == 200
    wait_for(lambda: stats(port)["requests_total"] == 10, what="stats")
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("POST", "/llmsim/stats/reset")
    assert c.getresponse().status == 200
    c.close()
    wait_for(lambda: stats(port)["requests_total"] == 0 and stats(port)["workers"] == 2,
             what="reset on every worker")
    for _ in range(4):
        assert chat(port) == 200
    wait_for(lambda: stats(port)["requests_total"] == 4, what="counting after reset")


def test_resolve_workers() -> None:
    assert resolve_workers("auto") == (os.cpu_count() or 1)
    assert resolve_workers("3") == 3
    with pytest.raises(ValueError):
        resolve_workers("0")


def test_workers_flag_rejects_bad_value() -> None:
    from llmsim.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="workers"):
        load_config(env={}, overrides={"workers": "zero"})


def test_shared_store_is_seen_by_another_connection_and_bounded(tmp_path: Path) -> None:
    path = str(tmp_path / "s.sqlite3")
    evicted: list[str] = []
    a: SharedStore[dict] = SharedStore(path, "responses", 3, 0, on_evict=lambda k, v: evicted.append(k))  # type: ignore[type-arg]
    b: SharedStore[dict] = SharedStore(path, "responses", 3, 0)  # type: ignore[type-arg]
    a.put("resp_1", {"id": "resp_1", "output": [1, 2]})
    assert b.get("resp_1") == {"id": "resp_1", "output": [1, 2]}  # another process' view
    for i in range(2, 6):
        a.put(f"resp_{i}", {"id": f"resp_{i}"})
    assert len(b) == 3 and b.get("resp_1") is None
    assert evicted == ["resp_1", "resp_2"]
    assert b.pop("resp_5") == {"id": "resp_5"} and a.get("resp_5") is None
    assert [v["id"] for v in a.values()] == ["resp_3", "resp_4"]
    a.put("resp_3", {"id": "resp_3", "v": 2})  # replace moves it to the newest position
    assert [v["id"] for v in b.values()] == ["resp_4", "resp_3"]


def test_shared_store_totals_follow_every_write_from_every_connection(tmp_path: Path) -> None:
    """The entry count and byte sum put() bounds by are kept by triggers (one row read per
    put, not COUNT(*)/SUM(size) over the table): they must equal the table after a put, a
    replace, an update, an eviction by count and by bytes, a pop, an owned rewrite and a
    clear, written through either of two connections (two workers)."""
    path = str(tmp_path / "s.sqlite3")
    a: SharedStore[bytes] = SharedStore(path, "r", 4, 0, max_bytes=3000)
    b: SharedStore[bytes] = SharedStore(path, "r", 4, 0, max_bytes=3000)

    def check() -> None:
        n, size = a._db.execute("SELECT COUNT(*), COALESCE(SUM(size), 0) FROM s_r").fetchone()
        assert (len(a), a.nbytes) == (len(b), b.nbytes) == (n, size)

    a.put("k1", b"x" * 500, owner=7)
    b.put("k2", b"y" * 500)
    check()
    a.put("k1", b"x" * 900, owner=7)  # a replace: one entry, its new size, now the newest
    check()
    assert len(a) == 2 and [len(v) for v in b.values()] == [500, 900]
    b.update("k2", b"z" * 100)
    check()
    for i in range(3, 7):  # past 4 entries: the oldest go
        (a if i % 2 else b).put(f"k{i}", b"w" * 300)
        check()
    assert len(a) == 4 and not a.has("k2") and not a.has("k1")
    a.put("big", b"B" * 2500)  # past 3000 bytes: the oldest go, never the entry just put
    check()
    assert a.has("big") and a.nbytes <= 3000 + 200 and len(a) < 4
    a.put("huge", b"H" * 5000)  # alone over the budget: kept, everything older goes
    check()
    assert [len(v) for v in a.values()] == [5000]
    b.put("o1", b"o" * 10, owner=9)  # (and "huge" goes: the bytes are over again)
    assert [len(v) for v in a.values()] == [10]
    assert a.update_owned(9, lambda v: v * 3) == 1
    check()
    assert a.nbytes > 10
    b.put("o2", b"p")
    assert b.pop("o1") == b"o" * 30
    check()
    a.clear()
    check()
    assert len(b) == 0 and b.nbytes == 0
    # a third connection opening the store later finds the same totals (no second row)
    c: SharedStore[bytes] = SharedStore(path, "r", 4, 0, max_bytes=3000)
    c.put("k", b"k")
    check()
    assert c._db.execute("SELECT COUNT(*) FROM s_r_sum").fetchone()[0] == 1


def test_shared_store_ttl(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr("llmsim.state.shared.time.time", lambda: now[0])
    s: SharedStore[int] = SharedStore(str(tmp_path / "t.sqlite3"), "x", 10, 5.0)
    s.put("k", 1)
    now[0] += 4.9
    assert s.get("k") == 1
    now[0] += 0.2
    assert s.get("k") is None and len(s) == 0


def test_shared_store_put_purges_at_most_once_a_second(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """put() drops expired entries at most every PURGE_EVERY_S (a worker publishing a
    thousand responses a second spent 4% of its time purging); readers never see an expired
    entry meanwhile, and the next purge drops them."""
    from llmsim.state import shared

    now, mono = [1000.0], [50.0]
    monkeypatch.setattr("llmsim.state.shared.time.time", lambda: now[0])
    monkeypatch.setattr("llmsim.state.shared.time.monotonic", lambda: mono[0])
    s: SharedStore[int] = SharedStore(str(tmp_path / "t.sqlite3"), "x", 100, 5.0)
    purges = []
    real = s.purge

    def counted() -> None:
        purges.append(mono[0])
        real()

    monkeypatch.setattr(s, "purge", counted)
    s.put("old", 1)
    now[0] += 6.0  # "old" has expired
    for i in range(20):
        s.put(f"k{i}", i)
    assert purges == [50.0]  # the first put's; none in the burst
    rows = s._db.execute(f"SELECT COUNT(*) FROM {s.table}").fetchone()[0]
    assert rows == 21  # "old" is still in the table …
    assert not s.has("old") and "old" not in s  # … unseen
    now[0] += 6.0  # the twenty expire too
    s.put("new", 0)
    assert purges == [50.0]
    assert s.get("k3") is None  # a reader never returns an expired entry (and purges)
    assert list(s.values()) == [0]
    mono[0] += shared.PURGE_EVERY_S
    now[0] += 6.0
    s.put("k20", 20)
    assert purges[-1] == 50.0 + shared.PURGE_EVERY_S  # a second later, put purges again
    assert s._db.execute(f"SELECT k FROM {s.table}").fetchall() == [("k20",)]


def test_open_store_picks_by_mode(tmp_path: Path) -> None:
    assert isinstance(open_store("r", 5, 0, time.monotonic), BoundedStore)
    assert isinstance(open_store("r", 5, 0, time.monotonic, state_dir=str(tmp_path)),
                      SharedStore)


def test_shared_store_waits_for_the_write_lock_in_small_steps(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Another process holding the write lock: a put waits (sqlite's own busy handler is off,
    the store tries again in sub-millisecond steps) and succeeds once the lock is released;
    past LOCK_WAIT_S it raises "database is locked" as sqlite would; other errors are not
    retried."""
    import sqlite3

    from llmsim.state import shared

    path = str(tmp_path / "t.sqlite3")
    s: SharedStore[int] = SharedStore(path, "x", 10, 0.0)
    assert s._db.execute("PRAGMA busy_timeout").fetchone()[0] == 0
    other = shared.connect(path)
    other.execute("BEGIN IMMEDIATE")
    sleeps: list[float] = []
    real_sleep = shared.time.sleep

    def sleep(d: float) -> None:
        sleeps.append(d)
        if len(sleeps) == 5:
            other.execute("ROLLBACK")  # the other process lets go
        real_sleep(d)

    monkeypatch.setattr("llmsim.state.shared.time.sleep", sleep)
    s.put("k", 1)
    assert s.get("k") == 1
    assert len(sleeps) == 5 and max(sleeps) <= 0.001 and sleeps == sorted(sleeps)

    other.execute("BEGIN IMMEDIATE")  # held for good now
    monkeypatch.setattr(shared, "LOCK_WAIT_S", 0.02)
    with pytest.raises(sqlite3.OperationalError, match="locked"):
        s.put("k2", 2)
    other.execute("ROLLBACK")
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        s._db.execute("SELECT * FROM nowhere")
    other.close()
