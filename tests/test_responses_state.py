"""Stored responses, bounds, background work, resumable streams and the WebSocket branch.

Every bounded store has a test that the bound holds. Background/timing tests run on the
FakeClock (virtual time) or on long fixed latencies that only need "not finished yet"."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any

import openai
import orjson
import pytest

from llmsim import Config
from llmsim.api.responses.state import ItemIndex, input_bytes, record_bytes, state
from llmsim.app import App
from llmsim.config import ResponsesConfig
from llmsim.messages import JSONResponse, RawResponse, Request, StreamResponse
from llmsim.state.store import BoundedStore
from llmsim.streaming.clock import FakeClock
from llmsim.streaming.flow import Pump
from tests import rawhttp
from tests.responses_sse import wire_events
from tests.sinks import FrameSink


def sdk(srv: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0,
                         _strict_response_validation=True)


def _req(body: dict[str, Any], method: str = "POST", path: str = "/v1/responses",
         query: dict[str, list[str]] | None = None, **kw: Any) -> Request:
    return Request(method, path, query or {}, {}, orjson.dumps(body) if body else b"",
                   "req_t", **kw)


# --- the store itself ----------------------------------------------------------------------

def test_bounded_store_entry_cap_and_ttl():
    now = [0.0]
    evicted: list[str] = []
    s: BoundedStore[int] = BoundedStore(3, 10.0, lambda: now[0],
                                        on_evict=lambda k, v: evicted.append(k))
    for i in range(5):
        s.put(f"k{i}", i)
    assert len(s) == 3 and s.get("k0") is None and s.get("k4") == 4
    assert evicted == ["k0", "k1"]
    now[0] = 5.0
    s.put("k5", 5)
    now[0] = 10.5  # k2..k4 were born at 0 → expired; k5 (born at 5) lives
    assert s.get("k3") is None and s.get("k5") == 5 and len(s) == 1
    assert s.pop("k5") == 5 and len(s) == 0
    off: BoundedStore[int] = BoundedStore(0, 0, lambda: 0.0)
    assert off.put("x", 1) is False and off.get("x") is None


def test_bounded_store_put_purges_and_evicts_by_itself():
    # put drops expired entries and holds the byte bound with no other call between
    now = [0.0]
    s: BoundedStore[int] = BoundedStore(10, 10.0, lambda: now[0], max_bytes=100)
    s.put("a", 1, nbytes=40)
    s.put("b", 2, nbytes=40)
    now[0] = 5.0
    assert s.put("c", 3, nbytes=10) and s.bytes == 90  # nothing due: all kept
    now[0] = 10.0  # a and b (born at 0) have expired
    assert s.put("d", 4, nbytes=10) and s.bytes == 20
    assert s.put("e", 5, nbytes=90) and s.bytes == 100  # c (oldest) goes for the bound
    assert s.get("c") is None and s.get("d") == 4 and s.get("e") == 5
    s.extra_bytes = 95  # owner-kept bytes: the new entry cannot fit beside them
    assert s.put("f", 6, nbytes=10) is False and s.bytes == 0


def test_stored_responses_bound_holds(make_server):
    """responses.store_max_entries: only the newest N responses stay retrievable."""
    s = make_server(responses=ResponsesConfig(store_max_entries=3))
    c = sdk(s)
    ids = [c.responses.create(model="gpt-4o", input=f"r{i}").id for i in range(6)]
    for rid in ids[:3]:
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(rid)
    assert [c.responses.retrieve(r).id for r in ids[3:]] == ids[3:]
    assert len(state(s.app).store) == 3


async def test_stored_responses_ttl_on_fake_clock():
    clock = FakeClock()
    app = App(Config(latency="instant", responses=ResponsesConfig(store_ttl_s=60)),
              clock=clock)
    res = await app.dispatch(_req({"model": "gpt-4o", "input": "x"}))
    rid = res.data["id"]
    get = _req({}, "GET", f"/v1/responses/{rid}")
    assert (await app.dispatch(get)).data["id"] == rid
    clock.advance(61)
    got = await app.dispatch(_req({}, "GET", f"/v1/responses/{rid}"))
    assert isinstance(got, RawResponse) and got.status == 404


def test_item_index_sweep_keeps_only_stored_items():
    """The item index sweeps entries of responses that left the store (evicted or
    expired), and keeps every stored response's items findable through the sweeps."""
    now = [0.0]
    store: BoundedStore[Any] = BoundedStore(8, 100.0, lambda: now[0])
    index = ItemIndex()

    class Rec:
        def __init__(self, i: int) -> None:
            self.id = f"resp_{i}"
            self.input_items = [{"id": f"in_{i}", "type": "message"}]
            self.out = SimpleNamespace(items=[SimpleNamespace(id=f"out_{i}")])

        def output_items(self) -> list[dict[str, Any]]:
            return [{"id": f"out_{self.id[5:]}", "type": "message"}]

    for i in range(41):
        if i == 30:
            now[0] = 150.0  # the first 30 expired (born at 0)
        if i == 40:
            index._sweep_at = 0  # (this add sweeps)
        rec = Rec(i)
        store.put(rec.id, rec)
        index.add(rec, store)  # type: ignore[arg-type]
    assert sorted(store.keys()) == sorted(f"resp_{i}" for i in range(33, 41))
    assert len(index) == 16  # swept: the stored responses' items only
    for i in range(33, 41):
        assert index.find(f"in_{i}", store) == {"id": f"in_{i}", "type": "message"}
        assert index.find(f"out_{i}", store) == {"id": f"out_{i}", "type": "message"}
    assert index.find("in_3", store) is None and index.find("out_32", store) is None


