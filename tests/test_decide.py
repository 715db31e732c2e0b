"""The one decision module (llmsim.sim.decide): the same decision in every dialect, the fixed
chat drift (custom tool calls), and billed tokens counted at the edge, once."""

from __future__ import annotations

import time
from random import Random
from typing import Any

import orjson
import pytest
from openai.types.chat import ChatCompletionMessageCustomToolCall

from llmsim import Config
from llmsim.api import chat
from llmsim.api import responses as resp
from llmsim.api.responses import parse as rparse
from llmsim.api.responses import render as rrender
from llmsim.app import App
from llmsim.messages import Request
from llmsim.sim.decide import Ask, Choice, decide
from tests import rawhttp

USER = [{"role": "user", "content": "Run some code, then answer in json."}]
CUSTOM = [{"type": "custom", "custom": {"name": "run_code", "description": "Runs code."}}]
PARAMS = {"type": "object", "properties": {"city": {"type": "string"},
                                           "unit": {"type": "string", "enum": ["c", "f"]}},
          "required": ["city", "unit"]}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"},
                                           "b": {"type": "array", "items": {"type": "string"}}},
          "required": ["a", "b"], "additionalProperties": False}


# ------------------------------------------------------------------------------------------
# Chat custom tool calls, judged by the SDK with strict validation
# ------------------------------------------------------------------------------------------

def _custom_body(**kw: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": USER, "tools": CUSTOM, "tool_choice": "required",
            "seed": 11, **kw}


def test_chat_custom_tool_call_json_is_custom(client):
    """ChatCompletionMessageCustomToolCall: type "custom", custom {name, input}."""
    for seed in range(6):
        r = client.chat.completions.create(**_custom_body(seed=seed))
        tc = r.choices[0].message.tool_calls[0]
        assert isinstance(tc, ChatCompletionMessageCustomToolCall)
        assert tc.type == "custom" and tc.custom.name == "run_code"
        text = tc.custom.input
        assert text and text == text.strip() and "  " not in text  # single-spaced
        assert r.choices[0].finish_reason == "tool_calls"
        assert r.usage.completion_tokens >= 4 + len(text.split())


def test_chat_custom_tool_call_stream(client):
    """Streamed: the strict SDK accepts every chunk, the deltas carry ``custom`` pieces whose
    concatenation is the non-streamed input (same seeded decision), id and name once."""
    want = client.chat.completions.create(**_custom_body()).choices[0].message.tool_calls[0]
    deltas = [tc for ch in client.chat.completions.create(**_custom_body(), stream=True)
              if ch.choices and ch.choices[0].delta.tool_calls
              for tc in ch.choices[0].delta.tool_calls]
    assert deltas[0].id and deltas[0].custom == {"name": "run_code", "input": ""}
    assert all(d.id is None and d.function is None and set(d.custom) == {"input"}
               for d in deltas[1:])
    text = "".join(d.custom["input"] for d in deltas)
    assert text == want.custom.input and "  " not in text
    # the SDK's stream helper accumulates them into the same call
    with client.chat.completions.stream(**_custom_body()) as s:
        final = s.get_final_completion()
    got = final.choices[0].message.tool_calls[0]
    assert got.custom == {"name": "run_code", "input": want.custom.input}
    assert final.choices[0].finish_reason == "tool_calls"


def test_chat_function_and_custom_calls_side_by_side(make_server):
    import openai
    srv = make_server(tool_call_probability=0.5)  # the random policy: either tool is picked
    client = openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0,
                           _strict_response_validation=True)
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": PARAMS}},
             *CUSTOM]
    kinds = set()
    for seed in range(12):
        r = client.chat.completions.create(model="gpt-4o", messages=USER, tools=tools,
                                           tool_choice="required", seed=seed)
        for tc in r.choices[0].message.tool_calls:
            kinds.add(tc.type)
            if tc.type == "function":
                assert tc.function.name == "get_weather"
                assert set(orjson.loads(tc.function.arguments)) == {"city", "unit"}
            else:
                assert tc.custom.name == "run_code"
    assert kinds == {"function", "custom"}


# ------------------------------------------------------------------------------------------
# One decision: equivalent chat and Responses requests decide the same answer
# ------------------------------------------------------------------------------------------

