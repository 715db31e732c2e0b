"""--engine: token timing from the serving engine's steps, on a fake clock, through the
HTTP protocol; its vLLM metrics parsed by prometheus_client."""

from __future__ import annotations

import asyncio
import random
import statistics
from dataclasses import replace
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmsim.api.serving import SERVING
from llmsim.sim import engine as sim_engine
from llmsim.streaming.clock import FakeClock

from .faultkit import CHAT, exchange, server
from .memtransport import connect

H100 = sim_engine.PROFILES["llama-3.1-8b-h100"]
STAGGER = 0.5  # clients start spread over half a first request's life


def exact(n: int, prompt_words: int = 0, **kw: Any) -> dict[str, Any]:
    """A streamed chat request of exactly ``n`` output tokens (vLLM's ignore_eos)."""
    msgs = CHAT["messages"] if not prompt_words else [
        {"role": "user", "content": "word " * prompt_words}]
    return {**CHAT, "messages": msgs, "stream": True, "max_tokens": n, "ignore_eos": True,
            "stream_options": {"include_usage": True}, **kw}


def token_times(ex: Any) -> list[float]:
    return [t for t, c in zip(ex.times, ex.chunks, strict=True)
            for _ in range(c.count(b'"content":"') - c.count(b'"content":""'))]


def engine_of(srv: Any, model: str = "gpt-4o", rank: int = 0) -> Any:
    return srv.app.feature(SERVING).engines[model][rank]


async def test_one_stream_is_paced_by_the_engine_steps() -> None:
    clock = FakeClock()
    srv = server(clock, engine="llama-3.1-8b-h100")
    t0 = clock.now()
    ex = await exchange(srv, exact(20))
    assert ex.complete and ex.status == 200
    tt = token_times(ex)
    assert len(tt) == 20
    gaps = [b - a for a, b in zip(tt, tt[1:], strict=False)]
    one = H100.step_time(1, 1)
    assert gaps == pytest.approx([one] * 19, abs=3e-4)
    assert tt[0] - t0 == pytest.approx(one * 1 + 0, abs=2e-3)  # a short prompt: one step
    eng = engine_of(srv)
    assert eng.generation_tokens == 20 and not eng.running and not eng.waiting
    assert eng.free == H100.num_blocks


async def closed_loop(srv: Any, conc: int, rounds: int = 3, out: int = 128,
                      words: int = 1000) -> tuple[float, float, int]:
    """``conc`` clients, each sending ``rounds`` requests one after another (the first at a
    staggered start, each later one up to 2 ms after the last ended: a client's own time,
    seeded); the median TPOT and TTFT of the requests past each client's first."""
    clock = srv.app.clock
    rng = random.Random(1)
    life = out * H100.step_time(conc, conc) + H100.step_time(1024, 1)
    tpots: list[float] = []
    ttfts: list[float] = []
    prompt = 0

    async def client(i: int) -> None:
        nonlocal prompt
        await clock.sleep(life * i / conc * STAGGER)
        for r in range(rounds):
            if r:
                await clock.sleep(rng.uniform(0, 0.002))
            t0 = clock.now()
            ex = await exchange(srv, exact(out, words))
            assert ex.complete, ex.body[-200:]
            tt = token_times(ex)
            assert len(tt) == out
            prompt = ex.sse()[-2][1]["usage"]["prompt_tokens"]
            if r:
                tpots.append((tt[-1] - tt[0]) / (out - 1))
                ttfts.append(tt[0] - t0)

    await asyncio.gather(*(client(i) for i in range(conc)))
    return statistics.median(tpots), statistics.median(ttfts), prompt


async def test_published_sweep_through_the_server() -> None:
    """vLLM 0.21, H100, Llama-3.1-8B, 1024-token prompts, 128-token answers: TPOT x1.02 /
    x1.69 / x7.2 at concurrency 4/16/64 against 1 (within 10%), TTFT x1.64 / x3.0 / x6.2
    (growing, within 25%)."""
    base = await closed_loop(server(FakeClock(), engine="llama-3.1-8b-h100"), 1)
    assert 1000 <= base[2] <= 1100  # ~1024-token prompts
    assert base[0] == pytest.approx(H100.step_time(1, 1), rel=0.01)
    ttfts = [base[1]]
    for conc, tpot_ratio, ttft_ratio in ((4, 1.02, 1.64), (16, 1.69, 3.0), (64, 7.2, 6.2)):
        tpot, ttft, _ = await closed_loop(server(FakeClock(), engine="llama-3.1-8b-h100"),
                                          conc)
        assert tpot / base[0] == pytest.approx(tpot_ratio, rel=0.10), conc
        assert ttft / base[1] == pytest.approx(ttft_ratio, rel=0.25), conc
        ttfts.append(ttft)
    assert ttfts == sorted(ttfts)


