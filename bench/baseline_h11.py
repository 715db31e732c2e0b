"""The anchors llmsim is measured against: a bare asyncio + h11 server with the same
TCP_NODELAY, Date and keep-alive handling, doing the least a server must do.

- Non-streaming: every request is answered with one fixed JSON body (a chat completion of the
  same shape and size llmsim returns). Everything llmsim does on top of this (routing,
  validation, simulation, ids, orjson) is its overhead.
- Paced SSE (a request whose body has ``"stream": true``): ``max_tokens`` complete
  ``chat.completion.chunk`` events of the same shape and size as llmsim's, the first (with the
  role chunk) at ``--ttft-ms`` after the request, then one every ``--itl-ms``, on absolute
  deadlines (send time + TTFT + j × gap) kept in ONE shared heap that drives ONE loop timer;
  every due event is one ``transport.write`` of a hand-framed chunk (no coalescing of events
  due at different instants), then the finish chunk, ``data: [DONE]`` and the end of the body
  through h11. This is the cheapest correct way to pace many streams in asyncio: llmsim's
  streaming cost and timing error are measured against it.

    python bench/baseline_h11.py [--port 0] [--uvloop] [--ttft-ms 100] [--itl-ms 10]
    # prints "listening on http://..."
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import socket
import sys
import time
from email.utils import formatdate
from typing import Any

import h11

BODY = (b'{"id":"chatcmpl-0123456789abcdefghijklmn","object":"chat.completion","created":1700000000,'
        b'"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":'
        b'"Hello there, this is a fixed answer from the bare h11 baseline server.","refusal":null,'
        b'"annotations":[]},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":9,'
        b'"completion_tokens":16,"total_tokens":25},"service_tier":"default",'
        b'"system_fingerprint":"fp_llmsim"}')


# the same words and chunk shape llmsim streams (id, created, model, tier, fingerprint)
WORDS = [(" " + w).encode() for w in (
    "such research known includes case model answer simple token stream value result "
    "system event number reason time first second point").split()]
CHUNK_HEAD = (b'data: {"id":"chatcmpl-9tJx4AeZP5YkjFH90GBm3PbE","object":"chat.completion.chunk",'
              b'"created":1795520651,"model":"gpt-4o-mini","service_tier":"default",'
              b'"system_fingerprint":"fp_llmsim","choices":[{"index":0,"delta":')
ROLE = CHUNK_HEAD + b'{"role":"assistant","content":"","refusal":null},"logprobs":null,' \
    b'"finish_reason":null}]}\n\n'
FINISH = CHUNK_HEAD + b'{},"logprobs":null,"finish_reason":"length"}]}\n\n' + b"data: [DONE]\n\n"
SSE_HEADERS = [(b"server", b"baseline"), (b"content-type", b"text/event-stream; charset=utf-8"),
               (b"cache-control", b"no-cache"), (b"transfer-encoding", b"chunked")]


def token_event(j: int) -> bytes:
    return (CHUNK_HEAD + b'{"content":' + json.dumps(WORDS[j % len(WORDS)].decode()).encode()
            + b'},"logprobs":null,"finish_reason":null}]}\n\n')


class Pacer:
    """One heap of absolute deadlines for every stream of the process, driving one
    ``loop.call_at`` armed for the earliest (re-armed only when an earlier one arrives)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.heap: list[tuple[float, int, Stream]] = []
        self.n = 0
        self.armed = float("inf")
        self.handle: asyncio.TimerHandle | None = None

    def push(self, when: float, s: Stream) -> None:
        self.n += 1
        heapq.heappush(self.heap, (when, self.n, s))
        if when < self.armed:
            if self.handle is not None:
                self.handle.cancel()
            self.armed = when
            self.handle = self.loop.call_at(when, self.fire)

    def fire(self) -> None:
        self.handle = None
        self.armed = float("inf")
        heap = self.heap
        now = self.loop.time()
        due: list[tuple[float, Stream]] = []
        # (+1 ns: deadlines on uvloop's whole-millisecond ticks can come out a float
        # rounding after the tick; compared exactly, the timer (re-armed for a delay libuv
        # rounds to 0 ms) fires again and again until the next tick: a busy-spin)
        while heap and heap[0][0] <= now + 1e-9:
            when, _, s = heapq.heappop(heap)
            due.append((when, s))
        for when, s in due:  # each due event: one write; its next deadline goes back in
            nxt = s.emit(when)
            if nxt is not None:
                self.n += 1
                heapq.heappush(heap, (nxt, self.n, s))
        if heap:
            self.armed = heap[0][0]
            self.handle = self.loop.call_at(self.armed, self.fire)


