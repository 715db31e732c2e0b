"""The Realtime API (``/v1/realtime``), judged by the official SDK's realtime client
(``client.realtime.connect``, sync and async). Every server event is validated strictly
against the SDK's ``RealtimeServerEvent`` union, and no event may carry a field the SDK's
type does not declare (beyond the session's ``id``/``object``)."""

from __future__ import annotations

import array
import base64
import fcntl
import json
import math
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI, OpenAI
from openai.types.realtime.realtime_server_event import RealtimeServerEvent
from pydantic import BaseModel, TypeAdapter
from websockets.exceptions import ConnectionClosed

import llmsim.api.realtime as rt
from llmsim.api.realtime.audio import VAD, speech
from llmsim.config import RateLimitConfig, WebSocketConfig
from llmsim.sim.rng import seeded

EVENT = TypeAdapter(RealtimeServerEvent)
SESSION_EXTRA = {"id", "object"}
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False}}


def _no_extra(m: Any, path: str) -> None:
    if isinstance(m, BaseModel):
        extra = set(m.model_extra or {})
        if path.endswith("session"):
            extra -= SESSION_EXTRA
        assert not extra, f"{path}: fields the SDK does not declare: {extra}"
        for k in type(m).model_fields:
            _no_extra(getattr(m, k), f"{path}.{k}")
    elif isinstance(m, list):
        for i, x in enumerate(m):
            _no_extra(x, f"{path}[{i}]")


def validated(raw: bytes | str) -> dict[str, Any]:
    data = json.loads(raw)
    model = EVENT.validate_python(data, strict=True)
    _no_extra(model, data["type"])
    return data


def recv_until(conn: Any, etype: str) -> list[dict[str, Any]]:
    out = []
    while True:
        ev = validated(conn.recv_bytes())
        out.append(ev)
        if ev["type"] == etype:
            return out


async def arecv_until(conn: Any, etype: str) -> list[dict[str, Any]]:
    out = []
    while True:
        ev = validated(await conn.recv_bytes())
        out.append(ev)
        if ev["type"] == etype:
            return out


def pcm(ms: int, amp: int = 0, freq: int = 220) -> bytes:
    """``ms`` of PCM16 24 kHz mono: silence, or a tone of amplitude ``amp``."""
    n = 24 * ms
    a = array.array("h", (int(amp * math.sin(2 * math.pi * freq * i / 24000))
                          for i in range(n)))
    return a.tobytes()


def rms(data: bytes) -> float:
    a = array.array("h")
    a.frombytes(data)
    return math.sqrt(sum(x * x for x in a) / max(1, len(a)))


@pytest.fixture
def rsrv(make_server: Any) -> Any:
    return make_server(output_tokens_mean=12, output_tokens_sigma=0)


@pytest.fixture
def rclient(rsrv: Any) -> Any:
    with OpenAI(base_url=rsrv.url + "/v1", api_key="sk-test", max_retries=0) as c:
        yield c


def _gauges_zero(srv: Any) -> None:
    st = srv.app.stats
    for _ in range(200):  # (a bounded poll of the server's own gauges, no time budget)
        if st.active_requests == 0 and st.active_streams == 0 and st.active_websockets == 0:
            return
        time.sleep(0.02)
    assert (st.active_requests, st.active_streams, st.active_websockets) == (0, 0, 0)


def text_session(conn: Any, **extra: Any) -> None:
    conn.session.update(session={"type": "realtime", "output_modalities": ["text"], **extra})
    assert validated(conn.recv_bytes())["type"] == "session.updated"


# -- round trips -----------------------------------------------------------------------------

def test_text_round_trip_sync(rclient: Any, rsrv: Any) -> None:
    with rclient.realtime.connect(model="gpt-realtime") as conn:
        created = validated(conn.recv_bytes())
        assert created["type"] == "session.created"
        assert created["session"]["model"] == "gpt-realtime"
        text_session(conn, instructions="Be brief.")
        conn.conversation.item.create(item={"type": "message", "role": "user",
                                            "content": [{"type": "input_text",
                                                         "text": "Say hello."}]})
        added, done = validated(conn.recv_bytes()), validated(conn.recv_bytes())
        assert (added["type"], done["type"]) == ("conversation.item.added",
                                                  "conversation.item.done")
        user_id = done["item"]["id"]
        conn.response.create()
        evs = recv_until(conn, "response.done")
    types = [e["type"] for e in evs]
    assert types[:6] == ["response.created", "rate_limits.updated",
                         "response.output_item.added", "conversation.item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert types[-5:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "conversation.item.done",
                          "response.done"]
    deltas = "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta")
    assert deltas == evs[-5]["text"] and deltas.strip()
    assert evs[3]["previous_item_id"] == user_id
    resp = evs[-1]["response"]
    assert resp["status"] == "completed" and resp["output"][0]["content"][0]["text"] == deltas
    u = resp["usage"]
    assert u["output_tokens"] == 12 and u["output_token_details"]["audio_tokens"] == 0
    assert u["input_tokens"] == u["input_token_details"]["text_tokens"] > 0
    assert u["total_tokens"] == u["input_tokens"] + u["output_tokens"]
    _gauges_zero(rsrv)


