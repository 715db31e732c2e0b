"""Stored responses with and without shared state on Redis (issue 16).

Two set-ups, each measured the same way for ``--seconds`` (default 6): ``N`` client threads,
each with one keep-alive connection per server, loop over create (``store: true``, non-streaming,
``--latency instant``) then retrieve of that id. Set-up A: one llmsim without ``--state``
(create and retrieve on the same server). Set-up B: two llmsim replicas with ``--state
redis://`` on one private ``redis-server`` (create on one, retrieve on the *other*, so every
retrieve is served from Redis). Loopback only, bounded in time; servers and Redis are child
processes, killed on exit. Prints a Markdown table and, with ``--results``, appends it to
``bench/RESULTS.md``.

    python bench/redis_state.py [--seconds 6] [--clients 4] [--results]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import threading
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BODY = json.dumps({"model": "gpt-4o", "input": "Write one sentence about the sea.",
                   "store": True, "max_output_tokens": 32}).encode()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_up(port: int, path: bytes = b"", timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                if not path:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
                else:
                    s.sendall(b"GET " + path + b" HTTP/1.1\r\nhost: x\r\n\r\n")
                    if b" 200 " in s.recv(64):
                        return
        except OSError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"port {port} did not come up")


def start_llmsim(state: str | None) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    cmd = [sys.executable, "-m", "llmsim", "--port", str(port), "--latency", "instant",
           "--quiet", "--seed", "1"]
    if state:
        cmd += ["--state", state]
    env = dict(os.environ, PYTHONPATH=ROOT)
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_up(port, b"/health")
    return p, port


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of these processes so far (Linux /proc)."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1000 if xs else float("nan")


def drive(create_ports: list[int], get_ports: list[int], clients: int,
          seconds: float, pids: list[int] | None = None) -> dict[str, Any]:
    creates: list[float] = []
    gets: list[float] = []
    errors = [0]
    lock = threading.Lock()
    stop = time.monotonic() + seconds

    def worker(i: int) -> None:
        cp = create_ports[i % len(create_ports)]
        gp = get_ports[i % len(get_ports)]
        c1 = http.client.HTTPConnection("127.0.0.1", cp, timeout=10)
        c2 = c1 if gp == cp else http.client.HTTPConnection("127.0.0.1", gp, timeout=10)
        mine_c: list[float] = []
        mine_g: list[float] = []
        bad = 0
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            c1.request("POST", "/v1/responses", BODY, {"content-type": "application/json"})
            r = c1.getresponse()
            data = r.read()
            t1 = time.perf_counter()
            if r.status != 200:
                bad += 1
                continue
            rid = json.loads(data)["id"]
            c2.request("GET", "/v1/responses/" + rid)
            r = c2.getresponse()
            r.read()
            t2 = time.perf_counter()
            if r.status != 200:
                bad += 1
                continue
            mine_c.append(t1 - t0)
            mine_g.append(t2 - t1)
        with lock:
            creates.extend(mine_c)
            gets.extend(mine_g)
            errors[0] += bad

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    t0 = time.monotonic()
    cpu0 = cpu_s(pids or [])
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.monotonic() - t0
    cpu = cpu_s(pids or []) - cpu0
    return {"pairs": len(creates), "rate": len(creates) / took,
            "cpu_ms": 1000 * cpu / max(1, len(creates)),
            "create": (pct(creates, 0.5), pct(creates, 0.99)),
            "get": (pct(gets, 0.5), pct(gets, 0.99)), "errors": errors[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--results", action="store_true", help="append to bench/RESULTS.md")
    a = ap.parse_args()
    if not 1 <= a.clients <= 64 or not 0 < a.seconds <= 60:
        ap.error("--clients 1-64, --seconds up to 60")
    redis_bin = shutil.which("redis-server")
    if redis_bin is None:
        sys.exit("redis-server is not installed")
    procs: list[subprocess.Popen[bytes]] = []
    rows = []
    try:
        one, port = start_llmsim(None)
        procs.append(one)
        drive([port], [port], a.clients, 1.0)  # warm-up (tokenizer, first requests)
        rows.append(("1 server, in memory (no --state)",
                     drive([port], [port], a.clients, a.seconds, [one.pid])))
        one.kill()
        rport = free_port()
        red = subprocess.Popen(
            [redis_bin, "--port", str(rport), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(red)
        wait_up(rport)
        url = f"redis://127.0.0.1:{rport}/0"
        solo, sport = start_llmsim(url)
        procs.append(solo)
        drive([sport], [sport], a.clients, 1.0)
        rows.append(("1 server, --state redis",
                     drive([sport], [sport], a.clients, a.seconds, [solo.pid, red.pid])))
        solo.kill()
        (p1, port1), (p2, port2) = start_llmsim(url), start_llmsim(url)
        procs += [p1, p2]
        drive([port1, port2], [port2, port1], a.clients, 1.0)
        rows.append(("2 replicas, --state redis (retrieve on the other)",
                     drive([port1, port2], [port2, port1], a.clients, a.seconds,
                           [p1.pid, p2.pid, red.pid])))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
    load = os.getloadavg()
    head = (f"## Stored responses: in memory vs shared on Redis (issue 16)\n\n"
            f"- date: {time.strftime('%Y-%m-%d %H:%M')} UTC, python {platform.python_version()}, "
            f"{os.cpu_count()} cores, load average at start {load[0]:.2f}\n"
            f"- command: `python bench/redis_state.py --seconds {a.seconds:g} --clients "
            f"{a.clients}` — {a.clients} client threads (Python, http.client keep-alive) loop "
            "create(store=true, --latency instant) → retrieve; the servers, Redis and the "
            "client share the cores\n\n")
    table = ["| set-up | create+retrieve pairs/s | server CPU ms per pair (llmsim + Redis) "
             "| create ms p50/p99 | retrieve ms p50/p99 | errors |",
             "|---|---|---|---|---|---|"]
    for name, r in rows:
        table.append(f"| {name} | {r['rate']:.0f} | {r['cpu_ms']:.2f} | {r['create'][0]:.2f} / "
                     f"{r['create'][1]:.2f} | {r['get'][0]:.2f} / {r['get'][1]:.2f} | "
                     f"{r['errors']} |")
    text = head + "\n".join(table) + "\n"
    print(text)
    if a.results:
        with open(os.path.join(ROOT, "bench", "RESULTS.md"), "a") as fh:
            fh.write("\n" + text)


if __name__ == "__main__":
    main()
