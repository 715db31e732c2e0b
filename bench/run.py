"""llmsim side-by-side benchmark: one command, loopback only, bounded in time.

    python bench/run.py [--quick] [--peers] [--only rps,stream,ws,mem,startup] [--no-write]
                        [--loops uvloop,asyncio] [--rounds 3] [--no-pin]

Starts every server as a child process (killed in ``finally``), drives it with the epoll C
load generator in ``bench/loadgen.c`` (compiled with gcc on first use into ``bench/.build``),
and prints a table; ``bench/RESULTS.md`` gets the figures with the machine details.

Workloads (see README "Performance"):
  rps      non-streaming chat, 64 keep-alive connections, ``--latency instant``: llmsim (1 and
           2 workers) vs the bare asyncio+h11 server in ``bench/baseline_h11.py`` (and peers).
  stream   streaming chat and Responses at 100/500/1000/2000 concurrent streams, fixed TTFT and
           10 ms inter-token gap: delivered events/s, server CPU, TTFT error, gap error and
           lateness (actual receive time minus scheduled) p50/p99/max, share on time.
  ws       the same Responses stream over WebSocket (if llmsim serves it).
  Streaming runs against the bare paced-SSE anchor (``bench/baseline_h11.py``) on the same
  event loop, once per ``--loops`` entry: its chat stream for every workload (the issue-15
  targets), and for Responses and Responses over WebSocket also its same-wire stream (the
  same Responses events, sizes and writes, paced bare: the second ratio); each run is repeated ``--rounds`` times (medians).
  Single-worker streaming servers run on CPU 0 and the load generator on CPU 1 (``--no-pin``:
  not), server CPU is the threads' schedstat run time (ns), and each round drives the anchor
  and every llmsim server in turn.
  mem      RSS growth per idle keep-alive connection and per active stream.
  startup  process start → first served request.

``--peers`` installs ``llmock`` (PyPI) into ``bench/.peers/venv`` and ``@copilotkit/aimock``
(npm) into ``bench/.peers/node`` (once; later runs reuse them), runs the same rps and chat
streaming workloads against them and prints ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BUILD = HERE / ".build"
PEERS = HERE / ".peers"
PY = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
TTFT_MS = 100.0
ITL_MS = 10.0
STREAM_TOKENS = 100
# a stream server's fixed timing (llmsim's and the anchor's flags alike)
STREAM_TIMING = ["--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS)]
CHAT_MARKER = '"delta":{"content":'
RESP_MARKER = "response.output_text.delta"
WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
         "sigma tau upsilon").split()


# ------------------------------------------------------------------------------------------
# processes
# ------------------------------------------------------------------------------------------

def loadgen() -> str:
    """Compile the C load generator if it is missing or older than its source."""
    src, exe = HERE / "loadgen.c", BUILD / "loadgen"
    if not exe.exists() or exe.stat().st_mtime < src.stat().st_mtime:
        BUILD.mkdir(exist_ok=True)
        subprocess.run(["gcc", "-O2", "-o", str(exe), str(src), "-lm"], check=True, timeout=120)
    return str(exe)


def free_port() -> int:
    """Only for peers that cannot bind port 0 and report it (llmsim and the baseline do)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree_pids(pid: int) -> list[int]:
    """``pid`` and all its descendants (workers, node helpers)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(x) for x in fh.read().split())
        except OSError:
            pass
    return out


SCHEDSTAT = os.path.exists("/proc/self/schedstat")


def cpu_seconds(pid: int) -> float:
    """CPU time of a process tree: the scheduler's nanosecond run time of every thread
    (/proc/<pid>/task/<tid>/schedstat), or utime + stime in clock ticks where the kernel has
    no schedstat. A 100-stream run uses ~10% of a core: over 3 s that is 30 ticks, so ticks
    alone would quantise a per-token ratio by several percent."""
    total = 0
    for p in tree_pids(pid):
        try:
            if SCHEDSTAT:
                for tid in os.listdir(f"/proc/{p}/task"):
                    with open(f"/proc/{p}/task/{tid}/schedstat") as fh:
                        total += int(fh.read().split()[0])
            else:
                with open(f"/proc/{p}/stat") as fh:
                    f = fh.read().rsplit(")", 1)[1].split()
                total += int(f[11]) + int(f[12])
        except OSError:  # a thread or process that ended meanwhile
            pass
    return total / 1e9 if SCHEDSTAT else total / CLK_TCK


def rss_bytes(pid: int) -> int:
    """Resident set size of a process tree, from /proc/<pid>/statm."""
    total = 0
    for p in tree_pids(pid):
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * PAGE
        except OSError:
            pass
    return total


class Child:
    """A server subprocess; ``port`` is read from its start-up line (or given)."""

    def __init__(self, name: str, cmd: list[str], *, port: int | None = None,
                 url_re: str = r"http://127\.0\.0\.1:(\d+)", timeout: float = 60,
                 cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.t0 = time.perf_counter()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, cwd=cwd, env=env,
                                     start_new_session=True)
        self.lines: list[str] = []
        found = threading.Event()
        self.port = port

        def reader() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").rstrip()
                if len(self.lines) < 200:
                    self.lines.append(line)
                if self.port is None:
                    m = re.search(url_re, line)
                    if m:
                        self.port = int(m.group(1))
                        found.set()
            found.set()

        threading.Thread(target=reader, daemon=True).start()
        deadline = time.monotonic() + timeout
        if port is None:
            found.wait(timeout)
        while self.port is None or not self._connectable():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{name} did not start: {' | '.join(self.lines[-8:])}")
            time.sleep(0.05)
        self.ready_s = time.perf_counter() - self.t0

    def _connectable(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):  # type: ignore[arg-type]
                return True
        except OSError:
            return False

    @property
    def pid(self) -> int:
        return self.proc.pid

    client_cpus: set[int] | None = None  # where the load generator runs against this server

    def pin(self, server: set[int], client: set[int]) -> Child:
        """Keep this server's threads on ``server`` and its load generator on ``client``
        (the default; ``--no-pin``: not). Unpinned, the one-thread load generator and the
        server share both cores: each write wakes the client, which often preempts the
        server on its own core (0.3–0.45 involuntary switches per event at 100 streams), and
        the costlier server is preempted more (it has used more of its share), so a CPU ratio
        comes out wider than the work it measures, and varies with placement from run to
        run."""
        for p in tree_pids(self.pid):
            try:
                for tid in os.listdir(f"/proc/{p}/task"):
                    os.sched_setaffinity(int(tid), server)
            except OSError:
                pass
        self.client_cpus = client
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(5)
            except (subprocess.TimeoutExpired, ProcessLookupError):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait(5)

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def llmsim(*args: str, name: str = "llmsim", warm: bool = True,
           tree: Path | None = None) -> Child:
    """Start llmsim (this checkout's, or the source tree ``tree``'s); ``warm``: wait for one
    served request (tokenizer loaded) before measuring. Fixed-length answers
    (``--max-tokens-mode exact``, what a benchmark harness asks for with ``ignore_eos``):
    every server in a comparison sends the same number of tokens."""
    env = None if tree is None else {**os.environ, "PYTHONPATH": str(tree)}
    c = Child(name, [PY, "-m", "llmsim", "--port", "0", "--max-tokens-mode", "exact", *args],
              cwd=tree or ROOT, env=env)
    if warm:
        body = {**CHAT_BODY, "max_tokens": 1}
        try:
            request_head(c.port, http_request("/v1/chat/completions", body),  # type: ignore[arg-type]
                         timeout=60)
        except BaseException:
            c.stop()
            raise
    return c


def request_head(port: int, req: bytes, timeout: float) -> bytes:
    """Send one request and read until the response head has arrived."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(req)
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
    return buf


