"""Responses API through the official SDK with strict validation (every body and event is
validated against the SDK's own models). Test names/comments name the requirement (R1.1 ...)
of ../shared/seeds/000 they cover; SDK-WIRE-FACTS 1a wins where the seed disagrees."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from llmsim.sim import tokens as tok

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {
               "city": {"type": "string"}, "unit": {"type": "string",
                                                    "enum": ["c", "f"]}},
               "required": ["city", "unit"], "additionalProperties": False},
           "strict": True}
TIME = {"type": "function", "name": "get_time",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}},
                       "required": ["tz"], "additionalProperties": False}, "strict": True}


def sdk(srv: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0,
                         _strict_response_validation=True)


# --- R1 core -------------------------------------------------------------------------------

def test_r1_1_r1_3_create_string_input(client):
    """R1.1/R1.2/R1.3: string input → a completed Response with the documented fields."""
    r = client.responses.create(model="gpt-4o", input="Hello, world!")
    assert r.id.startswith("resp_") and r.object == "response"
    assert r.status == "completed" and r.model == "gpt-4o"
    assert isinstance(r.created_at, float)
    assert [o.type for o in r.output] == ["message"]
    assert r.output_text and r.output_text == r.output[0].content[0].text
    # R6.1 / SDK-WIRE-FACTS: output includes reasoning (0 here); total = in + out
    u = r.usage
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens == 0
    assert u.input_tokens_details.cache_write_tokens == 0
    assert u.output_tokens_details.reasoning_tokens == 0
    # R3.1: msg_ id, assistant, completed, output_text with annotations []
    m = r.output[0]
    assert m.id.startswith("msg_") and m.role == "assistant" and m.status == "completed"
    assert m.content[0].annotations == []


def test_r1_1_openai_prefix_alias(srv):
    """R1.1: the endpoint is also served under /openai/v1."""
    c = openai.OpenAI(base_url=srv.url + "/openai/v1", api_key="x", max_retries=0,
                      _strict_response_validation=True)
    assert c.responses.create(model="gpt-4o", input="hi").status == "completed"


def test_r1_2_r2_1_r2_2_array_input_roles_and_parts(client):
    """R1.2/R2.1/R2.2: message items (shorthand and typed), every role, text/image parts."""
    r = client.responses.create(model="gpt-4o", input=[
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "input_text", "text": "Dev note."}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "What is in this image?"},
            {"type": "input_image", "image_url": "https://example.com/cat.png"}]},
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "And now?"}])
    assert r.status == "completed"
    items = client.responses.input_items.list(r.id, order="asc").data
    assert [i.role for i in items] == ["system", "developer", "user", "assistant", "user"]
    assert items[2].content[1].type == "input_image" and items[2].content[1].detail == "auto"
    # the image costs tokens too (fixed low-detail price)
    r2 = client.responses.create(model="gpt-4o", input=[{"role": "user", "content": [
        {"type": "input_text", "text": "What is in this image?"}]}])
    assert r.usage.input_tokens > r2.usage.input_tokens + 85


def test_r2_bad_items_name_the_param(client):
    """Bad input items are 400s naming the exact parameter."""
    cases = [
        ([{"role": "wizard", "content": "x"}], "input[0].role"),
        ([{"type": "message", "role": "user"}], "input[0].content"),
        ([{"role": "user", "content": [{"type": "image_url", "text": "x"}]}],
         "input[0].content[0].type"),
        ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input[0].call_id"),
        ([{"type": "frobnicate"}], "input[0].type"),
    ]
    for inp, param in cases:
        with pytest.raises(openai.BadRequestError) as ei:
            client.responses.create(model="gpt-4o", input=inp)
        assert ei.value.param == param, (inp, ei.value.body)
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model="gpt-4o")  # type: ignore[call-arg]
    assert ei.value.param == "input" and ei.value.code == "missing_required_parameter"


# --- R3 reasoning --------------------------------------------------------------------------

def test_r3_2_reasoning_item_before_message(client):
    """R3.2: reasoning models put an rs_ item before the message; non-reasoning don't."""
    r = client.responses.create(model="o3", input="What is 2+2?")
    assert [o.type for o in r.output] == ["reasoning", "message"]
    rs = r.output[0]
    assert rs.id.startswith("rs_") and rs.status == "completed"
    # R3.2.1: no summary requested → empty list (the SDK requires a list; the seed's null
    # would fail validation) and no encrypted content without include
    assert rs.summary == [] and rs.encrypted_content is None
    # R4.3.2: reasoning tokens are reported and included in output_tokens
    u = r.usage
    assert u.output_tokens_details.reasoning_tokens > 0
    assert u.output_tokens > u.output_tokens_details.reasoning_tokens
    assert u.total_tokens == u.input_tokens + u.output_tokens
    g = client.responses.create(model="gpt-4o", input="What is 2+2?")
    assert [o.type for o in g.output] == ["message"]
    # effort none → no reasoning tokens, no reasoning item (R3.2)
    n = client.responses.create(model="gpt-5.1", input="hi", reasoning={"effort": "none"})
    assert [o.type for o in n.output] == ["message"]
    assert n.usage.output_tokens_details.reasoning_tokens == 0
    assert n.reasoning.effort == "none"


