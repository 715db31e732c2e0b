"""The capacity model on a fake clock: a hosted model on the serving scheduler (an engine
derived from its latency profile and the --capacity-* options): waves, queueing TTFT,
load-dependent inter-token gaps, the timing of a request alone unchanged, rejection beyond the
queue, and no leaked sequence whatever the client does."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from llmsim.api.faults import CAPACITY
from llmsim.api.validate import SERVING
from llmsim.config import CapacityConfig, EngineSpec
from llmsim.sim.engine import hosted_profile
from llmsim.streaming.clock import FakeClock

from .faultkit import CHAT, exchange, server
from .memtransport import connect

STREAM = {**CHAT, "stream": True, "max_tokens": 5}


def engine(srv: Any, model: str = "gpt-4o") -> Any:
    """The scheduler engine of ``model`` (capacity on puts hosted models on it)."""
    return srv.app.feature(SERVING).ranks_of(model)[0]


def active(srv: Any, model: str = "gpt-4o") -> int:
    return len(engine(srv, model).running)


def fixed(slope: float, max_seqs: int, itl_ms: float = 10.0) -> Any:
    """The engine a fixed-latency (--itl-ms) gpt-4o gets: no prefill rate in its steps."""
    return hosted_profile("gpt-4o", itl_ms, 0.0, slope, max_seqs, 64, 1000)


def token_times(ex: Any, t0: float) -> list[float]:
    return [round(t - t0, 6) for t, c in zip(ex.times, ex.chunks, strict=True)
            for _ in range(c.count(b'"content":"') - c.count(b'"content":""'))]


async def test_six_requests_two_sequences_three_waves() -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=2, queue=10, itl_slope=0.5))
    t0 = clock.now()
    exs = await asyncio.gather(*(exchange(srv, STREAM) for _ in range(6)))
    assert all(ex.complete and ex.sse()[-1] == (None, "[DONE]") for ex in exs)
    # two at a time share every step (prefill, then 4 decode steps) of two sequences; each
    # spends its lead (TTFT 100 ms less its one-step prefill alone) holding its slot first,
    # and a queued request's TTFT grows by its wait
    step = fixed(0.5, 2).step_time(2, 2)
    assert 0.0105 < step < 0.011  # the knee: two sequences at slope 0.5 are barely slower
    lead = 0.1 - 0.01
    wave = lead + 5 * step
    firsts = sorted(token_times(ex, t0)[0] for ex in exs)
    ends = sorted(round(ex.times[-1] - t0, 6) for ex in exs)
    assert firsts == pytest.approx([w * wave + lead + step for w in (0, 0, 1, 1, 2, 2)],
                                   abs=2e-6)
    assert ends == pytest.approx([(w + 1) * wave for w in (0, 0, 1, 1, 2, 2)], abs=2e-6)
    for ex in exs:
        tt = token_times(ex, t0)
        assert [b - a for a, b in zip(tt, tt[1:], strict=False)] == \
            pytest.approx([step] * 4, abs=2e-6)
    e = engine(srv)
    assert (len(e.running), len(e.waiting), e.success, e.peak_waiting) == (
        0, 0, {"length": 6}, 4)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
async def test_inter_token_gap_grows_with_active_sequences(n: int) -> None:
    """Flat while the step is memory-bound, then linear: slope x ITL per sequence."""
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=8, itl_slope=0.5))
    t0 = clock.now()
    exs = await asyncio.gather(*(exchange(srv, STREAM) for _ in range(n)))
    gap = fixed(0.5, 8).step_time(n, n)
    assert gap == pytest.approx({1: 0.01, 2: 0.0107, 3: 0.015, 4: 0.02}[n], abs=1e-4)
    for ex in exs:
        tt = token_times(ex, t0)
        assert tt[0] == pytest.approx(0.1 - 0.01 + gap, abs=2e-6)  # (the lead, one step)
        assert [b - a for a, b in zip(tt, tt[1:], strict=False)] == \
            pytest.approx([gap] * 4, abs=2e-6)


async def test_prefill_grows_ttft_with_prompt_length() -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=4, prefill_ms_per_1k=200))
    long = {**STREAM, "messages": [{"role": "user", "content": "hello " * 5000}]}
    t0 = clock.now()
    ex = await exchange(srv, long)
    ttft = token_times(ex, t0)[0]
    assert 0.1 + 0.2 * 4.9 < ttft < 0.1 + 0.2 * 5.2  # ~5000 prompt tokens → ~1 s prefill


@pytest.mark.parametrize("status", [429, 503])
async def test_beyond_the_queue_is_rejected(status: int) -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=1, queue=1, reject_status=status))
    exs = await asyncio.gather(*(exchange(srv, STREAM) for _ in range(3)))
    assert sorted(ex.status for ex in exs) == sorted([200, 200, status])
    rej = next(ex for ex in exs if ex.status == status)
    err = rej.json()["error"]
    assert err["message"].startswith("That model is currently overloaded with other requests.")
    assert rej.headers["x-request-id"] in err["message"]
    assert rej.headers["retry-after"] == "1"
    assert engine(srv).rejected == 1 and active(srv) == 0
    assert srv.app.feature(CAPACITY).engines == {}  # (not on the slot model)


async def test_per_model_engines() -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=1, queue=0,
                                         models={"gpt-4o-mini": EngineSpec(max_seqs=3)}))
    mini = {**STREAM, "model": "gpt-4o-mini"}
    exs = await asyncio.gather(*(exchange(srv, mini) for _ in range(3)))
    assert [ex.status for ex in exs] == [200, 200, 200]
    exs = await asyncio.gather(*(exchange(srv, STREAM) for _ in range(2)))
    assert sorted(ex.status for ex in exs) == [200, 429]


async def test_non_streamed_requests_wait_and_release() -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=1))
    body = {**CHAT, "max_tokens": 5}
    t0 = clock.now()
    done: list[float] = []

    async def one() -> None:
        ex = await exchange(srv, body)
        assert ex.status == 200
        done.append(round(clock.now() - t0, 6))

    await asyncio.gather(*(one() for _ in range(3)))
    # one at a time, each its own time (100 ms + 4 gaps of 10 ms): the lead fills what its
    # steps alone do not
    assert sorted(done) == [0.14, 0.28, 0.42]
    assert active(srv) == 0


# ------------------------------------------------------------------------------ no leaks
async def _start(srv: Any, body: Any) -> tuple[Any, Any]:
    proto, tr = connect(srv)
    raw = orjson.dumps(body)
    proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: "
                        b"%d\r\n\r\n%s" % (len(raw), raw))
    return proto, tr


async def _until(cond: Any, passes: int = 100_000) -> None:
    for _ in range(passes):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


async def test_client_gone_mid_stream_and_in_queue_releases_everything() -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=1, queue=5))
    long = {**STREAM, "max_tokens": 500}
    _p1, tr1 = await _start(srv, long)
    await _until(lambda: tr1.out.count(b'"content":"') >= 3)
    _p2, tr2 = await _start(srv, long)  # waits in the queue
    await _until(lambda: len(engine(srv).waiting) == 1)
    tr2.close()  # leaves while queued
    await _until(lambda: not engine(srv).waiting)
    tr1.close()  # leaves mid-stream
    await _until(lambda: active(srv) == 0)
    ex = await exchange(srv, STREAM)  # the engine is whole again
    assert ex.complete and active(srv) == 0
    assert srv.app.stats.active_streams == 0 and srv.app.stats.active_requests == 0


async def test_client_gone_during_non_streamed_handler_releases() -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=1000, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=1, queue=5))
    _p, tr = await _start(srv, {**CHAT, "max_tokens": 5})
    await _until(lambda: SERVING in srv.app.features and srv.app.feature(SERVING).engines
                 and active(srv) == 1)
    tr.close()
    await _until(lambda: active(srv) == 0)


@pytest.mark.parametrize("fault", ["disconnect-after:2", "truncate-after:2", "error-after:2",
                                   "reset", "500"])
async def test_faults_never_leak_a_sequence(fault: str) -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=1, queue=5))
    exs = await asyncio.gather(exchange(srv, STREAM, [("x-llmsim-fault", fault)]),
                               exchange(srv, STREAM))
    assert exs[1].complete
    await _until(lambda: active(srv) == 0)


def test_capacity_status_route(make_server) -> None:  # type: ignore[no-untyped-def]
    from . import rawhttp

    st = make_server(capacity=CapacityConfig(max_seqs=2))
    assert rawhttp.request(st.url, "POST", "/v1/chat/completions", CHAT).status == 200
    data = rawhttp.request(st.url, "GET", "/llmsim/capacity").json()["data"]
    assert data == [{"model": "gpt-4o", "max_seqs": 2, "queue": 64, "active": 0, "waiting": 0,
                     "admitted": 1, "rejected": 0, "peak_waiting": 0, "itl_factor": 1.0}]


# --------------------------------------------------------------- hosted models on the scheduler
def _steady(model: str = "gpt-4o") -> dict[str, Any]:
    """The model's own profile, drawn TTFT jitter kept, each gap its median (the scheduler's
    steps carry no per-token jitter)."""
    from llmsim.config import ModelSpec

    return {model: ModelSpec(itl_jitter=0.0)}


@pytest.mark.parametrize("model,body", [
    ("gpt-4o", {"max_tokens": 12}),
    ("gpt-4o", {"max_tokens": 6, "messages": [{"role": "user", "content": "word " * 9000}]}),
    ("o4-mini", {"max_completion_tokens": 40, "reasoning_effort": "low"}),
])
@pytest.mark.parametrize("stream", [True, False])
async def test_a_request_alone_is_timed_as_without_the_scheduler(
        model: str, body: dict[str, Any], stream: bool) -> None:
    """Concurrency 1: the hosted model's own TTFT (jitter and prefill rate included, a long
    prompt prefilled in chunks), reasoning time and ITL, to the microsecond."""
    req = {**CHAT, "model": model, "stream": stream, **body}
    runs = []
    for cap in (CapacityConfig(), CapacityConfig(max_seqs=4, itl_slope=0.1)):
        clock = FakeClock()
        srv = server(clock, latency="realistic", models=_steady(model), capacity=cap)
        t0 = clock.now()
        ex = await exchange(srv, req)
        assert ex.status == 200 and ex.complete
        runs.append([round(t - t0, 6) for t in ex.times] if stream
                    else [round(clock.now() - t0, 6)])
        assert (SERVING in srv.app.features) == bool(cap.max_seqs)
    assert runs[1][-1] > 0.3 and runs[0] == runs[1]
    if stream:
        assert len(runs[0]) > 5


async def test_another_requests_prefill_stalls_a_decoding_stream() -> None:
    """Under load the hosted model bends like the engine: a long prompt's prefill shares
    the step of a stream decoding next to it (its gap grows by the prefill's compute) and
    the newcomer's own TTFT includes nothing it did not cause."""
    clock = FakeClock()
    srv = server(clock, latency="realistic", models=_steady(),
                 capacity=CapacityConfig(max_seqs=4))
    t0 = clock.now()
    a = asyncio.ensure_future(exchange(srv, {**STREAM, "max_tokens": 200, "ignore_eos": True}))
    while clock.now() < t0 + 1.0:  # A decodes alone (the fake clock runs its steps)
        await asyncio.sleep(0)
    long = {**STREAM, "messages": [{"role": "user", "content": "word " * 5000}]}
    b = await exchange(srv, long)
    ex = await a
    tt = token_times(ex, t0)
    gaps = [round(y - x, 6) for x, y in zip(tt, tt[1:], strict=False)]
    assert min(gaps) == pytest.approx(0.012, abs=1e-6)  # gpt-4o's ITL, alone
    # one step with B's ~5,000-token prefill: ~90 ms per 1,000 tokens (gpt-4o's rate)
    assert 0.4 < max(gaps) < 0.5 and sum(g > 0.013 for g in gaps) == 1
    assert b.status == 200 and engine(srv).public()["running"] == 0


async def test_embeddings_are_prefill_only_sequences_of_a_hosted_model() -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic",
                 capacity=CapacityConfig(max_seqs=1, queue=1, reject_status=503))
    body = {"model": "text-embedding-3-small", "input": "word " * 2000}
    t0 = clock.now()
    exs = await asyncio.gather(*(exchange(srv, body, path="/v1/embeddings") for _ in range(3)))
    assert sorted(ex.status for ex in exs) == [200, 200, 503]
    e = engine(srv, "text-embedding-3-small")
    assert e.success == {"stop": 2} and e.generation_tokens == 0 and e.rejected == 1
    assert e.prompt_tokens > 3000 and not e.running and not e.waiting
    assert clock.now() - t0 > 0.1


