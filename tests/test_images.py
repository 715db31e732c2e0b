"""``/v1/images/*`` through the official SDK (strict): generations, edits, variations and the
streamed partial images; Pillow decodes every image at the requested size and format."""

from __future__ import annotations

import base64
import io
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from llmsim.api import media
from llmsim.multipart import MAX_PARTS
from llmsim.sim.script import parse_script
from llmsim.streaming.clock import FakeClock

from . import faultkit

pytestmark = pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")


def decode(b64: str) -> Image.Image:
    img = Image.open(io.BytesIO(base64.b64decode(b64)))
    img.load()
    return img


def png_bytes(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (10, 20, 30)).save(buf, "PNG")
    return buf.getvalue()


@pytest.mark.parametrize("fmt,size", [("png", "1024x1024"), ("jpeg", "1536x1024"),
                                      ("webp", "1024x1536")])
def test_gpt_image_formats_sizes_and_usage(client: Any, fmt: str, size: str) -> None:
    r = client.images.generate(model="gpt-image-1", prompt="a red fox in snow", size=size,
                               output_format=fmt, quality="low", n=2)
    assert len(r.data) == 2 and r.output_format == fmt and r.size == size
    w, h = (int(x) for x in size.split("x"))
    imgs = [decode(d.b64_json) for d in r.data]
    assert all(i.size == (w, h) and i.format == fmt.upper() for i in imgs)
    assert imgs[0].tobytes() != imgs[1].tobytes()  # each image of n its own
    assert r.usage.output_tokens == {"1024x1024": 272, "1536x1024": 400,
                                     "1024x1536": 408}[size] * 2
    assert r.usage.input_tokens == r.usage.input_tokens_details.text_tokens > 0
    assert r.quality == "low" and r.background == "opaque"


def test_deterministic_from_prompt(client: Any) -> None:
    a = client.images.generate(model="gpt-image-1", prompt="a lighthouse", quality="low")
    b = client.images.generate(model="gpt-image-1", prompt="a lighthouse", quality="low")
    c = client.images.generate(model="gpt-image-1", prompt="a lighthouse at dusk",
                               quality="low")
    assert a.data[0].b64_json == b.data[0].b64_json != c.data[0].b64_json
    assert a.size == "1024x1024"  # auto


def test_dalle_sizes_url_and_revised_prompt(client: Any, srv: Any) -> None:
    r = client.images.generate(model="dall-e-3", prompt="a cat", size="1792x1024",
                               quality="hd", style="natural")
    assert r.data[0].revised_prompt == "a cat" and r.data[0].url
    got = httpx.get(r.data[0].url)
    assert got.status_code == 200 and got.headers["content-type"] == "image/png"
    assert Image.open(io.BytesIO(got.content)).size == (1792, 1024)
    r = client.images.generate(prompt="a dog", size="256x256", n=3,
                               response_format="b64_json")  # dall-e-2, the default
    assert [decode(d.b64_json).size for d in r.data] == [(256, 256)] * 3
    assert r.usage is None


def test_url_store_expires_and_is_bounded() -> None:
    store = media.FileStore(budget=100, ttl=10)
    a = store.put(0, "png", "image/png", b"x" * 60)
    assert store.get(5, a) == ("image/png", b"x" * 60)
    b = store.put(5, "png", "image/png", b"y" * 60)  # over budget: the oldest goes
    assert store.get(5, a) is None and store.get(5, b) is not None and store.bytes == 60
    assert store.get(16, b) is None and store.bytes == 0 and len(store) == 0


@pytest.mark.parametrize("body,param,code", [
    ({"model": "gpt-image-1", "prompt": "x", "size": "512x512"}, "size", "invalid_value"),
    ({"model": "dall-e-2", "prompt": "x", "size": "1536x1024"}, "size", "invalid_value"),
    ({"model": "dall-e-3", "prompt": "x", "n": 2}, "n", "invalid_value"),
    ({"model": "dall-e-2", "prompt": "x", "n": 11}, "n", "integer_above_max_value"),
    ({"model": "dall-e-2", "prompt": "x" * 1001}, "prompt", "string_above_max_length"),
    ({"model": "gpt-image-1", "prompt": "x", "response_format": "url"}, "response_format",
     "unknown_parameter"),
    ({"model": "dall-e-3", "prompt": "x", "output_format": "png"}, "output_format",
     "unsupported_parameter"),
    ({"model": "gpt-image-1", "prompt": "x", "partial_images": 2}, "partial_images",
     "invalid_value"),
    ({"model": "gpt-image-1", "prompt": "x", "output_compression": 101},
     "output_compression", "integer_above_max_value"),
    ({"model": "gpt-4o", "prompt": "x"}, "model", "model_not_supported"),
    ({"model": "gpt-image-1"}, "prompt", "missing_required_parameter"),
])
def test_bad_generation_requests(srv: Any, body: dict[str, Any], param: str,
                                 code: str) -> None:
    r = httpx.post(srv.url + "/v1/images/generations", json=body)
    assert r.status_code == 400, r.json()
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == code


