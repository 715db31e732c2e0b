"""Two servers measured at once: a paired CPU-per-token comparison that the box's drift cannot move.

``python bench/pair.py A B [--kind chat|responses|ws] [--streams 100] [--tokens 100]
[--ramp S] [--seconds 6] [--reps 6]``

``A`` and ``B`` are each ``anchor`` (``bench/baseline_h11.py``, its Responses mode for
``responses`` and ``ws``) or a source tree of llmsim (a ``git worktree`` of another commit,
say). Both run pinned to CPU 0, each with its own load generator pinned to CPU 1, over the
same seconds, so a slower or busier moment of this shared VM slows both alike: the ratio of
the two servers' CPU per token is measured within one run instead of between runs seconds or
minutes apart. Each rep swaps the two servers' ports and start order, and the start order
matters: on a busy box the same tree against itself reads 0.94 one rep and 1.06 the next.
So reps come in pairs, one of each order, and the report is every rep's ``B ÷ A``, each
pair's geometric mean (the order cancels) and the median of those; a median of single reps
would lean to whichever order had more of them.

What it measures is a difference, not ``bench/run.py``'s ratio: two servers on one core share
its caches and its time, so each runs somewhat dearer than alone. Use it to decide whether a
change helps (on this box, two copies of the same tree come out within ±3% of each other a
rep, against ±10% for runs made one after the other); quote ``bench/run.py`` for the
comparison with the anchor.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run as bench  # noqa: E402

PY = sys.executable


def start(who: str) -> bench.Child:
    """A server on a free port, pinned to CPU 0 (its load generator: CPU 1)."""
    if who == "anchor":
        child = bench.Child("anchor", [PY, str(HERE / "baseline_h11.py"), "--uvloop",
                                       "--port", "0", *bench.STREAM_TIMING])
    else:
        tree = Path(who).resolve()
        if not (tree / "llmsim" / "__main__.py").exists():
            raise SystemExit(f"pair: {who!r} is neither 'anchor' nor a source tree of llmsim")
        child = bench.llmsim(*bench.STREAM_TIMING, "--loop", "uvloop", name=who, warm=False,
                             tree=tree)
    return child.pin({0}, {1})


def both(a: bench.Child, b: bench.Child, args: list[str], timeout: float
         ) -> tuple[float, float]:
    """Drive both servers at once; each one's CPU seconds per token."""
    exe = bench.loadgen()
    cpu0 = (bench.cpu_seconds(a.pid), bench.cpu_seconds(b.pid))
    procs = [subprocess.Popen([exe, "stream", "-p", str(s.port), *args], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              preexec_fn=lambda: os.sched_setaffinity(0, {1}))
             for s in (a, b)]
    outs = [p.communicate(timeout=timeout)[0] for p in procs]
    cpu1 = (bench.cpu_seconds(a.pid), bench.cpu_seconds(b.pid))
    got, tokens = [], []
    for out, c0, c1, s in zip(outs, cpu0, cpu1, (a, b), strict=True):
        r = json.loads(out)
        if r.get("errors") or not r.get("tokens"):
            raise SystemExit(f"pair: {s.name}: {r.get('errors')} errors, "
                             f"{r.get('tokens')} tokens")
        got.append((c1 - c0) / r["tokens"])
        tokens.append(r["tokens"])
    if abs(tokens[0] - tokens[1]) > 0.02 * max(tokens):  # (a server that fell behind or broke)
        print(f"pair: warning: A delivered {tokens[0]} tokens, B {tokens[1]}: the two did "
              "not do the same work", file=sys.stderr, flush=True)
    return got[0], got[1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description="Two servers' CPU per token, measured at once on one core (see the "
                    "module doc). A and B: 'anchor' or a source tree of llmsim.")
    ap.add_argument("a", metavar="A")
    ap.add_argument("b", metavar="B")
    ap.add_argument("--kind", choices=("chat", "responses", "ws"), default="chat",
                    help="the stream workload of bench/run.py (default: chat)")
    ap.add_argument("--streams", type=int, default=100, help="streams per server (100)")
    ap.add_argument("--tokens", type=int, default=bench.STREAM_TOKENS,
                    help=f"tokens a stream ({bench.STREAM_TOKENS}; Responses: at least 16, "
                         "its least max_output_tokens): short streams weigh what a request "
                         "costs, long ones what a token costs")
    ap.add_argument("--ramp", type=float, default=None,
                    help="seconds over which the streams' first requests are sent (default: "
                         "bench/run.py's, 0.2 s up to 400 streams); 0 sends them together, "
                         "and back-to-back streams of one length keep them together: each "
                         "loop pass then handles many requests, warm, instead of one, cold")
    ap.add_argument("--seconds", type=float, default=6.0, help="seconds a rep (6)")
    ap.add_argument("--reps", type=int, default=6,
                    help="reps, an even number: pairs of one rep in each start order (6)")
    a = ap.parse_args(argv)
    if not 1 <= a.streams <= 2000 or not 1 <= a.seconds <= 120 or not 2 <= a.reps <= 50 \
            or a.reps % 2:
        ap.error("--streams 1..2000, --seconds 1..120, --reps an even number 2..50")
    if a.ramp is not None and not 0 <= a.ramp <= 10:
        ap.error("--ramp 0..10")
    least = bench.least_tokens("responses" if a.kind == "ws" else a.kind)
    if not least <= a.tokens <= 4096:
        ap.error(f"--tokens {least}..4096 for {a.kind}")
    if len(os.sched_getaffinity(0)) < 2:
        ap.error("needs two CPUs (0: the servers, 1: the load generators)")
    # SIGTERM (e.g. from `timeout`) unwinds through the with blocks that stop the servers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    kind, ws = ("responses", True) if a.kind == "ws" else (a.kind, False)
    warm = bench.stream_args(a.streams, 1.0, kind, ws, a.tokens, a.ramp)
    args = bench.stream_args(a.streams, a.seconds, kind, ws, a.tokens, a.ramp)
    ratios = []
    for rep in range(a.reps):
        first, second = (a.a, a.b) if rep % 2 == 0 else (a.b, a.a)
        with start(first) as s1, start(second) as s2:
            sa, sb = (s1, s2) if rep % 2 == 0 else (s2, s1)
            time.sleep(1.0)
            both(sa, sb, warm, 60)
            ta, tb = both(sa, sb, args, a.seconds + 60)
        ratios.append(tb / ta)
        print(f"rep {rep + 1}: A {ta * 1e6:.2f} us/token, B {tb * 1e6:.2f} us/token, "
              f"B/A {tb / ta:.3f}", flush=True)
    pairs = [statistics.geometric_mean(ratios[i:i + 2]) for i in range(0, len(ratios), 2)]
    print(f"B/A median {statistics.median(pairs):.3f} over {len(pairs)} pairs of reps, each "
          f"the geometric mean of its two start orders ({a.kind}, {a.streams} streams each, "
          f"{a.tokens} tokens a stream" + ("" if a.ramp is None else f", ramp {a.ramp:g} s")
          + f"); A started first: {statistics.median(ratios[0::2]):.3f}, B first: "
          f"{statistics.median(ratios[1::2]):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
