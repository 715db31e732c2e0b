"""Seeded, bounded fuzzing of Chat Completions and Responses bodies (issue 10, "Done means").

A small structure-aware mutator (``random.Random(seed)``, no extra dependency) starts from a
corpus of valid bodies that together use every feature the validators know (tools and every
tool_choice shape, json_schema formats, reasoning, logprobs, previous_response_id,
conversation, every input item type, stream_options, vLLM extensions, ...) and applies one to
three mutations per case: hostile numbers (1e30, 2**70, -0.0, 1e400, NaN), wrong types, deep
nesting, control and unpaired-surrogate strings, long strings and arrays, removed / unknown /
duplicated keys, lists where objects go, subtrees spliced from the other API, and fields
grafted from other valid bodies (valid but unusual mixes). Each case is a pure function of
(seed, test, index); bodies stay under 1 MiB (size limits are tested elsewhere).

Each case goes to a real ``python -m llmsim --port 0`` (a subprocess: a body that makes the
server spin or eat memory is killed by a watchdog instead of taking the test runner and the
machine with it) over a fresh loopback connection, with latency ``instant`` (handlers finish
without suspending) and ``paced`` (1 ms to the first token: every handler finishes in a Task),
and must get, within ``CASE_TIMEOUT_S``:

* a status below 500 (fault injection is off, so no 5xx is legitimate);
* for a 4xx, the OpenAI error envelope ``{"error": {"message": str, "type", "param",
  "code"}}``; for a 2xx, a JSON object, or an SSE stream that ends cleanly with its terminal
  event (``data: [DONE]`` for chat; ``response.completed|failed|incomplete`` or ``error`` for
  Responses); over WebSocket, a terminal or error event (no 5xx) for every create, and no
  close other than a clean one;
* no traceback in the server's log.

After the run the live gauges return to idle (only the stats request itself is active) and
``/health`` answers. Failures found earlier are replayed first (``KNOWN_*``, minimal bodies,
each with the area that owns its fix). Every failure is reported with the seed, its case
index, the exact body sent (``$PREV``/``$CONV``/``$ITEM`` stand for ids created at start-up),
a greedily minimised body that fails the same way, and the server's traceback.
``FUZZ_SEED`` and ``FUZZ_CASES`` (per HTTP endpoint; WebSocket runs a sixth) change the seed
and the number of cases for longer local runs.
"""

from __future__ import annotations

import copy
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from random import Random
from typing import Any

import h11
import pytest
from wsproto.events import CloseConnection, TextMessage

from . import rawhttp
from .test_websocket_raw import RawWS

SEED = int(os.environ.get("FUZZ_SEED", "20250610"))
CASES = int(os.environ.get("FUZZ_CASES", "400"))  # per HTTP endpoint
WS_CASES = max(1, CASES // 6)
CASE_TIMEOUT_S = 5.0  # "no hang": every case is answered within this
MAX_RSS_MB = 1500  # the watchdog kills a server above this (a memory bomb is a failure)
MAX_BODY = 1 << 20  # a mutation that makes the body larger is undone
MAX_RESTARTS = 3  # a test gives up after this many dead or wedged servers
MAX_MINIMISE = 6  # failures minimised per test (the others are printed as sent)
MINIMISE_TRIES = 120  # requests per minimisation

pytestmark = pytest.mark.timeout(300)


# ------------------------------------------------------------------------------------------
# JSON text with what Python's json cannot say: raw fragments and duplicate keys
# ------------------------------------------------------------------------------------------

class Raw(str):
    """A JSON fragment written as is (``NaN``, ``1e400``, 5000 nested brackets)."""


class Pairs:
    """An object written with these (key, value) pairs in order (keys may repeat)."""

    def __init__(self, items: Any) -> None:
        self.items: list[tuple[str, Any]] = list(items)


def dumps(obj: Any) -> str:
    if isinstance(obj, Raw):
        return str(obj)
    if isinstance(obj, Pairs):
        return "{" + ",".join(json.dumps(k) + ":" + dumps(v) for k, v in obj.items) + "}"
    if isinstance(obj, dict):
        return "{" + ",".join(json.dumps(str(k)) + ":" + dumps(v) for k, v in obj.items()) + "}"
    if isinstance(obj, list):
        return "[" + ",".join(dumps(v) for v in obj) + "]"
    return json.dumps(obj)  # ensure_ascii: a lone surrogate becomes a "\ud800" escape


def substitute(text: str, ids: dict[str, str]) -> str:
    """Replace the ``"$PREV"``/``"$CONV"``/``"$ITEM"`` placeholder strings by this server's
    ids (textually, so placeholders inside raw fragments are replaced too)."""
    for k, v in ids.items():
        text = text.replace(json.dumps(k), json.dumps(v))
    return text


# ------------------------------------------------------------------------------------------
# Corpus: valid bodies covering the features of each API
# ------------------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Oslo"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    "unit": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    "when": {"type": "string", "format": "date-time"}},
    "required": ["city", "days", "tags", "unit", "when"], "additionalProperties": False}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.",
                                      "parameters": SCHEMA, "strict": True}},
    {"type": "function", "function": {"name": "noop"}},
    {"type": "custom", "custom": {"name": "shell", "description": "Run a command."}},
]
U = {"role": "user", "content": "What is the weather in Paris? Answer in json."}


