"""The Ollama family (issue 32) through the official ``ollama`` client and LangChain's
``ChatOllama``, plus raw checks of what the clients hide (NDJSON framing, error shape, the
default stream, bounds)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import ollama
import pytest

from llmsim import Config, ServerThread
from tests import rawhttp

MODEL = "llama3.2"


@pytest.fixture(scope="module")
def srv() -> Any:
    with ServerThread(Config(port=0, latency="instant", seed=9, quiet=True)) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv: Any) -> ollama.Client:
    return ollama.Client(host=srv.url)


def _timed(r: Any) -> None:
    assert r.done is True and r.done_reason in ("stop", "length")
    assert r.eval_count and r.prompt_eval_count and r.eval_duration and r.prompt_eval_duration
    assert r.total_duration == (r.load_duration or 0) + r.prompt_eval_duration + r.eval_duration


def test_chat_and_generate(client: ollama.Client) -> None:
    r = client.chat(model=MODEL, messages=[{"role": "user", "content": "Say hi"}])
    assert r.message.role == "assistant" and r.message.content
    _timed(r)
    g = client.generate(model=MODEL, prompt="Why is the sky blue?", system="Be brief.")
    assert g.response and not g.thinking
    _timed(g)
    cut = client.chat(model=MODEL, messages=[{"role": "user", "content": "Write a long story"}],
                      options={"num_predict": 7})
    assert cut.done_reason == "length" and cut.eval_count == 7


def test_stream_is_ndjson_with_a_final_done(client: ollama.Client) -> None:
    chunks = list(client.chat(model=MODEL, messages=[{"role": "user", "content": "Explain TCP"}],
                              stream=True, options={"num_predict": 20}))
    assert len(chunks) == 21 and all(c.done is False for c in chunks[:-1])
    assert chunks[-1].done and chunks[-1].done_reason == "length" and chunks[-1].eval_count == 20
    assert "".join(c.message.content for c in chunks)
    parts = list(client.generate(model=MODEL, prompt="hello", stream=True))
    assert parts[-1].done and "".join(p.response for p in parts[:-1])


def test_timings_follow_the_simulated_latency() -> None:
    """With fixed latency the nanosecond fields are the simulated TTFT and gaps."""
    with ServerThread(Config(port=0, ttft_ms=200, itl_ms=10, seed=1, quiet=True)) as s:
        r = ollama.Client(host=s.url).generate(model=MODEL, prompt="hi",
                                               options={"num_predict": 5})
    assert r.prompt_eval_duration == 200_000_000 and r.eval_duration == 40_000_000
    assert r.total_duration == 240_000_000


def test_default_is_stream_and_empty_request_loads(srv: Any) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "options": {"num_predict": 3}}
    r = rawhttp.request(srv.url, "POST", "/api/chat", body)
    assert r.status == 200 and r.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(x) for x in r.body.decode().splitlines()]
    assert len(lines) == 4 and lines[-1]["done"] is True
    load = httpx.post(srv.url + "/api/generate", json={"model": MODEL}).json()
    assert load["done_reason"] == "load" and load["response"] == ""


def test_tools_format_and_think(client: ollama.Client) -> None:
    def get_weather(city: str) -> str:
        """Get the current weather for a city.

        Args:
          city: The city name
        """
        return f"Sunny in {city}"

    r = client.chat(model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}],
                    tools=[get_weather])
    calls = r.message.tool_calls or []
    assert calls and calls[0].function.name == "get_weather"
    assert isinstance(calls[0].function.arguments.get("city"), str)
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                                "age": {"type": "integer"}},
              "required": ["name", "age"]}
    j = client.chat(model=MODEL, messages=[{"role": "user", "content": "A person"}],
                    format=schema)
    person = json.loads(j.message.content)
    assert isinstance(person["name"], str) and isinstance(person["age"], int)
    assert isinstance(json.loads(client.generate(model=MODEL, prompt="x", format="json")
                                 .response), dict)
    t = client.chat(model="qwen3", messages=[{"role": "user", "content": "Why is 2+2=4?"}],
                    think=True)
    assert t.message.thinking and t.message.content
    with pytest.raises(ollama.ResponseError) as ei:
        client.chat(model="gpt-4o", messages=[{"role": "user", "content": "x"}], think=True)
    assert ei.value.status_code == 400 and "does not support thinking" in ei.value.error


def test_embed_list_show_ps_version(client: ollama.Client, srv: Any) -> None:
    e = client.embed(model="nomic-embed-text", input=["a", "b"], dimensions=32)
    assert len(e.embeddings) == 2 and len(e.embeddings[0]) == 32 and e.prompt_eval_count
    legacy = client.embeddings(model="nomic-embed-text", prompt="a")
    assert len(legacy.embedding) > 32
    names = [m.model for m in client.list().models]
    assert "gpt-4o:latest" in names
    assert "completion" in (client.show(MODEL).capabilities or [])
    assert client.ps().models
    assert httpx.get(srv.url + "/api/version").json()["version"]


def test_errors_in_ollamas_shape(client: ollama.Client, srv: Any) -> None:
    for body in ({"model": MODEL, "messages": "x"},
                 {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
                 {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                  "options": {"num_predict": "ten"}},
                 {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                  "format": "yaml"},
                 {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                  "options": {"stop": ["a"] * 100}},
                 {"messages": [{"role": "user", "content": "x"}]}):
        r = httpx.post(srv.url + "/api/chat", json=body)
        assert r.status_code == 400 and set(r.json()) == {"error"}, body
    r = httpx.post(srv.url + "/api/embed", json={"model": "e", "input": ["x"] * 5000})
    assert r.status_code == 400 and "input" in r.json()["error"]
    r = httpx.post(srv.url + "/api/chat", content=b"{not json")
    assert r.status_code == 400 and set(r.json()) == {"error"}
    r = httpx.post(srv.url + "/api/show", json={"model": ""})
    assert r.status_code == 404 and set(r.json()) == {"error"}


def test_faults_and_scripts(make_server: Any) -> None:
    s = make_server()
    c = ollama.Client(host=s.url, headers={"x-llmsim-fault": "429"})
    with pytest.raises(ollama.ResponseError) as ei:
        c.chat(model=MODEL, messages=[{"role": "user", "content": "x"}], stream=False)
    assert ei.value.status_code == 429
    # a mid-stream fault on the default (streamed) request: the stream's own error line
    r = rawhttp.request(s.url, "POST", "/api/chat", {"model": MODEL, "messages": [
        {"role": "user", "content": "x"}], "options": {"num_predict": 8}},
        headers=[("x-llmsim-fault", "error-after:2")])
    lines = [json.loads(x) for x in r.body.decode().splitlines()]
    assert len(lines) == 3 and "error" in lines[-1]
    with pytest.raises(ollama.ResponseError):
        list(ollama.Client(host=s.url, headers={"x-llmsim-fault": "error-after:2"}).chat(
            model=MODEL, messages=[{"role": "user", "content": "x"}], stream=True))
    rawhttp.request(s.url, "POST", "/llmsim/scripts", {"rules": [
        {"match": {"endpoint": "ollama.chat"}, "reply": [{"text": "Scripted answer."}]}]})
    r2 = ollama.Client(host=s.url).chat(model=MODEL, messages=[{"role": "user", "content": "x"}])
    assert r2.message.content == "Scripted answer."


def test_langchain_chat_ollama(srv: Any) -> None:
    lc = pytest.importorskip("langchain_ollama")
    llm = lc.ChatOllama(model=MODEL, base_url=srv.url, num_predict=12)
    msg = llm.invoke("Say hi")
    assert isinstance(msg.content, str) and msg.content
    assert msg.usage_metadata and msg.usage_metadata["output_tokens"] <= 12
    assert "".join(str(c.content) for c in llm.stream("Say hi"))


def test_record_and_replay(tmp_path: Any) -> None:
    """Recorded through llmsim from an upstream Ollama (here another llmsim), replayed
    offline: the same answers, streamed (NDJSON, frame by frame) or not."""
    def run(url: str) -> tuple[Any, ...]:
        c = ollama.Client(host=url)
        msgs = [{"role": "user", "content": "hi"}]
        whole = c.chat(model=MODEL, messages=msgs, stream=False).message.content
        lines = [x.message.content for x in c.chat(model=MODEL, messages=msgs, stream=True)]
        return whole, lines, c.embed(model="nomic-embed-text", input="x").embeddings

    with ServerThread(Config(port=0, latency="instant", seed=5, quiet=True)) as up, \
            ServerThread(Config(port=0, quiet=True, record_route=(f"ollama={up.url}",),
                                cassettes=str(tmp_path))) as rec:
        first = run(rec.url)
    assert len(list(tmp_path.iterdir())) == 3
    with ServerThread(Config(port=0, quiet=True, replay=str(tmp_path))) as rp:
        assert run(rp.url) == first
        r = httpx.post(rp.url + "/api/chat", json={"model": "other", "messages": [
            {"role": "user", "content": "never recorded"}]})
        assert r.status_code == 404 and set(r.json()) == {"error"}
