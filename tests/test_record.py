"""Recording (issue 34): HTTPS upstreams with a private CA, streaming through live, bounded
and cancellable upstream exchanges, errors in each family's envelope, cassettes that keep no
credential, record modes, routes. Every upstream here is on 127.0.0.1."""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path
from typing import Any

import anthropic
import h11
import openai
import orjson
import pytest

from llmsim.api.cassette import SSEFramer

from . import rawhttp
from .upstreams import FakeUpstream, TLSFront, chunk, head, make_ca, until

MSGS = [{"role": "user", "content": "Tell me something"}]
CHAT = {"model": "gpt-4o", "messages": MSGS, "max_tokens": 4}


def _files(d: Path) -> list[Path]:
    return sorted(d.glob("*.json"))


def _oai(srv: Any, key: str = "sk-SECRET-123", **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, **kw)


# ------------------------------------------------------------------------------------------
# HTTPS, SNI, keep-alive; every family through its SDK; replay byte-identical
# ------------------------------------------------------------------------------------------

def test_record_https_provider_with_private_ca_then_replay(make_server: Any,
                                                           tmp_path: Path) -> None:
    ca, cert, key = make_ca(tmp_path)
    provider = make_server(latency="realistic", ttft_ms=10, itl_ms=3, seed=5,
                           max_tokens_mode="cap")
    front = TLSFront(cert, key, int(provider.url.rsplit(":", 1)[1]))
    cas = tmp_path / "cassettes"
    try:
        # without the CA the certificate is refused: a 502 naming the upstream, no traceback
        bare = make_server(record_upstream=front.url, cassettes=str(cas))
        r = rawhttp.request(bare.url, "POST", "/v1/chat/completions", CHAT)
        assert r.status == 502 and r.json()["error"]["code"] == "upstream_error"
        assert "CERTIFICATE" in r.json()["error"]["message"].upper()
        rec = make_server(record_upstream=front.url, cassettes=str(cas),
                          upstream_ca=str(ca))
        c = _oai(rec)
        a = c.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=8)
        chunks = list(c.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=6,
                                                stream=True))
        with c.responses.stream(model="gpt-4o", input="hi", max_output_tokens=16) as s:
            resp = s.get_final_response()
        emb = c.embeddings.create(model="text-embedding-3-small", input="abc")
        ac = anthropic.Anthropic(base_url=rec.url + "/anthropic", api_key="sk-ant-SECRET",
                                 max_retries=0)
        m = ac.messages.create(model="claude-sonnet-5-5", max_tokens=8, messages=MSGS)
        with ac.messages.stream(model="claude-sonnet-5-5", max_tokens=8,
                                messages=MSGS) as ms:
            mfinal = ms.get_final_message()
        assert front.sni and set(front.sni) == {"localhost"}  # SNI sent
        assert front.accepted < 6  # six exchanges over kept-alive connections
        files = _files(cas)
        assert len(files) == 6
        names = {f.name.rsplit("-", 1)[0] for f in files}
        assert "chat.completions-gpt-4o-stream" in names
        assert "chat.completions-gpt-4o-json" in names
        assert "anthropic.messages-claude-sonnet-5-5-stream" in names
        for f in files:
            assert "SECRET" not in f.read_text()
    finally:
        front.close()
    # replay offline (the provider gone): the very same answers
    provider.stop()
    player = make_server(replay=str(cas), replay_speed=0)
    p = _oai(player)
    assert p.chat.completions.create(model="gpt-4o", messages=MSGS,
                                     max_tokens=8).model_dump() == a.model_dump()
    again = list(p.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=6,
                                           stream=True))
    assert [x.model_dump() for x in again] == [x.model_dump() for x in chunks]
    with p.responses.stream(model="gpt-4o", input="hi", max_output_tokens=16) as s:
        assert s.get_final_response().model_dump() == resp.model_dump()
    assert p.embeddings.create(model="text-embedding-3-small",
                               input="abc").model_dump() == emb.model_dump()
    pa = anthropic.Anthropic(base_url=player.url + "/anthropic", api_key="x", max_retries=0)
    assert pa.messages.create(model="claude-sonnet-5-5", max_tokens=8,
                              messages=MSGS).model_dump() == m.model_dump()
    with pa.messages.stream(model="claude-sonnet-5-5", max_tokens=8, messages=MSGS) as ms:
        assert ms.get_final_message().model_dump() == mfinal.model_dump()


