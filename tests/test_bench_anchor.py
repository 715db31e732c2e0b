"""The benchmark's same-wire anchor (``bench/baseline_h11.py``) sends what llmsim sends.

Its Responses CPU ratio is only a measure of llmsim's own cost if the bare server writes the
same events: the same types in the same order, the same fields, about the same bytes, and
the same writes. Both servers answer the benchmark's request (``bench/run.py``), over SSE
(read by the official SDK with strict validation) and over WebSocket (a raw wsproto client,
each frame validated against the SDK's event union)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from .test_websocket_raw import RawWS

ROOT = Path(__file__).resolve().parent.parent
TOKENS = 24
BODY = {"model": "gpt-4o-mini", "input": "Hi", "max_output_tokens": TOKENS}


@pytest.fixture
def anchor() -> Iterator[str]:
    """The anchor as bench/run.py starts it (short pacing), on a free port; stopped after."""
    p = subprocess.Popen([sys.executable, str(ROOT / "bench" / "baseline_h11.py"), "--port",
                          "0", "--ttft-ms", "1", "--itl-ms", "1"], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()  # (the anchor prints it once listening)
        m = re.search(r"http://127\.0\.0\.1:\d+", line)
        assert m, line
        yield m.group(0)
    finally:
        p.kill()
        p.wait(10)


def _shape(ev: dict[str, Any]) -> Any:
    """An event's fields, nested, without the values (ids, times and text differ)."""
    if isinstance(ev, dict):
        return {k: _shape(v) for k, v in ev.items()}
    if isinstance(ev, list):
        return [_shape(v) for v in ev]
    return type(ev).__name__


def _sse(url: str) -> tuple[list[dict[str, Any]], int]:
    """One stream's events and body bytes (its chunked framing included), read raw; and the
    same request read by the SDK, which validates every event strictly."""
    with openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0,
                       _strict_response_validation=True) as c:
        assert list(c.responses.create(**BODY, stream=True))[-1].type == "response.incomplete"
    port = int(url.rsplit(":", 1)[1])
    body = json.dumps({**BODY, "stream": True}).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /v1/responses HTTP/1.1\r\nhost: x\r\ncontent-type: application/json"
                  b"\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        raw = b""
        while not raw.endswith(b"\r\n0\r\n\r\n"):
            chunk = s.recv(65536)
            assert chunk
            raw += chunk
    payload = raw.partition(b"\r\n\r\n")[2]
    events = [json.loads(line[6:]) for line in payload.split(b"\n")
              if line.startswith(b"data: ")]
    return events, len(payload)


def test_the_anchor_sends_llmsims_responses_sse_events(anchor: str, make_server: Any) -> None:
    srv = make_server()
    mine, mine_bytes = _sse(srv.url)
    bare, bare_bytes = _sse(anchor)
    assert [e["type"] for e in bare] == [e["type"] for e in mine]
    assert sum(e["type"] == "response.output_text.delta" for e in bare) == TOKENS
    assert [_shape(e) for e in bare] == [_shape(e) for e in mine]
    assert [e["sequence_number"] for e in bare] == list(range(len(mine)))
    assert abs(bare_bytes - mine_bytes) <= 0.1 * mine_bytes  # (the words differ)


def test_the_anchor_sends_llmsims_responses_websocket_events(anchor: str,
                                                             make_server: Any) -> None:
    srv = make_server()
    got = []
    for url in (srv.url, anchor):
        ws = RawWS(url)
        assert ws.status == 101
        frames = []
        for _ in range(2):  # two creates on one connection: the anchor serves them in turn
            ws.send_json({"type": "response.create", **BODY})
            frames.append(ws.until_terminal())
        ws.sock.close()
        got.append(frames)
    mine, bare = got
    for m, b in zip(mine, bare, strict=True):
        assert [e["type"] for e in b] == [e["type"] for e in m]
        assert b[-1]["type"] == "response.incomplete"
        assert [_shape(e) for e in b] == [_shape(e) for e in m]
        size = len(json.dumps(m))
        assert abs(len(json.dumps(b)) - size) <= 0.1 * size
