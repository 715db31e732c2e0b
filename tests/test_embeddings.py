"""``POST /v1/embeddings`` through the official SDK (strict; base64 by default and float),
the vectors' properties, the limits, and the generic layers."""

from __future__ import annotations

import math
from typing import Any

import openai
import orjson
import pytest

from . import rawhttp


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_sdk_default_base64_and_float_agree(srv: Any, client: Any) -> None:
    # the SDK asks for base64 by default and decodes it after parsing; its *strict*
    # validation runs before that decoding and rejects the base64 string the real API sends
    # too, so the default call uses a non-strict client (float answers are checked strictly)
    with openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0) as loose:
        a = loose.embeddings.create(model="text-embedding-3-small", input="The cat sat.")
    b = client.embeddings.create(model="text-embedding-3-small", input="The cat sat.",
                                 encoding_format="float")
    va, vb = a.data[0].embedding, b.data[0].embedding
    assert len(va) == len(vb) == 1536
    assert max(abs(x - y) for x, y in zip(va, vb, strict=True)) < 1e-6  # float32 on the wire
    assert math.isclose(math.sqrt(sum(x * x for x in vb)), 1.0, rel_tol=1e-6)
    assert a.object == "list" and a.model == "text-embedding-3-small"
    assert a.usage.prompt_tokens == a.usage.total_tokens == 4


def test_models_dimensions_and_list_input(client: Any) -> None:
    r = client.embeddings.create(model="text-embedding-3-large", input=["a b", "c", "d e f"],
                                 encoding_format="float")
    assert [d.index for d in r.data] == [0, 1, 2] and len(r.data[0].embedding) == 3072
    r = client.embeddings.create(model="text-embedding-3-large", input="shorter",
                                 dimensions=256, encoding_format="float")
    v = r.data[0].embedding
    assert len(v) == 256 and math.isclose(sum(x * x for x in v), 1.0, rel_tol=1e-6)
    r = client.embeddings.create(model="text-embedding-ada-002", input=[[1, 2, 3], [4, 5]],
                                 encoding_format="float")
    assert len(r.data) == 2 and r.usage.prompt_tokens == 5


def test_similar_texts_are_closer_than_unrelated_ones(client: Any) -> None:
    texts = ["How do I reset my password?", "How can I reset the password?",
             "Best pizza places in Naples"]
    v = [d.embedding for d in client.embeddings.create(
        model="text-embedding-3-small", input=texts, encoding_format="float").data]
    assert cos(v[0], v[1]) > 0.5 > cos(v[0], v[2])
    assert abs(cos(v[0], v[2])) < 0.3


def test_deterministic_across_servers(make_server: Any) -> None:
    got = []
    for _ in range(2):
        srv = make_server(seed=99)
        r = rawhttp.request(srv.url, "POST", "/v1/embeddings",
                            {"model": "text-embedding-3-small", "input": "same text"})
        got.append(orjson.loads(r.body)["data"][0]["embedding"])
    assert got[0] == got[1]


@pytest.mark.parametrize("body, status, param", [
    ({"model": "text-embedding-3-small"}, 400, "input"),
    ({"model": "text-embedding-3-small", "input": ""}, 400, "input"),
    ({"model": "text-embedding-3-small", "input": []}, 400, "input"),
    ({"model": "text-embedding-3-small", "input": ["ok", ""]}, 400, "input"),
    ({"model": "text-embedding-3-small", "input": 3}, 400, "input"),
    ({"model": "text-embedding-3-small", "input": [[1], "x", None]}, 400, "input[2]"),
    ({"model": "text-embedding-3-small", "input": ["x"] * 2049}, 400, "input"),
    ({"model": "text-embedding-3-small", "input": "x " * 9000}, 400, "input"),
    ({"model": "text-embedding-3-small", "input": [10**8]}, 400, "input"),
    ({"model": "text-embedding-3-small", "input": "x", "dimensions": 5000}, 400, "dimensions"),
    ({"model": "text-embedding-3-small", "input": "x", "dimensions": 0}, 400, "dimensions"),
    ({"model": "text-embedding-ada-002", "input": "x", "dimensions": 8}, 400, "dimensions"),
    ({"model": "text-embedding-3-small", "input": "x", "encoding_format": "hex"}, 400,
     "encoding_format"),
    ({"model": "gpt-4o", "input": "x"}, 400, "model"),
])
def test_bad_requests(srv: Any, body: dict[str, Any], status: int, param: str) -> None:
    r = rawhttp.request(srv.url, "POST", "/v1/embeddings", body)
    assert r.status == status, r.body
    assert orjson.loads(r.body)["error"]["param"] == param


def test_total_tokens_bound(srv: Any) -> None:
    r = rawhttp.request(srv.url, "POST", "/v1/embeddings",
                        {"model": "text-embedding-3-small", "input": ["x " * 4000] * 80})
    assert r.status == 400 and orjson.loads(r.body)["error"]["code"] == "max_tokens_per_request"


def test_chat_on_an_embedding_model_and_unknown_embedding_ids(client: Any) -> None:
    with pytest.raises(openai.BadRequestError, match="embedding model"):
        client.chat.completions.create(model="text-embedding-3-small",
                                       messages=[{"role": "user", "content": "hi"}])
    r = client.embeddings.create(model="BAAI/bge-m3", input="vLLM-served id",
                                 encoding_format="float")
    assert len(r.data[0].embedding) == 1536


def test_latency_capacity_and_stats(make_server: Any) -> None:
    srv = make_server(latency="realistic")
    r = rawhttp.request(srv.url, "POST", "/v1/embeddings",
                        {"model": "text-embedding-3-small", "input": "timed"})
    assert r.status == 200
    snap = srv.app.stats.snapshot()
    assert snap["requests_by_endpoint"].get("embeddings") == 1
    assert srv.app.stats.tokens_in == orjson.loads(r.body)["usage"]["prompt_tokens"] > 0
