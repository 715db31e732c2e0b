"""Hostile requests vs one llmsim process: how long each takes, what it answers, how late a
concurrent /health gets, and the server's peak RSS (issue 10, item 2). Loopback only; every
run stops by itself (the server runs under ``ulimit -v 3 GB``, each request times out).

    python bench/hostile_work.py [--only min_tokens,prompt_x,...] [--tokenizer estimate]
                                 [--timeout 60]

Each case starts a fresh ``python -m llmsim --port 0`` (so peak RSS is the case's), warms the
tokenizer, builds any state the case needs (a chain, stored responses), then sends the hostile
request while a thread sends GET /health back to back on a keep-alive connection.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import orjson

MSG = [{"role": "user", "content": "hi"}]
TEN_MB = 10_000_000


class Server:
    def __init__(self, tokenizer: str) -> None:
        env = dict(os.environ, LLMSIM_TOKENIZER=tokenizer)
        cmd = (f"ulimit -v 3000000; exec {sys.executable} -m llmsim --port 0 "
               "--latency instant --seed 1")
        self.proc = subprocess.Popen(["bash", "-c", cmd], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, env=env)
        assert self.proc.stdout is not None
        m = re.search(r"http://127\.0\.0\.1:\d+", self.proc.stdout.readline())
        assert m, "no URL in the banner"
        self.url = m.group(0)
        deadline = time.monotonic() + 20
        while self.post("/v1/chat/completions", {"model": "gpt-4o", "messages": MSG})[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)

    def post(self, path: str, body: Any, timeout: float = 60) -> tuple[int | None, bytes]:
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        req = urllib.request.Request(self.url + path, data=data,
                                     headers={"content-type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
        except Exception as e:  # timeout, reset: reported, not raised
            return None, repr(e).encode()

    def peak_rss_mb(self) -> float:
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM"):
                        return int(line.split()[1]) / 1024
        except OSError:
            pass
        return float("nan")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


def _chain(s: Server) -> tuple[str, Any]:
    prev = None
    for _ in range(51):
        body: dict[str, Any] = {"model": "gpt-4o", "input": "word " * 2500,
                                "max_output_tokens": 16}
        if prev:
            body["previous_response_id"] = prev
        st, out = s.post("/v1/responses", body)
        if st != 200:
            break
        prev = orjson.loads(out)["id"]
    return "/v1/responses", {"model": "gpt-4o", "input": "word " * 120_000,
                             "previous_response_id": prev, "truncation": "auto",
                             "max_output_tokens": 16}


def _refs(n: int) -> Callable[[Server], tuple[str, Any]]:
    def build(s: Server) -> tuple[str, Any]:
        last = b""
        for _ in range(1000):
            last = s.post("/v1/responses", {"model": "gpt-4o", "input": "hi",
                                            "max_output_tokens": 16})[1]
        ref = orjson.loads(last)["output"][-1]["id"]
        return "/v1/responses", {"model": "gpt-4o", "max_output_tokens": 16,
                                 "input": [{"type": "item_reference", "id": ref}] * n}
    return build


def _prompt(text: str, api: str = "chat", model: str = "gpt-4o"
            ) -> Callable[[Server], tuple[str, Any]]:
    def build(s: Server) -> tuple[str, Any]:
        if api == "chat":
            return "/v1/chat/completions", {"model": model,
                                            "messages": [{"role": "user", "content": text}]}
        return "/v1/responses", {"model": model, "input": text}
    return build


PROSE = ("lorem ipsum dolor sit amet " * (TEN_MB // 27 + 1))[:TEN_MB]
CASES: dict[str, Callable[[Server], tuple[str, Any]]] = {
    "min_tokens": lambda s: ("/v1/chat/completions", {"model": "gpt-4o", "messages": MSG,
                                                      "min_tokens": 1_000_000_000}),
    "prompt_prose": _prompt(PROSE),
    "prompt_x": _prompt("x" * TEN_MB),
    "prompt_spaces": _prompt(" " * TEN_MB),
    "responses_prose": _prompt(PROSE, "responses"),
    "responses_x_gpt41": _prompt("x" * TEN_MB, "responses", "gpt-4.1"),
    "truncation_auto": _chain,
    "refs_2048": _refs(2048),
    "refs_20000": _refs(20_000),
}


def run(name: str, tokenizer: str, timeout: float) -> str:
    s = Server(tokenizer)
    try:
        path, body = CASES[name](s)
        raw = orjson.dumps(body)
        lat: list[float] = []
        stop = threading.Event()

        def probe() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                try:
                    with urllib.request.urlopen(s.url + "/health", timeout=timeout) as r:
                        r.read()
                except Exception:
                    pass
                lat.append(time.perf_counter() - t0)
                time.sleep(0.005)

        th = threading.Thread(target=probe, daemon=True)
        th.start()
        time.sleep(0.1)
        t0 = time.perf_counter()
        status, out = s.post(path, raw, timeout=timeout)
        took = time.perf_counter() - t0
        time.sleep(0.2)
        stop.set()
        th.join(timeout + 5)
        try:
            e = orjson.loads(out).get("error")
            what = f"{e['code']} param={e['param']}" if e else "ok"
        except Exception:
            what = out[:80].decode(errors="replace")
        return (f"| {name} | {len(raw) / 1e6:.2f} MB | {took:.3f} s | {status} {what} | "
                f"{max(lat) * 1000:.0f} ms | {s.peak_rss_mb():.0f} MB |")
    finally:
        s.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default=",".join(CASES))
    ap.add_argument("--tokenizer", default="auto", choices=("auto", "estimate"))
    ap.add_argument("--timeout", type=float, default=60.0)
    a = ap.parse_args()
    print("| case | body | time | answer | max /health | peak RSS |")
    print("|---|---|---|---|---|---|")
    for name in a.only.split(","):
        print(run(name, a.tokenizer, a.timeout), flush=True)


if __name__ == "__main__":
    main()
