"""Per-request CPU of a streamed chat completion on the HTTP path, without sockets:
``python bench/request_micro.py [-n 500] [--rounds 4] [--tokens 4] [--repeat 3] [--profile]``.

What a streamed request costs besides its tokens: the real :class:`HTTPProtocol` of ``-n``
connections, each on a transport that counts and drops its writes, is fed the raw request
the load generator sends (bench/run.py's stream body, as many rounds as asked, back to back
on each connection), and every stream runs to its end on a manual clock that jumps from
deadline to deadline (no waiting). The server is configured as bench/run.py starts it (no
seed, realistic latency) and the garbage collector as :meth:`Server.settle` leaves it. CPU
microseconds per request, the median of ``--repeat`` runs, in three parts:

- ``read``: ``data_received``: h11 parses the request, the ``Request`` is built, its handler
  is scheduled;
- ``handle``: the loop pass that runs the handlers: dispatch (route, hooks, parse or body
  memo, decide, plan), the response head, the stream's accounting and its pump started;
- ``stream``: the clock runs the streams: ``--tokens`` token writes each (the per-token path,
  kept short so the rest shows), then the finish chunk, ``[DONE]``, the terminating chunk,
  the end of the stream's accounting and the connection's next cycle.

``--profile`` prints the top of cProfile over one run (all three parts).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))

from pump_micro import ManualClock  # noqa: E402
from wire_micro import connections, medians, request  # noqa: E402

from llmsim import Config  # noqa: E402
from llmsim.transport.server import GC_YOUNG_THRESHOLD, Server  # noqa: E402


async def run(n: int, rounds: int, tokens: int, prof: cProfile.Profile | None
              ) -> tuple[float, float, float, int]:
    clock = ManualClock()
    srv = Server(Config(port=0, latency="realistic", ttft_ms=100, itl_ms=10, quiet=True,
                        max_tokens_mode="exact"), clock=clock)
    raw = request("chat", tokens)
    sink = [0, 0, 0]
    protos = connections(srv, n, sink)
    for p in protos[:2]:  # warm-up: tokenizer, caches, the body memo
        p.data_received(raw)
    await asyncio.sleep(0)
    clock.run()
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    sink[:] = [0, 0, 0]
    read = handle = stream = 0.0
    if prof:
        prof.enable()
    for _ in range(rounds):
        c0 = time.process_time()
        for p in protos:
            p.data_received(raw)
        c1 = time.process_time()
        await asyncio.sleep(0)  # the loop pass that runs the handlers (call_soon)
        c2 = time.process_time()
        clock.run()
        c3 = time.process_time()
        read += c1 - c0
        handle += c2 - c1
        stream += c3 - c2
    if prof:
        prof.disable()
    for p in protos:
        p.connection_lost(None)
    gc.unfreeze()
    k = 1e6 / (n * rounds)
    return read * k, handle * k, stream * k, sink[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=500, help="connections (concurrent streams)")
    ap.add_argument("--rounds", type=int, default=4, help="requests per connection")
    ap.add_argument("--tokens", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3, help="runs; the medians are printed")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    med, writes = medians(lambda prof: run(a.n, a.rounds, a.tokens, prof), a.repeat,
                          a.profile, a.top)
    print(f"chat stream: {a.n} connections x {a.rounds} requests x {a.tokens} tokens, "
          f"{writes} writes a run")
    print(f"  read    {med[0]:7.2f} us per request")
    print(f"  handle  {med[1]:7.2f} us per request")
    print(f"  stream  {med[2]:7.2f} us per request ({a.tokens} tokens, finish, end)")
    print(f"  total   {sum(med):7.2f} us per request")


if __name__ == "__main__":
    main()
