"""Chat Completions contract: bad input, tokens, determinism, tools, formats, reasoning rules."""

from __future__ import annotations

import json

import openai
import orjson
import pytest

from llmsim.sim import schema as sch
from llmsim.sim import tokens as tok

from . import rawhttp

MSG = [{"role": "user", "content": "hello there"}]
URL = "/v1/chat/completions"


def post(srv, body, path=URL):
    return rawhttp.request(srv.url, "POST", path, body if isinstance(body, (bytes, dict))
                           else orjson.dumps(body))


BAD = [
    ({}, "model", "missing_required_parameter"),
    ({"model": "gpt-4o"}, "messages", "missing_required_parameter"),
    ({"model": 5, "messages": MSG}, "model", "invalid_type"),
    ({"model": "gpt-4o", "messages": []}, "messages", "empty_array"),
    ({"model": "gpt-4o", "messages": "hi"}, "messages", "invalid_type"),
    ({"model": "gpt-4o", "messages": [{"content": "x"}]}, "messages[0].role", None),
    ({"model": "gpt-4o", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role",
     "invalid_value"),
    ({"model": "gpt-4o", "messages": [{"role": "user"}]}, "messages[0].content", None),
    ({"model": "gpt-4o", "messages": [{"role": "user", "content": [{"type": "video"}]}]},
     "messages[0].content[0].type", "invalid_value"),
    ({"model": "gpt-4o", "messages": [{"role": "tool", "content": "x"}]},
     "messages[0].tool_call_id", None),
    ({"model": "gpt-4o", "messages": MSG, "temperature": 3}, "temperature", None),
    ({"model": "gpt-4o", "messages": MSG, "temperature": "hot"}, "temperature", "invalid_type"),
    ({"model": "gpt-4o", "messages": MSG, "top_p": -1}, "top_p", None),
    ({"model": "gpt-4o", "messages": MSG, "n": 0}, "n", None),
    ({"model": "gpt-4o", "messages": MSG, "n": 129}, "n", None),
    ({"model": "gpt-4o", "messages": MSG, "max_tokens": 0}, "max_tokens", None),
    ({"model": "gpt-4o", "messages": MSG, "max_tokens": 10**6}, "max_tokens", "invalid_value"),
    ({"model": "gpt-4o", "messages": MSG, "stream": "yes"}, "stream", "invalid_type"),
    ({"model": "gpt-4o", "messages": MSG, "stream_options": {"include_usage": True}},
     "stream_options", None),
    ({"model": "gpt-4o", "messages": MSG, "stop": ["a", "b", "c", "d", "e"]}, "stop", None),
    ({"model": "gpt-4o", "messages": MSG, "stop": 5}, "stop", "invalid_type"),
    ({"model": "gpt-4o", "messages": MSG, "top_logprobs": 3}, "top_logprobs", None),
    ({"model": "gpt-4o", "messages": MSG, "tools": [{"type": "function"}]}, "tools[0].function",
     None),
    ({"model": "gpt-4o", "messages": MSG, "tools": [{"type": "function", "function": {
        "name": "bad name!"}}]}, "tools[0].function.name", None),
    ({"model": "gpt-4o", "messages": MSG, "tool_choice": "required"}, "tool_choice", None),
    ({"model": "gpt-4o", "messages": MSG, "tools": [{"type": "function", "function": {
        "name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice", None),
    ({"model": "gpt-4o", "messages": MSG, "response_format": {"type": "xml"}},
     "response_format.type", None),
    ({"model": "gpt-4o", "messages": MSG, "response_format": {"type": "json_object"}},
     "messages", None),
    ({"model": "gpt-4o", "messages": MSG, "response_format": {"type": "json_schema"}},
     "response_format.json_schema", None),
    ({"model": "gpt-4o", "messages": MSG, "metadata": {f"k{i}": "v" for i in range(17)}},
     "metadata", None),
    ({"model": "gpt-4o", "messages": MSG, "reasoning_effort": "high"}, "reasoning_effort", None),
    ({"model": "o3", "messages": MSG, "max_tokens": 5}, "max_tokens", "unsupported_parameter"),
    ({"model": "o3", "messages": MSG, "temperature": 0.2}, "temperature", "unsupported_value"),
    ({"model": "o3", "messages": MSG, "reasoning_effort": "xhigh"}, "reasoning_effort", None),
    ({"model": "gpt-4", "messages": [{"role": "user", "content": "word " * 9000}]}, "messages",
     "context_length_exceeded"),
]


@pytest.mark.parametrize("body,param,code", BAD)
def test_bad_input_names_the_param(srv, body, param, code):
    r = post(srv, body)
    assert 400 <= r.status < 500, r.body
    err = r.json()["error"]
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error"
    if code:
        assert err["code"] == code
    assert err["message"]


def test_strict_models_404(make_server):
    s = make_server(strict_models=True)
    r = post(s, {"model": "nope-1", "messages": MSG})
    assert r.status == 404 and r.json()["error"]["code"] == "model_not_found"
    assert post(s, {"model": "gpt-4o-2024-08-06", "messages": MSG}).status == 200  # snapshot
    r = rawhttp.request(s.url, "GET", "/v1/models/nope-1")
    assert r.status == 404


def test_any_model_accepted_by_default(client):
    r = client.chat.completions.create(model="my-bench-model", messages=MSG, max_tokens=4)
    assert r.model == "my-bench-model" and r.usage.completion_tokens == 4


def test_models_endpoints(client):
    ids = [m.id for m in client.models.list()]
    for fam in ("gpt-5", "gpt-5-mini", "o3", "o4-mini", "gpt-4.1", "gpt-4o"):
        assert fam in ids
    m = client.models.retrieve("gpt-4.1")
    assert m.id == "gpt-4.1" and m.model_extra["context_window"] > 1_000_000


@pytest.mark.parametrize("enc_name", ["o200k_base", "cl100k_base"])
def test_stream_chunks_are_single_tokens_and_count_matches(client, enc_name):
    enc = tok.get_encoding(enc_name)
    if enc is None:
        pytest.skip("tiktoken with offline encoding files not available")
    model = "gpt-4o" if enc_name == "o200k_base" else "gpt-4"
    for n in (1, 17, 300):
        chunks = list(client.chat.completions.create(
            model=model, messages=MSG, max_tokens=n, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        pieces = [c.choices[0].delta.content for c in chunks
                  if c.choices and c.choices[0].delta.content]
        assert len(pieces) == n == chunks[-1].usage.completion_tokens
        assert all(len(enc.encode(p)) == 1 for p in pieces)
        assert len(enc.encode("".join(pieces))) == n


def test_prompt_tokens_exact_with_tiktoken(client):
    enc = tok.get_encoding("o200k_base")
    if enc is None:
        pytest.skip("tiktoken not available")
    text = "The quick brown fox jumps over the lazy dog, twice!"
    r = client.chat.completions.create(model="gpt-4o", max_tokens=1,
                                       messages=[{"role": "user", "content": text}])
    # OpenAI's documented accounting: 3 per message + role + content, 3 for the reply
    assert r.usage.prompt_tokens == 3 + 3 + len(enc.encode("user")) + len(enc.encode(text))


def test_seeded_determinism_across_servers(make_server):
    a, b = make_server(seed=42), make_server(seed=42)
    body = {"model": "gpt-4o", "messages": MSG, "n": 2}
    ra, rb = post(a, body).json(), post(b, body).json()
    assert [c["message"]["content"] for c in ra["choices"]] == \
           [c["message"]["content"] for c in rb["choices"]]
    assert ra["usage"] == rb["usage"]
    assert ra["id"] != rb["id"]
    c = make_server(seed=43)
    assert post(c, body).json()["choices"][0]["message"]["content"] != \
        ra["choices"][0]["message"]["content"]


def test_unseeded_runs_vary(make_server):
    s = make_server(seed=None)
    body = {"model": "gpt-4o", "messages": MSG}
    texts = {post(s, body).json()["choices"][0]["message"]["content"] for _ in range(3)}
    assert len(texts) > 1
    body["seed"] = 5  # the request's own seed makes it reproducible
    texts = {post(s, body).json()["choices"][0]["message"]["content"] for _ in range(3)}
    assert len(texts) == 1


def test_stream_equals_nonstream_for_same_seeded_request(client):
    r = client.chat.completions.create(model="gpt-4o", messages=MSG, seed=3, max_tokens=30)
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="gpt-4o", messages=MSG, seed=3, max_tokens=30, stream=True) if c.choices)
    assert text == r.choices[0].message.content


def test_echo_and_fixed_and_sequence(make_server):
    from openai import OpenAI

    for mode, check in (("echo", lambda t: t == "Repeat after me please"),
                        ("fixed", lambda t: t == "Hello! This is a simulated response from "
                                             "llmsim."),
                        ("sequence", lambda t: t.startswith("1,2,3,4"))):
        s = make_server(text=mode, max_tokens_mode="natural")
        c = OpenAI(base_url=s.url + "/v1", api_key="x", _strict_response_validation=True)
        r = c.chat.completions.create(model="gpt-4o", messages=[
            {"role": "system", "content": "be nice"},
            {"role": "user", "content": "Repeat after me please"}])
        assert check(r.choices[0].message.content), (mode, r.choices[0].message.content)
    s = make_server(text="echo")
    c = OpenAI(base_url=s.url + "/v1", api_key="x", _strict_response_validation=True)
    r = c.chat.completions.create(model="gpt-4o", max_tokens=2,
                                  messages=[{"role": "user", "content": "one two three four"}])
    assert r.choices[0].message.content == "one two" and r.choices[0].finish_reason == "length"


def test_stop_sequence_cuts_text(make_server):
    s = make_server(text="fixed", fixed_text="alpha beta gamma delta")
    r = post(s, {"model": "gpt-4o", "messages": MSG, "stop": [" gamma"]}).json()
    assert r["choices"][0]["message"]["content"] == "alpha beta"
    assert r["choices"][0]["finish_reason"] == "stop"


def test_json_schema_output_validates(client):
    schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}}},
        "required": ["name", "age", "tags"], "additionalProperties": False}
    for stream in (False, True):
        kw = dict(model="gpt-4o", messages=MSG, response_format={
            "type": "json_schema", "json_schema": {"name": "person", "schema": schema,
                                                   "strict": True}})
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in
                           client.chat.completions.create(stream=True, **kw) if c.choices)
        else:
            text = client.chat.completions.create(**kw).choices[0].message.content
        assert sch.validate(json.loads(text), schema) == []


