"""``POST /v1/audio/speech``, ``/v1/audio/transcriptions`` and ``/v1/audio/translations``.

Speech (``tts-1``, ``tts-1-hd``, ``gpt-4o-mini-tts``): the synthetic voice of
:mod:`llmsim.sim.audio` saying ``input`` (at most 4096 characters) in ``voice`` at ``speed``
(0.25-4), as ``response_format`` mp3 (default), opus, aac, flac, wav or pcm; wav, pcm and
flac carry the voice, the compressed formats valid silent frames of the same duration. The
audio is streamed as it is "generated": the first bytes after the profile's ``ttft_ms``, the
rest at ``gen_s`` seconds per second of audio (chunked, so ``with_streaming_response`` reads
it progressively). ``stream_format: "sse"`` (gpt-4o-mini-tts) sends ``speech.audio.delta``
events of base64 PCM chunks and ``speech.audio.done`` with token usage (audio output tokens at
1250 a minute, from the price ratio of the model's audio tokens and its per-minute estimate).
``instructions`` (gpt-4o-mini-tts) is validated and does not change the voice.

Transcriptions (``whisper-1``, ``gpt-4o-transcribe``, ``gpt-4o-mini-transcribe``,
``gpt-transcribe``: the openai-agents voice pipeline's default, like gpt-4o-transcribe) and
translations (``whisper-1``): a multipart upload ``file`` of at most :data:`MAX_AUDIO_BYTES`;
its duration is read from a WAV header, else estimated from its size at 128 kbit/s
(assumption). The transcript is a script turn's ``text`` (rules on ``audio.transcriptions``
match the request's ``prompt``) or generated text of the length the duration would hold at a
speaking rate of 150 words a minute. ``response_format`` json (default), text, srt, vtt,
verbose_json (whisper-1; segments, and words with ``timestamp_granularities[]=word``);
``stream=true`` (gpt-4o models) streams ``transcript.text.delta`` events then
``transcript.text.done``. ``chunking_strategy``, ``known_speaker_*``, ``temperature`` and
``language`` are validated and do not change the transcript. Usage: whisper-1 bills the duration (seconds), the gpt-4o models
tokens (audio input at 1000 a minute, assumption from the price ratio). Work time: ``ttft_ms``
plus ``gen_s`` per second of audio.
"""

from __future__ import annotations

import base64
import hashlib
import math
import random
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import APIError, E
from ..messages import JSONResponse, RawResponse, Request, Result, StreamResponse
from ..sim import audio as au
from ..sim import tokens as tok
from ..sim.decide import Usage
from ..sim.rng import seeded
from ..streaming.dialect import Dialect
from ..streaming.stream import DISCONNECT, EventStream
from .media import form_floats, script_turn, upload, work_seconds
from .validate import V, deliver_after, paced

if TYPE_CHECKING:
    from ..sim.models import ModelProfile
    from .services import Host, Services

__all__ = ["register", "MAX_AUDIO_BYTES", "MAX_INPUT_CHARS", "MAX_TRANSCRIPT_WORDS"]

MAX_INPUT_CHARS = 4096
MAX_AUDIO_BYTES = 25 * 1024 * 1024  # the real API's upload limit
MAX_TRANSCRIPT_WORDS = 20_000
SPEECH_OUT_TOKENS_PER_S = 1250 / 60
AUDIO_IN_TOKENS_PER_S = 1000 / 60
ESTIMATE_BYTES_PER_S = 16_000  # a non-WAV upload's duration: 128 kbit/s
CHUNK_S = 0.5  # audio per streamed chunk
GPT_TTS = frozenset(("gpt-4o-mini-tts",))
OLD_VOICES = frozenset(("alloy", "ash", "coral", "echo", "fable", "onyx", "nova", "sage",
                        "shimmer"))
TRANSCRIBE_FORMATS = ("json", "text", "srt", "verbose_json", "vtt")


def _raw(etype: str, data: Any) -> bytes:
    return data if isinstance(data, bytes) else b""


def _no_events(err: APIError) -> list[tuple[str, Any]]:
    return [(DISCONNECT, None)]  # raw audio has no error frame: the connection drops


def _raw_dialect(ctype: str) -> Dialect:
    return Dialect("audio.speech", numbered=False, sse=_raw, sse_error=lambda e, s: b"",
                   error_events=_no_events, token_types=frozenset({"audio"}),
                   stream_headers=f"content-type: {ctype}\r\n".encode())


RAW = {fmt: _raw_dialect(ctype) for fmt, ctype in au.CONTENT_TYPES.items()}


def _sse(etype: str, data: Any) -> bytes:
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _error_events(err: APIError) -> list[tuple[str, Any]]:
    return [("error", {"type": "error", "error": err.to_dict()})]


