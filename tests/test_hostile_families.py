"""Hostile input on the other providers' families (issue 32): Gemini, Ollama, Azure OpenAI and
Bedrock. A seeded, bounded mutator (wrong types, hostile numbers, deep nesting, long strings
and arrays, removed and unknown keys) starts from valid bodies of each generating route; every
case must get a status below 500, a 4xx in the family's own error shape, or a 2xx whose
stream ends with the family's terminal (NDJSON ``done``/``error`` line, the JSON array's
``]``, an event-stream ``metadata``/``message_stop``/``exception`` message with valid CRCs).
After the run the server's live gauges are idle and ``/health`` answers. ``FUZZ_SEED`` and
``FUZZ_CASES`` change the seed and the cases per route."""

from __future__ import annotations

import copy
import json
import os
import random
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest

from llmsim import Config, ServerThread
from tests import rawhttp
from tests.test_bedrock import frames

SEED = int(os.environ.get("FUZZ_SEED", "32"))
CASES = int(os.environ.get("FUZZ_CASES", "40"))
MODEL_B = "us.anthropic.claude-haiku-4-5-20251001-v1:0"
TOOL_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}},
               "required": ["city"]}


def _gemini_ok(status: int, body: bytes, stream: bool) -> str | None:
    if status >= 400:
        e = json.loads(body).get("error", {})
        return None if {"code", "message", "status"} <= set(e) else "not Google's envelope"
    if stream:
        data = json.loads(body)  # the JSON array, closed
        return None if isinstance(data, list) else "not a JSON array"
    return None if "candidates" in json.loads(body) else "no candidates"


def _ollama_ok(status: int, body: bytes, stream: bool) -> str | None:
    lines = [json.loads(x) for x in body.decode().splitlines() if x]
    if status >= 400:
        return None if len(lines) == 1 and set(lines[0]) == {"error"} else "not Ollama's error"
    last = lines[-1]
    return None if last.get("done") is True or "error" in last else "no done line"


def _azure_ok(status: int, body: bytes, stream: bool) -> str | None:
    if status >= 400:
        e = json.loads(body).get("error")
        return None if isinstance(e, dict) and "message" in e else "not an error envelope"
    if stream:
        return None if body.rstrip().endswith(b"data: [DONE]") else "no [DONE]"
    return None if "prompt_filter_results" in json.loads(body) else "no filter results"


def _bedrock_ok(status: int, body: bytes, stream: bool, headers: dict[str, str]) -> str | None:
    if status >= 400:
        if not headers.get("x-amzn-errortype", "").endswith("Exception:http://internal."
                                                            "amazon.com/coral/com.amazon."
                                                            "bedrock/"):
            return "no x-amzn-errortype"
        return None if set(json.loads(body)) == {"message"} else "not Bedrock's error body"
    if stream:
        got = frames(body)  # (checks both CRCs)
        last = got[-1][0]
        return None if last.get(":event-type") in ("metadata", "chunk") or \
            last.get(":message-type") == "exception" else "no terminal message"
    return None


def _gemini_body() -> dict[str, Any]:
    return {"contents": [{"role": "user", "parts": [{"text": "What is the weather in Paris?"}]}],
            "systemInstruction": {"parts": [{"text": "Be brief."}]},
            "tools": [{"functionDeclarations": [{"name": "get_weather", "description": "w",
                                                 "parameters": {"type": "OBJECT", "properties": {
                                                     "city": {"type": "STRING"}}}}]}],
            "generationConfig": {"maxOutputTokens": 20, "temperature": 0.5,
                                 "stopSequences": ["x"],
                                 "thinkingConfig": {"thinkingBudget": 0}}}


def _ollama_body() -> dict[str, Any]:
    return {"model": "llama3.2", "messages": [{"role": "system", "content": "Be brief."},
                                              {"role": "user", "content": "Weather in Paris?"}],
            "tools": [{"type": "function", "function": {"name": "get_weather",
                                                        "parameters": TOOL_SCHEMA}}],
            "options": {"num_predict": 20, "temperature": 0.5, "stop": ["x"]},
            "format": "json", "think": False}


def _azure_body() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 20,
            "tools": [{"type": "function", "function": {"name": "get_weather",
                                                        "parameters": TOOL_SCHEMA}}],
            "temperature": 0.5}


def _bedrock_body() -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": [{"text": "Weather in Paris?"}]}],
            "system": [{"text": "Be brief."}],
            "inferenceConfig": {"maxTokens": 20, "temperature": 0.5, "stopSequences": ["x"]},
            "toolConfig": {"tools": [{"toolSpec": {"name": "get_weather", "inputSchema": {
                "json": TOOL_SCHEMA}}}]}}


def _invoke_body() -> dict[str, Any]:
    return {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 20,
            "messages": [{"role": "user", "content": "Weather in Paris?"}]}


def _nova_body() -> dict[str, Any]:
    return {"schemaVersion": "messages-v1", **{k: v for k, v in _bedrock_body().items()
                                               if k != "inferenceConfig"},
            "inferenceConfig": {"max_new_tokens": 20, "top_k": 5, "stopSequences": ["x"]}}


