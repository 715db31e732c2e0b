"""vLLM compatibility extras for harnesses: model card fields, /tokenize and /detokenize,
--served-model-name."""

from __future__ import annotations

from typing import Any

import openai
import orjson
import pytest

from llmsim.sim import tokens as tok

from . import rawhttp


def test_model_cards_carry_root_parent_max_model_len(client: Any, srv: Any) -> None:
    models = client.models.list().data  # strict validation accepts the extra fields
    raw = rawhttp.request(srv.url, "GET", "/v1/models").json()["data"]
    for m in raw:
        assert m["root"] == m["id"] and m["parent"] is None
        assert m["max_model_len"] == m["context_window"] > 0
    assert len(models) == len(raw)


def test_tokenize_and_detokenize_round_trip(srv: Any) -> None:
    if tok.get_encoding("o200k_base") is None:
        pytest.skip("the exact tokenizer is not installed (tokens extra)")
    r = rawhttp.request(srv.url, "POST", "/tokenize", {"model": "gpt-4o",
                                                        "prompt": "Hello world"})
    body = r.json()
    assert r.status == 200 and body["count"] == len(body["tokens"]) == 2
    assert body["max_model_len"] == 128_000
    back = rawhttp.request(srv.url, "POST", "/detokenize",
                           {"model": "gpt-4o", "tokens": body["tokens"]}).json()
    assert back == {"prompt": "Hello world"}
    chat = rawhttp.request(srv.url, "POST", "/tokenize", {
        "model": "gpt-4o", "messages": [{"role": "user", "content": "Hello world"}]}).json()
    assert chat["count"] == 2


@pytest.mark.parametrize("path, body, param", [
    ("/tokenize", {"model": "gpt-4o"}, "prompt"),
    ("/tokenize", {"model": "gpt-4o", "prompt": 5}, "prompt"),
    ("/detokenize", {"model": "gpt-4o"}, "tokens"),
    ("/detokenize", {"model": "gpt-4o", "tokens": [1, -2]}, "tokens"),
    ("/detokenize", {"model": "gpt-4o", "tokens": "abc"}, "tokens"),
])
def test_tokenizer_routes_refuse_bad_input(srv: Any, path: str, body: dict[str, Any],
                                           param: str) -> None:
    r = rawhttp.request(srv.url, "POST", path, body)
    assert r.status == 400 and orjson.loads(r.body)["error"]["param"] == param


def test_served_model_name_serves_exactly_those_ids(make_server: Any) -> None:
    srv = make_server(served_model_name=("meta-llama/Llama-3.1-8B-Instruct", "gpt-4o-mini"))
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0,
                       _strict_response_validation=True) as c:
        assert [m.id for m in c.models.list()] == ["meta-llama/Llama-3.1-8B-Instruct",
                                                   "gpt-4o-mini"]
        r = c.completions.create(model="meta-llama/Llama-3.1-8B-Instruct", prompt="x",
                                 max_tokens=3)
        assert r.model == "meta-llama/Llama-3.1-8B-Instruct"
        with pytest.raises(openai.NotFoundError):
            c.chat.completions.create(model="gpt-4o", messages=[{"role": "user",
                                                                 "content": "hi"}])
    assert srv.app.registry.get("gpt-4o-mini").ttft_ms == 350.0  # a known id keeps its profile