def test_json_object_mode(client):
    r = client.chat.completions.create(model="gpt-4o", response_format={"type": "json_object"},
                                       messages=[{"role": "user", "content": "answer in JSON"}])
    assert isinstance(json.loads(r.choices[0].message.content), dict)


@pytest.fixture
def random_policy_client(make_server):
    """The random tool policy (``--tool-call-probability``): calls pick tools at random."""
    srv = make_server(tool_call_probability=0.5)
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0,
                       _strict_response_validation=True) as c:
        yield c


def test_tool_calls_parallel_and_named(random_policy_client):
    client = random_policy_client
    tools = [{"type": "function", "function": {"name": n, "parameters": {
        "type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}},
        "required": ["q", "n"]}}} for n in ("a", "b", "c")]
    seen_parallel = False
    for seed in range(12):
        r = client.chat.completions.create(model="gpt-4o", messages=MSG, tools=tools,
                                           tool_choice="required", seed=seed)
        ch = r.choices[0]
        assert ch.finish_reason == "tool_calls" and ch.message.content is None
        for tc in ch.message.tool_calls:
            assert tc.id.startswith("call_")
            args = json.loads(tc.function.arguments)
            assert isinstance(args["q"], str) and isinstance(args["n"], int)
        seen_parallel |= len(ch.message.tool_calls) > 1
    assert seen_parallel
    r = client.chat.completions.create(model="gpt-4o", messages=MSG, tools=tools,
                                       parallel_tool_calls=False, tool_choice={
                                           "type": "function", "function": {"name": "b"}})
    assert [t.function.name for t in r.choices[0].message.tool_calls] == ["b"]
    r = client.chat.completions.create(model="gpt-4o", messages=MSG, tools=tools,
                                       tool_choice="none")
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content