async def test_text_round_trip_async(rsrv: Any) -> None:
    async with AsyncOpenAI(base_url=rsrv.url + "/v1", api_key="sk-test",
                           max_retries=0) as c:
        async with c.realtime.connect(model="gpt-realtime") as conn:
            assert validated(await conn.recv_bytes())["type"] == "session.created"
            await conn.session.update(session={"type": "realtime",
                                               "output_modalities": ["text"]})
            assert validated(await conn.recv_bytes())["type"] == "session.updated"
            await conn.conversation.item.create(item={
                "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": "Hi"}]})
            await arecv_until(conn, "conversation.item.done")
            await conn.response.create()
            evs = await arecv_until(conn, "response.done")
            # the SDK's typed recv() parses the same events
            await conn.response.create(response={"max_output_tokens": 3})
            typed = []
            while True:
                ev = await conn.recv()
                typed.append(ev)
                if ev.type == "response.done":
                    break
    assert evs[-1]["response"]["status"] == "completed"
    assert typed[-1].response.status == "incomplete"
    assert typed[-1].response.status_details.reason == "max_output_tokens"
    assert typed[-1].response.usage.output_tokens == 3


def test_function_call_round_trip(rclient: Any) -> None:
    with rclient.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        text_session(conn, tools=[WEATHER], tool_choice="auto")
        conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "What is the weather in Paris?"}]})
        recv_until(conn, "conversation.item.done")
        conn.response.create()
        evs = recv_until(conn, "response.done")
        done = [e for e in evs if e["type"] == "response.function_call_arguments.done"]
        assert len(done) == 1
        call = done[0]
        deltas = "".join(e["delta"] for e in evs
                         if e["type"] == "response.function_call_arguments.delta")
        assert deltas == call["arguments"] and call["name"] == "get_weather"
        assert isinstance(json.loads(call["arguments"])["city"], str)
        item = evs[-1]["response"]["output"][0]
        assert item["type"] == "function_call" and item["call_id"] == call["call_id"]
        conn.conversation.item.create(item={"type": "function_call_output",
                                            "call_id": call["call_id"],
                                            "output": '{"temp_c": 21}'})
        recv_until(conn, "conversation.item.done")
        conn.response.create()
        evs2 = recv_until(conn, "response.done")
    out = evs2[-1]["response"]["output"]
    assert out[0]["type"] == "message"  # the result is in: the model answers in text
    assert out[0]["content"][0]["type"] == "output_text"


def test_audio_in_vad_transcription_and_audio_out(rclient: Any) -> None:
    with rclient.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.session.update(session={
            "type": "realtime", "output_modalities": ["audio"],
            "audio": {"input": {"transcription": {"model": "gpt-4o-mini-transcribe"},
                                "turn_detection": {"type": "server_vad",
                                                   "silence_duration_ms": 400,
                                                   "prefix_padding_ms": 100}},
                      "output": {"voice": "marin"}}})
        assert validated(conn.recv_bytes())["type"] == "session.updated"
        audio = pcm(600) + pcm(1000, amp=8000) + pcm(800)
        for i in range(0, len(audio), 9600):  # 200 ms an append
            conn.input_audio_buffer.append(audio=base64.b64encode(audio[i:i + 9600]).decode())
        evs = recv_until(conn, "response.done")
    types = [e["type"] for e in evs]
    start = evs[types.index("input_audio_buffer.speech_started")]
    stop = evs[types.index("input_audio_buffer.speech_stopped")]
    assert start["audio_start_ms"] == 600 - 100  # speech at 600 ms, minus the prefix
    assert stop["audio_end_ms"] == 1600 + 400  # speech ends at 1600 ms, plus the silence
    committed = evs[types.index("input_audio_buffer.committed")]
    assert committed["item_id"] == start["item_id"] == stop["item_id"]
    tr = evs[types.index("conversation.item.input_audio_transcription.completed")]
    deltas = "".join(e["delta"] for e in evs
                     if e["type"] == "conversation.item.input_audio_transcription.delta")
    assert deltas.strip() == tr["transcript"] and tr["item_id"] == committed["item_id"]
    assert types.index("response.created") > types.index("input_audio_buffer.committed")
    # the answer's audio: valid PCM16 at 24 kHz, as long as its words take to say
    chunks = [base64.b64decode(e["delta"]) for e in evs
              if e["type"] == "response.output_audio.delta"]
    pcm_out = b"".join(chunks)
    assert len(pcm_out) % 2 == 0 and rms(pcm_out) > 500
    transcript = evs[types.index("response.output_audio_transcript.done")]["transcript"]
    assert transcript == "".join(e["delta"] for e in evs
                                 if e["type"] == "response.output_audio_transcript.delta")
    seconds = len(pcm_out) / 48000
    words = len(transcript.split())
    assert 0.2 * words <= seconds <= 0.6 * words + 0.5  # ~170 words a minute
    u = evs[-1]["response"]["usage"]
    assert u["output_token_details"]["audio_tokens"] == round(seconds * 20)
    assert u["input_token_details"]["audio_tokens"] > 0
    item = evs[-1]["response"]["output"][0]
    assert item["content"][0] == {"type": "output_audio", "transcript": transcript}


