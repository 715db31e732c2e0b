"""``POST /v1/images/generations``, ``/v1/images/edits`` and ``/v1/images/variations``.

Each image is a mosaic generated from the prompt (and the edited images' bytes, and
``--seed``): valid PNG, JPEG or WebP of the requested size, the same bytes for the same
request (:mod:`llmsim.sim.imaging`). Per model, as the real API validates:

- ``gpt-image-1`` / ``gpt-image-1-mini``: ``size`` 1024x1024, 1536x1024, 1024x1536 or auto
  (1024x1024), ``quality`` low/medium/high/auto (medium), ``n`` 1-10, ``output_format``
  png/jpeg/webp, ``output_compression`` 0-100 (the JPEG quantiser; WebP is lossless),
  ``background`` (transparent: PNG and WebP get an alpha channel, some tiles clear),
  ``moderation`` and ``input_fidelity`` validated and echoed, answers
  ``b64_json`` only (``response_format`` is a 400), ``usage`` with the image tokens of
  OpenAI's size × quality table, ``stream`` with ``partial_images`` 0-3 (SSE
  ``image_generation.partial_image`` … ``image_generation.completed``; edits:
  ``image_edit.*``); edits take 1-16 images.
- ``dall-e-3``: 1024x1024, 1792x1024, 1024x1792; ``n`` 1; ``quality`` standard/hd;
  ``style`` vivid/natural; ``revised_prompt`` (the prompt); no edits or variations.
- ``dall-e-2`` (the default model): 256x256, 512x512, 1024x1024; ``n`` 1-10; edits and
  variations of one square PNG under 4 MB.

``response_format=url`` answers a URL on this server (``GET /llmsim/files/{name}``, bounded
store: :class:`llmsim.api.media.FileStore`). Work time: the profile's ``gen_s`` for a medium
1024x1024 image, scaled by the image tokens (GPT image) or pixels (DALL-E), +10% per extra
image, jittered; the answer is held for it counted as running, a stream spreads its events
over it.
"""

from __future__ import annotations

import base64
import hashlib
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import APIError, E, quoted
from ..messages import JSONResponse, Request, Result, StreamResponse
from ..multipart import Upload
from ..sim import imaging
from ..sim import tokens as tok
from ..sim.decide import Usage
from ..sim.rng import seeded
from ..streaming.dialect import Dialect
from ..streaming.stream import EventStream
from .media import file_url, files_of, form_ints, script_turn, upload, work_seconds
from .validate import V, deliver_after, paced

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["register", "IMAGE_TOKENS", "MAX_EDIT_IMAGES"]

GPT_SIZES = ("1024x1024", "1536x1024", "1024x1536", "auto")
# output image tokens per image, OpenAI's gpt-image-1 table (quality × size)
IMAGE_TOKENS = {"low": {"1024x1024": 272, "1024x1536": 408, "1536x1024": 400},
                "medium": {"1024x1024": 1056, "1024x1536": 1584, "1536x1024": 1568},
                "high": {"1024x1024": 4160, "1024x1536": 6240, "1536x1024": 6208}}
INPUT_IMAGE_TOKENS = 765  # an edited image's input tokens (a 1024x1024 image at high detail)
MAX_EDIT_IMAGES = 16
DALLE2_MAX_BYTES = 4 * 1024 * 1024
GPT_MAX_BYTES = 50 * 1024 * 1024
CONTENT_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}


@dataclass(frozen=True, slots=True)
class Rules:
    sizes: tuple[str, ...]
    default_size: str
    n_max: int
    prompt_max: int
    qualities: tuple[str, ...]
    gpt: bool
    edits: bool
    variations: bool


GPT = Rules(GPT_SIZES, "auto", 10, 32000, ("low", "medium", "high", "auto"), True, True, False)
RULES = {
    "gpt-image-1": GPT, "gpt-image-1-mini": GPT,
    "dall-e-3": Rules(("1024x1024", "1792x1024", "1024x1792"), "1024x1024", 1, 4000,
                      ("standard", "hd", "auto"), False, False, False),
    "dall-e-2": Rules(("256x256", "512x512", "1024x1024"), "1024x1024", 10, 1000,
                      ("standard", "auto"), False, True, True),
}
GPT_ONLY = ("output_format", "output_compression", "background", "moderation", "stream",
            "partial_images", "input_fidelity")
KNOWN = {"generations": frozenset(("prompt", "model", "n", "size", "quality", "response_format",
                                   "style", "user") + GPT_ONLY),
         "edits": frozenset(("image", "mask", "prompt", "model", "n", "size", "quality",
                             "response_format", "user") + GPT_ONLY),
         "variations": frozenset(("image", "model", "n", "size", "response_format", "user"))}


def _sse(etype: str, data: Any) -> bytes:
    return b"event: " + etype.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _error_events(err: APIError) -> list[tuple[str, Any]]:
    return [("error", {"type": "error", "error": err.to_dict()})]


