"""A streamed request's CPU with every step run on cold caches, llmsim beside the bare anchor:
``python bench/cold_micro.py [-n 300] [--tokens 4] [--repeat 3] [--thrash-mb 8]``.

Why it exists: warm, in a loop, a streamed chat request costs llmsim about what it costs the
anchor (``bench/request_micro.py``: 80-90 µs each). In the server at 100 streams, llmsim's
request costs 110-130 µs more than the anchor's (``bench/RESULTS.md``, "Where chat's excess
at 100 streams is"). At that load about one request arrives per loop pass. Between two steps
of a stream the kernel's network stack and the other streams' ticks run, so each step starts
with the caches holding little of its code and data. A path that runs many distinct functions
and objects once per request pays for each of them again.

What it does: one connection of each server (llmsim's real ``HTTPProtocol`` on a transport
that drops its writes, the anchor's ``Proto`` likewise) is fed ``-n`` requests one after
another, each run to its end on a manual clock. Before each step, the cache is thrashed:
``--thrash-mb`` MiB of memory are written, then some unrelated interpreter work runs. The
steps are the request read, the handler pass (llmsim only; the anchor answers while it
reads), and each clock pass of the stream. Only the steps are timed (process CPU time).
The report gives microseconds per request, in total and by step: medians of ``--repeat``
runs, each run in a fresh process. llmsim runs on uvloop when it is installed, as
``bench/run.py`` runs it; "(empty pass)" is what a loop pass with nothing to run costs cold,
a part of "handle" the server pays too. ``--thrash-mb 0`` keeps only the interpreter work.

A change to the path a request takes should move the llmsim total here before it is tried
in ``bench/pair.py --tokens 16``. The run-to-run spread of llmsim's total is about ±6%.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
_pc = time.process_time


class Thrash:
    """Evicts the caches: a buffer written with a 64-byte stride, then a walk over dicts."""

    def __init__(self, mb: int) -> None:
        self.buf = bytearray(mb << 20)
        self.zeros = bytes(len(self.buf) // 64)
        self.junk = [{"a": i, "b": str(i)} for i in range(20000)]

    def __call__(self) -> int:
        if self.buf:
            self.buf[::64] = self.zeros
        s = 0
        for d in self.junk[::7]:
            s += d["a"]
        return s


def run_anchor(n: int, tokens: int, thrash: Thrash) -> dict[str, float]:
    sys.path.insert(0, str(HERE))
    import baseline_h11 as b
    from pump_micro import _AnchorLoop
    from wire_micro import Transport, request

    raw = request("chat", tokens)
    loop = _AnchorLoop()
    b.Proto.pacer = b.Pacer(loop)  # type: ignore[arg-type]
    p = b.Proto()
    p.connection_made(Transport([0, 0, 0]))  # type: ignore[arg-type]

    def one(timed: dict[str, float] | None) -> None:
        if timed is not None:
            thrash()
        c0 = _pc()
        p.data_received(raw)
        if timed is not None:
            timed["read"] += _pc() - c0
        j = 0
        while (h := loop.handle) is not None:
            loop.handle = None
            loop.t = max(loop.t, h.when)
            if timed is not None:
                thrash()
            c0 = _pc()
            h.cb()
            if timed is not None:
                timed[f"pass {j}"] += _pc() - c0
            j += 1

    for _ in range(3):
        one(None)
    gc.collect()
    timed: dict[str, float] = collections.defaultdict(float)
    for _ in range(n):
        one(timed)
    return {k: 1e6 * v / n for k, v in timed.items()}


async def run_llmsim(n: int, tokens: int, thrash: Thrash) -> dict[str, float]:
    sys.path.insert(0, str(HERE.parent))
    sys.path.insert(1, str(HERE))
    from pump_micro import ManualClock
    from wire_micro import connections, request

    from llmsim import Config
    from llmsim.transport.server import GC_YOUNG_THRESHOLD, Server

    clock = ManualClock()
    srv = Server(Config(port=0, latency="realistic", ttft_ms=100, itl_ms=10, quiet=True,
                        max_tokens_mode="exact"), clock=clock)
    raw = request("chat", tokens)
    (p,) = connections(srv, 1, [0, 0, 0])

    async def one(timed: dict[str, float] | None) -> None:
        if timed is not None:
            thrash()
        c0 = _pc()
        p.data_received(raw)
        c1 = _pc()
        if timed is not None:
            timed["read"] += c1 - c0
            thrash()
            c1 = _pc()
        await asyncio.sleep(0)  # the loop pass that runs the handlers (call_soon)
        if timed is not None:
            timed["handle"] += _pc() - c1
        j = 0
        while (k := clock.next_slot()) is not None:
            clock.t = max(clock.t, k * clock.coalesce)
            if timed is not None:
                thrash()
            c0 = _pc()
            clock._run_due(clock.t)
            if timed is not None:
                timed[f"pass {j}"] += _pc() - c0
            j += 1

    for _ in range(3):  # warm-up: the tokenizer, caches, the body memo
        await one(None)
    empty = 0.0  # what an empty loop pass costs cold (part of "handle")
    for _ in range(min(n, 100)):
        thrash()
        c0 = _pc()
        await asyncio.sleep(0)
        empty += _pc() - c0
    gc.collect()
    gc.freeze()  # as Server.settle leaves the collector
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    timed: dict[str, float] = collections.defaultdict(float)
    for _ in range(n):
        await one(timed)
    out = {k: 1e6 * v / n for k, v in timed.items()}
    out["(empty pass)"] = 1e6 * empty / min(n, 100)
    return out


def child(which: str, n: int, tokens: int, mb: int) -> None:
    thrash = Thrash(mb)
    if which == "anchor":
        got = run_anchor(n, tokens, thrash)
    else:
        try:  # the loop the server runs on (bench/run.py: --loop uvloop)
            import uvloop
            got = uvloop.run(run_llmsim(n, tokens, thrash))
        except ImportError:
            got = asyncio.run(run_llmsim(n, tokens, thrash))
    print(json.dumps(got))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=300, help="requests a run (300)")
    ap.add_argument("--tokens", type=int, default=4, help="tokens a stream (4)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each server (3)")
    ap.add_argument("--thrash-mb", type=int, default=8, help="MiB written between steps (8)")
    ap.add_argument("--child", choices=("anchor", "llmsim"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if not 1 <= a.n <= 100_000 or not 1 <= a.tokens <= 4096 or not 1 <= a.repeat <= 50 \
            or not 0 <= a.thrash_mb <= 1024:
        ap.error("-n 1..100000, --tokens 1..4096, --repeat 1..50, --thrash-mb 0..1024")
    if a.child:
        child(a.child, a.n, a.tokens, a.thrash_mb)
        return 0
    print(f"{a.n} streamed chat requests of {a.tokens} tokens, one at a time, {a.thrash_mb} "
          f"MiB thrashed before each step; µs per request, medians of {a.repeat} runs")
    totals = {}
    for which in ("anchor", "llmsim"):
        runs = []
        for _ in range(a.repeat):
            out = subprocess.run([sys.executable, __file__, "--child", which, "-n", str(a.n),
                                  "--tokens", str(a.tokens), "--thrash-mb", str(a.thrash_mb)],
                                 capture_output=True, text=True, check=True, timeout=600)
            runs.append(json.loads(out.stdout))
        steps = list(runs[0])
        med = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in steps}
        totals[which] = statistics.median(sum(v for k, v in r.items() if k[0] != "(")
                                          for r in runs)
        parts = ", ".join(f"{k} {v:.1f}" for k, v in med.items())
        print(f"  {which:7} total {totals[which]:6.1f}  ({parts})")
    print(f"  llmsim - anchor: {totals['llmsim'] - totals['anchor']:+.1f} µs per request, "
          f"llmsim ÷ anchor {totals['llmsim'] / totals['anchor']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
