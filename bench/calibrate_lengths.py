"""Derive llmsim's trace-calibrated length classes from the Azure LLM inference traces 2023.

Writes the ``histograms`` of ``llmsim/data/lengths.json``: for the conversation class and the
code-continuation class, the trace's own output-length distribution as (value, cumulative
count) pairs, which the length model samples by inverse CDF (llmsim.sim.lengths).

    python bench/calibrate_lengths.py [TRACE_DIR]

TRACE_DIR defaults to ../shared/data/azure-llm-inference-2023 (or tests/data/...).
Source: Azure/AzurePublicDataset, CC-BY 4.0; Patel et al., "Splitwise: Efficient generative
LLM inference using phase splitting", ISCA 2024.
"""

from __future__ import annotations

import csv
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "llmsim" / "data" / "lengths.json"
CANDIDATES = (ROOT.parent / "shared" / "data" / "azure-llm-inference-2023",
              ROOT / "tests" / "data" / "azure-llm-inference-2023")


def histogram(path: Path) -> list[list[int]]:
    with path.open(newline="") as f:
        counts = Counter(int(r["GeneratedTokens"]) for r in csv.DictReader(f))
    out, cum = [], 0
    for value in sorted(counts):
        cum += counts[value]
        out.append([value, cum])
    return out


def main() -> None:
    src = Path(sys.argv[1]) if len(sys.argv) > 1 else next(p for p in CANDIDATES if p.exists())
    data = json.loads(DATA.read_text())
    for cls, name in (("conversation", "conv"), ("code_continuation", "code")):
        h = histogram(src / f"AzureLLMInferenceTrace_{name}.csv")
        data["kinds"][cls]["histogram"] = h
        print(f"{cls}: {h[-1][1]} answers, {len(h)} distinct lengths")
    text = json.dumps(data, indent=1)
    # one histogram pair per line would be 2,000 lines: keep each histogram on one line
    DATA.write_text(_compact(text) + "\n")


def _compact(text: str) -> str:
    import re
    return re.sub(r"\[\s+(\d+),\s+(\d+)\s+\]", r"[\1,\2]", text)


if __name__ == "__main__":
    main()
