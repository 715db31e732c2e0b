"""Azure OpenAI paths (issue 32) through the ``openai`` SDK's ``AzureOpenAI`` client, plus raw
checks of Azure's api-version rules, error shapes and content-filter fields."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from llmsim import Config, ServerThread
from tests import rawhttp

CHAT = [{"role": "user", "content": "Say hi"}]
V = "2024-10-21"


@pytest.fixture(scope="module")
def srv() -> Any:
    with ServerThread(Config(port=0, latency="instant", seed=9, quiet=True,
                             azure_deployments=("prod-chat=gpt-4o-mini",))) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv: Any) -> openai.AzureOpenAI:
    return openai.AzureOpenAI(azure_endpoint=srv.url, api_key="k", api_version=V,
                              max_retries=0)


def test_chat_maps_the_deployment_and_adds_filter_results(client: openai.AzureOpenAI) -> None:
    r = client.chat.completions.create(model="prod-chat", messages=CHAT)
    assert r.model == "gpt-4o-mini" and r.choices[0].message.content
    extra = r.model_extra or {}
    assert extra["prompt_filter_results"][0]["content_filter_results"]["hate"] == {
        "filtered": False, "severity": "safe"}
    assert "content_filter_results" in (r.choices[0].model_extra or {})
    same = client.chat.completions.create(model="gpt-4o", messages=CHAT)
    assert same.model == "gpt-4o"  # a deployment not configured serves its own name


def test_stream_starts_with_the_prompt_filter_chunk(client: openai.AzureOpenAI) -> None:
    chunks = list(client.chat.completions.create(model="prod-chat", messages=CHAT,
                                                 stream=True, max_tokens=5))
    assert chunks[0].choices == [] and (chunks[0].model_extra or {})["prompt_filter_results"]
    assert "".join(c.choices[0].delta.content or "" for c in chunks[1:] if c.choices)
    assert chunks[-1].choices[0].finish_reason == "length"


def test_embeddings_completions_and_responses(srv: Any, client: openai.AzureOpenAI) -> None:
    e = client.embeddings.create(model="text-embedding-3-small", input=["a", "b"], dimensions=8)
    assert len(e.data) == 2 and len(e.data[0].embedding) == 8
    c = client.completions.create(model="gpt-3.5-turbo-instruct", prompt="Once", max_tokens=5)
    assert c.choices[0].text and c.choices[0].finish_reason == "length"
    rc = openai.AzureOpenAI(azure_endpoint=srv.url, api_key="k",
                            api_version="2025-04-01-preview", max_retries=0)
    r = rc.responses.create(model="prod-chat", input="Say hi")
    assert r.model == "gpt-4o-mini" and r.output_text
    assert rc.responses.retrieve(r.id).id == r.id
    events = list(rc.responses.create(model="prod-chat", input="Say hi", stream=True))
    assert events[-1].type == "response.completed"


def test_api_version_rules(srv: Any) -> None:
    url = srv.url + "/openai/deployments/gpt-4o/chat/completions"
    body = {"messages": CHAT}
    r = httpx.post(url, json=body)
    assert r.status_code == 404 and r.json() == {"error": {"code": "404",
                                                           "message": "Resource not found"}}
    for bad in ("2020-01-01", "latest-ish", "2024-13-01", "x" * 5000):
        r = httpx.post(url, params={"api-version": bad}, json=body)
        assert r.status_code == 400 and r.json()["error"]["code"] == "BadRequest", bad
    assert httpx.post(url, params={"api-version": "2025-04-01-preview"},
                      json=body).status_code == 200


def test_keys_entra_tokens_and_error_shapes() -> None:
    with ServerThread(Config(port=0, latency="instant", quiet=True, api_key=("secret",),
                             strict_models=True)) as s:
        url = s.url + "/openai/deployments/gpt-4o/chat/completions?api-version=" + V
        r = httpx.post(url, json={"messages": CHAT})
        assert r.status_code == 401 and r.json()["error"]["code"] == "401"
        assert httpx.post(url, json={"messages": CHAT},
                          headers={"api-key": "secret"}).status_code == 200
        entra = openai.AzureOpenAI(azure_endpoint=s.url, api_version=V, max_retries=0,
                                   azure_ad_token_provider=lambda: "eyJhbGciOi.eyJzdWIi.c2ln")
        assert entra.chat.completions.create(model="gpt-4o", messages=CHAT).choices
        bad = openai.AzureOpenAI(azure_endpoint=s.url, api_version=V, max_retries=0,
                                 azure_ad_token="not-a-jwt")
        with pytest.raises(openai.AuthenticationError):
            bad.chat.completions.create(model="gpt-4o", messages=CHAT)
        r = httpx.post(url.replace("gpt-4o", "nope"), json={"messages": CHAT},
                       headers={"api-key": "secret"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "DeploymentNotFound"


def test_bad_input_and_faults(srv: Any, client: openai.AzureOpenAI) -> None:
    url = srv.url + "/openai/deployments/gpt-4o/chat/completions?api-version=" + V
    for body in ({"messages": "x"}, {"messages": CHAT, "max_tokens": -1},
                 {"messages": CHAT, "n": 10_000}):
        r = httpx.post(url, json=body)
        assert r.status_code == 400 and r.json()["error"]["param"], body
    r = httpx.post(url, content=b"{", headers={"content-type": "application/json"})
    assert r.status_code == 400
    with pytest.raises(openai.RateLimitError) as ei:
        client.chat.completions.create(model="gpt-4o", messages=CHAT,
                                       extra_headers={"x-llmsim-fault": "429"})
    assert ei.value.status_code == 429 and "retry after" in str(ei.value.body)
    raw = rawhttp.request(srv.url, "POST", "/openai/deployments/gpt-4o/chat/completions"
                          "?api-version=" + V, {"messages": CHAT, "stream": True,
                                                "max_tokens": 8},
                          headers=[("x-llmsim-fault", "error-after:2")])
    events = rawhttp.parse_sse(raw.body)
    assert "error" in json.loads(events[-2][1])


def test_scripts_apply(make_server: Any) -> None:
    s = make_server()
    rawhttp.request(s.url, "POST", "/llmsim/scripts", {"rules": [
        {"match": {"endpoint": "chat.completions", "model": "gpt-4o"},
         "reply": [{"text": "Scripted."}]}]})
    c = openai.AzureOpenAI(azure_endpoint=s.url, api_key="k", api_version=V)
    assert c.chat.completions.create(model="gpt-4o", messages=CHAT).choices[0].message.content \
        == "Scripted."


def test_record_and_replay(tmp_path: Any) -> None:
    """Recording proxies the Azure path as it is (an Azure upstream's own path); replay
    serves the recorded answers, annotations included, without adding them twice."""
    ask = {"model": "gpt-4o", "messages": CHAT}
    with ServerThread(Config(port=0, latency="instant", seed=5, quiet=True)) as up, \
            ServerThread(Config(port=0, quiet=True, record_upstream=up.url,
                                cassettes=str(tmp_path))) as rec:
        c = openai.AzureOpenAI(azure_endpoint=rec.url, api_key="k", api_version=V,
                               max_retries=0)
        a = c.chat.completions.create(**ask)
        s1 = list(c.chat.completions.create(**ask, stream=True))
    assert len(list(tmp_path.iterdir())) == 2
    with ServerThread(Config(port=0, quiet=True, replay=str(tmp_path))) as rp:
        c = openai.AzureOpenAI(azure_endpoint=rp.url, api_key="k", api_version=V,
                               max_retries=0)
        b = c.chat.completions.create(**ask)
        s2 = list(c.chat.completions.create(**ask, stream=True))
    assert b.choices[0].message.content == a.choices[0].message.content
    assert (b.model_extra or {})["prompt_filter_results"]
    assert [x.choices for x in s2] == [x.choices for x in s1] and s1[0].choices == []
    assert sum(1 for x in s2 if not x.choices) == sum(1 for x in s1 if not x.choices)