@pytest.mark.parametrize("mode", ["auto", "concise", "detailed"])
def test_r3_2_1_r3_2_2_summary_modes(client, mode):
    """R3.2.1: a summary is present for auto/concise/detailed; R3.2.2: its length is about
    5/10/15% of the reasoning tokens."""
    share = {"concise": 0.05, "auto": 0.10, "detailed": 0.15}[mode]
    r = client.responses.create(model="o4-mini", input="Think about it.",
                                reasoning={"effort": "high", "summary": mode})
    rs = r.output[0]
    assert rs.type == "reasoning" and rs.summary
    assert all(s.type == "summary_text" and s.text for s in rs.summary)
    words = sum(tok.count_tokens(s.text) for s in rs.summary)
    reasoning = r.usage.output_tokens_details.reasoning_tokens
    assert words == max(3, round(reasoning * share))
    assert r.reasoning.summary == mode and r.reasoning.effort == "high"


def test_r3_2_1_summary_streams_r5_1_1(client):
    """R5.1.1: reasoning summary events precede the message (output_index 0 then 1)."""
    with client.responses.stream(model="o3", input="hi",
                                 reasoning={"summary": "detailed"}) as s:
        events = list(s)
        final = s.get_final_response()
    types = [e.type for e in events]
    first_msg = types.index("response.content_part.added")
    for t in ("response.reasoning_summary_part.added", "response.reasoning_summary_text.delta",
              "response.reasoning_summary_text.done", "response.reasoning_summary_part.done"):
        assert t in types[:first_msg]
    added = [e for e in events if e.type == "response.output_item.added"]
    assert [(e.output_index, e.item.type) for e in added] == [(0, "reasoning"), (1, "message")]
    deltas = "".join(e.delta for e in events
                     if e.type == "response.reasoning_summary_text.delta"
                     and e.summary_index == 0)
    done = next(e for e in events if e.type == "response.reasoning_summary_text.done")
    assert deltas == done.text == final.output[0].summary[0].text


def test_r4_2_include_encrypted_content(client):
    """R4.2: include reasoning.encrypted_content adds an opaque blob; it can be sent back."""
    r = client.responses.create(model="o3", input="hi", store=False,
                                include=["reasoning.encrypted_content"])
    rs = r.output[0]
    assert rs.type == "reasoning" and isinstance(rs.encrypted_content, str)
    assert len(rs.encrypted_content) > 64
    # stateless multi-turn: replay the reasoning item (with its blob) as input
    r2 = client.responses.create(model="o3", store=False, input=[
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": rs.id, "summary": [],
         "encrypted_content": rs.encrypted_content},
        {"role": "assistant", "content": r.output_text},
        {"role": "user", "content": "more"}])
    assert r2.status == "completed"
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model="o3", input="hi", include=["reasoning.everything"])
    assert ei.value.param == "include[0]"


