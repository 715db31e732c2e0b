"""Hostile input against the observability and admin surface (issue 10, items 4, 6, 7):
long metric labels, unauthenticated changes under /llmsim/, and queue slots held by clients
that left. Loopback only, bounded in count and time."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmsim.api.faults import FAULTS
from llmsim.config import CapacityConfig, ConfigError, load_config
from llmsim.ops.cli import config_from_args
from llmsim.state.prom import prometheus_text
from llmsim.state.stats import MAX_KEYS, MAX_LABEL, Stats, label, merge

from . import rawhttp
from .faultkit import CHAT, exchange, server

STREAM = {**CHAT, "stream": True, "max_tokens": 3}


def _until(cond: Callable[[], bool], limit_s: float = 3.0, every_s: float = 0.01) -> None:
    """Poll ``cond`` until true, failing after ``limit_s``."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > limit_s:
            raise AssertionError(f"condition not reached within {limit_s} s")
        time.sleep(every_s)


def _idle(url: str) -> bool:
    """Only the polling request itself is in flight and no stream is open."""
    a = rawhttp.request(url, "GET", "/llmsim/stats").json()["active"]
    return a["requests"] == 1 and a["streams"] == 0


# ============================================================================ labels (item 4)
def test_label_is_bounded_and_keeps_distinct_values_distinct() -> None:
    assert label("gpt-4o") == "gpt-4o"
    exact = "m" * MAX_LABEL
    assert label(exact) == exact
    a, b = "x" * 70_000 + "a", "x" * 70_000 + "b"
    la, lb = label(a), label(b)
    assert len(la) == len(lb) == MAX_LABEL and la != lb
    assert la.startswith("x" * (MAX_LABEL - 9) + "~") and la == label(a)  # stable
    st = Stats()
    st.error("k" * 10_000)
    assert [len(k) for k in st.errors] == [MAX_LABEL]
    assert len(st.model_key("m" * 10_000)) == MAX_LABEL


def test_long_label_cardinality_and_length_both_bounded() -> None:
    st = Stats()
    for i in range(MAX_KEYS + 10):
        m = f"{i:03d}" + "y" * 65_533
        st.record("chat.completions", m, "sse", 200)
        t = st.track(m, 0.0, "sse", lambda e, d: True, 10)
        assert t.observe is not None
        t.observe("x", None, 0.01)
        t.finish("completed", 0.05)
    raw = st.raw()
    text = prometheus_text(raw)
    # 64 distinct labels of ≤ 128 characters (+ "other"): ~2 MB, not ~740 MB
    assert len(text) < 3_000_000
    models = {s.labels["model"] for f in text_string_to_metric_families(text) for s in f.samples
              if "model" in s.labels}
    assert len(models) == MAX_KEYS + 1 and "other" in models
    assert max(map(len, models)) == MAX_LABEL
    # merging workers keeps the bounds
    merged = merge([raw, st.raw()])
    assert max(len(k) for k in merged["models"]) == MAX_LABEL


TRICKY = ['quote"d', "back\\slash", "new\nline", "cr\rtab\t", "nul\x00", "ü✓ 模型",
          '} 1\nfake_metric{a="b"} 2']


def test_long_and_tricky_model_ids_over_http(make_server: Any) -> None:
    st = make_server()
    longs = [f"{i}-" + "z" * 65_536 for i in range(4)]
    longs.append('"\\\n' * 20_000)  # long and full of characters that need escaping
    for m in longs + TRICKY:
        r = rawhttp.request(st.url, "POST", "/v1/chat/completions", {**STREAM, "model": m})
        assert r.status == 200
    r = rawhttp.request(st.url, "GET", "/metrics")
    assert r.status == 200 and len(r.body) < 500_000, len(r.body)
    fams = list(text_string_to_metric_families(r.body.decode()))
    names = {s.name for f in fams for s in f.samples}
    assert "fake_metric" not in names  # a newline in a label cannot forge a sample
    got = {s.labels["model"] for f in fams for s in f.samples
           if f.name == "llmsim_requests" and "model" in s.labels}
    assert got == {label(m) for m in longs + TRICKY}  # escaped exactly, distinct, bounded
    assert max(map(len, got)) == MAX_LABEL
    stats = rawhttp.request(st.url, "GET", "/llmsim/stats").json()
    assert set(stats["models"]) == got and set(stats["requests_by_model"]) == got
    _until(lambda: _idle(st.url))


# ============================================================================ admin (item 6)
ADMIN, API = "sk-admin-0123456789", "sk-api-0123456789"
CONFIGS = {"open": {}, "api": {"api_key": (API,)}, "admin": {"admin_key": (ADMIN,)},
           "both": {"api_key": (API,), "admin_key": (ADMIN,)}}