def test_stream_partial_images(client: Any) -> None:
    events = list(client.images.generate(model="gpt-image-1", prompt="a tree", stream=True,
                                         partial_images=2, quality="medium",
                                         output_format="webp"))
    assert [e.type for e in events] == ["image_generation.partial_image"] * 2 + [
        "image_generation.completed"]
    assert [e.partial_image_index for e in events[:2]] == [0, 1]
    imgs = [decode(e.b64_json) for e in events]
    assert all(i.size == (1024, 1024) and i.format == "WEBP" for i in imgs)
    assert len({i.tobytes() for i in imgs}) == 3  # the partials sharpen into the final
    assert events[-1].usage.output_tokens == 1056


def test_edit_and_stream_edit(client: Any) -> None:
    src = png_bytes(64, 64)
    r = client.images.edit(model="gpt-image-1", image=[("a.png", src), ("b.png", src)],
                           prompt="make it blue", size="1024x1536", output_format="jpeg")
    img = decode(r.data[0].b64_json)
    assert img.size == (1024, 1536) and img.format == "JPEG"
    assert r.usage.input_tokens_details.image_tokens == 2 * 765
    events = list(client.images.edit(model="gpt-image-1", image=("a.png", src),
                                     prompt="blue", stream=True, partial_images=1))
    assert [e.type for e in events] == ["image_edit.partial_image", "image_edit.completed"]
    r = client.images.edit(image=("a.png", src), prompt="blue", size="512x512",
                           response_format="b64_json")  # dall-e-2
    assert decode(r.data[0].b64_json).size == (512, 512)


def test_variations(client: Any) -> None:
    r = client.images.create_variation(image=("a.png", png_bytes(32, 32)), n=2,
                                       size="256x256", response_format="b64_json")
    assert [decode(d.b64_json).size for d in r.data] == [(256, 256)] * 2
    with pytest.raises(openai.BadRequestError) as e:
        client.images.create_variation(image=("a.png", png_bytes(32, 16)))
    assert e.value.body["param"] == "image" and e.value.body["code"] == "invalid_image"
    with pytest.raises(openai.BadRequestError) as e:
        client.images.create_variation(image=("a.txt", b"not an image"))
    assert e.value.body["code"] == "invalid_image_format"


def test_hostile_multipart(srv: Any) -> None:
    url = srv.url + "/v1/images/edits"
    parts = "".join(f'--B\r\nContent-Disposition: form-data; name="f{i}"\r\n\r\nx\r\n'
                    for i in range(MAX_PARTS + 1)) + "--B--\r\n"
    for body, ctype in [
        (parts, "multipart/form-data; boundary=B"),  # too many parts
        ("--B\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nx", "multipart/form-"
         "data; boundary=B"),  # no closing boundary
        ("--B\r\n" + "X-A: " + "a" * 10000 + "\r\n\r\nx\r\n--B--\r\n",
         "multipart/form-data; boundary=B"),  # a part's headers over the bound
        ("x", "multipart/form-data"),  # no boundary
    ]:
        r = httpx.post(url, content=body.encode(), headers={"content-type": ctype})
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_multipart", r.text
    # a gpt-image edit of 17 images: over the bound of 16
    files = [("image[]", ("a.png", png_bytes(8, 8), "image/png"))] * 17
    r2 = httpx.post(url, files=files, data={"prompt": "x", "model": "gpt-image-1"})
    assert r2.status_code == 400 and r2.json()["error"]["code"] == "array_above_max_length"
    # DALL-E 2: a PNG over 4 MB
    big = png_bytes(8, 8) + b"\0" * (4 * 1024 * 1024)
    r2 = httpx.post(url, files=[("image", ("a.png", big, "image/png"))], data={"prompt": "x"})
    assert r2.status_code == 400 and r2.json()["error"]["code"] == "image_too_large"


async def test_generation_time_from_the_profile_on_the_fake_clock() -> None:
    srv = faultkit.server(FakeClock(start=0.0), latency="realistic")
    body = {"model": "gpt-image-1", "prompt": "a boat", "quality": "low"}
    ex = await faultkit.exchange(srv, body, path="/v1/images/generations",
                                 headers=[("content-type", "application/json")])
    assert ex.status == 200 and ex.complete
    # gpt_image-1: gen_s 20 s for medium; low is 272/1056 of it (jittered log-normally)
    assert 20 * 272 / 1056 / 3 < ex.times[0] < 20 * 272 / 1056 * 3
    body.update(stream=True, partial_images=3)
    t0 = srv.app.clock.now()
    ex = await faultkit.exchange(srv, body, path="/v1/images/generations",
                                 headers=[("content-type", "application/json")])
    types = [e for e, _ in ex.sse()]
    assert types == ["image_generation.partial_image"] * 3 + ["image_generation.completed"]
    gaps = [t - t0 for t in ex.times]
    assert gaps == sorted(gaps) and gaps[-1] > 1.0  # spread over the work time