def test_streamed_tool_call_deltas_send_id_and_name_once(srv):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    r = post(srv, {"model": "gpt-4o", "messages": MSG, "tools": tools, "stream": True,
                   "tool_choice": "required", "parallel_tool_calls": False})
    datas = [d for _, d in r.sse()]
    assert datas[-1] == "[DONE]"
    chunks = [json.loads(d) for d in datas[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0]["role"] == "assistant"
    tcs = [d["tool_calls"][0] for d in deltas if d.get("tool_calls")]
    assert sum(1 for t in tcs if "id" in t) == 1
    assert sum(1 for t in tcs if "name" in t.get("function", {})) == 1
    assert all("function" in t and t["index"] == 0 for t in tcs)
    args = "".join(t["function"].get("arguments", "") for t in tcs)
    assert "city" in json.loads(args)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_tool_loop_terminates_with_text(client):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    messages = list(MSG)
    for _ in range(10):
        r = client.chat.completions.create(model="gpt-4o", messages=messages, tools=tools)
        msg = r.choices[0].message
        if not msg.tool_calls:
            break
        messages.append(msg.model_dump(exclude_none=True))
        for tc in msg.tool_calls:
            messages.append({"role": "tool", "tool_call_id": tc.id, "content": "42"})
    assert msg.content


def test_n_choices_stream_order_and_usage(srv):
    r = post(srv, {"model": "gpt-4o", "messages": MSG, "n": 3, "max_tokens": 4, "stream": True,
                   "stream_options": {"include_usage": True}})
    chunks = [json.loads(d) for _, d in r.sse() if d != "[DONE]"]
    first_seen = []
    for c in chunks:
        for ch in c["choices"]:
            if ch["index"] not in first_seen:
                first_seen.append(ch["index"])
    assert first_seen == [0, 1, 2]
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    assert all(c["usage"] is None for c in chunks[:-1])


def test_no_usage_key_without_include_usage(srv):
    r = post(srv, {"model": "gpt-4o", "messages": MSG, "max_tokens": 2, "stream": True})
    assert all('"usage"' not in d for _, d in r.sse())


def test_logprobs(client):
    r = client.chat.completions.create(model="gpt-4o", messages=MSG, max_tokens=5,
                                       logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == 5 and all(len(x.top_logprobs) == 3 and x.logprob <= 0 for x in lp)
    assert "".join(x.token for x in lp) == r.choices[0].message.content
    chunks = list(client.chat.completions.create(model="gpt-4o", messages=MSG, max_tokens=3,
                                                 logprobs=True, stream=True))
    assert sum(len(c.choices[0].logprobs.content) for c in chunks
               if c.choices and c.choices[0].logprobs) == 3


def test_reasoning_model_usage_and_limits(client):
    r = client.chat.completions.create(model="o4-mini", messages=MSG, max_completion_tokens=200,
                                       reasoning_effort="high")
    u = r.usage
    assert u.completion_tokens <= 200
    assert u.completion_tokens_details.reasoning_tokens > 0
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    low = client.chat.completions.create(model="o4-mini", messages=MSG, reasoning_effort="low",
                                         seed=1)
    high = client.chat.completions.create(model="o4-mini", messages=MSG,
                                          reasoning_effort="high", seed=1)
    # reasoning by task and effort (llmsim.sim.lengths): the same seed, more effort, more
    # reasoning (the effort factors' ratio, high / low = 8, with the same spread drawn)
    r_low = low.usage.completion_tokens_details.reasoning_tokens
    r_high = high.usage.completion_tokens_details.reasoning_tokens
    assert 0 < r_low < r_high


def test_sdk_error_classes(client):
    with pytest.raises(openai.BadRequestError) as ei:
        client.chat.completions.create(model="gpt-4o", messages=[])
    assert ei.value.param == "messages" and ei.value.request_id.startswith("req_")
    with pytest.raises(openai.NotFoundError):
        client.post("/nowhere", cast_to=object, body={})


def test_multimodal_content_parts(client):
    r = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": [
        {"type": "text", "text": "what is this"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}],
        max_tokens=3)
    assert r.usage.prompt_tokens > 85


