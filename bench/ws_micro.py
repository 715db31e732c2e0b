"""Per-connection and per-create CPU of the Responses WebSocket mode, without sockets:
``python bench/ws_micro.py [-n 500] [--tokens 16] [--repeat 5] [--profile]``.

What a burst of WebSocket clients costs the server (bench/run.py's ws workload opens its
connections over a short ramp): the real :class:`HTTPProtocol` of ``-n`` connections, each on
a transport that counts and drops its writes (bench/wire_micro.py), is fed the upgrade request
the load generator sends, then one masked ``response.create`` text frame (its body as
bench/run.py's), and every response runs to its end on a manual clock that jumps from
deadline to deadline (bench/pump_micro.py). The server is configured as bench/run.py starts
it and the garbage collector as :meth:`Server.settle` leaves it. CPU microseconds per
connection, the median of ``--repeat`` runs, in three parts:

- ``setup``: ``connection_made`` and the upgrade request read, the loop pass that validates
  the handshake, answers 101 and builds the WebSocket connection and its mode;
- ``create``: the frame read (a whole text frame: unmasked by the connection), the create
  parsed and admitted, and the loop passes that dispatch it and start its pump (the first
  event written);
- ``stream``: the clock runs the responses: ``--tokens`` token events each, the terminal
  event, the end of the job's accounting.

``--profile`` prints the top of cProfile over one run (all three parts).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402
from pump_micro import ManualClock  # noqa: E402
from wire_micro import Transport, medians  # noqa: E402

from llmsim import Config  # noqa: E402
from llmsim.transport.http import HTTPProtocol  # noqa: E402
from llmsim.transport.server import GC_YOUNG_THRESHOLD, Server  # noqa: E402

UPGRADE = (b"GET /v1/responses HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           b"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer sk-bench\r\n\r\n")


def client_frame(payload: bytes) -> bytes:
    """One masked, final text frame (RFC 6455 §5.2), as a client sends it."""
    mask = os.urandom(4)
    n = len(payload)
    head = bytes([0x81]) + (bytes([0x80 | n]) if n < 126
                            else bytes([0x80 | 126]) + n.to_bytes(2, "big"))
    body = bytes(b ^ mask[i & 3] for i, b in enumerate(payload))
    return head + mask + body


def run_until_done(clock: ManualClock, protos: list[HTTPProtocol]) -> None:
    """Run the clock until every connection's responses ended (not on to the connections'
    time limits)."""
    while any(p.upgraded.mode._jobs for p in protos) and (k := clock.next_slot()) is not None:
        clock.t = max(clock.t, k * clock.coalesce)
        clock._run_due(clock.t)


async def passes(k: int = 4) -> None:
    for _ in range(k):
        await asyncio.sleep(0)


async def run(n: int, tokens: int, prof: cProfile.Profile | None
              ) -> tuple[float, float, float, int]:
    clock = ManualClock()
    srv = Server(Config(port=0, latency="realistic", ttft_ms=100, itl_ms=10, quiet=True,
                        max_tokens_mode="exact"), clock=clock)
    frame = client_frame(orjson.dumps({"type": "response.create", "model": "gpt-4o-mini",
                                       "input": "Hi", "max_output_tokens": tokens}))
    sink = [0, 0, 0]
    # warm-up: imports on first use, tokenizer, caches
    warm = []
    for _ in range(2):
        p = HTTPProtocol(srv)
        p.connection_made(Transport(sink))  # type: ignore[arg-type]
        p.data_received(UPGRADE)
        warm.append(p)
    await passes()
    for p in warm:
        p.data_received(frame)
    await passes()
    run_until_done(clock, warm)
    for p in warm:
        p.connection_lost(None)
    gc.collect()
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, *gc.get_threshold()[1:])
    sink[:] = [0, 0, 0]
    if prof:
        prof.enable()
    c0 = time.process_time()
    protos = []
    for _ in range(n):
        p = HTTPProtocol(srv)
        p.connection_made(Transport(sink))  # type: ignore[arg-type]
        p.data_received(UPGRADE)
        protos.append(p)
    await passes()
    c1 = time.process_time()
    for p in protos:
        p.data_received(frame)
    await passes()
    c2 = time.process_time()
    run_until_done(clock, protos)
    c3 = time.process_time()
    if prof:
        prof.disable()
    assert all(p.upgraded is not None for p in protos), "an upgrade failed"
    writes = sink[0]
    for p in protos:
        p.connection_lost(None)
    gc.unfreeze()
    k = 1e6 / n
    return (c1 - c0) * k, (c2 - c1) * k, (c3 - c2) * k, writes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=500, help="connections, one create each")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=5, help="runs; the medians are printed")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    med, writes = medians(lambda prof: run(a.n, a.tokens, prof), a.repeat, a.profile, a.top)
    print(f"responses ws: {a.n} connections x 1 create x {a.tokens} tokens, "
          f"{writes} writes a run")
    print(f"  setup   {med[0]:7.2f} us per connection")
    print(f"  create  {med[1]:7.2f} us per create")
    print(f"  stream  {med[2]:7.2f} us per create ({a.tokens} tokens, terminal, end)")
    print(f"  total   {sum(med):7.2f} us per connection")


if __name__ == "__main__":
    main()
