"""Simulated hosted tools of the Responses API, judged by the openai SDK: every Response is
strictly validated by the SDK client, every SSE event by the SDK's event union (strict), and
the stream's order, statuses, citations, include options and approvals are checked; the
openai-agents SDK runs its hosted tools against llmsim."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import struct
import zlib
from typing import Any

import openai
import pytest

from llmsim.api.responses import hosted as api_hosted
from llmsim.sim import hosted as sim_hosted
from llmsim.sim.latency import Latency
from llmsim.sim.models import ModelProfile

from . import rawhttp
from .responses_sse import SSE_EVENT, strict_sse_events

INCLUDE = ["web_search_call.action.sources", "file_search_call.results",
           "code_interpreter_call.outputs"]
WEB = {"type": "web_search"}
FILES = {"type": "file_search", "vector_store_ids": ["vs_manuals", "vs_policies"]}
CODE = {"type": "code_interpreter", "container": {"type": "auto"}}
IMAGE = {"type": "image_generation", "partial_images": 2}
MCP = {"type": "mcp", "server_label": "deepwiki", "server_url": "https://mcp.example.com/mcp"}
MCP_NEVER = {**MCP, "require_approval": "never"}
COMPUTER = {"type": "computer_use_preview", "display_width": 1024, "display_height": 768,
            "environment": "browser"}
SHELL = {"type": "shell"}
LOCAL_SHELL = {"type": "local_shell"}
PATCH = {"type": "apply_patch"}
# tool -> (output item types, the call item's stream events between added and done)
EXPECTED: dict[str, tuple[dict[str, Any], list[str], list[str]]] = {
    "web_search": (WEB, ["web_search_call", "message"], [
        "response.web_search_call.in_progress", "response.web_search_call.searching",
        "response.web_search_call.completed"]),
    "file_search": (FILES, ["file_search_call", "message"], [
        "response.file_search_call.in_progress", "response.file_search_call.searching",
        "response.file_search_call.completed"]),
    "code_interpreter": (CODE, ["code_interpreter_call", "message"], [
        "response.code_interpreter_call.in_progress", "response.code_interpreter_call_code.delta",
        "response.code_interpreter_call_code.done", "response.code_interpreter_call.interpreting",
        "response.code_interpreter_call.completed"]),
    "image_generation": (IMAGE, ["image_generation_call", "message"], [
        "response.image_generation_call.in_progress",
        "response.image_generation_call.generating",
        "response.image_generation_call.partial_image",
        "response.image_generation_call.completed"]),
    "mcp": (MCP_NEVER, ["mcp_list_tools", "mcp_call", "message"], [
        "response.mcp_call.in_progress", "response.mcp_call_arguments.delta",
        "response.mcp_call_arguments.done", "response.mcp_call.completed"]),
    "mcp_approval": (MCP, ["mcp_list_tools", "mcp_approval_request"], []),
    "computer": (COMPUTER, ["computer_call"], []),
    "shell": (SHELL, ["shell_call"], []),  # (its command events: test_shell_command_events)
    "local_shell": (LOCAL_SHELL, ["local_shell_call"], []),
    "apply_patch": (PATCH, ["apply_patch_call"], []),
}


@pytest.fixture
def hsrv(make_server: Any) -> Any:
    return make_server(output_tokens_mean=30, output_tokens_sigma=0)


@pytest.fixture
def hclient(hsrv: Any) -> Any:
    with openai.OpenAI(base_url=hsrv.url + "/v1", api_key="sk-test", max_retries=0,
                       _strict_response_validation=True) as c:
        yield c


def sse(srv: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The raw SSE events of a streamed create, each validated strictly by the SDK."""
    out = strict_sse_events(srv, body)
    assert [e["sequence_number"] for e in out] == list(range(len(out)))
    return out


def _between(events: list[dict[str, Any]], item_id: str) -> list[str]:
    """The types of the events about ``item_id`` between its added and done events."""
    return [e["type"] for e in events if e.get("item_id") == item_id
            and e["type"].startswith("response.") and "output_item" not in e["type"]]


def _dedup(types: list[str]) -> list[str]:
    out: list[str] = []
    for t in types:
        if not out or out[-1] != t:
            out.append(t)
    return out


