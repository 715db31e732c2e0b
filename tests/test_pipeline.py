"""The request pipeline (issue 30): a family is one module. The test-only echo family
(``tests/echo_family.py``) registered with one line gets JSON and streaming, scripts, faults,
capacity, stats and metrics from the pipeline and the generic hooks; and every generating
family counts as running while in flight, streamed or not."""

from __future__ import annotations

import io
import json
import threading
import time
import wave
from typing import Any

import httpx
import pytest

from llmsim import Config, ServerThread
from llmsim.config import CapacityConfig

from . import echo_family

SAY = "/echo/v1/say"


def _echo_server(**kw: Any) -> ServerThread:
    srv = ServerThread(Config(port=0, quiet=True, seed=3, **kw)).start()
    echo_family.register(srv.app)  # the one registration line
    return srv


@pytest.fixture
def echo() -> Any:
    srv = _echo_server(latency="instant", max_tokens_mode="exact")
    yield srv
    srv.stop()


def test_json_and_ndjson_stream(echo: Any) -> None:
    r = httpx.post(echo.url + SAY, json={"model": "gpt-4o", "text": "hello", "max_tokens": 7})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("echo_") and body["tokens"] == 7 and body["finish"] == "length"
    with httpx.stream("POST", echo.url + SAY, json={"model": "gpt-4o", "text": "hello",
                                                    "max_tokens": 5, "stream": True}) as s:
        assert s.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(x) for x in s.iter_lines() if x]
    assert [x["token"] for x in lines[:-1]] and len(lines) == 6
    assert lines[-1] == {"done": True, "finish": "length", "tokens": 5}
    bad = httpx.post(echo.url + SAY, json={"model": "gpt-4o"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "text"
    # the same request, the same answer (the seed comes from the pipeline)
    a = httpx.post(echo.url + SAY, json={"model": "gpt-4o", "text": "x", "max_tokens": 9})
    b = httpx.post(echo.url + SAY, json={"model": "gpt-4o", "text": "x", "max_tokens": 9})
    assert a.json()["text"] == b.json()["text"]


def test_scripts_and_faults_reach_the_family(echo: Any) -> None:
    rules = {"rules": [{"match": {"contains": "weather"},
                        "reply": [{"text": "It is sunny."}]}]}
    assert httpx.post(echo.url + "/llmsim/scripts", json=rules).status_code == 200
    r = httpx.post(echo.url + SAY, json={"model": "gpt-4o", "text": "the weather?"})
    assert r.json()["text"] == "It is sunny."
    r = httpx.post(echo.url + SAY, json={"model": "gpt-4o", "text": "x", "max_tokens": 3},
                   headers={"X-LLMSim-Fault": "503"})
    assert r.status_code == 503
    with httpx.stream("POST", echo.url + SAY, headers={"X-LLMSim-Fault": "error-after:2"},
                      json={"model": "gpt-4o", "text": "x", "max_tokens": 8,
                            "stream": True}) as s:
        lines = [json.loads(x) for x in s.iter_lines() if x]
    assert [x.get("token") is not None for x in lines] == [True, True, False]
    assert "error" in lines[-1]


def test_stats_metrics_and_running_while_in_flight() -> None:
    srv = _echo_server(latency="realistic", ttft_ms=600, itl_ms=1)
    try:
        seen: list[str] = []

        def poll() -> None:
            for _ in range(40):
                m = httpx.get(srv.url + "/metrics").text
                seen.extend(ln for ln in m.splitlines()
                            if ln.startswith('vllm:num_requests_running{model_name="echo-m"}'))
                time.sleep(0.02)

        t = threading.Thread(target=poll)
        t.start()
        r = httpx.post(srv.url + SAY, json={"model": "echo-m", "text": "x", "max_tokens": 2},
                       timeout=10)
        t.join()
        assert r.status_code == 200
        assert any(ln.endswith(" 1") for ln in seen), seen[:3]
        stats = httpx.get(srv.url + "/llmsim/stats").json()
        assert stats["requests_by_endpoint"].get("echo.say") == 1
    finally:
        srv.stop()


def test_capacity_applies_to_the_family() -> None:
    srv = _echo_server(latency="realistic", ttft_ms=400, itl_ms=1,
                       capacity=CapacityConfig(max_seqs=1, queue=0))
    try:
        results: list[int] = []

        def one() -> None:
            results.append(httpx.post(srv.url + SAY, json={
                "model": "echo-m", "text": "x", "max_tokens": 2}, timeout=10).status_code)

        threads = [threading.Thread(target=one) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert 200 in results and any(s in (429, 503) for s in results), results
    finally:
        srv.stop()


@pytest.mark.parametrize("path,body", [
    ("/v1/chat/completions", {"model": "run-m", "messages": [{"role": "user", "content": "x"}],
                              "max_tokens": 2}),
    ("/v1/completions", {"model": "run-m", "prompt": "x", "max_tokens": 2}),
    ("/v1/responses", {"model": "run-m", "input": "x", "max_output_tokens": 16}),
    ("/anthropic/v1/messages", {"model": "run-m", "max_tokens": 2,
                                "messages": [{"role": "user", "content": "x"}]}),
])
@pytest.mark.parametrize("stream", [False, True])
def test_every_family_counts_as_running_while_in_flight(path: str, body: dict[str, Any],
                                                        stream: bool) -> None:
    """vllm:num_requests_running is 1 while a request of any family is generating."""
    _assert_running(path, {**body, "stream": stream})


@pytest.mark.parametrize("path", [
    "/v1beta/models/run-m:generateContent",
    "/v1beta/models/run-m:streamGenerateContent?alt=sse",
    "/model/run-m/converse",
    "/model/run-m/converse-stream",
])
def test_path_streaming_families_count_as_running(path: str) -> None:
    """The families whose path says whether they stream (Gemini, Bedrock) are counted too."""
    gemini = path.startswith("/v1beta")
    body: dict[str, Any] = ({"contents": [{"role": "user", "parts": [{"text": "x"}]}],
                             "generationConfig": {"maxOutputTokens": 2}} if gemini else
                            {"messages": [{"role": "user", "content": [{"text": "x"}]}],
                             "inferenceConfig": {"maxTokens": 2}})
    _assert_running(path, body)


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path,body", [
    ("/api/chat", {"model": "run-m", "messages": [{"role": "user", "content": "x"}],
                   "options": {"num_predict": 2}}),
    ("/openai/deployments/run-m/chat/completions?api-version=2024-10-21",
     {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2}),
])
def test_provider_families_count_as_running(path: str, body: dict[str, Any],
                                            stream: bool) -> None:
    _assert_running(path, {**body, "stream": stream})


def _assert_running(path: str, body: dict[str, Any], model: str = "run-m",
                    **post: Any) -> None:
    """POST ``body`` (or ``post``: httpx's files/data) and see ``model`` running."""
    _assert_running_with(lambda url: httpx.post(url + path, json=body if not post else None,
                                                timeout=60, **post), model)


def _assert_running_with(send: Any, model: str = "run-m") -> None:
    """``send(url)`` makes one request (returning its response, status 200 expected, or None)
    while the server's /metrics is polled: the model is seen running."""
    with ServerThread(Config(port=0, quiet=True, latency="realistic", ttft_ms=500,
                             itl_ms=1, max_tokens_mode="exact")) as srv:
        seen: list[str] = []
        done = threading.Event()

        def poll() -> None:
            while not done.is_set():
                m = httpx.get(srv.url + "/metrics").text
                seen.extend(ln for ln in m.splitlines()
                            if ln.startswith(f'vllm:num_requests_running{{model_name="{model}"}}'))
                time.sleep(0.02)

        t = threading.Thread(target=poll)
        t.start()
        try:
            r = send(srv.url)
            assert r is None or r.status_code == 200, r.text
        finally:
            done.set()
            t.join()
        assert any(ln.endswith(" 1") for ln in seen), (model, seen[:3])


def _wav(seconds: float) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\x00\x10" * int(16000 * seconds))
    return buf.getvalue()


@pytest.mark.parametrize("path,body", [
    ("/v1/embeddings", {"model": "run-m", "input": "x"}),
    ("/v1/moderations", {"model": "omni-moderation-latest", "input": "x"}),
    ("/v1/images/generations", {"model": "dall-e-2", "prompt": "x", "size": "256x256"}),
    ("/v1/audio/speech", {"model": "tts-1", "input": "hello there", "voice": "alloy"}),
])
def test_media_families_count_as_running(path: str, body: dict[str, Any]) -> None:
    """Embeddings, moderations, images and speech are counted while in flight too."""
    _assert_running(path, body, body["model"])


def test_transcription_counts_as_running() -> None:
    _assert_running("/v1/audio/transcriptions", {}, "whisper-1", data={"model": "whisper-1"},
                    files={"file": ("a.wav", _wav(1.0), "audio/wav")})


def test_realtime_response_counts_as_running() -> None:
    """A Realtime ``response.create`` is counted while it generates (over the WebSocket)."""
    from openai import OpenAI

    def send(url: str) -> None:
        with OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0) as c, \
                c.realtime.connect(model="run-m") as conn:
            conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            conn.response.create()
            for ev in conn:
                if ev.type == "response.done":
                    return None
        return None

    _assert_running_with(send)


