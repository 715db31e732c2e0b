"""Per-event CPU of llmsim's streaming path without sockets: ``python bench/pump_micro.py``.

In-process: N chat (or Responses) streams are decided by the real App, driven by the real
Pump on the shared timer heap (a manual clock jumps from deadline to deadline, so no time is
spent waiting), and written through the connection's ``HTTPWire`` (the HTTP chunk, as the
server writes it) into a transport that counts and drops each write (``--sink ws``: the
WebSocket session's ``WSWire`` and the dialect's WebSocket encoder, Responses only;
``--sink plain``: a sink without the wire frame, which frames each write itself). Prints CPU microseconds per written event, end to end (request
dispatch included) and for the pump path alone, beside the same measurement of the bare
anchor's pacing (``baseline_h11.Pacer``: heap, json.dumps, chunk framing, one write per due
event). ``--profile`` prints the top of cProfile.

``--spread S`` starts the streams over S seconds (on whole milliseconds) and runs the clock
as uvloop does (a pass at each millisecond tick), as a server under a steady load sees them:
each pass then holds a few streams' events, not every stream's at once (with 100 streams of
10 ms gaps, about five a pass: what a real server's pass holds at that load), so the cost of
a pass (and of the anchor's) counts as it does in a server. Without it every stream starts at
the same instant and one pass runs them all.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import math
import pstats
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402

from llmsim import Config  # noqa: E402
from llmsim.app import App  # noqa: E402
from llmsim.messages import Request  # noqa: E402
from llmsim.state import accounting  # noqa: E402
from llmsim.streaming.clock import Clock  # noqa: E402
from llmsim.streaming.flow import Pump  # noqa: E402
from llmsim.streaming.wire import HTTPWire, WSWire  # noqa: E402


class ManualClock(Clock):
    """Virtual time that jumps to the next deadline (no waiting, no loop passes)."""

    def __init__(self, ms: bool = False) -> None:
        super().__init__()
        self.t = 1000.0
        self.ms = ms  # passes on whole milliseconds, as uvloop's timers fire

    def now(self) -> float:
        return self.t

    def time(self) -> float:
        return 1_700_000_000.0 + self.t

    def _arm(self) -> None:
        pass

    def run(self) -> None:
        # as RealClock fires: at the start of the earliest live slot
        while (k := self.next_slot()) is not None:
            at = k * self.coalesce
            if self.ms:  # the first millisecond tick at which the slot has begun
                at = math.ceil(at * 1000 - 1e-6) / 1000
            self.t = max(self.t, at)
            self._run_due(self.t)


class Sink:
    paused = False

    def __init__(self) -> None:
        self.writes = 0
        self.bytes = 0

    def write_events(self, frames: list[bytes]) -> None:
        payload = frames[0] if len(frames) == 1 else b"".join(frames)
        payload = b"%x\r\n%b\r\n" % (len(payload), payload)
        self.writes += 1
        self.bytes += len(payload)

    def abort(self) -> None:
        pass


class _Counting:
    """The transport under an HTTPWire: counts the writes (into a Sink) and drops them."""

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    def write(self, data: bytes) -> None:
        self.sink.writes += 1
        self.sink.bytes += len(data)

    def is_closing(self) -> bool:
        return False


def wire_sink(sink: Sink, ws: bool = False) -> HTTPWire | WSWire:
    w = (WSWire if ws else HTTPWire)(_Counting(sink))  # type: ignore[arg-type]
    w.open = True
    return w


async def main(n: int, tokens: int, kind: str, profile: bool, sink_kind: str = "wire",
               spread: float = 0.0) -> None:
    clock = ManualClock(ms=spread > 0)
    app = App(Config(port=0, latency="realistic", ttft_ms=100, itl_ms=10, seed=1, quiet=True,
                     max_tokens_mode="exact"), clock=clock)
    if kind == "chat":
        path = "/v1/chat/completions"
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": tokens, "stream": True}
    else:
        path = "/v1/responses"
        body = {"model": "gpt-4o-mini", "input": "Hi", "max_output_tokens": tokens,
                "stream": True}
    raw = orjson.dumps(body)
    sink = Sink()
    prof = cProfile.Profile() if profile else None
    # warm-up: the first request loads the tokenizer (not a per-request cost)
    await app.dispatch(Request("POST", path, {}, {}, raw, "req_w", received_at=clock.now()))
    c0 = time.process_time()
    pumps = []
    for _ in range(n):
        req = Request("POST", path, {}, {"authorization": "Bearer sk-x"}, raw, "req_x",
                      received_at=clock.now())
        res = await app.dispatch(req)
        track = accounting.stream_started(app, req, "chat.completions", res)  # type: ignore[arg-type]
        st = res.stream  # type: ignore[union-attr]
        ws = sink_kind == "ws"
        enc = st.dialect.ws if ws else st.dialect.sse
        assert enc is not None  # (--sink ws: Responses, which has a WebSocket mode)
        pumps.append(Pump(st, clock, enc,
                          sink if sink_kind == "plain" else wire_sink(sink, ws), None,
                          track.observe, st.dialect.sse_error))
    c1 = time.process_time()
    if prof:
        prof.enable()
    t0 = clock.t
    for j, p in enumerate(pumps):
        clock.t = t0 + round(j * spread / n, 3)  # (each stream begins at its own time)
        p.start()
    clock.t = t0
    clock.run()
    if prof:
        prof.disable()
    c2 = time.process_time()
    events = sink.writes  # on a manual clock nothing is late: one write per instant
    print(f"{kind}: {n} streams x {tokens} tokens, {sink.writes} writes, {sink.bytes} bytes")
    print(f"  dispatch  {1e6 * (c1 - c0) / n:8.1f} us per request")
    print(f"  pump path {1e6 * (c2 - c1) / events:8.2f} us per write")
    print(f"  total     {1e6 * (c2 - c0) / events:8.2f} us per write")
    if prof:
        pstats.Stats(prof).sort_stats("tottime").print_stats(18)


class _Handle:
    def __init__(self, loop: _AnchorLoop, when: float, cb: Any) -> None:
        self.loop, self.when, self.cb = loop, when, cb

    def cancel(self) -> None:
        if self.loop.handle is self:
            self.loop.handle = None


class _AnchorLoop:
    """What the anchor's Pacer needs of a loop: ``time`` and one ``call_at`` at a time."""

    def __init__(self) -> None:
        self.t = 1000.0
        self.handle: _Handle | None = None

    def time(self) -> float:
        return self.t

    def call_at(self, when: float, cb: Any) -> _Handle:
        self.handle = _Handle(self, when, cb)
        return self.handle