def test_raw_replay_is_byte_identical(make_server: Any, tmp_path: Path) -> None:
    provider = make_server(seed=9)
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path))
    body = {**CHAT, "stream": True}
    first = rawhttp.request(rec.url, "POST", "/v1/chat/completions", body)
    player = make_server(replay=str(tmp_path), replay_speed=0)
    again = rawhttp.request(player.url, "POST", "/v1/chat/completions", body)
    assert first.status == again.status == 200 and first.body == again.body


# ------------------------------------------------------------------------------------------
# Stream-through: the client sees each frame when the upstream sends it
# ------------------------------------------------------------------------------------------

def test_stream_reaches_the_client_live_while_recording(make_server: Any,
                                                        tmp_path: Path) -> None:
    seen_first = threading.Event()

    def handler(s: socket.socket, req: h11.Request, body: bytes) -> None:
        s.sendall(head(200, [("content-type", "text/event-stream"),
                             ("transfer-encoding", "chunked")]))
        s.sendall(chunk(b'data: {"n":1}\n\n'))
        # the second frame only once the client has the first: a recorder that waits for
        # the whole answer never gets there (the test's read would time out)
        seen_first.wait(10)
        s.sendall(chunk(b'data: {"n":2}\n\n') + chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")

    up = FakeUpstream(handler)
    try:
        rec = make_server(record_upstream=up.url, cassettes=str(tmp_path))
        sock = rawhttp.connect(rec.url)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/json\r\ncontent-length: %d\r\n\r\n%s"
                     % (len(orjson.dumps({**CHAT, "stream": True})),
                        orjson.dumps({**CHAT, "stream": True})))
        got = b""
        while b'{"n":1}' not in got:
            data = sock.recv(65536)
            assert data, "closed before the first frame"
            got += data
        assert b'{"n":2}' not in got
        seen_first.set()
        while b"0\r\n\r\n" not in got:
            got += sock.recv(65536)
        sock.close()
        until(lambda: len(_files(tmp_path)) == 1)
        events = json.loads(_files(tmp_path)[0].read_text())["response"]["events"]
        assert [f for _, f in events] == ['data: {"n":1}\n\n', 'data: {"n":2}\n\n',
                                          "data: [DONE]\n\n"]
        assert events[1][0] >= events[0][0]  # the upstream's timing, kept
    finally:
        up.close()


def test_framing_is_incremental() -> None:
    """Each byte is scanned a bounded number of times however the answer is cut (before: the
    buffer was re-scanned per piece, quadratic: 32 MiB without a separator held the loop 12 s)."""
    f = SSEFramer()
    scanned = 0
    for _ in range(200_000):
        before = f._scan
        assert f.feed(b"x") == []
        scanned += f._scan - before + 1
    assert scanned <= 2 * 200_000
    out = f.feed(b"\r")
    out += f.feed(b"\n\r\ndata: 2\n\ndata: 3")
    assert out == [b"x" * 200_000 + b"\n\n", b"data: 2\n\n"]
    assert f.flush() == b"data: 3"
    # \r\n split across pieces, and many frames in one piece
    g = SSEFramer()
    assert g.feed(b"data: a\r") == [] and g.feed(b"\n\r") == []
    assert g.feed(b"\ndata: b\n\ndata: c\n\n") == [b"data: a\n\n", b"data: b\n\n", b"data: c\n\n"]


