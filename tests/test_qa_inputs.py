"""Regressions from exploratory QA: error wording that must match the value actually sent."""

from __future__ import annotations

import orjson
import pytest

from . import rawhttp

MSG = [{"role": "user", "content": "hi"}]


def _err(srv, path, body):
    r = rawhttp.request(srv.url, "POST", path, orjson.dumps(body))
    assert r.status == 400, r.body
    return r.json()["error"]


@pytest.mark.parametrize("path,body,param,kind,side", [
    # an integer parameter sent as an integer: "integer", not "decimal"
    ("/v1/chat/completions", {"messages": MSG, "n": 200}, "n", "integer", "above_max"),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": -1}, "max_tokens", "integer",
     "below_min"),
    ("/v1/responses", {"input": "x", "top_logprobs": 30}, "top_logprobs", "integer",
     "above_max"),
    # a decimal parameter sent as a whole number: still "decimal"
    ("/v1/chat/completions", {"messages": MSG, "temperature": 5}, "temperature", "decimal",
     "above_max"),
    ("/v1/chat/completions", {"messages": MSG, "frequency_penalty": -3}, "frequency_penalty",
     "decimal", "below_min"),
    ("/v1/responses", {"input": "x", "temperature": 3}, "temperature", "decimal", "above_max"),
])
def test_range_error_names_the_parameter_type(srv, path, body, param, kind, side):
    e = _err(srv, path, {"model": "gpt-4o", **body})
    assert e["param"] == param
    assert e["code"] == f"{kind}_{side}_value"
    words = side.replace("_max", " maximum").replace("_min", " minimum")
    assert e["message"].startswith(f"Invalid '{param}': {kind} {words} value."), e["message"]


@pytest.mark.parametrize("path,body,param,got", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 5}]},
     "messages[0].content", "an integer"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": True}]},
     "messages[0].content", "a boolean"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": {"a": 1}}]},
     "messages[0].content", "an object"),
    ("/v1/responses", {"input": 5}, "input", "an integer"),
    ("/v1/responses", {"input": {"role": "user"}}, "input", "an object"),
    ("/v1/responses", {"input": [{"role": "user", "content": 1.5}]}, "input[0].content",
     "a number"),
])
def test_type_error_names_the_type_sent(srv, path, body, param, got):
    e = _err(srv, path, {"model": "gpt-4o", **body})
    assert e["param"] == param and e["code"] == "invalid_type"
    assert f"but got {got} instead." in e["message"], e["message"]


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"messages": MSG}),
    ("/v1/responses", {"input": "x"}),
])
def test_empty_model_is_missing_not_a_type_error(srv, path, body):
    e = _err(srv, path, {"model": "", **body})
    assert e["param"] == "model" and e["code"] == "missing_required_parameter"


TOOLS = [{"type": "function", "function": {"name": n, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"]}}} for n in ("a", "b", "c")]


@pytest.mark.parametrize("limit", [1, 3, 6, 12])
def test_max_tokens_caps_tool_calls(client, limit):
    """A tool-call answer obeys max_tokens like text does: cut off, finish_reason length."""
    for seed in range(6):
        r = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": f"go {seed}"}], tools=TOOLS,
            tool_choice="required", max_tokens=limit, n=2)
        for ch in r.choices:
            assert ch.finish_reason == "length"
            calls = ch.message.tool_calls
            assert calls
            full = "".join(c.function.arguments for c in calls)
            assert len(full) < 60 * len(calls)
        assert r.usage.completion_tokens <= 2 * limit
        s = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": f"go {seed}"}], tools=TOOLS,
            tool_choice="required", max_tokens=limit, n=2, stream=True,
            stream_options={"include_usage": True})
        args: dict[tuple[int, int], str] = {}
        fin = {}
        usage = None
        for chunk in s:
            usage = chunk.usage or usage
            for c in chunk.choices:
                fin[c.index] = c.finish_reason or fin.get(c.index)
                for tc in c.delta.tool_calls or []:
                    args[(c.index, tc.index)] = (args.get((c.index, tc.index), "")
                                                 + (tc.function.arguments or ""))
        assert fin == {0: "length", 1: "length"}
        assert usage.completion_tokens <= 2 * limit
        # the streamed arguments are the non-streamed ones (same seed, same decision)
        for ch in r.choices:
            assert [args[(ch.index, j)] for j in range(len(ch.message.tool_calls))] == [
                c.function.arguments for c in ch.message.tool_calls]


def test_tool_calls_within_max_tokens_are_whole(client):
    r = client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "x"}], tools=TOOLS,
        tool_choice="required", max_tokens=4000)
    assert r.choices[0].finish_reason == "tool_calls"
    for c in r.choices[0].message.tool_calls:
        assert set(orjson.loads(c.function.arguments)) == {"city", "days"}


