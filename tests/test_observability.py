"""Observability: /llmsim/stats, /metrics (parsed by prometheus_client), reset, merge, caps,
latency at the socket write (fake clock), gauges that return to zero, the access log, `top`."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import subprocess
import sys
import time
from contextlib import redirect_stdout
from typing import Any

import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmsim.api.faults import FAULTS
from llmsim.state.prom import METRICS, prometheus_text
from llmsim.state.stats import MAX_KEYS, PERCENTILE_RELATIVE_ERROR, Stats, quantile, render
from llmsim.streaming.clock import FakeClock

from . import rawhttp
from .memtransport import connect, mem_server

USER = [{"role": "user", "content": "hi"}]


def wait_for(cond: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.01)
    return bool(cond())


def metrics(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """/metrics parsed by the official parser: sample name → sorted labels → value."""
    r = rawhttp.request(url, "GET", "/metrics")
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    families = list(text_string_to_metric_families(r.body.decode()))
    assert families
    for fam in families:
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def stats(url: str) -> dict[str, Any]:
    r = rawhttp.request(url, "GET", "/llmsim/stats")
    assert r.status == 200
    return r.json()


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0,
                         _strict_response_validation=True)


# ------------------------------------------------------------------------------------------
# Known traffic → every counter and gauge, /metrics agrees with /llmsim/stats and the client
# ------------------------------------------------------------------------------------------

def test_known_traffic_counts_everything(make_server):
    srv = make_server(latency="realistic", ttft_ms=0, itl_ms=2)
    url = srv.url
    client = sdk(url)
    counted = {"json_tokens": 0, "stream_tokens": 0, "prompt": {"gpt-4o": 0, "gpt-4o-mini": 0}}
    # 3 JSON completions
    for _ in range(3):
        r = client.chat.completions.create(model="gpt-4o", messages=USER, max_tokens=4)
        counted["json_tokens"] += r.usage.completion_tokens
        counted["prompt"]["gpt-4o"] += r.usage.prompt_tokens
    # 2 streams, counting content tokens as the client sees them
    for _ in range(2):
        for chunk in client.chat.completions.create(
                model="gpt-4o-mini", messages=USER, max_tokens=6, stream=True,
                stream_options={"include_usage": True}):
            if chunk.choices and chunk.choices[0].delta.content:
                counted["stream_tokens"] += 1
            if chunk.usage is not None:
                counted["prompt"]["gpt-4o-mini"] += chunk.usage.prompt_tokens
    # errors: 400 (missing messages), 404 (unknown path), 405 (wrong method)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-4o", messages=None)  # type: ignore[arg-type]
    assert rawhttp.request(url, "GET", "/v1/nope").status == 404
    assert rawhttp.request(url, "GET", "/v1/chat/completions").status == 405
    client.close()

    s = stats(url)
    rows = {(r["endpoint"], r["model"], r["transport"], r["status"]): r["count"]
            for r in s["requests"]}
    assert rows == {("chat.completions", "gpt-4o", "http", 200): 3,
                    ("chat.completions", "gpt-4o-mini", "sse", 200): 2,
                    ("chat.completions", "gpt-4o", "http", 400): 1,  # refused: keeps its model
                    ("unmatched", "", "http", 404): 1,
                    ("unmatched", "", "http", 405): 1}
    assert s["requests_total"] == 8
    assert s["requests_by_status"] == {"200": 5, "400": 1, "404": 1, "405": 1}
    assert s["requests_by_transport"] == {"http": 6, "sse": 2}
    assert s["requests_by_model"] == {"gpt-4o": 4, "gpt-4o-mini": 2}  # the 400 too
    assert s["errors"] == {"missing_required_parameter": 1, "invalid_request_error": 1,
                           "method_not_allowed": 1}
    assert s["errors_total"] == 3
    assert s["stream_ends"] == {"completed": 2}
    assert s["streams_total"] == 2
    assert s["tokens"]["delivered"] == counted["json_tokens"] + counted["stream_tokens"]
    assert s["tokens"]["output"] == counted["json_tokens"] + counted["stream_tokens"]
    assert s["tokens"]["input"] == sum(counted["prompt"].values())
    m = s["models"]
    assert m["gpt-4o"]["delivered_tokens"] == counted["json_tokens"]
    assert m["gpt-4o-mini"]["delivered_tokens"] == counted["stream_tokens"]
    assert m["gpt-4o"]["prompt_tokens"] == counted["prompt"]["gpt-4o"]
    assert m["gpt-4o-mini"]["prompt_tokens"] == counted["prompt"]["gpt-4o-mini"]
    lat = s["latency_ms"]
    assert lat["ttft"]["count"] == 2  # one per stream (JSON has no first-token write)
    assert lat["itl"]["count"] == counted["stream_tokens"] - 2
    assert lat["e2e"]["count"] == 5
    assert m["gpt-4o-mini"]["itl_ms"]["p50"] is not None
    # the stats request itself is the only request in flight; nothing generating
    assert s["active"] == {"connections": 1, "requests": 1, "streams": 0, "websockets": 0}
    assert s["running"] == 0 and s["queue_depth"] == 0
    assert s["window"]["requests"] == 8 and s["window"]["requests_per_s"] > 0

    # a client that disconnects mid-stream
    sock = rawhttp.connect(url)
    body = orjson.dumps({"model": "gpt-4o-mini", "messages": USER, "max_tokens": 3000,
                         "stream": True})
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                 b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    got = b""
    while got.count(b'"content":"') < 5:
        got += sock.recv(65536)
    assert srv.app.stats.active_streams == 1
    assert {k: v for k, v in srv.app.stats.running.items() if v} == {"gpt-4o-mini": 1}
    sock.close()
    assert wait_for(lambda: srv.app.stats.active_streams == 0)
    s2 = stats(url)
    assert s2["stream_ends"] == {"completed": 2, "cancelled": 1}
    assert s2["errors"]["client_disconnect"] == 1
    assert s2["active"]["streams"] == 0 and s2["running"] == 0
    sent = s2["models"]["gpt-4o-mini"]["delivered_tokens"] - counted["stream_tokens"]
    assert 5 <= sent < 3000  # written before the client left, at least what it read
    assert s2["latency_ms"]["ttft"]["count"] == 3
    assert s2["latency_ms"]["e2e"]["count"] == 6

    # /metrics: parses with the official parser and agrees with /llmsim/stats
    mt = metrics(url)
    s3 = stats(url)
    for name in METRICS:
        if name == "llmsim_model_gauge":
            continue  # no per-model gauge set without the capacity model
        fam = name[:-len("_total")] if name.endswith("_total") else name
        assert any(k == name or k.startswith(fam) for k in mt), name
    prom_rows = {(d["endpoint"], d["model"], d["transport"], int(d["status"])): v
                 for labels, v in mt["llmsim_requests_total"].items()
                 for d in [dict(labels)]}
    assert prom_rows == {(r["endpoint"], r["model"], r["transport"], r["status"]): r["count"]
                         for r in s3["requests"]}
    assert sum(prom_rows.values()) == 9
    assert mt["llmsim_errors_total"][(("kind", "client_disconnect"),)] == 1
    assert mt["llmsim_active_streams"][()] == 0
    assert mt["llmsim_active_requests"][()] == 1  # the /metrics request
    for model in ("gpt-4o", "gpt-4o-mini"):
        lab = (("model_name", model),)
        assert mt["vllm:num_requests_running"][lab] == 0
        assert mt["vllm:num_requests_waiting"][lab] == 0
        assert mt["vllm:generation_tokens_total"][lab] == s3["models"][model]["delivered_tokens"]
        assert mt["vllm:prompt_tokens_total"][lab] == s3["models"][model]["prompt_tokens"]
        for vname, key in (("vllm:time_to_first_token_seconds", "ttft_ms"),
                           ("vllm:inter_token_latency_seconds", "itl_ms"),
                           ("vllm:time_per_output_token_seconds", "itl_ms"),
                           ("vllm:e2e_request_latency_seconds", "e2e_ms")):
            assert mt[vname + "_count"].get(lab, 0) == s3["models"][model][key]["count"]
            buckets = sorted(((float(dict(k)["le"]), v) for k, v in mt[vname + "_bucket"].items()
                              if dict(k)["model_name"] == model), key=lambda x: x[0])
            counts = [v for _, v in buckets]
            assert counts == sorted(counts)  # cumulative
            assert counts[-1] == mt[vname + "_count"].get(lab, 0)
        assert mt["llmsim_delivered_tokens_total"][(("model", model),)] == \
            s3["models"][model]["delivered_tokens"]
    assert mt["llmsim_completion_tokens_total"][()] == s3["tokens"]["output"]
    assert mt["llmsim_prompt_tokens_total"][()] == s3["tokens"]["input"]
    assert mt["llmsim_connections_total"][()] == s3["connections_total"] - 1  # + this one
    # the monitoring endpoints are not counted as load
    assert stats(url)["requests_total"] == 9


def test_injected_faults_are_counted(make_server):
    """Faults injected with the X-LLMSim-Fault header show up as error statuses and kinds."""
    srv = make_server()
    if srv.app.feature(FAULTS) is None and not any(
            r.name.startswith("faults") for r in srv.app.router.routes()) and \
            not _has_fault_module():
        pytest.skip("fault injection (X-LLMSim-Fault) is not part of this build")
    body = {"model": "gpt-4o", "messages": USER, "max_tokens": 3}
    r = rawhttp.request(srv.url, "POST", "/v1/chat/completions", body,
                        headers=[("x-llmsim-fault", "429")])
    assert r.status == 429
    r = rawhttp.request(srv.url, "POST", "/v1/chat/completions", body,
                        headers=[("x-llmsim-fault", "500")])
    assert r.status == 500
    s = stats(srv.url)
    rows = {(x["endpoint"], x["status"]): x["count"] for x in s["requests"]}
    assert rows[("chat.completions", 429)] == 1
    assert rows[("chat.completions", 500)] == 1
    assert s["errors_total"] >= 2
    assert s["requests_by_status"]["429"] == 1 and s["requests_by_status"]["500"] == 1
    assert s["active"]["streams"] == 0 and s["running"] == 0


def _has_fault_module() -> bool:
    try:
        import llmsim.api.faults  # noqa: F401
    except ImportError:
        return False
    return True


def test_reset_keeps_live_gauges(make_server):
    srv = make_server()
    client = sdk(srv.url)
    client.chat.completions.create(model="gpt-4o", messages=USER, max_tokens=2)
    client.close()
    assert stats(srv.url)["requests_total"] == 1
    r = rawhttp.request(srv.url, "POST", "/llmsim/stats/reset")
    assert r.status == 200 and r.json() == {"reset": True}
    s = stats(srv.url)
    assert s["requests_total"] == 0 and s["tokens"]["delivered"] == 0 and s["errors"] == {}
    assert s["latency_ms"]["e2e"]["count"] == 0 and s["models"] == {}
    assert s["active"]["requests"] == 1 and s["active"]["connections"] == 1
    assert rawhttp.request(srv.url, "GET", "/llmsim/stats/reset").status == 405


def test_top_once(srv, capsys):
    from llmsim.ops.cli import main

    rawhttp.request(srv.url, "POST", "/v1/chat/completions",
                    {"model": "gpt-4o", "messages": USER, "max_tokens": 2})
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert main(["top", "--url", srv.url, "--once"]) == 0
    out = buf.getvalue()
    assert "requests/s" in out and "gpt-4o" in out and "TTFT" in out
    assert main(["top", "--url", "http://127.0.0.1:1", "--once"]) == 1


# ------------------------------------------------------------------------------------------
# Latency measured at the socket write (fake clock: exact)
# ------------------------------------------------------------------------------------------

async def _run_stream(server: Any, clock: FakeClock, body: dict[str, Any]) -> Any:
    proto, tr = connect(server)
    data = orjson.dumps(body)
    proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d"
                        b"\r\n\r\n%s" % (len(data), data))
    for _ in range(20000):
        await asyncio.sleep(0)
        if tr.out.endswith(b"0\r\n\r\n"):
            break
    return proto, tr


async def test_latency_at_socket_write_fake_clock():
    clock = FakeClock()
    server = mem_server(clock=clock, latency="realistic", ttft_ms=300, itl_ms=25)
    await _run_stream(server, clock, {"model": "gpt-4o", "messages": USER, "max_tokens": 10,
                                      "stream": True})
    st = server.app.stats
    s = st.snapshot()
    m = s["models"]["gpt-4o"]
    assert m["ttft_ms"]["count"] == 1 and m["ttft_ms"]["mean"] == pytest.approx(300.0)
    assert m["itl_ms"]["count"] == 9 and m["itl_ms"]["mean"] == pytest.approx(25.0)
    assert m["e2e_ms"]["count"] == 1 and m["e2e_ms"]["mean"] == pytest.approx(525.0)
    # interpolated inside its bucket: within the documented 2% of the true 300 ms
    assert abs(m["ttft_ms"]["p50"] - 300.0) <= 300.0 * PERCENTILE_RELATIVE_ERROR
    assert 20.0 < m["itl_ms"]["p99"] <= 25.0
    # a non-streamed response: e2e at the write, running gauge released
    proto, tr = connect(server)
    data = orjson.dumps({"model": "gpt-4o", "messages": USER, "max_tokens": 5})
    proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d"
                        b"\r\n\r\n%s" % (len(data), data))
    for _ in range(20000):
        await asyncio.sleep(0)
        if st.running.get("gpt-4o") == 1:
            break
    assert st.snapshot()["running"] == 1
    for _ in range(20000):
        await asyncio.sleep(0)
        if b"chat.completion" in tr.out:
            break
    m = st.snapshot()["models"]["gpt-4o"]
    assert m["e2e_ms"]["count"] == 2
    assert m["e2e_ms"]["mean"] == pytest.approx((525.0 + 400.0) / 2)
    assert st.snapshot()["running"] == 0


async def test_disconnects_release_every_gauge():
    clock = FakeClock()
    server = mem_server(clock=clock, latency="realistic", ttft_ms=100, itl_ms=50)
    st = server.app.stats
    # mid-stream
    proto, tr = connect(server)
    data = orjson.dumps({"model": "m1", "messages": USER, "max_tokens": 500, "stream": True})
    proto.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d"
                        b"\r\n\r\n%s" % (len(data), data))
    for _ in range(20000):
        await asyncio.sleep(0)
        if tr.out.count(b'"content":') >= 3:
            break
    assert st.active_streams == 1 and {k: v for k, v in st.running.items() if v} == {"m1": 1}
    proto.connection_lost(None)
    # before the answer (a JSON request still "generating")
    proto2, tr2 = connect(server)
    data = orjson.dumps({"model": "m2", "messages": USER, "max_tokens": 50})
    proto2.data_received(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: "
                         b"%d\r\n\r\n%s" % (len(data), data))
    for _ in range(2000):
        await asyncio.sleep(0)
        if st.running.get("m2") == 1:
            break
    assert st.running.get("m2") == 1 and st.active_requests == 1
    proto2.connection_lost(None)
    for _ in range(50):
        await asyncio.sleep(0)
    s = st.snapshot()
    assert s["active"] == {"connections": 0, "requests": 0, "streams": 0, "websockets": 0}
    assert s["running"] == 0
    assert s["stream_ends"] == {"cancelled": 1}
    assert s["errors"] == {"client_disconnect": 2}
    rows = {(r["model"], r["transport"], r["status"]): r["count"] for r in s["requests"]}
    assert rows == {("m1", "sse", 200): 1, ("", "http", 499): 1}
    assert s["models"]["m1"]["ttft_ms"]["mean"] == pytest.approx(100.0)


# ------------------------------------------------------------------------------------------
# Pure parts: merge across workers, cardinality, quantiles
# ------------------------------------------------------------------------------------------

def _traffic(st: Stats, model: str, n: int, ttft: float) -> None:
    for _ in range(n):
        tr = st.track(model, 0.0, "sse", lambda t, d: t == "tok", prompt_tokens=3)
        tr.observe("tok", None, ttft)
        tr.observe("tok", None, ttft + 0.01)
        tr.observe("other", None, ttft + 0.02)
        tr.finish("completed", ttft + 0.02)
        st.record("chat.completions", model, "sse", 200)


def test_merge_sums_workers_and_renders():
    a, b = Stats(), Stats()
    _traffic(a, "gpt-4o", 3, 0.2)
    _traffic(b, "gpt-4o", 2, 0.4)
    _traffic(b, "o3", 1, 1.0)
    b.error("fault_disconnect")
    b.set_gauge("queue_depth", "o3", 4)
    a.conn_open()
    b.conn_open()
    merged = Stats.merge([a.raw(), b.raw()])
    s = render(merged)
    assert s["workers"] == 2
    assert s["requests_total"] == 6 and s["requests_by_model"] == {"gpt-4o": 5, "o3": 1}
    assert s["active"]["connections"] == 2 and s["queue_depth"] == 4
    assert s["errors"] == {"fault_disconnect": 1}
    g = s["models"]["gpt-4o"]
    assert g["ttft_ms"]["count"] == 5
    assert g["ttft_ms"]["mean"] == pytest.approx((3 * 200 + 2 * 400) / 5)
    assert g["itl_ms"]["mean"] == pytest.approx(10.0)
    assert g["delivered_tokens"] == 10 and g["prompt_tokens"] == 15
    assert s["window"]["requests"] == 6
    # merged raw is JSON-able and renders to Prometheus text the parser accepts
    merged = json.loads(json.dumps(merged))
    fams = {f.name: f for f in text_string_to_metric_families(prometheus_text(merged))}
    w = {tuple(sorted(x.labels.items())): x.value for x in fams["vllm:num_requests_waiting"].samples}
    assert w[(("model_name", "o3"),)] == 4


def test_model_cardinality_is_capped():
    st = Stats()
    for i in range(MAX_KEYS + 20):
        st.record("chat.completions", f"model-{i}", "http", 200)
        st.delivered(f"model-{i}", 1, 1, 0.01)
    s = st.snapshot()
    assert len(s["requests_by_model"]) == MAX_KEYS + 1
    assert s["requests_by_model"]["other"] == 20
    assert len(s["models"]) == MAX_KEYS + 1
    for i in range(MAX_KEYS + 20):
        st.error(f"kind-{i}")
    assert len(st.errors) == MAX_KEYS + 1 and st.errors["other"] == 20


def test_quantile_interpolates_like_prometheus():
    from llmsim.state.stats import BOUNDS, NB

    h = [0] * (NB + 1)
    i = BOUNDS.index(0.01)
    h[i] = 100  # 100 values in (BOUNDS[i - 1], 0.01]
    assert quantile(h, 0.5) == pytest.approx((BOUNDS[i - 1] + 0.01) / 2)
    assert quantile([0] * (NB + 1), 0.5) is None
    h2 = [0] * (NB + 1)
    h2[NB - 1] = 1  # +Inf bucket
    assert quantile(h2, 0.99) == BOUNDS[-1]


# ------------------------------------------------------------------------------------------
# Access log
# ------------------------------------------------------------------------------------------

def test_access_log_off_by_default():
    from llmsim.state.logs import ACCESS, INFO

    assert not ACCESS.isEnabledFor(INFO)


def test_access_log_json_lines():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    p = subprocess.Popen([sys.executable, "-m", "llmsim", "--port", "0", "--latency", "instant",
                          "--max-tokens-mode", "exact",
                          "--log-level", "info", "--log-format", "json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        assert p.stdout is not None and p.stderr is not None
        line = p.stdout.readline()
        url = line.split(" listening on ")[1].split()[0]
        rawhttp.request(url, "POST", "/v1/chat/completions",
                        {"model": "gpt-4o", "messages": USER, "max_tokens": 3})
        rawhttp.request(url, "POST", "/v1/chat/completions",
                        {"model": "gpt-4o", "messages": USER, "max_tokens": 4, "stream": True})
        rawhttp.request(url, "GET", "/v1/nope")
        lines = []
        while len(lines) < 3:
            ln = p.stderr.readline()
            assert ln, "server exited"
            if '"llmsim.access"' in ln:
                lines.append(json.loads(ln))
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(10)
    a, b, c = lines
    assert a["method"] == "POST" and a["path"] == "/v1/chat/completions"
    assert a["model"] == "gpt-4o" and a["status"] == 200 and a["tokens_out"] == 3
    assert a["tokens_in"] > 0 and a["duration_ms"] >= 0 and a["transport"] == "http"
    assert a["request_id"].startswith("req_")
    assert b["transport"] == "sse" and b["tokens_out"] == 4 and b["ttft_ms"] is not None
    assert b["end"] == "completed"
    assert c["status"] == 404 and c["model"] is None


def test_access_log_plain_format():
    import logging

    from llmsim.state.logs import access, setup_logging

    buf = io.StringIO()
    h = setup_logging("info", "plain", buf)
    try:
        access("POST", "/v1/chat/completions", "gpt-4o", 200, 8, 12, 0.1234, 0.5, "sse",
               "req_1", "127.0.0.1:5", end="completed")
    finally:
        logging.getLogger("llmsim").removeHandler(h)
        logging.getLogger("llmsim").setLevel(logging.WARNING)
    out = buf.getvalue()
    assert '"POST /v1/chat/completions" 200 model=gpt-4o tokens=8/12 ttft=123.4ms ' \
           'duration=500.0ms sse end=completed req_1' in out


def test_reset_mid_stream_counts_only_new_tokens():
    st = Stats()
    tr = st.track("gpt-4o", 0.0, "sse", lambda t, d: True)
    assert tr.observe is not None
    for i in range(5):
        tr.observe("tok", None, 0.1 * (i + 1))
    assert st.raw()["counters"]["tokens_delivered"] == 5
    st.reset()
    assert st.raw()["counters"]["tokens_delivered"] == 0
    assert st.active_streams == 1 and st.running["gpt-4o"] == 1  # live gauges survive
    tr.observe("tok", None, 0.7)
    assert st.raw()["counters"]["tokens_delivered"] == 1
    tr.finish("completed", 0.8)
    tr.finish("completed", 0.9)  # idempotent
    raw = st.raw()
    assert raw["counters"]["tokens_delivered"] == 1
    assert st.active_streams == 0 and st.running["gpt-4o"] == 0
    assert raw["stream_ends"] == {"completed": 1}


def test_a_stream_start_counts_as_record_then_track():
    """Stats.stream_started (one model lookup, the streamed request's path) leaves every
    counter, gauge and histogram as record() then track() do, the once-a-second ring too
    (its entries, and the totals summed over every model's histograms, make the window)."""
    now = [100.0]
    a, b = Stats(lambda: now[0]), Stats(lambda: now[0])
    tracks = []
    for i, model in enumerate(["gpt-4o", "gpt-4o-mini", "gpt-4o", None, "x" * 300]):
        now[0] += 3.0  # (the ring ticks at each start: the window spans some of them)
        a.record("chat.completions", model, "sse", 200)
        ta = a.track(model, 0.25 * i, "sse", lambda t, d: True, 7 + i)
        tb = b.stream_started("chat.completions", model, "sse", 200, 0.25 * i,
                              lambda t, d: True, 7 + i)
        assert (ta.key, ta.t0, ta.prompt, ta.transport) == (tb.key, tb.t0, tb.prompt,
                                                            tb.transport)
        tracks.append((ta, tb))
        for t in (ta, tb):
            assert t.observe is not None
            for k in range(3 + i):
                t.observe("tok", None, 0.5 * i + 0.01 * k + 0.3)
            t.fold()
    assert a.raw() == b.raw()
    for i, (ta, tb) in enumerate(tracks):
        now[0] += 0.7
        ta.finish("completed" if i % 2 else "cancelled", 5.0 + i)
        tb.finish("completed" if i % 2 else "cancelled", 5.0 + i)
    ra, rb = a.raw(), b.raw()
    assert ra == rb and ra["counters"]["streams_total"] == 5
    assert 0 < ra["window"]["tokens"] < sum(3 + i for i in range(5))  # (the last 10 s)


def test_ring_totals_sum_every_models_histograms():
    """The ring's totals (the windows' base) are each bucket summed over every model's
    histogram, counts and the latency sum alike."""
    st = Stats(lambda: 50.0)
    for j, model in enumerate(["a", "b", "c"]):
        for i, h in enumerate(st._hist(model)):
            for k in range(len(h)):
                h[k] = (k * 7 + i * 3 + j) % 5 if k < len(h) - 1 else 0.1 * (i + 1) * (j + 1)
    hs = st._totals(50.0)[5]
    for i in range(3):
        want = [sum(h[i][k] for h in st.hists.values()) for k in range(len(hs[i]))]
        assert hs[i] == want and len(want) == len(st.hists["a"][i])


def test_responses_api_is_labelled(srv):
    if not any(r.name.startswith("responses") for r in srv.app.router.routes()):
        pytest.skip("the Responses API is not part of this build")
    client = sdk(srv.url)
    client.responses.create(model="gpt-4o", input="hi", max_output_tokens=16)
    n = 0
    for ev in client.responses.create(model="gpt-4o-mini", input="hi", max_output_tokens=16,
                                      stream=True):
        n += ev.type == "response.output_text.delta"
    client.close()
    s = stats(srv.url)
    rows = {(r["endpoint"], r["model"], r["transport"], r["status"]): r["count"]
            for r in s["requests"]}
    assert rows[("responses", "gpt-4o", "http", 200)] == 1
    assert rows[("responses", "gpt-4o-mini", "sse", 200)] == 1
    assert s["models"]["gpt-4o-mini"]["delivered_tokens"] == n
    assert s["models"]["gpt-4o-mini"]["ttft_ms"]["count"] == 1
    assert s["active"]["streams"] == 0 and s["running"] == 0


def test_percentiles_within_two_percent_of_the_exact_samples():
    """p50/p90/p99 from /llmsim/stats against the exact samples of the same run: a FakeClock
    run of 400 streams with log-normal TTFTs and gaps, recorded through the stream tracks."""
    import math
    import random

    from llmsim.state.stats import Stats, render

    rng = random.Random(3)
    clock = [0.0]
    st = Stats(lambda: clock[0])
    ttfts, gaps = [], []
    for _ in range(400):
        t0 = clock[0]
        tr = st.track("gpt-4o", t0, "sse", lambda t, d: True, 0)
        now = t0 + rng.lognormvariate(math.log(0.2), 0.6)
        ttfts.append(now - t0)
        tr.observe("tok", None, now)
        for _ in range(5):
            g = rng.lognormvariate(math.log(0.02), 0.4)
            gaps.append(g)
            now += g
            tr.observe("tok", None, now)
        tr.finish("completed", now)
        clock[0] = now
    snap = render(st.raw())["models"]["gpt-4o"]

    def exact(xs, q):
        xs = sorted(xs)
        return xs[max(0, math.ceil(q * len(xs)) - 1)]

    for name, xs in (("ttft_ms", ttfts), ("itl_ms", gaps)):
        for q, key in ((0.5, "p50"), (0.9, "p90"), (0.99, "p99")):
            want = exact(xs, q) * 1000
            assert abs(snap[name][key] - want) <= want * PERCENTILE_RELATIVE_ERROR, (name, key)


def test_every_injected_fault_counts_in_errors_total(make_server):
    """Mid-stream faults (when they take effect) and resets count by kind; an injected 429
    counts by its code and keeps the model label."""
    srv = make_server()
    body = {"model": "gpt-4o", "messages": USER, "max_tokens": 8, "stream": True}
    for spec in ("error-after:2", "truncate-after:2", "stall-after:2:1"):
        rawhttp.request(srv.url, "POST", "/v1/chat/completions", body,
                        headers=[("x-llmsim-fault", spec)])
    try:
        rawhttp.request(srv.url, "POST", "/v1/chat/completions", body,
                        headers=[("x-llmsim-fault", "disconnect-after:2")])
    except Exception:
        pass
    r = rawhttp.request(srv.url, "POST", "/v1/chat/completions",
                        {**body, "model": "gpt-4o-mini"}, headers=[("x-llmsim-fault", "429")])
    assert r.status == 429
    assert wait_for(lambda: srv.app.stats.errors.get("fault_disconnect") == 1)
    errs = srv.app.stats.errors
    for kind in ("fault_error", "fault_truncate", "fault_stall", "rate_limit_exceeded"):
        assert errs.get(kind) == 1, (kind, dict(errs))
    rows = {k: v for k, v in srv.app.stats.requests.items() if k[3] == 429}
    assert rows == {("chat.completions", "gpt-4o-mini", "http", 429): 1}