def _sse_error(err: APIError, seq: int) -> bytes:
    return _sse("error", _error_events(err)[0][1])


IMAGES_SSE = Dialect("images", numbered=False, sse=_sse, sse_error=_sse_error,
                     error_events=_error_events,
                     token_types=frozenset({"image_generation.partial_image",
                                            "image_generation.completed",
                                            "image_edit.partial_image",
                                            "image_edit.completed"}))


@dataclass(slots=True)
class Job:
    """A validated request: what to draw and how to answer."""

    kind: str  # generations | edits | variations
    model: str
    rules: Rules
    prompt: str
    n: int
    size: str  # as answered ("auto" resolved)
    quality: str  # as answered
    fmt: str
    compression: int
    url: bool
    background: str | None
    stream: bool
    partials: int
    seed: bytes
    input_images: int
    style: str | None


def _image_kind(data: bytes) -> str | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def _check_image(f: Upload, param: str, rules: Rules) -> None:
    kind = _image_kind(f.data)
    if not rules.gpt:
        if kind != "png":
            raise E.image_invalid_file.at(param, formats="PNG")
        if len(f.data) > DALLE2_MAX_BYTES:
            raise E.image_too_large.at(param, size=len(f.data), max=DALLE2_MAX_BYTES)
        w, h = struct.unpack(">II", f.data[16:24]) if len(f.data) >= 24 else (0, 0)
        if w != h:
            raise E.image_not_square.at(param, width=w, height=h)
        return
    if kind is None:
        raise E.image_invalid_file.at(param, formats="PNG, JPEG or WebP")
    if len(f.data) > GPT_MAX_BYTES:
        raise E.image_too_large.at(param, size=len(f.data), max=GPT_MAX_BYTES)


def _parse(kind: str, body: dict[str, Any], app: Services) -> Job:
    form_ints(body, "n", "output_compression", "partial_images")
    for key in body:
        if key not in KNOWN[kind]:
            raise E.unrecognized_argument.at(key=key)
    v = V(body)
    model = v.str("model", "dall-e-2") or "dall-e-2"
    profile = app.model(model, kind="image")
    rules = RULES.get(profile.id, GPT)
    if kind == "edits" and not rules.edits or kind == "variations" and not rules.variations:
        raise E.invalid_value.at("model", value=model, allowed=quoted(
            m for m, r in RULES.items() if (r.edits if kind == "edits" else r.variations)))
    if not rules.gpt:
        for key in GPT_ONLY:
            if body.get(key) is not None:
                raise E.unsupported_parameter.at(key, hint="")
    elif body.get("response_format") is not None:
        raise E.unknown_parameter.at("response_format")
    prompt = ""
    if kind != "variations":
        p = v.str("prompt", max_len=rules.prompt_max)
        if not p:
            raise E.missing.at("prompt")
        prompt = p
    n = v.int("n", 1, lo=1, hi=10) or 1
    if n > rules.n_max:
        raise E.image_n_one.at("n")
    size = v.str("size", rules.default_size, choices=rules.sizes) or rules.default_size
    if size == "auto":
        size = "1024x1024"
    quality = v.str("quality", "auto", choices=rules.qualities) if kind != "variations" \
        else "auto"
    if quality == "auto" or quality is None:
        quality = "medium" if rules.gpt else "standard"
    style = None
    if profile.id == "dall-e-3":
        style = v.str("style", "vivid", choices=("vivid", "natural"))
    elif body.get("style") is not None:
        raise E.unsupported_parameter.at("style", hint="")
    url = v.str("response_format", "url", choices=("url", "b64_json")) == "url" \
        and not rules.gpt
    fmt = v.str("output_format", "png", choices=imaging.FORMATS) or "png"
    compression = v.int("output_compression", 100, lo=0, hi=100)
    if compression is None:
        compression = 100
    background = v.str("background", "auto", choices=("transparent", "opaque", "auto")) \
        if rules.gpt else None
    if background == "transparent" and fmt == "jpeg":
        raise E.invalid_value.at("background", value="transparent",
                                 allowed="'opaque' and 'auto' with output_format 'jpeg'")
    v.str("moderation", choices=("low", "auto"))
    v.str("input_fidelity", choices=("high", "low"))
    v.str("user")
    stream = bool(v.bool("stream", False))
    partials = v.int("partial_images", 0, lo=0, hi=3) or 0
    if partials and not stream:
        raise E.partial_images_without_stream.at("partial_images")
    seed = hashlib.blake2b(orjson.dumps([profile.id, prompt, app.config.seed]),
                           digest_size=16).digest()
    images: list[Upload] = []
    if kind != "generations":
        raw = body.get("image")
        files = raw if isinstance(raw, list) else [raw]
        limit = MAX_EDIT_IMAGES if rules.gpt else 1
        if len(files) > limit:
            raise E.too_many_images.at("image", max=limit, count=len(files))
        for i, f in enumerate(files):
            name = "image" if len(files) == 1 else f"image[{i}]"
            images.append(upload(f, name))
            _check_image(images[-1], name, rules)
        if body.get("mask") is not None:
            _check_image(upload(body["mask"], "mask"), "mask", rules)
        h = hashlib.blake2b(seed, digest_size=16)
        for f in images:
            h.update(f.data)
        seed = h.digest()
    return Job(kind, model, rules, prompt, n, size, quality, fmt, compression, url,
               background, stream, partials, seed, len(images), style)