async def test_a_resent_body_is_measured_as_the_first():
    """A create whose body the memo kept reuses the first create's measure of its input
    (``input_bytes``): every record of those bytes is accounted exactly as if measured anew,
    and a different body is measured on its own."""
    app = App(Config(latency="instant", seed=3), clock=FakeClock())
    st = state(app)
    bodies = [{"model": "gpt-4o", "input": "x", "max_output_tokens": 16},
              {"model": "gpt-4o", "input": [{"role": "user", "content": "y" * 3000}],
               "max_output_tokens": 16, "instructions": "be brief"}]
    seen = []
    for body in bodies * 3:
        req = _req(body)
        res = await app.dispatch(req)
        rec = st.store.get(res.data["id"])
        assert rec is not None
        assert rec.nbytes == record_bytes(rec, req.body)
        seen.append(input_bytes(rec, req.body))
    assert seen[0] == seen[2] == seen[4] != seen[1] == seen[3] == seen[5]


def test_store_disabled(make_server):
    c = sdk(make_server(responses=ResponsesConfig(store_max_entries=0)))
    r = c.responses.create(model="gpt-4o", input="x")
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model="gpt-4o", input="x", background=True)
    assert ei.value.param == "background"


def test_conversation_bounds_hold(make_server):
    """conversations_max_entries and conversation_max_items both hold."""
    s = make_server(responses=ResponsesConfig(conversations_max_entries=2,
                                              conversation_max_items=4))
    c = sdk(s)
    convs = [c.conversations.create() for _ in range(3)]
    with pytest.raises(openai.NotFoundError):
        c.conversations.retrieve(convs[0].id)
    cid = convs[2].id
    for i in range(4):
        c.responses.create(model="gpt-4o", input=f"turn {i}", conversation=cid)
    items = c.conversations.items.list(cid, order="asc", limit=100).data
    assert len(items) == 4  # 8 items were added, the oldest 4 dropped
    assert items[-1].role == "assistant"


def test_chain_depth_bound_holds(make_server):
    """responses.max_chain_depth: a long previous_response_id chain keeps only the newest
    turns as context (and releases the older records)."""
    s = make_server(responses=ResponsesConfig(max_chain_depth=2), output_tokens_sigma=0,
                    output_tokens_mean=20)
    c = sdk(s)
    prev = None
    used = []
    ids = []
    for i in range(5):
        r = c.responses.create(model="gpt-4o", input=f"turn {i}", previous_response_id=prev)
        used.append(r.usage.input_tokens)
        prev = r.id
        ids.append(r.id)
    assert used[1] < used[2]
    assert used[2] == used[3] == used[4]  # context no longer grows beyond 2 earlier turns
    st = state(s.app)
    assert st.store.get(ids[2]).parent is None  # older turns are let go


