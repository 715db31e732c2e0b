"""The ceiling for non-streaming throughput: a bare asyncio + h11 server that answers every
request with one fixed JSON body (a chat completion of the same shape and size llmsim returns),
with the same TCP_NODELAY, Date and keep-alive handling. Everything llmsim does on top of this
(routing, validation, simulation, ids, orjson) is its overhead.

    python bench/baseline_h11.py [--port 0] [--uvloop]   # prints "listening on http://..."
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from email.utils import formatdate

import h11

BODY = (b'{"id":"chatcmpl-0123456789abcdefghijklmn","object":"chat.completion","created":1700000000,'
        b'"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":'
        b'"Hello there, this is a fixed answer from the bare h11 baseline server.","refusal":null,'
        b'"annotations":[]},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":9,'
        b'"completion_tokens":16,"total_tokens":25},"service_tier":"default",'
        b'"system_fingerprint":"fp_llmsim"}')


class Proto(asyncio.Protocol):
    """One h11 connection; answers each complete request with BODY."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # type: ignore[override]
        self.t = transport
        self.conn = h11.Connection(h11.SERVER)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        conn = self.conn
        conn.receive_data(data)
        while True:
            try:
                ev = conn.next_event()
            except h11.RemoteProtocolError:
                self.t.close()
                return
            if ev is h11.NEED_DATA or ev is h11.PAUSED:
                return
            if type(ev) is h11.EndOfMessage:
                out = conn.send(h11.Response(status_code=200, headers=[
                    (b"date", formatdate(time.time(), usegmt=True).encode()),
                    (b"server", b"baseline"), (b"content-type", b"application/json"),
                    (b"content-length", str(len(BODY)).encode())]))
                out += conn.send(h11.Data(data=BODY))
                out += conn.send(h11.EndOfMessage())
                self.t.write(out)
                if conn.our_state is h11.MUST_CLOSE:
                    self.t.close()
                    return
                conn.start_next_cycle()
            elif type(ev) is h11.ConnectionClosed:
                self.t.close()
                return


async def main(port: int) -> None:
    loop = asyncio.get_running_loop()
    srv = await loop.create_server(Proto, "127.0.0.1", port, backlog=4096)
    print(f"listening on http://127.0.0.1:{srv.sockets[0].getsockname()[1]}", flush=True)
    await srv.serve_forever()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--uvloop", action="store_true")
    a = ap.parse_args()
    try:
        if a.uvloop:
            import uvloop

            uvloop.run(main(a.port))
        else:
            asyncio.run(main(a.port))
    except KeyboardInterrupt:
        sys.exit(0)