@pytest.fixture
def tiny(monkeypatch: pytest.MonkeyPatch) -> str:
    """A profile whose KV cache holds 3,200 tokens and whose queue holds 8."""
    prof = replace(H100, name="test-tiny", num_blocks=200, max_waiting=8)
    monkeypatch.setitem(sim_engine.PROFILES, "test-tiny", prof)
    return "test-tiny"


async def metrics(srv: Any) -> dict[str, Any]:
    ex = await exchange(srv, None, path="/metrics", method="GET")
    assert ex.status == 200
    return {f.name: f for f in text_string_to_metric_families(ex.body.decode())}


def value(fams: dict[str, Any], name: str, sample: str | None = None, **labels: str) -> float:
    fam = fams[name]
    return sum(s.value for s in fam.samples if s.name == (sample or name)
               and all(s.labels.get(k) == v for k, v in labels.items()))


async def test_kv_exhaustion_preempts_and_every_request_completes(tiny: str) -> None:
    clock = FakeClock()
    srv = server(clock, engine=tiny)
    exs = await asyncio.gather(*(exchange(srv, exact(300, 600)) for _ in range(6)))
    assert all(ex.complete and ex.status == 200 for ex in exs)
    assert all(len(token_times(ex)) == 300 for ex in exs)
    eng = engine_of(srv)
    assert eng.preemptions > 0 and eng.free == eng.profile.num_blocks
    fams = await metrics(srv)
    assert value(fams, "vllm:num_preemptions", "vllm:num_preemptions_total") == eng.preemptions
    assert value(fams, "vllm:request_success", "vllm:request_success_total",
                 finished_reason="length") == 6
    # a preempted stream stalls while it is recomputed: its longest gap is many steps
    worst = max(max(b - a for a, b in zip(tt, tt[1:], strict=False))
                for tt in map(token_times, exs))
    assert worst > 10 * H100.step_time(6, 6)