CREDS: dict[str, list[tuple[str, str]]] = {
    "none": [], "wrong": [("authorization", "Bearer sk-wrong-0123456789")],
    "admin": [("authorization", f"Bearer {ADMIN}")],
    "admin-header": [("x-llmsim-admin-key", ADMIN)],
    "api": [("authorization", f"Bearer {API}")], "api-header": [("api-key", API)]}
# (method, path, body, status when allowed)
MUTATIONS = [("POST", "/llmsim/faults", {"fault": "500", "model": "nope"}, 200),
             ("DELETE", "/llmsim/faults", None, 200),
             ("DELETE", "/llmsim/faults/fault_99", None, 404),
             ("POST", "/llmsim/stats/reset", None, 200)]


def _allowed(config: str, cred: str) -> bool:
    if config == "open":
        return True
    if config in ("admin", "both"):
        return cred in ("admin", "admin-header")
    return cred in ("api", "api-header")


@pytest.mark.parametrize("config", list(CONFIGS))
async def test_admin_mutations_need_the_right_key(config: str) -> None:
    srv = server(**CONFIGS[config])
    stats = srv.app.stats
    for method, path, body, ok in MUTATIONS:
        for cred, headers in CREDS.items():
            before = stats.requests_n
            ex = await exchange(srv, body, headers, path=path, method=method)
            if _allowed(config, cred):
                assert ex.status == ok, (method, path, cred, ex.body)
                continue
            assert ex.status == 401, (method, path, cred)
            err = ex.json()["error"]
            assert set(err) == {"message", "type", "param", "code"}
            assert err["type"] == "invalid_request_error" and err["param"] is None
            name = "admin key" if config in ("admin", "both") else "API key"
            if cred == "none":
                assert err["code"] is None
                assert err["message"].startswith(f"You didn't provide an {name}.")
            else:
                assert err["code"] == ("invalid_admin_key" if name == "admin key"
                                       else "invalid_api_key")
                assert err["message"].startswith(f"Incorrect {name} provided: ")
                sent = headers[0][1].removeprefix("Bearer ")
                assert sent not in err["message"] and sent[-4:] in err["message"]  # masked
            if path == "/llmsim/stats/reset":
                assert stats.requests_n >= before  # not wiped
    # a refused POST installed nothing: only authorized ones did (then were deleted)
    assert srv.app.feature(FAULTS).engine.rules == []
    assert stats.active_requests == 0 and stats.active_connections == 0


@pytest.mark.parametrize("config", list(CONFIGS))
async def test_reads_stay_open_and_do_not_show_keys(config: str) -> None:
    srv = server(**CONFIGS[config])
    rule = {"fault": "500", "api_key": "sk-victim-0123456789"}
    key = {"open": [], "api": CREDS["api"]}.get(config, CREDS["admin"])
    added = await exchange(srv, rule, key, path="/llmsim/faults")
    assert added.status == 200
    for path in ("/llmsim/stats", "/metrics", "/llmsim/capacity", "/llmsim/faults",
                 "/llmsim/faults/fault_1", "/llmsim/dashboard", "/health"):
        ex = await exchange(srv, None, path=path, method="GET")
        assert ex.status == 200, path
        if config != "open":
            assert b"sk-victim-0123456789" not in ex.body, path
    shown = (await exchange(srv, None, path="/llmsim/faults/fault_1", method="GET")).json()
    assert (shown["api_key"] == "sk-victim-0123456789") == (config == "open")
    # a browser's CORS preflight before a change is answered without a key
    ex = await exchange(srv, None, [("origin", "http://x"),
                                    ("access-control-request-method", "DELETE")],
                        path="/llmsim/faults", method="OPTIONS")
    assert ex.status == 200


async def test_admin_key_alone_leaves_the_api_open_and_api_keys_stay_api_keys() -> None:
    srv = server(admin_key=(ADMIN,))
    assert (await exchange(srv, CHAT)).status == 200  # /v1 needs no key without --api-key
    srv = server(api_key=(API,), admin_key=(ADMIN,))
    # the admin key is not an API key
    assert (await exchange(srv, CHAT, [("authorization", f"Bearer {ADMIN}")])).status == 401
    assert (await exchange(srv, CHAT, [("authorization", f"Bearer {API}")])).status == 200


def test_admin_key_over_a_real_socket(make_server: Any) -> None:
    st = make_server(api_key=(API,), admin_key=(ADMIN, "sk-second-admin"))
    r = rawhttp.request(st.url, "POST", "/llmsim/stats/reset")
    assert r.status == 401 and r.json()["error"]["message"].startswith(
        "You didn't provide an admin key.")
    for key in (ADMIN, "sk-second-admin"):
        r = rawhttp.request(st.url, "POST", "/llmsim/stats/reset",
                            headers=[("x-llmsim-admin-key", key)])
        assert r.status == 200 and r.json() == {"reset": True}
    _until(lambda: _idle(st.url))