def test_tokenizer_estimate_mode(make_server):
    """--tokenizer estimate counts prompts with the estimate (not tiktoken), per server;
    generated text still has exact counts."""
    from llmsim.sim import tokens as T

    text = [{"role": "user", "content": "supercalifragilisticexpialidocious " * 20}]
    s = make_server(tokenizer="estimate")
    r = post(s, {"model": "gpt-4o", "messages": text, "max_tokens": 9}).json()
    assert r["usage"]["completion_tokens"] == 9
    estimated = r["usage"]["prompt_tokens"]
    if T.get_encoding("o200k_base") is not None:  # the exact tokenizer counts otherwise
        exact = post(make_server(tokenizer="auto"), {"model": "gpt-4o", "messages": text,
                                                     "max_tokens": 9}).json()
        assert exact["usage"]["prompt_tokens"] != estimated
    assert post(s, {"model": "gpt-4o", "messages": text, "max_tokens": 9}).json()[
        "usage"]["prompt_tokens"] == estimated  # the other server did not change this one


def test_vllm_benchmark_extensions(client):
    """Fields that benchmark harnesses send to vLLM-style servers are accepted; ignore_eos and
    min_tokens shape the length, the rest are ignored (the real API would 400 on them)."""
    r = client.chat.completions.create(model="bench-model", messages=MSG, max_tokens=40,
                                       extra_body={"ignore_eos": True, "top_k": 5,
                                                   "repetition_penalty": 1.1})
    assert r.usage.completion_tokens == 40 and r.choices[0].finish_reason == "length"