@pytest.mark.parametrize("status", [429, 503])
async def test_a_full_queue_refuses_with_the_capacity_error(
        monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    from llmsim.config import CapacityConfig

    prof = replace(H100, name="test-one-seat", max_num_seqs=1, max_waiting=1)
    monkeypatch.setitem(sim_engine.PROFILES, "test-one-seat", prof)
    srv = server(FakeClock(), engine="test-one-seat",
                 capacity=CapacityConfig(reject_status=status))
    # one runs, one waits, the third finds the queue full
    exs = await asyncio.gather(*(exchange(srv, exact(20)) for _ in range(3)))
    assert [ex.status for ex in exs] == [200, 200, status]
    assert exs[2].json()["error"]["message"] and all(ex.complete for ex in exs[:2])
    eng = engine_of(srv)
    assert eng.rejected == 1 and eng.peak_waiting == 1
    fams = await metrics(srv)
    assert value(fams, "vllm:admission_rejections", "vllm:admission_rejections_total") == 1


async def test_repeated_long_prefix_hits_the_cache_and_answers_sooner() -> None:
    clock = FakeClock()
    srv = server(clock, engine="llama-3.1-8b-h100")
    prefix = [{"role": "system", "content": "rule " * 4000}]

    def ask(q: str) -> dict[str, Any]:
        return {**exact(20), "messages": [*prefix, {"role": "user", "content": q}]}

    load = [asyncio.ensure_future(exchange(srv, exact(400, 300))) for _ in range(8)]
    t0 = clock.now()
    cold = await exchange(srv, ask("first question"))
    t1 = clock.now()
    warm = await exchange(srv, ask("second question"))
    await asyncio.gather(*load)
    usage = warm.sse()[-2][1]["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] >= 3900
    assert cold.sse()[-2][1]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert token_times(warm)[0] - t1 < (token_times(cold)[0] - t0) / 2
    fams = await metrics(srv)
    assert value(fams, "vllm:prompt_tokens_cached", "vllm:prompt_tokens_cached_total") >= 3900
    assert value(fams, "vllm:prefix_cache_hits", "vllm:prefix_cache_hits_total") >= 3900


async def test_non_streamed_answer_waits_for_the_engine() -> None:
    clock = FakeClock()
    srv = server(clock, engine="llama-3.1-8b-h100")
    t0 = clock.now()
    body = {**CHAT, "max_tokens": 50}
    ex = await exchange(srv, body)
    assert ex.status == 200 and ex.json()["usage"]["completion_tokens"] == 50
    assert ex.times[-1] - t0 == pytest.approx(50 * H100.step_time(1, 1), rel=0.05)
    eng = engine_of(srv)
    assert eng.success == {"length": 1} and eng.free == H100.num_blocks


RESP = {"model": "gpt-4o", "input": "Tell me a long story.", "max_output_tokens": 40}


async def test_a_non_streamed_response_waits_for_the_engine() -> None:
    """A held /v1/responses answer goes through the engine as chat's does (it used to wait
    the simulated time only, outside the engine: issue 30's Responses pipeline)."""
    clock = FakeClock()
    srv = server(clock, engine="llama-3.1-8b-h100")
    t0 = clock.now()
    ex = await exchange(srv, RESP, path="/v1/responses")
    assert ex.status == 200 and ex.json()["status"] in ("completed", "incomplete")
    n = ex.json()["usage"]["output_tokens"]
    eng = engine_of(srv)
    assert eng.generation_tokens == n and sum(eng.success.values()) == 1
    assert ex.times[-1] - t0 == pytest.approx(n * H100.step_time(1, 1), rel=0.1)
    assert eng.free == H100.num_blocks


async def test_a_background_response_runs_through_the_engine() -> None:
    """A background response (no client) joins the engine while it runs and leaves it when
    it ends; the stored response completes with the engine's tokens."""
    clock = FakeClock()
    srv = server(clock, engine="llama-3.1-8b-h100")
    ex = await exchange(srv, {**RESP, "background": True}, path="/v1/responses")
    assert ex.status == 200 and ex.json()["status"] == "queued"
    rid = ex.json()["id"]
    eng = engine_of(srv)
    seen_running = False
    for _ in range(200_000):
        await asyncio.sleep(0)
        seen_running = seen_running or bool(eng.running)
        if eng.success:
            break
    assert seen_running and sum(eng.success.values()) == 1
    got = await exchange(srv, None, path=f"/v1/responses/{rid}", method="GET")
    assert got.json()["status"] in ("completed", "incomplete")
    assert eng.generation_tokens == got.json()["usage"]["output_tokens"]
    assert not eng.running and eng.free == H100.num_blocks


async def test_a_client_leaving_mid_stream_frees_its_sequence() -> None:
    clock = FakeClock()
    srv = server(clock, engine="llama-3.1-8b-h100")
    proto, tr = connect(srv)
    raw = orjson.dumps(exact(500))
    proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: "
                        + str(len(raw)).encode() + b"\r\n\r\n" + raw)
    for _ in range(2000):
        await asyncio.sleep(0)
        if tr.out.count(b"content") > 5:
            break
    eng = engine_of(srv)
    assert eng.running
    proto.connection_lost(None)
    for _ in range(50):
        await asyncio.sleep(0)
    assert not eng.running and not eng.waiting and eng.free == H100.num_blocks


async def test_metrics_have_vllms_names_labels_and_types() -> None:
    srv = server(FakeClock(), engine="llama-3.1-8b-h100")
    await exchange(srv, exact(10))
    fams = await metrics(srv)
    want = {
        "gauge": ["vllm:num_requests_running", "vllm:num_requests_waiting",
                  "vllm:num_requests_waiting_by_reason", "vllm:kv_cache_usage_perc",
                  "vllm:engine_sleep_state", "vllm:lora_requests_info"],
        "counter": ["vllm:prefix_cache_queries", "vllm:prefix_cache_hits",
                    "vllm:num_preemptions", "vllm:prompt_tokens", "vllm:prompt_tokens_cached",
                    "vllm:generation_tokens", "vllm:request_success",
                    "vllm:admission_rejections"],
        "histogram": ["vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                      "vllm:request_time_per_output_token_seconds",
                      "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds",
                      "vllm:request_inference_time_seconds",
                      "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds",
                      "vllm:request_prompt_tokens", "vllm:request_generation_tokens",
                      "vllm:iteration_tokens_total",
                      "vllm:request_max_num_generation_tokens", "vllm:request_params_n",
                      "vllm:request_params_max_tokens", "vllm:request_num_preemptions",
                      "vllm:request_prefill_kv_computed_tokens"]}
    for typ, names in want.items():
        for n in names:
            assert n in fams, n
            assert fams[n].type == typ, n
    run = [s for s in fams["vllm:num_requests_running"].samples if "engine" in s.labels]
    assert run and run[0].labels == {"model_name": "gpt-4o", "engine": "0"}
    (q,) = fams["vllm:prefix_cache_queries"].samples
    assert q.labels == {"model_name": "gpt-4o", "engine": "0"} and q.value > 0
    (g,) = fams["vllm:generation_tokens"].samples
    assert g.labels == {"model_name": "gpt-4o", "engine": "0"} and g.value == 10
    ttft = [s for s in fams["vllm:time_to_first_token_seconds"].samples
            if s.name.endswith("_bucket")]
    assert ttft[0].labels == {"model_name": "gpt-4o", "engine": "0", "le": "0.001"}
    itl = fams["vllm:inter_token_latency_seconds"].samples
    assert [s.value for s in itl if s.name.endswith("_count")] == [9]
    it = fams["vllm:iteration_tokens_total"]
    les = [s.labels["le"] for s in it.samples if s.name.endswith("_bucket")]
    assert les[:4] == ["1.0", "8.0", "16.0", "32.0"] and les[-1] == "+Inf"
    assert value(fams, "vllm:request_success", "vllm:request_success_total",
                 finished_reason="length") == 1


async def test_stats_and_engines_endpoint_show_the_engine() -> None:
    srv = server(FakeClock(), engine="llama-3.1-8b-h100")
    await exchange(srv, exact(10))
    st = (await exchange(srv, None, path="/llmsim/stats", method="GET")).json()
    (e,) = st["engines"]
    assert e["profile"] == "llama-3.1-8b-h100" and e["running"] == 0
    assert e["generation_tokens"] == 10 and "hists" not in e
    en = (await exchange(srv, None, path="/llmsim/engines", method="GET")).json()
    assert en["data"][0]["kv_blocks"] == H100.num_blocks


def test_an_unknown_profile_is_a_config_error() -> None:
    from llmsim.config import Config, ConfigError

    with pytest.raises(ConfigError, match="llama-3.1-8b-h100"):
        Config(engine="h200-of-dreams")
    for n in (0, 65):
        with pytest.raises(ConfigError, match="data_parallel"):
            Config(engine="llama-3.1-8b-h100", data_parallel=n)


async def test_data_parallel_ranks_by_header_or_least_loaded() -> None:
    clock = FakeClock()
    srv = server(clock, engine="llama-3.1-8b-h100", data_parallel=3)
    pinned = [asyncio.ensure_future(exchange(srv, exact(50), headers=[
        ("x-data-parallel-rank", "2")])) for _ in range(2)]
    spread = [asyncio.ensure_future(exchange(srv, exact(50))) for _ in range(4)]
    await asyncio.gather(*pinned, *spread)
    served = [engine_of(srv, rank=r).generation_tokens // 50 for r in range(3)]
    assert sum(served) == 6 and served[2] >= 2 and min(served) >= 1
    bad = await exchange(srv, exact(5), headers=[("x-data-parallel-rank", "3")])
    assert bad.status == 400 and "x-data-parallel-rank" in bad.json()["error"]["param"]
    fams = await metrics(srv)
    ranks = {s.labels["engine"] for s in fams["vllm:kv_cache_usage_perc"].samples}
    assert ranks == {"0", "1", "2"}


async def test_per_model_profile_from_the_config_file() -> None:
    from llmsim.config import CapacityConfig, EngineSpec

    cap = CapacityConfig(models={"small": EngineSpec(engine="llama-3-8b-a100-40gb")})
    srv = server(FakeClock(), capacity=cap)
    ex = await exchange(srv, {**exact(10), "model": "small"})
    other = await exchange(srv, exact(10))
    assert ex.complete and other.complete
    engs = srv.app.feature(SERVING).engines
    assert list(engs) == ["small"] and engs["small"][0].profile.name == "llama-3-8b-a100-40gb"
    assert engs["small"][0].generation_tokens == 10
    with pytest.raises(Exception, match="engine"):
        EngineSpec(engine="nope")


# ------------------------------------------------------------------------------ embeddings
SERVED = "meta-llama/Llama-3.1-8B-Instruct"  # one id for chat and embeddings (vLLM's way)


def embed_body(words: int) -> dict[str, Any]:
    return {"model": SERVED, "input": "word " * words}


async def _spin(cond: Any, passes: int = 100_000) -> None:
    for _ in range(passes):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("never")


async def test_embeddings_share_the_engine_with_chat_streams(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An embeddings request is a prefill-only sequence of the model's engine: it counts as
    running while its prompt is computed, and chat streams behind a burst of them wait for
    those prefill steps (their TTFT grows); no output token is generated for it."""
    prof = replace(H100, name="test-slow-prefill", c_ms=0.5)  # 4,000 tokens: ~2 s
    monkeypatch.setitem(sim_engine.PROFILES, "test-slow-prefill", prof)
    clock = FakeClock()
    srv = server(clock, engine="test-slow-prefill", latency="realistic")
    chat = {**exact(8), "model": SERVED}
    t0 = clock.now()
    alone = await exchange(srv, chat)
    ttft_alone = token_times(alone)[0] - t0
    eng = engine_of(srv, SERVED)
    burst = [asyncio.ensure_future(exchange(srv, embed_body(4000), path="/v1/embeddings"))
             for _ in range(4)]
    await _spin(lambda: len(eng.running) + len(eng.waiting) == 4)
    fams = await metrics(srv)  # in flight: the embeddings are the engine's requests
    in_flight = value(fams, "vllm:num_requests_running", model_name=SERVED) + value(
        fams, "vllm:num_requests_waiting", model_name=SERVED)
    assert in_flight == 4 and value(fams, "vllm:num_requests_running", model_name=SERVED) >= 1
    t1 = clock.now()
    streams = await asyncio.gather(*(exchange(srv, chat) for _ in range(2)))
    exs = await asyncio.gather(*burst)
    assert all(ex.status == 200 and len(ex.json()["data"]) == 1 for ex in exs)
    ttfts = [token_times(ex)[0] - t1 for ex in streams]
    # behind two steps of ~8,000 prefill tokens each (~4 s each at 0.5 ms a token)
    assert ttft_alone < 0.05 and min(ttfts) > 2.0 > 40 * ttft_alone
    assert eng.success == {"length": 3, "stop": 4}
    assert eng.generation_tokens == 3 * 8 and eng.prompt_tokens > 16_000
    assert not eng.running and not eng.waiting and eng.free == prof.num_blocks
    fams = await metrics(srv)
    assert value(fams, "vllm:request_success", "vllm:request_success_total",
                 model_name=SERVED, finished_reason="stop") == 4


@pytest.mark.parametrize("status", [429, 503])
async def test_embeddings_beyond_the_queue_get_the_capacity_error(
        monkeypatch: pytest.MonkeyPatch, status: int) -> None:
    from llmsim.config import CapacityConfig

    prof = replace(H100, name="test-one-seat", max_num_seqs=1, max_waiting=1)
    monkeypatch.setitem(sim_engine.PROFILES, "test-one-seat", prof)
    srv = server(FakeClock(), engine="test-one-seat",
                 capacity=CapacityConfig(reject_status=status))
    exs = await asyncio.gather(*(exchange(srv, embed_body(3000), path="/v1/embeddings")
                                 for _ in range(3)))
    assert sorted(ex.status for ex in exs) == [200, 200, status]
    err = next(ex for ex in exs if ex.status == status).json()["error"]
    assert err["message"].startswith("That model is currently overloaded")
    eng = engine_of(srv, SERVED)
    assert eng.rejected == 1 and eng.success == {"stop": 2} and not eng.running


@pytest.mark.parametrize("path,body", [
    ("/v1beta/models/emb-m:embedContent",
     {"content": {"parts": [{"text": "word " * 2000}]}}),
    ("/v1beta/models/emb-m:batchEmbedContents",
     {"requests": [{"model": "models/emb-m", "content": {"parts": [{"text": "word " * 1000}]}}
                   for _ in range(2)]}),
    ("/api/embed", {"model": "emb-m", "input": ["word " * 1000, "word " * 1000]}),
])
async def test_gemini_and_ollama_embeddings_are_prefill_only_sequences(
        monkeypatch: pytest.MonkeyPatch, path: str, body: dict[str, Any]) -> None:
    """Gemini's embedContent/batchEmbedContents and Ollama's /api/embed join the model's
    engine as /v1/embeddings does: counted while their prompt is computed, finished "stop"
    with no output token, the answer held until then."""
    prof = replace(H100, name="test-slow-prefill", c_ms=0.5)
    monkeypatch.setitem(sim_engine.PROFILES, "test-slow-prefill", prof)
    clock = FakeClock()
    srv = server(clock, engine="test-slow-prefill", latency="realistic")
    t0 = clock.now()
    task = asyncio.ensure_future(exchange(srv, body, path=path))
    await _spin(lambda: "emb-m" in srv.app.feature(SERVING).engines
                and bool(engine_of(srv, "emb-m").running))
    eng = engine_of(srv, "emb-m")
    ex = await task
    assert ex.status == 200, ex.body
    assert eng.success == {"stop": 1} and eng.generation_tokens == 0
    assert eng.prompt_tokens >= 2000
    assert clock.now() - t0 > 2000 * prof.c_ms / 1000  # held for its prefill at least
