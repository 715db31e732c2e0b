"""The validated-body memo (llmsim.api.validate.BodyMemo): a repeated chat body skips parsing
and counting, answers exactly as a fresh one would, and the memo stays within its bounds."""

from __future__ import annotations

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


def test_many_distinct_bodies_stay_within_the_memo_bounds(make_server):
    """A client sending ever new bodies cannot grow the memo: the entry and byte bounds hold
    (the oldest go first) and every answer is still right."""
    srv = make_server()
    memo = srv.app.memos[chat.MEMO]
    sock = rawhttp.connect(srv.url)
    conn = h11.Connection(h11.CLIENT)
    try:
        for i in range(BodyMemo.MAX_ENTRIES + 40):
            body = _body(max_tokens=1 + i % 5, user=f"u{i}")
            r = rawhttp.request(srv.url, "POST", "/v1/chat/completions", orjson.dumps(body),
                                sock=sock, conn=conn)
            assert r.status == 200 and r.json()["usage"]["completion_tokens"] == 1 + i % 5
    finally:
        sock.close()
    assert len(memo) <= BodyMemo.MAX_ENTRIES and memo.bytes <= BodyMemo.BUDGET
    assert len(memo) > BodyMemo.MAX_ENTRIES // 2  # (it kept the newest, not nothing)