def test_audio_out_pacing_is_real_time() -> None:
    """The plan's delays: TTFT, then audio chunks every 200 ms of audio, ending when the
    audio ends (no wall clock: the plan's own offsets); none under --latency instant."""
    sp = speech([" Hello", " there,", " how", " are", " you", " today?"], "alloy", 1.0,
                "audio/pcm", seeded(1))
    at: dict[str, Any] = {}
    evs = list(rt._audio_events(at, [" Hello", " there,", " how", " are", " you", " today?"],
                                sp, 0.5, zero=False))
    assert sum(e[0] for e in evs) == pytest.approx(0.5 + sp.duration)
    audio_at = []
    t = 0.0
    for wait, etype, _ in evs:
        t += wait
        if etype == "response.output_audio.delta":
            audio_at.append(t)
    assert audio_at == pytest.approx([0.5 + 0.2 * k for k in range(len(audio_at))])
    assert sum(len(base64.b64decode(e[2]["delta"])) for e in evs
               if e[1] == "response.output_audio.delta") == 2 * sp.samples
    assert all(e[0] == 0.0 for e in rt._audio_events(at, [" Hi"], speech(
        [" Hi"], "alloy", 1.0, "audio/pcm", seeded(1)), 0.5, zero=True))
    # speed scales the duration; the seed decides the voice
    fast = speech([" Hello", " there"], "alloy", 1.5, "audio/pcm", seeded(1))
    slow = speech([" Hello", " there"], "alloy", 0.75, "audio/pcm", seeded(1))
    assert fast.duration < slow.duration
    assert b"".join(fast.chunks(200)) == b"".join(
        speech([" Hello", " there"], "alloy", 1.5, "audio/pcm", seeded(1)).chunks(200))


def test_vad_unit() -> None:
    v = VAD("audio/pcm", 0.5, 300, 200)
    evs = v.feed(pcm(1000))
    assert evs == []
    evs = v.feed(pcm(500, amp=6000)) + v.feed(pcm(300))
    assert [(e.kind, e.ms) for e in evs] == [("start", 700), ("stop", 1700)]
    quiet = VAD("audio/pcm", 0.9, 0, 200)  # a high threshold: this tone is below it
    assert quiet.feed(pcm(500, amp=2000)) == []


def test_g711_formats_round_trip(rclient: Any) -> None:
    with rclient.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.session.update(session={"type": "realtime", "audio": {
            "input": {"format": {"type": "audio/pcmu"}, "turn_detection": None},
            "output": {"format": {"type": "audio/pcma"}}}})
        s = validated(conn.recv_bytes())["session"]
        assert s["audio"]["input"]["turn_detection"] is None
        conn.input_audio_buffer.append(audio=base64.b64encode(b"\xff" * 8 * 500).decode())
        conn.input_audio_buffer.commit()
        evs = recv_until(conn, "conversation.item.done")
        assert evs[0]["type"] == "input_audio_buffer.committed"
        conn.response.create()
        evs = recv_until(conn, "response.done")
    out = b"".join(base64.b64decode(e["delta"]) for e in evs
                   if e["type"] == "response.output_audio.delta")
    transcript = evs[-1]["response"]["output"][0]["content"][0]["transcript"]
    assert 0.2 <= len(out) / 8000 / len(transcript.split()) <= 0.6 + 0.5


