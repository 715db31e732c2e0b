"""Record/replay of uploads and binary answers (issue 33): multipart requests keyed by their
parts (never the boundary, never storing the file), binary answers in base64 replayed
byte-exact, chunked audio chunk by chunk at its recorded pace, image URLs served by the
replaying server. The upstream is a second llmsim on 127.0.0.1; the official SDK drives."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import subprocess
import sys
import threading
import wave
from pathlib import Path
from typing import Any

import httpx
import openai
import orjson
import pytest
from PIL import Image

from llmsim.api.cassette import CassetteError, _answer, load_cassettes
from llmsim.sim import audio as au

from . import rawhttp
from .upstreams import FakeUpstream, chunk, head, until

TEXT = "Recorded voices come back exactly as they were spoken."


def _png(w: int = 32, h: int = 32, color: tuple[int, int, int] = (200, 40, 40)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (w, h), color).save(out, format="PNG")
    return out.getvalue()


def _wav(seconds: float) -> bytes:
    return au.wav(b"\1\0" * int(seconds * au.RATE))


def _oai(srv: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-SECRET-9", max_retries=0)


def _cassettes(d: Path) -> list[dict[str, Any]]:
    return [json.loads(f.read_text()) for f in sorted(d.glob("*.json"))]


def _form(boundary: str, fields: dict[str, str], file: tuple[str, str, bytes]) -> bytes:
    b = boundary.encode()
    out = b""
    for k, v in fields.items():
        out += b"--" + b + b'\r\nContent-Disposition: form-data; name="' + k.encode() + \
            b'"\r\n\r\n' + v.encode() + b"\r\n"
    name, ctype, data = file
    out += (b"--" + b + b'\r\nContent-Disposition: form-data; name="file"; filename="'
            + name.encode() + b'"\r\nContent-Type: ' + ctype.encode() + b"\r\n\r\n" + data
            + b"\r\n--" + b + b"--\r\n")
    return out


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: Any) -> Any:
    """Every media route recorded once through a recording llmsim, the provider stopped."""
    from llmsim import Config, ServerThread

    d = tmp_path_factory.mktemp("media")
    got: dict[str, Any] = {"dir": d}
    with ServerThread(Config(port=0, seed=7, quiet=True, time_scale=4)) as provider, \
            ServerThread(Config(port=0, quiet=True, record_upstream=provider.url,
                                cassettes=str(d))) as rec:
        c = _oai(rec)
        png = _png()
        got["png"] = png
        got["edit"] = c.images.edit(model="gpt-image-1", image=("a.png", png),
                                    prompt="paint it blue", quality="low")
        got["variation"] = c.images.create_variation(model="dall-e-2", image=("a.png", png),
                                                     size="256x256", response_format="url")
        got["variation_png"] = httpx.get(got["variation"].data[0].url).content
        wav = _wav(4.0)
        got["wav"] = wav
        got["tjson"] = c.audio.transcriptions.create(model="gpt-4o-transcribe",
                                                     file=("a.wav", wav))
        got["tverbose"] = c.audio.transcriptions.create(
            model="whisper-1", file=("a.wav", wav), response_format="verbose_json",
            timestamp_granularities=["word", "segment"])
        got["tstream"] = [e.model_dump() for e in c.audio.transcriptions.create(
            model="gpt-4o-mini-transcribe", file=("a.wav", wav), stream=True)]
        got["translation"] = c.audio.translations.create(model="whisper-1",
                                                         file=("a.wav", wav))
        big = _wav(45.0)  # over a MiB: hashed off the event loop
        got["big"] = big
        got["tbig"] = c.audio.transcriptions.create(model="whisper-1", file=("big.wav", big))
        got["speech_wav"] = c.audio.speech.create(model="tts-1", voice="alloy", input=TEXT,
                                                  response_format="wav").content
        with c.audio.speech.with_streaming_response.create(
                model="gpt-4o-mini-tts", voice="coral", input=TEXT,
                response_format="pcm") as resp:
            got["pcm_type"] = resp.headers["content-type"]
            got["pcm"] = b"".join(resp.iter_bytes())
        sse = httpx.post(rec.url + "/v1/audio/speech", json={
            "model": "gpt-4o-mini-tts", "voice": "coral", "input": TEXT,
            "stream_format": "sse"}, timeout=30)
        got["speech_sse"] = sse.content
    return got


def test_every_media_route_replays_from_its_cassette(recorded: Any, make_server: Any) -> None:
    d: Path = recorded["dir"]
    cassettes = _cassettes(d)
    assert len(cassettes) == 10
    raw = "".join(f.read_text() for f in d.glob("*.json"))
    assert "SECRET" not in raw and "boundary" not in raw
    # no uploaded byte is kept: the files are named by their digest
    for data in (recorded["png"], recorded["wav"], recorded["big"]):
        assert base64.b64encode(data).decode()[:64] not in raw
        assert hashlib.sha256(data).hexdigest() in raw
    forms = [c["request"]["form"] for c in cassettes if "form" in c["request"]]
    assert len(forms) == 7
    assert all(c["request"]["headers"]["content-type"] == "multipart/form-data"
               for c in cassettes if "form" in c["request"])
    speech = [c["response"] for c in cassettes if c["request"]["path"] == "/v1/audio/speech"]
    assert {r["content_type"].partition(";")[0] for r in speech} == {
        "audio/wav", "audio/pcm", "text/event-stream"}
    for r in speech:
        if "chunks" in r:  # streamed binary: chunks in base64 with their offsets
            offsets = [t for t, _ in r["chunks"]]
            assert len(offsets) > 1 and offsets == sorted(offsets) and offsets[-1] > 0

    player = make_server(replay=str(d), replay_speed=0)
    p = _oai(player)
    png, wav = recorded["png"], recorded["wav"]
    assert p.images.edit(model="gpt-image-1", image=("a.png", png), prompt="paint it blue",
                         quality="low").model_dump() == recorded["edit"].model_dump()
    # a url answer: the replaying server serves the recorded image itself
    v = p.images.create_variation(model="dall-e-2", image=("a.png", png), size="256x256",
                                  response_format="url")
    assert v.data[0].url.startswith(player.url + "/llmsim/files/")
    assert v.created == recorded["variation"].created
    img = httpx.get(v.data[0].url)
    assert img.content == recorded["variation_png"]
    assert img.headers["content-type"] == "image/png"
    assert p.audio.transcriptions.create(
        model="gpt-4o-transcribe", file=("a.wav", wav)).model_dump() == \
        recorded["tjson"].model_dump()
    verbose = p.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", wav), response_format="verbose_json",
        timestamp_granularities=["word", "segment"])
    assert verbose.model_dump() == recorded["tverbose"].model_dump() and verbose.words
    assert [e.model_dump() for e in p.audio.transcriptions.create(
        model="gpt-4o-mini-transcribe", file=("a.wav", wav), stream=True)] == \
        recorded["tstream"]
    assert p.audio.translations.create(model="whisper-1", file=("a.wav", wav)).model_dump() \
        == recorded["translation"].model_dump()
    assert p.audio.transcriptions.create(
        model="whisper-1", file=("big.wav", recorded["big"])).model_dump() == \
        recorded["tbig"].model_dump()
    speech_wav = p.audio.speech.create(model="tts-1", voice="alloy", input=TEXT,
                                       response_format="wav").content
    assert speech_wav == recorded["speech_wav"]
    w = wave.open(io.BytesIO(speech_wav))
    assert w.getframerate() == 24000 and w.getnframes() > 24000
    with p.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="coral", input=TEXT, response_format="pcm") as resp:
        assert resp.headers["content-type"] == recorded["pcm_type"] == "audio/pcm"
        assert b"".join(resp.iter_bytes()) == recorded["pcm"]
    sse = httpx.post(player.url + "/v1/audio/speech", json={
        "model": "gpt-4o-mini-tts", "voice": "coral", "input": TEXT, "stream_format": "sse"})
    assert sse.content == recorded["speech_sse"] and b"speech.audio.done" in sse.content


def test_streamed_audio_replays_chunk_by_chunk_at_the_recorded_pace(recorded: Any) -> None:
    entry = next(c for c in _cassettes(recorded["dir"]) if "chunks" in c["response"])
    times = [t for t, _ in entry["response"]["chunks"]]
    gaps = [b - a for a, b in zip([0.0, *times], times, strict=False)]
    for speed in (1.0, 4.0, 0.0):
        res = _answer(entry, speed)
        items = list(res.stream._it)  # type: ignore[union-attr]
        assert [off for off, _t, _d in items] == pytest.approx(
            [g / speed if speed else 0.0 for g in gaps])
        assert b"".join(data for _o, _t, data in items) == recorded["pcm"]


def _exact(make_server: Any, d: Path) -> Any:
    """A player of exact matches only: mode once on a directory that holds cassettes
    (--replay's mode none falls back to the path's first cassette of the same model); its
    upstream is never asked."""
    return make_server(record_upstream="http://127.0.0.1:9", record_mode="once",
                       cassettes=str(d), replay_speed=0)


def test_the_boundary_does_not_select_a_cassette_but_the_file_does(recorded: Any,
                                                                   make_server: Any) -> None:
    player = _exact(make_server, recorded["dir"])
    fields = {"model": "gpt-4o-transcribe"}
    answers = []
    for boundary in ("----a-boundary", "zz9-other-BOUNDARY-0123456789"):
        r = httpx.post(player.url + "/v1/audio/transcriptions",
                       content=_form(boundary, fields, ("a.wav", "audio/x-wav", recorded["wav"])),
                       headers={"content-type": f"multipart/form-data; boundary={boundary}"})
        assert r.status_code == 200, r.text
        answers.append(r.json())
    assert answers[0] == answers[1] == recorded["tjson"].model_dump(exclude_unset=True)
    other = _wav(4.0)[:-2] + b"\2\0"  # the same size and name, another sample
    r = httpx.post(player.url + "/v1/audio/transcriptions",
                   content=_form("b", fields, ("a.wav", "audio/x-wav", other)),
                   headers={"content-type": "multipart/form-data; boundary=b"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "cassette_not_found"
    assert "file (another file: sha256)" in r.json()["error"]["message"]
    # another filename is another request too
    r = httpx.post(player.url + "/v1/audio/transcriptions",
                   content=_form("b", fields, ("b.wav", "audio/x-wav", recorded["wav"])),
                   headers={"content-type": "multipart/form-data; boundary=b"})
    assert r.status_code == 404


def test_hostile_multipart_bodies_get_clear_errors(recorded: Any, make_server: Any) -> None:
    player = make_server(replay=str(recorded["dir"]), replay_speed=0, max_body_bytes=64 * 1024)
    url = player.url + "/v1/audio/transcriptions"
    big = _form("b", {"model": "whisper-1"}, ("a.wav", "audio/wav", _wav(4.0)))
    r = httpx.post(url, content=big, headers={"content-type": "multipart/form-data; boundary=b"})
    assert r.status_code == 413 and "65536 bytes" in r.json()["error"]["message"]
    parts = "".join(f'--B\r\nContent-Disposition: form-data; name="f{i}"\r\n\r\nx\r\n'
                    for i in range(65)) + "--B--\r\n"
    for body, ctype, code in [
        (parts, "multipart/form-data; boundary=B", "invalid_multipart"),
        ('--B\r\nContent-Disposition: form-data; name="model"\r\n\r\nx', "multipart/form-data;"
         " boundary=B", "invalid_multipart"),
        ("x", "multipart/form-data", "invalid_multipart"),
    ]:
        r = httpx.post(url, content=body.encode(), headers={"content-type": ctype})
        assert r.status_code == 400 and r.json()["error"]["code"] == code, r.text
    stats = httpx.get(player.url + "/llmsim/stats").json()["active"]
    assert stats["requests"] == 1 and stats["streams"] == 0  # (this one)
    small = _form("b", {"model": "whisper-1"}, ("a.wav", "audio/wav", _wav(0.5)))
    r = httpx.post(url, content=small, headers={"content-type": "multipart/form-data; boundary=b"})
    assert r.status_code == 200  # served (the path's fallback), nothing stuck


def test_binary_answers_over_the_recording_bounds(make_server: Any, tmp_path: Path) -> None:
    provider = make_server(latency="instant")
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path / "a"),
                      record_max_bytes=4096)
    c = _oai(rec)
    # chunked audio over --record-max-bytes: the head is out, so the body is cut (audio has no
    # error frame); nothing is written
    with pytest.raises((openai.APIConnectionError, httpx.HTTPError)):
        c.audio.speech.create(model="tts-1", voice="alloy", input=TEXT,
                              response_format="wav").read()
    assert list((tmp_path / "a").glob("*.json")) == []
    until(lambda: httpx.get(rec.url + "/llmsim/stats").json()["active"]["streams"] == 0)

    # a binary answer with a length over the bound: a 502 naming the option
    blob = bytes(range(256)) * 40

    def handler(s: Any, req: Any, body: bytes) -> None:
        s.sendall(head(200, [("content-type", "application/octet-stream"),
                             ("content-length", str(len(blob)))]) + blob)

    up = FakeUpstream(handler)
    try:
        rec2 = make_server(record_upstream=up.url, cassettes=str(tmp_path / "b"),
                           record_max_bytes=4096)
        r = httpx.post(rec2.url + "/v1/audio/speech", json={"model": "tts-1", "input": "x"})
        assert r.status_code == 502 and "--record-max-bytes" in r.json()["error"]["message"]
        assert list((tmp_path / "b").glob("*.json")) == []
        # under the bound: kept in base64, replayed byte-exact
        rec3 = make_server(record_upstream=up.url, cassettes=str(tmp_path / "c"))
        r = httpx.post(rec3.url + "/v1/audio/speech", json={"model": "tts-1", "input": "x"})
        assert r.status_code == 200 and r.content == blob
    finally:
        up.close()
    (saved,) = _cassettes(tmp_path / "c")
    assert base64.b64decode(saved["response"]["body_b64"]) == blob
    player = make_server(replay=str(tmp_path / "c"), replay_speed=0)
    r = httpx.post(player.url + "/v1/audio/speech", json={"model": "tts-1", "input": "x"})
    assert r.content == blob and r.headers["content-type"] == "application/octet-stream"

    # the session's budget: the answer is delivered, the cassette not written, then a 502
    rec4 = make_server(record_upstream=provider.url, cassettes=str(tmp_path / "d"),
                       record_budget_bytes=1)
    assert len(_oai(rec4).audio.speech.create(model="tts-1", voice="alloy", input="Hi",
                                              response_format="wav").content) > 44
    assert list((tmp_path / "d").glob("*.json")) == []
    with pytest.raises(openai.APIStatusError) as e:
        _oai(rec4).audio.speech.create(model="tts-1", voice="alloy", input="Hi again")
    assert e.value.status_code == 502 and e.value.body["code"] == "record_budget_exhausted"


GOOD = {"request": {"method": "POST", "path": "/v1/audio/transcriptions",
                    "form": {"model": "whisper-1", "file": {
                        "filename": "a.wav", "content_type": "audio/wav", "size": 4,
                        "sha256": "0" * 64}}},
        "response": {"status": 200, "content_type": "audio/wav", "body_b64": "AAAA"}}


def _with(where: str, value: Any, drop: str = "") -> Any:
    entry = json.loads(json.dumps(GOOD))
    node = entry
    *parts, last = where.split(".")
    for p in parts:
        node = node[p]
    node[last] = value
    if drop:
        del entry["response"][drop]
    return entry


@pytest.mark.parametrize("where, value, drop, field", [
    ("request.form", [1], "", "request.form"),
    ("request.form.file", {"size": 4}, "", "request.form.file"),
    ("request.form.file", {"size": -1, "sha256": "0" * 64}, "", "request.form.file.size"),
    ("request.form.file", {"size": 4, "sha256": "xyz"}, "", "request.form.file.sha256"),
    ("request.form.file", {"size": 4, "sha256": "0" * 64, "bytes": "AAAA"}, "",
     "request.form.file"),
    ("request.form.n", 3, "", "request.form.n"),
    ("request.form.image", [{"size": 1, "sha256": "0" * 64}] * 65, "", "request.form.image"),
    ("request.raw", {"size": 1}, "", "request"),
    ("response.body_b64", "not base64!", "", "response.body_b64"),
    ("response.body_b64", 5, "", "response.body_b64"),
    ("response.chunks", [[0.1, ""]], "body_b64", "response.chunks[0][1]"),
    ("response.chunks", [[0.1, "@@"]], "body_b64", "response.chunks[0][1]"),
    ("response.chunks", [[-1, "AAAA"]], "body_b64", "response.chunks[0][0]"),
    ("response.chunks", "AAAA", "body_b64", "response.chunks"),
    ("response.chunks", [[0.1, "AAAA"]], "", "response"),
    ("response.files", [{"url": "file:///etc/passwd", "content_type": "image/png",
                         "body_b64": "AAAA"}], "", "response.files[0].url"),
    ("response.files", [{"url": "https://x/a.png", "content_type": "a\r\nb",
                         "body_b64": "AAAA"}], "", "response.files[0].content_type"),
    ("response.files", [{}] * 17, "", "response.files"),
])
def test_hostile_media_cassettes_are_refused_at_load(tmp_path: Path, where: str, value: Any,
                                                     drop: str, field: str) -> None:
    (tmp_path / "ok.json").write_text(json.dumps(GOOD))
    load_cassettes(str(tmp_path))
    (tmp_path / "evil.json").write_text(json.dumps(_with(where, value, drop)))
    with pytest.raises(CassetteError) as e:
        load_cassettes(str(tmp_path))
    assert "evil.json" in str(e.value) and f": {field}: " in str(e.value), str(e.value)


def test_a_malformed_media_cassette_is_a_start_up_error(tmp_path: Path) -> None:
    (tmp_path / "evil.json").write_text(json.dumps(_with("response.body_b64", "%%%")))
    out = subprocess.run([sys.executable, "-m", "llmsim", "--replay", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "evil.json: response.body_b64: valid base64" in out.stderr


def test_a_binary_request_body_is_keyed_by_its_digest(make_server: Any,
                                                      tmp_path: Path) -> None:
    body = b"\xff\xfe" + bytes(range(256))
    up = FakeUpstream(lambda s, req, b: s.sendall(
        head(200, [("content-type", "application/json"), ("content-length", "2")]) + b"{}"))
    try:
        rec = make_server(record_upstream=up.url, cassettes=str(tmp_path))
        r = rawhttp.request(rec.url, "POST", "/v1/moderations", body,
                            headers=[("content-type", "application/octet-stream")])
        assert r.status == 200
    finally:
        up.close()
    (saved,) = _cassettes(tmp_path)
    assert saved["request"]["raw"] == {"size": len(body),
                                       "sha256": hashlib.sha256(body).hexdigest()}
    player = _exact(make_server, tmp_path)
    assert rawhttp.request(player.url, "POST", "/v1/moderations", body).body == b"{}"
    r = rawhttp.request(player.url, "POST", "/v1/moderations", body[:-1] + b"\0")
    assert r.status == 404 and "(binary body)" in r.json()["error"]["message"]


def test_chunked_audio_reaches_the_client_live_while_recording(make_server: Any,
                                                               tmp_path: Path) -> None:
    seen_first = threading.Event()
    first, rest = b"RIFF\xff\xff\xff\xffWAVE", bytes(range(256))

    def handler(s: Any, req: Any, body: bytes) -> None:
        s.sendall(head(200, [("content-type", "audio/wav"), ("transfer-encoding", "chunked")]))
        s.sendall(chunk(first))
        # the rest only once the client has the first chunk: a recorder that waits for the
        # whole answer never gets there (the test's read would time out)
        seen_first.wait(10)
        s.sendall(chunk(rest) + b"0\r\n\r\n")

    up = FakeUpstream(handler)
    try:
        rec = make_server(record_upstream=up.url, cassettes=str(tmp_path))
        body = orjson.dumps({"model": "tts-1", "voice": "alloy", "input": "x",
                             "response_format": "wav"})
        sock = rawhttp.connect(rec.url)
        sock.sendall(b"POST /v1/audio/speech HTTP/1.1\r\nhost: x\r\ncontent-type: "
                     b"application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        got = b""
        while first not in got:
            data = sock.recv(65536)
            assert data, "closed before the first chunk"
            got += data
        assert b"content-type: audio/wav" in got.lower() and rest not in got
        seen_first.set()
        while not got.endswith(b"0\r\n\r\n"):
            data = sock.recv(65536)
            assert data, "closed before the end"
            got += data
        sock.close()
        until(lambda: len(list(tmp_path.glob("*.json"))) == 1)
    finally:
        up.close()
    (saved,) = _cassettes(tmp_path)
    chunks = saved["response"]["chunks"]
    assert [base64.b64decode(c) for _, c in chunks] == [first, rest]
    assert chunks[1][0] > chunks[0][0]  # the upstream's timing, kept


def test_an_image_url_that_cannot_be_kept_leaves_the_exchange_unrecorded(
        make_server: Any, tmp_path: Path) -> None:
    big = bytes(8192)
    files = FakeUpstream(lambda s, req, b: s.sendall(
        head(200, [("content-type", "image/png"), ("content-length", str(len(big)))]) + big
        if req.target.endswith(b"big.png") else
        head(404, [("content-type", "text/plain"), ("content-length", "1")]) + b"x"))
    urls = iter([f"{files.url}/big.png", f"{files.url}/gone.png", "http://127.0.0.1:9/x.png"])

    def api(s: Any, req: Any, b: bytes) -> None:
        answer = orjson.dumps({"created": 1, "data": [{"url": next(urls)}]})
        s.sendall(head(200, [("content-type", "application/json"),
                             ("content-length", str(len(answer)))]) + answer)

    up = FakeUpstream(api)
    try:
        rec = make_server(record_upstream=up.url, cassettes=str(tmp_path),
                          record_max_bytes=4096)
        c = _oai(rec)
        # too large for --record-max-bytes, a 404, unreachable: the client has its answer
        # (the provider's URL), no cassette is written
        for _ in range(3):
            r = c.images.generate(model="dall-e-2", prompt="x", response_format="url")
            assert r.data[0].url.startswith("http://127.0.0.1:")
        assert list(tmp_path.glob("*.json")) == []
        until(lambda: httpx.get(rec.url + "/llmsim/stats").json()["active"]["requests"] == 1)
        until(lambda: files.closed_by_peer == 2)  # each image connection closed
    finally:
        up.close()
        files.close()