def test_r4_3_1_effort_multipliers(make_server):
    """R4.3.1, as the real API behaves rather than the seed's fixed multiples: reasoning grows
    with the effort (llmsim.sim.lengths' effort factors) and with the kind of task, the
    visible answer does not change."""
    s = make_server(output_tokens_mean=100, output_tokens_sigma=0)
    c = sdk(s)
    means = []
    for effort in ("minimal", "low", "medium", "high"):
        spent = []
        for i in range(8):
            r = c.responses.create(model="gpt-5", input=f"question {i}",
                                   reasoning={"effort": effort})
            u = r.usage
            assert u.output_tokens - u.output_tokens_details.reasoning_tokens == 100
            spent.append(u.output_tokens_details.reasoning_tokens)
        means.append(sum(spent) / len(spent))
    assert means == sorted(means) and means[0] < 100 < means[-1], means
    # a math task reasons longer than a greeting at the same effort
    math = [c.responses.create(model="gpt-5", input=f"Solve the equation {i}x + 3 = 7",
                               ).usage.output_tokens_details.reasoning_tokens for i in range(6)]
    hello = [c.responses.create(model="gpt-5", input=f"Hello {i}!",
                                ).usage.output_tokens_details.reasoning_tokens for i in range(6)]
    assert min(math) > max(hello)
    r = c.responses.create(model="gpt-5.2", input="x", reasoning={"effort": "xhigh"})
    assert r.usage.output_tokens_details.reasoning_tokens >= 800
    # effort values the model does not support are rejected
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model="o3", input="x", reasoning={"effort": "minimal"})
    assert ei.value.param == "reasoning.effort"
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model="gpt-4o", input="x", reasoning={"effort": "low"})
    assert ei.value.param == "reasoning.effort"


# --- R4 request fields ---------------------------------------------------------------------

def test_r4_1_fields_echoed(client):
    """R4.1/R4.2: the response echoes the request fields as the real API does."""
    r = client.responses.create(
        model="gpt-4o", input="hi", instructions="Be terse.", temperature=0.3, top_p=0.9,
        max_output_tokens=500, metadata={"k": "v"}, user="u1", safety_identifier="s1",
        prompt_cache_key="pk", service_tier="auto", truncation="disabled",
        parallel_tool_calls=False, store=True)
    assert r.instructions == "Be terse." and r.temperature == 0.3 and r.top_p == 0.9
    assert r.max_output_tokens == 500 and r.metadata == {"k": "v"}
    assert r.user == "u1" and r.safety_identifier == "s1" and r.prompt_cache_key == "pk"
    assert r.service_tier == "default" and r.truncation == "disabled"
    assert r.parallel_tool_calls is False and r.tool_choice == "auto" and r.tools == []
    assert r.text.format.type == "text" and r.background is False
    assert r.previous_response_id is None and r.error is None


def test_r4_1_ranges_validated(client):
    """R4.1: temperature 0-2, top_p 0-1, max_output_tokens >= 16, ≤ the model's limit."""
    for kw, param in (({"temperature": 2.5}, "temperature"), ({"top_p": 1.5}, "top_p"),
                      ({"max_output_tokens": 5}, "max_output_tokens"),
                      ({"max_output_tokens": 10**7}, "max_output_tokens"),
                      ({"top_logprobs": 30}, "top_logprobs")):
        with pytest.raises(openai.BadRequestError) as ei:
            client.responses.create(model="gpt-4o", input="hi", **kw)
        assert ei.value.param == param, kw
    # reasoning models reject sampling parameters
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model="o3", input="hi", temperature=0.2)
    assert ei.value.param == "temperature" and ei.value.code == "unsupported_parameter"
    # unknown parameters are rejected like the real API
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model="gpt-4o", input="hi", extra_body={"max_tokens": 5})
    assert ei.value.param == "max_tokens"