def test_large_unseparated_stream_never_stalls_the_loop(make_server: Any,
                                                        tmp_path: Path) -> None:
    """8 MiB without a frame separator in 4 KiB pieces: one frame, and no pass of the
    server's loop took 100 ms of CPU (its own measurement; before: 1.1 s at 8 MiB, 11.9 s
    at 32 MiB)."""
    from .loopstalls import STALL_BUDGET_CPU_S, WATCH_MS, loop_report, stalls_since

    blob = b"data: " + b"y" * (8 * 1024 * 1024)

    def handler(s: socket.socket, req: h11.Request, body: bytes) -> None:
        s.sendall(head(200, [("content-type", "text/event-stream"),
                             ("content-length", str(len(blob) + 2))]))
        for i in range(0, len(blob), 4096):
            s.sendall(blob[i:i + 4096])
        s.sendall(b"\n\n")

    up = FakeUpstream(handler)
    try:
        rec = make_server(record_upstream=up.url, cassettes=str(tmp_path),
                          loop_watch_ms=WATCH_MS)
        since = loop_report(rec.url)["now"]
        r = rawhttp.request(rec.url, "POST", "/v1/chat/completions", {**CHAT, "stream": True})
        assert r.status == 200 and r.body == blob + b"\n\n"
        stalls = stalls_since(rec.url, since)
        assert max(stalls, default=0.0) < STALL_BUDGET_CPU_S, stalls
        events = json.loads(_files(tmp_path)[0].read_text())["response"]["events"]
        assert len(events) == 1
    finally:
        up.close()


# ------------------------------------------------------------------------------------------
# Held sockets: deadlines, and the upstream cancelled when the client leaves
# ------------------------------------------------------------------------------------------

def _silent(s: socket.socket, req: h11.Request, body: bytes) -> None:
    """Never answers (the connection stays open until the recorder closes it)."""


def _head_then_silent(s: socket.socket, req: h11.Request, body: bytes) -> None:
    s.sendall(head(200, [("content-type", "text/event-stream"),
                         ("transfer-encoding", "chunked")]) + chunk(b"data: {}\n\n"))


def test_silent_upstream_is_a_504_after_the_read_deadline(make_server: Any,
                                                          tmp_path: Path) -> None:
    up = FakeUpstream(_silent)
    try:
        rec = make_server(record_upstream=up.url, cassettes=str(tmp_path),
                          upstream_read_timeout_s=0.3)
        r = rawhttp.request(rec.url, "POST", "/v1/chat/completions", CHAT)
        assert r.status == 504 and r.json()["error"]["code"] == "upstream_timeout"
        assert "--upstream-read-timeout-s" in r.json()["error"]["message"]
        r = rawhttp.request(rec.url, "POST", "/anthropic/v1/messages",
                            {"model": "claude-sonnet-5-5", "max_tokens": 4, "messages": MSGS})
        assert r.status == 504 and r.json()["type"] == "error"
        # total deadline, with reads that each come in time
        rec2 = make_server(record_upstream=up.url, cassettes=str(tmp_path),
                           upstream_read_timeout_s=30, upstream_timeout_s=0.3)
        r = rawhttp.request(rec2.url, "POST", "/v1/chat/completions", CHAT)
        assert r.status == 504 and "--upstream-timeout-s" in r.json()["error"]["message"]
        until(lambda: up.closed_by_peer == up.opened)  # nothing held
        assert _files(tmp_path) == []
    finally:
        up.close()


@pytest.mark.parametrize("handler", [_silent, _head_then_silent], ids=["json", "stream"])
def test_client_leaving_cancels_the_upstream_request(make_server: Any, tmp_path: Path,
                                                     handler: Any) -> None:
    up = FakeUpstream(handler)
    try:
        rec = make_server(record_upstream=up.url, cassettes=str(tmp_path))
        body = orjson.dumps({**CHAT, "stream": handler is _head_then_silent})
        socks = []
        for _ in range(20):
            s = rawhttp.connect(rec.url)
            s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                      b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            socks.append(s)
        until(lambda: up.opened == 20)
        for s in socks:
            s.close()
        # (before: every upstream connection and request gauge held for 600 s)
        until(lambda: up.closed_by_peer == 20)
        until(lambda: rawhttp.request(rec.url, "GET", "/llmsim/stats").json()["active"] == {
            "connections": 1, "requests": 1, "streams": 0, "websockets": 0})
        assert _files(tmp_path) == []  # a recording cut short is not a cassette
    finally:
        up.close()


# ------------------------------------------------------------------------------------------
# Errors: 502/504 in the family's envelope; upstream errors passed through, saved if asked
# ------------------------------------------------------------------------------------------

def _closed_port() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}"