async def test_a_held_answer_the_engine_never_sees_keeps_a_slot() -> None:
    """A moderation holds its answer without the engine: the slot model admits it (one at a
    time, queued); a non-streamed chat or Responses answer is admitted by the slot model,
    then handed over to the engine (never counted twice)."""
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=1, queue=5))
    model = "omni-moderation-latest"
    t0 = clock.now()
    exs = await asyncio.gather(*(exchange(srv, {"model": model, "input": "hi"},
                                          path="/v1/moderations") for _ in range(2)))
    assert [ex.status for ex in exs] == [200, 200]
    slots = srv.app.feature(CAPACITY).engines[model]
    assert (slots.admitted, slots.active, slots.peak_waiting) == (2, 0, 1)
    assert clock.now() - t0 > 0.19  # one after the other (0.1 s each)
    held = srv.app.feature(CAPACITY).engines
    for path, body in (("/v1/chat/completions", {**CHAT, "max_tokens": 5}),
                       ("/v1/responses", {"model": "gpt-4o", "input": "hi",
                                          "max_output_tokens": 16})):
        before = engine(srv).success.get("length", 0) + engine(srv).success.get("stop", 0)
        task = asyncio.ensure_future(exchange(srv, body, path=path))
        await _until(lambda: bool(engine(srv).running))
        assert held["gpt-4o"].active == 0  # (its slot went back when the engine took it)
        ex = await task
        assert ex.status == 200 and held["gpt-4o"].active == 0
        assert sum(engine(srv).success.values()) == before + 1


async def test_instant_latency_stays_instant_under_capacity() -> None:
    """Nothing to time: no scheduler, the slot count only, every event at once."""
    clock = FakeClock()
    srv = server(clock, latency="instant", capacity=CapacityConfig(max_seqs=2, itl_slope=0.5))
    t0 = clock.now()
    exs = await asyncio.gather(*(exchange(srv, STREAM) for _ in range(2)))
    assert all(ex.complete for ex in exs) and SERVING not in srv.app.features
    assert {t - t0 for ex in exs for t in ex.times} == {0.0}
    assert srv.app.feature(CAPACITY).engines["gpt-4o"].admitted == 2