# -- the pipeline's hooks: a family with state of its own (Responses uses them all) ---------

async def test_a_background_response_counts_as_running_until_it_ends() -> None:
    """A background response has no client, yet it is generating: counted in
    vllm:num_requests_running from its start to its end (run_detached)."""
    from llmsim.streaming.clock import FakeClock

    from .faultkit import exchange, server
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=500, itl_ms=10)
    running = srv.app.stats.running
    ex = await exchange(srv, {"model": "run-m", "input": "x", "max_output_tokens": 16,
                              "background": True}, path="/v1/responses")
    assert ex.status == 200 and ex.json()["status"] == "queued"
    m = await exchange(srv, None, path="/metrics", method="GET")
    assert 'vllm:num_requests_running{model_name="run-m"} 1' in m.body.decode()
    clock.advance(0.1)
    assert running.get("run-m") == 1
    clock.advance(5.0)
    got = await exchange(srv, None, path=f"/v1/responses/{ex.json()['id']}", method="GET")
    assert got.json()["status"] in ("completed", "incomplete")  # (ended: the token limit)
    assert running.get("run-m") == 0


class _Kept(echo_family.Echo):
    """The echo family with state of its own, through the pipeline's hooks only: every
    answer is kept (after_decide, on_complete), a text "no" is refused (admit), "?" is
    answered without the model, and "later" is run with no client (run_detached)."""

    endpoint = "echo.kept"
    seed_path = "/echo/v1/kept"
    chained = True

    def __init__(self) -> None:
        self.kept: dict[str, dict[str, Any]] = {}

    def admit(self, req: Any, app: Any, p: Any) -> Any:
        from llmsim.errors import E
        from llmsim.messages import JSONResponse
        text = p.body["text"]
        if text == "no":
            raise E.invalid_value.at("text", value="no", allowed="anything else")
        return JSONResponse({"answer": "without the model"}) if text == "?" else None

    def after_decide(self, req: Any, app: Any, p: Any, d: Any, meta: Any) -> Any:
        from llmsim.api.pipeline import run_detached
        from llmsim.messages import JSONResponse
        rec = meta.state = self.kept[meta.id] = {"status": "running"}
        if p.body["text"] != "later":
            return None

        def done(reason: str) -> None:
            rec["status"] = reason

        run_detached(req, app, self.open_stream(p, d, meta), done)
        return JSONResponse({"id": meta.id, "status": "queued"}, 202)

    def on_complete(self, p: Any, d: Any, meta: Any, data: Any) -> None:
        meta.state.update(status="completed", text=data["text"])


