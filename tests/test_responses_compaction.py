"""Compaction: ``client.responses.compact`` and ``context_management`` on a create (HTTP and
WebSocket), judged by the openai SDK with strict validation and by the Open Responses
schema; the compaction item expands when it comes back; bounds on what is compacted."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai.types.responses.compacted_response import CompactedResponse
from openai.types.responses.response_compaction_item import ResponseCompactionItem

from llmsim.sim import compaction as blob

from . import rawhttp
from .openresponses_spec import conforms
from .responses_sse import SSE_EVENT

LONG = " ".join(["The quick brown fox jumps over the lazy dog near the river bank."] * 120)
HISTORY: list[dict[str, Any]] = [
    {"role": "user", "content": "What is the weather in Paris?"},
    {"type": "function_call", "call_id": "call_w1", "name": "get_weather",
     "arguments": '{"city": "Paris"}'},
    {"type": "function_call_output", "call_id": "call_w1", "output": LONG},
    {"role": "assistant", "content": LONG},
    {"role": "user", "content": "And tomorrow?"},
]


@pytest.fixture
def csrv(make_server: Any) -> Any:
    return make_server(output_tokens_mean=12, output_tokens_sigma=0)


@pytest.fixture
def cclient(csrv: Any) -> Any:
    with openai.OpenAI(base_url=csrv.url + "/v1", api_key="sk-test", max_retries=0,
                       _strict_response_validation=True) as c:
        yield c


def test_compact_returns_user_messages_then_compaction(cclient: Any, csrv: Any) -> None:
    # The real API answers the user messages (input_text parts) before the compaction item,
    # which the SDK's CompactedResponse.output union (assistant messages only) cannot hold
    # under strict validation: the SDK's default (lenient) client reads it; the items
    # other than user messages are validated strictly, the whole by the Open Responses schema.
    loose = cclient.with_options()
    loose._strict_response_validation = False
    raw_r = loose.responses.with_raw_response.compact(model="gpt-4o", input=HISTORY)
    r = raw_r.parse()
    assert isinstance(r, CompactedResponse) and r.object == "response.compaction"
    ResponseCompactionItem.model_validate(r.output[-1].model_dump(), strict=True)
    types = [(o.type, getattr(o, "role", None)) for o in r.output]
    assert types == [("message", "user"), ("message", "user"), ("compaction", None)]
    item = r.output[-1]
    assert item.id.startswith("cmp_") and item.encrypted_content.startswith("gAAAAA")
    # usage billed: the whole context in, the summary out
    full = cclient.responses.input_tokens.count(model="gpt-4o", input=HISTORY).input_tokens
    assert r.usage.input_tokens == full
    assert r.usage.output_tokens == blob.summary_size(full) > 0
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    raw = rawhttp.request(csrv.url, "POST", "/v1/responses/compact",
                          {"model": "gpt-4o", "input": HISTORY})
    conforms(raw.json(), "CompactResource")
    # the compacted context costs its summary, not what it replaced
    again = raw_r.http_response.json()["output"]
    small = cclient.responses.input_tokens.count(model="gpt-4o", input=again).input_tokens
    assert small < full // 4
    # the compacted function call is still known: its output may come back
    follow = cclient.responses.create(model="gpt-4o", input=[*again, {
        "type": "function_call_output", "call_id": "call_w1", "output": "sunny"}])
    assert follow.status == "completed"
    bad = cclient.responses.create  # an output for a call nobody made is still refused
    with pytest.raises(openai.BadRequestError):
        bad(model="gpt-4o", input=[*again, {"type": "function_call_output",
                                            "call_id": "call_zz", "output": "x"}])


def test_compact_a_chain(cclient: Any) -> None:
    first = cclient.responses.create(model="gpt-4o", input="Tell me about " + LONG)
    second = cclient.responses.create(model="gpt-4o", input="More.",
                                      previous_response_id=first.id)
    loose = cclient.with_options()
    loose._strict_response_validation = False
    r = loose.responses.compact(model="gpt-4o", previous_response_id=second.id)
    assert [o.type for o in r.output] == ["message", "message", "compaction"]
    assert r.usage.input_tokens >= second.usage.input_tokens


def test_compaction_item_from_elsewhere_is_refused(cclient: Any, csrv: Any) -> None:
    for enc in ("gAAAAAnotablob", "x" * 40, blob.encode([], 100)[:-8] + "AAAAAAAA"):
        r = rawhttp.request(csrv.url, "POST", "/v1/responses", {
            "model": "gpt-4o", "input": [
                {"type": "compaction", "encrypted_content": enc},
                {"type": "function_call_output", "call_id": "call_1", "output": "x"}]})
        assert r.status == 400, (enc, r.body)
        assert r.json()["error"]["param"] == "input[0].encrypted_content"


def test_compact_bounds(csrv: Any) -> None:
    r = rawhttp.request(csrv.url, "POST", "/v1/responses/compact",
                        {"model": "gpt-4o", "input": "x", "stream": True})
    assert r.status == 400 and r.json()["error"]["param"] == "stream"
    r = rawhttp.request(csrv.url, "POST", "/v1/responses/compact", {"input": "x"})
    assert r.status == 400 and r.json()["error"]["param"] == "model"
    r = rawhttp.request(csrv.url, "POST", "/v1/responses/compact",
                        {"model": "gpt-4o", "input": []})
    assert r.status == 400 and r.json()["error"]["param"] == "input"
    # a blob longer than any llmsim makes is refused before it is decoded
    huge = "gAAAAA" + "A" * (blob.MAX_BLOB_CHARS + 1)
    r = rawhttp.request(csrv.url, "POST", "/v1/responses/input_tokens", {
        "model": "gpt-4o", "input": [{"type": "compaction", "encrypted_content": huge}]})
    assert r.status in (400, 413)


def test_blob_is_bounded_and_round_trips() -> None:
    items = [{"type": "function_call_output", "call_id": f"c{i}", "output": "y" * 10_000}
             for i in range(300)]
    enc = blob.encode(items, 500)
    back = blob.expand(enc)
    assert blob.summary_tokens(enc) == 500
    assert 0 < len(back) < len(items) and back[-1] == items[-1]  # the oldest dropped
    assert len(json.dumps(back)) <= blob.MAX_ITEMS_BYTES
    # a zip bomb: the decompression stops at the budget
    import base64
    import zlib
    bomb = "gAAAAA" + base64.urlsafe_b64encode(
        blob.MAGIC + (1).to_bytes(4, "big") + zlib.compress(b"[" + b" " * (8 << 20) + b"]")
    ).decode()
    with pytest.raises(blob.BlobError):
        blob.expand(bomb)


CM = [{"type": "compaction", "compact_threshold": 1000}]


def _auto_body(**kw: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "input": HISTORY, "context_management": CM, **kw}


def test_context_management_compacts_past_threshold(cclient: Any, csrv: Any) -> None:
    r = cclient.responses.create(**_auto_body())
    assert [o.type for o in r.output] == ["compaction", "message"]
    summary = blob.summary_size(r.usage.input_tokens)
    assert r.usage.output_tokens == summary + 12
    # under the threshold: no compaction
    small = cclient.responses.create(model="gpt-4o", input="hi", context_management=CM)
    assert [o.type for o in small.output] == ["message"]
    # the chain goes on through the compaction, at the compacted size
    nxt = cclient.responses.create(model="gpt-4o", input="Thanks!", previous_response_id=r.id)
    assert nxt.status == "completed"
    assert nxt.usage.input_tokens < r.usage.input_tokens // 4
    # ... and a tool output may answer a call compacted away
    tool = cclient.responses.create(model="gpt-4o", previous_response_id=r.id, input=[
        {"type": "function_call_output", "call_id": "call_w1", "output": "rain"}])
    assert tool.status == "completed"


def test_context_management_stream_events(csrv: Any) -> None:
    r = rawhttp.request(csrv.url, "POST", "/v1/responses", _auto_body(stream=True))
    assert r.status == 200, r.body
    events = [json.loads(d) for _, d in r.sse()]
    for ev in events:
        SSE_EVENT.validate_python(ev, strict=True)
    types = [e["type"] for e in events]
    i = types.index("response.compaction.compacting")
    assert types[i - 1] == "response.output_item.added" and events[i - 1]["item"]["type"] == \
        "compaction"
    assert types[i + 1] == "response.output_item.done"
    done = events[i + 1]["item"]
    assert done["type"] == "compaction" and done["encrypted_content"].startswith("gAAAAA")
    assert events[i]["item_id"] == done["id"] and events[i]["output_index"] == 0
    assert events[-1]["response"]["output"][0] == done


def test_context_management_over_websocket(cclient: Any) -> None:
    with cclient.responses.connect() as conn:
        conn.response.create(**_auto_body())
        events = []
        while True:
            ev = json.loads(conn.recv_bytes())
            events.append(ev)
            if ev["type"] in ("response.completed", "error"):
                break
        types = [e["type"] for e in events]
        assert "response.compaction.compacting" in types, types
        rid = events[-1]["response"]["id"]
        conn.response.create(model="gpt-4o", input="Go on.", previous_response_id=rid,
                             store=False)
        while True:
            ev = json.loads(conn.recv_bytes())
            if ev["type"] in ("response.completed", "error"):
                break
        assert ev["type"] == "response.completed", ev
        assert ev["response"]["usage"]["input_tokens"] < \
            events[-1]["response"]["usage"]["input_tokens"] // 4


@pytest.mark.parametrize("cm, param", [
    ([{"type": "compaction", "compact_threshold": 10}], "context_management[0].compact_threshold"),
    ([{"type": "compaction", "compact_threshold": "9000"}],
     "context_management[0].compact_threshold"),
    ([{"type": "truncate"}], "context_management[0].type"),
    ([{"type": "compaction"}] * 5, "context_management"),
    ({"type": "compaction"}, "context_management"),
])
def test_context_management_bounds(csrv: Any, cm: Any, param: str) -> None:
    r = rawhttp.request(csrv.url, "POST", "/v1/responses",
                        {"model": "gpt-4o", "input": "x", "context_management": cm})
    assert r.status == 400 and r.json()["error"]["param"] == param, r.body


def test_one_blob_is_expanded_a_request(cclient: Any, csrv: Any, monkeypatch: Any) -> None:
    """A context with many compaction items reads only the newest (the older ones are what it
    replaced): one expansion a request however many blobs are sent; the stored input keeps
    every item."""
    calls = []
    real = blob.expand

    def counting(b: Any) -> Any:
        calls.append(1)
        return real(b)

    monkeypatch.setattr(blob, "expand", counting)
    items = [{"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"}]
    enc = blob.encode(items, 100)
    many = [{"type": "compaction", "encrypted_content": enc} for _ in range(200)]
    r = cclient.responses.create(model="gpt-4o", input=[*many, {
        "type": "function_call_output", "call_id": "call_a", "output": "x"}])
    assert r.status == "completed" and len(calls) == 1
    listed = cclient.responses.input_items.list(r.id, limit=100)
    assert len(listed.data) == 100 and listed.has_more
