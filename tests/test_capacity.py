"""The capacity model on a fake clock: waves, queueing TTFT, load-dependent inter-token gaps,
rejection beyond the queue, and no leaked sequence whatever the client does."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from llmsim.api.faults import CAPACITY
from llmsim.config import CapacityConfig, EngineSpec
from llmsim.streaming.clock import FakeClock

from .faultkit import CHAT, exchange, server
from .memtransport import connect

STREAM = {**CHAT, "stream": True, "max_tokens": 5}


def engine(srv: Any, model: str = "gpt-4o") -> Any:
    return srv.app.feature(CAPACITY).engine(model)


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
    firsts = sorted(token_times(ex, t0)[0] for ex in exs)
    ends = sorted(round(ex.times[-1] - t0, 6) for ex in exs)
    # each stream: TTFT 100 ms, then 4 gaps of 10 ms × (1 + 0.5 × (2 active - 1)) = 160 ms;
    # a queued request's TTFT grows by its wait
    assert firsts == [0.1, 0.1, 0.26, 0.26, 0.42, 0.42]
    assert ends == [0.16, 0.16, 0.32, 0.32, 0.48, 0.48]
    for ex in exs:
        tt = token_times(ex, t0)
        assert [round(b - a, 6) for a, b in zip(tt, tt[1:], strict=False)] == [0.015] * 4
    e = engine(srv)
    assert (e.active, len(e.waiting), e.admitted, e.peak_waiting) == (0, 0, 6, 4)


@pytest.mark.parametrize("n,gap", [(1, 0.01), (2, 0.015), (3, 0.02), (4, 0.025)])
async def test_inter_token_gap_grows_with_active_sequences(n: int, gap: float) -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=8, itl_slope=0.5))
    t0 = clock.now()
    exs = await asyncio.gather(*(exchange(srv, STREAM) for _ in range(n)))
    for ex in exs:
        tt = token_times(ex, t0)
        assert tt[0] == pytest.approx(0.1)
        assert [round(b - a, 6) for a, b in zip(tt, tt[1:], strict=False)] == [gap] * 4


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
    assert engine(srv).rejected == 1 and engine(srv).active == 0


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
    assert sorted(done) == [0.14, 0.28, 0.42]
    assert engine(srv).active == 0


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
    await _until(lambda: engine(srv).active == 0)
    ex = await exchange(srv, STREAM)  # the engine is whole again
    assert ex.complete and engine(srv).active == 0
    assert srv.app.stats.active_streams == 0 and srv.app.stats.active_requests == 0


async def test_client_gone_during_non_streamed_handler_releases() -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=1000, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=1, queue=5))
    _p, tr = await _start(srv, {**CHAT, "max_tokens": 5})
    await _until(lambda: engine(srv).active == 1)
    tr.close()
    await _until(lambda: engine(srv).active == 0)


@pytest.mark.parametrize("fault", ["disconnect-after:2", "truncate-after:2", "error-after:2",
                                   "reset", "500"])
async def test_faults_never_leak_a_sequence(fault: str) -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=1, queue=5))
    exs = await asyncio.gather(exchange(srv, STREAM, [("x-llmsim-fault", fault)]),
                               exchange(srv, STREAM))
    assert exs[1].complete
    await _until(lambda: engine(srv).active == 0)


def test_capacity_status_route(make_server) -> None:  # type: ignore[no-untyped-def]
    from . import rawhttp

    st = make_server(capacity=CapacityConfig(max_seqs=2))
    assert rawhttp.request(st.url, "POST", "/v1/chat/completions", CHAT).status == 200
    data = rawhttp.request(st.url, "GET", "/llmsim/capacity").json()["data"]
    assert data == [{"model": "gpt-4o", "max_seqs": 2, "queue": 64, "active": 0, "waiting": 0,
                     "admitted": 1, "rejected": 0, "peak_waiting": 0, "itl_factor": 1.0}]