def test_unreachable_upstream_is_a_502_in_each_family(make_server: Any,
                                                      tmp_path: Path) -> None:
    rec = make_server(record_upstream=_closed_port(), cassettes=str(tmp_path))
    with pytest.raises(openai.APIStatusError) as e:
        _oai(rec).chat.completions.create(model="gpt-4o", messages=MSGS)
    assert e.value.status_code == 502
    assert e.value.body["code"] == "upstream_error"  # type: ignore[index]
    assert "ConnectionRefusedError" in e.value.message
    ac = anthropic.Anthropic(base_url=rec.url + "/anthropic", api_key="x", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as ea:
        ac.messages.create(model="claude-sonnet-5-5", max_tokens=4, messages=MSGS)
    assert ea.value.status_code == 502
    assert ea.value.body["type"] == "error"  # type: ignore[index]
    assert ea.value.body["error"]["type"] == "api_error"  # type: ignore[index]


def test_upstream_errors_pass_through_and_are_saved_only_if_asked(make_server: Any,
                                                                  tmp_path: Path) -> None:
    provider = make_server(api_key=("sk-good",))
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path / "a"))
    with pytest.raises(openai.AuthenticationError):
        _oai(rec, key="sk-bad").chat.completions.create(model="gpt-4o", messages=MSGS)
    assert _files(tmp_path / "a") == []
    _oai(rec, key="sk-good").chat.completions.create(model="gpt-4o", messages=MSGS)
    assert len(_files(tmp_path / "a")) == 1
    rec2 = make_server(record_upstream=provider.url, cassettes=str(tmp_path / "b"),
                       record_errors=True)
    with pytest.raises(openai.AuthenticationError):
        _oai(rec2, key="sk-bad").chat.completions.create(model="gpt-4o", messages=MSGS)
    saved = _files(tmp_path / "b")
    assert len(saved) == 1 and json.loads(saved[0].read_text())["response"]["status"] == 401


def test_record_byte_bounds(make_server: Any, tmp_path: Path) -> None:
    provider = make_server()
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path / "a"),
                      record_max_bytes=1024)
    r = rawhttp.request(rec.url, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 400})
    assert r.status == 502 and "--record-max-bytes" in r.json()["error"]["message"]
    r = rawhttp.request(rec.url, "POST", "/v1/chat/completions",
                        {**CHAT, "max_tokens": 400, "stream": True})
    assert r.status == 200 and b'"error"' in r.body  # cut mid-stream: an error frame
    assert _files(tmp_path / "a") == []
    rec2 = make_server(record_upstream=provider.url, cassettes=str(tmp_path / "b"),
                       record_budget_bytes=1)
    assert rawhttp.request(rec2.url, "POST", "/v1/chat/completions", CHAT).status == 200
    r = rawhttp.request(rec2.url, "POST", "/v1/chat/completions", {**CHAT, "max_tokens": 5})
    assert r.status == 502 and r.json()["error"]["code"] == "record_budget_exhausted"


# ------------------------------------------------------------------------------------------
# Credentials: forwarded, never stored
# ------------------------------------------------------------------------------------------

CREDENTIALS = [
    "authorization", "proxy-authorization", "api-key", "x-api-key", "cookie",
    "openai-organization", "openai-project", "x-goog-api-key", "x-amz-security-token",
    "x-amz-date", "x-auth-token", "x-access-token", "x-session-token", "x-csrf-token",
    "x-client-secret", "x-ms-token-aad-id-token", "ocp-apim-subscription-key",
    "x-secret", "x-forwarded-authorization", "x-upstream-key"]


def test_no_credential_header_reaches_a_cassette(make_server: Any, tmp_path: Path) -> None:
    up = FakeUpstream(lambda s, req, body: s.sendall(
        head(200, [("content-type", "application/json"), ("content-length", "2"),
                   ("set-cookie", "session=SECRETCOOKIE"), ("openai-organization",
                                                            "SECRETORG"),
                   ("x-request-id", "req_1")]) + b"{}"))
    try:
        rec = make_server(record_upstream=up.url, cassettes=str(tmp_path))
        hs = [(h, f"SECRET-{i}-value") for i, h in enumerate(CREDENTIALS)]
        r = rawhttp.request(rec.url, "POST", "/v1/chat/completions", CHAT,
                            headers=[("content-type", "application/json"), *hs])
        assert r.status == 200
        sent = {k.decode().lower(): v.decode() for k, v in up.requests[0][0].headers}
        for h, v in hs:  # forwarded to the provider ...
            assert sent[h] == v
        text = "".join(f.read_text() for f in _files(tmp_path))
        assert text and "SECRET" not in text  # ... never written
        assert '"x-request-id": "req_1"' in text  # (an allowed header is kept)
    finally:
        up.close()


