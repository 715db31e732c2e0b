"""Hostile input against the observability and admin surface (issue 10, items 4, 6, 7):
long metric labels, unauthenticated changes under /llmsim/, and queue slots held by clients
that left. Loopback only, bounded in count and time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from llmsim.state.prom import prometheus_text
from llmsim.state.stats import MAX_KEYS, MAX_LABEL, Stats, label, merge

from . import rawhttp
from .faultkit import CHAT

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
