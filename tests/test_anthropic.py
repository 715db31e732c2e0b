"""Anthropic Messages through the official ``anthropic`` SDK (sync, async, streaming helper,
tool loop, thinking, count_tokens, models) and raw for the wire, errors and generic layers."""

from __future__ import annotations

from typing import Any

import anthropic
import orjson
import pytest

from llmsim.config import CapacityConfig, RateLimitConfig

from . import rawhttp

MODEL = "claude-sonnet-5-5"
HI = [{"role": "user", "content": "Hi"}]
TOOLS = [{"name": "get_weather", "description": "Current weather for a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]


@pytest.fixture
def ant(make_server: Any) -> Any:
    """The SDK on a server with the product defaults (natural lengths); raw wire checks use
    the shared ``srv`` (exact lengths)."""
    srv = make_server(max_tokens_mode="natural")
    with anthropic.Anthropic(base_url=srv.url + "/anthropic", api_key="sk-ant-x",
                             max_retries=0) as c:
        yield c


def test_create_and_the_sdk_base_url_path(srv: Any, ant: Any) -> None:
    m = ant.messages.create(model=MODEL, max_tokens=64, messages=HI)
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert m.id.startswith("msg_") and m.content[0].type == "text" and m.content[0].text
    assert m.stop_reason in ("end_turn", "max_tokens") and m.usage.input_tokens > 0
    assert 1 <= m.usage.output_tokens <= 64
    with anthropic.Anthropic(base_url=srv.url, api_key="x", max_retries=0) as plain:
        r = plain.messages.with_raw_response.create(model=MODEL, max_tokens=8, messages=HI)
        assert r.headers["request-id"] and r.parse().stop_reason


async def test_async_client(srv: Any) -> None:
    async with anthropic.AsyncAnthropic(base_url=srv.url + "/anthropic", api_key="x",
                                        max_retries=0) as c:
        m = await c.messages.create(model=MODEL, max_tokens=16, messages=HI)
        assert m.content[0].type == "text"


def test_stream_helper_and_the_event_sequence(srv: Any, ant: Any) -> None:
    with ant.messages.stream(model=MODEL, max_tokens=2000, messages=HI) as s:
        final = s.get_final_message()
    assert final.stop_reason == "end_turn" and final.content[0].text
    r = rawhttp.request(srv.url, "POST", "/anthropic/v1/messages",
                        {"model": MODEL, "max_tokens": 10, "messages": HI, "stream": True})
    names = [n for n, _ in rawhttp.parse_sse(r.body)]
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    datas = [orjson.loads(d) for _, d in rawhttp.parse_sse(r.body)]
    deltas = [d for d in datas if d["type"] == "content_block_delta"]
    assert all(d["delta"]["type"] == "text_delta" for d in deltas)
    md = datas[-2]
    assert md["usage"]["output_tokens"] == len(deltas) == 10
    assert md["delta"]["stop_reason"] == "max_tokens"


def test_tool_use_loop(ant: Any) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    m = ant.messages.create(model=MODEL, max_tokens=300, tools=TOOLS, messages=ask)
    assert m.stop_reason == "tool_use"
    use = m.content[-1]
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    assert isinstance(use.input["city"], str)
    m2 = ant.messages.create(model=MODEL, max_tokens=300, tools=TOOLS, messages=[
        *ask, {"role": "assistant", "content": m.content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "sunny"}]}])
    assert m2.stop_reason == "end_turn" and m2.content[0].type == "text"
    # streamed: input_json_delta pieces accumulate to the same kind of input
    with ant.messages.stream(model=MODEL, max_tokens=300, tools=TOOLS, messages=ask,
                             tool_choice={"type": "tool", "name": "get_weather"}) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use" and final.content[-1].input["city"]


def test_thinking_blocks_with_signature(ant: Any) -> None:
    with ant.messages.stream(model=MODEL, max_tokens=4000, messages=HI,
                             thinking={"type": "enabled", "budget_tokens": 2000}) as s:
        final = s.get_final_message()
    kinds = [b.type for b in final.content]
    assert kinds == ["thinking", "text"] and final.content[0].signature
    assert final.content[0].thinking and final.usage.output_tokens <= 4000
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        ant.messages.create(model=MODEL, max_tokens=1500, messages=HI,
                            thinking={"type": "enabled", "budget_tokens": 2000})