def _rtools(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for t in tools:
        inner = t[t["type"]]
        out.append({"type": t["type"], **inner})
    return out


# (chat body, Responses body) pairs that ask the same thing
PAIRS: list[tuple[dict[str, Any], dict[str, Any]]] = [
    ({"messages": USER, "max_tokens": 40}, {"input": USER, "max_output_tokens": 40}),
    ({"messages": USER}, {"input": USER}),
    ({"messages": USER, "tools": CUSTOM, "tool_choice": "required"},
     {"input": USER, "tools": _rtools(CUSTOM), "tool_choice": "required"}),
    ({"messages": USER, "tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": PARAMS}}, *CUSTOM], "tool_choice": "auto"},
     {"input": USER, "tools": [{"type": "function", "name": "get_weather",
                                "parameters": PARAMS}, *_rtools(CUSTOM)]}),
    ({"messages": USER, "tools": [{"type": "function", "function": {
        "name": "get_weather", "parameters": PARAMS}}, *CUSTOM],
      "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
      "max_tokens": 16},
     {"input": USER, "tools": [{"type": "function", "name": "get_weather",
                                "parameters": PARAMS}, *_rtools(CUSTOM)],
      "tool_choice": {"type": "function", "name": "get_weather"}, "max_output_tokens": 16}),
    ({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {
        "name": "s", "schema": SCHEMA}}},
     {"input": USER, "text": {"format": {"type": "json_schema", "name": "s",
                                         "schema": SCHEMA}}}),
    ({"messages": USER, "response_format": {"type": "json_object"}},
     {"input": USER, "text": {"format": {"type": "json_object"}}}),
    ({"messages": USER, "logprobs": True, "top_logprobs": 3, "max_tokens": 20},
     {"input": USER, "include": ["message.output_text.logprobs"], "top_logprobs": 3,
      "max_output_tokens": 20}),
    ({"model": "o3", "messages": USER, "reasoning_effort": "low",
      "max_completion_tokens": 300},
     {"model": "o3", "input": USER, "reasoning": {"effort": "low"},
      "max_output_tokens": 300}),
]


def _request(path: str, body: dict[str, Any]) -> Request:
    return Request("POST", path, {}, {}, orjson.dumps(body), "req_decide")


async def _asks(app: App, cb: dict[str, Any], rb: dict[str, Any]) -> tuple[Ask, Ask]:
    cb = {"model": "gpt-4o", **cb}
    rb = {"model": "gpt-4o", **rb}
    cr = await chat.parse(_request("/v1/chat/completions", cb), app)
    p = await resp.prepare(_request("/v1/responses", rb), app, rb)
    return chat.ask(cr), rparse.ask(p.rr, p.context, p.input_tokens, p.cached_tokens)


def _same(a: Choice, b: Choice) -> None:
    assert (a.pieces, a.finish, a.tokens, a.logprobs) == (b.pieces, b.finish, b.tokens,
                                                          b.logprobs)
    assert a.reasoning_tokens == b.reasoning_tokens
    assert [(c.name, c.kind, c.arguments, c.pieces, c.tokens, c.complete) for c in a.calls] \
        == [(c.name, c.kind, c.arguments, c.pieces, c.tokens, c.complete) for c in b.calls]


@pytest.mark.parametrize("k", range(len(PAIRS)))
async def test_same_decision_in_chat_and_responses(k):
    app = App(Config(latency="instant", seed=5, quiet=True))
    ca, ra = await _asks(app, *PAIRS[k])
    assert [(t.name, t.kind, t.parameters) for t in ca.tools] == \
        [(t.name, t.kind, t.parameters) for t in ra.tools]
    assert ca.tool_choice == ra.tool_choice and ca.output.schema == ra.output.schema
    lat = app.latency(ca.profile)
    for seed in range(8):
        dc = decide(ca, app.config, Random(seed), lat)
        dr = decide(ra, app.config, Random(seed), lat)
        _same(dc.choices[0], dr.choices[0])
        assert dc.usage.output_tokens == dr.usage.output_tokens
        assert dc.usage.reasoning_tokens == dr.usage.reasoning_tokens


async def test_same_decision_renders_the_same_call_and_text():
    """The rendered chat completion and Responses output carry the same call / text."""
    app = App(Config(latency="instant", seed=5, quiet=True))
    seen = set()
    for k in (1, 3, 4):
        ca, ra = await _asks(app, *PAIRS[k])
        cr = await chat.parse(_request("/v1/chat/completions",
                                       {"model": "gpt-4o", **PAIRS[k][0]}), app)
        for seed in range(8):
            lat = app.latency(ca.profile)
            dc, dr = (decide(a, app.config, Random(seed), lat) for a in (ca, ra))
            msg = chat.completion_json(cr, chat.ChatOut.of(dc, 0, "chatcmpl-x"))["choices"][0]["message"]
            out = rrender.final_snapshot({}, rrender.response_out(dr, "resp_x", 0))["output"]
            if msg["content"] is not None:
                seen.add("text")
                assert [o["content"][0]["text"] for o in out] == [msg["content"]]
                continue
            for tc, item in zip(msg["tool_calls"], out, strict=True):
                seen.add(tc["type"])
                if tc["type"] == "custom":
                    assert item["type"] == "custom_tool_call"
                    assert (item["name"], item["input"]) == (tc["custom"]["name"],
                                                             tc["custom"]["input"])
                else:
                    assert item["type"] == "function_call"
                    assert (item["name"], item["arguments"]) == (tc["function"]["name"],
                                                                 tc["function"]["arguments"])
    assert seen == {"text", "function", "custom"}