def test_background_limit(make_server):
    """responses.background_max_active: more concurrent background responses → 429."""
    s = make_server(responses=ResponsesConfig(background_max_active=1),
                    latency="realistic", ttft_ms=60_000, itl_ms=10)
    c = sdk(s)
    b1 = c.responses.create(model="gpt-4o", input="x", background=True)
    with pytest.raises(openai.RateLimitError):
        c.responses.create(model="gpt-4o", input="y", background=True)
    c.responses.cancel(b1.id)
    assert c.responses.create(model="gpt-4o", input="z", background=True).status == "queued"


# --- background ----------------------------------------------------------------------------

def test_background_polling(srv):
    """background: returns at once (queued), then completes; polling shows it."""
    c = sdk(srv)
    b = c.responses.create(model="o3", input="long task", background=True,
                           reasoning={"summary": "auto"})
    assert b.status == "queued" and b.background is True and b.output == []
    deadline = time.monotonic() + 5
    while (r := c.responses.retrieve(b.id)).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert r.status == "completed" and [o.type for o in r.output] == ["reasoning", "message"]
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    # cancelling a finished background response returns it unchanged (the real API's 200)
    again = c.responses.cancel(b.id)
    assert again.status == "completed" and again.id == b.id and again.output == r.output
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model="gpt-4o", input="x", background=True, store=False)
    assert ei.value.param == "background"


def test_background_cancel_and_delete(make_server):
    """cancel stops a running background response (status cancelled, nothing after);
    delete stops one too; foreground responses cannot be cancelled."""
    s = make_server(latency="realistic", ttft_ms=60_000, itl_ms=10)
    c = sdk(s)
    b = c.responses.create(model="gpt-4o", input="x", background=True)
    got = c.responses.retrieve(b.id)
    assert got.status in ("queued", "in_progress")
    cancelled = c.responses.cancel(b.id)
    assert cancelled.status == "cancelled" and cancelled.id == b.id
    assert c.responses.retrieve(b.id).status == "cancelled"
    assert c.responses.cancel(b.id).status == "cancelled"  # idempotent
    assert state(s.app).active_background == 0
    b2 = c.responses.create(model="gpt-4o", input="y", background=True)
    c.responses.delete(b2.id)
    assert state(s.app).active_background == 0
    fast = make_server()
    fc = sdk(fast)
    r = fc.responses.create(model="gpt-4o", input="x")
    with pytest.raises(openai.BadRequestError):
        fc.responses.cancel(r.id)


def test_background_stream_and_resume_with_sdk(srv):
    """background + stream: the SDK resumes with responses.stream(response_id=,
    starting_after=N) and gets exactly the events after N (same sequence numbers)."""
    c = sdk(srv)
    with c.responses.stream(model="gpt-4o", input="x", background=True) as s:
        events = list(s)
        final = s.get_final_response()
    assert events[0].response.status == "queued"
    assert [e.type for e in events[:3]] == ["response.created", "response.queued",
                                           "response.in_progress"]
    with c.responses.stream(response_id=final.id, starting_after=5) as s2:
        tail = list(s2)
        again = s2.get_final_response()
    assert [e.sequence_number for e in tail] == [e.sequence_number for e in events[6:]]
    assert again.output_text == final.output_text
    raw = list(c.responses.retrieve(final.id, stream=True))  # full replay
    assert [e.type for e in raw] == [e.type for e in events]


def _event(data: Any) -> dict[str, Any]:
    """A plan event's payload as the client reads it (token deltas come pre-rendered)."""
    return orjson.loads(data) if type(data) is bytes else data


