"""Hostile use of the ``--workers`` shared store (issue 10, item 5).

* Long ``previous_response_id`` chains of big turns: every snapshot used to copy the whole
  chain (quadratic bytes: 40 turns of 1 MiB made an 861 MB database). A snapshot now holds its
  own turn and its parent's id; the store's size grows linearly and it has a byte budget
  (``responses.shared_store_max_bytes``) enforced by evicting the oldest entries.
* A worker killed with background responses running: they stayed ``queued`` for an hour and a
  GET answered differently depending on the worker. The supervisor now marks them ``failed``
  (server_error) as soon as it reaps the worker, and every worker answers the same.

Two in-process Apps sharing one state directory stand for two workers (as in
test_workers_store.py); one bounded subprocess test kills a real worker.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmsim import Config
from llmsim.api.responses.state import Record, fail_orphans, state
from llmsim.app import App
from llmsim.config import ResponsesConfig
from llmsim.messages import RawResponse, Request
from llmsim.state.shared import WAL_LIMIT_BYTES
from llmsim.streaming.clock import FakeClock
from tests.responses_sse import wire_events
from tests.test_workers import children, wait_for

KIB = 1024


def _apps(tmp_path: Path, n: int = 2, **cfg: Any) -> list[App]:
    kw: dict[str, Any] = {"latency": "instant", "seed": 7, **cfg}
    return [App(Config(**kw), clock=FakeClock(), state_dir=str(tmp_path)) for _ in range(n)]


def _req(body: dict[str, Any] | None = None, method: str = "POST", path: str = "/v1/responses",
         query: dict[str, list[str]] | None = None, **kw: Any) -> Request:
    return Request(method, path, query or {}, {}, orjson.dumps(body) if body else b"", "req_t",
                   **kw)


async def _ok(app: App, req: Request) -> Any:
    res = await app.dispatch(req)
    assert not isinstance(res, RawResponse), res.body
    return res


async def _get(app: App, rid: str) -> tuple[int, Any]:
    res = await app.dispatch(_req(None, "GET", f"/v1/responses/{rid}"))
    if isinstance(res, RawResponse):
        return res.status, orjson.loads(res.body)
    return res.status, res.data


def _turn(i: int, payload: int, prev: str | None = None) -> dict[str, Any]:
    """A turn carrying ``payload`` bytes that cost almost no tokens (an image URL)."""
    url = "data:image/png;base64," + "A" * payload + f"{i:08d}"
    body: dict[str, Any] = {"model": "gpt-4o", "max_output_tokens": 16, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": f"turn {i}"},
                                     {"type": "input_image", "image_url": url}]}]}
    if prev:
        body["previous_response_id"] = prev
    return body


async def _count(app: App, body: dict[str, Any]) -> int:
    res = await _ok(app, _req(body, path="/v1/responses/input_tokens"))
    return int(res.data["input_tokens"])


def _db_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.iterdir() if p.name.startswith("store.sqlite3"))


# ------------------------------------------------------------------------------------------
# chains reference, not copy
# ------------------------------------------------------------------------------------------

async def test_a_long_chain_is_stored_once_and_reads_the_same_on_every_worker(
        tmp_path: Path) -> None:
    depth, payload = 24, 64 * KIB
    a, b = _apps(tmp_path)
    prev = None
    turns: list[dict[str, Any]] = []
    for i in range(depth):  # alternate workers: every link is read from the shared store
        body = _turn(i, payload, prev)
        r = (await _ok((a, b)[i % 2], _req(body))).data
        turns.append({"input": body["input"], "output": r["output"]})
        prev = r["id"]
    sh = state(a).shared
    assert sh is not None
    sent = depth * payload
    # linear: each turn once (plus echo/plan overhead); the old copies were depth/2 × bigger
    assert sh.snapshots.nbytes < 1.5 * sent, (sh.snapshots.nbytes, sent)
    assert _db_bytes(tmp_path) < 3 * sent
    # the context of a follow-up is the whole chain, on either worker and in one process
    follow = {"model": "gpt-4o", "input": "next", "previous_response_id": prev}
    explicit = [it for t in turns for it in t["input"] + t["output"]]
    one = App(Config(latency="instant", seed=7), clock=FakeClock())
    want = await _count(one, {"model": "gpt-4o",
                              "input": [*explicit, {"role": "user", "content": "next"}]})
    assert await _count(a, follow) == await _count(b, follow) == want


async def test_max_chain_depth_bounds_the_chain_read_from_the_shared_store(
        tmp_path: Path) -> None:
    a, b = _apps(tmp_path, responses=ResponsesConfig(max_chain_depth=3))
    prev = None
    turns = []
    for i in range(7):
        body = _turn(i, 16, prev)
        r = (await _ok((a, b)[i % 2], _req(body))).data
        turns.append(body["input"] + r["output"])
        prev = r["id"]
    follow = {"model": "gpt-4o", "input": "next", "previous_response_id": prev}
    one = App(Config(latency="instant", seed=7), clock=FakeClock())
    want = await _count(one, {"model": "gpt-4o", "input": [
        *[it for t in turns[-3:] for it in t], {"role": "user", "content": "next"}]})
    assert await _count(a, follow) == await _count(b, follow) == want


async def test_a_deleted_turn_stays_in_the_chains_that_continue_it(tmp_path: Path) -> None:
    """As in one process (a child keeps its deleted parent's record), on every worker."""
    a, b = _apps(tmp_path)
    r1 = (await _ok(a, _req(_turn(0, 16)))).data
    r2 = (await _ok(b, _req(_turn(1, 16, r1["id"])))).data
    follow = {"model": "gpt-4o", "input": "next", "previous_response_id": r2["id"]}
    before = await _count(a, follow)
    assert (await _ok(b, _req(None, "DELETE", f"/v1/responses/{r1['id']}"))).data["deleted"]
    for app in (a, b):
        assert (await _get(app, r1["id"]))[0] == 404
        assert await _count(app, follow) == before
    st = await app.dispatch(_req(_turn(2, 16, r1["id"])))
    assert st.status == 400  # previous_response_not_found: a deleted id cannot be continued


class _WSContext:
    """The connection-local cache a WebSocket session offers the Responses handler."""

    def __init__(self) -> None:
        self.cache: dict[str, Record] = {}

    def cached_response(self, rid: str) -> Record | None:
        return self.cache.get(rid)

    def cache_response(self, rec: Record) -> None:
        self.cache[rec.id] = rec


async def test_websocket_store_false_turns_reach_the_other_worker(tmp_path: Path) -> None:
    """A store=false turn lives only in its connection's cache: the stored turn that
    continues it carries it, so the chain reads whole on the other worker."""
    a, b = _apps(tmp_path)
    ctx = _WSContext()

    async def ws(body: dict[str, Any]) -> dict[str, Any]:
        res = await _ok(a, _req(body, transport="ws", context=ctx))
        events = wire_events(res.stream)
        assert events[-1][0] in ("response.completed", "response.incomplete")
        return events[-1][1]["response"]  # type: ignore[no-any-return]

    r1 = await ws({**_turn(0, 16), "store": False})
    r2 = await ws({**_turn(1, 16, r1["id"]), "store": True})
    assert (await _get(b, r1["id"]))[0] == 404 and (await _get(b, r2["id"]))[0] == 200
    follow = {"model": "gpt-4o", "input": "next", "previous_response_id": r2["id"]}
    one = App(Config(latency="instant", seed=7), clock=FakeClock())
    want = await _count(one, {"model": "gpt-4o", "input": [
        *_turn(0, 16)["input"], *r1["output"], *_turn(1, 16)["input"], *r2["output"],
        {"role": "user", "content": "next"}]})
    assert await _count(b, follow) == await _count(a, follow) == want


# ------------------------------------------------------------------------------------------
# the byte budget
# ------------------------------------------------------------------------------------------

async def test_the_byte_budget_evicts_the_oldest_on_every_worker(tmp_path: Path) -> None:
    budget, payload = 256 * KIB, 40 * KIB
    a, b = _apps(tmp_path, responses=ResponsesConfig(shared_store_max_bytes=budget))
    sh = state(a).shared
    assert sh is not None
    ids = []
    for i in range(60):  # 2.4 MB sent, chained: eviction also cuts the chain's oldest turns
        body = _turn(i, payload, ids[-1] if ids else None)
        ids.append((await _ok((a, b)[i % 2], _req(body))).data["id"])
        assert sh.snapshots.nbytes <= budget
    assert sh.snapshots.evicted + state(b).shared.snapshots.evicted > 40  # type: ignore[union-attr]
    # the database file reuses the pages it frees; the write-ahead log is checkpointed every
    # ~4 MB and truncated to WAL_LIMIT_BYTES after
    assert (tmp_path / "store.sqlite3").stat().st_size < 4 * budget
    assert _db_bytes(tmp_path) < 4 * budget + WAL_LIMIT_BYTES
    # an evicted response is gone on every worker, its owner included (a still holds it in
    # its own memory store: the shared store decides)
    assert state(a).store.get(ids[0]) is not None
    for app in (a, b):
        assert (await _get(app, ids[0]))[0] == 404
        assert (await _get(app, ids[1]))[0] == 404
        assert (await _get(app, ids[-1]))[0] == 200
    # the chain's evicted turns are forgotten alike on both workers
    follow = {"model": "gpt-4o", "input": "x", "previous_response_id": ids[-1]}
    assert await _count(a, follow) == await _count(b, follow)
    # one entry bigger than the whole budget is still stored (the newest is always kept)
    big = (await _ok(a, _req(_turn(99, 2 * budget)))).data["id"]
    assert (await _get(b, big))[0] == 200
    assert len(sh.snapshots) == 1


def test_shared_store_max_bytes_is_a_config_option() -> None:
    from llmsim.config import ConfigError, load_config

    cfg = load_config(env={"LLMSIM_RESPONSES_SHARED_STORE_MAX_BYTES": "1000"}, overrides={})
    assert cfg.responses.shared_store_max_bytes == 1000
    assert Config().responses.shared_store_max_bytes == 256 * 1024 * 1024
    with pytest.raises(ConfigError, match="shared_store_max_bytes"):
        load_config(env={"LLMSIM_RESPONSES_SHARED_STORE_MAX_BYTES": "-1"}, overrides={})


# ------------------------------------------------------------------------------------------
# a worker that dies
# ------------------------------------------------------------------------------------------

DEAD_PID = 999_999_999  # stands for the killed worker (in-process Apps share one real pid)


async def test_a_dead_workers_background_responses_fail_on_every_worker(
        tmp_path: Path) -> None:
    from openai.types.responses import Response

    a, b = _apps(tmp_path, latency="realistic", ttft_ms=100, itl_ms=10)
    sa = state(a).shared
    assert sa is not None
    sa.owner = DEAD_PID
    bg = {"model": "gpt-4o", "input": "x", "background": True, "max_output_tokens": 400}
    first = (await _ok(a, _req(bg))).data["id"]
    running = (await _ok(a, _req(bg))).data["id"]
    rec = state(a).store.get(running)
    assert rec is not None
    while rec.emitted < 8:  # (the FakeClock runs as fast as the loop turns)
        await asyncio.sleep(0)
    mine = (await _ok(b, _req(bg))).data["id"]  # b's, alive: left alone
    for r in state(a).store.values():  # a dies: nothing it ran moves on
        r.shared = None
        if r.pump is not None:
            r.pump.cancel()
    # what the supervisor does when it reaps the dead worker
    cfg = a.config.responses
    assert fail_orphans(cfg, str(tmp_path), DEAD_PID) == 2
    assert fail_orphans(cfg, str(tmp_path), DEAD_PID) == 0
    (c,) = _apps(tmp_path, n=1)  # the restarted worker
    for rid in (first, running):
        answers = [await _get(app, rid) for app in (b, c)]
        assert answers[0] == answers[1]
        st, got = answers[0]
        assert st == 200 and got["status"] == "failed", got
        assert got["error"]["code"] == "server_error" and got["error"]["message"]
        Response.model_validate(got)  # the SDK's shape
        # a replay ends with response.failed, the same on every worker
        q = {"stream": ["true"]}
        evs = [wire_events((await _ok(app, _req(None, "GET", f"/v1/responses/{rid}",
                                                 q))).stream) for app in (b, c)]
        assert evs[0] == evs[1]
        assert [e for e, _ in evs[0]] == ["response.created", "response.queued",
                                          "response.in_progress", "response.failed"]
        assert [d["sequence_number"] for _, d in evs[0]] == [0, 1, 2, 3]
        assert evs[0][-1][1]["response"] == got
        # cancelling a failed response returns it unchanged, on any worker
        res = await b.dispatch(_req(None, "POST", f"/v1/responses/{rid}/cancel"))
        assert res.status == 200 and res.data["status"] == "failed"  # type: ignore[union-attr]
    # the survivor's running response is untouched
    assert (await _get(c, mine))[1]["status"] in ("queued", "in_progress")
    assert state(b).store.get(mine).pump is not None  # type: ignore[union-attr]
    state(b).store.get(mine).cancel()  # type: ignore[union-attr]
    assert state(b).active_background == 0


# --- through real worker processes ---------------------------------------------------------

def _http(port: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        c.request(method, path, json.dumps(body) if body is not None else None,
                  {"Content-Type": "application/json", "Connection": "close"})
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def _owners(pid: int) -> dict[str, int]:
    """Response id → owner pid of the unfinished responses in the workers' shared store."""
    for child in children(pid):
        for fd in Path(f"/proc/{child}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.endswith("/store.sqlite3"):
                db = sqlite3.connect(target, timeout=5)
                try:
                    return dict(db.execute("SELECT k, owner FROM s_responses "
                                           "WHERE owner IS NOT NULL").fetchall())
                finally:
                    db.close()
    return {}


@pytest.mark.skipif(not hasattr(os, "fork") or not os.path.isdir("/proc"),
                    reason="needs fork and /proc")
def test_kill_9_of_a_worker_every_worker_answers_failed() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmsim", "--port", "0", "--workers", "2", "--itl-ms", "50",
         "--output-tokens-min", "2000", "--shutdown-grace-s", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True, cwd=Path(__file__).resolve().parent.parent)
    lines: list[str] = []
    found: dict[str, int] = {}
    seen = threading.Event()

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
        assert seen.wait(30) and "port" in found, "".join(lines)
        port = found["port"]
        wait_for(lambda: len(children(proc.pid)) == 2, what="2 workers")
        bg = {"model": "gpt-4o", "input": "x", "background": True}  # ≥ 2000 tokens: ≥ 100 s
        ids = []
        for _ in range(6):  # fresh connections: the kernel spreads them over both workers
            st, r = _http(port, "POST", "/v1/responses", bg)
            assert st == 200, r
            ids.append(r["id"])
        owners = wait_for(lambda: (lambda o: o if len(o) == len(ids) else None)(_owners(proc.pid)),
                          timeout=10, what="owners recorded")
        victim = owners[ids[0]]
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: victim not in children(proc.pid), what="the victim reaped")
        wait_for(lambda: any("failed" in line for line in lines), timeout=10,
                 what="the supervisor's note")
        for rid in ids:
            answers = set()
            for _ in range(6):  # fresh connections reach the survivor and the restarted one
                st, r = _http(port, "GET", f"/v1/responses/{rid}")
                answers.add((st, r["status"], (r.get("error") or {}).get("code")))
            assert len(answers) == 1, (rid, answers)
            (st, status, code), = answers
            if owners[rid] == victim:
                assert (st, status, code) == (200, "failed", "server_error")
            else:
                assert st == 200 and status in ("queued", "in_progress")
        st, r = _http(port, "POST", "/v1/responses", {"model": "gpt-4o", "input": "still up",
                                                     "max_output_tokens": 16})
        assert st == 200 and r["status"] in ("completed", "incomplete")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