def test_stop_sequences(make_server: Any) -> None:
    srv = make_server(text="fixed", fixed_text="alpha beta STOP gamma")
    with anthropic.Anthropic(base_url=srv.url + "/anthropic", api_key="x", max_retries=0) as c:
        m = c.messages.create(model=MODEL, max_tokens=50, messages=HI, stop_sequences=["STOP"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"
    assert m.content[0].text == "alpha beta "


def test_count_tokens_and_models(ant: Any) -> None:
    n = ant.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "Hello"}])
    assert n.input_tokens > 0
    ids = [m.id for m in ant.models.list()]
    assert MODEL in ids and all(i.startswith("claude") for i in ids)


@pytest.mark.parametrize("body, etype", [
    ({"model": MODEL, "messages": HI}, "invalid_request_error"),  # max_tokens required
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
     "invalid_request_error"),
    ({"model": MODEL, "max_tokens": 5, "messages": HI, "bogus": 1}, "invalid_request_error"),
    ({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "nope"}]}]}, "invalid_request_error"),
    ({"model": MODEL, "max_tokens": 10**7, "messages": HI}, "invalid_request_error"),
])
def test_errors_use_anthropics_envelope(srv: Any, body: dict[str, Any], etype: str) -> None:
    r = rawhttp.request(srv.url, "POST", "/v1/messages", body)
    assert r.status == 400
    err = orjson.loads(r.body)
    assert err["type"] == "error" and err["error"]["type"] == etype and err["error"]["message"]


def test_x_api_key_auth(make_server: Any) -> None:
    srv = make_server(api_key=("sk-ant-good",))
    with anthropic.Anthropic(base_url=srv.url + "/anthropic", api_key="sk-ant-good",
                             max_retries=0) as c:
        assert c.messages.create(model=MODEL, max_tokens=4, messages=HI).content
    with anthropic.Anthropic(base_url=srv.url + "/anthropic", api_key="sk-bad",
                             max_retries=0) as c:
        with pytest.raises(anthropic.AuthenticationError):
            c.messages.create(model=MODEL, max_tokens=4, messages=HI)


def test_capacity_rejection_is_529_overloaded(make_server: Any) -> None:
    """A request beyond the engine's sequences and queue: Anthropic's 529 overloaded_error."""
    import threading

    from .test_websocket_raw import wait_for

    srv = make_server(latency="realistic", ttft_ms=50, itl_ms=10,
                      capacity=CapacityConfig(max_seqs=1, queue=0))
    body = {"model": MODEL, "max_tokens": 150, "messages": HI}
    t = threading.Thread(target=rawhttp.request, args=(srv.url, "POST", "/v1/messages", body))
    t.start()
    try:
        # (capacity on puts the hosted model on the serving scheduler: /llmsim/engines)
        assert wait_for(lambda: any(e["running"] == 1 for e in rawhttp.request(
            srv.url, "GET", "/llmsim/engines").json()["data"]))
        r = rawhttp.request(srv.url, "POST", "/v1/messages", body)
        assert r.status == 529, r.body
        assert orjson.loads(r.body)["error"]["type"] == "overloaded_error"
    finally:
        t.join()


def test_rate_limit_headers_are_anthropics(make_server: Any) -> None:
    srv = make_server(ratelimit=RateLimitConfig(rpm=100))
    r = rawhttp.request(srv.url, "POST", "/v1/messages",
                        {"model": MODEL, "max_tokens": 4, "messages": HI})
    assert r.headers["anthropic-ratelimit-requests-limit"] == "100"
    assert r.headers["anthropic-ratelimit-requests-reset"].endswith("Z")
    assert "x-ratelimit-limit-requests" not in r.headers


def test_mid_stream_fault_is_an_error_event(srv: Any) -> None:
    r = rawhttp.request(srv.url, "POST", "/anthropic/v1/messages",
                        {"model": MODEL, "max_tokens": 10, "messages": HI, "stream": True},
                        headers=[("x-llmsim-fault", "error-after:3")])
    events = rawhttp.parse_sse(r.body)
    assert events[-1][0] == "error"
    err = orjson.loads(events[-1][1])
    assert err["type"] == "error" and err["error"]["type"] == "api_error"
    assert sum(1 for n, _ in events if n == "content_block_delta") == 3