def test_min_tokens_and_ignore_eos_in_cap_mode(make_server):
    s = make_server(max_tokens_mode="natural", output_tokens_mean=5, output_tokens_sigma=0)
    r = post(s, {"model": "m", "messages": MSG, "max_tokens": 50}).json()
    assert r["usage"]["completion_tokens"] == 5
    r = post(s, {"model": "m", "messages": MSG, "max_tokens": 50, "ignore_eos": True}).json()
    assert r["usage"]["completion_tokens"] == 50
    r = post(s, {"model": "m", "messages": MSG, "max_tokens": 50, "min_tokens": 20}).json()
    assert r["usage"]["completion_tokens"] == 20
    r = post(s, {"model": "m", "messages": MSG, "min_tokens": -1})
    assert r.status == 400 and r.json()["error"]["param"] == "min_tokens"


def test_request_work_is_bounded(srv):
    """One request cannot make the simulator decide gigabytes of output before its first byte."""
    r = post(srv, {"model": "gpt-4o", "messages": MSG, "n": 128, "max_tokens": 16384,
                   "logprobs": True, "top_logprobs": 20})
    assert r.status == 400
    err = r.json()["error"]
    assert err["param"] == "n" and err["code"] == "request_too_large"
    assert post(srv, {"model": "gpt-4o", "messages": MSG, "n": 32, "max_tokens": 16384}
                ).status == 200