def chat_corpus() -> list[dict[str, Any]]:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    return [
        {"model": "gpt-4o", "messages": [U]},
        {"model": "gpt-4o-mini", "max_tokens": 24, "n": 2, "temperature": 0.7, "top_p": 0.9,
         "stop": ["\n\n", "END"], "seed": 7, "user": "u-1", "presence_penalty": 0.5,
         "frequency_penalty": -0.5, "logit_bias": {"50256": -100}, "metadata": {"k": "v"},
         "store": False, "service_tier": "auto", "logprobs": True, "top_logprobs": 3,
         "messages": [{"role": "system", "content": "Be brief."},
                      {"role": "developer", "content": [{"type": "text", "text": "Obey."}]},
                      {"role": "user", "content": [
                          {"type": "text", "text": "Describe"},
                          {"type": "image_url", "image_url": {"url": "https://x/a.png",
                                                              "detail": "low"}},
                          {"type": "input_audio", "input_audio": {"data": "UklGRg==",
                                                                  "format": "wav"}},
                          {"type": "file", "file": {"file_id": "file-abc"}}]}]},
        {"model": "gpt-4o", "tools": CHAT_TOOLS, "tool_choice": "required",
         "parallel_tool_calls": False, "max_completion_tokens": 64,
         "messages": [U, {"role": "assistant", "content": None, "tool_calls": [call]},
                      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
                      {"role": "user", "content": "And tomorrow?"}]},
        {"model": "gpt-4.1", "tools": CHAT_TOOLS,
         "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
         "messages": [U]},
        {"model": "gpt-4.1-mini", "tools": CHAT_TOOLS, "messages": [U],
         "tool_choice": {"type": "allowed_tools", "allowed_tools": {
             "mode": "auto", "tools": [{"type": "function", "function": {"name": "noop"}}]}}},
        {"model": "gpt-4o", "messages": [U], "max_tokens": 40, "response_format": {
            "type": "json_schema", "json_schema": {"name": "weather", "strict": True,
                                                   "schema": SCHEMA}}},
        {"model": "gpt-4o", "messages": [U], "response_format": {"type": "json_object"}},
        {"model": "gpt-5", "reasoning_effort": "low", "max_completion_tokens": 200,
         "verbosity": "low", "messages": [U], "prompt_cache_key": "k",
         "safety_identifier": "s"},
        {"model": "o3", "reasoning_effort": "high", "messages": [
            {"role": "user", "content": "Think."},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
            {"role": "user", "content": "Please."}]},
        {"model": "gpt-4o", "messages": [U], "ignore_eos": True, "min_tokens": 8,
         "max_tokens": 16, "top_k": 40, "repetition_penalty": 1.1},
        {"model": "gpt-4o", "messages": [U, {"role": "assistant", "content": "x",
                                             "function_call": {"name": "noop",
                                                               "arguments": "{}"}},
                                         {"role": "function", "name": "noop", "content": "ok"}],
         "functions": [{"name": "noop", "parameters": {}}], "function_call": "auto"},
        {"model": "my-own-model", "messages": [U], "prediction": {"type": "content",
                                                                  "content": "x"},
         "modalities": ["text"], "web_search_options": {}, "prompt_cache_retention": "24h"},
    ]


RESP_TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather.",
     "parameters": SCHEMA, "strict": True},
    {"type": "function", "name": "noop", "parameters": {"type": "object", "properties": {}}},
    {"type": "custom", "name": "shell", "description": "Run a command."},
    {"type": "web_search"},
    {"type": "file_search", "vector_store_ids": ["vs_1"]},
    {"type": "mcp", "server_label": "deepwiki", "server_url": "https://mcp.example/sse"},
    {"type": "code_interpreter", "container": {"type": "auto"}},
]
ALL_ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "Weather in Paris, as json?"},
    {"type": "message", "role": "developer", "content": "Be brief."},
    {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "Sys."}]},
    {"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Look:"},
        {"type": "input_image", "image_url": "https://x/a.png", "detail": "high"},
        {"type": "input_image", "file_id": "file-img"},
        {"type": "input_file", "file_data": "data:application/pdf;base64,JVBERi0=",
         "filename": "a.pdf"}]},
    {"type": "message", "role": "assistant", "id": "msg_a1", "status": "completed", "content": [
        {"type": "output_text", "text": "Sure.", "annotations": []},
        {"type": "refusal", "refusal": "Not that."}]},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Hm."}],
     "encrypted_content": "gAAAA-opaque"},
    {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
     "arguments": '{"city": "Paris"}', "status": "completed"},
    {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    {"type": "custom_tool_call", "call_id": "call_2", "name": "shell", "input": "ls"},
    {"type": "custom_tool_call_output", "call_id": "call_2",
     "output": [{"type": "input_text", "text": "a.txt"}]},
    {"type": "item_reference", "id": "$ITEM"},
    {"role": "user", "content": "Thanks. Now json please."},
]


def responses_corpus() -> list[dict[str, Any]]:
    return [
        {"model": "gpt-4o", "input": "Hello"},
        {"model": "gpt-4o", "input": copy.deepcopy(ALL_ITEMS), "max_output_tokens": 32,
         "instructions": "Answer in json.", "metadata": {"k": "v"}, "temperature": 0.5,
         "top_p": 0.9, "truncation": "auto", "service_tier": "default", "user": "u",
         "safety_identifier": "s", "prompt_cache_key": "k", "prompt_cache_retention": "24h",
         "store": True, "parallel_tool_calls": True},
        {"model": "gpt-4.1", "input": [ALL_ITEMS[0]], "tools": copy.deepcopy(RESP_TOOLS),
         "tool_choice": "required", "max_tool_calls": 2},
        {"model": "gpt-4.1-mini", "input": "Weather?", "tools": copy.deepcopy(RESP_TOOLS[:3]),
         "tool_choice": {"type": "function", "name": "get_weather"}},
        {"model": "gpt-4o", "input": "Weather?", "tools": copy.deepcopy(RESP_TOOLS),
         "tool_choice": {"type": "allowed_tools", "mode": "auto",
                         "tools": [{"type": "function", "name": "noop"}]}},
        {"model": "gpt-4o", "input": "Weather?", "tools": copy.deepcopy(RESP_TOOLS),
         "tool_choice": {"type": "mcp", "server_label": "deepwiki"}},
        {"model": "gpt-4o", "input": "Weather?", "text": {"verbosity": "low", "format": {
            "type": "json_schema", "name": "weather", "strict": True, "schema": SCHEMA,
            "description": "A forecast."}}},
        {"model": "gpt-4o", "input": "Reply in json.", "text": {"format": {
            "type": "json_object"}}},
        {"model": "gpt-5", "input": "Think.", "reasoning": {"effort": "low",
                                                           "summary": "auto"},
         "include": ["reasoning.encrypted_content"], "max_output_tokens": 400},
        {"model": "o3", "input": "Think.", "reasoning": {"effort": "high",
                                                        "generate_summary": "concise"}},
        {"model": "gpt-4o", "input": "Hi", "include": ["message.output_text.logprobs"],
         "top_logprobs": 5, "max_output_tokens": 20},
        {"model": "gpt-4o", "input": "Again.", "previous_response_id": "$PREV"},
        {"model": "gpt-4o", "input": "More.", "conversation": "$CONV"},
        {"model": "gpt-4o", "input": [{"role": "user", "content": "More."}],
         "conversation": {"id": "$CONV"}},
        {"model": "gpt-4o", "input": "Later.", "background": True, "store": True},
        {"model": "gpt-4o", "input": "Hi", "stream_options": {"include_obfuscation": False},
         "stream": True},
        {"model": "gpt-4o", "input": [{"type": "item_reference", "id": "$ITEM"}],
         "prompt": {"id": "pmpt_1", "variables": {"x": "y"}}},
    ]