SPEECH_SSE = Dialect("audio.speech", numbered=False, sse=_sse,
                     sse_error=lambda e, s: _sse("error", _error_events(e)[0][1]),
                     error_events=_error_events, token_types=frozenset({"speech.audio.delta"}),
                     terminals=frozenset({"speech.audio.done"}))
TRANSCRIPT_SSE = Dialect("audio.transcriptions", numbered=False, sse=_sse,
                         sse_error=lambda e, s: _sse("error", _error_events(e)[0][1]),
                         error_events=_error_events,
                         token_types=frozenset({"transcript.text.delta"}),
                         terminals=frozenset({"transcript.text.done"}))


def _model(app: Services, body: dict[str, Any], kind: str) -> tuple[str, ModelProfile]:
    model = body.get("model")
    if model is None:
        raise E.missing.at("model")
    return model, app.model(model, kind=kind)


# -- speech ----------------------------------------------------------------------------------

async def speech(req: Request, app: Services) -> Result:
    body = req.json_object()
    v = V(body)
    for key in body:
        if key not in ("model", "input", "voice", "instructions", "response_format", "speed",
                       "stream_format"):
            raise E.unrecognized_argument.at(key=key)
    model, profile = _model(app, body, "speech")
    text = v.str("input", max_len=MAX_INPUT_CHARS)
    if not text:
        raise E.missing.at("input")
    voice = body.get("voice")
    if isinstance(voice, dict):
        voice = V(voice, "voice.").str("id", max_len=256)
    if voice is None:
        raise E.missing.at("voice")
    if not isinstance(voice, str):
        raise E.invalid_type.at("voice", expected="a string or an object with an 'id'")
    gpt = profile.id in GPT_TTS
    allowed = au.VOICES if gpt else OLD_VOICES
    if voice not in allowed and not voice.startswith("voice_"):
        raise E.invalid_value.at("voice", value=voice, allowed=", ".join(f"'{x}'" for x in
                                                                          allowed))
    instructions = v.str("instructions", max_len=MAX_INPUT_CHARS)
    if instructions is not None and not gpt:
        raise E.unsupported_parameter.at("instructions", hint="")
    fmt = v.str("response_format", "mp3", choices=au.FORMATS) or "mp3"
    speed = v.num("speed", 1.0, lo=0.25, hi=4.0) or 1.0
    sse = v.str("stream_format", "audio", choices=("sse", "audio")) == "sse"
    if sse and not gpt:
        raise E.unsupported_parameter.at("stream_format", hint="")
    await script_turn(app, req, "audio.speech", profile, text)
    pcm = au.speak(text, voice, speed)
    seconds = len(pcm) / (2 * au.RATE)
    data = pcm if sse else await paced(au.encode(fmt, pcm))
    rng = seeded(len(text) * 7919 + len(pcm))
    first = work_seconds(app, profile, profile.ttft_ms / 1000, rng)
    pace = 0.0 if app.config.latency == "instant" else profile.gen_s
    n_in = tok.count_tokens(text, profile.encoding)
    n_out = math.ceil(seconds * SPEECH_OUT_TOKENS_PER_S)
    usage = Usage(n_in, n_out) if gpt else None
    chunks = max(1, math.ceil(seconds / CHUNK_S))
    size = -(-len(data) // chunks)
    if sse:
        size += size & 1  # whole 16-bit samples a delta
    pieces = [data[i:i + size] for i in range(0, len(data), size)] or [b""]
    gap = pace * seconds / len(pieces)
    plan: Iterator[tuple[float, str, Any]]
    if sse:
        plan = _sse_plan(pieces, first, gap, n_in, n_out)
        stream = EventStream(plan, SPEECH_SSE, model=model, usage=usage)
    else:
        plan = ((first if i == 0 else gap, "audio", p) for i, p in enumerate(pieces))
        stream = EventStream(plan, RAW[fmt], model=model, usage=usage)
    return StreamResponse(stream, usage=usage)


def _sse_plan(pieces: list[bytes], first: float, gap: float, n_in: int,
              n_out: int) -> Iterator[tuple[float, str, Any]]:
    for i, p in enumerate(pieces):
        yield first if i == 0 else gap, "speech.audio.delta", {
            "type": "speech.audio.delta", "audio": base64.b64encode(p).decode()}
    yield 0.0, "speech.audio.done", {"type": "speech.audio.done", "usage": {
        "input_tokens": n_in, "output_tokens": n_out, "total_tokens": n_in + n_out}}


# -- transcriptions and translations ---------------------------------------------------------

def _transcript(rng: random.Random, words: int) -> str:
    if words <= 0:
        return ""
    pieces = tok.lorem_pieces(int(words * 1.6) + 8, rng)
    out = "".join(pieces).split()[:words]
    text = " ".join(out)
    return text if text.endswith((".", "!", "?")) else text.rstrip(",;:") + "."


def _clock(t: float, sep: str) -> str:
    ms = round(t * 1000)
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _ids(text: str, enc: str) -> list[int]:
    """Stand-in token ids of ``text`` (stable per piece; not the tokenizer's ids)."""
    return [int.from_bytes(hashlib.blake2b(p.encode(), digest_size=4).digest(), "big") % 50257
            for p in tok.split_pieces(text, enc)]


def _segments(times: list[tuple[str, float, float]], enc: str) -> list[dict[str, Any]]:
    segs: list[dict[str, Any]] = []
    cur: list[tuple[str, float, float]] = []
    for i, w in enumerate(times):
        cur.append(w)
        if len(cur) >= 24 or w[0][-1:] in ".!?" and len(cur) >= 6 or i == len(times) - 1:
            text = " " + " ".join(x[0] for x in cur)
            segs.append({"id": len(segs), "seek": int(cur[0][1] * 100) // 3000 * 3000,
                         "start": round(cur[0][1], 2), "end": round(cur[-1][2], 2),
                         "text": text, "tokens": _ids(text, enc),
                         "temperature": 0.0, "avg_logprob": -0.21, "compression_ratio": 1.4,
                         "no_speech_prob": 0.01})
            cur = []
    return segs


async def transcribe(task: str, req: Request, app: Services) -> Result:
    body = req.json_object()
    form_floats(body, "temperature")
    known = ("file", "model", "language", "prompt", "response_format", "temperature",
             "timestamp_granularities", "stream", "include", "chunking_strategy",
             "known_speaker_names", "known_speaker_references", "languages")
    for key in body:
        base = key.split("[", 1)[0]  # a form's nested object: chunking_strategy[type]
        if base not in known or task == "translate" and base in (
                "language", "stream", "include", "chunking_strategy",
                "timestamp_granularities", "known_speaker_names", "known_speaker_references",
                "languages"):
            raise E.unrecognized_argument.at(key=key)
    chunking = body.get("chunking_strategy")
    if chunking is not None and chunking != "auto" and not isinstance(chunking, dict):
        raise E.invalid_value.at("chunking_strategy", value=str(chunking),
                                 allowed="'auto' or a server_vad object")
    v = V(body)
    kind = "transcription"
    model, profile = _model(app, body, kind)
    whisper = profile.id == "whisper-1"
    if task == "translate" and not whisper:
        raise E.invalid_value.at("model", value=model, allowed="'whisper-1'")
    f = upload(body.get("file"), "file")
    if len(f.data) > MAX_AUDIO_BYTES:
        raise E.audio_too_large.at("file", size=len(f.data), max=MAX_AUDIO_BYTES)
    if not f.data:
        raise E.audio_invalid.at("file")
    language = v.str("language", max_len=16)
    langs = body.get("languages")  # gpt-transcribe's language hints
    if isinstance(langs, str):
        langs = [langs]
    if langs is not None and (not isinstance(langs, list) or len(langs) > 16
                              or not all(isinstance(x, str) and len(x) <= 16 for x in langs)):
        raise E.invalid_type.at("languages", expected="an array of at most 16 language codes")
    prompt = v.str("prompt", max_len=MAX_INPUT_CHARS) or ""
    formats = TRANSCRIBE_FORMATS if whisper else ("json", "text")
    fmt = v.str("response_format", "json", choices=formats) or "json"
    v.num("temperature", lo=0.0, hi=1.0)
    grans = body.get("timestamp_granularities") or []
    if isinstance(grans, str):
        grans = [grans]
    for g in grans:
        if g not in ("word", "segment"):
            raise E.invalid_value.at("timestamp_granularities", value=g,
                                     allowed="'word' and 'segment'")
    if grans and fmt != "verbose_json":
        raise E.granularities_need_verbose.at("timestamp_granularities")
    stream = bool(v.bool("stream", False))
    if stream and whisper:
        raise E.unsupported_parameter.at("stream", hint="")
    include = body.get("include") or []
    include = [include] if isinstance(include, str) else include
    logprobs = "logprobs" in include
    if logprobs and (whisper or fmt != "json"):
        raise E.unsupported_parameter.at("include", hint="")
    duration = au.wav_seconds(f.data)
    if duration is None:
        duration = len(f.data) / ESTIMATE_BYTES_PER_S
    endpoint = "audio.transcriptions" if task == "transcribe" else "audio.translations"
    turn = await script_turn(app, req, endpoint, profile, prompt)
    digest = hashlib.blake2b(f.data, digest_size=8).digest()
    rng = seeded(int.from_bytes(digest, "big") ^ (app.config.seed or 0))
    if turn is not None and turn.text is not None:
        text = turn.text
    else:
        text = _transcript(rng, min(MAX_TRANSCRIPT_WORDS, round(duration * 2.5)))
    times = au.word_times(text, "alloy", 1.0)
    spoken = times[-1][2] if times else 0.0
    scale = duration / spoken if spoken else 1.0
    times = [(w, s * scale, e * scale) for w, s, e in times]
    first = work_seconds(app, profile, profile.ttft_ms / 1000, rng)
    work = 0.0 if app.config.latency == "instant" else profile.gen_s * duration
    n_text = tok.count_tokens(text, profile.encoding)
    n_audio = math.ceil(duration * AUDIO_IN_TOKENS_PER_S)
    n_prompt = tok.count_tokens(prompt, profile.encoding) if prompt else 0
    if whisper:
        usage_obj: dict[str, Any] = {"type": "duration", "seconds": math.ceil(duration)}
        billed = None
    else:
        usage_obj = {"type": "tokens", "input_tokens": n_audio + n_prompt,
                     "input_token_details": {"audio_tokens": n_audio, "text_tokens": n_prompt},
                     "output_tokens": n_text, "total_tokens": n_audio + n_prompt + n_text}
        billed = Usage(n_audio + n_prompt, n_text)
    if stream:
        plan = _transcript_plan(times, text, first, work, usage_obj, logprobs)
        return StreamResponse(EventStream(plan, TRANSCRIPT_SSE, model=model, usage=billed),
                              usage=billed)
    await deliver_after(app, model, first + work)
    if fmt in ("text", "srt", "vtt"):
        segs = _segments(times, profile.encoding)
        if fmt == "text":
            out = text + "\n"
        elif fmt == "srt":
            out = "".join(f"{i + 1}\n{_clock(s['start'], ',')} --> {_clock(s['end'], ',')}\n"
                          f"{s['text'].strip()}\n\n" for i, s in enumerate(segs))
        else:
            out = "WEBVTT\n\n" + "".join(f"{_clock(s['start'], '.')} --> "
                                         f"{_clock(s['end'], '.')}\n{s['text'].strip()}\n\n"
                                         for s in segs)
        return RawResponse(out.encode(), content_type="text/plain; charset=utf-8")
    if fmt == "verbose_json":
        data: dict[str, Any] = {"task": "transcribe" if task == "transcribe" else "translate",
                                "language": "english" if task == "translate" or not language
                                else language, "duration": round(duration, 2), "text": text}
        if not grans or "segment" in grans:
            data["segments"] = _segments(times, profile.encoding)
        if "word" in grans:
            data["words"] = [{"word": w.strip(".,!?;:"), "start": round(s, 2),
                              "end": round(e, 2)} for w, s, e in times]
        if task == "transcribe":
            data["usage"] = usage_obj
        return JSONResponse(data, model=model, usage=billed)
    data = {"text": text}
    if task == "transcribe":
        data["usage"] = usage_obj
        if logprobs:
            data["logprobs"] = [{"token": p, "logprob": -0.05, "bytes": list(p.encode())}
                                for p in tok.split_pieces(text, profile.encoding)[:4096]]
    return JSONResponse(data, model=model, usage=billed)


def _transcript_plan(times: list[tuple[str, float, float]], text: str, first: float,
                     work: float, usage: dict[str, Any],
                     logprobs: bool) -> Iterator[tuple[float, str, Any]]:
    gap = work / max(1, len(times))
    for i, (w, _, _) in enumerate(times):
        delta = w if i == 0 else " " + w
        ev: dict[str, Any] = {"type": "transcript.text.delta", "delta": delta}
        if logprobs:
            ev["logprobs"] = [{"token": delta, "logprob": -0.05, "bytes": list(delta.encode())}]
        yield first if i == 0 else gap, "transcript.text.delta", ev
    done: dict[str, Any] = {"type": "transcript.text.done", "text": text, "usage": usage}
    yield first if not times else gap, "transcript.text.done", done


def register(app: Host) -> None:
    app.router.add("POST", "/v1/audio/speech", speech, "audio.speech", streaming=True)

    async def transcriptions(req: Request, app: Services) -> Result:
        return await transcribe("transcribe", req, app)

    async def translations(req: Request, app: Services) -> Result:
        return await transcribe("translate", req, app)

    app.router.add("POST", "/v1/audio/transcriptions", transcriptions,
                   "audio.transcriptions", stream_capable=True)
    app.router.add("POST", "/v1/audio/translations", translations, "audio.translations")