def test_items_retrieve_delete_truncate_and_cancel(rclient: Any) -> None:
    with rclient.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.conversation.item.create(item={"id": "item_a", "type": "message", "role": "user",
                                            "content": [{"type": "input_text", "text": "A"}]})
        recv_until(conn, "conversation.item.done")
        conn.conversation.item.create(previous_item_id="root", item={
            "id": "item_b", "type": "message", "role": "system",
            "content": [{"type": "input_text", "text": "B"}]})
        evs = recv_until(conn, "conversation.item.done")
        assert evs[-1]["previous_item_id"] is None
        conn.conversation.item.retrieve(item_id="item_a")
        got = validated(conn.recv_bytes())
        assert got["type"] == "conversation.item.retrieved" and got["item"]["id"] == "item_a"
        conn.conversation.item.delete(item_id="item_b")
        deleted = validated(conn.recv_bytes())
        assert (deleted["type"], deleted["item_id"]) == ("conversation.item.deleted", "item_b")
        conn.conversation.item.retrieve(item_id="item_b")
        assert _err(conn)["code"] == "item_not_found"
        conn.response.create()
        evs = recv_until(conn, "response.done")
        item = evs[-1]["response"]["output"][0]
        conn.conversation.item.truncate(item_id=item["id"], content_index=0, audio_end_ms=100)
        tr = validated(conn.recv_bytes())
        assert tr["type"] == "conversation.item.truncated" and tr["audio_end_ms"] == 100
        conn.conversation.item.truncate(item_id=item["id"], content_index=0,
                                        audio_end_ms=10 ** 7)
        err = validated(conn.recv_bytes())
        assert err["type"] == "error" and err["error"]["param"] == "audio_end_ms"
        conn.response.cancel()
        err = validated(conn.recv_bytes())
        assert err["error"]["code"] == "response_cancel_not_active"


def test_cancel_and_second_create_while_active(make_server: Any) -> None:
    srv = make_server(latency="realistic", output_tokens_mean=400, output_tokens_sigma=0)
    with OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0) as c, \
            c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        text_session(conn)
        conn.response.create()
        assert validated(conn.recv_bytes())["type"] == "response.created"
        conn.response.create(event_id="evt_second")
        conn.response.cancel()
        evs = recv_until(conn, "response.done")
        errs = [e for e in evs if e["type"] == "error"]
        assert errs[0]["error"]["code"] == "conversation_already_has_active_response"
        assert errs[0]["error"]["event_id"] == "evt_second"
        resp = evs[-1]["response"]
        assert resp["status"] == "cancelled"
        assert resp["status_details"] == {"type": "cancelled", "reason": "client_cancelled"}
        text_session(conn)  # still open and serving
    _gauges_zero(srv)


def test_deterministic_with_seed(rclient: Any) -> None:
    texts = []
    for _ in range(2):
        with rclient.realtime.connect(model="gpt-realtime") as conn:
            validated(conn.recv_bytes())
            text_session(conn)
            conn.conversation.item.create(item={"type": "message", "role": "user",
                                                "content": [{"type": "input_text",
                                                             "text": "Same question"}]})
            recv_until(conn, "conversation.item.done")
            conn.response.create()
            evs = recv_until(conn, "response.done")
            texts.append(evs[-1]["response"]["output"][0]["content"][0]["text"])
    assert texts[0] == texts[1]


def test_script_applies(make_server: Any, tmp_path: Any) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps([{"match": {"endpoint": "realtime", "contains": "capital"},
                                   "reply": [{"text": "Paris is the capital."}]}]))
    srv = make_server(script=str(script))
    with OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0) as c, \
            c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        text_session(conn)
        conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "The capital of France?"}]})
        recv_until(conn, "conversation.item.done")
        conn.response.create()
        evs = recv_until(conn, "response.done")
    assert evs[-1]["response"]["output"][0]["content"][0]["text"] == "Paris is the capital."


# -- faults -----------------------------------------------------------------------------------

def _fault_conn(srv: Any, fault: str) -> Any:
    c = OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0)
    return c.realtime.connect(model="gpt-realtime", extra_headers={"X-LLMSim-Fault": fault})


@pytest.mark.parametrize("fault,code", [("429", "rate_limit_exceeded"), ("500", None)])
def test_fault_before_response(rsrv: Any, fault: str, code: str | None) -> None:
    with _fault_conn(rsrv, fault) as conn:
        validated(conn.recv_bytes())
        conn.response.create()
        evs = recv_until(conn, "response.done")
        assert [e["type"] for e in evs] == ["response.created", "error", "response.done"]
        assert evs[1]["error"]["code"] == code
        assert evs[-1]["response"]["status"] == "failed"
        conn.session.update(session={"type": "realtime"})  # the connection stays open
        assert validated(conn.recv_bytes())["type"] == "session.updated"
    _gauges_zero(rsrv)