def check_items(events: list[dict[str, Any]]) -> None:
    """Each item opens in progress and closes in a final status, in output order."""
    added = [e for e in events if e["type"] == "response.output_item.added"]
    done = [e for e in events if e["type"] == "response.output_item.done"]
    assert [e["output_index"] for e in added] == list(range(len(added)))
    assert [e["item"]["id"] for e in added] == [e["item"]["id"] for e in done]
    for a, d in zip(added, done, strict=True):
        if "status" in a["item"]:
            assert a["item"]["status"] == "in_progress", a
            assert d["item"]["status"] in ("completed", "failed"), d
    final = events[-1]["response"]
    assert [o["id"] for o in final["output"]] == [e["item"]["id"] for e in done]


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_hosted_tool_create_and_stream(hclient: Any, hsrv: Any, name: str) -> None:
    tool, types, between = EXPECTED[name]
    body = {"model": "gpt-4o", "input": "Find llama facts for me.", "tools": [tool],
            "tool_choice": "required", "include": INCLUDE}
    r = hclient.responses.create(**body)  # strictly validated by the SDK
    assert [o.type for o in r.output] == types
    assert r.status == "completed"
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens
    events = sse(hsrv, body)
    check_items(events)
    assert [o["type"] for o in events[-1]["response"]["output"]] == types
    if between:
        call = next(e["item"] for e in events if e["type"] == "response.output_item.added"
                    and e["item"]["type"] not in ("mcp_list_tools",))
        assert _dedup(_between(events, call["id"])) == between
    # the SDK's streaming helper accumulates the same response
    with hclient.responses.stream(**body) as stream:
        seen = [e.type for e in stream]
        final = stream.get_final_response()
    assert [o.type for o in final.output] == types
    assert seen[0] == "response.created" and seen[-1] == "response.completed"


def test_web_search_citations_slice_the_text(hclient: Any, hsrv: Any) -> None:
    body = {"model": "gpt-4o", "input": "What is the latest news about llamas?",
            "tools": [WEB], "include": ["web_search_call.action.sources"]}
    r = hclient.responses.create(**body)
    call, msg = r.output
    assert call.type == "web_search_call" and call.action.type == "search"
    assert call.action.query and "llama" in call.action.query
    sources = [s.url for s in call.action.sources]
    part = msg.content[0]
    assert part.annotations
    for a in part.annotations:
        assert a.type == "url_citation" and a.url in sources
        domain = a.url.split("/")[2]
        assert part.text[a.start_index:a.end_index] == f"[{domain}]({a.url})"
    assert r.tool_usage is not None and r.tool_usage.web_search.num_requests == 1
    # the stream announces each annotation once, before the text is done
    events = sse(hsrv, body)
    anns = [e for e in events if e["type"] == "response.output_text.annotation.added"]
    assert [e["annotation_index"] for e in anns] == list(range(len(part.annotations)))
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert events.index(anns[-1]) < events.index(done)
    for e in anns:
        a = e["annotation"]
        assert done["text"][a["start_index"]:a["end_index"]].endswith(f"({a['url']})")
    # without include: no sources
    r2 = hclient.responses.create(**{**body, "include": []})
    assert r2.output[0].action.sources is None
    # a deeper search opens the first page and finds the query in it
    deep = hclient.responses.create(**{**body, "tools": [{**WEB, "search_context_size": "high",
                                                          "user_location": {
                                                              "type": "approximate",
                                                              "city": "Paris"}}]})
    actions = [o.action.type for o in deep.output if o.type == "web_search_call"]
    assert actions == ["search", "open_page", "find_in_page"]


def test_file_search_results_from_the_vector_stores(hclient: Any) -> None:
    body = {"model": "gpt-4o", "input": "What does the manual say about refunds?",
            "tools": [FILES], "include": ["file_search_call.results"]}
    r = hclient.responses.create(**body)
    call, msg = r.output
    assert call.queries and call.results
    ids = {x.file_id for x in call.results}
    scores = [x.score for x in call.results]
    assert scores == sorted(scores, reverse=True) and all(0 < s <= 1 for s in scores)
    text = msg.content[0].text
    for a in msg.content[0].annotations:
        assert a.type == "file_citation" and a.file_id in ids and 0 < a.index <= len(text)
    # the same stores give the same files; no include: no results
    r2 = hclient.responses.create(**{**body, "include": []})
    assert r2.output[0].results is None
    r3 = hclient.responses.create(**{**body, "tools": [{**FILES, "max_num_results": 1}]})
    assert len(r3.output[0].results) == 1
    assert r3.output[0].results[0].file_id.startswith("file-")


