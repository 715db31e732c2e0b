"""Per-request and per-event CPU of the whole server path, without sockets:
``python bench/wire_micro.py [--kind chat|responses|rps] [--profile]``.

Both servers run their real protocol objects (llmsim's :class:`~llmsim.transport.http.HTTPProtocol`,
the anchor's ``baseline_h11.Proto``) against fake transports that count the bytes written, and
are fed the same raw HTTP request bytes the load generator sends. Streams are paced on a
manual clock that jumps from deadline to deadline, so no time is spent waiting and the figure
is pure CPU: request parsing, dispatch, pacing, framing, stats, everything but the syscalls
(which cost both servers the same per write). The ratio is what the socket benchmark's
"CPU per token ÷ anchor" converges to when the write syscall is taken out (``--kind
responses``: ÷ the same-wire anchor, whose Responses stream sends llmsim's events); quiet or
busy box, it moves little. ``--profile`` prints the top of cProfile for llmsim.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(1, str(Path(__file__).resolve().parent))

import orjson  # noqa: E402
from pump_micro import ManualClock  # noqa: E402
from run import least_tokens  # noqa: E402

from llmsim import Config  # noqa: E402
from llmsim.transport.http import HTTPProtocol  # noqa: E402
from llmsim.transport.server import Server  # noqa: E402

SPLIT: list[float] = []  # CPU seconds spent in data_received (request in, head out), per run


class Transport:
    """What both protocols need of an asyncio transport; ``write`` counts and drops."""

    def __init__(self, sink: list[int]) -> None:
        self.sink = sink

    def write(self, data: bytes) -> None:
        self.sink[0] += 1
        self.sink[1] += len(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        self.sink[2] += 1

    abort = close

    def pause_reading(self) -> None:
        pass

    resume_reading = pause_reading


def connections(srv: Any, n: int, sink: list[int]) -> list[Any]:
    """``n`` of the server's HTTP connections, each on a counting :class:`Transport`."""

    protos = []
    for _ in range(n):
        p = HTTPProtocol(srv)
        p.connection_made(Transport(sink))  # type: ignore[arg-type]
        protos.append(p)
    return protos


