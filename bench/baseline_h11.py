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
- Paced Responses (``POST /v1/responses`` with ``"stream": true``, or a ``response.create``
  on a WebSocket upgraded at ``/v1/responses``): the same pacing of the Responses event
  stream llmsim sends for a text answer cut at ``max_output_tokens``, with the same event
  shapes and sizes: ``response.created`` and ``response.in_progress`` at once (with the head),
  the item and content part with the first delta at TTFT, one numbered delta every gap, and
  the last delta with the three ``.done`` events and ``response.incomplete`` (the full
  Response). Each event's JSON is built per event: a delta's token as the chat chunks' is
  (``json.dumps``), the others with orjson, the library llmsim uses;
  over SSE each write is one hand-framed chunk, over WebSocket one hand-framed text frame per
  event (the client's masked frames are parsed by hand; ping, close). This is the same-wire
  anchor of llmsim's Responses streams: the least a server must do to send those bytes.

    python bench/baseline_h11.py [--port 0] [--uvloop] [--ttft-ms 100] [--itl-ms 10]
    # prints "listening on http://..."
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import heapq
import itertools
import json
import socket
import sys
import time
from email.utils import formatdate
from typing import Any

import h11
import orjson

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


# the Responses object as llmsim renders it for `{"model", "input", "max_output_tokens"}`
def response_object(rid: str, created: int, max_out: int, status: str,
                    output: list[dict[str, Any]], text: str,
                    usage: dict[str, Any] | None) -> dict[str, Any]:
    return {"id": rid, "object": "response", "created_at": created, "status": status,
            "completed_at": created if status != "in_progress" else None, "error": None,
            "incomplete_details": ({"reason": "max_output_tokens"}
                                   if status == "incomplete" else None),
            "background": False, "conversation": None, "instructions": None,
            "max_output_tokens": max_out, "max_tool_calls": None, "model": "gpt-4o-mini",
            "parallel_tool_calls": True, "previous_response_id": None,
            "prompt_cache_key": None, "prompt_cache_retention": None,
            "reasoning": {"effort": None, "summary": None}, "safety_identifier": None,
            "service_tier": "default", "store": True, "temperature": 1.0,
            "text": {"format": {"type": "text"}, "verbosity": "medium"},
            "tool_choice": "auto", "tools": [], "top_logprobs": 0, "top_p": 1.0,
            "truncation": "disabled", "user": None, "metadata": {}, "presence_penalty": 0.0,
            "frequency_penalty": 0.0, "output": output, "output_text": text, "usage": usage}


_ids = itertools.count(10**23)


def event(ws: bool, etype: str, data: dict[str, Any]) -> bytes:
    """One Responses event: its JSON (orjson, as llmsim's), SSE-framed unless over
    WebSocket."""
    js = orjson.dumps({"type": etype, **data})
    return js if ws else b"event: %s\ndata: %s\n\n" % (etype.encode(), js)


def ws_frame(payload: bytes) -> bytes:
    n = len(payload)
    if n < 126:
        return bytes((0x81, n)) + payload
    if n < 65536:
        return bytes((0x81, 126)) + n.to_bytes(2, "big") + payload
    return bytes((0x81, 127)) + n.to_bytes(8, "big") + payload


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


class RespStream(Stream):
    """One paced Responses stream (SSE or WebSocket): the events llmsim sends, see the doc."""

    __slots__ = ("ws", "rid", "mid", "created", "seq", "words", "head")

    def __init__(self, proto: Proto, tokens: int, itl: float, ws: bool,
                 head: bytes = b"") -> None:
        super().__init__(proto, tokens, itl)
        self.ws = ws
        self.rid = f"resp_{next(_ids)}"
        self.mid = f"msg_{next(_ids)}"
        self.created = int(time.time())
        self.words: list[str] = []
        self.head = (b'{"type":"response.output_text.delta","item_id":"' + self.mid.encode()
                     + b'","output_index":0,"content_index":0,"delta":')
        obj = response_object(self.rid, self.created, tokens, "in_progress", [], "", None)
        self.seq = 2
        self.send([event(ws, "response.created", {"response": obj, "sequence_number": 0}),
                   event(ws, "response.in_progress", {"response": obj, "sequence_number": 1})],
                  head)

    def send(self, events: list[bytes], head: bytes = b"") -> None:
        if self.ws:
            self.proto.t.write(b"".join([ws_frame(e) for e in events]))
        else:
            payload = b"".join(events)
            self.proto.t.write(b"%b%x\r\n%b\r\n" % (head, len(payload), payload))

    def numbered(self, etype: str, data: dict[str, Any]) -> bytes:
        data["sequence_number"] = self.seq
        self.seq += 1
        return event(self.ws, etype, data)

    def emit(self, when: float) -> float | None:
        if self.dead:
            return None
        j = self.j
        ws, mid = self.ws, self.mid
        events = []
        if j == 0:
            item: dict[str, Any] = {"id": mid, "type": "message", "status": "in_progress",
                                    "content": [],
                    "role": "assistant"}
            events += [self.numbered("response.output_item.added",
                                     {"output_index": 0, "item": item}),
                       self.numbered("response.content_part.added", {
                           "item_id": mid, "output_index": 0, "content_index": 0,
                           "part": {"type": "output_text", "text": "", "annotations": [],
                                    "logprobs": []}})]
        word = WORDS[j % len(WORDS)].decode()
        self.words.append(word)
        js = (self.head + json.dumps(word).encode()
              + b',"logprobs":[],"sequence_number":%d}' % self.seq)
        self.seq += 1
        events.append(js if ws else b"event: response.output_text.delta\ndata: %s\n\n" % js)
        self.j = j = j + 1
        if j >= self.tokens:
            text = "".join(self.words)
            part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": [],
                                    "logprobs": []}
            done = {"id": mid, "type": "message", "status": "incomplete", "content": [part],
                    "role": "assistant"}
            usage = {"input_tokens": 8, "input_tokens_details": {
                "cached_tokens": 0, "cache_write_tokens": 0}, "output_tokens": self.tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": 8 + self.tokens}
            events += [
                self.numbered("response.output_text.done", {
                    "item_id": mid, "output_index": 0, "content_index": 0, "text": text,
                    "logprobs": []}),
                self.numbered("response.content_part.done", {
                    "item_id": mid, "output_index": 0, "content_index": 0, "part": part}),
                self.numbered("response.output_item.done", {"output_index": 0, "item": done}),
                self.numbered("response.incomplete", {"response": response_object(
                    self.rid, self.created, self.tokens, "incomplete", [done], text, usage)})]
        self.send(events)
        if j >= self.tokens:
            self.proto.end_stream()
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
        self.target = b""
        self.key: bytes | None = None  # an upgrade request's Sec-WebSocket-Key
        self.ws: bytearray | None = None  # after the upgrade: the bytes not yet parsed
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.stream is not None:
            self.stream.dead = True

    def data_received(self, data: bytes) -> None:
        if self.ws is not None:
            self.ws += data
            self.ws_frames()
            return
        self.conn.receive_data(data)
        self.process()

    def upgrade(self, key: bytes) -> None:
        accept = base64.b64encode(hashlib.sha1(
            key + b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11").digest())
        self.t.write(self.conn.send(h11.InformationalResponse(status_code=101, headers=[
            (b"upgrade", b"websocket"), (b"connection", b"Upgrade"),
            (b"sec-websocket-accept", accept)])))
        self.ws = bytearray(self.conn.trailing_data[0])
        self.ws_frames()

    def ws_frames(self) -> None:
        """Parse the client's masked frames: a text frame is a ``response.create``."""
        buf = self.ws
        while buf is not None and len(buf) >= 2 and self.stream is None:
            op, n, i = buf[0] & 0x0F, buf[1] & 0x7F, 2
            if n == 126:
                n, i = int.from_bytes(buf[2:4], "big"), 4
            elif n == 127:
                n, i = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < i + 4 + n:
                return
            mask = bytes(buf[i:i + 4]) * (n // 4 + 1)
            payload = (int.from_bytes(buf[i + 4:i + 4 + n], "big")
                       ^ int.from_bytes(mask[:n], "big")).to_bytes(n, "big")
            del buf[:i + 4 + n]
            if op == 1:
                req = json.loads(payload)
                self.stream = s = RespStream(self, max(1, int(req.get("max_output_tokens")
                                                              or 16)), self.itl, True)
                self.pacer.push(self.pacer.loop.time() + self.ttft, s)
            elif op == 9:
                self.t.write(bytes((0x8A, n)) + payload)
            elif op == 8:
                self.t.write(b"\x88\x02\x03\xe8")
                self.t.close()
                self.ws = None

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
            if type(ev) is h11.Request:
                self.target = ev.target  # type: ignore[union-attr]
                self.key = dict(ev.headers).get(b"sec-websocket-key")  # type: ignore[union-attr]
            elif type(ev) is h11.Data:
                self.body.append(ev.data)  # type: ignore[union-attr]
            elif type(ev) is h11.EndOfMessage:
                body = b"".join(self.body)
                self.body = []
                if self.key is not None:
                    self.upgrade(self.key)
                    return
                if b'"stream"' in body and json.loads(body).get("stream") is True:
                    req = json.loads(body)
                    if self.target.startswith(b"/v1/responses"):
                        self.start_stream(int(req.get("max_output_tokens") or 16), True)
                    else:
                        self.start_stream(int(req.get("max_tokens") or 16))
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

    def start_stream(self, tokens: int, responses: bool = False) -> None:
        head = self.conn.send(h11.Response(status_code=200, headers=[
            (b"date", formatdate(time.time(), usegmt=True).encode()), *SSE_HEADERS]))
        s: Stream
        if responses:  # (the head goes out with the events due at once, as llmsim's does)
            self.stream = s = RespStream(self, max(1, tokens), self.itl, False, head)
        else:
            self.t.write(head)
            self.stream = s = Stream(self, max(1, tokens), self.itl)
        self.pacer.push(self.pacer.loop.time() + self.ttft, s)

    def end_stream(self) -> None:
        self.stream = None
        if self.ws is not None:  # the next response.create, if already read
            self.ws_frames()
            return
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
