"""The validated-body memo (llmsim.api.validate.BodyMemo): a repeated chat body skips parsing
and counting, answers exactly as a fresh one would, and the memo stays within its bounds."""

from __future__ import annotations

from typing import Any

import h11
import orjson
import pytest

from llmsim.api import chat
from llmsim.api.validate import BodyMemo
from tests import rawhttp
from tests.conftest import cfg

MSGS = [{"role": "user", "content": "Hi"}]


def _body(**kw: object) -> dict[str, object]:
    return {"model": "gpt-4o-mini", "messages": MSGS, "max_tokens": 8, **kw}


def test_memo_bounds_and_eviction_order():
    m = BodyMemo(max_body=10, budget=25, max_entries=3)
    conf = object()
    assert m.get(b"a", conf) is None  # first sight of this config: it owns the memo now
    m.put(b"x" * 11, conf, 1)  # over max_body: not kept
    assert len(m) == 0 and m.get(b"x" * 11, conf) is None
    for i, k in enumerate((b"a" * 10, b"b" * 10)):
        m.put(k, conf, i)
    assert m.bytes == 20 and m.get(b"a" * 10, conf) == 0
    m.put(b"c" * 10, conf, 2)  # 30 bytes > 25: the oldest goes
    assert m.get(b"a" * 10, conf) is None and m.get(b"b" * 10, conf) == 1
    assert m.bytes == 20 and len(m) == 2
    for k in (b"d", b"e", b"f"):  # entry cap: never more than 3
        m.put(k, conf, k)
    assert len(m) == 3 and m.bytes <= 25
    m.put(bytearray(b"g"), conf, "g")  # a bytearray is kept as bytes (hashable)
    assert m.get(b"g", conf) == "g"
    other = object()
    assert m.get(b"g", other) is None and len(m) == 0 and m.bytes == 0  # new config: emptied
    m.put(b"g", conf, "stale")  # a put under the old config is dropped
    assert len(m) == 0


def _chat(srv, body: dict[str, object]) -> tuple[int, dict]:
    r = rawhttp.request(srv.url, "POST", "/v1/chat/completions", orjson.dumps(body))
    return r.status, r.json()


def test_repeated_body_answers_like_a_fresh_one(make_server):
    srv = make_server(seed=7)
    memo = srv.app.memos[chat.MEMO]
    raw = _body(n=2)
    st1, first = _chat(srv, raw)
    assert st1 == 200 and len(memo) == 1
    st2, again = _chat(srv, raw)  # a hit: same seeded text, token counts, finish
    assert st2 == 200 and len(memo) == 1
    for k in ("choices", "usage", "model"):
        assert again[k] == first[k]
    assert again["id"] != first["id"]  # ids stay unique
    # a fresh server (no memo) gives the same answer: the memo changes nothing seen
    other = make_server(seed=7)
    _st, fresh = _chat(other, raw)
    assert fresh["choices"] == first["choices"] and fresh["usage"] == first["usage"]
    # another body is another entry, not the first one's answer
    _st, longer = _chat(srv, _body(max_tokens=3))
    assert longer["usage"]["completion_tokens"] == 3 and len(memo) == 2


@pytest.mark.parametrize("bad, param", [
    (_body(max_tokens=0), "max_tokens"),
    (_body(temperature=5), "temperature"),
    ({"model": "gpt-4o-mini", "messages": []}, "messages"),
])
def test_refused_body_is_never_kept(make_server, bad, param):
    srv = make_server()
    memo = srv.app.memos[chat.MEMO]
    for _ in range(2):  # refused the second time too: validation is not skipped
        st, err = _chat(srv, bad)
        assert st == 400 and err["error"]["param"] == param
    assert len(memo) == 0


def test_memo_follows_the_config(make_server):
    """The memo belongs to one config: a swapped config (tests do it) empties it, and the
    next answer follows the new config (here its seed, which the memo keeps per body)."""
    srv = make_server(seed=1)
    _st, one = _chat(srv, _body())
    app = srv.app
    app.config = cfg(seed=2)
    _st, two = _chat(srv, _body())
    assert two["choices"][0]["message"]["content"] != one["choices"][0]["message"]["content"]
    assert len(app.memos[chat.MEMO]) == 1  # the old config's entry went with it
    app.config = cfg(seed=1)
    _st, back = _chat(srv, _body())
    assert back["choices"] == one["choices"]