def _parse(app, body):
    import asyncio

    from llmsim.api import chat
    from llmsim.messages import Request
    req = Request("POST", URL, {}, {}, orjson.dumps(body), "req_x")
    return asyncio.run(chat.parse(req, app))


@pytest.mark.parametrize("extra", [
    {}, {"max_tokens": 7}, {"max_completion_tokens": 9, "n": 2, "stream": True},
    {"temperature": 0.5, "top_p": 0.9, "seed": 3, "user": "u"}])
def test_plain_body_parses_as_the_full_path(extra):
    """A body of plain fields only skips the other fields' validation (chat.PLAIN_FIELDS):
    it must parse to what the full path gives (forced here by a field at its default)."""
    from dataclasses import astuple

    from llmsim import Config
    from llmsim.api import chat
    from llmsim.app import App
    app = App(Config(quiet=True))
    body = {"model": "gpt-4o", "messages": MSG, **extra}
    assert set(body) <= chat.PLAIN_FIELDS
    plain = _parse(app, body)
    full = _parse(app, {**body, "parallel_tool_calls": True})
    assert astuple(plain)[1:] == astuple(full)[1:]


@pytest.mark.parametrize("body,param", [
    ({"model": "gpt-4o", "messages": MSG, "seed": "x"}, "seed"),
    ({"model": "gpt-4o", "messages": MSG, "user": 5}, "user"),
    ({"model": "gpt-4o", "messages": MSG, "max_completion_tokens": 0}, "max_completion_tokens"),
])
def test_plain_body_fields_are_validated(srv, body, param):
    r = post(srv, body)
    assert r.status == 400 and r.json()["error"]["param"] == param


def test_ask_carries_every_request_field_by_name():
    """chat.ask builds the Ask positionally (hot path): each field lands in its own slot."""
    from llmsim import Config
    from llmsim.api import chat
    from llmsim.app import App
    from llmsim.sim.decide import ToolChoice
    app = App(Config(quiet=True))
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    cr = _parse(app, {"model": "gpt-4o", "messages": MSG, "max_tokens": 40, "n": 3,
                      "stop": ["zz"], "logprobs": True, "top_logprobs": 4,
                      "parallel_tool_calls": False, "min_tokens": 5, "ignore_eos": True,
                      "tools": [tool], "tool_choice": "required"})
    a = chat.ask(cr, json_hint=True)
    assert (a.profile, a.prompt_tokens, a.cached_tokens) == (cr.profile, cr.prompt_tokens, 0)
    assert a.user_text() == "hello there" and a.prompt_texts() == ["hello there"]
    assert a.json_hint is True and a.after_tool_result is False
    assert [t.name for t in a.tools] == ["f"] and a.tool_choice == ToolChoice("required")
    assert a.parallel_tool_calls is False and a.max_tool_calls is None
    assert a.output.kind == "text" and a.limit == 40 and a.min_tokens == 5
    assert a.ignore_eos is True and a.stops == ("zz",) and a.effort is None
    assert a.summary is None and a.encrypted is False
    assert (a.n, a.logprobs, a.top_logprobs) == (3, True, 4)


def test_latency_model_cached_per_profile_and_config():
    from dataclasses import replace

    from llmsim import Config
    from llmsim.app import App
    app = App(Config(quiet=True, latency="instant"))
    p = app.model("gpt-4o")
    lat = app.latency(p)
    assert app.latency(p) is lat and lat.profile is p and lat.instant
    other = app.model("gpt-4o-mini")
    assert app.latency(other).profile is other
    fixed = replace(p, ttft_ms=p.ttft_ms + 1)  # same id, another profile: not the cached one
    assert app.latency(fixed).profile is fixed
    app.config = replace(app.config, latency="realistic", ttft_ms=7)  # another config
    lat2 = app.latency(fixed)
    assert not lat2.instant and lat2.fixed_ttft_ms == 7
