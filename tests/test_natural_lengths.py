"""The product default ``--max-tokens-mode cap``: a real model usually stops on its own well
before a generous limit; the limit still cuts an answer that runs into it; benchmark harnesses
get exact lengths with ``ignore_eos`` or ``--max-tokens-mode exact``."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from llmsim import Config, ServerThread


@pytest.fixture
def natural() -> Any:
    with ServerThread(Config(port=0, latency="instant", seed=5, quiet=True)) as srv:
        assert srv.app.config.max_tokens_mode == "cap"  # the product default
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-x", max_retries=0,
                           _strict_response_validation=True) as c:
            yield c


def test_responses_stream_get_final_response_succeeds_by_default(natural: Any) -> None:
    for i in range(20):
        with natural.responses.stream(model="gpt-4o", input=f"Question {i}?",
                                      max_output_tokens=64) as s:
            final = s.get_final_response()  # raises unless response.completed arrives
        assert final.status == "completed" and 1 <= final.usage.output_tokens < 64


def test_chat_answers_stop_before_a_generous_limit(natural: Any) -> None:
    finishes = [natural.chat.completions.create(
        model="gpt-4o", max_tokens=50, messages=[{"role": "user", "content": f"q{i}"}]
    ).choices[0].finish_reason for i in range(40)]
    assert finishes.count("stop") >= 38  # the limit is rarely reached (under 1% expected)


def test_reasoning_model_completes_within_its_budget(natural: Any) -> None:
    r = natural.responses.create(model="o4-mini", input="think", max_output_tokens=400,
                                 reasoning={"effort": "medium"})
    assert r.status == "completed"
    assert r.usage.output_tokens <= 400 and r.usage.output_tokens_details.reasoning_tokens > 0


def test_a_tiny_limit_still_truncates(natural: Any) -> None:
    r = natural.responses.create(model="gpt-4o", input="hi", max_output_tokens=16)
    # a natural length drawn from mean 16/3 can still exceed 16 now and then: many seeds
    statuses = {natural.responses.create(model="gpt-4o", input=f"hi {i}", max_output_tokens=16,
                                         ).status for i in range(3)}
    assert r.usage.output_tokens <= 16 and statuses <= {"completed", "incomplete"}
    c = natural.chat.completions.create(model="gpt-4o", max_tokens=1,
                                        messages=[{"role": "user", "content": "hi"}])
    assert c.choices[0].finish_reason == "length" and c.usage.completion_tokens == 1


def test_exact_lengths_for_benchmarks(natural: Any) -> None:
    c = natural.chat.completions.create(model="gpt-4o", max_tokens=120,
                                        messages=[{"role": "user", "content": "hi"}],
                                        extra_body={"ignore_eos": True})
    assert c.usage.completion_tokens == 120 and c.choices[0].finish_reason == "length"
    with ServerThread(Config(port=0, latency="instant", max_tokens_mode="exact",
                             quiet=True)) as srv:
        with openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-x", max_retries=0) as cl:
            r = cl.completions.create(model="gpt-4o", prompt="x", max_tokens=77)
            assert r.usage.completion_tokens == 77


def test_models_list_a_non_reasoning_default_first(make_server: Any) -> None:
    """Harnesses that take the first listed model must not benchmark a reasoning model by
    accident; ``--default-model`` picks it (an unknown id is added)."""
    srv = make_server()
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-x", max_retries=0,
                       _strict_response_validation=True) as c:
        first = c.models.list().data[0]
        assert first.id == "gpt-4o"
        assert srv.app.registry.get(first.id).reasoning is False
    srv2 = make_server(default_model="my-org/llama-8b")
    with openai.OpenAI(base_url=srv2.url + "/v1", api_key="sk-x", max_retries=0) as c:
        ids = [m.id for m in c.models.list().data]
        assert ids[0] == "my-org/llama-8b" and len(ids) == len(set(ids))
    with pytest.raises(ValueError, match="default_model"):
        Config(default_model="")