async def test_decision_is_pure_and_repeatable():
    """No I/O, no stats: the same Ask and RNG state give the same decision, and deciding
    touches no counter."""
    app = App(Config(latency="realistic", seed=5, quiet=True))
    ca, _ = await _asks(app, *PAIRS[3])
    st = app.stats

    def counters() -> tuple[int, ...]:
        return (st.tokens_in, st.tokens_out, st.tokens_reasoning, st.tokens_delivered,
                st.requests_n, st.active_streams)

    before = counters()
    lat = app.latency(ca.profile)
    a = decide(ca, app.config, Random(3), lat)
    b = decide(ca, app.config, Random(3), lat)
    assert [c.calls and [(x.name, x.arguments) for x in c.calls] or c.pieces
            for c in a.choices] == [c.calls and [(x.name, x.arguments) for x in c.calls]
                                    or c.pieces for c in b.choices]
    assert a.timing.first == b.timing.first and a.timing.first > 0
    assert list(a.timing.gaps(20)) == list(b.timing.gaps(20))
    assert a.timing.duration(21) == pytest.approx(a.timing.first + sum(a.timing.gaps(20)))
    assert counters() == before


# ------------------------------------------------------------------------------------------
# Billed tokens: counted where the answer is delivered, once
# ------------------------------------------------------------------------------------------

def _stats(url: str) -> dict[str, Any]:
    return rawhttp.request(url, "GET", "/llmsim/stats").json()["tokens"]


def test_billed_once_at_the_edge(srv):
    url = srv.url
    billed_in = billed_out = 0

    def add(u: dict[str, Any]) -> None:
        nonlocal billed_in, billed_out
        billed_in += u.get("prompt_tokens", u.get("input_tokens", 0))
        billed_out += u.get("completion_tokens", u.get("output_tokens", 0))

    chat_body = {"model": "gpt-4o", "messages": USER, "max_tokens": 9}
    add(rawhttp.request(url, "POST", "/v1/chat/completions", chat_body).json()["usage"])
    events = rawhttp.request(url, "POST", "/v1/chat/completions", {
        **chat_body, "stream": True, "stream_options": {"include_usage": True}}).sse()
    add(orjson.loads(events[-2][1])["usage"])
    r = rawhttp.request(url, "POST", "/v1/responses", {"model": "o3", "input": "hi",
                                                        "max_output_tokens": 64}).json()
    add(r["usage"])
    events = rawhttp.request(url, "POST", "/v1/responses", {
        "model": "gpt-4o", "input": "hi", "max_output_tokens": 20, "stream": True}).sse()
    done = orjson.loads(events[-1][1])["response"]
    add(done["usage"])
    bg = rawhttp.request(url, "POST", "/v1/responses", {
        "model": "gpt-4o", "input": "hi", "max_output_tokens": 20, "background": True}).json()
    deadline = time.monotonic() + 5
    while True:
        got = rawhttp.request(url, "GET", f"/v1/responses/{bg['id']}").json()
        if got["status"] in ("completed", "incomplete") or time.monotonic() > deadline:
            break
        time.sleep(0.01)
    assert got["status"] in ("completed", "incomplete")
    add(got["usage"])
    assert _stats(url)["output"] == billed_out and _stats(url)["input"] == billed_in
    # replays and retrievals deliver an answer again: they bill nothing
    replay = rawhttp.request(url, "GET", f"/v1/responses/{done['id']}?stream=true").sse()
    assert orjson.loads(replay[-1][1])["type"] == f"response.{done['status']}"
    rawhttp.request(url, "GET", f"/v1/responses/{r['id']}")
    assert _stats(url)["output"] == billed_out and _stats(url)["input"] == billed_in


# -- the agent tool policy (default for tool_choice "auto") -------------------------------------
AGENT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description":
     "Current weather for a city", "parameters": {"type": "object", "properties": {
         "city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "search_flights", "description":
     "Find flights between airports", "parameters": {"type": "object", "properties": {
         "origin": {"type": "string"}, "destination": {"type": "string"}},
         "required": ["origin", "destination"]}}},
]


