"""The Gemini API family (issue 32) through the official google-genai SDK, plus raw checks of
what the SDK hides (the JSON-array stream, the error envelope, snake_case fields)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from google import genai
from google.genai import errors as gerrors
from google.genai import types
from pydantic import BaseModel

from llmsim import Config, ServerThread

MODEL = "gemini-2.5-flash"


@pytest.fixture(scope="module")
def srv() -> Any:
    with ServerThread(Config(port=0, latency="instant", seed=9, quiet=True)) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv: Any) -> genai.Client:
    return genai.Client(api_key="g-key", http_options=types.HttpOptions(base_url=srv.url))


def test_generate_and_usage(client: genai.Client) -> None:
    r = client.models.generate_content(model=MODEL, contents="Say hi")
    assert r.text and r.candidates and r.candidates[0].finish_reason == types.FinishReason.STOP
    u = r.usage_metadata
    assert u is not None and u.prompt_token_count and u.candidates_token_count
    assert u.total_token_count == u.prompt_token_count + u.candidates_token_count + (
        u.thoughts_token_count or 0)
    assert (u.thoughts_token_count or 0) > 0  # 2.5 Flash thinks by default
    off = client.models.generate_content(
        model=MODEL, contents="Say hi",
        config=types.GenerateContentConfig(thinking_config=types.ThinkingConfig(
            thinking_budget=0)))
    assert off.usage_metadata is not None and not off.usage_metadata.thoughts_token_count
    shown = client.models.generate_content(
        model=MODEL, contents="Why is the sky blue?",
        config=types.GenerateContentConfig(thinking_config=types.ThinkingConfig(
            include_thoughts=True)))
    assert shown.candidates and shown.candidates[0].content is not None
    parts = shown.candidates[0].content.parts or []
    assert parts[0].thought is True and parts[-1].thought is not True


def test_max_output_tokens_truncates(client: genai.Client) -> None:
    r = client.models.generate_content(
        model="gemini-2.0-flash", contents="Write a long story about dragons",
        config=types.GenerateContentConfig(max_output_tokens=7))
    assert r.candidates and r.candidates[0].finish_reason == types.FinishReason.MAX_TOKENS
    assert r.usage_metadata is not None and r.usage_metadata.candidates_token_count == 7


def test_stream_sse(client: genai.Client) -> None:
    chunks = list(client.models.generate_content_stream(
        model="gemini-2.0-flash", contents="Explain TCP briefly",
        config=types.GenerateContentConfig(max_output_tokens=300)))
    assert len(chunks) > 2
    last = chunks[-1]
    assert last.candidates and last.candidates[0].finish_reason is not None
    assert last.usage_metadata is not None and last.usage_metadata.candidates_token_count
    text = "".join(c.text or "" for c in chunks)
    assert len(text) > 10


def test_function_calling_and_the_answer_after(client: genai.Client) -> None:
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        return f"Sunny in {city}"

    r = client.models.generate_content(
        model=MODEL, contents="What is the weather in Paris?",
        config=types.GenerateContentConfig(
            tools=[get_weather],
            automatic_function_calling=types.AutomaticFunctionCallingConfig(disable=True)))
    assert r.function_calls and r.function_calls[0].name == "get_weather"
    assert isinstance((r.function_calls[0].args or {}).get("city"), str)
    done = client.models.generate_content(
        model=MODEL, contents="What is the weather in Paris?",
        config=types.GenerateContentConfig(tools=[get_weather]))
    assert done.text and done.automatic_function_calling_history  # called, then answered


def test_json_schema_output(client: genai.Client) -> None:
    class Person(BaseModel):
        name: str
        age: int

    r = client.models.generate_content(
        model=MODEL, contents="A person",
        config=types.GenerateContentConfig(response_mime_type="application/json",
                                           response_schema=Person))
    assert isinstance(r.parsed, Person)


def test_count_tokens_embeddings_and_models(client: genai.Client) -> None:
    n = client.models.count_tokens(model=MODEL, contents="hello world")
    assert n.total_tokens and n.total_tokens > 0
    e = client.models.embed_content(model="gemini-embedding-001", contents=["a", "b"],
                                    config=types.EmbedContentConfig(output_dimensionality=64))
    assert e.embeddings and len(e.embeddings) == 2 and len(e.embeddings[0].values or []) == 64
    names = [m.name for m in client.models.list()]
    assert "models/gemini-2.5-flash" in names


def test_errors_in_googles_envelope(client: genai.Client, srv: Any) -> None:
    with pytest.raises(gerrors.ClientError) as ei:
        client.models.generate_content(
            model=MODEL, contents="x", config=types.GenerateContentConfig(candidate_count=99))
    assert ei.value.code == 400 and ei.value.status == "INVALID_ARGUMENT"
    raw = httpx.post(srv.url + f"/v1beta/models/{MODEL}:generateContent",
                     json={"contents": [], "bogus": 1})
    body = raw.json()
    assert raw.status_code == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
    assert set(body["error"]) == {"code", "message", "status"}
    r = httpx.post(srv.url + f"/v1beta/models/{MODEL}:generateContent",
                   json={"contents": [{"parts": [{"text": "x"}]}]},
                   headers={"x-llmsim-fault": "429"})
    assert r.status_code == 429 and r.json()["error"]["status"] == "RESOURCE_EXHAUSTED"
    with pytest.raises(gerrors.ClientError):
        client.models.generate_content(
            model=MODEL, contents=[{"role": "wizard", "parts": [{"text": "x"}]}])


def test_faults_and_scripts(make_server: Any) -> None:
    """The generic hooks on Gemini, through the SDK: a fault before the answer (Google's
    envelope), one mid-stream (the stream's own error chunk, SSE and the JSON array), and a
    script (matched by endpoint and by the model in the path)."""
    s = make_server()
    c = genai.Client(api_key="k", http_options=types.HttpOptions(
        base_url=s.url, headers={"x-llmsim-fault": "503"}))
    with pytest.raises(gerrors.ServerError) as ei:
        c.models.generate_content(model=MODEL, contents="x")
    assert ei.value.code == 503 and ei.value.status == "UNAVAILABLE"
    mid = genai.Client(api_key="k", http_options=types.HttpOptions(
        base_url=s.url, headers={"x-llmsim-fault": "error-after:2"}))
    with pytest.raises(gerrors.APIError):
        list(mid.models.generate_content_stream(
            model=MODEL, contents="Explain TCP",
            config=types.GenerateContentConfig(max_output_tokens=20)))
    with httpx.stream("POST", s.url + f"/v1beta/models/{MODEL}:streamGenerateContent",
                      json={"contents": [{"parts": [{"text": "Explain TCP"}]}],
                            "generationConfig": {"maxOutputTokens": 20}},
                      headers={"x-llmsim-fault": "error-after:2"}) as r:
        arr = json.loads(r.read())  # still one JSON array, the error its last element
    assert "candidates" in arr[0] and arr[-1]["error"]["code"] == 500
    httpx.post(s.url + "/llmsim/scripts", json={"rules": [
        {"match": {"endpoint": "gemini.generate", "model": "gemini-2.0-flash"},
         "reply": [{"text": "Scripted."}]}]})
    plain = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=s.url))
    assert plain.models.generate_content(model="gemini-2.0-flash", contents="x").text == \
        "Scripted."
    assert "".join(x.text or "" for x in plain.models.generate_content_stream(
        model="gemini-2.0-flash", contents="x")) == "Scripted."
    assert plain.models.generate_content(model=MODEL, contents="x").text != "Scripted."


def test_json_array_stream_and_snake_case(srv: Any) -> None:
    """Without alt=sse the REST API streams one JSON array; snake_case fields work."""
    with httpx.stream("POST", srv.url + "/v1beta/models/gemini-2.0-flash:streamGenerateContent",
                      json={"contents": [{"role": "user", "parts": [{"text": "Say hi"}]}],
                            "generation_config": {"max_output_tokens": 5}}) as s:
        assert s.headers["content-type"].startswith("application/json")
        data = json.loads(s.read())
    assert isinstance(data, list) and len(data) >= 2
    assert data[-1]["candidates"][0]["finishReason"] in ("STOP", "MAX_TOKENS")
    assert data[-1]["usageMetadata"]["candidatesTokenCount"] <= 5


def test_implicit_caching(client: genai.Client) -> None:
    prefix = " ".join(f"Fact {i}: the item {i} weighs {i} grams." for i in range(300))
    client.models.generate_content(model="gemini-2.0-flash", contents=prefix + " Q1")
    r = client.models.generate_content(model="gemini-2.0-flash", contents=prefix + " Q2")
    cached = r.usage_metadata.cached_content_token_count if r.usage_metadata else None
    assert cached and cached % 128 == 0 and cached >= 1024


def test_langchain_chat_google_generative_ai(srv: Any) -> None:
    lc = pytest.importorskip("langchain_google_genai")

    def chat(**kw: Any) -> Any:
        return lc.ChatGoogleGenerativeAI(model="gemini-2.0-flash", google_api_key="k",
                                         base_url=srv.url, max_retries=0, **kw)

    m = chat(max_output_tokens=12).invoke("Say hi")
    assert isinstance(m.content, str) and m.content
    assert m.usage_metadata and 0 < m.usage_metadata["output_tokens"] <= 12
    assert "".join(str(c.content) for c in chat(max_output_tokens=12).stream("Say hi"))

    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        return "sunny"

    t = chat().bind_tools([get_weather]).invoke("What is the weather in Paris?")
    assert t.tool_calls and t.tool_calls[0]["name"] == "get_weather"

    class Person(BaseModel):
        name: str
        age: int

    assert isinstance(chat().with_structured_output(Person).invoke("A person"), Person)


def test_record_and_replay(tmp_path: Any) -> None:
    """Recorded through llmsim from an upstream (here another llmsim), replayed offline: the
    SDK's generate and SSE stream get the recorded answers."""
    def run(url: str) -> tuple[Any, ...]:
        c = genai.Client(api_key="g-key", http_options=types.HttpOptions(base_url=url))
        whole = c.models.generate_content(model=MODEL, contents="hi").text
        parts = [x.text for x in c.models.generate_content_stream(model=MODEL, contents="hi")]
        return whole, parts

    with ServerThread(Config(port=0, latency="instant", seed=5, quiet=True)) as up, \
            ServerThread(Config(port=0, quiet=True, record_route=(f"gemini={up.url}",),
                                cassettes=str(tmp_path))) as rec:
        first = run(rec.url)
    assert len(list(tmp_path.iterdir())) == 2 and len(first[1]) > 2
    with ServerThread(Config(port=0, quiet=True, replay=str(tmp_path))) as rp:
        assert run(rp.url) == first
        other = genai.Client(api_key="k", http_options=types.HttpOptions(base_url=rp.url))
        with pytest.raises(gerrors.ClientError) as ei:
            other.models.generate_content(model="gemini-2.5-pro", contents="never recorded")
        assert ei.value.code == 404 and ei.value.status == "NOT_FOUND"
