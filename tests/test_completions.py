"""Legacy ``POST /v1/completions``: the official SDK (strict for JSON answers), raw SSE for
the wire, the errors, and the generic layers (faults, stats) applying to the new dialect."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from llmsim.api.completions import COMPLETIONS, DEFAULT_MAX_TOKENS

from . import rawhttp


@pytest.fixture
def loose(srv: Any) -> Any:
    """Streaming completions: the SDK types ``finish_reason`` as never null, while the real
    API (and llmsim) sends null in every chunk but the last, so strict validation of a
    completions *stream* fails against the real API too. Streams use the default client."""
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0) as c:
        yield c


def test_plain_completion_strict_sdk(client: Any) -> None:
    r = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Say hello")
    assert r.object == "text_completion" and r.id.startswith("cmpl-")
    assert r.model == "gpt-3.5-turbo-instruct" and len(r.choices) == 1
    ch = r.choices[0]
    assert ch.index == 0 and ch.text and ch.finish_reason in ("stop", "length")
    assert ch.logprobs is None
    # max_tokens defaults to 16, as the real API's does
    assert 1 <= r.usage.completion_tokens <= DEFAULT_MAX_TOKENS
    assert r.usage.prompt_tokens == 2
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_prompt_forms_and_choice_numbering(client: Any) -> None:
    r = client.completions.create(model="gpt-4o", prompt=["one two", "three"], n=2,
                                  max_tokens=4)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]  # prompt * n + j
    assert r.usage.prompt_tokens == 3
    r = client.completions.create(model="gpt-4o", prompt=[9906, 1917, 0], max_tokens=4)
    assert r.usage.prompt_tokens == 3 and len(r.choices) == 1
    r = client.completions.create(model="gpt-4o", prompt=[[1, 2], [3, 4, 5]], max_tokens=4)
    assert r.usage.prompt_tokens == 5 and len(r.choices) == 2


def test_legacy_logprobs_and_echo(client: Any) -> None:
    r = client.completions.create(model="gpt-4o", prompt="Hello there", logprobs=3, echo=True,
                                  max_tokens=5, seed=7)
    ch = r.choices[0]
    lp = ch.logprobs
    assert ch.text.startswith("Hello there")
    assert "".join(lp.tokens) == ch.text
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    # text_offset: each token's character offset in the choice text
    pos = 0
    for t, off in zip(lp.tokens, lp.text_offset, strict=True):
        assert off == pos
        pos += len(t)
    generated = lp.top_logprobs[2:]  # after the two echoed prompt tokens
    assert all(1 <= len(d) <= 3 for d in generated)
    assert all(v <= 0 for d in generated for v in d.values())
    assert r.usage.completion_tokens == len(lp.tokens) - 2


def test_same_seed_same_answer(client: Any) -> None:
    body = {"model": "gpt-4o", "prompt": "determinism", "max_tokens": 12, "seed": 42}
    a = client.completions.create(**body)
    b = client.completions.create(**body)
    assert a.choices[0].text == b.choices[0].text and a.usage == b.usage


def test_streaming_sdk_and_wire(srv: Any, loose: Any) -> None:
    chunks = list(loose.completions.create(model="gpt-4o", prompt="hi", max_tokens=6,
                                           stream=True,
                                           stream_options={"include_usage": True}))
    assert all(c.object == "text_completion" for c in chunks)
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage is not None
    tokens = [c for c in chunks[:-1] if c.choices[0].text]
    assert len(tokens) == usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")
    assert all(c.choices[0].finish_reason is None for c in tokens)
    # the wire: data-only SSE lines, [DONE] last, one token per chunk
    r = rawhttp.request(srv.url, "POST", "/v1/completions",
                        {"model": "gpt-4o", "prompt": "hi", "max_tokens": 3, "stream": True})
    assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = rawhttp.parse_sse(r.body)
    assert all(name is None for name, _ in events) and events[-1][1] == "[DONE]"
    datas = [orjson.loads(d) for _, d in events[:-1]]
    assert [d["choices"][0]["finish_reason"] for d in datas][-1] in ("stop", "length")
    assert sum(1 for d in datas if d["choices"][0]["text"]) == 3


async def test_async_client(aclient: Any) -> None:
    r = await aclient.completions.create(model="gpt-4o", prompt="async", max_tokens=3)
    assert r.choices[0].finish_reason in ("stop", "length") and r.usage.completion_tokens <= 3


@pytest.mark.parametrize("body, param, code", [
    ({"model": "gpt-4o"}, "prompt", "missing_required_parameter"),
    ({"model": "gpt-4o", "prompt": 5}, "prompt", "invalid_type"),
    ({"model": "gpt-4o", "prompt": []}, "prompt", "empty_array"),
    ({"model": "gpt-4o", "prompt": [1, 2, 10**7]}, "prompt", "invalid_value"),
    ({"model": "gpt-4o", "prompt": ["a", 3]}, "prompt[1]", "invalid_type"),
    ({"model": "gpt-4o", "prompt": [[1], []]}, "prompt[1]", "invalid_type"),
    ({"model": "gpt-4o", "prompt": "x", "n": 2, "best_of": 1}, "best_of", "invalid_value"),
    ({"model": "gpt-4o", "prompt": "x", "best_of": 2, "stream": True}, "best_of",
     "invalid_value"),
    ({"model": "gpt-4o", "prompt": "x", "logprobs": 6}, "logprobs", "integer_above_max_value"),
    ({"model": "gpt-4o", "prompt": "x", "max_tokens": 10**6}, "max_tokens", "invalid_value"),
    ({"model": "gpt-4o", "prompt": "x", "max_tokens": 4, "min_tokens": 9}, "min_tokens",
     "invalid_value"),
    ({"model": "gpt-4o", "prompt": "x", "stop": ["a"] * 5}, "stop", "array_above_max_length"),
    ({"model": "gpt-4o", "prompt": "x", "stream_options": {}}, "stream_options",
     "invalid_value"),
    ({"model": "gpt-4o", "prompt": "x", "n": 10**9}, "n", "integer_above_max_value"),
    ({"model": "gpt-4o", "prompt": "x " * 200_000}, "prompt", "context_length_exceeded"),
    ({"model": "gpt-4o", "prompt": ["x"] * 3000}, "prompt", "array_above_max_length"),
])
def test_bad_requests_name_the_parameter(srv: Any, body: dict[str, Any], param: str,
                                         code: str) -> None:
    r = rawhttp.request(srv.url, "POST", "/v1/completions", body)
    assert r.status == 400, r.body
    err = orjson.loads(r.body)["error"]
    assert err["param"] == param and err["code"] == code and err["type"] == (
        "invalid_request_error")


def test_unknown_field_and_sdk_error_class(client: Any) -> None:
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument"):
        client.completions.create(model="gpt-4o", prompt="x", extra_body={"bogus": 1})


def test_vllm_extensions_shape_the_length(client: Any) -> None:
    r = client.completions.create(model="gpt-4o", prompt="x", max_tokens=40,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 40 and r.choices[0].finish_reason == "length"


def test_generic_layers_apply_to_the_dialect(make_server: Any) -> None:
    """Faults, stats and the stream core know nothing of completions: the dialect says
    which events carry tokens and how a mid-stream failure looks."""
    srv = make_server()
    body = {"model": "gpt-4o", "prompt": "x", "max_tokens": 10, "stream": True}
    r = rawhttp.request(srv.url, "POST", "/v1/completions", body,
                        headers=[("x-llmsim-fault", "error-after:3")])
    events = rawhttp.parse_sse(r.body)
    datas = [orjson.loads(d) for _, d in events[:-1]]
    assert events[-1][1] == "[DONE]" and "error" in datas[-1]
    assert sum(1 for d in datas if d.get("choices") and d["choices"][0]["text"]) == 3
    snap = srv.app.stats.snapshot()
    assert snap["requests_by_endpoint"].get("completions", 0) >= 1
    assert COMPLETIONS.is_token("token", b"") and not COMPLETIONS.is_token("chunk", {})


def test_echo_and_logprobs_count_in_the_work_bound(srv: Any) -> None:
    """``echo`` repeats every prompt in its choice (with ``logprobs``, a logprob object per
    prompt token): the per-request work bound counts those tokens too (before: 2,048 prompts
    × 1,000 tokens with logprobs 5 made an 84 MB answer)."""
    from . import rawhttp

    body = {"model": "gpt-4o", "prompt": [[1] * 1000] * 256, "max_tokens": 16,
            "echo": True, "logprobs": 5}
    r = rawhttp.request(srv.url, "POST", "/v1/completions", body)
    assert r.status == 400, r.body[:200]
    err = r.json()["error"]
    assert (err["code"], err["param"]) == ("request_too_large", "echo")
    # the same prompts without echo are within the bound
    r = rawhttp.request(srv.url, "POST", "/v1/completions", {**body, "echo": False})
    assert r.status == 200, r.body[:200]