def test_r4_2_metadata_limits(client):
    """R4.2 metadata: at most 16 pairs, keys ≤ 64 chars, values ≤ 512 chars."""
    ok = {f"k{i}": "v" * 512 for i in range(16)}
    ok["k" * 64] = ok.pop("k0")
    assert client.responses.create(model="gpt-4o", input="hi", metadata=ok).metadata == ok
    bad = [{f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}, {"k": "v" * 513}]
    for md in bad:
        with pytest.raises(openai.BadRequestError) as ei:
            client.responses.create(model="gpt-4o", input="hi", metadata=md)
        assert ei.value.param.startswith("metadata"), md


def test_r4_1_max_output_tokens_incomplete(client):
    """max_output_tokens → status incomplete, reason max_output_tokens, a cut message."""
    r = client.responses.create(model="gpt-4o", input="Write a long essay.",
                                max_output_tokens=20)
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output[0].status == "incomplete"
    assert r.usage.output_tokens == 20
    # reasoning + visible share the budget
    o = client.responses.create(model="o3", input="essay", max_output_tokens=64)
    assert o.status == "incomplete" and o.usage.output_tokens == 64
    assert 0 < o.usage.output_tokens_details.reasoning_tokens <= 64  # reasoning is spent first
    # streamed: the terminal event is response.incomplete; get_final_response refuses
    with client.responses.stream(model="gpt-4o", input="x", max_output_tokens=16) as s:
        events = list(s)
        with pytest.raises(RuntimeError):
            s.get_final_response()
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_text_format_json_schema_validates(client):
    """text.format json_schema → output that validates against the schema."""
    schema = {"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3}},
        "required": ["name", "age", "tags"], "additionalProperties": False}
    for i in range(5):
        r = client.responses.create(model="gpt-4o", input=f"person {i}", text={
            "format": {"type": "json_schema", "name": "person", "schema": schema,
                       "strict": True}})
        jsonschema.validate(json.loads(r.output_text), schema)
        assert r.text.format.type == "json_schema" and r.text.format.name == "person"
    r = client.responses.create(model="gpt-4o", input="reply in json",
                                text={"format": {"type": "json_object"}})
    assert isinstance(json.loads(r.output_text), dict)
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model="gpt-4o", input="hello",
                                text={"format": {"type": "json_object"}})
    assert ei.value.param == "text"
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model="gpt-4o", input="x", text={
            "format": {"type": "json_schema", "schema": schema}})
    assert ei.value.param == "text.format.name"


def test_responses_parse_helper(client):
    """client.responses.parse with a pydantic model (SDK-side JSON parsing of our output)."""
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        population: int

    r = client.responses.parse(model="gpt-4o", input="a city", text_format=City)
    assert isinstance(r.output_parsed, City)


# --- R9 tools ------------------------------------------------------------------------------

def test_r9_1_tool_types_accepted_echoed(client):
    """R9.1: function, web_search, file_search, code_interpreter, mcp, image_generation are
    accepted and echoed; with tool_choice none no tool is called (the MCP server's tools are
    still listed, as the real API lists them: tests/test_responses_hosted.py)."""
    tools = [WEATHER, {"type": "web_search"}, {"type": "file_search",
                                                "vector_store_ids": ["vs_1"]},
             {"type": "code_interpreter", "container": {"type": "auto"}},
             {"type": "mcp", "server_label": "deepwiki",
              "server_url": "https://mcp.deepwiki.com/mcp", "headers": {"X": "y"}},
             {"type": "image_generation"}]
    r = client.responses.create(model="gpt-4.1", input="hi", tools=tools, tool_choice="none")
    assert [t.type for t in r.tools] == ["function", "web_search", "file_search",
                                          "code_interpreter", "mcp", "image_generation"]
    assert [o.type for o in r.output] == ["mcp_list_tools", "message"]
    for bad, param in (({"type": "file_search"}, "tools[0].vector_store_ids"),
                       ({"type": "mcp", "server_label": "x"}, "tools[0]"),
                       ({"type": "teleport"}, "tools[0].type"),
                       ({"type": "function", "name": "bad name"}, "tools[0].name")):
        with pytest.raises(openai.BadRequestError) as ei:
            client.responses.create(model="gpt-4o", input="hi", tools=[bad])
        assert ei.value.param == param


