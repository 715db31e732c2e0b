"""Open Responses compliance of the Responses API: every Response object and streaming event
llmsim sends validates against the specification's JSON Schemas (tests/openresponses_spec.py),
over HTTP (JSON and SSE) and WebSocket, and WebSocket errors carry a string ``code``."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from openai import OpenAI

from . import rawhttp
from .openresponses_spec import conforms, event_conforms

SHORT = {"output_tokens_mean": 12, "output_tokens_sigma": 0}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}}


@pytest.fixture
def osrv(make_server: Any) -> Any:
    return make_server(**SHORT)


def test_spec_judges() -> None:
    """The validator can fail: a Response without the penalties is rejected."""
    with pytest.raises(jsonschema.ValidationError):
        conforms({"id": "resp_1", "object": "response"}, "ResponseResource")


@pytest.mark.parametrize("body", [
    {"input": "Hello"},
    {"input": "Weather in Paris?", "tools": [WEATHER], "tool_choice": "required"},
    {"input": "Hi", "presence_penalty": 0.5, "frequency_penalty": -1.0, "temperature": 0.3},
])
def test_json_response_conforms(osrv: Any, body: dict[str, Any]) -> None:
    r = rawhttp.request(osrv.url, "POST", "/v1/responses", {"model": "gpt-4o", **body})
    assert r.status == 200, r.body
    resp = r.json()
    conforms(resp, "ResponseResource")
    assert resp["presence_penalty"] == body.get("presence_penalty", 0)
    assert resp["frequency_penalty"] == body.get("frequency_penalty", 0)
    got = rawhttp.request(osrv.url, "GET", f"/v1/responses/{resp['id']}").json()
    conforms(got, "ResponseResource")
    assert got["presence_penalty"] == resp["presence_penalty"]


@pytest.mark.parametrize("model", ["gpt-4o", "o3"])
def test_sse_events_conform(osrv: Any, model: str) -> None:
    body = {"model": model, "input": "Tell me a story.", "stream": True,
            "presence_penalty": 1}
    if model == "o3":
        body["reasoning"] = {"effort": "low", "summary": "auto"}
    r = rawhttp.request(osrv.url, "POST", "/v1/responses", body)
    assert r.status == 200, r.body
    events = [json.loads(d) for _, d in r.sse()]
    assert events[-1]["type"] == "response.completed"
    for ev in events:
        event_conforms(ev)
        if "response" in ev:
            assert ev["response"]["presence_penalty"] == 1
            assert ev["response"]["frequency_penalty"] == 0


@pytest.mark.parametrize("value", [2.5, -3, "high"])
def test_penalty_out_of_range_is_400(osrv: Any, value: Any) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        r = rawhttp.request(osrv.url, "POST", "/v1/responses",
                            {"model": "gpt-4o", "input": "x", name: value})
        assert r.status == 400 and r.json()["error"]["param"] == name


def test_websocket_events_and_errors_conform(osrv: Any) -> None:
    with OpenAI(base_url=osrv.url + "/v1", api_key="sk-test", max_retries=0) as c, \
            c.responses.connect() as conn:
        conn.send({"type": "response.create", "model": "gpt-4o", "input": "Hi",  # type: ignore[typeddict-unknown-key]
                   "frequency_penalty": 0.25})
        events = []
        while True:
            ev = json.loads(conn.recv_bytes())
            events.append(ev)
            if ev["type"] in ("response.completed", "error"):
                break
        assert events[-1]["type"] == "response.completed"
        for ev in events:
            event_conforms(ev)
        assert events[-1]["response"]["frequency_penalty"] == 0.25
        # failures: an unknown continuation and a request with no model
        conn.response.create(model="gpt-4o", input="x",
                             previous_response_id="resp_doesnotexist")
        conn.send({"type": "response.create", "input": "no model"})  # type: ignore[typeddict-item]
        conn.response.create(model="gpt-4o", input=[  # an error with no code of its own
            {"type": "function_call_output", "call_id": "call_nope", "output": "x"}])
        for _ in range(3):
            err = json.loads(conn.recv_bytes())
            assert err["type"] == "error"
            conforms(err, "WebSocketErrorEvent")
            assert isinstance(err["error"]["code"], str)


@pytest.mark.parametrize("body, kind", [
    ({"input": "Search the configured vector store for relevant content and summarize one "
               "result.", "tools": [{"type": "file_search", "vector_store_ids": ["vs_abc"]}],
      "tool_choice": {"type": "file_search"}, "include": ["file_search_call.results"]},
     "file_search_call"),
    ({"input": "Find the most relevant cached result for OpenResponses.",
      "tools": [{"type": "web_search", "external_web_access": False}],
      "tool_choice": {"type": "web_search"}, "include": ["web_search_call.action.sources"]},
     "web_search_call"),
])
def test_search_requests_of_the_compliance_suite(osrv: Any, body: dict[str, Any],
                                                 kind: str) -> None:
    """The suite's optional search tests (a vector store id, offline web search), answered
    by the simulated hosted tools, and strictly valid for the openai SDK."""
    from openai.types.responses import Response

    r = rawhttp.request(osrv.url, "POST", "/v1/responses", {"model": "gpt-4o", **body})
    assert r.status == 200, r.body
    resp = r.json()
    Response.model_validate(resp, strict=True)
    assert resp["status"] == "completed"
    assert [o["type"] for o in resp["output"]] == [kind, "message"]