# ------------------------------------------------------------------------------------------
# Mutations
# ------------------------------------------------------------------------------------------

Path = tuple[Any, ...]

HOSTILE_NUMBERS: list[Any] = [
    0, -1, 1, 15, 16, 20, 21, 128, 129, 4097, 2**31 - 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63,
    2**64, 2**70, -(2**63) - 1, -(2**70), 1e30, -1e30, 1e-30, 0.5, -0.0, 1.5, 1e308,
    Raw("1e400"), Raw("-1e400"), Raw("NaN"), Raw("Infinity"), Raw("-Infinity"), Raw("1E+2"),
    Raw("0.0000000000000000000000000001"), Raw("1" * 400), Raw("-" + "9" * 30),
]
HOSTILE_STRINGS: list[Any] = [
    "", " ", "x", "\x00", "a\nb", "\r\n\r\nHTTP/1.1 200 OK\r\n", "\u202e\u200b\ufeff", "\ud800",
    "\udfff\ud800", "😀" * 50, "e\u0301" * 30, "%s%n{0}{{}}", "<script>alert(1)</script>",
    "\\", '"', "null", "true", "123", "-1", "1e30", "auto", "none", "required", "json",
    "x" * 300, "x" * 70_000, "\t" * 1000, "$PREV", "$CONV", "$ITEM", "resp_nope", "msg_nope",
    "conv_nope", "../../etc/passwd", "ÿ\x7f\x80", "a" * 65, "a" * 257,
]
MODELS = ["gpt-4o", "gpt-5", "o3", "o1", "gpt-4", "gpt-3.5-turbo", "gpt-5.2", "gpt-4o-2024-08-06",
          "nope-model", "", " gpt-4o", "gpt-4o\n", "x" * 2000, "\u0000", "gpt-5-\u00e9"]
TYPES = ["message", "function_call", "function_call_output", "reasoning", "item_reference",
         "custom_tool_call", "custom_tool_call_output", "input_text", "output_text", "refusal",
         "input_image", "input_file", "text", "image_url", "input_audio", "file", "function",
         "custom", "web_search", "mcp", "file_search", "json_schema", "json_object",
         "allowed_tools", "computer_use_preview", "namespace", "summary_text", "content",
         "response.create", "", "nope", None, 1]
PARAM_KEYS = ["stream", "background", "store", "n", "logprobs", "top_logprobs", "include",
               "truncation", "max_output_tokens", "max_tokens", "max_completion_tokens",
               "previous_response_id", "conversation", "tools", "tool_choice", "text",
               "response_format", "reasoning", "reasoning_effort", "stream_options", "input",
               "messages", "instructions", "min_tokens", "ignore_eos", "max_tool_calls",
               "generate", "metadata", "seed", "temperature", "stop"]
EXTRA_KEYS = PARAM_KEYS + ["id", "type", "role", "content", "status", "__proto__", "",
                           "\u0000", "k" * 300, "stream_id", "response"]
PLAUSIBLE = [True, False, 1, 2, 8, 20, 64, 128, "auto", "required", "none", "disabled", "$PREV",
             "$CONV", {"include_usage": True}, {"include_obfuscation": True},
             {"effort": "minimal"}, ["reasoning.encrypted_content"],
             ["message.output_text.logprobs", "message.input_image.image_url"],
             [{"type": "function", "name": "f"}], {"type": "json_object"}, [], {}, None]


def paths(obj: Any, depth: int = 0, base: Path = ()) -> Iterator[Path]:
    """Every node's path (the root is ``()``); Raw/Pairs are leaves."""
    yield base
    if depth > 40 or isinstance(obj, (Raw, Pairs)):
        return
    if isinstance(obj, dict):
        for k in obj:
            yield from paths(obj[k], depth + 1, (*base, k))
    elif isinstance(obj, list):
        for i in range(min(len(obj), 64)):
            yield from paths(obj[i], depth + 1, (*base, i))


def get_at(obj: Any, path: Path) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def set_at(root: Any, path: Path, value: Any) -> Any:
    if not path:
        return value
    get_at(root, path[:-1])[path[-1]] = value
    return root


def nest(value: Any, depth: int, kind: str) -> Raw:
    """``value`` inside ``depth`` arrays or objects, as raw text (no recursion to get there)."""
    if kind == "list":
        return Raw("[" * depth + dumps(value) + "]" * depth)
    return Raw('{"a":' * depth + dumps(value) + "}" * depth)