def test_fault_mid_response_error_and_disconnect(rsrv: Any) -> None:
    with _fault_conn(rsrv, "error-after:3") as conn:
        validated(conn.recv_bytes())
        text_session(conn)
        conn.response.create()
        evs = recv_until(conn, "response.done")
        assert sum(e["type"] == "response.output_text.delta" for e in evs) == 3
        assert evs[-2]["type"] == "error" and evs[-1]["response"]["status"] == "failed"
    with _fault_conn(rsrv, "disconnect-after:3") as conn:
        validated(conn.recv_bytes())
        text_session(conn)
        conn.response.create()
        got = []
        with pytest.raises(ConnectionClosed):  # the connection drops with no response.done
            while True:
                got.append(validated(conn.recv_bytes())["type"])
        assert got.count("response.output_text.delta") == 3 and "response.done" not in got
    _gauges_zero(rsrv)


def test_close_mid_response_releases_gauges(make_server: Any) -> None:
    srv = make_server(latency="realistic", output_tokens_mean=400, output_tokens_sigma=0)
    with OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0) as c:
        with c.realtime.connect(model="gpt-realtime") as conn:
            validated(conn.recv_bytes())
            conn.response.create()
            assert validated(conn.recv_bytes())["type"] == "response.created"
    _gauges_zero(srv)


# -- hostile input ---------------------------------------------------------------------------

def _err(conn: Any) -> dict[str, Any]:
    ev = validated(conn.recv_bytes())
    assert ev["type"] == "error", ev
    return ev["error"]


def _still_open(conn: Any) -> None:
    conn.session.update(session={"type": "realtime"})
    assert validated(conn.recv_bytes())["type"] == "session.updated"