# ------------------------------------------------------------------------------------------
# Modes, routes, ignored fields
# ------------------------------------------------------------------------------------------

def test_record_modes(make_server: Any, tmp_path: Path) -> None:
    provider = make_server(seed=1)
    d = tmp_path / "c"

    def calls() -> int:
        s = rawhttp.request(provider.url, "GET", "/llmsim/stats").json()
        return int(sum(s["requests_by_status"].values()))

    once = make_server(record_upstream=provider.url, cassettes=str(d), record_mode="once")
    assert rawhttp.request(once.url, "POST", "/v1/chat/completions", CHAT).status == 200
    assert len(_files(d)) == 1  # an empty directory: once records
    n = calls()
    # started again on a directory with cassettes: once replays, and a new request is a 404
    once2 = make_server(record_upstream=provider.url, cassettes=str(d), record_mode="once")
    assert rawhttp.request(once2.url, "POST", "/v1/chat/completions", CHAT).status == 200
    other = {**CHAT, "max_tokens": 3}
    r = rawhttp.request(once2.url, "POST", "/v1/chat/completions", other)
    assert r.status == 404 and r.json()["error"]["code"] == "cassette_not_found"
    assert "max_tokens (3 here, 4 there)" in r.json()["error"]["message"]
    new = make_server(record_upstream=provider.url, cassettes=str(d),
                      record_mode="new_episodes")
    assert rawhttp.request(new.url, "POST", "/v1/chat/completions", CHAT).status == 200
    assert calls() == n  # replayed, the provider not asked
    assert rawhttp.request(new.url, "POST", "/v1/chat/completions", other).status == 200
    assert calls() == n + 1 and len(_files(d)) == 2
    assert rawhttp.request(new.url, "POST", "/v1/chat/completions", other).status == 200
    assert calls() == n + 1  # recorded once, then replayed
    allm = make_server(record_upstream=provider.url, cassettes=str(d), record_mode="all")
    assert rawhttp.request(allm.url, "POST", "/v1/chat/completions", CHAT).status == 200
    assert calls() == n + 2
    none = make_server(replay=str(d), record_mode="none")
    assert rawhttp.request(none.url, "POST", "/v1/chat/completions", CHAT).status == 200


def test_routes_send_each_family_to_its_upstream(make_server: Any, tmp_path: Path) -> None:
    oai = make_server(text="fixed", fixed_text="from openai")
    ant = make_server(text="fixed", fixed_text="from anthropic")
    emb = FakeUpstream(lambda s, req, body: s.sendall(
        head(200, [("content-type", "application/json"), ("content-length", "17")])
        + b'{"object":"list"}'))
    try:
        rec = make_server(record_upstream=oai.url, cassettes=str(tmp_path),
                          record_route=(f"anthropic={ant.url}", f"/v1/embeddings={emb.url}"))
        r = rawhttp.request(rec.url, "POST", "/v1/chat/completions", CHAT)
        assert "from openai" in r.json()["choices"][0]["message"]["content"]
        r = rawhttp.request(rec.url, "POST", "/anthropic/v1/messages",
                            {"model": "claude-sonnet-5-5", "max_tokens": 30, "messages": MSGS})
        assert "from anthropic" in r.json()["content"][0]["text"]
        r = rawhttp.request(rec.url, "POST", "/v1/embeddings",
                            {"model": "text-embedding-3-small", "input": "x"})
        assert r.json() == {"object": "list"}
        assert up_path(emb) == "/v1/embeddings"
    finally:
        emb.close()


def up_path(up: FakeUpstream) -> str:
    return up.requests[-1][0].target.decode()