def _flood(srv, memo: BodyMemo, path: str, body_of: Any, check: Any) -> None:
    """Send ``MAX_ENTRIES + 40`` distinct bodies (``body_of(i)``) over one connection,
    ``check(i, response)`` each answer, then: the memo's entry and byte bounds held, and it
    kept the newest, not nothing."""
    sock = rawhttp.connect(srv.url)
    conn = h11.Connection(h11.CLIENT)
    try:
        for i in range(BodyMemo.MAX_ENTRIES + 40):
            r = rawhttp.request(srv.url, "POST", path, orjson.dumps(body_of(i)), sock=sock,
                                conn=conn)
            check(i, r)
    finally:
        sock.close()
    assert len(memo) <= BodyMemo.MAX_ENTRIES and memo.bytes <= BodyMemo.BUDGET
    assert len(memo) > BodyMemo.MAX_ENTRIES // 2  # (it kept the newest, not nothing)


def test_many_distinct_bodies_stay_within_the_memo_bounds(make_server):
    """A client sending ever new bodies cannot grow the memo: the entry and byte bounds hold
    (the oldest go first) and every answer is still right."""
    srv = make_server()

    def check(i: int, r: Any) -> None:
        assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 1 + i % 5

    _flood(srv, srv.app.memos[chat.MEMO], "/v1/chat/completions",
           lambda i: _body(max_tokens=1 + i % 5, user=f"u{i}"), check)


# -- Responses ------------------------------------------------------------------------------

def _resp(srv, body: dict[str, object], path: str = "/v1/responses") -> tuple[int, dict]:
    r = rawhttp.request(srv.url, "POST", path, orjson.dumps(body))
    return r.status, r.json()


def _input_items(srv, rid: str) -> list[dict]:
    r = rawhttp.request(srv.url, "GET", f"/v1/responses/{rid}/input_items?order=asc", b"")
    assert r.status == 200
    return r.json()["data"]  # type: ignore[no-any-return]