def http_request(path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body, separators=(",", ":")).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer sk-bench\r\nContent-Length: {len(data)}\r\n\r\n").encode() + data


def ws_upgrade(path: str) -> bytes:
    return (f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
            "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            "Sec-WebSocket-Version: 13\r\nAuthorization: Bearer sk-bench\r\n\r\n").encode()


def write_tmp(data: bytes) -> str:
    fd, path = tempfile.mkstemp(prefix="llmsim-bench-", dir=BUILD)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


def drive(server: Child, mode: str, args: list[str], timeout: float,
          stdin: Any = None) -> dict[str, Any]:
    """Run the load generator against ``server``; server CPU is measured around it."""
    cpu0, t0 = cpu_seconds(server.pid), time.perf_counter()
    cpus = server.client_cpus
    out = subprocess.run([loadgen(), mode, "-p", str(server.port), *args], capture_output=True,
                         timeout=timeout, text=True,
                         preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus))
    wall = time.perf_counter() - t0
    res = json.loads(out.stdout)
    res["server_cpu_s"] = cpu_seconds(server.pid) - cpu0
    res["server_cpu_pct"] = 100 * res["server_cpu_s"] / wall
    res["wall_s"] = wall
    return res


CHAT_BODY = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}],
             "max_tokens": 16}