@pytest.mark.parametrize("event,code,param", [
    ({"type": "nope.event"}, "invalid_value", "type"),
    ({"no": "type"}, "missing_required_parameter", "type"),
    ({"type": "input_audio_buffer.append", "audio": "%%%not base64%%%"}, "invalid_value",
     "audio"),
    ({"type": "input_audio_buffer.append", "audio": 5}, "invalid_type", "audio"),
    ({"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty", None),
    ({"type": "session.update", "session": {"type": "realtime", "bogus": 1}},
     "unknown_parameter", "session.bogus"),
    ({"type": "session.update", "session": {"type": "realtime",
                                            "audio": {"output": {"speed": 9}}}},
     "invalid_value", "session.audio.output.speed"),
    ({"type": "session.update", "session": {"type": "realtime",
                                            "audio": {"output": {"voice": "robot"}}}},
     "invalid_value", "session.audio.output.voice"),
    ({"type": "session.update", "session": {"type": "realtime", "audio": {"input": {
        "turn_detection": {"type": "server_vad", "threshold": 2}}}}},
     "invalid_value", "session.audio.input.turn_detection.threshold"),
    ({"type": "session.update", "session": {"type": "realtime", "max_output_tokens": 0}},
     "invalid_value", "session.max_output_tokens"),
    ({"type": "session.update", "session": {"type": "realtime",
                                            "output_modalities": ["text", "audio"]}},
     "invalid_value", "session.output_modalities"),
    ({"type": "session.update", "session": {"type": "realtime", "tool_choice": {
        "type": "function", "name": "missing"}}}, "invalid_value", "session.tool_choice"),
    ({"type": "session.update", "session": {"type": "realtime", "tools": [WEATHER] * 2}},
     "invalid_value", "session.tools[1].name"),
    ({"type": "conversation.item.create", "item": {"type": "message", "role": "robot",
                                                   "content": []}},
     "invalid_value", "item.role"),
    ({"type": "conversation.item.retrieve", "item_id": "item_nope"}, "item_not_found",
     "item_id"),
    ({"type": "response.create", "response": {"voice": "x"}}, "unknown_parameter",
     "response.voice"),
])
def test_bad_events_get_error_events(rclient: Any, event: dict[str, Any], code: str,
                                     param: str | None) -> None:
    with rclient.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.send({**event, "event_id": "evt_1"})  # type: ignore[arg-type]
        err = _err(conn)
        assert (err["code"], err["param"]) == (code, param)
        assert err["event_id"] == "evt_1"
        _still_open(conn)


def test_invalid_json_and_binary(rclient: Any) -> None:
    with rclient.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.send_raw("{not json")
        assert _err(conn)["code"] == "invalid_json"
        conn.send_raw(b"\x00\x01")
        assert _err(conn)["code"] == "invalid_message_type"
        _still_open(conn)


def test_audio_bounds(rclient: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(rt, "MAX_APPEND_B64", 4000)
    monkeypatch.setattr(rt, "MAX_BUFFER_MS", 1000)
    with rclient.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.session.update(session={"type": "realtime",
                                     "audio": {"input": {"turn_detection": None}}})
        validated(conn.recv_bytes())
        conn.input_audio_buffer.append(audio="A" * 4004)
        err = _err(conn)
        assert (err["code"], err["param"]) == ("request_too_large", "audio")
        chunk = base64.b64encode(pcm(60)).decode()  # 3840 base64 characters
        for _ in range(16):  # 960 ms
            conn.input_audio_buffer.append(audio=chunk)
        conn.input_audio_buffer.append(audio=chunk)  # 1020 ms > the 1000 ms bound
        assert _err(conn)["code"] == "input_audio_buffer_too_large"
        conn.input_audio_buffer.clear()
        assert validated(conn.recv_bytes())["type"] == "input_audio_buffer.cleared"
        conn.input_audio_buffer.append(audio=chunk)
        conn.input_audio_buffer.append(audio=chunk)
        conn.input_audio_buffer.commit()
        assert validated(conn.recv_bytes())["type"] == "input_audio_buffer.committed"


def test_oversized_message_closes_1009(make_server: Any) -> None:
    srv = make_server(websocket=WebSocketConfig(max_message_bytes=4096))
    with OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0) as c, \
            c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.input_audio_buffer.append(audio="A" * 8192)
        with pytest.raises(ConnectionClosed) as ei:
            conn.recv_bytes()
        assert "1009" in str(ei.value)
    _gauges_zero(srv)


def test_conversation_is_bounded(rclient: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(rt, "MAX_ITEMS", 3)
    with rclient.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        for i in range(5):
            conn.conversation.item.create(item={"id": f"item_{i}", "type": "message",
                                                "role": "user", "content": [
                                                    {"type": "input_text", "text": str(i)}]})
            recv_until(conn, "conversation.item.done")
        conn.conversation.item.retrieve(item_id="item_0")  # dropped: the oldest go first
        assert _err(conn)["code"] == "item_not_found"
        conn.conversation.item.retrieve(item_id="item_4")
        assert validated(conn.recv_bytes())["type"] == "conversation.item.retrieved"


# -- other clients ------------------------------------------------------------------------------

async def test_openai_agents_realtime_agent_calls_a_tool(rsrv: Any) -> None:
    """The openai-agents SDK's RealtimeAgent runs offline against the simulator: it calls its
    tool, sends the output back and gets the answer."""
    agents = pytest.importorskip("agents")
    from agents.realtime import RealtimeAgent, RealtimeRunner

    calls: list[str] = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Get the weather in a city."""
        calls.append(city)
        return f"sunny in {city}"

    agent = RealtimeAgent(name="Assistant", instructions="Be brief.", tools=[get_weather])
    runner = RealtimeRunner(agent, config={"model_settings": {
        "model_name": "gpt-realtime", "output_modalities": ["text"]}})
    url = rsrv.url.replace("http://", "ws://") + "/v1/realtime?model=gpt-realtime"
    session = await runner.run(model_config={"url": url, "api_key": "sk-test"})
    seen: list[str] = []
    async with session:
        await session.send_message("What is the weather in Paris?")
        async for ev in session:
            seen.append(ev.type)
            assert ev.type != "error", ev
            if ev.type == "agent_end" and "tool_end" in seen:
                break
    assert len(calls) == 1 and "tool_start" in seen


# the openai JS SDK and its WebSocket package, pinned; installed once into a cache directory
JS_PACKAGES = ("openai@7.59.0", "ws@8.23.0")
JS_PROBE = Path(__file__).parent / "js" / "realtime.mjs"


@pytest.fixture(scope="module")
def js_dir() -> Path:
    """A directory where node resolves the pinned packages (``LLMSIM_NODE_DIR``, default
    ``~/.cache/llmsim-tests/node``, its ``openai-realtime`` folder: npm installs there once,
    under a file lock so parallel test workers do not install twice); a skip only when node
    or npm is missing or the install fails (no registry)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("node and npm are needed")
    root = Path(os.environ.get("LLMSIM_NODE_DIR",
                               Path.home() / ".cache" / "llmsim-tests" / "node"))
    d = root / "openai-realtime"
    d.mkdir(parents=True, exist_ok=True)
    stamp = d / "installed.txt"
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        have = all((d / "node_modules" / p.rpartition("@")[0] / "package.json").exists()
                   for p in JS_PACKAGES)
        if not have or not stamp.exists() or stamp.read_text() != " ".join(JS_PACKAGES):
            try:
                subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent",
                                "--no-save", "--prefix", str(d), *JS_PACKAGES], check=True,
                               timeout=300, capture_output=True)
            except (subprocess.SubprocessError, OSError) as exc:
                pytest.skip(f"npm install {' '.join(JS_PACKAGES)} failed: {exc}")
            stamp.write_text(" ".join(JS_PACKAGES))
    shutil.copy(JS_PROBE, d / JS_PROBE.name)  # (an ES module resolves packages from its dir)
    return d