def test_chat_unknown_parameter_is_rejected(srv, client):
    e = _err(srv, "/v1/chat/completions", {"model": "gpt-4o", "messages": MSG, "topk": 5})
    assert e["message"] == "Unrecognized request argument supplied: topk"
    assert e["type"] == "invalid_request_error"
    # every field the SDK can send is still accepted (deprecated ones too)
    r = client.chat.completions.create(
        model="gpt-4o", messages=MSG, functions=[{"name": "f", "parameters": {}}],
        prompt_cache_retention="24h", max_tokens=2)
    assert r.choices[0].finish_reason


def _call(cid):
    return {"id": cid, "type": "function", "function": {"name": "f", "arguments": "{}"}}


def test_tool_message_must_answer_a_preceding_call(srv):
    e = _err(srv, "/v1/chat/completions", {"model": "gpt-4o", "messages": [
        {"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c1", "content": "r"}]})
    assert e["param"] == "messages.[1].role"
    assert "must be a response to a preceeding message with 'tool_calls'" in e["message"]


def test_every_tool_call_needs_an_answer_before_the_next_turn(srv, client):
    asst = {"role": "assistant", "content": None, "tool_calls": [_call("c1"), _call("c2")]}
    e = _err(srv, "/v1/chat/completions", {"model": "gpt-4o", "messages": [
        {"role": "user", "content": "x"}, asst,
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "user", "content": "and?"}]})
    assert e["param"] == "messages.[3].role"
    assert e["message"].endswith("did not have response messages: c2")
    # answered in any order, then the conversation goes on: fine
    r = client.chat.completions.create(model="gpt-4o", max_tokens=3, messages=[
        {"role": "user", "content": "x"}, asst,
        {"role": "tool", "tool_call_id": "c2", "content": "r"},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "user", "content": "and?"}])
    assert r.choices[0].message.content


def test_cors_preflight_and_allow_origin(make_server):
    """Browser apps (the SDK's dangerouslyAllowBrowser) need a preflight answer and
    access-control-allow-origin on every response, even with an API key required."""
    srv = make_server(api_key=("sk-right",))
    pre = rawhttp.request(srv.url, "OPTIONS", "/v1/chat/completions", headers=[
        ("origin", "http://app.example"), ("access-control-request-method", "POST"),
        ("access-control-request-headers", "authorization,content-type,x-stainless-os")])
    assert pre.status == 200
    h = dict(pre.headers)
    assert h["access-control-allow-origin"] == "*"
    assert "POST" in h["access-control-allow-methods"]
    assert h["access-control-allow-headers"] == "authorization,content-type,x-stainless-os"
    ok = rawhttp.request(srv.url, "POST", "/v1/chat/completions", orjson.dumps(
        {"model": "gpt-4o", "messages": MSG, "max_tokens": 2, "stream": True}),
        headers=[("authorization", "Bearer sk-right")])
    assert ok.status == 200 and dict(ok.headers)["access-control-allow-origin"] == "*"
    bad = rawhttp.request(srv.url, "GET", "/v1/models")  # 401, still readable by the page
    assert bad.status == 401 and dict(bad.headers)["access-control-allow-origin"] == "*"


def test_path_parameters_are_percent_decoded(srv, client):
    """The SDK percent-encodes path parameters; the id the server sees is the decoded one."""
    for mid in ("org/model name", "a%b", "ft:gpt-4o-mini:org::abc"):
        assert client.models.retrieve(mid).id == mid
    r = client.responses.create(model="gpt-4o", input="x", max_output_tokens=16)
    enc = "".join(f"%{b:02X}" for b in r.id.encode())  # every byte encoded: still found
    got = rawhttp.request(srv.url, "GET", f"/v1/responses/{enc}")
    assert got.status == 200 and got.json()["id"] == r.id


def _allowed(mode, *names):
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": [
        {"type": "function", "function": {"name": n}} for n in names]}}


def test_chat_allowed_tools_restricts_and_forces(client, srv):
    tools = [{"type": "function", "function": {"name": n}} for n in "abcd"]
    for i in range(12):
        m = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": f"x{i}"}], tools=tools,
            tool_choice=_allowed("required", "b", "c")).choices[0]
        assert m.finish_reason == "tool_calls"
        assert m.message.tool_calls and {t.function.name for t in m.message.tool_calls} <= {"b", "c"}
        m = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": f"x{i}"}], tools=tools,
            tool_choice=_allowed("auto", "d")).choices[0]
        assert {t.function.name for t in m.message.tool_calls or []} <= {"d"}
    bad = _allowed("sometimes", "a")
    e = _err(srv, "/v1/chat/completions", {"model": "gpt-4o", "messages": MSG, "tools": tools,
                                           "tool_choice": bad})
    assert e["param"] == "tool_choice.allowed_tools.mode"
    e = _err(srv, "/v1/chat/completions", {"model": "gpt-4o", "messages": MSG, "tools": tools,
                                           "tool_choice": {"type": "allowed_tools"}})
    assert e["param"] == "tool_choice.allowed_tools"