def test_cli_record_takes_routes_and_help_lists_the_options() -> None:
    from llmsim.ops.cli import build_parser

    text = build_parser().format_help()
    for flag in ("--record-mode", "--record-route", "--upstream-ca", "--record-errors",
                 "--upstream-read-timeout-s", "--upstream-timeout-s", "--match-ignore",
                 "--record-max-bytes", "--record-budget-bytes"):
        assert flag in text
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "llmsim", "record", "--upstream",
                          "anthropic=ftp://x"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "record_route" in out.stderr
    out = subprocess.run([sys.executable, "-m", "llmsim", "record", "--upstream",
                          "https://127.0.0.1:9", "--upstream-ca", "/nonexistent.pem"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "upstream_ca" in out.stderr
    assert "Traceback" not in out.stderr


def test_ignored_fields_and_path_as_sent(make_server: Any, tmp_path: Path) -> None:
    provider = make_server()
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path))
    assert rawhttp.request(rec.url, "POST", "/v1/chat/completions",
                           {**CHAT, "temperature": 0.2}).status == 200
    assert rawhttp.request(rec.url, "POST", "/openai/v1/chat/completions",
                           {**CHAT, "temperature": 0.2}).status == 200
    assert len(_files(tmp_path)) == 2  # (before: the second overwrote the first)
    player = make_server(replay=str(tmp_path), replay_speed=0, match_ignore=("temperature",))
    r = rawhttp.request(player.url, "POST", "/v1/chat/completions",
                        {**CHAT, "temperature": 0.9})
    assert r.status == 200


MALFORMED = {
    "not_http": b"garbage\r\n\r\n",
    "status_999": b"HTTP/1.1 999 X\r\ncontent-length: 2\r\n\r\n{}",
    "huge_head": b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * 100_000 + b"\r\n\r\n",
    "bad_chunk": b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nxx\r\n",
    "short_body": b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{}",
    "gzip": b"HTTP/1.1 200 OK\r\ncontent-encoding: gzip\r\ncontent-length: 2\r\n\r\n{}",
    "sse_bad_chunk": b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                     b"transfer-encoding: chunked\r\n\r\n9\r\ndata: 1\n\n\r\nzz\r\n",
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_hostile_upstream_answers_are_502_never_500(make_server: Any, tmp_path: Path,
                                                    case: str) -> None:
    def handler(s: socket.socket, req: h11.Request, body: bytes) -> None:
        s.sendall(MALFORMED[case])
        s.shutdown(socket.SHUT_WR)

    up = FakeUpstream(handler)
    try:
        rec = make_server(record_upstream=up.url, cassettes=str(tmp_path),
                          upstream_read_timeout_s=5)
        stream = case.startswith("sse")
        r = rawhttp.request(rec.url, "POST", "/v1/chat/completions", {**CHAT, "stream": stream})
        if stream:  # the head was passed on: the stream ends with an error event
            assert r.status == 200 and r.body.startswith(b"data: 1\n\n")
            assert r.sse()[-1][1].startswith('{"error"')
        else:
            assert r.status == 502, (r.status, r.body[:200])
            assert r.json()["error"]["code"] == "upstream_error"
        assert _files(tmp_path) == []
        until(lambda: rawhttp.request(rec.url, "GET", "/llmsim/stats").json()["active"] == {
            "connections": 1, "requests": 1, "streams": 0, "websockets": 0})
    finally:
        up.close()


def test_a_kept_alive_connection_closed_by_the_upstream_is_retried_once(
        make_server: Any, tmp_path: Path) -> None:
    served: dict[int, int] = {}

    def handler(s: socket.socket, req: h11.Request, body: bytes) -> None:
        n = served[s.fileno()] = served.get(s.fileno(), 0) + 1
        if n > 1:  # the upstream dropped the idle connection as the request came
            s.shutdown(socket.SHUT_RDWR)
            return
        s.sendall(head(200, [("content-type", "application/json"), ("content-length", "2")])
                  + b"{}")

    up = FakeUpstream(handler)
    try:
        rec = make_server(record_upstream=up.url, cassettes=str(tmp_path))
        for mt in (4, 5):
            r = rawhttp.request(rec.url, "POST", "/v1/chat/completions",
                                {**CHAT, "max_tokens": mt})
            assert r.status == 200, r.body
        assert up.opened == 2 and len(up.requests) == 3  # reused, refused, sent again
    finally:
        up.close()