def test_code_interpreter_streams_code_and_logs(hclient: Any, hsrv: Any) -> None:
    body = {"model": "gpt-4o", "input": "Calculate the average of some numbers.",
            "tools": [{"type": "code_interpreter", "container": "cntr_mine"}],
            "include": ["code_interpreter_call.outputs"]}
    events = sse(hsrv, body)
    code = "".join(e["delta"] for e in events
                   if e["type"] == "response.code_interpreter_call_code.delta")
    done = next(e for e in events if e["type"] == "response.code_interpreter_call_code.done")
    assert code == done["code"] and "print(" in code
    item = events[-1]["response"]["output"][0]
    assert item["container_id"] == "cntr_mine" and item["code"] == code
    (logs,) = item["outputs"]
    assert logs["type"] == "logs" and logs["logs"].startswith("mean = ")
    r = hclient.responses.create(**{**body, "include": []})
    assert r.output[0].outputs is None


def _png_ok(b64: str) -> tuple[int, int]:
    raw = base64.b64decode(b64)
    assert raw[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", raw[16:24])
    at, idat = 8, b""
    while at < len(raw):
        (n,) = struct.unpack(">I", raw[at:at + 4])
        kind, data = raw[at + 4:at + 8], raw[at + 8:at + 8 + n]
        (crc,) = struct.unpack(">I", raw[at + 8 + n:at + 12 + n])
        assert zlib.crc32(kind + data) & 0xFFFFFFFF == crc
        if kind == b"IDAT":
            idat += data
        at += 12 + n
    assert len(zlib.decompress(idat)) == height * (1 + 3 * width)
    return width, height


def test_image_generation_partial_images_and_png(hsrv: Any) -> None:
    events = sse(hsrv, {"model": "gpt-4o", "input": "Draw a llama.", "tools": [IMAGE]})
    partial = [e for e in events if e["type"] == "response.image_generation_call.partial_image"]
    assert [e["partial_image_index"] for e in partial] == [0, 1]
    for e in partial:
        _png_ok(e["partial_image_b64"])
    item = events[-1]["response"]["output"][0]
    assert item["type"] == "image_generation_call" and _png_ok(item["result"]) == (32, 32)
    usage = events[-1]["response"]["tool_usage"]
    assert usage["image_gen"]["output_tokens"] > 0


def test_mcp_approval_round_trip(hclient: Any) -> None:
    tools = [{**MCP, "allowed_tools": ["ask_question", "read_wiki"]}]
    r1 = hclient.responses.create(model="gpt-4o", input="Ask deepwiki about llamas.",
                                  tools=tools)
    listing, request = r1.output
    assert listing.type == "mcp_list_tools" and listing.server_label == "deepwiki"
    assert [t.name for t in listing.tools] == ["ask_question", "read_wiki"]
    assert request.type == "mcp_approval_request" and request.name in ("ask_question",
                                                                      "read_wiki")
    json.loads(request.arguments)
    # approved: the call runs (no second listing), then the answer
    r2 = hclient.responses.create(model="gpt-4o", previous_response_id=r1.id, tools=tools,
                                  input=[{"type": "mcp_approval_response", "approve": True,
                                          "approval_request_id": request.id}])
    types = [o.type for o in r2.output]
    assert types[0] == "mcp_call" and types[-1] == "message" and "mcp_list_tools" not in types
    call = r2.output[0]
    assert call.approval_request_id == request.id and call.name == request.name
    assert call.arguments == request.arguments and call.output and call.status == "completed"
    # denied: no call
    r3 = hclient.responses.create(model="gpt-4o", previous_response_id=r1.id, tools=tools,
                                  tool_choice="none",
                                  input=[{"type": "mcp_approval_response", "approve": False,
                                          "approval_request_id": request.id}])
    assert [o.type for o in r3.output] == ["message"]
    # an approval of a request nobody made
    with pytest.raises(openai.BadRequestError) as ei:
        hclient.responses.create(model="gpt-4o", previous_response_id=r1.id, tools=tools,
                                 input=[{"type": "mcp_approval_response", "approve": True,
                                         "approval_request_id": "mcpr_nope"}])
    assert ei.value.param == "input[0].approval_request_id"


def test_computer_use_loop_of_two_turns(hclient: Any) -> None:
    r1 = hclient.responses.create(model="gpt-4o", input="Open the website and click login.",
                                  tools=[COMPUTER], truncation="auto")
    (call,) = r1.output
    assert call.type == "computer_call" and call.action.type == "screenshot"
    shot = {"type": "computer_screenshot",
            "image_url": "data:image/png;base64," + base64.b64encode(
                sim_hosted.png(random.Random(1))).decode()}
    r2 = hclient.responses.create(
        model="gpt-4o", previous_response_id=r1.id, tools=[COMPUTER], truncation="auto",
        tool_choice="required",
        input=[{"type": "computer_call_output", "call_id": call.call_id, "output": shot}])
    (call2,) = r2.output
    assert call2.type == "computer_call" and call2.action.type in ("click", "type")
    r3 = hclient.responses.create(
        model="gpt-4o", previous_response_id=r2.id, tools=[COMPUTER], truncation="auto",
        input=[{"type": "computer_call_output", "call_id": call2.call_id, "output": shot}])
    assert [o.type for o in r3.output] == ["message"]  # the result is in: it answers
    with pytest.raises(openai.BadRequestError) as ei:
        hclient.responses.create(model="gpt-4o", previous_response_id=r1.id, tools=[COMPUTER],
                                 truncation="auto", input=[{
                                     "type": "computer_call_output", "call_id": "call_nope",
                                     "output": shot}])
    assert ei.value.param == "input[0]"


@pytest.mark.parametrize("tool, output", [
    (SHELL, {"type": "shell_call_output", "output": [{"stdout": "a\nb\n", "stderr": "",
                                                     "outcome": {"type": "exit",
                                                                 "exit_code": 0}}]}),
    (PATCH, {"type": "apply_patch_call_output", "status": "completed", "output": "done"}),
])
def test_client_tools_outputs_come_back(hclient: Any, tool: dict[str, Any],
                                        output: dict[str, Any]) -> None:
    r1 = hclient.responses.create(model="gpt-4o", input="Please do it.", tools=[tool],
                                  tool_choice="required")
    (call,) = r1.output
    r2 = hclient.responses.create(model="gpt-4o", previous_response_id=r1.id, tools=[tool],
                                  input=[{**output, "call_id": call.call_id}])
    assert [o.type for o in r2.output] == ["message"]
    # stateless: the call and its output replayed as input
    r3 = hclient.responses.create(model="gpt-4o", tools=[tool], input=[
        {"role": "user", "content": "Please do it."}, call.model_dump(exclude_none=True),
        {**output, "call_id": call.call_id}])
    assert r3.status == "completed"


def test_the_policy_picks_the_tool_the_user_asks_for(hclient: Any) -> None:
    tools = [WEB, CODE, FILES]
    pick = {"Calculate the average and compute statistics of these numbers":
            "code_interpreter_call",
            "Search the web for the latest news today": "web_search_call",
            "What do my uploaded documents say in the manual?": "file_search_call"}
    for text, kind in pick.items():
        r = hclient.responses.create(model="gpt-4o", input=text, tools=tools)
        assert r.output[0].type == kind, text
    r = hclient.responses.create(model="gpt-4o", input="x", tools=tools, tool_choice="none")
    assert [o.type for o in r.output] == ["message"]
    # a forced hosted tool
    r = hclient.responses.create(model="gpt-4o", input="Calculate something",
                                 tools=[{"type": "web_search_preview"}, CODE],
                                 tool_choice={"type": "web_search_preview"})
    assert r.output[0].type == "web_search_call"
    # allowed_tools naming a hosted tool
    r = hclient.responses.create(model="gpt-4o", input="Calculate something", tools=tools,
                                 tool_choice={"type": "allowed_tools", "mode": "required",
                                              "tools": [{"type": "file_search"}]})
    assert r.output[0].type == "file_search_call"


def test_scripted_hosted_turns(make_server: Any, tmp_path: Any) -> None:
    script = {"rules": [{"match": {"contains": "llmsim"}, "reply": [{"tool_calls": [
        {"name": "web_search", "arguments": {
            "query": "llmsim docs",
            "sources": [{"url": "https://llmsim.dev/docs", "title": "llmsim docs"}]}},
    ]}]}, {"match": {"contains": "broken"}, "reply": [{"tool_calls": [
        {"name": "mcp:deepwiki", "arguments": {"name": "ask_question",
                                               "error": "server down"}}]}]},
        {"match": {"contains": "wiki"}, "reply": [{"tool_calls": [
        {"name": "mcp:deepwiki", "arguments": {
            "name": "ask_question", "arguments": {"question": "why"}, "output": "Because.",
            "tools": ["read_wiki", {"name": "ask_question", "description": "Ask it."}]}}]}]}]}
    path = tmp_path / "s.json"
    path.write_text(json.dumps(script))
    srv = make_server(script=str(path))
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0,
                      _strict_response_validation=True)
    r = c.responses.create(model="gpt-4o", input="tell me about llmsim", tools=[WEB],
                           include=["web_search_call.action.sources"])
    assert r.output[0].action.query == "llmsim docs"
    assert [s.url for s in r.output[0].action.sources] == ["https://llmsim.dev/docs"]
    ann = r.output[1].content[0].annotations
    assert ann and ann[0].url == "https://llmsim.dev/docs"
    r = c.responses.create(model="gpt-4o", input="ask the wiki", tools=[MCP_NEVER])
    assert [(t.name, t.description) for t in r.output[0].tools] == [
        ("read_wiki", None), ("ask_question", "Ask it.")]
    call = r.output[1]
    assert call.type == "mcp_call" and call.name == "ask_question"
    assert call.output == "Because." and json.loads(call.arguments) == {"question": "why"}
    body = {"model": "gpt-4o", "input": "the broken wiki", "tools": [MCP_NEVER]}
    r = c.responses.create(**body)
    call = r.output[1]
    assert call.status == "failed" and call.output is None
    assert call.error is not None and call.error.type == "mcp_tool_execution_error"
    types = [e["type"] for e in sse(srv, body)]
    assert "response.mcp_call.failed" in types and "response.mcp_call.completed" not in types


