"""Chat Completions through the official SDK with strict response validation."""

from __future__ import annotations

import json

import pytest


def test_nonstream_basic(client):
    r = client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=7)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 7
    assert r.object == "chat.completion"


def test_stream_usage(client):
    chunks = list(client.chat.completions.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5
    assert all(c.usage is None for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) == 5
    assert text


def test_stream_helper(client):
    with client.chat.completions.stream(model="gpt-4o", n=2,
                                        messages=[{"role": "user", "content": "hi"}]) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    assert len(final.choices) == 2


def test_tools_stream(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
    with client.chat.completions.stream(model="gpt-4o", tools=tools, tool_choice="required",
                                        messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_completion()
    tc = final.choices[0].message.tool_calls
    assert tc and tc[0].function.name == "get_weather"
    assert "city" in json.loads(tc[0].function.arguments)


@pytest.mark.asyncio
async def test_async(aclient):
    r = await aclient.chat.completions.create(model="o3", messages=[{"role": "user", "content": "x"}])
    assert r.usage.completion_tokens_details.reasoning_tokens > 0