RESP_INPUT = [{"role": "user", "content": "Hi"},  # no id: the server issues one
              {"type": "message", "role": "assistant", "id": "msg_client_given",
               "content": [{"type": "output_text", "text": "Hello"}]},
              {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
              {"type": "function_call_output", "call_id": "call_1", "output": "ok"},
              {"role": "user", "content": "and now?"}]


def test_a_repeated_responses_body_answers_like_a_fresh_one_with_its_own_item_ids(make_server):
    """A stateless create seen before skips validation and counting (responses.MEMO) but
    each response gets its own input items: the ids the server issued are new every time,
    the client's ids are kept, and the items are not shared between stored responses."""
    from llmsim.api import responses
    srv = make_server(seed=3)
    memo = srv.app.memos[responses.MEMO]
    body = {"model": "gpt-4o-mini", "input": RESP_INPUT, "max_output_tokens": 16}
    st1, one = _resp(srv, body)
    assert st1 == 200 and len(memo) == 1
    st2, two = _resp(srv, body)  # a hit
    assert st2 == 200 and len(memo) == 1
    assert two["output_text"] == one["output_text"] and two["usage"] == one["usage"]
    a, b = _input_items(srv, one["id"]), _input_items(srv, two["id"])
    assert [i["type"] for i in a] == [i["type"] for i in b] and len(a) == len(RESP_INPUT)
    for k, (x, y) in enumerate(zip(a, b, strict=True)):
        if "id" in RESP_INPUT[k]:
            assert x["id"] == y["id"] == RESP_INPUT[k]["id"]
        else:
            assert x["id"] != y["id"] and x["id"][:3] == y["id"][:3]
            assert {**x, "id": None} == {**y, "id": None}
    assert len({i["id"] for i in a + b}) == len(a) + len(b) - 1  # only the client's id twice
    app_state = responses.state(srv.app)
    r1, r2 = app_state.store.get(one["id"]), app_state.store.get(two["id"])
    assert all(x is not y for x, y in zip(r1.input_items, r2.input_items, strict=True))
    # a fresh server (no memo) answers the same
    _st, fresh = _resp(make_server(seed=3), body)
    assert fresh["output_text"] == one["output_text"] and fresh["usage"] == one["usage"]
    # a string input: one message, its id issued anew each time
    _st, s1 = _resp(srv, {"model": "gpt-4o-mini", "input": "Hi", "max_output_tokens": 16})
    _st, s2 = _resp(srv, {"model": "gpt-4o-mini", "input": "Hi", "max_output_tokens": 16})
    assert _input_items(srv, s1["id"])[0]["id"] != _input_items(srv, s2["id"])[0]["id"]
    assert len(memo) == 2


def test_a_responses_body_that_reads_stored_state_is_never_kept(make_server):
    """previous_response_id and item references depend on what is stored (and are refused
    once it is gone): they are validated every time, never answered from the memo."""
    from llmsim.api import responses
    for kind in ("previous_response_id", "item_reference"):
        srv = make_server()
        memo = srv.app.memos[responses.MEMO]
        _st, first = _resp(srv, {"model": "gpt-4o-mini", "input": "Hi",
                                 "max_output_tokens": 16, "store": True})
        assert len(memo) == 1
        body: dict[str, object] = {"model": "gpt-4o-mini", "max_output_tokens": 16,
                                   "store": False}
        if kind == "previous_response_id":
            body.update(input="more", previous_response_id=first["id"])
        else:
            body["input"] = [{"type": "item_reference", "id": first["output"][0]["id"]}]
        for _ in range(2):
            st, _r = _resp(srv, body)
            assert st == 200
        assert len(memo) == 1, kind
        rawhttp.request(srv.url, "DELETE", f"/v1/responses/{first['id']}", b"")
        st, err = _resp(srv, body)  # the state is gone: refused, not answered from a memo
        assert st in (400, 404), (kind, err)


def test_a_refused_responses_body_is_refused_again_and_counting_is_not_kept(make_server):
    from llmsim.api import responses
    srv = make_server()
    memo = srv.app.memos[responses.MEMO]
    bad = {"model": "gpt-4o-mini", "input": "Hi", "max_output_tokens": 0}
    for _ in range(2):
        st, err = _resp(srv, bad)
        assert st == 400 and err["error"]["param"] == "max_output_tokens"
    body = {"model": "gpt-4o-mini", "input": "Hi"}
    for _ in range(2):  # input_tokens counts every time (not a create)
        st, r = _resp(srv, body, "/v1/responses/input_tokens")
        assert st == 200 and r["input_tokens"] > 0
    assert len(memo) == 0


async def test_the_responses_memo_is_per_transport(make_server):
    """The same bytes validate differently over a WebSocket (``generate`` is a WebSocket
    field): a body kept for one transport is never the other's answer."""
    from llmsim.api import responses
    from llmsim.api.pipeline import _prepare
    from llmsim.errors import APIError
    from llmsim.messages import Request
    srv = make_server()
    app = srv.app
    raw = orjson.dumps({"model": "gpt-4o-mini", "input": "Hi", "generate": False})

    def req(transport: str) -> Request:
        return Request(method="POST", path="/v1/responses", query={}, headers={}, body=raw,
                       request_id="req_1", transport=transport)

    p = (await _prepare(req("ws"), app, responses.FAMILY))[0].info
    assert p.rr.generate is False
    assert len(app.memos[responses.WS_MEMO]) == 1
    again = (await _prepare(req("ws"), app, responses.FAMILY))[0].info  # a hit
    assert again.rr is p.rr and again.input_items[0]["id"] != p.input_items[0]["id"]
    with pytest.raises(APIError) as e:  # over HTTP: refused, as without any memo
        await _prepare(req("http"), app, responses.FAMILY)
    assert e.value.status == 400 and "generate" in str(e.value.to_dict())
    assert len(app.memos[responses.MEMO]) == 0


def test_many_distinct_responses_bodies_stay_within_the_memo_bounds(make_server):
    """Ever new Responses bodies cannot grow the Responses memo past BodyMemo's bounds, and
    every answer is still right."""
    from llmsim.api import responses
    srv = make_server()

    def check(i: int, r: Any) -> None:
        assert r.status == 200 and r.json()["usage"]["output_tokens"] <= 16

    _flood(srv, srv.app.memos[responses.MEMO], "/v1/responses",
           lambda i: {"model": "gpt-4o-mini", "input": f"hi {i}", "max_output_tokens": 16,
                      "store": False}, check)