def rps(server: Child, seconds: float, body: dict[str, Any] | None = None,
        path: str = "/v1/chat/completions") -> dict[str, Any]:
    req = write_tmp(http_request(path, body or CHAT_BODY))
    # a warm-up so import-on-first-use, caches and a server's start-up work (llmsim loads its
    # tokenizer files in a thread and then settles, see Server.settle) are not measured
    drive(server, "rps", ["-c", "64", "-d", "1.5", "-f", req], 30)
    r = drive(server, "rps", ["-c", "64", "-d", str(seconds), "-f", req], seconds + 60)
    r["rps"] = r["completed"] / r["elapsed_s"]
    r["rps_per_cpu_s"] = r["completed"] / max(r["server_cpu_s"], 1e-9)
    return r


def least_tokens(kind: str) -> int:
    """The fewest tokens a stream of ``kind`` asks for (the Responses API's least
    ``max_output_tokens`` is 16)."""
    return 16 if kind == "responses" else 1


def stream_args(n: int, seconds: float, kind: str = "chat", ws: bool = False,
                tokens: int = STREAM_TOKENS, ramp: float | None = None) -> list[str]:
    """The load generator's arguments for ``n`` streams of ``kind`` (chat or responses, over
    WebSocket with ``ws``) for ``seconds``: the stream workload of this benchmark, its streams
    ``tokens`` long, their first requests sent over ``ramp`` seconds (None: this benchmark's
    ramp for ``n``)."""
    extra: list[str] = []
    if kind == "chat":
        body: dict[str, Any] = {"model": "gpt-4o-mini", "stream": True,
                                "messages": [{"role": "user", "content": "Hi"}],
                                "max_tokens": tokens}
        req, marker = http_request("/v1/chat/completions", body), CHAT_MARKER
    else:
        body = {"model": "gpt-4o-mini", "input": "Hi", "max_output_tokens": tokens,
                "stream": True}
        req, marker = http_request("/v1/responses", body), RESP_MARKER
    if ws:
        body.pop("stream", None)
        frame = write_tmp(json.dumps({"type": "response.create", **body}).encode())
        req = ws_upgrade("/v1/responses")
        # max_output_tokens is reached exactly (as the stream benchmark asks), so the real
        # API's terminal event is response.incomplete, not response.completed
        extra = ["-w", frame, "-e", '"type":"response.incomplete"']
    if ramp is None:
        ramp = min(1.0, max(0.2, n / 2000))
    return ["-c", str(n), "-d", str(seconds), "-f", write_tmp(req), "-t", str(TTFT_MS),
            "-i", str(ITL_MS), "-m", marker, "-r", str(ramp), *extra]


def stream(server: Child, n: int, seconds: float, kind: str = "chat",
           ws: bool = False) -> dict[str, Any]:
    r = drive(server, "stream", stream_args(n, seconds, kind, ws), seconds + 90)
    r["events_per_s"] = r["events"] / r["elapsed_s"]
    r["on_time_pct"] = 100 * r["tokens_on_time_5ms"] / max(r["tokens"], 1)
    r["on_time_2ms_pct"] = 100 * r["tokens_on_time_2ms"] / max(r["tokens"], 1)
    return r


