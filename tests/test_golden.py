"""Golden transcripts (issue 30): the wire bytes of every generating family, seeded, over
JSON, SSE and WebSocket, for text, tool calls, reasoning and errors, kept in
``tests/data/golden/`` and compared byte for byte (ids and clock times normalised). A change
of what a client receives shows here as a diff; an intended one is recorded again with
``LLMSIM_GOLDEN_UPDATE=1 python -m pytest tests/test_golden.py`` and named in its commit."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import connect as ws_connect

from llmsim import Config, ServerThread

from . import rawhttp

GOLDEN = Path(__file__).parent / "data" / "golden"
UPDATE = os.environ.get("LLMSIM_GOLDEN_UPDATE") == "1"
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}},
           "required": ["city"], "additionalProperties": False}
MSG = [{"role": "user", "content": "What is the weather in Paris?"}]
CHAT_TOOL = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
RESP_TOOL = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]
ANT_TOOL = [{"name": "get_weather", "description": "weather", "input_schema": WEATHER}]
GEM_TOOL = [{"functionDeclarations": [{"name": "get_weather", "parameters": {
    "type": "OBJECT", "properties": {"city": {"type": "STRING"}}, "required": ["city"]}}]}]
GEM = "/v1beta/models/gemini-2.5-flash"

# name → (path, body); each is sent as JSON and, where the family streams, streamed
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "chat-text": ("/v1/chat/completions", {"model": "gpt-4o", "messages": MSG,
                                           "max_tokens": 12}),
    "chat-tools": ("/v1/chat/completions", {"model": "gpt-4o", "messages": MSG,
                                            "tools": CHAT_TOOL, "tool_choice": "required"}),
    "chat-reasoning": ("/v1/chat/completions", {"model": "o4-mini", "messages": MSG,
                                                "max_completion_tokens": 40}),
    "chat-error": ("/v1/chat/completions", {"model": "gpt-4o", "messages": []}),
    "completions-text": ("/v1/completions", {"model": "gpt-3.5-turbo-instruct",
                                             "prompt": "Once upon a time", "max_tokens": 10}),
    "responses-text": ("/v1/responses", {"model": "gpt-4o", "input": "Say hi",
                                         "max_output_tokens": 20, "store": False}),
    "responses-tools": ("/v1/responses", {"model": "gpt-4o", "input": "weather in Paris?",
                                          "tools": RESP_TOOL, "tool_choice": "required",
                                          "store": False}),
    "responses-reasoning": ("/v1/responses", {"model": "o4-mini", "input": "Say hi",
                                              "reasoning": {"effort": "low",
                                                            "summary": "auto"},
                                              "max_output_tokens": 300, "store": False}),
    "responses-error": ("/v1/responses", {"model": "gpt-4o", "input": "x",
                                          "max_output_tokens": 3}),
    "anthropic-text": ("/anthropic/v1/messages", {"model": "claude-sonnet-4-6",
                                                  "max_tokens": 12, "messages": MSG}),
    "anthropic-tools": ("/anthropic/v1/messages", {
        "model": "claude-sonnet-4-6", "max_tokens": 200, "messages": MSG, "tools": ANT_TOOL,
        "tool_choice": {"type": "any"}}),
    "anthropic-thinking": ("/anthropic/v1/messages", {
        "model": "claude-sonnet-4-6", "max_tokens": 3000, "messages": MSG,
        "thinking": {"type": "enabled", "budget_tokens": 1024}}),
    "anthropic-error": ("/anthropic/v1/messages", {"model": "claude-sonnet-4-6",
                                                   "messages": MSG}),
    "gemini-text": (f"{GEM}:generateContent", {"contents": [
        {"role": "user", "parts": [{"text": "Say hi"}]}],
        "generationConfig": {"maxOutputTokens": 60}}),
    "gemini-tools": (f"{GEM}:generateContent", {"contents": [
        {"role": "user", "parts": [{"text": "weather in Paris?"}]}], "tools": GEM_TOOL,
        "toolConfig": {"functionCallingConfig": {"mode": "ANY"}}}),
    "gemini-error": (f"{GEM}:generateContent", {"contents": []}),
}
_IDS = re.compile(r'"(?:id|call_id|item_id|response_id|responseId|request_id)":\s*"[^"]*"')
_PREFIXED = re.compile(r"\b(?:chatcmpl|resp|msg|rs|fc|call|cmpl|toolu|req|ctc|ws|item)"
                       r"_[A-Za-z0-9]{6,}")
_TIMES = re.compile(r'"(?:created|created_at|completed_at|startTime)":\s*[0-9.]+')


def _norm(data: bytes) -> str:
    text = data.decode()
    text = _IDS.sub(lambda m: m.group(0).split(":")[0] + ':"<id>"', text)
    text = _PREFIXED.sub("<id>", text)
    return _TIMES.sub(lambda m: m.group(0).split(":")[0] + ":0", text)


def _check(name: str, transcript: str) -> None:
    f = GOLDEN / f"{name}.txt"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        f.write_bytes(transcript.encode())  # (bytes: Gemini's frames end in CR LF)
        return
    assert f.exists(), f"no golden transcript {f.name}: record with LLMSIM_GOLDEN_UPDATE=1"
    assert transcript == f.read_bytes().decode(), f"{name}: the wire bytes changed"


@pytest.fixture(scope="module")
def srv() -> Any:
    with ServerThread(Config(port=0, latency="instant", seed=42, quiet=True)) as s:
        yield s


def _exchange(srv: Any, path: str, body: dict[str, Any]) -> str:
    r = rawhttp.request(srv.url, "POST", path, body)
    ctype = r.headers.get("content-type", "")
    return f"{r.status} {ctype}\n{_norm(r.body)}\n"


@pytest.mark.parametrize("name", sorted(CASES))
def test_json(srv: Any, name: str) -> None:
    path, body = CASES[name]
    _check(f"{name}.json", _exchange(srv, path, body))


@pytest.mark.parametrize("name", sorted(n for n in CASES if not n.endswith("-error")))
def test_stream(srv: Any, name: str) -> None:
    path, body = CASES[name]
    if path.startswith("/v1beta"):
        path = path.replace(":generateContent", ":streamGenerateContent?alt=sse")
        streamed = body
    else:
        streamed = {**body, "stream": True}
    _check(f"{name}.sse", _exchange(srv, path, streamed))


@pytest.mark.parametrize("name", sorted(n for n in CASES if n.startswith("responses-")))
def test_websocket(srv: Any, name: str) -> None:
    _, body = CASES[name]
    frames = []
    with ws_connect(srv.url.replace("http://", "ws://") + "/v1/responses") as ws:
        ws.send(json.dumps({"type": "response.create", **body}))
        while True:
            msg = ws.recv(timeout=10)
            frames.append(_norm(msg.encode() if isinstance(msg, str) else msg))
            kind = json.loads(msg).get("type")
            if kind in ("response.completed", "response.incomplete", "response.failed",
                        "error"):
                break
    _check(f"{name}.ws", "\n".join(frames) + "\n")
