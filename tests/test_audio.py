"""``/v1/audio/*`` through the official SDK (strict): speech in every format (``wave`` decodes
the WAV at the text's spoken length; mutagen reads the other containers' durations),
streamed speech, transcriptions (json, verbose_json with timestamps, text formats, streamed)
and translations; faults, scripts and the upload bounds."""

from __future__ import annotations

import io
import wave
from typing import Any

import httpx
import openai
import pytest
from mutagen.aac import AAC
from mutagen.flac import FLAC
from mutagen.mp3 import MP3
from mutagen.oggopus import OggOpus

from llmsim.api.audio import MAX_AUDIO_BYTES
from llmsim.sim import audio as au
from llmsim.sim.script import parse_script
from llmsim.streaming.clock import FakeClock

from . import faultkit

pytestmark = pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")

TEXT = ("Welcome to the simulator. This sentence is spoken by a synthetic voice, one tone a "
        "word, at about one hundred and fifty words a minute.")
WORDS = len(TEXT.split())


def spoken_length(words: int, speed: float = 1.0) -> float:
    return words / 2.5 / speed  # 150 words a minute


@pytest.mark.parametrize("speed", [1.0, 2.0])
def test_speech_wav_duration_matches_the_text(client: Any, speed: float) -> None:
    r = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT,
                                   response_format="wav", speed=speed)
    w = wave.open(io.BytesIO(r.content))
    assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
    seconds = w.getnframes() / w.getframerate()
    assert abs(seconds - spoken_length(WORDS, speed)) < 0.2 * spoken_length(WORDS, speed)
    frames = w.readframes(w.getnframes())
    assert any(frames[i] for i in range(0, len(frames), 97))  # not silence


@pytest.mark.parametrize("fmt,cls", [("flac", FLAC), ("mp3", MP3), ("opus", OggOpus),
                                     ("aac", AAC)])
def test_speech_other_formats_decode_with_the_same_duration(client: Any, fmt: str,
                                                            cls: Any) -> None:
    r = client.audio.speech.create(model="tts-1-hd", voice="onyx", input=TEXT,
                                   response_format=fmt)
    info = cls(io.BytesIO(r.content)).info
    expect = au.spoken_seconds(TEXT, "onyx")
    assert abs(info.length - expect) < 0.1, (info.length, expect)
    if fmt == "flac":
        assert (info.sample_rate, info.channels, info.bits_per_sample) == (24000, 1, 16)


def test_speech_pcm_and_streaming_response(client: Any) -> None:
    with client.audio.speech.with_streaming_response.create(
            model="gpt-4o-mini-tts", voice="coral", input=TEXT, response_format="pcm",
            instructions="Speak warmly.") as resp:
        assert resp.headers["content-type"] == "audio/pcm"
        chunks = list(resp.iter_bytes())
    pcm = b"".join(chunks)
    assert len(pcm) / 48000 == pytest.approx(au.spoken_seconds(TEXT, "coral"), abs=0.01)


def test_speech_sse_stream(srv: Any) -> None:
    r = httpx.post(srv.url + "/v1/audio/speech",
                   json={"model": "gpt-4o-mini-tts", "voice": "nova", "input": "Hi there.",
                         "stream_format": "sse"})
    import orjson
    events = [orjson.loads(line[6:]) for line in r.text.split("\n") if line.startswith("data: ")]
    assert [e["type"] for e in events][-1] == "speech.audio.done"
    assert all(e["type"] == "speech.audio.delta" for e in events[:-1]) and len(events) > 1
    assert events[-1]["usage"]["input_tokens"] > 0


@pytest.mark.parametrize("body,param", [
    ({"model": "tts-1", "voice": "alloy", "input": "x" * 4097}, "input"),
    ({"model": "tts-1", "voice": "marin", "input": "x"}, "voice"),
    ({"model": "tts-1", "voice": "alloy", "input": "x", "speed": 5}, "speed"),
    ({"model": "tts-1", "voice": "alloy", "input": "x", "response_format": "ogg"},
     "response_format"),
    ({"model": "tts-1", "voice": "alloy", "input": "x", "instructions": "calm"},
     "instructions"),
    ({"model": "tts-1", "voice": "alloy", "input": "x", "stream_format": "sse"},
     "stream_format"),
    ({"model": "tts-1", "input": "x"}, "voice"),
    ({"model": "whisper-1", "voice": "alloy", "input": "x"}, "model"),
])
def test_speech_bad_requests(srv: Any, body: dict[str, Any], param: str) -> None:
    r = httpx.post(srv.url + "/v1/audio/speech", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def wav_file(seconds: float) -> bytes:
    return au.wav(b"\0\0" * int(seconds * au.RATE))


def test_transcription_json_and_verbose(client: Any) -> None:
    r = client.audio.transcriptions.create(model="gpt-4o-transcribe",
                                           file=("a.wav", wav_file(8.0)))
    assert len(r.text.split()) == 20  # 8 s at 150 words a minute
    assert r.usage.type == "tokens" and r.usage.input_token_details.audio_tokens == 134
    r = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav_file(12.0)),
                                           response_format="verbose_json",
                                           timestamp_granularities=["word", "segment"])
    assert r.duration == 12.0 and r.usage.seconds == 12
    assert len(r.words) == 30 and r.words[-1].end == pytest.approx(12.0, abs=0.01)
    starts = [w.start for w in r.words]
    assert starts == sorted(starts)
    assert r.segments and r.segments[0].start == 0.0
    assert " ".join(s.text.strip() for s in r.segments) == r.text
    r2 = client.audio.transcriptions.create(model="whisper-1", file=("a.wav", wav_file(12.0)))
    assert r2.text == r.text  # the same upload, the same transcript
    # not WAV: the duration is estimated from the size (128 kbit/s)
    r = client.audio.transcriptions.create(model="whisper-1",
                                           file=("a.mp3", b"\xff\xf3" + b"\0" * 159_998),
                                           response_format="verbose_json")
    assert r.duration == 10.0