async def test_a_family_keeps_its_own_state_through_the_hooks() -> None:
    from llmsim.api.pipeline import register
    from llmsim.streaming.clock import FakeClock

    from .faultkit import exchange, server
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=200, itl_ms=10)
    fam = _Kept()
    register(srv.app, fam, [("POST", "/echo/v1/kept")])
    path = "/echo/v1/kept"
    ok = await exchange(srv, {"model": "k-m", "text": "hello", "max_tokens": 3}, path=path)
    assert ok.status == 200
    assert fam.kept[ok.json()["id"]] == {"status": "completed", "text": ok.json()["text"]}
    no = await exchange(srv, {"model": "k-m", "text": "no"}, path=path)
    assert no.status == 400 and no.json()["error"]["param"] == "text"
    asked = await exchange(srv, {"model": "k-m", "text": "?"}, path=path)
    assert asked.json() == {"answer": "without the model"} and len(fam.kept) == 1
    later = await exchange(srv, {"model": "k-m", "text": "later", "max_tokens": 3}, path=path)
    assert later.status == 202 and fam.kept[later.json()["id"]]["status"] == "running"
    clock.advance(0.05)
    assert srv.app.stats.running.get("k-m") == 1  # generating with no client
    clock.advance(2.0)
    assert fam.kept[later.json()["id"]]["status"] == "completed"
    assert srv.app.stats.running.get("k-m") == 0


async def test_a_held_response_whose_client_left_is_cancelled() -> None:
    """on_abandon: a non-streamed Responses answer still held when its client goes away
    stops generating; the stored response says cancelled."""
    import asyncio

    import orjson

    from llmsim.api import responses
    from llmsim.streaming.clock import FakeClock

    from .faultkit import exchange, server
    from .memtransport import connect
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=500, itl_ms=10)
    proto, _tr = connect(srv)
    raw = orjson.dumps({"model": "gpt-4o", "input": "x", "max_output_tokens": 16})
    proto.data_received(b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-length: "
                        + str(len(raw)).encode() + b"\r\n\r\n" + raw)
    store = responses.state(srv.app).store
    for _ in range(1000):
        await asyncio.sleep(0)
        if len(store):
            break
    (rec,) = list(store.values())
    rid = rec.id
    assert srv.app.stats.running.get("gpt-4o") == 1
    proto.connection_lost(None)
    for _ in range(50):
        await asyncio.sleep(0)
    assert srv.app.stats.running.get("gpt-4o") == 0
    got = await exchange(srv, None, path=f"/v1/responses/{rid}", method="GET")
    assert got.json()["status"] == "cancelled"
