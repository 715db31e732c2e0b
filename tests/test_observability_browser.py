"""The dashboard in a real headless browser (Debian's /usr/bin/chromium), driven over the
Chrome DevTools Protocol with only the standard library and ``websockets``: the page loads
with no console errors or exceptions and shows non-zero figures after known traffic."""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest

from . import rawhttp

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-quic", "--disable-extensions", "--mute-audio", "--window-size=1400,900"]

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason=f"{CHROMIUM} is absent (apt-get install chromium)")


class CDP:
    """A minimal DevTools client: numbered commands, events collected while waiting."""

    def __init__(self, ws_url: str) -> None:
        from websockets.sync.client import connect

        self.ws = connect(ws_url, max_size=None, open_timeout=20)
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=20))
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def eval(self, expr: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        return r["result"].get("value")

    def errors(self) -> list[str]:
        out = []
        for e in self.events:
            m, p = e["method"], e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append("exception: " + json.dumps(p.get("exceptionDetails"))[:500])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append("console.error: " + json.dumps(p.get("args"))[:500])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                out.append("log: " + p["entry"].get("text", "")[:500])
        return out

    def close(self) -> None:
        self.ws.close()


def _launch(profile: str) -> tuple[subprocess.Popen[str], str]:
    p = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}",
                          "--remote-debugging-port=0", "about:blank"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert p.stderr is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = p.stderr.readline()  # blocks until chromium says where DevTools listens
        if not line:
            break
        m = re.search(r"DevTools listening on (ws://\S+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, m.group(1)
    p.kill()
    raise RuntimeError("chromium did not start its DevTools endpoint")


def _page_ws(browser_ws: str) -> str:
    port = re.search(r":(\d+)/", browser_ws).group(1)  # type: ignore[union-attr]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
        targets = json.loads(r.read())
    return next(t["webSocketDebuggerUrl"] for t in targets if t["type"] == "page")


def browse(url: str, state_js: str, ready: Callable[[dict[str, Any]], bool],
           timeout: float = 30.0) -> tuple[dict[str, Any], list[str]]:
    """Open ``url`` in a fresh headless chromium and evaluate ``state_js`` until
    ``ready(state)`` or the timeout: the last state and the page's console errors."""
    profile = tempfile.mkdtemp(prefix="llmsim-chromium-")
    proc = cdp = None
    state: dict[str, Any] = {}
    try:
        proc, browser_ws = _launch(profile)
        cdp = CDP(_page_ws(browser_ws))
        cdp.call("Runtime.enable")
        cdp.call("Log.enable")
        cdp.call("Page.enable")
        cdp.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = cdp.eval(state_js) or {}
            if state and ready(state):
                break
            time.sleep(0.2)
        return state, cdp.errors()
    finally:
        if cdp is not None:
            cdp.close()
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(profile, ignore_errors=True)


def _num(text: str) -> float:
    m = re.match(r"([\d.]+)([kM]?)", text.strip())
    if not m:
        return 0.0
    return float(m.group(1)) * {"": 1, "k": 1e3, "M": 1e6}[m.group(2)]


def test_dashboard_renders_live_figures_without_console_errors(make_server):
    srv = make_server(latency="realistic", ttft_ms=5, itl_ms=1)
    url = srv.url
    chat = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    for i in range(4):
        rawhttp.request(url, "POST", "/v1/chat/completions", {**chat, "stream": i % 2 == 0})
    rawhttp.request(url, "GET", "/v1/nope")  # one error
    stop = threading.Event()

    def traffic() -> None:  # keep some load on while the page polls
        while not stop.is_set():
            rawhttp.request(url, "POST", "/v1/chat/completions", {**chat, "stream": True})
            stop.wait(0.05)

    bg = threading.Thread(target=traffic, daemon=True)
    bg.start()
    state_js = """(() => ({
        status: document.getElementById('status').textContent,
        requests: document.getElementById('kpi-requests').textContent,
        tokens: document.getElementById('kpi-tokens').textContent,
        ttft: document.getElementById('kpi-ttft-s').textContent,
        errors: document.getElementById('kpi-errors').textContent,
        models: document.getElementById('models').textContent,
        errkinds: document.getElementById('errors').textContent,
        points: Number(document.getElementById('c-rps').dataset.points || 0),
        tpsPoints: Number(document.getElementById('c-tps').dataset.points || 0),
        title: document.title }))()"""
    try:
        state, errors = browse(
            url + "/llmsim/dashboard?interval=300", state_js,
            lambda st: st.get("points", 0) >= 3 and _num(st.get("requests", "0")) > 0)
    finally:
        stop.set()
        bg.join(5)
    assert errors == []
    assert state["title"] == "llmsim dashboard"
    assert state["status"] == "live"
    assert state["points"] >= 3 and state["tpsPoints"] >= 3
    assert _num(state["requests"]) >= 5
    assert _num(state["tokens"]) >= 32
    assert _num(state["errors"]) >= 1
    assert "gpt-4o" in state["models"]
    assert "invalid_request_error" in state["errkinds"]
    assert "all: –" not in state["ttft"]  # TTFT percentiles shown