async def test_faults_and_scripts() -> None:
    srv = faultkit.server()
    json_h = [("content-type", "application/json")]
    body = {"model": "gpt-image-1", "prompt": "a boat", "quality": "low"}
    ex = await faultkit.exchange(srv, body, path="/v1/images/generations",
                                 headers=json_h + [("x-llmsim-fault", "429")])
    assert ex.status == 429 and ex.json()["error"]["code"] == "rate_limit_exceeded"
    ex = await faultkit.exchange(srv, dict(body, stream=True, partial_images=2),
                                 path="/v1/images/generations",
                                 headers=json_h + [("x-llmsim-fault", "disconnect-after:1")])
    assert ex.status == 200 and not ex.complete
    assert [e for e, _ in ex.sse()] == ["image_generation.partial_image"]
    srv.app.script.install(parse_script({"rules": [
        {"match": {"endpoint": "images", "contains": "forbidden"},
         "reply": [{"error": {"status": 400, "code": "moderation_blocked",
                              "message": "Your request was rejected by the safety system."}}]}]}))
    ex = await faultkit.exchange(srv, dict(body, prompt="a forbidden thing"),
                                 path="/v1/images/generations", headers=json_h)
    assert ex.status == 400 and ex.json()["error"]["code"] == "moderation_blocked"
    ex = await faultkit.exchange(srv, body, path="/v1/images/generations", headers=json_h)
    assert ex.status == 200


def test_record_then_replay(make_server: Any, tmp_path: Any) -> None:
    provider = make_server(seed=11)
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path))
    with openai.OpenAI(base_url=rec.url + "/v1", api_key="k", max_retries=0) as c:
        a = c.images.generate(model="gpt-image-1", prompt="a recorded owl", quality="low")
        s = [e.type for e in c.images.generate(model="gpt-image-1", prompt="a recorded owl",
                                                 quality="low", stream=True, partial_images=1)]
    player = make_server(replay=str(tmp_path), replay_speed=0, seed=99)
    with openai.OpenAI(base_url=player.url + "/v1", api_key="k", max_retries=0) as c:
        b = c.images.generate(model="gpt-image-1", prompt="a recorded owl", quality="low")
        s2 = [e.type for e in c.images.generate(model="gpt-image-1", prompt="a recorded owl",
                                                  quality="low", stream=True,
                                                  partial_images=1)]
    assert a.data[0].b64_json == b.data[0].b64_json and s == s2
    assert decode(b.data[0].b64_json).size == (1024, 1024)


def test_encoders_on_unaligned_tiles() -> None:
    """Tiles that do not fall on the 8x8 grid take the JPEG encoder's DCT path; every
    encoder decodes to the mosaic (JPEG within its quantiser, PNG and WebP exactly)."""
    from dataclasses import replace

    from llmsim.sim import imaging
    from llmsim.sim.tokens import run_steps

    p = imaging.picture(b"dog", 100, 60)
    p = replace(p, xs=(0, 13, 57, 100), ys=(0, 21, 60),
                colors=tuple(r[:3] for r in p.colors[:2]), bits=tuple(r[:3] for r in p.bits[:2]))
    ref = Image.open(io.BytesIO(run_steps(imaging.png(p)))).convert("RGB")
    assert ref.getpixel((12, 20)) == p.colors[0][0] and ref.getpixel((57, 21)) == p.colors[1][2]
    web = Image.open(io.BytesIO(run_steps(imaging.webp(p)))).convert("RGB")
    assert web.tobytes() == ref.tobytes()
    jpg = Image.open(io.BytesIO(run_steps(imaging.jpeg(p, 2)))).convert("RGB")
    diff = [abs(a - b) for a, b in zip(jpg.tobytes(), ref.tobytes(), strict=True)]
    assert jpg.size == (100, 60) and sum(diff) / len(diff) < 3


@pytest.mark.parametrize("fmt", ["png", "webp"])
def test_transparent_background(client: Any, fmt: str) -> None:
    r = client.images.generate(model="gpt-image-1", prompt="a logo", background="transparent",
                               output_format=fmt, quality="low")
    img = decode(r.data[0].b64_json)
    assert r.background == "transparent" and img.mode == "RGBA" and img.size == (1024, 1024)
    alphas = set(img.getchannel("A").tobytes())
    assert alphas == {0, 255}  # clear tiles and opaque ones
    opaque = decode(client.images.generate(model="gpt-image-1", prompt="a logo",
                                           output_format=fmt, quality="low").data[0].b64_json)
    assert opaque.mode == "RGB"