def test_openai_js_realtime_client(rsrv: Any, js_dir: Path) -> None:
    """The openai JS SDK's OpenAIRealtimeWS: a text round trip over the Realtime API."""
    r = subprocess.run(["node", str(js_dir / JS_PROBE.name), rsrv.url], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["status"] == "completed" and out["text"] == out["done"] and out["text"]
    assert out["seen"][0] == "session.created" and out["seen"][-1] == "response.done"


def test_speech_interrupts_audio_response_then_truncate(make_server: Any) -> None:
    """Server VAD: speech during an audio response cancels it (turn_detected); the item
    said so far stays in the conversation, incomplete, and its audio can be truncated."""
    srv = make_server(latency="realistic", output_tokens_mean=60, output_tokens_sigma=0)
    with OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0) as c, \
            c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.response.create()
        evs = recv_until(conn, "response.output_audio.delta")
        item_id = evs[-1]["item_id"]
        conn.input_audio_buffer.append(audio=base64.b64encode(pcm(300, amp=8000)).decode())
        evs = recv_until(conn, "response.done")
        types = [e["type"] for e in evs]
        assert "input_audio_buffer.speech_started" in types
        resp = evs[-1]["response"]
        assert resp["status"] == "cancelled"
        assert resp["status_details"] == {"type": "cancelled", "reason": "turn_detected"}
        item = resp["output"][0]
        assert item["id"] == item_id and item["status"] == "incomplete"
        said = "".join(e["delta"] for e in evs
                       if e["type"] == "response.output_audio_transcript.delta")
        assert item["content"][0]["transcript"].endswith(said)
        conn.conversation.item.retrieve(item_id=item_id)
        got = validated(conn.recv_bytes())
        assert got["type"] == "conversation.item.retrieved" and got["item"]["id"] == item_id
        conn.conversation.item.truncate(item_id=item_id, content_index=0, audio_end_ms=150)
        assert validated(conn.recv_bytes())["type"] == "conversation.item.truncated"
    _gauges_zero(srv)


def test_openai_prefix_path_and_default_model(rsrv: Any) -> None:
    with OpenAI(base_url=rsrv.url + "/openai/v1", api_key="sk-test", max_retries=0) as c, \
            c.realtime.connect() as conn:
        created = validated(conn.recv_bytes())
        assert created["session"]["model"] == "gpt-realtime"
        assert created["session"]["audio"]["input"]["turn_detection"]["type"] == "server_vad"


def test_out_of_band_response_leaves_the_conversation(rclient: Any) -> None:
    with rclient.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        text_session(conn)
        conn.conversation.item.create(item={"id": "item_q", "type": "message", "role": "user",
                                            "content": [{"type": "input_text", "text": "Q"}]})
        recv_until(conn, "conversation.item.done")
        conn.response.create(response={"conversation": "none", "metadata": {"k": "v"},
                                       "input": [{"type": "item_reference", "id": "item_q"}]})
        evs = recv_until(conn, "response.done")
        assert "conversation.item.added" not in [e["type"] for e in evs]
        assert evs[-1]["response"]["metadata"] == {"k": "v"}
        assert evs[-1]["response"]["conversation_id"] is None
        out_id = evs[-1]["response"]["output"][0]["id"]
        conn.conversation.item.retrieve(item_id=out_id)
        assert _err(conn)["code"] == "item_not_found"


def test_rate_limits_updated_and_429_from_the_limiter(make_server: Any) -> None:
    srv = make_server(ratelimit=RateLimitConfig(rpm=2, tpm=100_000),
                      output_tokens_mean=5, output_tokens_sigma=0)
    with OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0) as c, \
            c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        text_session(conn)
        seen = []
        for _ in range(2):
            conn.response.create()
            evs = recv_until(conn, "response.done")
            rl = evs[1]
            assert rl["type"] == "rate_limits.updated"
            seen.append({r["name"]: r for r in rl["rate_limits"]})
        assert seen[0]["requests"]["limit"] == 2
        assert [s["requests"]["remaining"] for s in seen] == [1, 0]
        assert seen[0]["tokens"]["limit"] == 100_000
        conn.response.create()
        evs = recv_until(conn, "response.done")
        assert evs[1]["error"]["code"] == "rate_limit_exceeded"
        assert evs[-1]["response"]["status"] == "failed"
    snap = srv.app.stats.snapshot()
    assert "realtime" in json.dumps(snap)
    _gauges_zero(srv)


