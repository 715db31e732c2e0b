"""Server CPU per token at N concurrent streams, ``--engine`` on against capacity off.

    python bench/engine_cpu.py [--streams 1000] [--rounds 3] [--engine llama-3.1-8b-h100]
                               [--time-scale X]

The engine paces tokens by its own steps (at 1,000 streams of the H100 8B profile, one token
per stream every ~0.63 s), the stream benchmark's capacity-off server by its 10 ms gap. A
stream's CPU per token depends on that rate: at 10 ms gaps and 1,000 streams a one-core
server falls behind and writes several due tokens per write (``Clock.catch_up``), at 0.63 s
every token is its own write, tick and syscall. So each round runs three servers, one after
another, each for the stream benchmark's load (``bench/run.py``'s ``stream``: 100 tokens a
stream, back to back): capacity off at the benchmark's gap, the engine, and capacity off at
the engine's measured gap (its gap p50 from the client) — the fair comparison: the same
streams, tokens and token rate, the engine deciding when. Servers pinned to CPU 0, the load
generator to CPU 1, as ``bench/run.py`` does; the table shows per-metric medians of the
rounds. Loopback only; each engine round takes about a minute (100 tokens at ~0.63 s).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as B  # noqa: E402  (bench/run.py: servers, load generator, CPU accounting)


def writes(pid: int) -> int:
    """Write system calls of a process so far (/proc/<pid>/io ``syscw``; 0 where unreadable):
    how many tokens a write carries."""
    try:
        with open(f"/proc/{pid}/io") as fh:
            return next(int(x.split()[1]) for x in fh if x.startswith("syscw"))
    except (OSError, StopIteration, ValueError):
        return 0


def one(args: list[str], n: int, seconds: float) -> dict[str, Any]:
    timing = ["--ttft-ms", str(B.TTFT_MS), "--itl-ms", str(B.ITL_MS), "--loop", "uvloop"
              if B.importlib.util.find_spec("uvloop") else "asyncio"]
    with B.llmsim(*timing, *args) as s:  # (a later --itl-ms wins)
        if len(os.sched_getaffinity(0)) >= 2:
            s.pin({0}, {1})
        w0 = writes(s.pid)
        r = B.stream(s, n, seconds)
        r["writes_per_token"] = (writes(s.pid) - w0) / max(r["tokens"], 1)
    r["cpu_us_per_token"] = 1e6 * r["server_cpu_s"] / max(r["tokens"], 1)
    # the client's gap error is against the benchmark's gap: the gap itself is that plus it
    r["gap_ms"] = r["gap_err_ms"]["p50"] + B.ITL_MS
    return r


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=4.0, help="back-to-back window per run")
    ap.add_argument("--engine", default="llama-3.1-8b-h100")
    ap.add_argument("--time-scale", type=float, default=None,
                    help="run the engine's server this many times faster (--time-scale): "
                         "shorter gaps, the same comparison at a higher token rate")
    a = ap.parse_args()
    scale = ["--time-scale", str(a.time_scale)] if a.time_scale else []
    B.loadgen()
    got: dict[str, list[dict[str, Any]]] = {"off": [], "engine": [], "off_same_rate": []}
    for i in range(a.rounds):
        got["off"].append(one([], a.streams, a.seconds))
        eng = one(["--engine", a.engine, *scale], a.streams, a.seconds)
        got["engine"].append(eng)
        gap = max(1.0, round(eng["gap_ms"]))
        got["off_same_rate"].append(one(["--itl-ms", str(gap)], a.streams, a.seconds))
        print(f"round {i + 1}: " + ", ".join(
            f"{k} {v[-1]['cpu_us_per_token']:.1f} us/token (gap {v[-1]['gap_ms']:.0f} ms, "
            f"{v[-1]['writes_per_token']:.2f} writes/token)"
            for k, v in got.items()), flush=True)
    med = {k: B.median_result(v) for k, v in got.items()}
    print(f"\n| server ({a.streams} streams) | gap p50 ms | tokens | server CPU s | "
          "CPU per token us | writes per token | engine ÷ this |")
    print("|---|---|---|---|---|---|---|")
    e = med["engine"]["cpu_us_per_token"]
    names = {"off": "capacity off, bench gap", "engine": f"--engine {a.engine} {' '.join(scale)}",
             "off_same_rate": "capacity off, the engine's gap"}
    for k, r in med.items():
        print(f"| {names[k]} | {r['gap_ms']:.0f} | {r['tokens']} | {r['server_cpu_s']:.2f} | "
              f"{r['cpu_us_per_token']:.1f} | {r['writes_per_token']:.2f} | "
              f"{e / r['cpu_us_per_token']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
