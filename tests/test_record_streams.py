"""Record/replay of the streams that are not SSE (issue 32): Bedrock's AWS event stream
(boto3 ``bedrock-runtime``), Ollama's NDJSON (the ``ollama`` client) and Gemini's JSON array
(``streamGenerateContent`` without ``alt=sse``, a raw client: google-genai always asks for
SSE). Each is recorded from another llmsim as the upstream, kept frame by frame with its
time, and replayed frame by frame at that time (checked on the fake clock)."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import boto3
import h11
import httpx
import ollama
import orjson
import pytest
from botocore.config import Config as BotoConfig
from botocore.exceptions import ClientError

from llmsim.api.bedrock import frame
from llmsim.api.cassette import CassetteError, load_cassettes
from llmsim.api.framing import ArrayFramer, FrameError, NDJSONFramer
from llmsim.streaming.clock import COALESCE, FakeClock

from . import faultkit, rawhttp
from .test_bedrock import frames as parse_frames
from .upstreams import FakeUpstream, chunk, head

MODEL = "us.anthropic.claude-haiku-4-5-20251001-v1:0"
HI = [{"role": "user", "content": [{"text": "Say hi"}]}]
INVOKE = {"anthropic_version": "bedrock-2023-05-31", "max_tokens": 6,
          "messages": [{"role": "user", "content": "Say hi"}]}
KEY_ID, SECRET = "AKIDRECORDKEY", "SECRETRECORDKEY"


def _boto(url: str) -> Any:
    return boto3.client("bedrock-runtime", endpoint_url=url, region_name="us-east-1",
                        aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET,
                        aws_session_token="SESSIONTOKENSECRET",
                        config=BotoConfig(retries={"max_attempts": 1}))


def _cassette(d: Path, part: str) -> dict[str, Any]:
    found = [f for f in d.glob("*.json") if part in f.name]
    assert len(found) == 1, [f.name for f in d.glob("*.json")]
    return dict(json.loads(found[0].read_text()))


def _upstream(make_server: Any) -> Any:
    # paced tokens: the recorded offsets differ from frame to frame
    return make_server(latency="realistic", ttft_ms=15, itl_ms=4, seed=5)


async def _paced(d: Path, path: str, body: Any, speed: float = 2.0) -> tuple[Any, Any]:
    """Replay ``path`` from ``d`` on the fake clock: the exchange (one chunk a frame, each
    with the clock's time) and the cassette's events."""
    srv = faultkit.server(FakeClock(start=0.0), replay=str(d), replay_speed=speed)
    ex = await faultkit.exchange(srv, body, path=path,
                                 headers=[("content-type", "application/json")])
    assert ex.status == 200 and ex.complete
    return ex, srv


def _check_paced(ex: Any, offsets: list[float], speed: float) -> None:
    """One HTTP chunk a recorded frame, each sent at its recorded offset / speed (a timer
    fires up to the clock's coalescing step early)."""
    assert len(ex.chunks) == len(offsets)
    start = ex.times[0] - offsets[0] / speed
    for t, off in zip(ex.times, offsets, strict=True):
        assert t - start == pytest.approx(off / speed, abs=2 * COALESCE)
    assert ex.times[-1] - ex.times[0] > (offsets[-1] - offsets[0]) / speed - 2 * COALESCE


# ------------------------------------------------------------------------------------------
# Bedrock: Converse, ConverseStream, InvokeModel, InvokeModelWithResponseStream
# ------------------------------------------------------------------------------------------

def _bedrock_calls(url: str) -> dict[str, Any]:
    c = _boto(url)
    conv = c.converse(modelId=MODEL, messages=HI, inferenceConfig={"maxTokens": 12})
    st = list(c.converse_stream(modelId=MODEL, messages=HI,
                                inferenceConfig={"maxTokens": 8})["stream"])
    inv = c.invoke_model(modelId=MODEL, body=json.dumps(INVOKE))
    ist = c.invoke_model_with_response_stream(modelId=MODEL, body=json.dumps(INVOKE))
    return {"converse": {k: conv[k] for k in ("output", "stopReason", "usage", "metrics")},
            "stream": st,
            "invoke": json.loads(inv["body"].read()),
            "invoke_tokens": inv["ResponseMetadata"]["HTTPHeaders"][
                "x-amzn-bedrock-output-token-count"],
            "invoke_stream": [json.loads(e["chunk"]["bytes"]) for e in ist["body"]]}


async def test_bedrock_recorded_then_replayed_with_boto3(make_server: Any,
                                                         tmp_path: Path) -> None:
    up = _upstream(make_server)
    rec = make_server(record_route=(f"bedrock={up.url}",), cassettes=str(tmp_path))
    first = _bedrock_calls(rec.url)
    names = {f.name.rsplit("-", 1)[0] for f in tmp_path.glob("*.json")}
    assert names == {
        f"bedrock.{e}-{MODEL.replace(':', '_')}-{k}" for e, k in (
            ("converse", "json"), ("converse-stream", "stream"), ("invoke", "json"),
            ("invoke-with-response-stream", "stream"))}
    text = "".join(f.read_text() for f in tmp_path.glob("*.json")).lower()
    for secret in ("akidrecordkey", "secretrecordkey", "sessiontokensecret", "aws4-hmac",
                   "x-amz-date", "x-amz-security-token", "x-amz-content-sha256",
                   "authorization", "signature"):
        assert secret not in text, secret

    # the cassette keeps the decoded events, readable: headers and the JSON payload, timed
    cs = _cassette(tmp_path, "converse-stream")
    assert cs["response"]["framing"] == "eventstream"
    events = cs["response"]["events"]
    kinds = [ev["headers"][":event-type"] for _t, ev in events]
    assert kinds[0] == "messageStart" and kinds[-2:] == ["messageStop", "metadata"]
    offsets = [t for t, _ev in events]
    assert offsets == sorted(offsets) and offsets[-1] > offsets[0]
    recorded_text = "".join(ev["payload"]["delta"]["text"] for _t, ev in events
                            if ev["headers"][":event-type"] == "contentBlockDelta")
    streamed_text = "".join(e["contentBlockDelta"]["delta"]["text"] for e in first["stream"]
                            if "contentBlockDelta" in e)
    assert recorded_text == streamed_text and recorded_text
    assert events[-1][1]["payload"]["usage"] == first["stream"][-1]["metadata"]["usage"]
    assert events[-2][1]["payload"]["stopReason"] == first["stream"][-2]["messageStop"][
        "stopReason"]

    up.stop()  # replay offline: the same answers, the same events
    player = make_server(replay=str(tmp_path), replay_speed=0)
    assert _bedrock_calls(player.url) == first
    with pytest.raises(ClientError) as ei:  # not recorded: Bedrock's error shape
        _boto(player.url).converse(modelId="us.anthropic.claude-other-v1:0", messages=HI)
    assert ei.value.response["Error"]["Code"] == "ResourceNotFoundException"
    assert ei.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert "cassette" in ei.value.response["Error"]["Message"]

    # re-framed with correct CRCs, one chunk an event at its recorded time
    body = {"messages": HI, "inferenceConfig": {"maxTokens": 8}}
    ex, _srv = await _paced(tmp_path, f"/model/{MODEL.replace(':', '%3A')}/converse-stream",
                           body)  # (the path as boto3 sent it)
    assert ex.headers["content-type"] == "application/vnd.amazon.eventstream"
    got = parse_frames(ex.body)
    assert [(h, json.loads(p)) for h, p in got] == [(ev["headers"], ev["payload"])
                                                    for _t, ev in events]
    _check_paced(ex, offsets, 2.0)
    # a fault mid-replay ends the stream with Bedrock's exception message, CRCs right
    ex = await faultkit.exchange(
        faultkit.server(replay=str(tmp_path), replay_speed=0), body,
        path=f"/model/{MODEL.replace(':', '%3A')}/converse-stream",
        headers=[("x-llmsim-fault", "error-after:2")])
    got = parse_frames(ex.body)
    assert len(got) == 3 and got[-1][0][":message-type"] == "exception"


def test_bedrock_replay_is_byte_identical_and_sigv4_resigned(make_server: Any,
                                                             tmp_path: Path) -> None:
    """Recording a SigV4-verifying upstream: the recorder signs each request again for the
    upstream's host with the secret --aws-keys gives for its key id."""
    up = make_server(seed=3, aws_keys=(f"{KEY_ID}:{SECRET}",))
    rec = make_server(record_route=(f"bedrock={up.url}",), cassettes=str(tmp_path),
                      aws_keys=(f"{KEY_ID}:{SECRET}",))
    c = _boto(rec.url)
    st = list(c.converse_stream(modelId=MODEL, messages=HI)["stream"])
    assert "metadata" in st[-1]
    raw = {"messages": HI, "inferenceConfig": {"maxTokens": 5}}
    path = f"/model/{MODEL}/converse-stream"
    first = rawhttp.request(rec.url, "POST", path, raw)
    assert first.status == 403  # unsigned: refused by the upstream, in Bedrock's shape
    assert first.headers["x-amzn-errortype"].startswith("MissingAuthenticationToken")
    player = make_server(replay=str(tmp_path), replay_speed=0)
    assert list(_boto(player.url).converse_stream(modelId=MODEL, messages=HI)["stream"]) == st
    open_up = make_server(seed=3)
    rec2 = make_server(record_route=(f"bedrock={open_up.url}",), cassettes=str(tmp_path / "b"))
    recorded = rawhttp.request(rec2.url, "POST", path, raw)
    replayed = rawhttp.request(make_server(replay=str(tmp_path / "b"), replay_speed=0).url,
                               "POST", path, raw)
    assert recorded.status == replayed.status == 200 and recorded.body == replayed.body


# ------------------------------------------------------------------------------------------
# Hostile upstream event streams and cassettes
# ------------------------------------------------------------------------------------------

def _ev(etype: str, payload: bytes) -> bytes:
    return frame([(":event-type", etype), (":content-type", "application/json"),
                  (":message-type", "event")], payload)


GOOD_EV = _ev("messageStart", b'{"role":"assistant"}')
BAD_CRC = bytearray(_ev("contentBlockDelta", b'{"delta":{"text":"x"}}'))
BAD_CRC[-1] ^= 1
BAD_PRELUDE = bytearray(_ev("messageStop", b"{}"))
BAD_PRELUDE[3] ^= 0x40
HUGE = struct.pack(">II", 1 << 30, 0)
HUGE += struct.pack(">I", zlib.crc32(HUGE))
NOT_JSON = _ev("contentBlockDelta", b"not json")
INT_HEADER = bytearray(GOOD_EV)


@pytest.mark.parametrize("tail, why", [
    (bytes(BAD_CRC), "CRC does not match"),
    (bytes(BAD_PRELUDE), "prelude CRC does not match"),
    (HUGE, "1073741824 bytes"),
    (GOOD_EV[:30], "ended inside an event-stream message"),
    (NOT_JSON, "payload that is not JSON"),
    (frame([(":message-type", "event")], b"{}")[:-4] + b"\0\0\0\0", "CRC does not match"),
])
def test_a_broken_event_stream_fails_the_recording_cleanly(make_server: Any, tmp_path: Path,
                                                           tail: bytes, why: str) -> None:
    def handler(s: socket.socket, req: h11.Request, body: bytes) -> None:
        s.sendall(head(200, [("content-type", "application/vnd.amazon.eventstream"),
                             ("transfer-encoding", "chunked")]))
        s.sendall(chunk(GOOD_EV) + chunk(tail) + b"0\r\n\r\n")

    bad = FakeUpstream(handler)
    try:
        rec = make_server(record_route=(f"bedrock={bad.url}",), cassettes=str(tmp_path))
        r = rawhttp.request(rec.url, "POST", f"/model/{MODEL}/converse-stream",
                            {"messages": HI})
        got = parse_frames(r.body)  # every frame the client gets has valid CRCs
        assert got[0][0][":event-type"] == "messageStart"  # the good frame, passed through
        assert len(got) == 2 and got[-1][0][":message-type"] == "exception"
        assert why in json.loads(got[-1][1])["message"]
        assert list(tmp_path.glob("*.json")) == []  # nothing stored
    finally:
        bad.close()


def test_event_stream_recording_is_bounded(make_server: Any, tmp_path: Path) -> None:
    """--record-max-bytes bounds a recorded event stream as it bounds an SSE one: a frame
    announcing more is refused from its prelude, a stream growing past it is cut."""
    up = _upstream(make_server)
    rec = make_server(record_route=(f"bedrock={up.url}",), cassettes=str(tmp_path),
                      record_max_bytes=1500)
    r = rawhttp.request(rec.url, "POST", f"/model/{MODEL}/converse-stream",
                        {"messages": HI, "inferenceConfig": {"maxTokens": 200}})
    got = parse_frames(r.body)
    assert got[-1][0][":message-type"] == "exception"
    assert "--record-max-bytes" in json.loads(got[-1][1])["message"]
    assert list(tmp_path.glob("*.json")) == []


def test_recorded_frames_are_bounded_in_count(make_server: Any, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The frame count bound of every recording (MAX_EVENTS, lowered here) applies to event
    streams and NDJSON alike: the stream ends with the family's error, nothing is stored."""
    import llmsim.api.cassette as cassette

    monkeypatch.setattr(cassette, "MAX_EVENTS", 5)
    up = make_server(seed=4)
    rec = make_server(record_route=(f"bedrock={up.url}", f"ollama={up.url}"),
                      cassettes=str(tmp_path))
    r = rawhttp.request(rec.url, "POST", f"/model/{MODEL}/converse-stream",
                        {"messages": HI, "inferenceConfig": {"maxTokens": 20}})
    got = parse_frames(r.body)
    assert len(got) == 6 and got[-1][0][":message-type"] == "exception"
    r = rawhttp.request(rec.url, "POST", "/api/chat", {
        "model": "llama3.2", "messages": [{"role": "user", "content": "x"}],
        "options": {"num_predict": 20}})
    lines = [json.loads(x) for x in r.body.decode().splitlines()]
    assert len(lines) == 6 and set(lines[-1]) == {"error"}
    assert list(tmp_path.glob("*.json")) == []


def _bedrock_entry(events: Any, framing: str = "eventstream") -> dict[str, Any]:
    return {"request": {"method": "POST", "path": f"/model/{MODEL}/converse-stream",
                        "body": json.dumps({"messages": HI})},
            "response": {"status": 200, "framing": framing, "events": events}}


OK_EV = {"headers": {":event-type": "messageStart", ":message-type": "event"},
         "payload": {"role": "assistant"}}
DEEP: Any = []
for _ in range(300):
    DEEP = [DEEP]


@pytest.mark.parametrize("events, framing, field, what", [
    ([[0.0, "data: x\n\n"]], "eventstream", "response.events[0][1]", "event-stream frame"),
    ([[0.0, {**OK_EV, "extra": 1}]], "eventstream", "response.events[0][1]", "headers and"),
    ([[0.0, {"payload": {}}]], "eventstream", "response.events[0][1].headers", "1 to 64"),
    ([[0.0, {"headers": {":event-type": "x"}}]], "eventstream",
     "response.events[0][1].headers.:message-type", "event, exception or error"),
    ([[0.0, {"headers": {":message-type": "event", "x" * 300: "v"}}]], "eventstream",
     "response.events[0][1].headers", "1 to 255 bytes"),
    ([[0.0, {"headers": {":message-type": "event", "h": "v" * 40000}}]], "eventstream",
     "response.events[0][1].headers.h", "32767 bytes"),
    ([[0.0, {"headers": {":message-type": "event", "h": 5}}]], "eventstream",
     "response.events[0][1].headers.h", "32767 bytes"),
    ([[0.0, {**OK_EV, "payload": DEEP}]], "eventstream", "response.events[0][1].payload",
     "a JSON value"),
    ([[-1.0, OK_EV]], "eventstream", "response.events[0][0]", "seconds"),
    ([[0.0, OK_EV]], "morse", "response.framing", "one of sse, ndjson"),
    ([[0.0, '{"a":1}\n{"b":2}\n']], "ndjson", "response.events[0][1]", "2 JSON lines"),
    ([[0.0, "nope\n"]], "ndjson", "response.events[0][1]", "not JSON"),
    ([[0.0, '[{"a":1}'], [0.1, '{"b":2}'], [0.2, "]"]], "json-array",
     "response.events[1][1]", "neither '[' nor ','"),
    ([[0.0, '[{"a":1},{"b":2}'], [0.2, "]"]], "json-array", "response.events[0][1]",
     "not JSON"),
    ([[0.0, '[{"a":1} '], [0.2, "]"]], "json-array", "response.events",
     "end one array element"),
    ([[0.0, '[{"a":1}'], [0.1, "]"], [0.2, "]"]], "json-array", "response.events",
     "after the end"),
    ([[0.0, '[{"a":1}']], "json-array", "response.events", "ended inside its JSON array"),
])
def test_malformed_stream_cassettes_are_refused_at_load(tmp_path: Path, events: Any,
                                                        framing: str, field: str,
                                                        what: str) -> None:
    (tmp_path / "evil.json").write_text(json.dumps(_bedrock_entry(events, framing)))
    with pytest.raises(CassetteError) as e:
        load_cassettes(str(tmp_path))
    assert f"evil.json: {field}: " in str(e.value) and what in str(e.value), str(e.value)


def test_malformed_bedrock_cassette_stops_the_server_with_a_message(tmp_path: Path) -> None:
    (tmp_path / "evil.json").write_text(json.dumps(_bedrock_entry(
        [[0.0, OK_EV], [0.1, {"headers": {":event-type": "x"}, "payload": {}}]])))
    out = subprocess.run([sys.executable, "-m", "llmsim", "--replay", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "evil.json: response.events[1][1].headers.:message-type: event, exception or " \
           "error" in out.stderr


# ------------------------------------------------------------------------------------------
# Ollama's NDJSON and Gemini's JSON array: frame by frame, paced
# ------------------------------------------------------------------------------------------

async def test_ollama_ndjson_recorded_and_replayed_frame_by_frame(make_server: Any,
                                                                  tmp_path: Path) -> None:
    up = _upstream(make_server)
    rec = make_server(record_route=(f"ollama={up.url}",), cassettes=str(tmp_path))
    msgs = [{"role": "user", "content": "Explain TCP"}]
    opts = {"num_predict": 10}
    first = [c.model_dump() for c in ollama.Client(host=rec.url).chat(
        model="llama3.2", messages=msgs, options=opts, stream=True)]
    cs = _cassette(tmp_path, "api.chat-llama3.2-stream")
    events = cs["response"]["events"]
    assert cs["response"]["framing"] == "ndjson" and len(events) == len(first) > 5
    assert all(f.endswith("\n") and f.count("\n") == 1 for _t, f in events)
    assert [json.loads(f)["message"]["content"] for _t, f in events] == \
        [c["message"]["content"] for c in first]
    offsets = [t for t, _f in events]
    assert offsets == sorted(offsets) and offsets[-1] > offsets[0]
    up.stop()
    player = make_server(replay=str(tmp_path), replay_speed=0)
    again = [c.model_dump() for c in ollama.Client(host=player.url).chat(
        model="llama3.2", messages=msgs, options=opts, stream=True)]
    assert again == first
    ex, _srv = await _paced(tmp_path, "/api/chat", {"model": "llama3.2", "messages": msgs,
                                                    "options": opts})
    assert ex.headers["content-type"] == "application/x-ndjson"
    assert [c.decode() for c in ex.chunks] == [f for _t, f in events]
    _check_paced(ex, offsets, 2.0)
    # a fault mid-replay ends the stream with Ollama's error line
    ex = await faultkit.exchange(faultkit.server(replay=str(tmp_path), replay_speed=0),
                                 {"model": "llama3.2", "messages": msgs, "options": opts},
                                 path="/api/chat",
                                 headers=[("x-llmsim-fault", "error-after:2")])
    lines = ex.body.decode().splitlines()
    assert set(json.loads(lines[-1])) == {"error"} and len(lines) == 3


async def test_gemini_json_array_recorded_and_replayed_frame_by_frame(make_server: Any,
                                                                      tmp_path: Path) -> None:
    up = _upstream(make_server)
    rec = make_server(record_route=(f"gemini={up.url}",), cassettes=str(tmp_path))
    path = "/v1beta/models/gemini-2.0-flash:streamGenerateContent"
    body = {"contents": [{"role": "user", "parts": [{"text": "Explain TCP"}]}],
            "generationConfig": {"maxOutputTokens": 8}}
    with httpx.stream("POST", rec.url + path, json=body) as s:
        assert s.headers["content-type"].startswith("application/json")
        live = b"".join(s.iter_raw())
    cs = _cassette(tmp_path, "gemini-2.0-flash-stream")
    events = cs["response"]["events"]
    assert cs["response"]["framing"] == "json-array"
    elements = json.loads(live)
    assert len(events) == len(elements) + 1 and events[-1][1].strip() == "]"
    assert "".join(f for _t, f in events).encode() == live
    assert [json.loads(f.strip()[1:]) for _t, f in events[:-1]] == elements
    offsets = [t for t, _f in events]
    assert offsets == sorted(offsets) and offsets[-1] > offsets[0]
    up.stop()
    player = make_server(replay=str(tmp_path), replay_speed=0)
    assert httpx.post(player.url + path, json=body).content == live
    ex, _srv = await _paced(tmp_path, path, body)
    assert ex.headers["content-type"].startswith("application/json")
    assert [c.decode() for c in ex.chunks] == [f for _t, f in events]
    _check_paced(ex, offsets, 2.0)
    # a fault mid-replay: still one JSON array, Google's error its last element
    ex = await faultkit.exchange(faultkit.server(replay=str(tmp_path), replay_speed=0), body,
                                 path=path, headers=[("x-llmsim-fault", "error-after:2")])
    arr = json.loads(ex.body)
    assert len(arr) == 3 and arr[-1]["error"]["status"] == "INTERNAL"


async def test_gemini_sse_replay_fails_in_googles_shape(make_server: Any,
                                                        tmp_path: Path) -> None:
    up = make_server(seed=2)
    rec = make_server(record_route=(f"gemini={up.url}",), cassettes=str(tmp_path))
    path = "/v1beta/models/gemini-2.0-flash:streamGenerateContent?alt=sse"
    body = {"contents": [{"parts": [{"text": "Explain TCP"}]}],
            "generationConfig": {"maxOutputTokens": 8}}
    assert httpx.post(rec.url + path, json=body).status_code == 200
    assert _cassette(tmp_path, "stream")["response"]["framing"] == "sse"
    ex = await faultkit.exchange(faultkit.server(replay=str(tmp_path), replay_speed=0), body,
                                 path=path, headers=[("x-llmsim-fault", "error-after:2")])
    last = rawhttp.parse_sse(ex.body)[-1][1]
    assert json.loads(last)["error"]["status"] == "INTERNAL"


def test_gemini_array_upstream_that_is_not_an_array_fails_cleanly(make_server: Any,
                                                                   tmp_path: Path) -> None:
    def handler(s: socket.socket, req: h11.Request, body: bytes) -> None:
        s.sendall(head(200, [("content-type", "application/json"),
                             ("transfer-encoding", "chunked")]))
        s.sendall(chunk(b'[{"candidates":[]}') + chunk(b',{"cand') + b"0\r\n\r\n")

    bad = FakeUpstream(handler)
    try:
        rec = make_server(record_route=(f"gemini={bad.url}",), cassettes=str(tmp_path))
        r = rawhttp.request(rec.url, "POST",
                            "/v1beta/models/gemini-2.0-flash:streamGenerateContent",
                            {"contents": [{"parts": [{"text": "x"}]}]})
        data = json.loads(r.body)  # still one JSON array: the element, then Google's error
        assert data[0] == {"candidates": []} and data[-1]["error"]["code"] == 502
        assert "inside its JSON array" in data[-1]["error"]["message"]
        assert list(tmp_path.glob("*.json")) == []
    finally:
        bad.close()


def test_framers_cut_wherever_the_pieces_end() -> None:
    text = (b' [{"a": "x]},\\"{"}\n,\r\n{"b": [1, {"c": 2}]}, "s,]", 12, true\n]')
    want = [b' [{"a": "x]},\\"{"}', b'\n,\r\n{"b": [1, {"c": 2}]}', b', "s,]"', b", 12",
            b", true\n", b"]"]
    for size in (1, 2, 3, 7, len(text)):
        f = ArrayFramer()
        got = [x for i in range(0, len(text), size) for x in f.feed(text[i:i + size])]
        assert got + f.flush() == want, size
    with pytest.raises(FrameError):
        ArrayFramer().feed(b'{"not": "an array"}')
    with pytest.raises(FrameError):
        ArrayFramer().feed(b"[1]x")
    lines = b'{"a":1}\n\n{"b":2}\n{"c":3}'
    for size in (1, 4, len(lines)):
        n = NDJSONFramer()
        got = [x for i in range(0, len(lines), size) for x in n.feed(lines[i:i + size])]
        assert got + n.flush() == [b'{"a":1}\n', b'\n{"b":2}\n', b'{"c":3}'], size
    # each byte is looked at once: blank lines and empty separators are not scanned again
    # (quadratic, these would not finish)
    assert NDJSONFramer().feed(b"\n" * (1 << 20)) == []
    commas = ArrayFramer()
    assert commas.feed(b"[" + b" ," * (1 << 17)) == []
    assert orjson.loads(b"".join(want)) == [{"a": 'x]},"{'}, {"b": [1, {"c": 2}]}, "s,]", 12,
                                            True]