def test_admin_key_flag_env_and_file(tmp_path: Any) -> None:
    c, _ = config_from_args(["--admin-key", "k1", "--admin-key", "k2"], env={})
    assert c.admin_key == ("k1", "k2")
    assert load_config(env={"LLMSIM_ADMIN_KEY": "k1,k2"}).admin_key == ("k1", "k2")
    f = tmp_path / "c.toml"
    f.write_text('admin_key = "k3"\n')
    assert load_config(f, env={}).admin_key == ("k3",)
    f.write_text('admin_key = ["k4", "k5"]\n')
    assert load_config(f, env={}).admin_key == ("k4", "k5")
    for bad in ('admin_key = ["has space"]\n', 'admin_key = ["é"]\n'):
        f.write_text(bad)
        with pytest.raises(ConfigError, match="admin_key"):
            load_config(f, env={})
    help_text = " ".join(__import__("llmsim.ops.cli", fromlist=["x"]).build_parser()
                         .format_help().split())
    assert "--admin-key KEY" in help_text and "X-LLMSim-Admin-Key" in help_text


# ====================================================================== queue side (item 7)
def _post(sock: socket.socket, body: dict[str, Any]) -> None:
    raw = orjson.dumps(body)
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                 b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(raw), raw))


def _capacity(url: str) -> dict[str, Any]:
    """gpt-4o's engine (capacity on puts the hosted model on the serving scheduler)."""
    data = rawhttp.request(url, "GET", "/llmsim/engines").json()["data"]
    return data[0] if data else {}


def _queued_gauges(url: str) -> tuple[int, float]:
    s = rawhttp.request(url, "GET", "/llmsim/stats").json()
    m = rawhttp.request(url, "GET", "/metrics").body.decode()
    w = [s.value for f in text_string_to_metric_families(m) for s in f.samples
         if s.name == "vllm:num_requests_waiting" and s.labels.get("model_name") == "gpt-4o"]
    return s["queue_depth"], sum(w)


@pytest.mark.parametrize("how", ["close", "half-close", "reset"])
def test_clients_that_leave_the_queue_free_it_at_once(make_server: Any, how: str) -> None:
    st = make_server(latency="realistic", ttft_ms=10, itl_ms=20,
                     capacity=CapacityConfig(max_seqs=1, queue=2))
    holder = rawhttp.connect(st.url)
    socks: list[socket.socket] = [holder]
    try:
        _post(holder, {**CHAT, "stream": True, "max_tokens": 2000})  # ~40 s: holds the slot
        assert holder.recv(64).startswith(b"HTTP/1.1 200")
        gone = [rawhttp.connect(st.url) for _ in range(2)]
        for s in gone:
            _post(s, {**CHAT, "max_tokens": 3})
        _until(lambda: _capacity(st.url).get("waiting") == 2)
        assert _queued_gauges(st.url) == (2, 2.0)
        for s in gone:
            if how == "reset":
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            if how == "half-close":
                s.shutdown(socket.SHUT_WR)
            else:
                s.close()
        # at once (within a 50 ms watch period), not when their turn comes (~40 s away): the
        # bound only tells the two apart, far from either on a busy machine
        _until(lambda: _capacity(st.url).get("waiting") == 0, limit_s=15.0)
        if how == "half-close":
            for s in gone:  # the server dropped them without an answer
                assert s.recv(100) == b""
                s.close()
        assert _queued_gauges(st.url) == (0, 0.0)
        by_status = rawhttp.request(st.url, "GET", "/llmsim/stats").json()["requests_by_status"]
        assert by_status.get("499") == 2  # counted as "client closed request"
        cap = _capacity(st.url)
        assert (cap["running"], cap["rejected"]) == (1, 0)
        # the queue is whole again: two new requests queue (a phantom would make one a 429)
        fresh = [rawhttp.connect(st.url) for _ in range(2)]
        socks += fresh
        for s in fresh:
            _post(s, {**CHAT, "max_tokens": 3})
        _until(lambda: _capacity(st.url).get("waiting") == 2)
        holder.close()  # frees the sequence: they run in turn and are answered
        for s in fresh:
            s.settimeout(10)
            assert s.recv(64).startswith(b"HTTP/1.1 200")
        _until(lambda: _capacity(st.url).get("running") == 0)
        _until(lambda: _idle(st.url))
        assert _queued_gauges(st.url) == (0, 0.0)
        assert _capacity(st.url)["rejected"] == 0
    finally:
        for s in socks:
            s.close()