def test_r9_2_tool_choice(make_server):
    """R9.2: none → text; required → a call; named → that function; auto → sometimes."""
    c = sdk(make_server(tool_call_probability=0.5))
    tools = [WEATHER, TIME]
    r = c.responses.create(model="gpt-4o", input="x", tools=tools, tool_choice="none")
    assert [o.type for o in r.output] == ["message"]
    r = c.responses.create(model="gpt-4o", input="x", tools=tools, tool_choice="required")
    assert r.output and all(o.type == "function_call" for o in r.output)
    r = c.responses.create(model="gpt-4o", input="x", tools=tools,
                           tool_choice={"type": "function", "name": "get_time"})
    assert [(o.type, o.name) for o in r.output] == [("function_call", "get_time")]
    assert r.tool_choice.type == "function" and r.tool_choice.name == "get_time"
    kinds = set()
    for i in range(30):
        r = c.responses.create(model="gpt-4o", input=f"q{i}", tools=tools)
        kinds.add(r.output[0].type)
    assert kinds == {"message", "function_call"}
    with pytest.raises(openai.BadRequestError) as ei:
        c.responses.create(model="gpt-4o", input="x", tools=tools,
                           tool_choice={"type": "function", "name": "nope"})
    assert ei.value.param == "tool_choice"
    with pytest.raises(openai.BadRequestError):
        c.responses.create(model="gpt-4o", input="x", tool_choice="required")
    # parallel_tool_calls false → exactly one call
    for i in range(10):
        r = c.responses.create(model="gpt-4o", input=f"p{i}", tools=tools,
                               tool_choice="required", parallel_tool_calls=False)
        assert len(r.output) == 1


def test_function_tool_loop(client):
    """The SDK tool loop: call → replay output items + function_call_output → an answer.
    Arguments are valid JSON for the tool's schema."""
    inputs: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    r = client.responses.create(model="gpt-4.1", input=inputs, tools=[WEATHER],
                                tool_choice="required")
    call = r.output[0]
    assert call.type == "function_call" and call.id.startswith("fc_")
    assert call.call_id.startswith("call_") and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    inputs += r.output  # SDK objects replayed as-is
    inputs.append({"type": "function_call_output", "call_id": call.call_id,
                   "output": json.dumps({"temp": 21})})
    r2 = client.responses.create(model="gpt-4.1", input=inputs, tools=[WEATHER],
                                 tool_choice="none")
    assert r2.status == "completed" and r2.output_text
    assert r2.usage.input_tokens > r.usage.input_tokens
    # a function_call_output without its call is the real API's 400
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model="gpt-4.1", tools=[WEATHER], input=[
            {"type": "function_call_output", "call_id": "call_missing", "output": "x"}])
    assert ei.value.param == "input[0]"


