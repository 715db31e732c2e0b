"""Hostile JSON Schemas against a real llmsim process: time, status, peak RSS, /health delay.

    python bench/schema_bombs.py [--only NAME,...] [--timeout 60] [--mem-mb 3072]

Each bomb gets a fresh ``python -m llmsim --port 0 --latency instant`` child (address space
capped with RLIMIT_AS so a runaway stops by itself; killed in ``finally``), a warm-up request
(tokenizer loaded), then one request with a client timeout while a thread polls
``GET /health`` every 20 ms. Printed per bomb: request bytes, answer status (or
"timeout"/"died"), seconds, the child's RSS after warm-up and its peak RSS (VmHWM), and the
slowest concurrent /health answer. Loopback only; stops by itself.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

MSG = [{"role": "user", "content": "hi"}]


def _chain(n: int, mk: Callable[[int], Any], last: Any) -> dict[str, Any]:
    defs = {f"d{i}": mk(i) for i in range(n - 1)}
    defs[f"d{n - 1}"] = last
    return {"$defs": defs, "$ref": "#/$defs/d0"}


def _tool(params: dict[str, Any]) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": MSG,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": params}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}}}


def _rf(schema: dict[str, Any]) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": MSG,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": schema}}}


def _resp_text(schema: dict[str, Any]) -> dict[str, Any]:
    return {"model": "gpt-4o", "input": "hi",
            "text": {"format": {"type": "json_schema", "name": "x", "schema": schema}}}


def _resp_tool(params: dict[str, Any]) -> dict[str, Any]:
    return {"model": "gpt-4o", "input": "hi", "tool_choice": "required",
            "tools": [{"type": "function", "name": "f", "parameters": params}]}


REF = "#/$defs/d{}"
BOMBS: dict[str, tuple[str, dict[str, Any]]] = {
    # the issue's 340-byte tool schema: a catastrophic pattern and an enum of near misses
    "pattern_enum": ("/v1/chat/completions", _tool({
        "type": "object", "required": ["s"],
        "properties": {"s": {"type": "string", "pattern": "^(a+)+$",
                             "enum": ["a" * 24 + "!", "a" * 25 + "!", "a" * 26 + "!"]}}})),
    # allOf of two $refs to the next level, 20 levels: 2^20 merges
    "allof_ref_exp": ("/v1/chat/completions", _rf(_chain(
        20, lambda i: {"allOf": [{"$ref": REF.format(i + 1)}, {"$ref": REF.format(i + 1)}]},
        {"type": "integer"}))),
    # nested oneOf whose branches overlap: every level retries and re-validates
    "oneof_exp": ("/v1/chat/completions", _rf(_chain(
        8, lambda i: {"oneOf": [{"type": "array", "minItems": 1, "items": {"$ref": REF.format(i + 1)}},
                                {"type": "array", "minItems": 1,
                                 "items": {"$ref": REF.format(i + 1)}}]},
        {"type": "integer"}))),
    # two required properties referring to the next level, 22 levels: a 2^22-node value
    "props_ref_exp": ("/v1/chat/completions", _tool(_chain(
        22, lambda i: {"type": "object", "required": ["a", "b"],
                       "properties": {"a": {"$ref": REF.format(i + 1)},
                                      "b": {"$ref": REF.format(i + 1)}}},
        {"type": "integer"}))),
    "minlength_1e9": ("/v1/chat/completions", _rf({"type": "string", "minLength": 10**9})),
    "minitems_1e9": ("/v1/chat/completions", _tool({
        "type": "object", "required": ["a"],
        "properties": {"a": {"type": "array", "minItems": 10**9}}})),
    "repeat_1e9": ("/v1/chat/completions", _tool({
        "type": "object", "required": ["s"],
        "properties": {"s": {"type": "string", "pattern": "^a{1000000000}$"}}})),
    "resp_text_minlength_1e9": ("/v1/responses", _resp_text({"type": "string",
                                                             "minLength": 10**9})),
    "resp_tool_pattern_enum": ("/v1/responses", _resp_tool({
        "type": "object", "required": ["s"],
        "properties": {"s": {"type": "string", "pattern": "^(a+)+$",
                             "enum": ["a" * 24 + "!", "a" * 25 + "!"]}}})),
    "type_5": ("/v1/chat/completions", _tool({"type": 5})),
}


def _limit(mem_mb: int) -> Callable[[], None]:
    def pre() -> None:
        os.setsid()
        cap = mem_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    return pre


def _peak_rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def run_one(name: str, path: str, body: dict[str, Any], timeout: float,
            mem_mb: int) -> dict[str, Any]:
    proc = subprocess.Popen([sys.executable, "-m", "llmsim", "--port", "0", "--latency", "instant",
                             "--seed", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, preexec_fn=_limit(mem_mb))
    try:
        assert proc.stdout is not None
        port = 0
        deadline = time.monotonic() + 20
        while not port and time.monotonic() < deadline:
            line = proc.stdout.readline().decode(errors="replace")
            m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
            if m:
                port = int(m.group(1))
        if not port:
            raise RuntimeError("server did not start")
        threading.Thread(target=lambda: proc.stdout.read(), daemon=True).start()  # type: ignore[union-attr]
        # warm up: the first request loads the tokenizer (~0.3 s, ~110 MB), not the bomb's cost
        warm = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        warm.request("POST", "/v1/chat/completions", json.dumps(
            {"model": "gpt-4o", "messages": MSG}).encode(), {"content-type": "application/json"})
        warm.getresponse().read()
        warm.close()
        idle_rss = _peak_rss_mb(proc.pid)
        worst_health = 0.0
        inflight: list[float] = []  # start of the /health request in flight, if any
        stop = threading.Event()

        def health() -> None:
            nonlocal worst_health
            while not stop.is_set():
                t0 = time.perf_counter()
                inflight[:] = [t0]
                try:
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout + 5)
                    c.request("GET", "/health")
                    c.getresponse().read()
                    c.close()
                except OSError:
                    return
                worst_health = max(worst_health, time.perf_counter() - t0)
                inflight.clear()
                stop.wait(0.02)

        data = json.dumps(body).encode()
        ht = threading.Thread(target=health, daemon=True)
        ht.start()
        t0 = time.perf_counter()
        status: Any
        err: Any = None
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
            c.request("POST", path, data, {"content-type": "application/json"})
            r = c.getresponse()
            status = r.status
            answer = r.read()
            if status >= 400:
                err = json.loads(answer).get("error", {})
        except TimeoutError:
            status = "timeout"
        except OSError as exc:
            status = f"died ({type(exc).__name__})"
        elapsed = time.perf_counter() - t0
        stop.set()
        if inflight:  # a /health still unanswered counts as slow as it has been so far
            worst_health = max(worst_health, time.perf_counter() - inflight[0])
        return {"name": name, "bytes": len(data), "status": status, "seconds": round(elapsed, 3),
                "idle_rss_mb": idle_rss, "peak_rss_mb": _peak_rss_mb(proc.pid),
                "worst_health_s": round(worst_health, 3),
                "code": err and err.get("code"), "param": err and err.get("param")}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated bomb names")
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--mem-mb", type=int, default=3072)
    args = ap.parse_args()
    names = [n for n in args.only.split(",") if n] or list(BOMBS)
    for name in names:
        path, body = BOMBS[name]
        print(json.dumps(run_one(name, path, body, args.timeout, args.mem_mb)), flush=True)


if __name__ == "__main__":
    main()
