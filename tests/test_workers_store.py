"""Stored responses across ``--workers``: two in-process Apps share one state directory (as two
worker processes do), so every follow-up can be sent to the *other* worker deterministically.

Background work runs on FakeClocks (virtual time); a small subprocess test checks the same
rule through real ``python -m llmsim --workers 2`` processes and the kernel's spreading.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmsim import Config
from llmsim.api.responses.state import Snapshot, state
from llmsim.app import App
from llmsim.messages import RawResponse, Request
from llmsim.streaming.clock import FakeClock
from tests.test_workers import children, wait_for, workers2  # noqa: F401 (fixture)

Apps = tuple[App, App]


def _req(body: dict[str, Any] | None = None, method: str = "POST", path: str = "/v1/responses",
         query: dict[str, list[str]] | None = None) -> Request:
    return Request(method, path, query or {}, {}, orjson.dumps(body) if body else b"", "req_t")


def _apps(tmp_path: Path, **cfg: Any) -> Apps:
    kw: dict[str, Any] = {"latency": "instant", "seed": 7, **cfg}
    d = str(tmp_path)
    return (App(Config(**kw), clock=FakeClock(), state_dir=d),
            App(Config(**kw), clock=FakeClock(), state_dir=d))


@pytest.fixture
def two(tmp_path: Path) -> Iterator[Apps]:
    yield _apps(tmp_path)


async def _call(app: App, req: Request) -> Any:
    res = await app.dispatch(req)
    assert not isinstance(res, RawResponse), res.body
    return res


async def _error(app: App, req: Request) -> tuple[int, dict[str, Any]]:
    res = await app.dispatch(req)
    assert isinstance(res, RawResponse)
    return res.status, orjson.loads(res.body)["error"]


async def _status(app: App, req: Request) -> int:
    res = await app.dispatch(req)
    return res.status  # type: ignore[no-any-return,union-attr]


def _create(text: str, prev: str | None = None, **kw: Any) -> Request:
    body: dict[str, Any] = {"model": "gpt-4o", "input": text, **kw}
    if prev:
        body["previous_response_id"] = prev
    return _req(body)


async def test_single_process_publishes_nothing() -> None:
    app = App(Config(latency="instant"), clock=FakeClock())
    assert state(app).shared is None


async def test_every_follow_up_works_on_the_other_worker(two: Apps) -> None:
    a, b = two
    r1 = (await _call(a, _create("first turn"))).data
    rid = r1["id"]
    assert state(b).store.get(rid) is None  # b never ran it
    got = (await _call(b, _req(None, "GET", f"/v1/responses/{rid}"))).data
    assert got == r1
    items = (await _call(b, _req(None, "GET", f"/v1/responses/{rid}/input_items",
                                 {"order": ["asc"]}))).data
    assert [i["content"][0]["text"] for i in items["data"]] == ["first turn"]

    # chains hop between workers and give the same context as one process would
    r2 = (await _call(b, _create("second", rid))).data
    r3 = (await _call(a, _create("third", r2["id"]))).data
    # the context of r3 is exactly the whole chain, whichever worker ran each turn
    one = App(Config(latency="instant", seed=7), clock=FakeClock())
    chain = [{"role": "user", "content": "first turn"}, *r1["output"],
             {"role": "user", "content": "second"}, *r2["output"],
             {"role": "user", "content": "third"}]
    count = (await _call(one, _req({"model": "gpt-4o", "input": chain},
                                   path="/v1/responses/input_tokens"))).data
    assert r3["usage"]["input_tokens"] == count["input_tokens"]
    assert r3["usage"]["input_tokens"] > r2["usage"]["input_tokens"] > \
        r1["usage"]["input_tokens"]
    # a terminal response replays its whole stream from any worker, identically
    q = {"stream": ["true"]}
    on_a = (await _call(a, _req(None, "GET", f"/v1/responses/{rid}", q))).stream.drain()
    on_b = (await _call(b, _req(None, "GET", f"/v1/responses/{rid}", q))).stream.drain()
    assert on_a == on_b and on_b[-1][0] == "response.completed"

    # delete on b removes a's response everywhere (a drops its own record on next lookup)
    assert (await _call(b, _req(None, "DELETE", f"/v1/responses/{rid}"))).data["deleted"]
    assert await _status(a, _req(None, "GET", f"/v1/responses/{rid}")) == 404
    assert await _status(b, _req(None, "GET", f"/v1/responses/{rid}")) == 404
    assert state(a).store.get(rid) is None
    assert await _status(a, _req(None, "DELETE", f"/v1/responses/{rid}")) == 404
    assert await _status(b, _req(None, "DELETE", f"/v1/responses/{rid}")) == 404
    st, err = await _error(a, _create("again", rid))
    assert st == 400 and err["code"] == "previous_response_not_found"
    # deleting on the owner removes the published copy too
    assert (await _call(a, _req(None, "DELETE", f"/v1/responses/{r3['id']}"))).data["deleted"]
    assert await _status(b, _req(None, "GET", f"/v1/responses/{r3['id']}")) == 404


async def test_unknown_ids_leave_no_tombstone(two: Apps) -> None:
    a, b = two
    for i in range(5):
        assert await _status(b, _req(None, "DELETE", f"/v1/responses/resp_nope{i}")) == 404
    sh = state(b).shared
    assert sh is not None and len(sh.control) == 0
    assert await _status(b, _req(None, "GET", "/v1/responses/resp_nope0")) == 404


async def test_store_false_is_not_published(two: Apps) -> None:
    a, b = two
    rid = (await _call(a, _create("x", store=False))).data["id"]
    assert await _status(b, _req(None, "GET", f"/v1/responses/{rid}")) == 404


async def test_shared_snapshots_keep_the_store_bound(tmp_path: Path) -> None:
    from llmsim.config import ResponsesConfig

    a, b = _apps(tmp_path, responses=ResponsesConfig(store_max_entries=3))
    ids = [(await _call(a if i % 2 else b, _create(f"t{i}"))).data["id"] for i in range(6)]
    sh = state(a).shared
    assert sh is not None and len(sh.snapshots) == 3
    assert await _status(b, _req(None, "GET", f"/v1/responses/{ids[1]}")) == 404  # a's, evicted
    assert await _status(b, _req(None, "GET", f"/v1/responses/{ids[5]}")) == 200


async def _running(a: App, rid: str) -> Any:
    rec = state(a).store.get(rid)
    while rec.emitted < 8:
        await asyncio.sleep(0)
    return rec


async def test_background_seen_cancelled_and_deleted_from_the_other_worker(
        tmp_path: Path) -> None:
    a, b = _apps(tmp_path, latency="realistic", ttft_ms=100, itl_ms=10)
    bg = {"background": True, "max_output_tokens": 400}
    rid = (await _call(a, _create("x", **bg))).data["id"]
    rec = await _running(a, rid)
    # b sees the snapshot published when it started (the owner's status); it cannot follow
    # it live
    got = (await _call(b, _req(None, "GET", f"/v1/responses/{rid}"))).data
    assert got["status"] == rec.status == "in_progress" and got["background"] is True
    st, err = await _error(b, _req(None, "GET", f"/v1/responses/{rid}", {"stream": ["true"]}))
    assert st == 400 and err["param"] == "stream"
    # cancel on b: a's watch picks it up and publishes the cancelled response
    out = (await _call(b, _req(None, "POST", f"/v1/responses/{rid}/cancel"))).data
    assert out["status"] == "cancelled" and rec.status == "cancelled"
    assert out == rec.response()
    assert state(a).active_background == 0 and a.clock.pending == 0
    replay = (await _call(b, _req(None, "GET", f"/v1/responses/{rid}",
                                  {"stream": ["true"]}))).stream.drain()
    assert len(replay) == rec.cancel_seq  # stops where the cancel did, as on the owner

    # delete on b stops a running response on a
    rid2 = (await _call(a, _create("y", **bg))).data["id"]
    rec2 = await _running(a, rid2)
    assert (await _call(b, _req(None, "DELETE", f"/v1/responses/{rid2}"))).data["deleted"]
    while rec2.pump is not None:
        await asyncio.sleep(0)
    assert rec2.status == "cancelled" and state(a).store.get(rid2) is None
    assert a.clock.pending == 0
    assert await _status(a, _req(None, "GET", f"/v1/responses/{rid2}")) == 404
    assert await _status(b, _req(None, "GET", f"/v1/responses/{rid2}")) == 404


async def test_cancel_of_an_orphaned_background_response(tmp_path: Path) -> None:
    """The owner died (its watch never runs): the cancel publishes it cancelled itself."""
    a, b = _apps(tmp_path, latency="realistic", ttft_ms=100, itl_ms=10)
    rid = (await _call(a, _create("x", background=True))).data["id"]
    sh = state(b).shared
    assert sh is not None
    snap = sh.get(rid)
    assert isinstance(snap, Snapshot) and not snap.terminal
    for r in state(a).store.values():  # simulate the owner's death: nothing runs any more
        r.shared = None
        if r.pump is not None:
            r.pump.cancel()
    out = (await _call(b, _req(None, "POST", f"/v1/responses/{rid}/cancel"))).data
    assert out["status"] == "cancelled"
    assert (await _call(b, _req(None, "GET", f"/v1/responses/{rid}"))).data["status"] == \
        "cancelled"


async def test_foreground_errors_keep_their_shape_remotely(two: Apps) -> None:
    a, b = two
    rid = (await _call(a, _create("x"))).data["id"]
    st, err = await _error(b, _req(None, "POST", f"/v1/responses/{rid}/cancel"))
    assert st == 400 and "background=true" in err["message"]


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


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_stored_responses_through_two_worker_processes(workers2) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    proc, port, _ = workers2
    wait_for(lambda: len(children(proc.pid)) == 2, what="2 workers")
    ids = []
    for i in range(8):  # one fresh connection per request: the kernel spreads them
        st, r = _http(port, "POST", "/v1/responses", {"model": "gpt-4o", "input": f"t{i}"})
        assert st == 200, r
        ids.append(r["id"])
    for rid in ids:
        st, r = _http(port, "GET", f"/v1/responses/{rid}")
        assert st == 200 and r["id"] == rid
        st, r = _http(port, "GET", f"/v1/responses/{rid}/input_items")
        assert st == 200 and len(r["data"]) == 1
        st, r = _http(port, "POST", "/v1/responses",
                      {"model": "gpt-4o", "input": "more", "previous_response_id": rid})
        assert st == 200, r
        st, r = _http(port, "DELETE", f"/v1/responses/{rid}")
        assert st == 200 and r["deleted"] is True
        for _ in range(3):
            st, _r = _http(port, "GET", f"/v1/responses/{rid}")
            assert st == 404
