"""Microbenchmark: SharedStore.put (the --workers store) at its default entry bound.

    python bench/store_micro.py [--entries 1024] [--puts 2000] [--rounds 5]

Fills a fresh store past ``--entries`` with ~2 KB values (a stored response's snapshot is
of that order), then times ``--puts`` puts per round (replacing and evicting, the byte
budget on) and prints µs per put per round and the median.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmsim.state import shared  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--entries", type=int, default=1024)
    ap.add_argument("--puts", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        shared.prepare(d)
        s: shared.SharedStore[dict[str, object]] = shared.SharedStore(
            os.path.join(d, "store.sqlite3"), "responses", a.entries, 3600,
            max_bytes=256 * 1024 * 1024)
        value = {"text": "x" * 2000, "n": list(range(50))}
        for i in range(a.entries + 100):
            s.put(f"resp_{i}", value, 123)
        res = []
        for r in range(a.rounds):
            t = time.perf_counter()
            for i in range(a.puts):
                s.put(f"resp_{r}_{i % (a.entries * 2 // 3)}", value, 123)
            res.append((time.perf_counter() - t) / a.puts * 1e6)
        print(f"put µs per round {[round(x, 1) for x in res]}; median "
              f"{statistics.median(res):.1f} ({len(s)} entries, {s.nbytes} bytes)")
        s.close()


if __name__ == "__main__":
    main()