@pytest.mark.parametrize("tools, param", [
    ([{"type": "function", "name": f"f{i}"} for i in range(129)], "tools"),
    ([{**MCP, "server_label": f"s{i}"} for i in range(17)], "tools"),
    ([MCP, MCP], "tools[1].server_label"),
    ([{**MCP, "allowed_tools": [f"t{i}" for i in range(65)]}], "tools[0].allowed_tools"),
    ([{**MCP, "allowed_tools": {"tool_names": [1]}}], "tools[0].allowed_tools[0]"),
    ([{**MCP, "require_approval": "sometimes"}], "tools[0].require_approval"),
    ([{**FILES, "vector_store_ids": [f"vs_{i}" for i in range(17)]}],
     "tools[0].vector_store_ids"),
    ([{**FILES, "vector_store_ids": []}], "tools[0].vector_store_ids"),
    ([{**FILES, "max_num_results": 51}], "tools[0].max_num_results"),
    ([{**IMAGE, "partial_images": 4}], "tools[0].partial_images"),
    ([{**WEB, "search_context_size": "huge"}], "tools[0].search_context_size"),
    ([{"type": "code_interpreter", "container": {"type": "manual"}}],
     "tools[0].container.type"),
    ([{**COMPUTER, "display_width": 0}], "tools[0].display_width"),
])
def test_hosted_tool_bounds(hsrv: Any, tools: list[dict[str, Any]], param: str) -> None:
    r = rawhttp.request(hsrv.url, "POST", "/v1/responses",
                        {"model": "gpt-4o", "input": "x", "tools": tools})
    assert r.status == 400 and r.json()["error"]["param"] == param, r.body