class Stream:
    """One paced SSE body: event j is due at start + TTFT + j × gap."""

    __slots__ = ("proto", "j", "tokens", "itl", "dead")

    def __init__(self, proto: Proto, tokens: int, itl: float) -> None:
        self.proto, self.j, self.tokens, self.itl, self.dead = proto, 0, tokens, itl, False

    def emit(self, when: float) -> float | None:
        p = self.proto
        if self.dead:
            return None
        j = self.j
        payload = token_event(j)
        if j == 0:
            payload = ROLE + payload
        self.j = j = j + 1
        if j >= self.tokens:
            payload += FINISH
        p.t.write(b"%x\r\n%b\r\n" % (len(payload), payload))
        if j >= self.tokens:
            p.end_stream()
            return None
        return when + self.itl


class Proto(asyncio.Protocol):
    """One h11 connection; answers each complete request with BODY, or a paced SSE stream."""

    pacer: Pacer
    ttft = 0.1
    itl = 0.01

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        self.t: Any = transport
        self.conn = h11.Connection(h11.SERVER)
        self.body: list[bytes] = []
        self.stream: Stream | None = None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.stream.dead = True

    def data_received(self, data: bytes) -> None:
        self.conn.receive_data(data)
        self.process()

    def process(self) -> None:
        conn = self.conn
        while self.stream is None:
            try:
                ev = conn.next_event()
            except h11.RemoteProtocolError:
                self.t.close()
                return
            if ev is h11.NEED_DATA or ev is h11.PAUSED:
                return
            if type(ev) is h11.Data:
                self.body.append(ev.data)  # type: ignore[union-attr]
            elif type(ev) is h11.EndOfMessage:
                body = b"".join(self.body)
                self.body = []
                if b'"stream"' in body and json.loads(body).get("stream") is True:
                    self.start_stream(int(json.loads(body).get("max_tokens") or 16))
                    return
                out = conn.send(h11.Response(status_code=200, headers=[
                    (b"date", formatdate(time.time(), usegmt=True).encode()),
                    (b"server", b"baseline"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(BODY)).encode())]))
                out += conn.send(h11.Data(data=BODY))
                out += conn.send(h11.EndOfMessage())
                self.t.write(out)
                if not self.next_cycle():
                    return
            elif type(ev) is h11.ConnectionClosed:
                self.t.close()
                return

    def next_cycle(self) -> bool:
        if self.conn.our_state is h11.MUST_CLOSE:
            self.t.close()
            return False
        self.conn.start_next_cycle()
        return True

    def start_stream(self, tokens: int) -> None:
        self.t.write(self.conn.send(h11.Response(status_code=200, headers=[
            (b"date", formatdate(time.time(), usegmt=True).encode()), *SSE_HEADERS])))
        self.stream = s = Stream(self, max(1, tokens), self.itl)
        self.pacer.push(self.pacer.loop.time() + self.ttft, s)

    def end_stream(self) -> None:
        self.stream = None
        self.t.write(self.conn.send(h11.EndOfMessage()))
        if self.next_cycle():
            self.process()


async def main(port: int) -> None:
    loop = asyncio.get_running_loop()
    Proto.pacer = Pacer(loop)
    srv = await loop.create_server(Proto, "127.0.0.1", port, backlog=4096)
    print(f"listening on http://127.0.0.1:{srv.sockets[0].getsockname()[1]}", flush=True)
    await srv.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--uvloop", action="store_true")
    ap.add_argument("--ttft-ms", type=float, default=100.0, help="paced SSE: time to first token")
    ap.add_argument("--itl-ms", type=float, default=10.0, help="paced SSE: gap between tokens")
    a = ap.parse_args()
    Proto.ttft, Proto.itl = a.ttft_ms / 1e3, a.itl_ms / 1e3
    try:
        if a.uvloop:
            import uvloop

            uvloop.run(main(a.port))
        else:
            asyncio.run(main(a.port))
    except KeyboardInterrupt:
        sys.exit(0)