def test_random_events_never_break_the_session(rclient: Any, rsrv: Any) -> None:
    """A bounded, seeded fuzz of client events: every answer is a valid server event and
    the session keeps serving."""
    import random

    rng = random.Random(7)
    values: list[Any] = [None, True, -1, 0, 2 ** 40, 1.5, "", "x" * 300, [], {}, [1, {}],
                         {"type": "message"}, "AAAA", "realtime", "audio/pcm"]
    keys = ["session", "item", "audio", "item_id", "response", "previous_item_id",
            "content_index", "audio_end_ms", "type", "event_id", "output_modalities"]
    with rclient.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        text_session(conn)
        for _ in range(150):
            ev: dict[str, Any] = {"type": rng.choice(rt.CLIENT_EVENTS[:-2] + ("x",))}
            for k in rng.sample(keys, rng.randint(0, 4)):
                if k != "type":
                    ev[k] = rng.choice(values)
            if ev["type"] in ("response.create", "response.cancel"):
                continue  # (responses have their own tests; keep this one instant)
            conn.send(ev)  # type: ignore[arg-type]
            conn.session.update(session={"type": "realtime", "output_modalities": ["text"]},
                                event_id="evt_sync")
            while validated(conn.recv_bytes())["type"] != "session.updated":
                pass
        _still_open(conn)
    _gauges_zero(rsrv)


def test_strict_models_know_the_realtime_models(make_server: Any) -> None:
    srv = make_server(strict_models=True)
    with OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0) as c:
        for model, code in (("gpt-realtime-mini", None), ("no-such-model", "model_not_found")):
            with c.realtime.connect(model=model) as conn:
                validated(conn.recv_bytes())
                text_session(conn)
                conn.response.create()
                evs = recv_until(conn, "response.done")
                errs = [e["error"]["code"] for e in evs if e["type"] == "error"]
                assert errs == ([code] if code else [])
    _gauges_zero(srv)


def test_session_time_limit(make_server: Any) -> None:
    srv = make_server(websocket=WebSocketConfig(connection_time_limit_s=0.3))
    with OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0) as c, \
            c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        err = _err(conn)
        assert err["code"] == "session_expired" and "0.3 seconds" in err["message"]
        with pytest.raises(ConnectionClosed):
            conn.recv_bytes()
    _gauges_zero(srv)


async def test_audio_is_paced_in_real_time_on_the_fake_clock() -> None:
    """End to end through the pump on virtual time: the first audio delta comes at the time
    to first token, the next ones every 200 ms of audio, response.done when the audio
    ends (a ~3 s answer takes ~3 s plus TTFT)."""
    import asyncio

    from wsproto import ConnectionType
    from wsproto.connection import Connection
    from wsproto.events import TextMessage

    from llmsim.streaming.clock import FakeClock

    from .memtransport import connect, mem_server
    from .test_websocket_raw import handshake

    clock = FakeClock()
    server = mem_server(clock=clock, latency="realistic", ttft_ms=300, itl_ms=10,
                        output_tokens_mean=10, output_tokens_sigma=0, seed=3)
    proto, tr = connect(server)
    proto.data_received(handshake("/v1/realtime?model=gpt-realtime"))
    client = Connection(ConnectionType.CLIENT)
    for _ in range(100):
        await asyncio.sleep(0)
        if b"\r\n\r\n" in tr.out:
            break
    head, _, rest = tr.drain_client().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101 ")
    client.receive_data(rest)
    t0 = clock.now()
    proto.data_received(client.send(TextMessage(data=json.dumps({
        "type": "response.create", "response": {"output_modalities": ["audio"]}}))))
    got: list[tuple[float, dict[str, Any]]] = []
    for _ in range(200_000):
        await asyncio.sleep(0)
        client.receive_data(tr.drain_client())
        for ev in client.events():
            if isinstance(ev, TextMessage):
                got.append((clock.now() - t0, validated(ev.data)))
        if got and got[-1][1]["type"] == "response.done":
            break
    audio = [(t, base64.b64decode(e["delta"])) for t, e in got
             if e["type"] == "response.output_audio.delta"]
    seconds = sum(len(a) for _, a in audio) / 48000
    assert 1.5 < seconds < 8
    assert audio[0][0] == pytest.approx(0.3, abs=0.01)
    assert [t for t, _ in audio] == pytest.approx([0.3 + 0.2 * k for k in range(len(audio))],
                                                 abs=0.01)
    assert got[-1][0] == pytest.approx(0.3 + seconds, abs=0.01)
    proto.connection_lost(None)
    assert server.app.stats.active_websockets == 0 and server.app.stats.active_streams == 0
