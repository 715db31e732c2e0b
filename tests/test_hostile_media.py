"""Hostile input on the media endpoints (issue 33): the multipart parser on mutated forms,
and mutated bodies on every media route — each answer a 2xx or a 4xx in the OpenAI envelope
naming what is wrong, never a 500, a hang or an exception out of the parser."""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest

from llmsim.errors import APIError
from llmsim.multipart import MAX_TEXT_FIELD, Upload, parse_form
from llmsim.sim import audio as au
from llmsim.sim import imaging
from llmsim.sim.tokens import run_steps as tok_run

from . import faultkit

CTYPE = "multipart/form-data; boundary=XyZ"


def form(*parts: tuple[str, bytes, str | None]) -> bytes:
    out = b""
    for name, value, filename in parts:
        disp = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        out += f"--XyZ\r\nContent-Disposition: {disp}\r\n".encode()
        if filename:
            out += b"Content-Type: application/octet-stream\r\n"
        out += b"\r\n" + value + b"\r\n"
    return out + b"--XyZ--\r\n"


VALID = form(("model", b"whisper-1", None), ("file", au.wav(b"\0\0" * 2400), "a.wav"),
             ("response_format", b"verbose_json", None),
             ("timestamp_granularities[]", b"word", None),
             ("timestamp_granularities[]", b"segment", None))


def mutate(rng: random.Random, data: bytes) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 6)):
        op = rng.randrange(5)
        i = rng.randrange(len(b) + 1)
        if op == 0 and b:
            del b[i:i + rng.randint(1, 40)]
        elif op == 1:
            b[i:i] = rng.choice([b"--XyZ", b"\r\n", b"\r\n\r\n", b'"', b";", b"[]",
                                 b"filename=", b"\xff\xfe", b"--XyZ--"])
        elif op == 2 and b:
            b[min(i, len(b) - 1)] = rng.randrange(256)
        elif op == 3:
            b = b[:i]
        else:
            b[i:i] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
    return bytes(b)


def test_parser_is_total_on_mutated_forms() -> None:
    got = parse_form(VALID, CTYPE)
    assert got["model"] == "whisper-1" and isinstance(got["file"], Upload)
    assert got["timestamp_granularities"] == ["word", "segment"]
    rng = random.Random(33)
    outcomes = {"ok": 0, "refused": 0}
    for _ in range(3000):
        try:
            parse_form(mutate(rng, VALID), CTYPE)
            outcomes["ok"] += 1
        except APIError as exc:
            assert exc.status == 400
            outcomes["refused"] += 1
    assert outcomes["ok"] > 100 and outcomes["refused"] > 100  # both paths exercised


def test_text_field_bound() -> None:
    big = form(("prompt", b"x" * (MAX_TEXT_FIELD + 1), None))
    with pytest.raises(APIError) as e:
        parse_form(big, CTYPE)
    assert e.value.param == "prompt" and e.value.code == "string_above_max_length"


HOSTILE_VALUES: list[Any] = [None, True, -1, 0, 1e308, -1e30, 2 ** 62, "", "x" * 5000, [], {},
                             [1, 2], {"a": {"b": []}}, "\u0000", "1024x1024x", "NaN"]
ROUTES = [
    ("/v1/images/generations", {"model": "dall-e-2", "prompt": "a cat", "size": "256x256",
                                "n": 1, "response_format": "b64_json"}),
    ("/v1/images/generations", {"model": "gpt-image-1", "prompt": "a cat", "quality": "low",
                                "output_format": "jpeg", "output_compression": 50,
                                "stream": True, "partial_images": 1}),
    ("/v1/audio/speech", {"model": "gpt-4o-mini-tts", "voice": "alloy", "input": "hi there",
                          "response_format": "flac", "speed": 1.5, "stream_format": "sse"}),
    ("/v1/moderations", {"model": "omni-moderation-latest",
                         "input": [{"type": "text", "text": "x"}]}),
]


@pytest.mark.parametrize("path,base", ROUTES, ids=[f"{p}:{i}" for i, (p, _) in
                                                     enumerate(ROUTES)])
async def test_mutated_json_bodies(path: str, base: dict[str, Any]) -> None:
    srv = faultkit.server()
    rng = random.Random(path)
    h = [("content-type", "application/json")]
    statuses = set()
    for _ in range(40):
        body = dict(base)
        for _ in range(rng.randint(1, 3)):
            key = rng.choice([*base, "bogus"])
            body[key] = rng.choice(HOSTILE_VALUES)
        ex = await faultkit.exchange(srv, orjson.dumps(body), path=path, headers=h)
        assert ex.complete and (ex.status < 300 or 400 <= ex.status < 500), (body, ex.body)
        if ex.status >= 400:
            err = ex.json()["error"]
            assert err["message"] and err["type"] == "invalid_request_error", err
        statuses.add(ex.status // 100)
    assert 4 in statuses


@pytest.mark.parametrize("path", ["/v1/audio/transcriptions", "/v1/audio/translations",
                                  "/v1/images/edits", "/v1/images/variations"])
async def test_mutated_forms_on_the_upload_routes(path: str) -> None:
    srv = faultkit.server()
    rng = random.Random(path)
    h = [("content-type", CTYPE)]
    for _ in range(40):
        ex = await faultkit.exchange(srv, mutate(rng, VALID), path=path, headers=h)
        assert ex.complete and (ex.status < 300 or 400 <= ex.status < 500), ex.body[:300]


TINY_PNG = tok_run(imaging.png(imaging.picture(b"x", 16, 16)))
UPLOAD_IMAGE = form(("prompt", b"x", None), ("image", TINY_PNG, "a.png"))
EVERY_ROUTE = [
    ("/v1/images/generations", orjson.dumps({"prompt": "x", "size": "256x256"}),
     "application/json"),
    ("/v1/images/edits", UPLOAD_IMAGE, CTYPE),
    ("/v1/images/variations", form(("image", TINY_PNG, "a.png")), CTYPE),
    ("/v1/audio/speech", orjson.dumps({"model": "tts-1", "voice": "alloy", "input": "x"}),
     "application/json"),
    ("/v1/audio/transcriptions", VALID, CTYPE),
    ("/v1/audio/translations", form(("model", b"whisper-1", None),
                                    ("file", au.wav(b"\0\0" * 2400), "a.wav")), CTYPE),
    ("/v1/moderations", orjson.dumps({"input": "x"}), "application/json"),
]


@pytest.mark.parametrize("path,body,ctype", EVERY_ROUTE, ids=[r[0] for r in EVERY_ROUTE])
async def test_every_media_route_answers_and_takes_faults(path: str, body: bytes,
                                                          ctype: str) -> None:
    srv = faultkit.server()
    h = [("content-type", ctype)]
    ex = await faultkit.exchange(srv, body, path=path, headers=h)
    assert ex.status == 200 and ex.complete, ex.body[:300]
    for fault, status in (("429", 429), ("500", 500), ("503", 503)):
        ex = await faultkit.exchange(srv, body, path=path, headers=h + [("x-llmsim-fault",
                                                                          fault)])
        assert ex.status == status and ex.json()["error"]["message"]
    snap = srv.app.stats.snapshot()
    assert sum(snap["requests_by_endpoint"].values()) == 4