def test_pending_approvals_bound(hsrv: Any) -> None:
    answers = [{"type": "mcp_approval_response", "approve": True,
                "approval_request_id": f"mcpr_{i}"} for i in range(17)]
    r = rawhttp.request(hsrv.url, "POST", "/v1/responses",
                        {"model": "gpt-4o", "input": answers, "tools": [MCP]})
    assert r.status == 400 and r.json()["error"]["param"] == "input", r.body


def test_hosted_tool_time_comes_from_the_profile() -> None:
    prof = ModelProfile("m", ttft_jitter=0.0)
    rng = random.Random(1)
    assert sim_hosted.seconds(Latency(prof, instant=True), rng, "web_search") == 0.0
    assert sim_hosted.seconds(Latency(prof), rng, "web_search") == \
        sim_hosted.HOSTED_SECONDS["web_search"]
    assert sim_hosted.seconds(Latency(prof, fixed_ttft_ms=250), rng, "mcp_call") == 0.25
    # a search takes seconds, many token gaps
    assert sim_hosted.HOSTED_SECONDS["web_search"] > 50 * prof.itl_ms / 1000


def test_hosted_time_is_in_the_schedule(make_server: Any) -> None:
    """The plan of a web search waits the search's time between searching and completed."""
    srv = make_server(ttft_ms=0, itl_ms=0)
    app = srv.app
    from llmsim.api.responses import render
    from llmsim.api.responses.parse import ask, parse_body
    from llmsim.sim.decide import decide
    body = {"model": "gpt-4o", "input": "search the web", "tools": [WEB],
            "tool_choice": "required"}
    rr = parse_body(body, app)
    items = rr.input_items
    asked = ask(rr, items, 10, 0)
    rng = random.Random(7)
    lat = Latency(rr.profile)
    d = decide(asked, app.config, rng, lat)
    out = api_hosted.response_out(d, asked, rr, items, items, app.config, rng, lat, "resp_x", 0)
    plan = list(render.plan(render.echo_fields(rr), out))
    types = [t for _, t, _ in plan]
    i = types.index("response.web_search_call.completed")
    assert plan[i][0] == out.extra > 1.0  # the search's seconds, before it completes