def _pump(app: App, res: StreamResponse) -> tuple[list[tuple[float, int, str]],
                                                  asyncio.Future[str]]:
    seen: list[tuple[float, int, str]] = []
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    pump = Pump(res.stream, app.clock, lambda t, d: b"", FrameSink(),
                on_done=lambda r: done.done() or done.set_result(r),
                observer=lambda t, d, now: seen.append((now, _event(d)["sequence_number"], t)))
    pump.start()
    return seen, done


async def test_resume_follows_the_live_schedule():
    """A stream resumed mid-way sends what was already out at once, then every later event
    at the same moment as the original stream (FakeClock)."""
    clock = FakeClock()
    app = App(Config(latency="realistic", ttft_ms=500, itl_ms=20, seed=5), clock=clock)
    res = await app.dispatch(_req({"model": "gpt-4o", "input": "x", "stream": True,
                                   "background": True}))
    assert isinstance(res, StreamResponse)
    first, p1 = _pump(app, res)
    rid = None
    while len(first) < 15:
        await asyncio.sleep(0)
    rid = state(app).store.values().__next__().id
    t_join = clock.now()
    res2 = await app.dispatch(_req({}, "GET", f"/v1/responses/{rid}",
                                   {"stream": ["true"], "starting_after": ["3"]}))
    assert isinstance(res2, StreamResponse)
    second, p2 = _pump(app, res2)
    await p1
    await p2
    assert [s for _, s, _ in second] == list(range(4, len(first)))
    orig = {s: t for t, s, _ in first}
    for t, s, _ in second:
        assert t == pytest.approx(max(orig[s], t_join)), s
    assert second[-1][2] == "response.completed"


async def test_background_cancel_on_fake_clock_stops_generation():
    clock = FakeClock()
    app = App(Config(latency="realistic", ttft_ms=100, itl_ms=10, seed=1), clock=clock)
    res = await app.dispatch(_req({"model": "gpt-4o", "input": "x", "background": True}))
    assert isinstance(res, JSONResponse) and res.data["status"] == "queued"
    rid = res.data["id"]
    rec = state(app).store.get(rid)
    while rec.emitted < 8:  # created, queued, in_progress, item, part, deltas...
        await asyncio.sleep(0)
    assert rec.status == "in_progress"
    got = await app.dispatch(_req({}, "POST", f"/v1/responses/{rid}/cancel"))
    assert got.data["status"] == "cancelled"
    n = rec.emitted
    t = clock.now()
    for _ in range(50):
        await asyncio.sleep(0)
    assert rec.emitted == n and clock.pending == 0 and clock.now() == t
    replay = await app.dispatch(_req({}, "GET", f"/v1/responses/{rid}",
                                     {"stream": ["true"]}))
    assert len(replay.stream.drain()) == n  # the replay stops where the cancel did


# --- the WebSocket branch of the contract (dispatch with transport="ws") --------------------

class FakeWS:
    def __init__(self) -> None:
        self.cache: dict[str, Any] = {}

    def cached_response(self, rid: str) -> Any:
        return self.cache.get(rid)

    def cache_response(self, record: Any) -> None:
        self.cache = {record.id: record}  # R10.5: the most recent completed response