class _AnchorConn:
    """The anchor's connection as its Stream sees it: a transport, h11 for the end."""

    def __init__(self, sink: Sink) -> None:
        self.t = self
        self.sink = sink

    def write(self, data: bytes) -> None:
        self.sink.writes += 1
        self.sink.bytes += len(data)

    def end_stream(self) -> None:
        pass


def anchor(n: int, tokens: int, spread: float = 0.0) -> None:
    """The same measurement for the bare anchor's pacing (bench/baseline_h11.py)."""
    import baseline_h11 as b  # bench/ is on sys.path when run as a script

    loop = _AnchorLoop()
    pacer = b.Pacer(loop)  # type: ignore[arg-type]
    sink = Sink()
    c0 = time.process_time()
    for j in range(n):
        pacer.push(loop.t + round(j * spread / n, 3) + 0.1,
                   b.Stream(_AnchorConn(sink), tokens, 0.01))  # type: ignore[arg-type]
    while loop.handle is not None:
        h = loop.handle
        loop.handle = None
        loop.t = max(loop.t, h.when)
        h.cb()
    c1 = time.process_time()
    print(f"anchor: {n} streams x {tokens} tokens, {sink.writes} writes, {sink.bytes} bytes")
    print(f"  pacing    {1e6 * (c1 - c0) / sink.writes:8.2f} us per write")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-n", type=int, default=500)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--kind", choices=["chat", "responses"], default="chat")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sink", choices=["wire", "ws", "plain"], default="wire")
    ap.add_argument("--spread", type=float, default=0.0, metavar="S",
                    help="start the streams over S seconds, passes on millisecond ticks "
                         "(e.g. 1.1 with -n 100: a server's passes at 100 streams)")
    a = ap.parse_args()
    if not 0.0 <= a.spread <= 60.0:
        ap.error("--spread: 0 to 60 seconds")
    anchor(a.n, a.tokens, a.spread)
    if a.sink == "ws" and a.kind != "responses":
        ap.error("--sink ws: --kind responses (the family with a WebSocket mode)")
    asyncio.run(main(a.n, a.tokens, a.kind, a.profile, a.sink, a.spread))
