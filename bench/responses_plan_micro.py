"""Microbenchmark: one streamed Responses create's event plan, its fixed events encoded.

    python bench/responses_plan_micro.py [--tokens 100] [--plans 20000] [--rounds 7]

Drains ``render.plan`` for a one-message response of ``--tokens`` pieces (the token run
itself is left to flow.Pump, as on the server) and SSE-encodes every other event, numbered
as the stream numbers them; prints µs per plan per round and the median (CPU time).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmsim.api.responses import render  # noqa: E402
from llmsim.sim.decide import Usage  # noqa: E402
from llmsim.streaming import encode  # noqa: E402
from llmsim.streaming.stream import TokenRun  # noqa: E402

# the fields a default create echoes (render.echo_fields), as a Response object carries them
ECHO: dict[str, object] = {
    "background": False, "conversation": None, "instructions": None, "max_output_tokens": None,
    "max_tool_calls": None, "model": "gpt-4o", "parallel_tool_calls": True,
    "previous_response_id": None, "prompt_cache_key": None, "prompt_cache_retention": None,
    "reasoning": {"effort": None, "summary": None}, "safety_identifier": None,
    "service_tier": "default", "store": True, "temperature": 1.0,
    "text": {"format": {"type": "text"}, "verbosity": "medium"}, "tool_choice": "auto",
    "tools": [], "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled", "user": None,
    "metadata": {}, "presence_penalty": 0.0, "frequency_penalty": 0.0}


def one(pieces: list[str]) -> int:
    out = render.RespOut("resp_x", 123, Usage(10, len(pieces)),
                         [render.MessageOut("msg_y", pieces, len(pieces))], streamed=len(pieces))
    n = 0
    for seq, (_d, etype, data) in enumerate(render.plan(ECHO, out)):
        if type(data) is TokenRun:
            continue
        if type(data) is bytes:  # rendered, cut before its number (as the stream stamps it)
            data += b"%d}" % seq
        else:
            data["sequence_number"] = seq
        n += len(encode.sse_responses(etype, data))
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--plans", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    pieces = [f"tok{i} " for i in range(a.tokens)]
    size = one(pieces)
    res = []
    for _ in range(a.rounds):
        t = time.process_time()
        for _ in range(a.plans):
            one(pieces)
        res.append((time.process_time() - t) / a.plans * 1e6)
    print(f"plan µs per round {[round(x, 2) for x in res]}; median "
          f"{statistics.median(res):.2f} ({size} bytes of fixed events)")


if __name__ == "__main__":
    main()