def test_transcription_text_formats_and_translation(client: Any) -> None:
    f = ("a.wav", wav_file(20.0))
    text = client.audio.transcriptions.create(model="whisper-1", file=f, response_format="text")
    assert isinstance(text, str) and len(text.split()) == 50
    srt = client.audio.transcriptions.create(model="whisper-1", file=f, response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> 00:00:") and "\n\n2\n" in srt
    vtt = client.audio.transcriptions.create(model="whisper-1", file=f, response_format="vtt")
    assert vtt.startswith("WEBVTT\n\n00:00:00.000 --> ")
    tr = client.audio.translations.create(model="whisper-1", file=f)
    assert len(tr.text.split()) == 50
    tv = client.audio.translations.create(model="whisper-1", file=f,
                                          response_format="verbose_json")
    assert tv.language == "english" and tv.duration == 20.0


def test_transcription_stream(client: Any) -> None:
    events = list(client.audio.transcriptions.create(
        model="gpt-4o-mini-transcribe", file=("a.wav", wav_file(4.0)), stream=True,
        include=["logprobs"]))
    deltas = [e for e in events if e.type == "transcript.text.delta"]
    assert events[-1].type == "transcript.text.done" and len(deltas) == 10
    assert "".join(e.delta for e in deltas) == events[-1].text
    assert deltas[0].logprobs and events[-1].usage.output_tokens > 0


def test_transcription_bad_requests_and_upload_bound(srv: Any, client: Any) -> None:
    url = srv.url + "/v1/audio/transcriptions"
    f = [("file", ("a.wav", wav_file(1.0), "audio/wav"))]
    for data, param in [({"model": "whisper-1", "response_format": "srt",
                          "timestamp_granularities[]": "word"}, "timestamp_granularities"),
                        ({"model": "gpt-4o-transcribe", "response_format": "srt"},
                         "response_format"),
                        ({"model": "whisper-1", "stream": "true"}, "stream"),
                        ({"model": "whisper-1", "temperature": "3"}, "temperature"),
                        ({}, "model")]:
        r = httpx.post(url, files=f, data=data)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(url, data={"model": "whisper-1"}, files=[("file", ("a", b"", "audio/wav"))])
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"
    r = httpx.post(url, content=b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
                   b"whisper-1\r\n--B--\r\n",
                   headers={"content-type": "multipart/form-data; boundary=B"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "missing_required_parameter"
    big = [("file", ("a.mp3", b"\0" * (MAX_AUDIO_BYTES + 1), "audio/mpeg"))]
    r = httpx.post(url, files=big, data={"model": "whisper-1"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "audio_too_large"
    with pytest.raises(openai.BadRequestError):
        client.audio.translations.create(model="gpt-4o-transcribe", file=("a.wav", wav_file(1)))


async def test_faults_scripts_and_pacing() -> None:
    srv = faultkit.server(FakeClock(start=0.0), latency="realistic")
    json_h = [("content-type", "application/json")]
    body = {"model": "tts-1", "voice": "alloy", "input": TEXT, "response_format": "pcm"}
    ex = await faultkit.exchange(srv, body, path="/v1/audio/speech", headers=json_h)
    assert ex.status == 200 and ex.complete
    seconds = len(ex.body) / 48000
    # first bytes after ttft (~0.3 s), the rest at 0.1 s per second of audio
    assert 0.05 < ex.times[0] < 2.0 and len(ex.chunks) > 5
    assert ex.times[-1] - ex.times[0] == pytest.approx(0.1 * seconds * (1 - 1 / len(ex.chunks)),
                                                       rel=0.2)
    ex = await faultkit.exchange(srv, body, path="/v1/audio/speech",
                                 headers=json_h + [("x-llmsim-fault", "503")])
    assert ex.status == 503
    ex = await faultkit.exchange(srv, body, path="/v1/audio/speech",
                                 headers=json_h + [("x-llmsim-fault", "disconnect-after:2")])
    assert not ex.complete and 0 < len(ex.body) < 48000 * seconds
    # raw audio has no error frame: a mid-stream error drops the connection, so the client
    # never takes the cut audio for the whole
    ex = await faultkit.exchange(srv, body, path="/v1/audio/speech",
                                 headers=json_h + [("x-llmsim-fault", "error-after:2")])
    assert ex.aborted and not ex.complete
    srv.app.script.install(parse_script({"rules": [
        {"match": {"endpoint": "audio.transcriptions"},
         "reply": [{"text": "Hello from the script."}, {"fault": "429"}]}]}))
    form = (b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
            b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            b"Content-Type: audio/wav\r\n\r\n" + wav_file(1.0) + b"\r\n--B--\r\n")
    mp = [("content-type", "multipart/form-data; boundary=B")]
    ex = await faultkit.exchange(srv, form, path="/v1/audio/transcriptions", headers=mp)
    assert ex.status == 200 and ex.json()["text"] == "Hello from the script."
    ex = await faultkit.exchange(srv, form, path="/v1/audio/transcriptions", headers=mp)
    assert ex.status == 429
    ex = await faultkit.exchange(srv, form, path="/v1/audio/translations",
                                 headers=mp + [("x-llmsim-fault", "500")])
    assert ex.status == 500


async def test_openai_agents_voice_pipeline(srv: Any) -> None:
    """The openai-agents voice pipeline offline: speech in → transcription → agent → speech
    out, all against llmsim (STT and TTS through the audio endpoints)."""
    np = pytest.importorskip("numpy")
    from agents import Agent, OpenAIChatCompletionsModel, set_tracing_disabled
    from agents.voice import (
        AudioInput,
        OpenAIVoiceModelProvider,
        SingleAgentVoiceWorkflow,
        VoicePipeline,
        VoicePipelineConfig,
    )

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0)
    srv.app.script.install(parse_script({"rules": [
        {"match": {"endpoint": "audio.transcriptions"}, "reply": [{"text": "What time is it?"}]},
        {"match": {"endpoint": "chat.completions", "contains": "What time is it?"},
         "reply": [{"text": "It is noon. Have a good lunch."}]}]}))
    agent = Agent(name="clock", instructions="Tell the time.",
                  model=OpenAIChatCompletionsModel(model="gpt-4o", openai_client=client))
    pipeline = VoicePipeline(workflow=SingleAgentVoiceWorkflow(agent),
                             config=VoicePipelineConfig(
                                 model_provider=OpenAIVoiceModelProvider(openai_client=client)))
    pcm_in = np.frombuffer(au.speak("What time is it?", "alloy", 1.0), dtype=np.int16)
    try:
        result = await pipeline.run(AudioInput(buffer=pcm_in))
        chunks = []
        async for event in result.stream():
            if event.type == "voice_stream_event_audio" and event.data is not None:
                chunks.append(event.data.tobytes())
    finally:
        await client.close()
    pcm = b"".join(chunks)
    seconds = len(pcm) / 48000
    expect = spoken_length(len("It is noon. Have a good lunch.".split()))
    assert abs(seconds - expect) < 0.2 * expect + 0.5, (seconds, expect)


def test_transcription_nested_form_fields(client: Any) -> None:
    r = client.audio.transcriptions.create(
        model="gpt-4o-transcribe", file=("a.wav", wav_file(2.0)),
        chunking_strategy={"type": "server_vad", "threshold": 0.5}, language="en",
        temperature=0.2)
    assert len(r.text.split()) == 5


def test_flac_frame_checksums() -> None:
    """The frame CRCs a FLAC decoder verifies (mutagen reads only STREAMINFO): CRC-16 has
    FLAC's check value, and the first frame's CRC-8 and CRC-16 hold."""
    import struct

    from llmsim.sim.tokens import run_steps

    assert au._crc16(b"123456789") == 0xFEE8 and au._crc8(b"123456789") == 0xF4
    assert au._crc32(b"123456789") == 0x89A1897F  # Ogg's page CRC (POSIX without xorout)
    pcm = au.speak(TEXT, "echo", 1.0)
    data = run_steps(au.encode("flac", pcm))
    frame = data[42:42 + 8 + 1 + 2 * au.FLAC_BLOCK + 2]
    assert frame[:2] == b"\xff\xf8" and au._crc8(frame[:7]) == frame[7]
    assert struct.unpack(">H", frame[-2:])[0] == au._crc16(frame[:-2])
    assert frame[9:11] == pcm[1:2] + pcm[0:1]  # big-endian samples