# (path, body factory, stream flag key or None, checker with (status, body, stream, headers))
Check = Callable[[int, bytes, bool, dict[str, str]], str | None]
ROUTES: list[tuple[str, Callable[[], dict[str, Any]], Check]] = [
    ("/v1beta/models/gemini-2.0-flash:generateContent", _gemini_body,
     lambda s, b, st, h: _gemini_ok(s, b, False)),
    ("/v1beta/models/gemini-2.0-flash:streamGenerateContent", _gemini_body,
     lambda s, b, st, h: _gemini_ok(s, b, True)),
    ("/api/chat", _ollama_body, lambda s, b, st, h: _ollama_ok(s, b, st)),
    ("/openai/deployments/gpt-4o/chat/completions?api-version=2024-10-21", _azure_body,
     lambda s, b, st, h: _azure_ok(s, b, st)),
    (f"/model/{MODEL_B}/converse", _bedrock_body,
     lambda s, b, st, h: _bedrock_ok(s, b, False, h)),
    (f"/model/{MODEL_B}/converse-stream", _bedrock_body,
     lambda s, b, st, h: _bedrock_ok(s, b, True, h)),
    (f"/model/{MODEL_B}/invoke-with-response-stream", _invoke_body,
     lambda s, b, st, h: _bedrock_ok(s, b, True, h)),
    ("/model/us.amazon.nova-lite-v1:0/invoke-with-response-stream", _nova_body,
     lambda s, b, st, h: _bedrock_ok(s, b, True, h)),
]

HOSTILE: list[Any] = [None, True, -1, 0, 2 ** 70, 1e30, -0.0, "", "x" * 70_000, [], {},
                      [[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]], {"\u0000": ""},
                      "\u202e\u0000", list(range(5000))]


def _paths(obj: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [at]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, at + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _paths(v, at + (i,))
    return out


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = value
    return obj


def mutate(body: dict[str, Any], rng: random.Random) -> Any:
    body = copy.deepcopy(body)
    for _ in range(rng.randint(1, 3)):
        paths = _paths(body)
        path = rng.choice(paths)
        op = rng.random()
        if op < 0.55:
            body = _set(body, path, copy.deepcopy(rng.choice(HOSTILE)))
        elif op < 0.7 and path:
            parent = body
            for k in path[:-1]:
                parent = parent[k]
            del parent[path[-1]]
        elif op < 0.8:
            target = body
            for k in path:
                target = target[k]
            if isinstance(target, dict):
                target[rng.choice(["bogus", "stream", "model", "n", "\u00e9"])] = rng.choice(
                    HOSTILE[:8])
        elif op < 0.9:
            body = _set(body, path, [copy.deepcopy(body if not path else 1)] * 3)
        else:
            nested: Any = "x"
            for _ in range(rng.choice((10, 60, 200))):
                nested = {"a": [nested]}
            body = _set(body, path, nested)
        if not isinstance(body, (dict, list)):
            break
    return body


@pytest.fixture(scope="module")
def srv() -> Any:
    with ServerThread(Config(port=0, latency="instant", seed=1, quiet=True)) as s:
        yield s


@pytest.mark.parametrize("route", ROUTES, ids=[r[0].split("?")[0] for r in ROUTES])
def test_mutated_bodies_get_the_familys_answer(srv: Any, route: Any) -> None:
    path, make, check = route
    rng = random.Random(f"{SEED}:{path}")
    failures = []
    for i in range(CASES):
        body = mutate(make(), rng)
        raw = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
        r = rawhttp.request(srv.url, "POST", path, raw,
                            headers=[("content-type", "application/json")])
        stream = "stream" in path.lower() or path == "/api/chat" and not (
            isinstance(body, dict) and body.get("stream") is False) or (
            isinstance(body, dict) and body.get("stream") is True)
        try:
            problem = None if r.status < 500 else f"status {r.status}"
            problem = problem or check(r.status, r.body, stream, r.headers)
        except (ValueError, KeyError, IndexError, AssertionError, struct.error) as exc:
            problem = f"unparsable answer: {exc!r}"
        if problem:
            failures.append(f"case {i}: {problem}: {raw[:300]!r} -> {r.status} {r.body[:300]!r}")
    assert not failures, "\n".join(failures[:5])


def test_gauges_idle_and_health(srv: Any) -> None:
    st = srv.app.stats
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (st.active_requests, st.active_streams) != (0, 0):
        time.sleep(0.01)
    assert (st.active_requests, st.active_streams) == (0, 0)
    assert rawhttp.request(srv.url, "GET", "/health").status == 200


def test_bad_json_and_non_objects_per_family(srv: Any) -> None:
    for path, _make, check in ROUTES:
        for raw in (b"{not json", b"[1, 2]", b'"x"', b"", b"\xff\xfe"):
            r = rawhttp.request(srv.url, "POST", path, raw,
                                headers=[("content-type", "application/json")])
            assert 400 <= r.status < 500, (path, raw, r.status)
            assert check(r.status, r.body, False, r.headers) is None, (path, raw, r.body[:200])