def _scalar(rng: Random, node: Any, key: Any) -> Any:
    if key == "model":
        return rng.choice(MODELS)
    if key == "type" or key == "role":
        return rng.choice(TYPES)
    if isinstance(node, bool) or node is None:
        return rng.choice([not node, 0, 1, "true", None, [], {}, rng.choice(HOSTILE_NUMBERS)])
    if isinstance(node, (int, float)):
        return rng.choice(HOSTILE_NUMBERS)
    if isinstance(node, str):
        times = min(rng.choice((2, 1000)), max(2, 100_000 // max(1, len(node))))
        return rng.choice(HOSTILE_STRINGS + [node * times,
                                             node + rng.choice(HOSTILE_STRINGS[:12])])
    return rng.choice(HOSTILE_NUMBERS + HOSTILE_STRINGS)


def mutate(rng: Random, body: Any, donors: list[Any], corpus: list[Any]) -> Any:
    """One structure-aware mutation of ``body`` (may replace it entirely). ``corpus`` holds
    valid bodies of the same API (grafting their fields makes valid but unusual mixes),
    ``donors`` any bodies (spliced subtrees land where they do not belong)."""
    all_paths = list(paths(body))
    top = [p for p in all_paths if len(p) == 1]
    # half the time a top-level field: that is where the parameters (and most limits) are
    path = rng.choice(top if top and rng.random() < 0.5 else all_paths)
    node = get_at(body, path)
    key = path[-1] if path else None
    parent = get_at(body, path[:-1]) if path else None
    op = rng.choices(
        ["scalar", "wrong_type", "wrap", "deep", "delete", "unknown_key", "dup_key", "list",
         "splice", "known_key", "root", "big_array", "graft"],
        weights=[30, 12, 6, 4, 12, 6, 3, 8, 8, 12, 1, 2, 20])[0]
    if op == "scalar":
        return set_at(body, path, _scalar(rng, node, key))
    if op == "wrong_type":
        return set_at(body, path, rng.choice([None, True, 0, -1, 1.5, "", "x", [], {}, [node],
                                              {"value": node}, [[node]], rng.choice(PLAUSIBLE)]))
    if op == "wrap":
        return set_at(body, path, [node] if rng.random() < 0.5 else {"type": "x", "v": node})
    if op == "deep":
        d = rng.choice((40, 254, 256, 300, 600))
        if rng.random() < 0.2:
            d = rng.choice((1000, 1100, 5000))
            value: Any = Raw("[" * d + "1" + "]" * d)
        else:
            value = nest(node, d, rng.choice(("list", "dict")))
        return set_at(body, path, value)
    if op == "delete":
        if isinstance(parent, dict):
            del parent[key]
        elif isinstance(parent, list):
            del parent[key]
        return body
    if op == "unknown_key":
        target = node if isinstance(node, dict) else parent if isinstance(parent, dict) else None
        if target is not None:
            target[rng.choice(EXTRA_KEYS)] = rng.choice(PLAUSIBLE + HOSTILE_STRINGS[:8]
                                                        + HOSTILE_NUMBERS[:10])
        return body
    if op == "dup_key":
        if isinstance(node, dict) and node:
            k = rng.choice(list(node))
            pairs = Pairs(node.items())
            pairs.items.insert(rng.randrange(len(node) + 1), (k, rng.choice(PLAUSIBLE)))
            return set_at(body, path, pairs)
        return body
    if op == "list":
        if isinstance(node, list) and node:
            how = rng.choice(("empty", "repeat", "reverse", "junk"))
            if how == "empty":
                node.clear()
            elif how == "repeat":
                node[:] = node * rng.choice((2, 20, 300))
            elif how == "reverse":
                node.reverse()
            else:
                node.insert(rng.randrange(len(node) + 1), _scalar(rng, None, None))
            return body
        return set_at(body, path, [node] * rng.choice((0, 2, 50)))
    if op == "splice":
        donor = rng.choice(donors)
        sub = copy.deepcopy(get_at(donor, rng.choice(list(paths(donor)))))
        return set_at(body, path, sub)
    if op == "known_key":
        if isinstance(body, dict):
            body[rng.choice(PARAM_KEYS)] = copy.deepcopy(rng.choice(
                PLAUSIBLE + HOSTILE_NUMBERS[:26]))
        return body
    if op == "graft":
        donor = rng.choice(corpus)
        if isinstance(body, dict) and donor:
            k = rng.choice(list(donor))
            body[k] = copy.deepcopy(donor[k])
        return body
    if op == "root":
        return rng.choice([[], [body], "x", 1, None, True, Raw(""), Raw("{"), Raw("{}{}"),
                           Raw('{"model": "gpt-4o", "input": "x"} trailing')])
    # big_array: many elements where few are expected
    return set_at(body, path, [copy.deepcopy(node)] * rng.choice((100, 2000)))


def make_case(seed: int, kind: str, i: int, corpus: list[Any], donors: list[Any],
              stream: bool | None) -> Any:
    """Case ``i`` of ``kind``: a corpus body with 1-3 mutations; independent of other cases."""
    rng = Random(f"{seed}:{kind}:{i}")
    body = copy.deepcopy(rng.choice(corpus))
    if stream is not None:
        body["stream"] = stream
    for _ in range(rng.choices((1, 2, 3), weights=(6, 3, 1))[0]):
        before = copy.deepcopy(body)
        body = mutate(rng, body, donors, corpus)
        if len(dumps(body)) > MAX_BODY:  # body-size limits are tested elsewhere: stay fast
            body = before
    return body


# ------------------------------------------------------------------------------------------
# The server under test: a subprocess with a memory watchdog
# ------------------------------------------------------------------------------------------

TRACE = re.compile(r"Traceback|ERROR|CRITICAL|Exception in|exception was never retrieved")


class Subserver:
    """``python -m llmsim --port 0 --latency instant`` with stderr in a file."""

    def __init__(self, latency: list[str]) -> None:
        self.latency = latency
        self.log = tempfile.NamedTemporaryFile("w+b", prefix="llmsim-fuzz-", suffix=".log")
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.killed_for_memory = False
        self._watch: threading.Thread | None = None

    def start(self) -> None:
        self.killed_for_memory = False
        # the flags alone decide the configuration (an LLMSIM_* variable would change it)
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMSIM_")}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmsim", "--port", "0", "--host", "127.0.0.1",
             *self.latency, "--seed", "1234", "--output-tokens-mean", "24",
             "--log-level", "warning"],
            stdout=subprocess.PIPE, stderr=self.log, env=env)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert m, f"server did not start: {line!r} {self.log_text()[-2000:]}"
        self.url = m.group(0)
        self._watch = threading.Thread(target=self._watchdog, args=(self.proc,), daemon=True)
        self._watch.start()

    def _watchdog(self, proc: subprocess.Popen[bytes]) -> None:
        status = f"/proc/{proc.pid}/status"
        while proc.poll() is None:
            try:
                with open(status) as f:
                    rss = next(int(x.split()[1]) for x in f if x.startswith("VmRSS:"))
            except (OSError, StopIteration, ValueError):
                return
            if rss > MAX_RSS_MB * 1024:
                self.killed_for_memory = True
                proc.kill()
                return
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_size(self) -> int:
        return os.path.getsize(self.log.name)

    def log_text(self, start: int = 0) -> str:
        with open(self.log.name, "rb") as f:
            f.seek(start)
            return f.read().decode("utf-8", "replace")

    def stop(self) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        if p is not None and p.stdout is not None:
            p.stdout.close()
        self.proc = None

    def restart(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.stop()
        self.start()


# ------------------------------------------------------------------------------------------
# Clients
# ------------------------------------------------------------------------------------------

class Hang(Exception):
    pass


@dataclass
class Answer:
    status: int
    ctype: str
    body: bytes
    clean: bool  # the body ended with EndOfMessage (not a reset or a close mid-body)


def http_post(url: str, path: str, data: bytes, timeout: float = CASE_TIMEOUT_S) -> Answer:
    """One POST on a fresh connection; the whole answer must arrive before ``timeout``."""
    deadline = time.monotonic() + timeout
    try:
        sock = rawhttp.connect(url, timeout=timeout)
    except OSError as exc:
        raise Hang(f"connect failed: {exc}") from exc
    conn = h11.Connection(h11.CLIENT)
    status, ctype, chunks, clean = 0, "", [], False
    try:
        hs = [("host", "localhost"), ("content-type", "application/json"),
              ("authorization", "Bearer sk-test"), ("content-length", str(len(data)))]
        try:
            sock.sendall(conn.send(h11.Request(method="POST", target=path, headers=hs))
                         + conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered (and closed) before the whole body was read: read the answer
        while True:
            try:
                ev = conn.next_event()
            except h11.RemoteProtocolError:
                break
            if ev is h11.NEED_DATA:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise Hang("no complete answer")
                sock.settimeout(left)
                try:
                    conn.receive_data(sock.recv(262144))
                except TimeoutError as exc:
                    raise Hang("no complete answer") from exc
                except OSError:
                    break
                continue
            if isinstance(ev, h11.Response):
                status = ev.status_code
                ctype = dict(ev.headers).get(b"content-type", b"").decode()
            elif isinstance(ev, h11.Data):
                chunks.append(bytes(ev.data))
            elif isinstance(ev, h11.EndOfMessage):
                clean = True
                break
            elif isinstance(ev, h11.ConnectionClosed):
                break
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        sock.close()
    return Answer(status, ctype, b"".join(chunks), clean)


def http_get(url: str, path: str, timeout: float = 2.0) -> Answer:
    sock = rawhttp.connect(url, timeout=timeout)
    try:
        r = rawhttp.request(url, "GET", path, sock=sock)
    finally:
        sock.close()
    return Answer(r.status, r.headers.get("content-type", ""), r.body, True)


def envelope_problem(body: bytes) -> str | None:
    try:
        doc = json.loads(body)
    except ValueError:
        return "error body is not JSON"
    err = doc.get("error") if isinstance(doc, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("message"), str) \
            or not {"type", "param", "code"} <= set(err):
        return "error body is not the OpenAI envelope"
    return None


RESP_TERMINAL = {"response.completed", "response.failed", "response.incomplete", "error"}


def check_answer(a: Answer, api: str) -> str | None:
    """What is wrong with this answer (None: acceptable)."""
    if a.status == 0:
        return "no answer (connection closed)"
    if a.status >= 500:
        return f"status {a.status}"
    if a.status >= 400:
        return envelope_problem(a.body) and f"{a.status}: {envelope_problem(a.body)}"
    if not a.clean:
        return "body cut short"
    if "text/event-stream" not in a.ctype:
        try:
            doc = json.loads(a.body)
        except ValueError:
            return "2xx body is not JSON"
        return None if isinstance(doc, dict) else "2xx body is not an object"
    events = rawhttp.parse_sse(a.body)
    if not events:
        return "empty stream"
    for _ev, data in events[:-1] if api == "chat" else events:
        try:
            json.loads(data)
        except ValueError:
            return "stream event data is not JSON"
    if api == "chat":
        last = events[-1][1]
        if last != "[DONE]":
            return "chat stream does not end with [DONE]"
    elif events[-1][0] not in RESP_TERMINAL:
        return f"responses stream ends with {events[-1][0]!r}"
    return None


# ------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------

@dataclass
class Failure:
    kind: str  # "chat-instant", "responses-paced", "ws", ...
    index: str  # the case number, or "known-N" for a replayed past failure
    body: Any
    problem: str
    log: str
    minimal: Any = None

    def signature(self) -> str:
        """One line per failure class: the problem and the innermost traceback frame."""
        frames = re.findall(r'File "[^"]*?(llmsim/[^"]+)", line \d+, in (\w+)', self.log)
        exc = re.findall(r"^(\w+(?:\.\w+)*(?:Error|Exception|Exit)\b[^\n]{0,80})", self.log,
                         re.M)
        where = f" at {frames[-1][0]}:{frames[-1][1]}" if frames else ""
        what = f" ({exc[-1].split(':')[0]})" if exc else ""
        prob = re.sub(r"\d+", "N", self.problem)
        return f"{self.kind}: {prob}{what}{where}"


@dataclass
class Fuzzer:
    kind: str
    srv: Subserver
    ids: dict[str, str] = field(default_factory=dict)
    failures: list[Failure] = field(default_factory=list)
    restarts: int = 0
    cases: int = 0
    slowest: tuple[float, str] = (0.0, "")
    outcomes: dict[str, int] = field(default_factory=dict)  # "200 sse", "400", "ws error"...

    def count(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def setup_ids(self) -> None:
        """Create what the corpus refers to: a stored response, its input item, a conversation."""
        r = http_post(self.srv.url, "/v1/responses", json.dumps({
            "model": "gpt-4o", "input": [{"type": "message", "id": "msg_fuzzitem",
                                          "role": "user", "content": "Remember json."}],
            "max_output_tokens": 16}).encode())
        assert r.status == 200, r.body
        c = http_post(self.srv.url, "/v1/conversations", b"{}")
        assert c.status == 200, c.body
        self.ids = {"$PREV": json.loads(r.body)["id"], "$CONV": json.loads(c.body)["id"],
                    "$ITEM": "msg_fuzzitem"}

    def wire(self, body: Any) -> bytes:
        return substitute(dumps(body), self.ids).encode()

    def attempt(self, path: str, body: Any, api: str) -> tuple[str | None, str]:
        """Send one body; (problem or None, new server log lines)."""
        mark = self.srv.log_size()
        try:
            a = http_post(self.srv.url, path, self.wire(body))
            problem = check_answer(a, api)
            self.count(f"{a.status}{' sse' if 'event-stream' in a.ctype else ''}")
        except Hang as exc:
            problem = f"hang: {exc}"
        log = self.srv.log_text(mark)
        if problem is None and TRACE.search(log):
            problem = "traceback in the server log"
        return problem, log

    def recover(self, problem: str) -> str:
        """After a hang: is the server still serving? Restart it if not."""
        if self.srv.killed_for_memory:
            problem = f"memory bomb: server RSS above {MAX_RSS_MB} MB (killed)"
        elif not self.srv.alive():
            problem = f"server died ({problem})"
        else:
            try:
                ok = http_get(self.srv.url, "/health").status == 200
            except OSError:
                ok = False
            if ok:
                return problem
            problem = f"server wedged: /health unanswered after {problem}"
        self.restarts += 1
        if self.restarts <= MAX_RESTARTS:
            self.srv.restart()
            self.setup_ids()
        return problem

    def run_http(self, path: str, api: str, cases: Iterator[tuple[str, Any]]) -> None:
        for label, body in cases:
            if self.restarts > MAX_RESTARTS:
                break
            self.cases += 1
            t0 = time.monotonic()
            problem, log = self.attempt(path, body, api)
            if problem is None:
                self.timed(time.monotonic() - t0, label)
            else:
                if problem.startswith("hang") or not self.srv.alive():
                    problem = self.recover(problem)
                self.failures.append(Failure(self.kind, label, body, problem, log))

    def timed(self, took: float, label: str) -> None:
        """Remember the slowest answered case (how close the others come to the bound)."""
        if took > self.slowest[0]:
            self.slowest = (took, label)

    def run_ws(self, cases: Iterator[tuple[str, Any]]) -> None:
        ws: RawWS | None = None
        try:
            for label, body in cases:
                if self.restarts > MAX_RESTARTS:
                    break
                self.cases += 1
                t0 = time.monotonic()
                if ws is None:
                    ws = RawWS(self.srv.url, timeout=CASE_TIMEOUT_S)
                    assert ws.status == 101, ws.head
                mark = self.srv.log_size()
                problem, ws = self._ws_case(ws, body)
                if problem is None:
                    self.timed(time.monotonic() - t0, label)
                log = self.srv.log_text(mark)
                if problem is None and TRACE.search(log):
                    problem = "traceback in the server log"
                if problem is not None:
                    if ws is not None:
                        ws.close()
                        ws = None
                    if problem.startswith("hang") or not self.srv.alive():
                        problem = self.recover(problem)
                    self.failures.append(Failure(self.kind, label, body, problem, log))
        finally:
            if ws is not None:
                ws.close()

    def _ws_case(self, ws: RawWS, body: Any) -> tuple[str | None, RawWS | None]:
        """One ``response.create`` (the mutated body spread into it when it is an object)."""
        msg = (Pairs([("type", "response.create"), *body.items]) if isinstance(body, Pairs)
               else {"type": "response.create", **body} if isinstance(body, dict)
               else Pairs([("type", "response.create"), ("response", body)]))
        deadline = time.monotonic() + CASE_TIMEOUT_S
        try:
            ws.send(TextMessage(data=substitute(dumps(msg), self.ids)))
            while True:
                ws.sock.settimeout(max(0.01, deadline - time.monotonic()))
                ev = ws.next_event()
                if isinstance(ev, CloseConnection):
                    if ev.code in (1000, 1001, 1008, 1009):
                        return None, None
                    return f"websocket closed with {ev.code} {ev.reason!r}", None
                if not isinstance(ev, str):
                    continue
                doc = json.loads(ev)
                if doc.get("type") == "error":
                    self.count("ws error")
                    err = doc.get("error")
                    if not isinstance(err, dict) or not isinstance(err.get("message"), str):
                        return "error event without a message", ws
                    st = doc.get("status")
                    if isinstance(st, int) and st >= 500:
                        return f"error event with status {st}", ws
                    return None, ws
                if doc.get("type") in RESP_TERMINAL:
                    self.count(f"ws {doc['type']}")
                    return None, ws
        except TimeoutError:
            return "hang: no terminal event", ws
        except (OSError, ValueError) as exc:
            return f"websocket broken: {exc!r}", None

    # -- after the run ---------------------------------------------------------------------
    def gauges_idle(self) -> str | None:
        """None when the live gauges are back to idle (the stats request itself only)."""
        want = {"connections": 1, "requests": 1, "streams": 0, "websockets": 0}
        got: Any = None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                got = json.loads(http_get(self.srv.url, "/llmsim/stats").body)["active"]
            except (OSError, ValueError, KeyError) as exc:
                got = repr(exc)
            if got == want:
                return None
            time.sleep(0.05)
        return f"gauges not back to idle after the run: {got} (want {want})"

    def minimise(self, f: Failure, path: str, api: str) -> None:
        """Greedily delete keys and elements while the same problem persists (bounded)."""
        if f.problem.startswith(("hang", "server", "memory")):
            return  # each try could cost a timeout or a restart: print the body as sent
        want = f.signature()
        cur = copy.deepcopy(f.body)
        tries = 0
        changed = True
        while changed and tries < MINIMISE_TRIES:
            changed = False
            for p in sorted(paths(cur), key=len):
                if not p or tries >= MINIMISE_TRIES:
                    continue
                cand = copy.deepcopy(cur)
                try:
                    del get_at(cand, p[:-1])[p[-1]]
                except (KeyError, IndexError, TypeError):
                    continue
                tries += 1
                problem, log = self.attempt(path, cand, api)
                if problem is not None and Failure(f.kind, "", cand, problem, log).signature() \
                        == want:
                    cur = cand
                    changed = True
                    break
        f.minimal = cur


def report(fz: Fuzzer, extra: list[str]) -> str:
    classes: dict[str, list[Failure]] = {}
    for f in fz.failures:
        classes.setdefault(f.signature(), []).append(f)
    out = [f"{fz.kind}: {len(fz.failures)} failing cases of {fz.cases} (seed {SEED}), "
           f"{len(classes)} classes, {fz.restarts} server restarts; ids {fz.ids}"]
    out += extra
    for sig, fs in classes.items():
        f = fs[0]
        out.append(f"\n=== {sig}  [{len(fs)} cases: {[x.index for x in fs[:12]]}]")
        out.append(f"case {f.index}: {f.problem}")
        for x in fs[:3]:
            if x.body is not None:
                body = fz.wire(x.body).decode("utf-8", "replace")
                out.append(f"body of case {x.index} ({len(body)} bytes): "
                           f"{body[:3000 if x is f else 600]}")
        if f.minimal is not None:
            out.append(f"minimal: {fz.wire(f.minimal).decode('utf-8', 'replace')[:3000]}")
        if f.log.strip():
            out.append("server log:\n" + f.log.strip()[-3000:])
    return "\n".join(out)


# "instant" answers most requests without the handler ever suspending (eager path);
# "paced" (1 ms to the first token) makes every handler suspend and finish in a Task, where an
# exception has no caller to land in: both paths must answer and release.
LATENCIES = {"instant": ["--latency", "instant"],
             "paced": ["--latency", "realistic", "--ttft-ms", "1", "--itl-ms", "0"]}


def fuzz(kind: str, run: Callable[[Fuzzer], None], path: str, api: str,
         latency: str = "instant") -> None:
    srv = Subserver(LATENCIES[latency])
    srv.start()
    fz = Fuzzer(kind, srv)
    try:
        fz.setup_ids()
        t0 = time.monotonic()
        run(fz)
        took = time.monotonic() - t0
        extra = [f"{fz.cases} cases in {took:.1f} s (slowest passing: {fz.slowest[1]}, "
                 f"{fz.slowest[0]:.2f} s); outcomes "
                 f"{dict(sorted(fz.outcomes.items(), key=lambda kv: -kv[1]))}"]
        if srv.alive():
            idle = fz.gauges_idle()
            if idle is not None:
                fz.failures.append(Failure(kind, "end", None, idle, ""))
            try:
                health = http_get(srv.url, "/health").status
            except OSError as exc:
                health = repr(exc)
            if health != 200:
                fz.failures.append(Failure(kind, "end", None, f"/health: {health}", ""))
            seen: set[str] = set()
            for f in fz.failures:
                if f.body is not None and f.signature() not in seen \
                        and len(seen) < MAX_MINIMISE:
                    seen.add(f.signature())
                    fz.minimise(f, path, api)
        else:
            fz.failures.append(Failure(kind, "end", None, "server not running after the run", ""))
        print("\n".join(report(fz, extra).splitlines()[:2]))  # with -s: coverage at a glance
        assert not fz.failures, report(fz, extra)
    finally:
        srv.stop()
        srv.log.close()


# ------------------------------------------------------------------------------------------
# Past failures, replayed first on every run (minimal bodies; the area that owns the fix)
# ------------------------------------------------------------------------------------------

def deep(value: Any, depth: int = 300) -> Raw:
    return nest(value, depth, "list")


def json_schema(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}


KNOWN_CHAT: list[Any] = [
    # min_tokens beyond the per-request work bound: generation never ends (min_tokens)
    {"model": "gpt-4o", "messages": [U], "min_tokens": 1e30},
    # nesting deeper than orjson encodes (255): tool schema counted for the prompt (nesting)
    {"model": "gpt-4o", "messages": [U], "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"a": {
            "type": deep("string")}}}}}]},
    # ... then deeper than Python's recursion limit: the request RNG's repr() fallback, and
    # error messages that echo the value (nesting)
    {"model": "gpt-4o", "messages": [U], "modalities": deep(1, 1000)},
    {"model": "gpt-4o", "messages": [U], "response_format": {"type": deep(1, 1000)}},
    {"model": "gpt-4o", "messages": [{"role": deep(1, 1000), "content": "x"}]},
    # malformed JSON Schemas must be 400s (sim/schema.py)
    {"model": "gpt-4o", "messages": [U], "response_format": json_schema({"type": 0})},
    {"model": "gpt-4o", "messages": [U], "response_format": json_schema({"required": [[]]})},
    {"model": "gpt-4o", "messages": [U], "response_format": json_schema({
        "type": "object", "additionalProperties": False,
        "properties": {"u": {"anyOf": [{"type": "string"}, {"type": ["null", "null"]}]}}})},
    # a bound no 64-bit integer satisfies: the generated value cannot be encoded (schema)
    {"model": "gpt-4o", "messages": [U], "response_format": json_schema({
        "type": "object", "required": ["d"],
        "properties": {"d": {"type": "integer", "minimum": 1e308}}})},
]
KNOWN_RESPONSES: list[Any] = [
    # an echoed integer orjson cannot encode: no answer / a cut stream / a leaked
    # connection (protocol error paths + integer ranges)
    {"model": "gpt-4o", "input": "Hi", "max_tool_calls": 1e30},
    {"model": "gpt-4o", "input": "Hi", "max_tool_calls": 2**70, "stream": True},
    # an allowed_tools entry without a string name (responses/parse.py)
    {"model": "gpt-4o", "input": "Hi", "tools": [{"type": "custom", "name": "shell"}],
     "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [{"name": []}]}},
    # nesting deeper than orjson encodes: schema source text, request RNG, error message
    {"model": "gpt-4o", "input": "Hi", "text": {"format": {
        "type": "json_schema", "name": "w", "schema": {"type": "object", "properties": {
            "c": {"enum": deep("x")}}}}}},
    {"model": "gpt-4o", "input": "Hi", "prompt": {"id": deep("p", 1000)}},
    {"model": "gpt-4o", "input": [{"role": deep(1, 1000), "content": "x"}]},
    # malformed JSON Schemas must be 400s (sim/schema.py)
    {"model": "gpt-4o", "input": "Hi", "tool_choice": "required", "tools": [{
        "type": "function", "name": "f", "parameters": {"type": "object",
                                                       "required": ["a", {"v": "b"}]}}]},
]
KNOWN_WS: list[Any] = [
    # a value nested deeper than orjson encodes kills the connection before dispatch
    {"model": "gpt-4o", "input": "Hi", "metadata": deep(1)},
    # an echoed integer orjson cannot encode: no terminal event (protocol error paths)
    {"model": "gpt-4o", "input": "Hi", "max_tool_calls": 1e30},
    # a malformed JSON Schema: an error event with status 500 (sim/schema.py)
    {"model": "gpt-4o", "input": "Hi", "tool_choice": "required", "tools": [{
        "type": "function", "name": "f", "parameters": {"type": 5}}]},
]


# ------------------------------------------------------------------------------------------
# Tests
# ------------------------------------------------------------------------------------------

def iter_cases(kind: str, known: list[Any], corpus: list[Any], donors: list[Any], n: int,
               alternate_stream: bool) -> Iterator[tuple[str, Any]]:
    """The replayed past failures, then ``n`` mutated cases (built one at a time)."""
    for k, body in enumerate(known):
        yield f"known-{k}", copy.deepcopy(body)
    for i in range(n):
        yield str(i), make_case(SEED, kind, i, corpus, donors,
                                stream=bool(i % 2) if alternate_stream else None)


@pytest.mark.parametrize("latency", ["instant", "paced"])
def test_fuzz_chat_completions(latency: str) -> None:
    """JSON and SSE (every other case asks for a stream before the mutations)."""
    kind, corpus = f"chat-{latency}", chat_corpus()
    cases = iter_cases(kind, KNOWN_CHAT, corpus, corpus + responses_corpus(), CASES // 2, True)
    fuzz(kind, lambda fz: fz.run_http("/v1/chat/completions", "chat", cases),
         "/v1/chat/completions", "chat", latency)


@pytest.mark.parametrize("latency", ["instant", "paced"])
def test_fuzz_responses(latency: str) -> None:
    """JSON and SSE (every other case asks for a stream before the mutations)."""
    kind, corpus = f"responses-{latency}", responses_corpus()
    cases = iter_cases(kind, KNOWN_RESPONSES, corpus, corpus + chat_corpus(), CASES // 2, True)
    fuzz(kind, lambda fz: fz.run_http("/v1/responses", "responses", cases),
         "/v1/responses", "responses", latency)


def test_fuzz_responses_websocket() -> None:
    """``response.create`` messages over one WebSocket (a new one after a close)."""
    corpus = responses_corpus() + [{"model": "gpt-4o", "input": "Warm up.", "generate": False}]
    cases = iter_cases("ws", KNOWN_WS, corpus, corpus + chat_corpus(), WS_CASES, False)
    fuzz("ws", lambda fz: fz.run_ws(cases), "/v1/responses", "responses")


def test_mutator_is_deterministic_and_varied() -> None:
    """The same seed gives the same bodies; the corpus bodies are themselves valid JSON."""
    corpus = chat_corpus() + responses_corpus()
    a = [dumps(make_case(1, "t", i, corpus, corpus, None)) for i in range(50)]
    b = [dumps(make_case(1, "t", i, corpus, corpus, None)) for i in range(50)]
    assert a == b and len(set(a)) > 45
    for body in corpus:
        json.loads(dumps(body))


# ------------------------------------------------------------------------------------------
# Regressions: failures the fuzzer found, fixed, pinned here with their exact answer
# ------------------------------------------------------------------------------------------

def _idle(srv: Any) -> bool:
    st = srv.app.stats
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if (st.active_connections, st.active_requests, st.active_streams) == (0, 0, 0):
            return True
        time.sleep(0.01)
    return False


@pytest.mark.parametrize("entry,param,code", [
    ({"name": []}, "tool_choice.tools[0].type", "missing_required_parameter"),
    ({"type": "function", "name": []}, "tool_choice.tools[0].name", "invalid_type"),
    ({"type": "custom"}, "tool_choice.tools[0].name", "missing_required_parameter"),
    ("noop", "tool_choice.tools[0]", "invalid_type"),
    ({"type": "nope", "name": "noop"}, "tool_choice.tools[0].type", "invalid_value"),
])
def test_responses_allowed_tools_entries_are_validated(srv: Any, entry: Any, param: str,
                                                       code: str) -> None:
    """An ``allowed_tools`` entry without a string name was accepted, then the simulation
    hashed its name: 500 (fuzz case: ``"tools": [{"name": []}]``). Now a 400 naming it."""
    body = {"model": "gpt-4o", "input": "Weather?", "tools": [{"type": "function",
                                                               "name": "noop"}],
            "tool_choice": {"type": "allowed_tools", "mode": "auto", "tools": [entry]}}
    r = rawhttp.request(srv.url, "POST", "/v1/responses", body)
    assert r.status == 400, r.body
    err = r.json()["error"]
    assert (err["param"], err["code"]) == (param, code), err
    # a named callable entry and a hosted one are still fine
    body["tool_choice"]["tools"] = [{"type": "function", "name": "noop"}, {"type": "web_search"}]
    body["tool_choice"]["mode"] = "required"
    r = rawhttp.request(srv.url, "POST", "/v1/responses", body)
    assert r.status == 200, r.body
    assert [o["name"] for o in r.json()["output"] if o["type"] == "function_call"] == ["noop"]
    assert _idle(srv)