def test_openai_agents_hosted_tools(hsrv: Any) -> None:
    from agents import (
        Agent,
        CodeInterpreterTool,
        FileSearchTool,
        HostedMCPTool,
        ImageGenerationTool,
        OpenAIResponsesModel,
        Runner,
        WebSearchTool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    tools: list[Any] = [
        WebSearchTool(), FileSearchTool(vector_store_ids=["vs_1"], include_search_results=True),
        CodeInterpreterTool(tool_config={"type": "code_interpreter",
                                         "container": {"type": "auto"}}),
        ImageGenerationTool(tool_config={"type": "image_generation", "quality": "low"}),
        HostedMCPTool(tool_config={"type": "mcp", "server_label": "deepwiki",
                                   "server_url": "https://mcp.example.com/mcp",
                                   "require_approval": "never"})]

    async def go(tool: Any, question: str) -> Any:
        client = openai.AsyncOpenAI(base_url=hsrv.url + "/v1", api_key="sk-test",
                                    max_retries=0)
        agent = Agent(name="helper", instructions="Use your tool.", tools=[tool],
                      model=OpenAIResponsesModel(model="gpt-4o", openai_client=client))
        try:
            return await Runner.run(agent, question)
        finally:
            await client.close()

    for tool in tools:
        result = asyncio.run(go(tool, "Find llama facts."))
        kinds = [getattr(i.raw_item, "type", None) for i in result.new_items]
        assert isinstance(result.final_output, str) and result.final_output, kinds
        assert any(k and k.endswith(("_call", "mcp_list_tools")) for k in kinds), kinds


def test_hosted_tools_over_websocket(hclient: Any) -> None:
    """The same items and events over the WebSocket mode, each event strictly valid."""
    with hclient.responses.connect() as conn:
        conn.response.create(model="gpt-4o", input="Search the web for llamas.", tools=[WEB],
                             tool_choice="required")
        events = []
        while True:
            ev = json.loads(conn.recv_bytes())
            SSE_EVENT.validate_python(ev, strict=True)
            events.append(ev)
            if ev["type"] in ("response.completed", "error"):
                break
    check_items(events)
    types = [e["type"] for e in events]
    assert "response.web_search_call.searching" in types
    assert [o["type"] for o in events[-1]["response"]["output"]] == ["web_search_call",
                                                                      "message"]


def test_cited_text_streams_whole_with_logprobs(hsrv: Any) -> None:
    """Citations inserted into the answer stream as deltas too, each with its logprob."""
    events = sse(hsrv, {"model": "gpt-4o", "input": "Search the web for llamas.",
                        "tools": [WEB], "tool_choice": "required", "top_logprobs": 2,
                        "include": ["message.output_text.logprobs"]})
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert "".join(e["delta"] for e in deltas) == done["text"]
    assert len(done["logprobs"]) == len(deltas) and all(len(e["logprobs"]) == 1
                                                         for e in deltas)
    assert "](https://" in done["text"]


def test_shell_command_events(hsrv: Any) -> None:
    events = sse(hsrv, {"model": "gpt-4o", "input": "List the files.", "tools": [SHELL],
                        "tool_choice": "required"})
    call = events[-1]["response"]["output"][0]
    cmds = call["action"]["commands"]
    assert call["type"] == "shell_call" and cmds
    for ci, cmd in enumerate(cmds):
        mine = [e for e in events if e["type"].startswith("response.shell_call_command.")
                and e["command_index"] == ci]
        assert mine[0]["type"].endswith(".added") and mine[-1]["type"].endswith(".done")
        assert "".join(e["delta"] for e in mine if e["type"].endswith(".delta")) == cmd
        assert mine[-1]["command"] == cmd and all("item_id" not in e for e in mine)


def test_openai_agents_hosted_mcp_with_approval(hsrv: Any) -> None:
    """The agents SDK's approval callback approves the request: the call runs and the
    agent gets the answer (the replayed items are accepted as input)."""
    from agents import Agent, HostedMCPTool, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    approved: list[str] = []

    def approve(req: Any) -> Any:
        approved.append(req.data.name)
        return {"approve": True}

    tool = HostedMCPTool(tool_config={"type": "mcp", "server_label": "deepwiki",
                                      "server_url": "https://mcp.example.com/mcp",
                                      "require_approval": "always"},
                         on_approval_request=approve)

    async def go() -> Any:
        client = openai.AsyncOpenAI(base_url=hsrv.url + "/v1", api_key="sk-test",
                                    max_retries=0)
        agent = Agent(name="helper", instructions="Use deepwiki.", tools=[tool],
                      model=OpenAIResponsesModel(model="gpt-4o", openai_client=client))
        try:
            return await Runner.run(agent, "Ask deepwiki about llamas.")
        finally:
            await client.close()

    result = asyncio.run(go())
    kinds = [getattr(i.raw_item, "type", None) for i in result.new_items]
    assert len(approved) == 1 and "mcp_call" in kinds, kinds
    assert isinstance(result.final_output, str) and result.final_output


def test_hosted_response_in_background_and_replayed(hclient: Any, hsrv: Any) -> None:
    """A background response runs its hosted tool on the server's clock; a stored response
    replays the same hosted events (the plan is rendered again, not kept)."""
    import time

    r = hclient.responses.create(model="gpt-4o", input="Calculate the mean.", tools=[CODE],
                                 tool_choice="required", background=True)
    for _ in range(200):
        r = hclient.responses.retrieve(r.id)
        if r.status == "completed":
            break
        time.sleep(0.01)
    assert [o.type for o in r.output] == ["code_interpreter_call", "message"]
    live = sse(hsrv, {"model": "gpt-4o", "input": "Search the web for llamas.",
                      "tools": [WEB], "tool_choice": "required"})
    rid = live[0]["response"]["id"]
    again = rawhttp.request(hsrv.url, "GET", f"/v1/responses/{rid}?stream=true")
    replay = [json.loads(d) for _, d in again.sse()]
    assert replay == live


def test_hosted_items_cost_tokens_in_a_prompt(hclient: Any) -> None:
    """What the model reads of a hosted item counts (not its ids, not image bytes)."""
    def count(items: list[dict[str, Any]]) -> int:
        return hclient.responses.input_tokens.count(model="gpt-4o",
                                                    input=items).input_tokens

    user = {"role": "user", "content": "hi"}
    small = {"type": "mcp_call", "id": "mcp_1", "server_label": "s", "name": "f",
             "arguments": "{}", "output": "ok"}
    big = {**small, "output": "word " * 500}
    assert count([user, big]) > count([user, small]) + 400
    shot = {"type": "computer_call_output", "call_id": "c1", "output": {
        "type": "computer_screenshot", "image_url": "data:image/png;base64," + "A" * 50_000}}
    call = {"type": "computer_call", "id": "cu_1", "call_id": "c1", "status": "completed",
            "action": {"type": "screenshot"}, "pending_safety_checks": []}
    assert count([user, call, shot]) - count([user, call]) == 3 + 85