async def test_ws_branch_contract():
    app = App(Config(latency="instant", seed=9))
    ws = FakeWS()

    async def create(body: dict[str, Any]) -> Any:
        return await app.dispatch(_req(body, transport="ws", context=ws))

    res = await create({"model": "gpt-4o", "input": "hi", "store": False})
    assert isinstance(res, StreamResponse) and res.stream.dialect.endpoint == "responses"
    evs = wire_events(res.stream)
    rid = evs[0][1]["response"]["id"]
    assert evs[-1][0] == "response.completed" and list(ws.cache) == [rid]
    # store=false responses chain through the connection cache only
    res2 = await create({"model": "gpt-4o", "input": "more", "previous_response_id": rid})
    assert isinstance(res2, StreamResponse)
    evs2 = wire_events(res2.stream)
    assert evs2[-1][1]["response"]["usage"]["input_tokens"] > \
        evs[-1][1]["response"]["usage"]["input_tokens"]
    http = await app.dispatch(_req({"model": "gpt-4o", "input": "x",
                                    "previous_response_id": rid}))
    assert isinstance(http, RawResponse) and http.status == 400
    err = orjson.loads(http.body)["error"]
    assert err["code"] == "previous_response_not_found"
    assert err["param"] == "previous_response_id"
    # background is rejected over WS; generate: false is a warm-up
    bg = await create({"model": "gpt-4o", "input": "x", "background": True})
    assert isinstance(bg, RawResponse) and orjson.loads(bg.body)["error"]["param"] == \
        "background"
    warm = await create({"model": "gpt-4o", "input": "prepare", "generate": False})
    wevs = wire_events(warm.stream)
    assert [t for t, _ in wevs] == ["response.created", "response.completed"]
    done = wevs[-1][1]["response"]
    assert done["output"] == [] and done["usage"]["output_tokens"] == 0
    wid = done["id"]
    assert wid in ws.cache
    chained = await create({"model": "gpt-4o", "input": "go", "previous_response_id": wid})
    cevs = wire_events(chained.stream)
    assert cevs[-1][1]["response"]["usage"]["input_tokens"] > done["usage"]["input_tokens"]
    # generate is a WS-only field
    http2 = await app.dispatch(_req({"model": "gpt-4o", "input": "x", "generate": False}))
    assert isinstance(http2, RawResponse) and http2.status == 400


def test_raw_get_stream_query_validation(srv):
    c = sdk(srv)
    r = c.responses.create(model="gpt-4o", input="x")
    bad = rawhttp.request(srv.url, "GET",
                          f"/v1/responses/{r.id}?stream=true&starting_after=abc")
    assert bad.status == 400 and orjson.loads(bad.body)["error"]["param"] == "starting_after"
    nf = rawhttp.request(srv.url, "GET", "/v1/responses/resp_missing")
    assert nf.status == 404
    d = rawhttp.request(srv.url, "DELETE", f"/v1/responses/{r.id}")
    assert d.json() == {"id": r.id, "object": "response", "deleted": True}


async def test_shutdown_stops_background_work():
    """Closing the server cancels running background responses: no timer is left behind."""
    from llmsim import Server

    srv = Server(Config(port=0, latency="realistic", ttft_ms=60_000, itl_ms=10, quiet=True))
    await srv.start()
    res = await srv.app.dispatch(_req({"model": "gpt-4o", "input": "x", "background": True}))
    rec = state(srv.app).store.get(res.data["id"])
    for _ in range(5):
        await asyncio.sleep(0)
    assert rec.status == "in_progress" and srv.app.clock.pending >= 1
    await srv.close(grace=0.1)
    assert rec.status == "cancelled" and state(srv.app).active_background == 0
    assert srv.app.clock.pending == 0


def test_client_disconnect_mid_stream_cancels_and_releases(make_server):
    """A foreground stream whose client leaves stops generating: the stored response is
    cancelled, and no timer or stream gauge is left behind."""
    import socket

    s = make_server(latency="realistic", ttft_ms=0, itl_ms=20)
    body = orjson.dumps({"model": "gpt-4o", "input": "x", "stream": True})
    sock = rawhttp.connect(s.url)
    sock.sendall(b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: %d\r\n\r\n%s" % (len(body), body))
    buf = b""
    while b"response.output_text.delta" not in buf:
        buf += sock.recv(65536)
    rid = orjson.loads(buf.split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"]["id"]
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()
    c = sdk(s)
    deadline = time.monotonic() + 5
    while c.responses.retrieve(rid).status == "in_progress":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert c.responses.retrieve(rid).status == "cancelled"
    assert s.call(lambda: s.app.clock.pending) == 0


def test_logprobs_work_is_bounded(srv):
    """max_output_tokens × (1 + top_logprobs) has the same per-request bound as chat."""
    from . import rawhttp

    r = rawhttp.request(srv.url, "POST", "/v1/responses", {
        "model": "gpt-4.1", "input": "hi", "max_output_tokens": 32768, "top_logprobs": 20,
        "include": ["message.output_text.logprobs"]})
    assert r.status == 400
    err = r.json()["error"]
    assert err["code"] == "request_too_large" and err["param"] == "max_output_tokens"