def _usage(job: Job, enc: str) -> dict[str, Any] | None:
    if not job.rules.gpt:
        return None
    text = tok.count_tokens(job.prompt, enc)
    image_in = job.input_images * INPUT_IMAGE_TOKENS
    out = IMAGE_TOKENS[job.quality][job.size] * job.n
    return {"input_tokens": text + image_in, "output_tokens": out,
            "total_tokens": text + image_in + out,
            "input_tokens_details": {"text_tokens": text, "image_tokens": image_in},
            "output_tokens_details": {"text_tokens": 0, "image_tokens": out}}


def _seconds(job: Job, gen_s: float) -> float:
    w, h = (int(x) for x in job.size.split("x"))
    if job.rules.gpt:
        scale = IMAGE_TOKENS[job.quality][job.size] / IMAGE_TOKENS["medium"]["1024x1024"]
    else:
        scale = (w * h / (1024 * 1024)) ** 0.5 * (1.5 if job.quality == "hd" else 1.0)
    return gen_s * scale * (1 + 0.1 * (job.n - 1))


async def _encode(job: Job, i: int, coarser: int = 0) -> bytes:
    w, h = (int(x) for x in job.size.split("x"))
    pic = imaging.picture(job.seed + bytes([i]), w, h, coarser,
                          alpha=job.background == "transparent")
    if job.fmt == "jpeg":
        quant = max(2, round(2 + (100 - job.compression) * 0.4))
        return await paced(imaging.jpeg(pic, quant))
    return await paced(imaging.encode(pic, job.fmt))


async def handle(kind: str, req: Request, app: Services) -> Result:
    job = _parse(kind, req.json_object(), app)
    profile = app.model(job.model, kind="image")
    await script_turn(app, req, "images", profile, job.prompt)
    rng = seeded(int.from_bytes(job.seed[:8], "big"))
    seconds = work_seconds(app, profile, _seconds(job, profile.gen_s), rng)
    usage = _usage(job, profile.encoding)
    billed = Usage(usage["input_tokens"], usage["output_tokens"]) if usage else None
    created = int(app.clock.time())
    if job.stream:
        frames = [[await _encode(job, i, job.partials - k) for k in range(job.partials)]
                  + [await _encode(job, i)] for i in range(job.n)]
        stream = EventStream(_plan(job, frames, seconds, created, usage), IMAGES_SSE,
                             model=job.model, usage=billed)
        return StreamResponse(stream, usage=billed)
    data = []
    for i in range(job.n):
        img = await _encode(job, i)
        if job.url:
            name = files_of(app).put(app.clock.time(), job.fmt, CONTENT_TYPES[job.fmt], img)
            item: dict[str, Any] = {"url": file_url(req, name)}
        else:
            item = {"b64_json": base64.b64encode(img).decode()}
        if job.style is not None:
            item["revised_prompt"] = job.prompt
        data.append(item)
    await deliver_after(app, job.model, seconds)
    out: dict[str, Any] = {"created": created, "data": data}
    if job.rules.gpt:
        out.update(background="transparent" if job.background == "transparent" else "opaque",
                   output_format=job.fmt, quality=job.quality, size=job.size, usage=usage)
    return JSONResponse(out, model=job.model, usage=billed)


def _plan(job: Job, frames: list[list[bytes]], seconds: float, created: int,
          usage: dict[str, Any] | None) -> Iterator[tuple[float, str, Any]]:
    prefix = "image_generation" if job.kind == "generations" else "image_edit"
    common = {"background": job.background or "auto", "created_at": created,
              "output_format": job.fmt, "quality": job.quality, "size": job.size}
    each = seconds / job.n
    for images in frames:
        step = each / len(images)
        for k, img in enumerate(images[:-1]):
            yield step, f"{prefix}.partial_image", {
                "type": f"{prefix}.partial_image", "b64_json": base64.b64encode(img).decode(),
                "partial_image_index": k, **common}
        yield step, f"{prefix}.completed", {
            "type": f"{prefix}.completed", "b64_json": base64.b64encode(images[-1]).decode(),
            **common, "usage": {k: v for k, v in (usage or {}).items()
                                if k != "output_tokens_details"}}


def register(app: Host) -> None:
    for kind in ("generations", "edits", "variations"):
        async def handler(req: Request, app: Services, kind: str = kind) -> Result:
            return await handle(kind, req, app)
        app.router.add("POST", f"/v1/images/{kind}", handler, f"images.{kind}",
                       stream_capable=kind != "variations")
