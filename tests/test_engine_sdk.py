"""--engine through the official SDKs: every family's stream and answer completes, each
output token is generated once by the engine, and nothing is left in it afterwards
(counts only: no wall-clock timing)."""

from __future__ import annotations

from typing import Any

import anthropic
import openai

from llmsim.api.serving import SERVING


def engine(st: Any, model: str) -> Any:
    return st.app.feature(SERVING).engines[model][0]


def idle(e: Any) -> bool:
    return not e.running and not e.waiting and e.free == e.profile.num_blocks


def test_openai_chat_completions_and_legacy_completions(make_server: Any) -> None:
    st = make_server(engine="llama-3.1-8b-h100", time_scale=20)
    with openai.OpenAI(base_url=st.url + "/v1", api_key="sk", max_retries=0,
                       _strict_response_validation=True) as c:
        chunks = list(c.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=40,
            stream=True, stream_options={"include_usage": True}))
        text = [ch for ch in chunks if ch.choices and ch.choices[0].delta.content]
        assert len(text) == 40 and chunks[-1].usage is not None
        r = c.chat.completions.create(model="gpt-4o", max_tokens=30,
                                      messages=[{"role": "user", "content": "hi"}])
        assert r.usage is not None and r.usage.completion_tokens == 30
        comp = c.completions.create(model="gpt-4o", prompt="Say", max_tokens=20)
        assert comp.usage is not None and comp.usage.completion_tokens == 20
        e = engine(st, "gpt-4o")
        assert e.generation_tokens == 90 and e.success == {"length": 3} and idle(e)


def test_anthropic_messages_stream(make_server: Any) -> None:
    st = make_server(engine="llama-3.1-8b-h100", time_scale=20)
    c = anthropic.Anthropic(base_url=st.url, api_key="sk", max_retries=0)
    with c.messages.stream(model="claude-sonnet-4-6", max_tokens=25,
                           messages=[{"role": "user", "content": "hi"}]) as s:
        final = s.get_final_message()
    assert final.usage.output_tokens == 25
    e = engine(st, "claude-sonnet-4-6")
    assert e.generation_tokens == 25 and idle(e)


def test_responses_stream(make_server: Any) -> None:
    st = make_server(engine="llama-3.1-8b-h100", time_scale=20)
    with openai.OpenAI(base_url=st.url + "/v1", api_key="sk", max_retries=0) as c:
        events = list(c.responses.create(model="gpt-4o", input="hi", max_output_tokens=30,
                                         stream=True))
    assert events[-1].type == "response.incomplete"  # (max_output_tokens reached)
    e = engine(st, "gpt-4o")
    assert e.generation_tokens == 30 and idle(e)