def median_result(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-metric medians of several rounds of one run (percentile dicts field by field)."""
    def med(xs: list[Any]) -> Any:
        xs = sorted(xs)
        return xs[len(xs) // 2]

    out: dict[str, Any] = {}
    for k, v in results[0].items():
        vals = [r.get(k) for r in results]
        if isinstance(v, (int, float)) and all(isinstance(x, (int, float)) for x in vals):
            out[k] = med(vals)
        elif isinstance(v, dict) and all(isinstance(x, dict) for x in vals):
            out[k] = {f: med([x[f] for x in vals])  # type: ignore[index]
                      if isinstance(fv, (int, float)) else fv
                      for f, fv in v.items()}
        else:
            out[k] = v
    return out


def memory(server: Child, n: int, req: bytes, streaming: bool) -> dict[str, Any]:
    """RSS growth of the server while ``n`` connections are idle (or streaming)."""
    path = write_tmp(req)
    # warm-up: one round of the same work so first-use allocations are not counted
    if not streaming:
        drive(server, "rps", ["-c", "8", "-d", "0.3", "-f", path], 30)
    time.sleep(0.3)
    before = rss_bytes(server.pid)
    args = [loadgen(), "hold", "-p", str(server.port), "-c", str(n), "-f", path]
    if streaming:
        args += ["-s", "-m", "data:"]
    p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        assert p.stderr is not None
        line = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = p.stderr.readline()
            if line.startswith("READY") or not line:
                break
        time.sleep(0.5)
        after = rss_bytes(server.pid)
    finally:
        try:
            assert p.stdin is not None
            p.stdin.close()
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
    parts = line.split()
    ok = int(parts[1]) if len(parts) > 1 else 0
    return {"n": n, "ready": ok, "rss_before_mib": before / 2**20, "rss_after_mib": after / 2**20,
            "kib_per": (after - before) / 1024 / max(ok, 1)}


def startup(runs: int = 3) -> dict[str, Any]:
    """Process start → a served /v1/chat/completions response (median of ``runs``)."""
    times = []
    req = http_request("/v1/chat/completions", CHAT_BODY)
    for _ in range(runs):
        t0 = time.perf_counter()
        c = llmsim("--latency", "instant", warm=False)
        try:
            request_head(c.port, req, timeout=10)  # type: ignore[arg-type]
            times.append(time.perf_counter() - t0)
        finally:
            c.stop()
    times.sort()
    return {"median_s": times[len(times) // 2], "all_s": times}


# ------------------------------------------------------------------------------------------
# peers
# ------------------------------------------------------------------------------------------

def install_peers() -> dict[str, list[str]]:
    """Install llmock (PyPI) and @copilotkit/aimock (npm) under bench/.peers (once)."""
    PEERS.mkdir(exist_ok=True)
    venv = PEERS / "venv"
    if not (venv / "bin" / "llmock").exists():
        subprocess.run([PY, "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "llmock"], check=True,
                       timeout=600)
    node = PEERS / "node"
    aimock = node / "node_modules" / ".bin" / "llmock"
    if not aimock.exists() and shutil.which("npm"):
        node.mkdir(exist_ok=True)
        if not (node / "package.json").exists():
            (node / "package.json").write_text('{"private": true}\n')
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "@copilotkit/aimock"],
                       cwd=node, check=True, timeout=600, capture_output=True)
    return {"llmock": [str(venv / "bin" / "llmock")],
            "aimock": [str(aimock)] if aimock.exists() else []}


def peer_text(n: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(n))


def start_llmock(exe: list[str], ttft_ms: float = 0, itl_ms: float = 0) -> Child:
    port = free_port()
    cmd = [*exe, "serve", "--port", str(port), "--log-level", "warning",
           "--latency-ms", str(int(ttft_ms))]
    if itl_ms:
        cmd += ["--stream-chunk-delay-ms", str(int(itl_ms))]
    return Child("llmock", cmd, port=port)


def start_aimock(exe: list[str], ttft_ms: float = 0, itl_ms: float = 0) -> Child:
    port = free_port()
    fx: dict[str, Any] = {"match": {}, "response": {"content": peer_text(STREAM_TOKENS)}}
    if itl_ms:
        # one word a chunk ("alpha " is 6 characters), first chunk after ttft, 1000/itl per s
        fx["chunkSize"] = 6
        fx["streamingProfile"] = {"ttft": ttft_ms, "tps": 1000 / itl_ms, "jitter": 0}
    path = write_tmp(json.dumps({"fixtures": [fx]}).encode()) + ".json"
    os.rename(path[:-5], path)
    return Child("aimock", [*exe, "-p", str(port), "-f", path, "--log-level", "silent",
                            "--journal-max", "1"], port=port)


# ------------------------------------------------------------------------------------------
# report
# ------------------------------------------------------------------------------------------

def machine() -> dict[str, str]:
    cpu = "?"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import uvloop  # noqa: F401

        loop = "uvloop " + __import__("uvloop").__version__
    except ImportError:
        loop = "asyncio"
    build = subprocess.run([PY, "-m", "llmsim", "--version"], capture_output=True, text=True,
                           cwd=ROOT, timeout=60).stdout.strip()
    return {"date": datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), "cpu": cpu,
            "cores": str(os.cpu_count()), "python": platform.python_version(),
            "kernel": platform.release(), "loop available": loop, "llmsim": build or "?",
            "load average at start": " ".join(f"{x:.2f}" for x in os.getloadavg())}


def fmt_pcts(d: dict[str, Any] | None) -> str:
    if not d:
        return "-"
    return f"{d['p50']:.2f} / {d['p99']:.2f} / {d['max']:.1f}"


class Report:
    def __init__(self) -> None:
        self.sections: list[str] = []

    def table(self, title: str, head: list[str], rows: list[list[str]]) -> None:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=False)]
        lines = [f"\n## {title}\n", "| " + " | ".join(h.ljust(w) for h, w in
                                                   zip(head, widths, strict=True)) + " |",
                 "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
        for r in rows:
            lines.append("| " + " | ".join(str(x).ljust(w) for x, w in
                                           zip(r, widths, strict=True)) + " |")
        text = "\n".join(lines)
        print(text, flush=True)
        self.sections.append(text)

    def note(self, text: str) -> None:
        print(text, flush=True)
        self.sections.append(text)


ANALYSIS_MARK = "## Targets"


def has_module(name: str) -> bool:
    base = ROOT / "llmsim"
    return any(p.exists() for p in (base / f"{name}.py", base / "api" / f"{name}.py",
                                     base / "api" / name / "__init__.py",
                                     base / "transport" / f"{name}.py"))


def _seconds(text: str) -> float:
    """``--stream-seconds``: a number of seconds from 1 to 120."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 1.0 <= v <= 120.0:
        raise argparse.ArgumentTypeError(f"{text} is outside 1-120 seconds")
    return v


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="short runs, 100/500/1000 streams")
    ap.add_argument("--peers", action="store_true", help="also install and run llmock, aimock")
    ap.add_argument("--only", default="rps,stream,ws,mem,startup",
                    help="comma-separated subset of workloads")
    ap.add_argument("--streams", default=None, help="stream counts, e.g. 100,1000,2000")
    ap.add_argument("--workers", default="1,2", help="llmsim worker counts for rps/stream")
    ap.add_argument("--no-write", action="store_true", help="do not rewrite bench/RESULTS.md")
    ap.add_argument("--loops", default="uvloop,asyncio",
                    help="event loops for the streaming runs (anchor and llmsim on each)")
    ap.add_argument("--no-pin", dest="pin", action="store_false",
                    help="do not pin single-worker streaming runs (by default, with two or more "
                         "CPUs, the server, anchor or llmsim, runs on CPU 0 and the load "
                         "generator on CPU 1, so the client does not preempt the server it "
                         "measures; see Child.pin)")
    ap.add_argument("--stream-seconds", type=_seconds, default=None, metavar="S",
                    help="length of each streaming round, 1-120 s (default 6, --quick 3); "
                         "e.g. --quick --stream-seconds 6: the quick stream counts, longer "
                         "rounds")
    ap.add_argument("--llmsim-args", default="", metavar="ARGS",
                    help="extra options for the streaming llmsim servers, e.g. "
                         "\"--engine llama-3.1-8b-h100\" (compare a run with and one without)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds of each streaming run; the table shows per-metric medians "
                         "(default 3, --quick 1)")
    a = ap.parse_args(argv)
    loops = [x for x in a.loops.split(",")
             if x == "asyncio" or (x == "uvloop" and importlib.util.find_spec("uvloop"))]
    n_rounds = max(1, a.rounds if a.rounds is not None else (1 if a.quick else 3))
    rounds_note = f", median of {n_rounds} rounds" if n_rounds > 1 else ""

    # SIGTERM (e.g. from `timeout`) unwinds through the finally blocks that stop the servers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    only = set(a.only.split(","))
    pinned = a.pin and len(os.sched_getaffinity(0)) >= 2
    secs = 3.0 if a.quick else 8.0
    sdur = a.stream_seconds or (3.0 if a.quick else 6.0)
    counts = [int(x) for x in (a.streams or ("100,500,1000" if a.quick else "100,500,1000,2000"))
              .split(",")]
    workers = [int(x) for x in a.workers.split(",")]
    multi = "--workers" in subprocess.run([PY, "-m", "llmsim", "--help"], capture_output=True,
                                          text=True, cwd=ROOT, timeout=60).stdout
    if not multi:
        workers = [1]
    loadgen()
    rep = Report()
    info = machine()
    rep.note("# llmsim benchmark results\n\n" + "\n".join(f"- {k}: {v}" for k, v in info.items())
             + f"\n- command: `python bench/run.py {' '.join(sys.argv[1:] if argv is None else argv)}`"
             + "\n- shared 2-core box: other engineers' test runs may overlap; the load generator"
             " (C, epoll, one thread) shares the cores with the server"
             + (" (single-worker streaming runs pinned: server CPU 0, load generator CPU 1)"
                if pinned else "") + ".\n- server CPU: the scheduler's per-thread run time "
             "(schedstat, ns) summed over the server's process tree.")
    peers = install_peers() if a.peers else {}
    t_all = time.perf_counter()

    if "rps" in only:
        rows, res = [], {}
        with Child("baseline-h11", [PY, str(HERE / "baseline_h11.py"), "--uvloop"]) as b:
            res["bare h11"] = rps(b, secs)
        for w in workers:
            wargs = ["--workers", str(w)] if multi else []
            with llmsim("--latency", "instant", *wargs) as s:
                res[f"llmsim ({w} worker{'s' if w > 1 else ''})"] = rps(s, secs)
        if "llmock" in peers:
            with start_llmock(peers["llmock"]) as s:
                res["llmock"] = rps(s, secs)
        if peers.get("aimock"):
            with start_aimock(peers["aimock"]) as s:
                res["aimock"] = rps(s, secs)
        base = res["bare h11"]["rps"]
        one = res.get("llmsim (1 worker)", {}).get("rps", 0)
        for name, r in res.items():
            rows.append([name, f"{r['rps']:.0f}", f"{r['rps'] / base:.2f}",
                         f"{one / r['rps']:.2f}" if r["rps"] else "-",
                         f"{r['server_cpu_pct']:.0f}%", f"{r['rps_per_cpu_s']:.0f}",
                         fmt_pcts(r["latency_ms"]), f"{r['client_cpu_s']:.2f}",
                         str(r["errors"])])
        rep.table(f"Non-streaming chat, 64 keep-alive connections, {secs:.0f} s",
                  ["server", "req/s", "× bare h11", "llmsim-1w ÷ this", "server CPU",
                   "req per CPU-s", "latency ms p50/p99/max", "client CPU s", "errors"], rows)

    def stream_rows(title: str, runs: list[tuple[str, int, dict[str, Any]]]) -> None:
        rows = []
        for name, n, r in runs:
            rows.append([name, str(n), f"{r['events_per_s']:.0f}", f"{r['server_cpu_pct']:.0f}%",
                         f"{r['on_time_pct']:.1f}%", fmt_pcts(r["ttft_err_ms"]),
                         fmt_pcts(r["gap_err_ms"]), fmt_pcts(r["lateness_ms"]),
                         f"{r['client_cpu_s']:.2f}", str(r["errors"])])
        rep.table(title, ["server", "streams", "events/s", "server CPU", "on time (≤5 ms)",
                          "TTFT err ms p50/p99/max", "gap err ms p50/p99/max",
                          "lateness ms p50/p99/max", "client CPU s", "errors"], rows)

    def cpu_tok(r: dict[str, Any]) -> float:
        return float(r["server_cpu_s"]) / max(r["tokens"], 1)

    def med(rs: list[dict[str, Any]]) -> dict[str, Any]:
        """The median result of a server's rounds, with each round's CPU per token kept
        (``cpu_rounds``, in round order) for the paired ratios."""
        out = median_result(rs)
        out["cpu_rounds"] = [cpu_tok(r) for r in rs]
        return out

    def round_ratios(r: dict[str, Any], a: dict[str, Any]) -> list[float]:
        """Each round's CPU per token ÷ the anchor's in that round (none without rounds)."""
        mine, theirs = r.get("cpu_rounds"), a.get("cpu_rounds")
        if mine and theirs and len(mine) == len(theirs):
            return [x / max(y, 1e-12) for x, y in zip(mine, theirs, strict=True)]
        return []

    def cpu_ratio(r: dict[str, Any], a: dict[str, Any]) -> float:
        """CPU per token ÷ the anchor's: the median of the rounds' own ratios (each round
        drives both servers seconds apart, so a ratio is taken before the shared machine's
        speed drifts); the ratio of the medians for results without rounds."""
        rounds = round_ratios(r, a)
        if rounds:
            return statistics.median(rounds)
        return cpu_tok(r) / max(cpu_tok(a), 1e-12)

    def cpu_cell(r: dict[str, Any], a: dict[str, Any]) -> str:
        """The ratio, then each round's in parentheses when there are several (their
        spread is the measurement's: a median near a target says little alone)."""
        rounds = round_ratios(r, a)
        cell = f"{statistics.median(rounds) if rounds else cpu_ratio(r, a):.2f}"
        if len(rounds) > 1:
            cell += " (" + " ".join(f"{x:.2f}" for x in rounds) + ")"
        return cell

    def ratio_rows(kind: str, runs: list[tuple[str, int, dict[str, Any]]],
                   anchor: dict[int, dict[str, Any]],
                   same: dict[int, dict[str, Any]] | None = None) -> None:
        """The issue-15 targets, side by side with the anchor at the same stream count;
        ``same``: the same-wire anchor's runs too (Responses): a second CPU ratio, and the
        gap and TTFT p99 differences to it after those to the chat anchor."""
        def diff(key: str, r: dict[str, Any], a: dict[str, Any],
                 b: dict[str, Any] | None) -> str:
            d = f"{r[key]['p99'] - a[key]['p99']:+.2f}"
            return d if b is None else f"{d} / {r[key]['p99'] - b[key]['p99']:+.2f}"

        rows = []
        for name, n, r in runs:
            a = anchor[n]
            b = same[n] if same is not None else None
            rows.append([name, str(n), cpu_cell(r, a),
                         *([cpu_cell(r, b)] if b is not None else []),
                         diff("gap_err_ms", r, a, b), diff("ttft_err_ms", r, a, b),
                         f"{r.get('abs_gap_err_ms', {}).get('p50', float('nan')):.2f} / "
                         f"{a.get('abs_gap_err_ms', {}).get('p50', float('nan')):.2f}",
                         f"{r['events_per_s'] / max(a['events_per_s'], 1e-9):.2f}"])
        both = " (chat / same-wire)" if same is not None else ""
        rep.table(f"Streaming {kind} against the bare anchor (targets: CPU/token ≤ 1.10, gap "
                  "p99 ≤ +1 ms, TTFT p99 ≤ +2 ms, abs gap err p50 ≤ 1 ms, events ≥ 1.00; CPU: "
                  "the median of the rounds' own ratios, each round's in parentheses)",
                  ["server", "streams", "CPU per token ÷ anchor",
                   *(["CPU per token ÷ same-wire anchor"] if same is not None else []),
                   f"gap err p99 − anchor ms{both}", f"TTFT err p99 − anchor ms{both}",
                   "abs gap err p50 ms (this / anchor)", "events/s ÷ anchor"], rows)

    timing = STREAM_TIMING
    extra = shlex.split(a.llmsim_args)  # (llmsim's servers only, never the anchor's)

    def pin(server: Child) -> None:
        if pinned:
            server.pin({0}, {1})

    if pinned:
        rounds_note += "; 1-worker servers pinned to CPU 0, the load generator to CPU 1"
    rounds_note += "; each round drives the anchor and every llmsim server in turn"
    if "stream" in only or "ws" in only:
        kinds = (["chat"] + (["responses"] if has_module("responses") else [])
                 if "stream" in only else [])
        ws_too = "ws" in only and has_module("ws")  # (the WebSocket transport)
        for loop in loops:
            # Every server of this loop's comparison runs at once (an idle one costs nothing)
            # and each round of a stream count drives them one after another, so the anchor
            # and llmsim are measured seconds apart, not minutes: this shared VM's speed
            # drifts by more than the differences measured (RESULTS.md, 2026-11-26).
            with contextlib.ExitStack() as stack:
                # the streaming anchor: bare asyncio+h11 pacing the same chunks on one heap
                # timer, on the same event loop as the llmsim runs it is compared with
                b = stack.enter_context(Child("anchor-sse", [
                    PY, str(HERE / "baseline_h11.py"),
                    *(["--uvloop"] if loop == "uvloop" else []), *timing]))
                pin(b)
                # (table, row name, workers, server, kind, over WebSocket)
                plan: list[tuple[str, str, int, Child, str, bool]] = []
                for kind in kinds:
                    for w in workers:
                        wargs = ["--workers", str(w)] if multi else []
                        s = stack.enter_context(llmsim(*timing, *extra, *wargs, "--loop",
                                                       loop))
                        if w == 1:
                            pin(s)
                        plan.append((kind, f"llmsim {kind} ({w}w, {loop})", w, s, kind,
                                     False))
                if ws_too:
                    s = stack.enter_context(llmsim(*timing, *extra, "--loop", loop))
                    pin(s)
                    plan.append(("ws", f"llmsim responses WS ({loop})", 1, s, "responses",
                                 True))
                got: dict[str, dict[int, list[dict[str, Any]]]] = {"anchor": {}}
                # the same-wire anchors: (table, row name, kind, over WebSocket)
                same_wire = ([("responses", f"bare h11 anchor, Responses SSE ({loop})",
                               "responses", False)] if "responses" in kinds else []) + (
                    [("ws", f"bare h11 anchor, Responses WS ({loop})", "responses", True)]
                    if ws_too else [])
                for n in counts:
                    for _ in range(n_rounds):
                        got["anchor"].setdefault(n, []).append(stream(b, n, sdur))
                        for _t, name, kind, ws in same_wire:
                            got.setdefault(name, {}).setdefault(n, []).append(
                                stream(b, n, sdur, kind, ws=ws))
                        for _t, name, w, s, kind, ws in plan:
                            if w > 1 and n < 1000:
                                continue
                            got.setdefault(name, {}).setdefault(n, []).append(
                                stream(s, n, sdur, kind, ws=ws))
            anchor = {n: med(got["anchor"][n]) for n in counts}
            for table in [*kinds, *(["ws"] if ws_too else [])]:
                runs = [(f"bare h11 anchor ({loop})", n, anchor[n])
                        for n in counts] if table == "chat" else []
                same: dict[int, dict[str, Any]] | None = None
                for t, name, _k, _ws in same_wire:
                    if t == table:
                        same = {n: med(rs) for n, rs in got[name].items()}
                        runs += [(name, n, same[n]) for n in counts]
                for t, name, _w, _s, _k, _ws in plan:
                    if t == table:
                        runs += [(name, n, med(rs)) for n, rs in got.get(name, {}).items()]
                mine = [(name, n, r) for name, n, r in runs if name.startswith("llmsim")]
                if table == "ws":
                    stream_rows(f"Streaming Responses over WebSocket ({loop}, one connection "
                                f"per stream){rounds_note}", runs)
                    ratio_rows(f"Responses WebSocket ({loop})", mine, anchor, same)
                    continue
                if table == "chat" and loop == loops[0]:
                    if "llmock" in peers:
                        with start_llmock(peers["llmock"], TTFT_MS, ITL_MS) as s:
                            for n in counts[:2]:
                                runs.append(("llmock chat", n, stream(s, n, sdur)))
                    if peers.get("aimock"):
                        with start_aimock(peers["aimock"], TTFT_MS, ITL_MS) as s:
                            for n in counts[:2]:
                                runs.append(("aimock chat", n, stream(s, n, sdur)))
                stream_rows(f"Streaming {table} ({loop}): TTFT {TTFT_MS:.0f} ms, gap "
                            f"{ITL_MS:.0f} ms, {STREAM_TOKENS} tokens a stream, back to back "
                            f"for {sdur:.0f} s{rounds_note}", runs)
                ratio_rows(f"{table} ({loop})", mine, anchor, same)

    if "mem" in only:
        rows = []
        n_idle = 1000 if a.quick else 5000
        n_stream = 500 if a.quick else 2000  # streams of STREAM_TOKENS tokens, 1 s apart
        with llmsim("--latency", "instant") as s:
            m = memory(s, n_idle, http_request("/v1/chat/completions", CHAT_BODY), False)
            rows.append(["idle keep-alive connection", str(m["ready"]),
                         f"{m['rss_before_mib']:.1f} → {m['rss_after_mib']:.1f}",
                         f"{m['kib_per']:.1f}"])
        body = {"model": "gpt-4o-mini", "stream": True, "max_tokens": STREAM_TOKENS,
                "messages": [{"role": "user", "content": "Hi"}]}
        with llmsim("--ttft-ms", "0", "--itl-ms", "1000") as s:  # streams stay active ~100 s
            m = memory(s, n_stream, http_request("/v1/chat/completions", body), True)
            rows.append(["active chat stream", str(m["ready"]),
                         f"{m['rss_before_mib']:.1f} → {m['rss_after_mib']:.1f}",
                         f"{m['kib_per']:.1f}"])
        rep.table("Memory (RSS growth)", ["what", "N", "RSS MiB before → after", "KiB each"],
                  rows)

    if "startup" in only:
        st = startup(3)
        rep.table("Start-up", ["what", "median s", "runs s"],
                  [["process start → first served chat completion", f"{st['median_s']:.3f}",
                    ", ".join(f"{x:.3f}" for x in st["all_s"])]])

    rep.note(f"\ntotal bench time: {time.perf_counter() - t_all:.0f} s")
    if not a.no_write:
        # the hand-written analysis (from "## Targets" on) survives a re-run: it is kept
        # below the fresh tables, to be re-read against them
        path = HERE / "RESULTS.md"
        old = path.read_text() if path.exists() else ""
        kept = old[old.index(ANALYSIS_MARK):] if ANALYSIS_MARK in old else ""
        path.write_text("\n".join(rep.sections) + "\n\n" + NOTES
                        + ("\n" + kept if kept else ""))
    for f in BUILD.glob("llmsim-bench-*"):
        f.unlink(missing_ok=True)
    return 0


NOTES = """## How to read this

- **Timing error** is measured by the client when `read()` returns: TTFT error = first token's
  arrival − request send − TTFT; gap error = (arrival of token j − arrival of token j−1) − gap;
  lateness = arrival of token j − (send + TTFT + j × gap). "On time" = lateness ≤ 5 ms.
- Server CPU is the scheduler's run time of the server's threads (`/proc/<pid>/task/*/schedstat`,
  ns; utime+stime where the kernel has no schedstat), over the wall time of the run; the
  client's own CPU is reported beside it. Single-worker streaming runs pin the server to
  CPU 0 and the load generator to CPU 1 unless `--no-pin` is given. Each round of a stream
  count drives the anchor and every llmsim server in turn (all of them started up front), so
  a ratio compares runs seconds apart, not minutes.
- Peers get the same workload. llmock: `--latency-ms` (before the response) and
  `--stream-chunk-delay-ms`; aimock: a catch-all fixture with `streamingProfile {ttft, tps}`
  and one word per chunk. Peers stream their own fixed text, so their event counts differ.
- Peer ports are picked by binding port 0 and closing it (they cannot report a port-0 bind);
  llmsim and the baseline bind port 0 themselves and print the URL.
"""

if __name__ == "__main__":
    sys.exit(main())
