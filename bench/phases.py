"""Where a live request's CPU goes, phase by phase, next to the anchor's.

``python bench/phases.py [--tokens 16] [--streams 100] [--seconds 6] [--tree .]``

Runs the anchor (``bench/baseline_h11.py``) and then llmsim (from ``--tree``), each pinned to
CPU 0 inside this script, which wraps the methods that begin each phase with a CPU timer
(``time.thread_time``); drives each with ``bench/run.py``'s chat stream workload (load
generator on CPU 1, after a one-second warm-up) and prints the server's CPU a request costs in
each phase. Indented phases run inside the one above them.

In process (``bench/wire_micro.py``) a request's code stays warm; live it is cold again by the
connection's next request, so this is where the two servers' live costs can be compared part
by part. A wrapper costs about half a microsecond a call, so compare phases, not totals
(``bench/run.py`` and ``bench/pair.py`` measure those).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402

# (label, indent, where): the method timed as that phase, per server
PHASES: dict[str, list[tuple[str, int, str]]] = {
    "anchor": [
        ("request read (parse, head, stream set up)", 0, "baseline_h11:Proto.data_received"),
        ("clock passes (tokens, stream ends)", 0, "baseline_h11:Pacer.fire"),
        ("end of stream", 1, "baseline_h11:Proto.end_stream"),
    ],
    "llmsim": [
        ("request read (parse, route)", 0, "llmsim.transport.http:HTTPProtocol.data_received"),
        ("handlers (answer, plan, pump set up)", 0, "llmsim.transport.http:_run_handlers"),
        ("clock passes (tokens, stream ends)", 0, "llmsim.streaming.clock:RealClock._fire"),
        ("general ticks (first and last events)", 1, "llmsim.streaming.flow:Pump._tick"),
        ("end of stream", 2, "llmsim.transport.http:HTTPProtocol._stream_done"),
        ("stream accounting", 3, "llmsim.transport.http:HTTPProtocol._release_stream"),
        ("next cycle", 3, "llmsim.transport.http:HTTPProtocol._end_cycle"),
    ],
}


def serve(who: str, out: str) -> None:
    """In the server process: wrap the phases, dump their totals to ``out`` on SIGUSR1
    (zeroed on SIGUSR2), then run the server."""
    import importlib

    acc: dict[str, list[float]] = {}
    clock = time.thread_time

    def wrap(label: str, where: str) -> None:
        mod, _, path = where.partition(":")
        owner: Any = importlib.import_module(mod)
        *outer, name = path.split(".")
        for part in outer:
            owner = getattr(owner, part)
        fn: Callable[..., Any] = getattr(owner, name)
        slot = acc[label] = [0.0, 0.0]

        def timed(*args: Any, **kw: Any) -> Any:
            t0 = clock()
            try:
                return fn(*args, **kw)
            finally:
                slot[0] += clock() - t0
                slot[1] += 1

        setattr(owner, name, timed)

    def dump(*_: Any) -> None:
        with open(out, "w") as fh:
            json.dump(acc, fh)

    def zero(*_: Any) -> None:
        for slot in acc.values():
            slot[0] = slot[1] = 0.0

    signal.signal(signal.SIGUSR1, dump)
    signal.signal(signal.SIGUSR2, zero)
    for label, _, where in PHASES[who]:
        wrap(label, where)
    if who == "anchor":
        import baseline_h11 as b  # type: ignore[import-not-found]
        import uvloop

        b.Proto.ttft, b.Proto.itl = bench.TTFT_MS / 1e3, bench.ITL_MS / 1e3
        uvloop.run(b.main(0))
        return
    from llmsim.ops.cli import main

    sys.argv = ["llmsim", "--port", "0", "--max-tokens-mode", "exact", "--loop", "uvloop",
                *bench.STREAM_TIMING]
    sys.exit(main())


def measure(who: str, tree: Path, args: list[str], warm: list[str], seconds: float
            ) -> tuple[dict[str, list[float]], int, float]:
    """One server's phase totals over the run, its requests and its CPU seconds."""
    out = str(bench.BUILD / f"phases-{who}-{os.getpid()}.json")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(HERE)])}
    with bench.Child(who, [sys.executable, str(Path(__file__).resolve()), "--serve", who,
                           "--out", out], cwd=tree, env=env).pin({0}, {1}) as s:
        time.sleep(1.0)
        bench.drive(s, "stream", warm, 60)
        os.kill(s.pid, signal.SIGUSR2)
        r = bench.drive(s, "stream", args, seconds + 60)
        os.kill(s.pid, signal.SIGUSR1)
        for _ in range(50):
            time.sleep(0.1)
            if os.path.exists(out):
                break
        with open(out) as fh:
            got: dict[str, list[float]] = json.load(fh)
        os.unlink(out)
    if r.get("errors") or not r.get("completed"):
        raise SystemExit(f"phases: {who}: {r.get('errors')} errors, "
                         f"{r.get('completed')} requests")
    return got, int(r["completed"]), float(r["server_cpu_s"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="A live request's CPU by phase, llmsim next to "
                                             "the anchor (see the module doc).")
    ap.add_argument("--tokens", type=int, default=16, help="tokens a chat stream (16)")
    ap.add_argument("--streams", type=int, default=100, help="concurrent streams (100)")
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds a run (6)")
    ap.add_argument("--tree", default=str(HERE.parent), help="llmsim's source tree (this one)")
    ap.add_argument("--serve", choices=("anchor", "llmsim"), help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.serve:
        serve(a.serve, a.out)
        return 0
    if not 1 <= a.tokens <= 4096 or not 1 <= a.streams <= 2000 or not 1 <= a.seconds <= 120:
        ap.error("--tokens 1..4096, --streams 1..2000, --seconds 1..120")
    if len(os.sched_getaffinity(0)) < 2:
        ap.error("needs two CPUs (0: the server, 1: the load generator)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tree = Path(a.tree).resolve()
    if not (tree / "llmsim" / "__main__.py").exists():
        ap.error(f"--tree {a.tree!r} is not a source tree of llmsim")
    warm = bench.stream_args(a.streams, 1.0, "chat", False, a.tokens)
    args = bench.stream_args(a.streams, a.seconds, "chat", False, a.tokens)
    print(f"chat, {a.streams} streams of {a.tokens} tokens, {a.seconds:g} s; "
          "µs of server CPU a request (calls a request)")
    for who in ("anchor", "llmsim"):
        got, requests, cpu = measure(who, tree, args, warm, a.seconds)
        print(f"  {who}: {1e6 * cpu / requests:7.1f} in all")
        for label, indent, _ in PHASES[who]:
            spent, calls = got[label]
            print(f"    {'  ' * indent}{label + ':':<{44 - 2 * indent}} "
                  f"{1e6 * spent / requests:7.1f}   ({calls / requests:.1f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
