"""Byte floods (issue 10, item 3): stored responses, previous_response_id chains, conversations
and unfinished WebSocket messages are bounded in bytes, not only in count.

Token-free fields (``reasoning.encrypted_content``, ``input_image`` URLs) cost no tokens, so
only a byte budget stops them: every test sends more than the budget and asserts the bound
holds, the oldest goes first, what is gone answers the normal 404, and counters return to 0.
Memory is checked with tracemalloc (the server's Python allocations), not RSS, which the
allocator keeps after frees."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from typing import Any

import openai
import orjson
import pytest
from wsproto.connection import Connection, ConnectionType
from wsproto.events import CloseConnection, TextMessage

from llmsim import Config
from llmsim.api.responses.state import CONVERSATION_BYTES, Record, state
from llmsim.app import App
from llmsim.config import ConfigError, ResponsesConfig, WebSocketConfig, load_config
from llmsim.messages import JSONResponse, Request
from llmsim.state.store import BoundedStore, approx_bytes, json_bytes
from llmsim.streaming.clock import FakeClock
from llmsim.transport.ws import FRAGMENT_OVERHEAD as FO
from llmsim.transport.ws import state as ws_state

from .memtransport import connect, mem_server
from .test_websocket_raw import RawWS, handshake, wait_for

KIB = 1024
MIB = 1024 * 1024
MODEL = "gpt-4o-mini"


def sdk(srv: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0,
                         _strict_response_validation=True)


def blob_input(i: int, n: int) -> list[dict[str, Any]]:
    """A turn carrying ``n`` token-free bytes (an opaque reasoning blob) and a short prompt."""
    return [{"type": "reasoning", "summary": [], "encrypted_content": chr(65 + i % 26) * n},
            {"role": "user", "content": f"turn {i}"}]


def _req(body: dict[str, Any] | None, method: str = "POST",
         path: str = "/v1/responses") -> Request:
    return Request(method, path, {}, {}, orjson.dumps(body) if body else b"", "req_t")


async def _create(app: App, body: dict[str, Any]) -> dict[str, Any]:
    res = await app.dispatch(_req(body))
    assert isinstance(res, JSONResponse), getattr(res, "body", res)
    return res.data  # type: ignore[no-any-return]


def _accounting(app: App) -> tuple[int, int, int, int]:
    """(stored bytes, pinned bytes) as accounted, and as recomputed from the records the
    store keeps reachable (stored ones and their parents)."""
    st = state(app)
    stored = list(st.store.values())
    ids = {r.id for r in stored}
    pinned: dict[str, Record] = {}
    for r in stored:
        p = r.parent
        while type(p) is Record:
            if p.id not in ids:
                pinned[p.id] = p
            p = p.parent
    return (st.store.bytes, st.store.extra_bytes, sum(r.nbytes for r in stored),
            sum(r.nbytes for r in pinned.values()))


# --- the store itself ----------------------------------------------------------------------

def test_bounded_store_byte_budget() -> None:
    removed: list[str] = []
    s: BoundedStore[str] = BoundedStore(100, 0, lambda: 0.0, max_bytes=1000,
                                        on_remove=lambda k, v: removed.append(k))
    for i in range(5):
        assert s.put(f"k{i}", "v", nbytes=300)
    assert s.bytes == 900 and [k for k in ("k0", "k1") if s.get(k)] == []
    assert removed == ["k0", "k1"] and s.evicted == 2
    assert s.put("huge", "v", nbytes=1001) is False and s.get("huge") is None  # alone too big
    s.resize("k2", 700)  # grows in place: the others go, k2 (the oldest) stays
    assert s.get("k2") and s.bytes <= 1000 and s.get("k3") is None
    assert s.pop("k2") == "v" and removed[-1] == "k2"
    s.clear()
    assert s.bytes == 0 and len(s) == 0


def test_size_estimates_bound_the_parsed_json() -> None:
    """json_bytes is an upper bound of the parsed size for structure-heavy JSON (where the
    JSON length alone is 20x too small), and exact-ish for big strings."""
    for obj in ([{} for _ in range(20000)], [[1.5, "ab"] for _ in range(20000)],
                [{"type": "message", "content": [{"type": "input_text", "text": "hi"}]}] * 5000,
                ["A" * 1_000_000]):
        data = orjson.dumps(obj)
        parsed = orjson.loads(data)
        real = approx_bytes(parsed, 1 << 30)
        assert real is not None
        assert real <= json_bytes(data) <= 5 * real + 4096
    assert approx_bytes([{} for _ in range(100)], limit=50) is None  # gives up, bounded


def test_byte_bounds_are_validated() -> None:
    with pytest.raises(ConfigError, match="responses.store_max_bytes"):
        load_config(env={"LLMSIM_RESPONSES_STORE_MAX_BYTES": "1000"})
    with pytest.raises(ConfigError, match="websocket.max_pending_bytes"):
        load_config(env={"LLMSIM_WEBSOCKET_MAX_PENDING_BYTES": "-1"})
    cfg = load_config(env={"LLMSIM_RESPONSES_CONVERSATION_MAX_BYTES": "0",
                           "LLMSIM_WEBSOCKET_FRAGMENT_TIMEOUT_S": "5"})
    assert cfg.responses.conversation_max_bytes == 0 and cfg.websocket.fragment_timeout_s == 5


# --- stored responses ----------------------------------------------------------------------

def test_store_flood_evicts_oldest_and_stays_under_budget(make_server: Any) -> None:
    budget = 1 * MIB
    s = make_server(responses=ResponsesConfig(store_max_bytes=budget))
    c = sdk(s)
    st = state(s.app)
    ids = []
    for i in range(12):  # 12 × 200 KB of token-free input into a 1 MiB budget
        r = c.responses.create(model=MODEL, input=blob_input(i, 200_000),  # type: ignore[arg-type]
                               max_output_tokens=16)
        assert r.status == "incomplete"  # answered (cut by max_output_tokens)
        ids.append(r.id)
        assert st.store.bytes + st.store.extra_bytes <= budget
    kept = len(st.store)
    assert 2 <= kept <= 5, kept  # entries are ~210 KB: the count cap (1024) never bit
    assert st.store.evicted == 12 - kept
    for rid in ids[:-kept]:  # evicted: the ordinary 404 of an unknown id
        with pytest.raises(openai.NotFoundError) as ei:
            c.responses.retrieve(rid)
        assert ei.value.body["param"] == "response_id"  # type: ignore[index]
    assert [c.responses.retrieve(r).id for r in ids[-kept:]] == ids[-kept:]
    assert s.app.stats.active_requests == 0


def test_response_too_big_to_store(make_server: Any) -> None:
    """Alone bigger than store_max_bytes: a foreground response is answered and not kept (a
    later GET is the 404 of any evicted response); background needs storage → 400."""
    s = make_server(responses=ResponsesConfig(store_max_bytes=1 * MIB))
    c = sdk(s)
    st = state(s.app)
    big = blob_input(0, 1_500_000)
    r = c.responses.create(model=MODEL, input=big, max_output_tokens=16)  # type: ignore[arg-type]
    assert r.status == "incomplete" and r.output_text
    with pytest.raises(openai.NotFoundError):
        c.responses.retrieve(r.id)
    events = list(c.responses.create(model=MODEL, input=big,  # type: ignore[arg-type]
                                     max_output_tokens=16, stream=True))
    assert events[-1].type == "response.incomplete"
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model=MODEL, input=big, background=True)  # type: ignore[arg-type]
    err = ei.value.body
    assert err["param"] == "background" and err["code"] == "request_too_large"  # type: ignore[index]
    assert "responses.store_max_bytes" in err["message"]  # type: ignore[index]
    assert st.unstored == 3 and st.store.bytes == 0 and st.store.extra_bytes == 0
    assert st.active_background == 0
    small = c.responses.create(model=MODEL, input="hi", max_output_tokens=16)
    assert c.responses.retrieve(small.id).id == small.id  # the server still stores and answers


async def test_chain_keeps_evicted_turns_and_counts_them() -> None:
    """A stored response keeps its previous_response_id chain alive after the store evicted
    the older turns: those bytes are counted (extra_bytes), each record once, and the chain
    forgets turns beyond chain_max_bytes. Deleting everything brings the counts back to 0."""
    app = App(Config(latency="instant", quiet=True, responses=ResponsesConfig(
        store_max_entries=3, store_max_bytes=4 * MIB, chain_max_bytes=1 * MIB)))
    prev = None
    ids = []
    for i in range(14):
        data = await _create(app, {"model": MODEL, "input": blob_input(i, 150_000),
                                   "max_output_tokens": 16, "previous_response_id": prev})
        prev = data["id"]
        ids.append(prev)
        stored, pinned, stored_real, pinned_real = _accounting(app)
        assert (stored, pinned) == (stored_real, pinned_real)
        assert stored + pinned <= 4 * MIB
        assert stored_real + pinned_real <= 1 * MIB + 200_000  # the chain bound holds
    assert pinned > 0  # evicted turns still held by the chain are counted
    st = state(app)
    head = st.store.get(ids[-1])
    depth = 0
    r: Any = head
    while r is not None:
        depth += 1
        r = r.parent
    assert 4 <= depth < 14  # older turns were forgotten (chain_max_bytes), newer ones kept
    # a fork from a turn in the middle is counted once, not twice
    await _create(app, {"model": MODEL, "input": "fork", "previous_response_id": ids[-2]})
    assert _accounting(app)[:2] == _accounting(app)[2:]
    for rid in list(ids) + [x.id for x in list(st.store.values())]:
        await app.dispatch(_req(None, "DELETE", f"/v1/responses/{rid}"))
    assert len(st.store) == 0
    assert (st.store.bytes, st.store.extra_bytes) == (0, 0)


@pytest.mark.parametrize("shape", ["blob", "many_items", "logprobs"])
async def test_store_flood_memory_under_budget(shape: str) -> None:
    """The stated bound: a flood of 4x the store's byte budget grows the server's Python heap
    by at most the budget + 1 MiB, and the accounted size is not below what is really held
    (the estimate is honest) nor wildly above it."""
    budget = 2 * MIB
    # (the prompt cache has a budget of its own, flooded in test_realism.py)
    app = App(Config(latency="instant", quiet=True, seed=3, prompt_cache_bytes=0,
                     responses=ResponsesConfig(store_max_bytes=budget)))

    def body(i: int) -> dict[str, Any]:
        b: dict[str, Any] = {"model": MODEL, "max_output_tokens": 100}
        if shape == "blob":
            b["input"] = blob_input(i, 256_000)
        elif shape == "many_items":  # small objects: ~20x their JSON size in memory
            b["input"] = [{"role": "user", "content": f"{i} {j}"} for j in range(600)]
        else:  # logprobs: ~340 bytes per alternative
            b.update(input=f"turn {i}", top_logprobs=20,
                     include=["message.output_text.logprobs"])
        return b

    await _create(app, body(-1))  # warm caches (tokenizer, vocabularies)
    st = state(app)
    st.store.clear()
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        i = 0
        sent = 0
        while sent < 4 * budget:  # bytes really held per response, as measured
            sent += {"blob": 256_000, "many_items": 600 * 650, "logprobs": 100 * 21 * 340}[shape]
            await _create(app, body(i))
            i += 1
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    accounted = st.store.bytes + st.store.extra_bytes
    assert st.store.evicted > 0 and accounted <= budget
    assert grown <= budget + MIB, (shape, grown)
    assert grown <= accounted * 1.1 + 128 * KIB, (shape, grown, accounted)  # honest
    assert accounted <= 4 * grown + 128 * KIB, (shape, grown, accounted)  # not absurd


# --- conversations -------------------------------------------------------------------------

def _item(i: int, n: int) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": f"{i}:" + "x" * n}


def test_conversation_byte_bound_drops_oldest_items(make_server: Any) -> None:
    cap = 512 * KIB
    s = make_server(responses=ResponsesConfig(conversation_max_bytes=cap))
    c = sdk(s)
    st = state(s.app)
    conv = c.conversations.create()
    for i in range(10):
        c.conversations.items.create(conv.id, items=[_item(i, 100_000)])  # type: ignore[list-item]
    items = c.conversations.items.list(conv.id, order="asc", limit=100).data
    assert 3 <= len(items) < 10
    assert items[-1].content[0].text.startswith("9:")  # type: ignore[union-attr]
    held = st.conversations.get(conv.id)
    assert held is not None and held.nbytes <= cap + CONVERSATION_BYTES
    assert st.conversations.bytes == held.nbytes
    # an item bigger than a whole conversation: refused, naming it; nothing changes
    with pytest.raises(openai.BadRequestError) as ei:
        c.conversations.items.create(conv.id, items=[_item(0, 10), _item(1, 600_000)])  # type: ignore[list-item]
    assert ei.value.body["param"] == "items[1]"  # type: ignore[index]
    assert ei.value.body["code"] == "request_too_large"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as ei:
        c.conversations.create(items=[_item(0, 600_000)])  # type: ignore[list-item]
    assert ei.value.body["param"] == "items[0]"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError) as ei:  # a create that would join it
        c.responses.create(model=MODEL, conversation=conv.id,
                           input=blob_input(0, 600_000))  # type: ignore[arg-type]
    assert ei.value.body["param"] == "input[0]"  # type: ignore[index]
    assert len(c.conversations.items.list(conv.id, limit=100).data) == len(items)
    # a turn through responses.create joins it and the bound still holds
    r = c.responses.create(model=MODEL, conversation=conv.id, input=blob_input(1, 200_000),
                           max_output_tokens=16)  # type: ignore[arg-type]
    assert r.status == "incomplete"
    assert held.nbytes <= cap + CONVERSATION_BYTES and st.conversations.bytes == held.nbytes
    assert held.items[-1]["role"] == "assistant"


async def test_stored_response_does_not_keep_a_deleted_conversation() -> None:
    app = App(Config(latency="instant", quiet=True))
    await _create(app, {"model": MODEL, "input": "warm"})
    tracemalloc.start()  # (it only sees the frees of what it saw allocated)
    try:
        conv = await app.dispatch(_req({"items": [_item(0, 1_000_000)]},
                                        path="/v1/conversations"))
        cid = conv.data["id"]  # type: ignore[union-attr]
        data = await _create(app, {"model": MODEL, "input": "hi", "conversation": cid})
        rec = state(app).store.get(data["id"])
        assert rec is not None and rec.terminal and rec.conversation is None
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        await app.dispatch(_req(None, "DELETE", f"/v1/conversations/{cid}"))
        gc.collect()
        freed = before - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    # (a 1 MB item: the allocator and first-run caches move tens of KB either way)
    assert freed >= 950_000 and state(app).conversations.bytes == 0


def test_conversations_total_budget_evicts_oldest(make_server: Any) -> None:
    total = 1 * MIB
    s = make_server(responses=ResponsesConfig(conversations_max_bytes=total,
                                              conversation_max_bytes=512 * KIB))
    c = sdk(s)
    st = state(s.app)
    convs = []
    for i in range(8):  # ~330 KB each into 1 MiB
        convs.append(c.conversations.create(items=[_item(i, 300_000)]).id)  # type: ignore[list-item]
        assert st.conversations.bytes <= total
    alive = [cid for cid in convs if st.conversations.get(cid) is not None]
    assert len(alive) == 3 and alive == convs[-3:]  # the oldest went first
    with pytest.raises(openai.NotFoundError):
        c.conversations.retrieve(convs[0])
    # growing the oldest live conversation evicts another one, never the one written to
    oldest = alive[0]
    c.conversations.items.create(oldest, items=[_item(99, 100_000)])  # type: ignore[list-item]
    assert st.conversations.get(oldest) is not None
    assert st.conversations.bytes <= total
    assert st.conversations.get(alive[1]) is None
    for cid in convs:
        try:
            c.conversations.delete(cid)
        except openai.NotFoundError:
            pass
    assert st.conversations.bytes == 0


# --- WebSocket: unfinished messages --------------------------------------------------------

async def _upgrade(server: Any) -> tuple[Any, Any, Connection]:
    proto, tr = connect(server)
    proto.data_received(handshake())
    assert await _settle(lambda: b"\r\n\r\n" in tr.out)
    head, _, rest = tr.drain_client().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ")
    client = Connection(ConnectionType.CLIENT)
    if rest:
        client.receive_data(rest)
    return proto, tr, client


def _events(tr: Any, client: Connection) -> list[Any]:
    client.receive_data(tr.drain_client())
    return list(client.events())


def _close_of(evs: list[Any]) -> CloseConnection | None:
    return next((e for e in evs if isinstance(e, CloseConnection)), None)


def _frag(client: Connection, data: str, last: bool = False) -> bytes:
    return client.send(TextMessage(data=data, message_finished=last))


async def _settle(cond: Any, passes: int = 400) -> bool:
    for _ in range(passes):
        if cond():
            return True
        await asyncio.sleep(0)
    return bool(cond())


async def test_unfinished_message_times_out_1008_on_fake_clock() -> None:
    clock = FakeClock()
    server = mem_server(clock=clock, websocket=WebSocketConfig(fragment_timeout_s=30))
    wst = ws_state(server.app)
    proto, tr, client = await _upgrade(server)
    # a message completed in time: no close, its timer is cancelled, its bytes released
    msg = orjson.dumps({"type": "response.create", "model": MODEL, "input": "hi",
                        "max_output_tokens": 16}).decode()
    armed = clock.pending  # the connection time limit
    proto.data_received(_frag(client, msg[:20]))
    assert wst.pending_bytes == 20 + FO and clock.pending == armed + 1
    proto.data_received(_frag(client, msg[20:], last=True))
    assert wst.pending_bytes == 0
    assert await _settle(lambda: proto.upgraded.mode.lanes.active == 0)
    evs = _events(tr, client)
    assert _close_of(evs) is None and any(isinstance(e, TextMessage) for e in evs)
    # never finished: closed 1008 once fragment_timeout_s of virtual time has passed
    t0 = clock.now()
    proto.data_received(_frag(client, '{"type": "response.cre'))
    assert wst.pending_bytes == 22 + FO
    closed: list[Any] = []
    assert await _settle(lambda: closed.extend(_events(tr, client)) or _close_of(closed))
    ev = _close_of(closed)
    assert ev is not None and ev.code == 1008 and "30 s" in (ev.reason or "")
    assert clock.now() - t0 >= 30
    assert wst.pending_bytes == 0
    proto.connection_lost(None)
    assert server.app.stats.active_websockets == 0 and clock.pending == 0


async def test_pending_budget_across_connections_closes_1013() -> None:
    server = mem_server(websocket=WebSocketConfig(max_pending_bytes=100_000))
    wst = ws_state(server.app)
    a, atr, ac = await _upgrade(server)
    b, btr, bc = await _upgrade(server)
    create = orjson.dumps({"type": "response.create", "model": MODEL, "max_output_tokens": 16,
                           "input": blob_input(0, 60_000)}).decode()
    a.data_received(_frag(ac, create[:60_000]))
    assert wst.pending_bytes == 60_000 + FO
    b.data_received(_frag(bc, "x" * 30_000))
    assert wst.pending_bytes == 90_000 + 2 * FO
    b.data_received(_frag(bc, "x" * 30_000))  # would pass 100,000 across the connections
    ev = _close_of(_events(btr, bc))
    assert ev is not None and ev.code == 1013 and "retry" in (ev.reason or "")
    assert wst.pending_bytes == 60_000 + FO  # b's share released at once; a keeps its own
    a.data_received(_frag(ac, create[60_000:], last=True))
    assert wst.pending_bytes == 0
    types: list[str] = []

    def done() -> bool:
        types.extend(orjson.loads(e.data)["type"] for e in _events(atr, ac)
                     if isinstance(e, TextMessage))
        return "response.incomplete" in types

    assert await _settle(done), types
    for p in (a, b):
        p.connection_lost(None)
    assert wst.pending_bytes == 0 and server.app.stats.active_websockets == 0


async def test_message_cap_counts_fragments_as_they_arrive() -> None:
    server = mem_server(websocket=WebSocketConfig(max_message_bytes=1000))
    wst = ws_state(server.app)
    proto, tr, client = await _upgrade(server)
    proto.data_received(_frag(client, "y" * 400) + _frag(client, "y" * 400))
    assert wst.pending_bytes == 800 + 2 * FO and _close_of(_events(tr, client)) is None
    proto.data_received(_frag(client, "y" * 400))  # never finished, already too big
    ev = _close_of(_events(tr, client))
    assert ev is not None and ev.code == 1009
    assert wst.pending_bytes == 0
    proto.connection_lost(None)
    assert server.app.stats.active_websockets == 0 and server.app.clock.pending == 0


async def test_pending_bytes_released_on_close_frame_and_disconnect() -> None:
    server = mem_server()
    wst = ws_state(server.app)
    a, atr, ac = await _upgrade(server)
    b, _, bc = await _upgrade(server)
    a.data_received(_frag(ac, "z" * 5000))
    b.data_received(_frag(bc, "z" * 7000))
    # two fragment timers, two connection time limits
    assert wst.pending_bytes == 12_000 + 2 * FO and server.app.clock.pending == 4
    a.data_received(ac.send(CloseConnection(code=1000)))  # the client closes mid-message
    assert wst.pending_bytes == 7000 + FO
    assert _close_of(_events(atr, ac)) is not None
    b.connection_lost(None)  # the client vanishes mid-message
    assert wst.pending_bytes == 0
    a.connection_lost(None)
    assert server.app.stats.active_websockets == 0 and server.app.clock.pending == 0


async def test_tiny_fragments_count_their_memory() -> None:
    """1-byte fragments cost ~60 bytes each held: the budget counts that, not the payload."""
    server = mem_server(websocket=WebSocketConfig(max_pending_bytes=64 * KIB))
    wst = ws_state(server.app)
    proto, tr, client = await _upgrade(server)
    sent = 0
    while _close_of(_events(tr, client)) is None and sent < 5000:
        proto.data_received(b"".join(_frag(client, "t") for _ in range(100)))
        sent += 100
        assert wst.pending_bytes <= 64 * KIB
    assert sent < 2000  # closed (1013) after ~1000 bytes of payload
    assert wst.pending_bytes == 0
    proto.connection_lost(None)
    assert server.app.stats.active_websockets == 0


def test_pending_budget_over_real_sockets(make_server: Any) -> None:
    """Tier 3: two real connections, the second one's fragments pass the server-wide budget."""
    srv = make_server(latency="instant", websocket=WebSocketConfig(max_pending_bytes=64 * KIB))
    a = RawWS(srv.url)
    b = RawWS(srv.url)
    a.send(TextMessage(data="q" * 40_000, message_finished=False))
    assert wait_for(lambda: ws_state(srv.app).pending_bytes == 40_000 + FO)
    b.send(TextMessage(data="q" * 40_000, message_finished=False))
    ev = b.next_event()
    assert isinstance(ev, CloseConnection) and ev.code == 1013
    b.close()
    a.send(TextMessage(data="}", message_finished=True))  # a finishes: answered, not closed
    err = orjson.loads(a.next_event())
    assert err["type"] == "error" and err["error"]["code"] == "invalid_json"
    a.close()
    assert wait_for(lambda: ws_state(srv.app).pending_bytes == 0
                    and srv.app.stats.active_websockets == 0)
