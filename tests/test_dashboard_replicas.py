"""The dashboard's ``?replicas=url1,url2`` view in a real headless browser: one llmsim serves
the page, the browser polls every listed replica's ``/llmsim/stats`` across origins (allowed by
the server's ``access-control-allow-origin: *``) and shows per-replica rows and their sum; an
unreachable replica is shown as such, bad and surplus URLs are ignored with a visible note."""

from __future__ import annotations

import socket
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

from . import rawhttp
from .test_observability_browser import _num, browse
from .test_observability_browser import pytestmark as needs_chromium

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
        "stream": True}
STATE_JS = """(() => {
  const rows = [...document.querySelectorAll('#replicas tr')].map(
    (tr) => [...tr.children].map((td) => td.textContent));
  const note = document.getElementById('replica-note');
  return { status: document.getElementById('status').textContent,
           statusClass: document.getElementById('status').className,
           requests: document.getElementById('kpi-requests').textContent,
           ttft: document.getElementById('kpi-ttft').textContent,
           meta: document.getElementById('meta').textContent,
           cardHidden: document.getElementById('replicas-card').hidden,
           note: note.hidden ? null : note.textContent, rows };
})()"""


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there any more: connection refused
    return port


def _browse(url: str, ready: Callable[[dict[str, Any]], bool]) -> tuple[dict[str, Any],
                                                                       list[str]]:
    return browse(url, STATE_JS, ready, timeout=40.0)


def _traffic(urls: list[str], stop: threading.Event) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            for u in urls:
                rawhttp.request(u, "POST", "/v1/chat/completions", CHAT)
            stop.wait(0.05)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def _row_ok(rows: list[list[str]], label: str) -> list[str] | None:
    return next((r for r in rows if r[0] == label and r[1] == "live"), None)


@needs_chromium
def test_replicas_are_summed_per_replica_rows_and_bad_urls_noted(make_server: Any) -> None:
    fast = make_server(latency="realistic", ttft_ms=2, itl_ms=1)
    slow = make_server(latency="realistic", ttft_ms=60, itl_ms=1)
    dead = f"127.0.0.1:{_closed_port()}"
    for _ in range(3):
        rawhttp.request(fast.url, "POST", "/v1/chat/completions", CHAT)
    for _ in range(5):
        rawhttp.request(slow.url, "POST", "/v1/chat/completions", CHAT)
    label = {s: s.url.removeprefix("http://") for s in (fast, slow)}
    replicas = ",".join([fast.url, slow.url + "/", dead, "ftp://nope", "javascript:alert(1)",
                         fast.url])  # a duplicate is polled once
    page = fast.url + "/llmsim/dashboard?interval=300&replicas=" + urllib.parse.quote(replicas)

    def ready(st: dict[str, Any]) -> bool:
        a, b = _row_ok(st["rows"], label[fast]), _row_ok(st["rows"], label[slow])
        return bool(a and b and a[7] != "–" and b[7] != "–" and st["ttft"] != "–"
                    and _num(st["requests"]) == _num(a[2]) + _num(b[2]) >= 8
                    and any(r[0] == dead and r[1] != "connecting" for r in st["rows"]))

    stop = threading.Event()
    bg = _traffic([fast.url, slow.url], stop)
    try:
        state, errors = _browse(page, ready)
    finally:
        stop.set()
        bg.join(5)
    assert not state["cardHidden"]
    rows = state["rows"]
    assert [r[0] for r in rows] == [label[fast], label[slow], dead]
    a, b = _row_ok(rows, label[fast]), _row_ok(rows, label[slow])
    assert a and b, rows
    # the sum is the sum of the rows polled at the same moment
    assert _num(state["requests"]) == _num(a[2]) + _num(b[2])
    assert _num(a[2]) >= 3 and _num(b[2]) >= 5
    # latency percentiles cannot be added: the KPI shows the worst replica's
    assert state["ttft"] == b[7] != a[7]
    assert rows[2][1] != "live" and rows[2][2] == "–"  # unreachable replica shown, not summed
    assert state["status"] == "live 2/3" and "warn" in state["statusClass"]
    assert state["meta"].startswith("2 of 3 replicas")
    assert "ftp://nope" in state["note"] and "javascript:alert(1)" in state["note"]
    # the page's own fetch to the dead replica is a network error chromium logs; nothing else
    assert [e for e in errors if "ERR_CONNECTION_REFUSED" not in e] == []


@needs_chromium
def test_replica_list_is_bounded_and_garbage_falls_back_to_this_server(
        make_server: Any) -> None:
    srv = make_server(latency="instant")
    rawhttp.request(srv.url, "POST", "/v1/chat/completions", {**CHAT, "stream": False})
    many = [f"{srv.url}/r{i}" for i in range(20)]  # 20 distinct bases: 16 kept
    page = srv.url + "/llmsim/dashboard?interval=300&replicas=" + urllib.parse.quote(
        ",".join(many))
    state, _ = _browse(page, lambda st: len(st["rows"]) == 16 and all(
        r[1] not in ("connecting", "–") for r in st["rows"]))
    assert len(state["rows"]) == 16
    assert "4 more ignored (at most 16 replicas)" in state["note"]
    assert all(r[1] == "HTTP 404" for r in state["rows"])  # /rN/llmsim/stats: not llmsim stats
    assert state["status"] == "disconnected"

    page = srv.url + "/llmsim/dashboard?interval=300&replicas=" + urllib.parse.quote(
        "ftp://x,,  ," + "h" * 3000)
    state, errors = _browse(page, lambda st: st["status"] == "live" and _num(
        st["requests"]) >= 1)
    assert state["status"] == "live" and _num(state["requests"]) >= 1
    assert state["cardHidden"] and state["rows"] == []
    assert "no usable replica URL: showing this server" in state["note"]
    assert "ftp://x" in state["note"] and "h" * 81 not in state["note"]  # echoed, truncated
    assert errors == []


def test_stats_answer_cross_origin_reads(make_server: Any) -> None:
    """What the browser relies on: every replica's stats (and the reset the button sends)
    are readable from another origin without a preflight."""
    srv = make_server(latency="instant")
    for method, path in (("GET", "/llmsim/stats"), ("POST", "/llmsim/stats/reset")):
        r = rawhttp.request(srv.url, method, path, headers=[("origin", "http://elsewhere:1")])
        assert r.status == 200
        assert r.headers.get("access-control-allow-origin") == "*"