def test_function_tool_loop_with_previous_response_id_streamed(client):
    """Tool loop with previous_response_id, streamed with responses.stream(): arguments
    deltas add up and strict tools get parsed arguments."""
    with client.responses.stream(model="gpt-4o", input="weather?", tools=[WEATHER],
                                 tool_choice="required", parallel_tool_calls=False) as s:
        events = list(s)
        final = s.get_final_response()
    call = final.output[0]
    deltas = "".join(e.delta for e in events
                     if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert deltas == done.arguments == call.arguments
    assert call.parsed_arguments == json.loads(call.arguments)
    r2 = client.responses.create(model="gpt-4o", previous_response_id=final.id,
                                 tools=[WEATHER], tool_choice="none", input=[
                                     {"type": "function_call_output", "call_id": call.call_id,
                                      "output": "sunny"}])
    assert r2.status == "completed" and r2.previous_response_id == final.id


# --- R5 streaming through the SDK ----------------------------------------------------------

def test_r5_stream_create_and_helper(client):
    """R5.1: create(stream=True) yields validated events; responses.stream() accepts the
    ordering and get_final_response() equals the terminal response."""
    events = list(client.responses.create(model="gpt-4o", input="hi", stream=True))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.output == [] and events[0].response.status == "in_progress"
    with client.responses.stream(model="gpt-4o", input="hi") as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert final.output_text == text and final.status == "completed"


async def test_r5_async_stream(aclient):
    async with aclient.responses.stream(model="gpt-5-mini", input="hi",
                                        reasoning={"summary": "auto"}) as s:
        async for _ in s:
            pass
        final = await s.get_final_response()
    assert [o.type for o in final.output] == ["reasoning", "message"]


# --- stored responses (seed 002) -----------------------------------------------------------

def test_retrieve_delete_and_store_false(client):
    r = client.responses.create(model="gpt-4o", input="hi")
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.status == "completed"
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(r.id)
    n = client.responses.create(model="gpt-4o", input="hi", store=False)
    assert n.model_extra.get("store") is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(n.id)
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model="gpt-4o", input="x", previous_response_id=n.id)
    assert ei.value.code == "previous_response_not_found"
    assert ei.value.param == "previous_response_id"
    assert ei.value.body["message"] == f"Previous response with id '{n.id}' not found."


def test_previous_response_id_chains_context(make_server):
    """previous_response_id: earlier input and output become context (prompt grows; the echo
    text mode sees the chained user turns)."""
    c = sdk(make_server(text="echo"))
    r1 = c.responses.create(model="gpt-4o", input="first question", instructions="sys")
    assert r1.output_text == "first question"
    r2 = c.responses.create(model="gpt-4o", input="second", previous_response_id=r1.id)
    assert r2.usage.input_tokens > r1.usage.input_tokens
    assert r2.instructions is None  # instructions are not carried over
    r3 = c.responses.create(model="gpt-4o", previous_response_id=r2.id,
                            input=[{"type": "item_reference", "id": r1.output[0].id}])
    assert r3.output_text == "second"  # the last *user* turn of the context
    assert r3.usage.input_tokens > r2.usage.input_tokens


def test_input_items_pagination(client):
    """input_items: cursor pagination with after/limit/order (desc by default)."""
    msgs = [{"role": "user", "content": f"m{i}"} for i in range(7)]
    r = client.responses.create(model="gpt-4o", input=msgs)
    page = client.responses.input_items.list(r.id, limit=3)
    assert [i.content[0].text for i in page.data] == ["m6", "m5", "m4"]
    assert page.has_more is True and page.first_id == page.data[0].id
    allv = [i.content[0].text for i in client.responses.input_items.list(r.id, limit=3)]
    assert allv == [f"m{i}" for i in range(6, -1, -1)]  # auto-paging follows `after`
    asc = client.responses.input_items.list(r.id, order="asc", limit=2, after=page.data[2].id)
    assert [i.content[0].text for i in asc.data] == ["m5", "m6"]
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nope")