def medians(run: Callable[[cProfile.Profile | None], Any], repeat: int, profile: bool,
            top: int) -> tuple[list[float], int]:
    """``run`` ``repeat`` times (the first under cProfile with ``profile``, its top ``top``
    printed), each returning three costs and a write count: their medians, the last count."""
    got = []
    for i in range(repeat):
        prof = cProfile.Profile() if profile and i == 0 else None
        got.append(asyncio.run(run(prof)))
        if prof:
            pstats.Stats(prof).sort_stats("tottime").print_stats(top)
    return [sorted(g[i] for g in got)[len(got) // 2] for i in range(3)], got[-1][3]


def request(kind: str, tokens: int) -> bytes:
    if kind == "responses":
        path = "/v1/responses"
        body: dict[str, Any] = {"model": "gpt-4o-mini", "input": "Hi",
                                "max_output_tokens": tokens, "stream": True}
    else:
        path = "/v1/chat/completions"
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": tokens}
        if kind == "chat":
            body["stream"] = True
    data = orjson.dumps(body)
    return (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer sk-bench\r\nContent-Length: {len(data)}\r\n\r\n"
            ).encode() + data


PROFILE_SORT = ["tottime"]
PROFILE_TOP = [25]


async def llmsim_run(kind: str, n: int, tokens: int, rounds: int,
                     profile: bool) -> tuple[float, int]:
    clock = ManualClock()
    srv = Server(Config(port=0, latency="instant" if kind == "rps" else "realistic",
                        ttft_ms=100, itl_ms=10, quiet=True, max_tokens_mode="exact",
                        # (rps unseeded, as bench/run.py starts it; streams seeded: the
                        # same text every run)
                        seed=None if kind == "rps" else 1),
                 clock=clock)
    raw = request(kind, tokens)
    sink = [0, 0, 0]
    protos = connections(srv, n, sink)
    protos[0].data_received(raw)  # warm-up: tokenizer, caches
    clock.run()
    await asyncio.sleep(0)
    sink[:] = [0, 0, 0]
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    c0 = time.process_time()
    split = 0.0
    for _ in range(rounds):
        s0 = time.process_time()
        for p in protos:
            p.data_received(raw)
        await asyncio.sleep(0)  # the handlers run on the loop pass after the read
        split += time.process_time() - s0
        clock.run()
        for _ in range(3):
            await asyncio.sleep(0)  # handlers that yielded once (none on this path)
    c1 = time.process_time()
    SPLIT.append(split)
    if prof:
        prof.disable()
        pstats.Stats(prof).sort_stats(PROFILE_SORT[0]).print_stats(PROFILE_TOP[0])
    for p in protos:
        p.connection_lost(None)
    return c1 - c0, sink[0]


def anchor_run(kind: str, n: int, tokens: int, rounds: int) -> tuple[float, int]:
    import baseline_h11 as b
    from pump_micro import _AnchorLoop

    loop = _AnchorLoop()
    b.Proto.pacer = b.Pacer(loop)  # type: ignore[arg-type]
    raw = request(kind, tokens)  # (responses: the anchor's same-wire Responses stream)
    sink = [0, 0, 0]
    protos = []
    for _ in range(n):
        p = b.Proto()
        p.connection_made(Transport(sink))  # type: ignore[arg-type]
        protos.append(p)
    c0 = time.process_time()
    split = 0.0
    for _ in range(rounds):
        s0 = time.process_time()
        for p in protos:
            p.data_received(raw)
        split += time.process_time() - s0
        while loop.handle is not None:
            h = loop.handle
            loop.handle = None
            loop.t = max(loop.t, h.when)
            h.cb()
    SPLIT.append(split)
    return time.process_time() - c0, sink[0]


def traced(server: str, tracer: Any, kind: str, n: int, tokens: int, rounds: int) -> None:
    """One run of ``server`` (anchor or llmsim) with ``tracer`` set (``sys.settrace``; inside
    the run: asyncio.run's task runs in a fresh context), cleared after it."""
    async def llmsim_traced() -> None:
        sys.settrace(tracer)
        await llmsim_run(kind, n, tokens, rounds, False)

    try:
        if server == "anchor":
            sys.settrace(tracer)
            anchor_run(kind, n, tokens, rounds)
        else:
            asyncio.run(llmsim_traced())
    finally:
        sys.settrace(None)


def opcodes(kind: str, n: int, tokens: int) -> None:
    """Bytecode instructions each server executes per token and per request (a tracer with
    ``f_trace_opcodes``), from runs of 1 and 3 requests per connection (what a run costs
    once, its set-up, cancels) of ``tokens`` tokens and of the least. Unlike CPU time, a
    count the box's load cannot move; it says how much Python a token costs, not how much
    each instruction costs (the cache misses a live server adds)."""
    count = [0]

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        if event == "opcode":
            count[0] += 1
        return tracer

    def once(server: str, t: int, rounds: int) -> int:
        count[0] = 0
        traced(server, tracer, kind, n, t, rounds)
        return count[0]

    lo = least_tokens(kind)
    once("llmsim", tokens, 1)  # warm-up: imports on first use, tables, caches
    print(f"{kind}: bytecode instructions, {n} connections, streams of {tokens} tokens and "
          f"of {lo}")
    for name in ("anchor", "llmsim"):
        many = once(name, tokens, 3) - once(name, tokens, 1)  # 2n requests of ``tokens``
        few = once(name, lo, 3) - once(name, lo, 1)  # 2n of ``lo``
        per_token = (many - few) / (2 * n * (tokens - lo))
        per_request = few / (2 * n) - lo * per_token
        print(f"  {name}  {per_token:7.1f} per token   {per_request:8.0f} per request")


_HARNESS = re.compile(r"(/bench/(wire|pump)_micro|/asyncio/[^/]+|/selectors)\.py$")


def footprint(kind: str, n: int, tokens: int) -> None:
    """The code each server runs per request: the Python functions a request of ``tokens``
    tokens calls (those called more often in runs of 6 requests a connection than of 2; not
    this harness's, nor the stock asyncio loop's it runs llmsim on, which live is uvloop's C)
    and the size of their bytecode. Live, this code is cold again by a connection's next request
    (hundreds of other streams' passes and the kernel's writes run in between), so what a
    request costs there is likely to follow this size more than its instruction count
    (docs/performance.md)."""
    calls: dict[Any, int] = {}

    def tracer(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            calls[frame.f_code] = calls.get(frame.f_code, 0) + 1

    def run(server: str, rounds: int) -> dict[Any, int]:
        calls.clear()
        traced(server, tracer, kind, n, tokens, rounds)
        return dict(calls)

    run("llmsim", 1)  # warm-up: imports on first use, tables, caches
    print(f"{kind}: code run per request, {n} connections, streams of {tokens} tokens")
    for name in ("anchor", "llmsim"):
        few, many = run(name, 2), run(name, 6)
        per = {c: (k - few.get(c, 0)) / (4 * n) for c, k in many.items()
               if k > few.get(c, 0) and not _HARNESS.search(c.co_filename)}
        size = sum(len(c.co_code) for c in per)
        print(f"  {name}  {len(per):4d} functions   {size / 1024:5.1f} KiB of bytecode   "
              f"{sum(per.values()):6.0f} calls per request")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", choices=["chat", "responses", "rps"], default="chat")
    ap.add_argument("-n", type=int, default=500, help="connections (concurrent streams)")
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=0, help="requests per connection")
    ap.add_argument("--repeat", type=int, default=3, help="repeats; the median is printed")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--top", type=int, default=25, help="--profile's number of lines")
    ap.add_argument("--sort", default="tottime", choices=("tottime", "cumulative"),
                    help="--profile's order")
    ap.add_argument("--only", choices=["anchor", "llmsim"],
                    help="run one server only (instruction counting under callgrind)")
    ap.add_argument("--opcodes", action="store_true",
                    help="count the bytecode instructions per token and per request instead "
                         "(slow: a tracer; try -n 20)")
    ap.add_argument("--footprint", action="store_true",
                    help="count the Python functions a request runs and the size of their "
                         "bytecode instead (a tracer; try -n 10 --tokens 2)")
    a = ap.parse_args()
    if a.footprint:
        if a.kind == "rps" or not 1 <= a.tokens <= 4096:
            ap.error("--footprint: a streaming --kind and --tokens 1..4096")
        footprint(a.kind, a.n, a.tokens)
        return
    if a.opcodes:
        if a.kind == "rps" or a.tokens <= least_tokens(a.kind):
            ap.error(f"--opcodes: a streaming --kind and more --tokens than its least "
                     f"({least_tokens(a.kind)})")
        opcodes(a.kind, a.n, a.tokens)
        return
    PROFILE_SORT[0] = a.sort
    PROFILE_TOP[0] = a.top
    kind = a.kind
    tokens = 16 if kind == "rps" else a.tokens
    rounds = a.rounds or (40 if kind == "rps" else 2)
    unit = "request" if kind == "rps" else "write"
    res: dict[str, list[float]] = {"anchor": [], "llmsim": []}
    req: dict[str, list[float]] = {"anchor": [], "llmsim": []}
    # (streams: a whole request's CPU and its writes; the servers write a stream in different
    # numbers of writes, so for short streams the per-write ratio is not the per-request one)
    whole: dict[str, list[float]] = {"anchor": [], "llmsim": []}
    per_req: dict[str, float] = {}
    for _ in range(a.repeat):
        if a.only != "llmsim":
            cpu, writes = anchor_run(kind, a.n, tokens, rounds)
            res["anchor"].append(1e6 * cpu / (a.n * rounds if kind == "rps" else writes))
            req["anchor"].append(1e6 * SPLIT[-1] / (a.n * rounds))
            whole["anchor"].append(1e6 * cpu / (a.n * rounds))
            per_req["anchor"] = writes / (a.n * rounds)
        if a.only == "anchor":
            continue
        cpu, writes = asyncio.run(llmsim_run(kind, a.n, tokens, rounds, a.profile))
        a.profile = False
        res["llmsim"].append(1e6 * cpu / (a.n * rounds if kind == "rps" else writes))
        req["llmsim"].append(1e6 * SPLIT[-1] / (a.n * rounds))
        whole["llmsim"].append(1e6 * cpu / (a.n * rounds))
        per_req["llmsim"] = writes / (a.n * rounds)
    if a.only:
        return
    med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
    rq = {k: sorted(v)[len(v) // 2] for k, v in req.items()}
    print(f"{kind}: {a.n} connections x {rounds} requests"
          + ("" if kind == "rps" else f" x {tokens} tokens"))
    extra = {k: "" if kind == "rps" else f"   (of which request in, head out: {rq[k]:.1f} us"
             " per request)" for k in rq}
    print(f"  anchor  {med['anchor']:7.2f} us per {unit}{extra['anchor']}")
    print(f"  llmsim  {med['llmsim']:7.2f} us per {unit}   ({med['llmsim'] / med['anchor']:.2f}x)"
          f"{extra['llmsim']}")
    if kind != "rps":
        wh = {k: sorted(v)[len(v) // 2] for k, v in whole.items()}
        print(f"  a whole request: anchor {wh['anchor']:.1f} us ({per_req['anchor']:.1f} writes), "
              f"llmsim {wh['llmsim']:.1f} us ({per_req['llmsim']:.1f} writes), "
              f"{wh['llmsim'] / wh['anchor']:.2f}x")


if __name__ == "__main__":
    main()