def test_agent_policy_calls_the_relevant_tool_then_answers(client):
    """A user question with tools: the matching tool is called (every seed); with the tool's
    result after the user's message the model answers in text."""
    ask_weather = [{"role": "user", "content": "What is the weather in Paris today?"}]
    ask_flights = [{"role": "user", "content": "Find me flights from Oslo to Rome"}]
    for seed in range(8):
        r = client.chat.completions.create(model="gpt-4o", messages=ask_weather,
                                           tools=AGENT_TOOLS, seed=seed)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls"
        assert [c.function.name for c in calls] == ["get_weather"]
        r = client.chat.completions.create(model="gpt-4o", messages=ask_flights,
                                           tools=AGENT_TOOLS, seed=seed)
        assert [c.function.name for c in r.choices[0].message.tool_calls] == ["search_flights"]
    call = calls[0]
    turn2 = [*ask_weather,
             {"role": "assistant", "content": None, "tool_calls": [
                 {"id": call.id, "type": "function",
                  "function": {"name": "get_weather", "arguments": call.function.arguments}}]},
             {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    for seed in range(8):
        r = client.chat.completions.create(model="gpt-4o", messages=turn2, tools=AGENT_TOOLS,
                                           seed=seed)
        assert r.choices[0].finish_reason == "stop" and r.choices[0].message.content
        assert r.choices[0].message.tool_calls is None


def test_agent_policy_on_responses_function_call_loop(client):
    tools = [{"type": "function", "name": t["function"]["name"],
              "description": t["function"]["description"],
              "parameters": t["function"]["parameters"]} for t in AGENT_TOOLS]
    r = client.responses.create(model="gpt-4o", input="Weather in Lima, please", tools=tools)
    calls = [o for o in r.output if o.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather"]
    r2 = client.responses.create(model="gpt-4o", previous_response_id=r.id, tools=tools,
                                 input=[{"type": "function_call_output",
                                         "call_id": calls[0].call_id, "output": "22 C"}])
    assert r2.status == "completed" and r2.output_text
    assert not [o for o in r2.output if o.type == "function_call"]


def test_agent_policy_parallel_calls_every_equally_relevant_tool(client):
    msgs = [{"role": "user", "content": "Weather in Oslo and flights to Oslo? weather flights"}]
    r = client.chat.completions.create(model="gpt-4o", messages=msgs, tools=AGENT_TOOLS, seed=1)
    assert sorted(c.function.name for c in r.choices[0].message.tool_calls) == [
        "get_weather", "search_flights"]
    r = client.chat.completions.create(model="gpt-4o", messages=msgs, tools=AGENT_TOOLS, seed=1,
                                       parallel_tool_calls=False)
    assert len(r.choices[0].message.tool_calls) == 1


def test_one_generator_per_request_and_the_first_choice_whatever_n(monkeypatch):
    """The first choice is drawn from the request's RNG itself (no second generator seeded
    per request); further choices from generators derived after it: the first choice is the
    same for any ``n``, the others differ from it, and all repeat for the same RNG state."""
    from dataclasses import replace

    from llmsim.sim import rng as rngmod
    app = App(Config(latency="instant", seed=5, quiet=True))
    ask = Ask(app.registry.get("gpt-4o"), 10, limit=30)
    lat = app.latency(ask.profile)
    seeded: list[int] = []
    real = rngmod.seeded
    monkeypatch.setattr(rngmod, "seeded", lambda s: seeded.append(s) or real(s))
    for seed in range(6):
        seeded.clear()
        one = decide(ask, app.config, Random(seed), lat)
        assert seeded == []  # n=1: no generator besides the request's
        three = decide(replace(ask, n=3), app.config, Random(seed), lat)
        assert len(seeded) == 2
        assert one.choices[0].pieces == three.choices[0].pieces
        assert three.choices[1].pieces != three.choices[0].pieces
        again = decide(replace(ask, n=3), app.config, Random(seed), lat)
        assert [c.pieces for c in again.choices] == [c.pieces for c in three.choices]
    seeded.clear()
    a = rngmod.request_rng(1, "/v1/chat/completions", {"model": "m", "stream": True})
    b = rngmod.request_rng(1, "/v1/chat/completions", {"model": "m"})
    assert len(seeded) == 2 and a.getstate() == b.getstate()  # delivery-only fields dropped


def test_answer_now_only_without_script_rules():
    app = App(Config(latency="instant", seed=5, quiet=True))
    ask = Ask(app.registry.get("gpt-4o"), 10, limit=8)
    lat = app.latency(ask.profile)
    d = app.answer_now(ask, Random(1), lat)
    assert d is not None and d.choices[0].pieces == decide(ask, app.config, Random(1),
                                                            lat).choices[0].pieces
    app.script.rules = [object()]  # type: ignore[list-item]  # any rule: answer() decides
    assert app.answer_now(ask, Random(1), lat) is None