def test_input_items_function_call_shapes(client):
    r = client.responses.create(model="gpt-4o", tools=[WEATHER], input=[
        {"role": "user", "content": "w?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}])
    items = client.responses.input_items.list(r.id, order="asc").data
    assert [i.type for i in items] == ["message", "function_call", "function_call_output"]
    assert items[1].id.startswith("fc_") and items[1].status == "completed"


def test_input_tokens_count(client):
    n1 = client.responses.input_tokens.count(model="gpt-4o", input="hello there")
    assert n1.object == "response.input_tokens"
    r = client.responses.create(model="gpt-4o", input="hello there")
    assert n1.input_tokens == r.usage.input_tokens
    n2 = client.responses.input_tokens.count(model="gpt-4o", input="hello there",
                                             instructions="Be very brief.", tools=[WEATHER])
    assert n2.input_tokens > n1.input_tokens


def test_conversation_transcript(client):
    conv = client.conversations.create(metadata={"topic": "t"},
                                       items=[{"role": "user", "content": "remember 7"}])
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "t"}
    r1 = client.responses.create(model="gpt-4o", input="hi", conversation=conv.id)
    assert r1.conversation.id == conv.id
    r2 = client.responses.create(model="gpt-4o", input="again", conversation={"id": conv.id})
    assert r2.usage.input_tokens > r1.usage.input_tokens
    items = client.conversations.items.list(conv.id, order="asc").data
    assert [i.type for i in items] == ["message"] * 5
    with pytest.raises(openai.BadRequestError) as ei:
        client.responses.create(model="gpt-4o", input="x", conversation=conv.id,
                                previous_response_id=r1.id)
    assert ei.value.param == "conversation"
    client.conversations.delete(conv.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-4o", input="x", conversation=conv.id)


# --- R7 / R8 -------------------------------------------------------------------------------

def test_r7_2_error_format(srv):
    """R7.2: errors carry type, code, message and param."""
    import orjson

    from tests import rawhttp

    r = rawhttp.request(srv.url, "POST", "/v1/responses",
                        {"model": "gpt-4o", "input": "x", "temperature": 9})
    assert r.status == 400
    err = orjson.loads(r.body)["error"]
    assert set(err) == {"type", "code", "message", "param"}
    assert err["type"] == "invalid_request_error" and err["param"] == "temperature"


def test_r8_1_same_models_as_chat(client):
    """R8.1: every model of /v1/models works on /v1/responses (the text-generation ones: as
    in the real list, the embedding models are there too, and refuse generation)."""
    from llmsim.sim.models import BUILTIN
    other_kinds = {p.id for p in BUILTIN if p.kind != "chat"}  # embeddings, media models
    for m in client.models.list():
        if m.id in other_kinds:
            with pytest.raises(openai.BadRequestError):
                client.responses.create(model=m.id, input="hi")
            continue
        r = client.responses.create(model=m.id, input="hi", max_output_tokens=16)
        assert r.model == m.id and r.status in ("completed", "incomplete")


def test_include_output_text_logprobs(client):
    """include message.output_text.logprobs (+ top_logprobs) → one logprob per token."""
    r = client.responses.create(model="gpt-4o", input="hi", top_logprobs=3,
                                include=["message.output_text.logprobs"])
    part = r.output[0].content[0]
    assert len(part.logprobs) == r.usage.output_tokens
    assert "".join(lp.token for lp in part.logprobs) == part.text
    assert all(len(lp.top_logprobs) == 3 and lp.logprob <= 0 for lp in part.logprobs)
    events = list(client.responses.create(model="gpt-4o", input="hi", stream=True,
                                          include=["message.output_text.logprobs"]))
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert all(len(e.logprobs) == 1 and e.logprobs[0].token == e.delta for e in deltas)


def test_seeded_requests_are_deterministic(client):
    """With a server seed, identical requests give identical text, usage and tool calls."""
    a = client.responses.create(model="o3", input="same", reasoning={"summary": "auto"})
    b = client.responses.create(model="o3", input="same", reasoning={"summary": "auto"})
    assert a.id != b.id and a.output_text == b.output_text
    assert a.usage == b.usage and a.output[0].summary == b.output[0].summary
    c = client.responses.create(model="o3", input="different", reasoning={"summary": "auto"})
    assert c.output_text != a.output_text
