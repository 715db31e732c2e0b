"""Responses SSE on the wire (raw h11 client) and its schedule (R5, R8.2), plus mid-stream
failures as ``response.failed`` (R7.1)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from llmsim import Config
from llmsim.app import App
from llmsim.errors import APIError
from llmsim.messages import Request, StreamResponse
from tests import rawhttp

# the SDK's discriminated union of every stream event (strict validation)
EVENT: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def sse(srv: Any, body: dict[str, Any], headers: list[tuple[str, str]] | None = None,
        path: str = "/v1/responses") -> list[tuple[str | None, dict[str, Any]]]:
    r = rawhttp.request(srv.url, "POST", path, {**body, "stream": True}, headers=headers)
    assert r.status == 200, r.body
    assert r.headers["content-type"].startswith("text/event-stream")
    return [(ev, orjson.loads(data)) for ev, data in r.sse()]


def check_wire(events: list[tuple[str | None, dict[str, Any]]]) -> None:
    """R5.2 event lines, R5.3 sequence numbers, R5.4 logprobs, R5.5 annotations, SDK models,
    and every .done text equal to the sum of its deltas."""
    for i, (ev, data) in enumerate(events):
        assert ev == data["type"]  # R5.2
        assert data["sequence_number"] == i  # R5.3: from 0, no gaps, shared by all events
        EVENT.validate_python(data)  # strict SDK model for this event type
        if data["type"] in ("response.output_text.delta", "response.output_text.done"):
            assert data["logprobs"] == []  # R5.4
        if data["type"] in ("response.content_part.added", "response.content_part.done"):
            assert data["part"]["annotations"] == []  # R5.5
    texts: dict[tuple[str, int], str] = {}
    for _, d in events:
        t = d["type"]
        if t.endswith(".delta"):
            key = (d["item_id"], d.get("content_index", d.get("summary_index", 0)))
            texts[key] = texts.get(key, "") + d["delta"]
        elif t in ("response.output_text.done", "response.reasoning_summary_text.done"):
            key = (d["item_id"], d.get("content_index", d.get("summary_index", 0)))
            assert texts.get(key, "") == d["text"]
        elif t == "response.function_call_arguments.done":
            assert texts.get((d["item_id"], 0), "") == d["arguments"]
    last = events[-1][1]
    if last["type"] == "response.completed":
        for item in last["response"]["output"]:
            for part in item.get("content") or ():
                assert part["annotations"] == []  # R5.5 in completed items too


def test_r5_1_r5_2_r5_3_plain_sequence(srv):
    """R5.1: the documented event sequence of a text response."""
    events = sse(srv, {"model": "gpt-4o", "input": "Tell me a story"})
    check_wire(events)
    types = [d["type"] for _, d in events]
    n = types.count("response.output_text.delta")
    assert n > 0
    assert types == (["response.created", "response.in_progress",
                      "response.output_item.added", "response.content_part.added"]
                     + ["response.output_text.delta"] * n
                     + ["response.output_text.done", "response.content_part.done",
                        "response.output_item.done", "response.completed"])
    created = events[0][1]["response"]
    assert created["status"] == "in_progress" and created["output"] == []
    done = events[-1][1]["response"]
    assert done["id"] == created["id"] and done["status"] == "completed"
    assert done["usage"]["output_tokens"] == n  # one token per delta


def test_r5_1_1_reasoning_then_message_and_openai_path(srv):
    """R5.1.1: reasoning item (output_index 0) with its summary events, then the message at
    output_index 1; the /openai/v1 path streams the same way (R1.1)."""
    events = sse(srv, {"model": "gpt-5", "input": "think",
                       "reasoning": {"effort": "low", "summary": "concise"}},
                 path="/openai/v1/responses")
    check_wire(events)
    types = [d["type"] for _, d in events]
    i_msg = next(i for i, (_, d) in enumerate(events)
                 if d["type"] == "response.output_item.added" and d["output_index"] == 1)
    head = types[:i_msg]
    assert head[:3] == ["response.created", "response.in_progress",
                        "response.output_item.added"]
    assert "response.reasoning_summary_part.added" in head
    assert "response.reasoning_summary_text.delta" in head
    assert head[-3:] == ["response.reasoning_summary_text.done",
                         "response.reasoning_summary_part.done", "response.output_item.done"]
    assert events[2][1]["item"]["type"] == "reasoning"
    assert events[i_msg][1]["item"]["type"] == "message"


def test_r5_function_call_events(srv):
    events = sse(srv, {"model": "gpt-4o", "input": "x", "tool_choice": "required",
                       "parallel_tool_calls": False,
                       "tools": [{"type": "function", "name": "f", "parameters": {
                           "type": "object", "properties": {"a": {"type": "integer"}},
                           "required": ["a"]}}]})
    check_wire(events)
    types = [d["type"] for _, d in events]
    assert "response.function_call_arguments.delta" in types
    added = events[2][1]["item"]
    assert added["type"] == "function_call" and added["arguments"] == ""
    assert added["status"] == "in_progress"


def test_custom_tool_events(srv):
    events = sse(srv, {"model": "gpt-5", "input": "x", "reasoning": {"effort": "minimal"},
                       "tool_choice": {"type": "custom", "name": "sql"},
                       "tools": [{"type": "custom", "name": "sql"}]})
    check_wire(events)
    out = events[-1][1]["response"]["output"]
    assert [o["type"] for o in out] == ["reasoning", "custom_tool_call"]
    assert "response.custom_tool_call_input.done" in [d["type"] for _, d in events]


def test_r5_incomplete_terminal(srv):
    events = sse(srv, {"model": "o3", "input": "x", "max_output_tokens": 40})
    check_wire(events)
    last = events[-1][1]
    assert last["type"] == "response.incomplete"
    assert last["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert last["response"]["usage"]["output_tokens"] == 40


def test_r7_1_fault_mid_stream_is_response_failed(srv):
    """R7.1: the shared fault system; after the first byte a failure is a terminal
    response.failed with a full Response (status failed, error {code, message})."""
    events = sse(srv, {"model": "gpt-4o", "input": "x"},
                 headers=[("x-llmsim-fault", "error-after:3")])
    check_wire(events)
    types = [d["type"] for _, d in events]
    assert types.count("response.output_text.delta") == 3
    last = events[-1][1]
    assert last["type"] == "response.failed"
    resp = last["response"]
    assert resp["status"] == "failed" and resp["error"]["code"] == "server_error"
    # the stored response says so too, and a replay ends with the same failure
    got = rawhttp.request(srv.url, "GET", f"/v1/responses/{resp['id']}")
    assert got.json()["status"] == "failed"
    replay = rawhttp.request(srv.url, "GET",
                             f"/v1/responses/{resp['id']}?stream=true&starting_after=2")
    rev = [orjson.loads(d) for _, d in replay.sse()]
    assert [d["sequence_number"] for d in rev] == list(range(3, len(events)))
    assert rev[-1]["type"] == "response.failed"


async def test_error_events_hook_builds_response_failed():
    """meta['error_events'] (used by the fault engine) gives a terminal response.failed whose
    error code is one the SDK accepts."""
    app = App(Config(latency="instant", seed=3))
    res = await app.dispatch(_req({"model": "gpt-4o", "input": "x", "stream": True}))
    assert isinstance(res, StreamResponse)
    s = res.stream
    s.begin(0.0)
    for _ in range(6):
        s.pull()
    evs = s.fail(APIError(502, "upstream went away", code="injected_fault"))
    assert [t for t, _ in evs] == ["response.failed"]
    data = evs[0][1]
    EVENT.validate_python({**data, "sequence_number": 6})
    assert data["response"]["error"] == {"code": "server_error",
                                         "message": "upstream went away"}
    assert data["response"]["status"] == "failed"
    s.close()


# --- timing (R8.2): decided before the first byte, read from the stream's deadlines --------

def _req(body: dict[str, Any], **kw: Any) -> Request:
    return Request("POST", "/v1/responses", {}, {}, orjson.dumps(body), "req_t", **kw)


async def _deadlines(app: App, body: dict[str, Any]) -> list[tuple[float, str, Any]]:
    res = await app.dispatch(_req({**body, "stream": True}))
    assert isinstance(res, StreamResponse), getattr(res, "body", res)
    s = res.stream
    s.begin(0.0)
    out = []
    while (ev := s.pull()) is not None:  # (a rendered event as its JSON)
        out.append((ev[0], ev[1], orjson.loads(ev[2]) if type(ev[2]) is bytes else ev[2]))
    return out


async def test_r8_2_timing_ttft_and_inter_token():
    """response.created at once, the first delta at TTFT, then one gap per token."""
    app = App(Config(latency="realistic", ttft_ms=200, itl_ms=10, seed=1))
    evs = await _deadlines(app, {"model": "gpt-4o", "input": "hi"})
    assert evs[0][0] == 0.0 and evs[0][1] == "response.created"
    deltas = [t for t, et, _ in evs if et == "response.output_text.delta"]
    assert deltas[0] == pytest.approx(0.200)
    gaps = [b - a for a, b in zip(deltas, deltas[1:], strict=False)]
    assert all(g == pytest.approx(0.010) for g in gaps)
    assert evs[-1][0] == pytest.approx(deltas[-1])


async def test_r8_2_reasoning_time_before_first_visible_output():
    """Reasoning tokens take time before the first visible output; the summary and the text
    then stream at the inter-token pace."""
    app = App(Config(latency="realistic", ttft_ms=100, itl_ms=5, seed=2))
    evs = await _deadlines(app, {"model": "o3", "input": "hi",
                                 "reasoning": {"summary": "auto"}})
    done = evs[-1][2]["response"]
    reasoning = done["usage"]["output_tokens_details"]["reasoning_tokens"]
    assert evs[2][1] == "response.output_item.added" and evs[2][0] == 0.0  # thinking starts
    visible = [(t, et) for t, et, _ in evs if et.endswith(".delta")]
    first = visible[0][0]
    assert visible[0][1] == "response.reasoning_summary_text.delta"
    assert first == pytest.approx(0.100 + reasoning * 0.005)
    times = [t for t, _ in visible]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(g == pytest.approx(0.005) for g in gaps)  # summary then text, same pace


async def test_non_streamed_takes_the_stream_duration():
    from llmsim.streaming.clock import FakeClock

    clock = FakeClock()
    app = App(Config(latency="realistic", ttft_ms=300, itl_ms=10, seed=1,
                     max_tokens_mode="exact"), clock=clock)
    t0 = clock.now()
    res = await app.dispatch(_req({"model": "gpt-4o", "input": "hi",
                                   "max_output_tokens": 21}))
    assert res.data["usage"]["output_tokens"] == 21
    assert clock.now() - t0 == pytest.approx(0.300 + 20 * 0.010)


# -- the plan's rendered events (bytes) against the objects they render ------------------------

def _outs() -> list[Any]:
    from llmsim.api.responses import render as r
    from llmsim.sim.decide import Usage

    lp = [{"token": "a\"", "logprob": -0.5, "bytes": [97, 34], "top_logprobs": []}]
    ann = [{"type": "url_citation", "url": "https://x/é", "title": "t", "start_index": 0,
            "end_index": 1}]
    return [
        r.RespOut("resp_1", 7, Usage(3, 2), [r.MessageOut("msg_1", ["Hi", " \"é\"\n"], 2)],
                  streamed=2),
        r.RespOut("resp_2", 8, Usage(3, 1, 0, 1), [r.MessageOut(
            "msg_2", ["a\""], 1, "incomplete", lp, ann)], "incomplete", "max_output_tokens",
            streamed=1),
        r.RespOut("resp_3", 9, Usage(5, 9, 4), [
            r.ReasoningOut("rs_3", 4, [["think", "ing"]], "blob"),
            r.CallOut("fc_3", "call_3", "get", '{"a":1}', ['{"a"', ":1}"], 2),
            r.CallOut("ctc_3", "call_4", "sh", 'ls "é"', ["ls", ' "é"'], 2,
                      "custom_tool_call", "incomplete"),
            r.HostedOut("ws_3", {"id": "ws_3", "type": "web_search_call",
                                 "status": "in_progress"},
                        {"id": "ws_3", "type": "web_search_call", "status": "completed"}),
            r.MessageOut("msg_3", ["x"], 1), r.MessageOut("msg_4", ["y", "z"], 2)],
            streamed=9, tool_usage={"web_search": {"num_requests": 1}}),
        r.RespOut("resp_4", 10, Usage(3, 0)),  # no output (a WebSocket warm-up)
    ]


def test_rendered_response_objects_are_the_snapshots_json() -> None:
    """The Response object a plan renders (render.response_json, from an echo, output and
    text rendered once) is byte for byte orjson's rendering of render.snapshot, in every
    status, with and without usage, tool_usage and an echo."""
    from llmsim.api.responses import render as r

    echo = {"model": "m\"é", "store": True, "metadata": {"k": "v"}, "tools": [], "top_p": 1.0}
    for e in (echo, {}):
        for out in _outs():
            items = [r.item_json(i) for i in out.items]
            output = orjson.dumps(items)
            text = orjson.dumps(r.output_text(items))
            for status in ("queued", "in_progress", out.status):
                assert r.response_json(r.echo_json(e), out, status) == \
                    orjson.dumps(r.snapshot(e, out, status))
            assert r.response_json(r.echo_json(e), out, out.status, output, text, usage=True,
                                   completed_at=r.completed_at(out),
                                   incomplete=out.incomplete_reason) == \
                orjson.dumps(r.final_snapshot(e, out))


def test_rendered_plan_events_carry_the_objects_they_render() -> None:
    """Every event a plan yields rendered is numbered by the stream like a dict, and carries
    the JSON of what it renders: created and in_progress the running snapshot, each
    output_item.done its item (render.item_json), each text's done events the joined
    deltas, the terminal event the final snapshot (byte for byte)."""
    from llmsim.api.responses import RESPONSES
    from llmsim.api.responses import render as r
    from llmsim.streaming.stream import EventStream

    echo = {"model": "m", "instructions": "be \"brief\""}
    for out in _outs():
        for background in (False, True):
            plan = r.plan(echo, out, background=background, warmup=not out.items)
            got = EventStream(plan, RESPONSES, first_seq=3).drain()
            assert got[-1][0] in ("response.completed", "response.incomplete")
            events = []
            for i, (etype, data) in enumerate(got):
                wire = data if type(data) is bytes else orjson.dumps(data)
                ev = orjson.loads(wire)
                assert ev["type"] == etype and ev["sequence_number"] == 3 + i
                assert list(ev)[-1] == "sequence_number"
                events.append(ev)
                if type(data) is bytes and etype != RESPONSES.token_type:
                    # (rendered: the same bytes as the dict of the same event)
                    assert data == orjson.dumps(ev)
            first = events[0]["response"]
            assert first == r.snapshot(echo, out, "queued" if background else "in_progress")
            final = got[-1][1]
            assert orjson.loads(final)["response"] == r.final_snapshot(echo, out)
            assert final.endswith(orjson.dumps(r.final_snapshot(echo, out)) +
                                  b',"sequence_number":%d}' % (2 + len(got)))
            added = [ev["item"] for ev in events
                     if ev["type"] == "response.output_item.added"]
            assert added == [r.item_json(i, done=False) for i in out.items]
            done = [ev["item"] for ev in events if ev["type"] == "response.output_item.done"]
            assert done == [r.item_json(i) for i in out.items]
            texts = [ev["text"] for ev in events if ev["type"] == "response.output_text.done"]
            assert texts == [i.text for i in out.items if isinstance(i, r.MessageOut)]
            summaries = [ev["text"] for ev in events
                         if ev["type"] == "response.reasoning_summary_text.done"]
            assert summaries == [s["text"] for i in done if i["type"] == "reasoning"
                                 for s in i["summary"]]
            assert summaries == [ev["part"]["text"] for ev in events
                                 if ev["type"] == "response.reasoning_summary_part.done"]
            args = [ev.get("arguments", ev.get("input")) for ev in events
                    if ev["type"] in ("response.function_call_arguments.done",
                                      "response.custom_tool_call_input.done")]
            assert args == [i.get("arguments", i.get("input")) for i in done
                            if i["type"] in ("function_call", "custom_tool_call")]
            parts = [ev["part"] for ev in events
                     if ev["type"] == "response.content_part.done"]
            assert parts == [c for i in done if i["type"] == "message" for c in i["content"]]


async def test_a_stored_response_reads_what_its_stream_told() -> None:
    """The record of a streamed response follows its stream without keeping its events:
    mid-stream GET shows the items done so far, then the terminal Response the stream
    sent, as JSON equal to the wire's (the record renders it when first read)."""
    from llmsim.streaming.clock import FakeClock

    app = App(Config(latency="instant", seed=4), clock=FakeClock())
    res = await app.dispatch(_req({"model": "o4-mini", "input": "hi", "stream": True,
                                   "reasoning": {"effort": "low", "summary": "auto"}}))
    assert isinstance(res, StreamResponse)
    s = res.stream
    seen: list[dict[str, Any]] = []
    got = None
    while (ev := s.pull()) is not None:
        data = orjson.loads(ev[2]) if type(ev[2]) is bytes else ev[2]
        if ev[1] == "response.output_item.done":
            seen.append(data["item"])
            got = await app.dispatch(Request("GET", f"/v1/responses/{s.id}", {}, {}, b"",
                                             "req_g"))
            assert got.data["status"] == "in_progress"  # type: ignore[union-attr]
            assert got.data["output"] == seen  # type: ignore[union-attr]
        last = data
    assert got is not None and len(seen) == 2
    final = await app.dispatch(Request("GET", f"/v1/responses/{s.id}", {}, {}, b"", "req_g"))
    assert last["type"] == "response.completed"
    assert final.data == last["response"]  # type: ignore[union-attr]


async def test_a_memoised_create_splices_its_kept_echo() -> None:
    """A create whose body the memo kept renders its Responses with the echo JSON kept
    there (rendered once per body): the same bytes as the first create's own rendering."""
    from llmsim.api.responses import render as r
    from llmsim.api.responses.state import state

    app = App(Config(latency="instant", seed=4))
    body = {"model": "gpt-4o", "input": "hi", "stream": True, "instructions": "é \"q\"",
            "metadata": {"a": "b"}, "max_output_tokens": 20}
    kept = []
    for _ in range(3):
        res = await app.dispatch(_req(body))
        assert isinstance(res, StreamResponse)
        got = res.stream.drain()
        rec = state(app).store.get(res.stream.id or "")
        assert rec is not None
        kept.append(rec.echo_json)
        want = r.snapshot(rec.echo, rec.out, "in_progress")
        assert got[0][1] == (b'{"type":"response.created","response":' + orjson.dumps(want) +
                             b',"sequence_number":0}')
        assert orjson.loads(got[-1][1])["response"] == rec.final == \
            r.final_snapshot(rec.echo, rec.out)
    assert kept[0] is None and kept[1] is not None and kept[2] is kept[1]
