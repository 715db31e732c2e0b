"""``POST /v1/moderations``: every category and score of the real API for each input,
deterministic from its text (:mod:`llmsim.sim.moderation`).

``input`` is a string, a list of strings (one result each, at most :data:`MAX_INPUTS`), or a
list of multimodal items (``{"type": "text", "text"}`` / ``{"type": "image_url",
"image_url": {"url"}}``, one result for them all, at most one image; omni-moderation only).
``model``: ``omni-moderation-latest`` (default) or ``text-moderation-latest`` (text only; its
``illicit`` categories are false and 0). A category is flagged only where a script rule on the
``moderations`` endpoint matches the input's text and its turn says ``flag`` (see
:mod:`llmsim.sim.script`); each input moves the rule's cursor. Held for the model's time
(``ttft_ms`` plus ``prefill_ms_per_1k`` per 1000 input tokens) counted as running.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import E
from ..messages import JSONResponse, Request
from ..sim import tokens as tok
from ..sim.decide import Usage
from ..sim.moderation import result
from ..sim.rng import new_id, request_rng
from .media import script_turn
from .validate import V, deliver_after, paced

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["register", "create", "MAX_INPUTS", "MAX_IMAGES"]

MAX_INPUTS = 256  # llmsim's bound on the strings of one request
MAX_IMAGES = 1  # omni-moderation takes one image a request
MAX_URL = 20 * 1024 * 1024  # an image URL or data URL's characters


def _items(raw: list[Any]) -> tuple[str, int]:
    """The text and image count of a multimodal ``input``."""
    texts = []
    images = 0
    for i, item in enumerate(raw):
        p = f"input[{i}]"
        if not isinstance(item, dict):
            raise E.invalid_type.at(p, expected="an object")
        kind = item.get("type")
        if kind == "text":
            t = V(item, p + ".").str("text")
            if t is None:
                raise E.missing.at(p + ".text")
            texts.append(t)
        elif kind == "image_url":
            img = V(item, p + ".").dict("image_url")
            if img is None:
                raise E.missing.at(p + ".image_url")
            url = V(img, p + ".image_url.").str("url", max_len=MAX_URL)
            if not url:
                raise E.missing.at(p + ".image_url.url")
            images += 1
            if images > MAX_IMAGES:
                raise E.too_many_images.at("input", max=MAX_IMAGES, count=images)
        else:
            raise E.invalid_value.at(p + ".type", value=str(kind), allowed="'text' and "
                                     "'image_url'")
    return "\n".join(texts), images


async def create(req: Request, app: Services) -> JSONResponse:
    body = req.json_object()
    for key in body:
        if key not in ("input", "model"):
            raise E.unrecognized_argument.at(key=key)
    model = V(body).str("model", "omni-moderation-latest") or "omni-moderation-latest"
    profile = app.model(model, kind="moderation")
    omni = profile.id.startswith("omni-")
    raw = body.get("input")
    inputs: list[tuple[str, int]]
    if raw is None:
        raise E.missing.at("input")
    if isinstance(raw, str):
        inputs = [(raw, 0)]
    elif isinstance(raw, list) and raw and all(isinstance(x, str) for x in raw):
        if len(raw) > MAX_INPUTS:
            raise E.array_too_long.at("input", max_len=MAX_INPUTS, length=len(raw))
        inputs = [(x, 0) for x in raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, dict) for x in raw):
        if not omni:
            raise E.model_not_supported.at("model", model=model, what="image inputs")
        inputs = [_items(raw)]
    elif isinstance(raw, list) and not raw:
        raise E.empty_array.at("input", min_len=1)
    else:
        raise E.invalid_type.at("input", expected="a string, an array of strings or an "
                                "array of input objects")
    total = 0
    for i, (text, _) in enumerate(inputs):
        n = await paced(tok.count_tokens_steps(text, profile.encoding,
                                               cap=profile.context_window))
        total += n
        if total > profile.context_window:
            raise E.context_prompt.at("input" if len(inputs) == 1 else f"input[{i}]",
                                      window=profile.context_window, least="", total=total,
                                      prompt=total, completion=0)
    seed = app.config.seed or 0
    results = []
    for text, images in inputs:
        turn = await script_turn(app, req, "moderations", profile, text)
        flags = turn.flag if turn is not None else ()
        results.append(result(text, flags, omni=omni, images=images, seed=seed))
    rng = request_rng(app.config.seed, "/v1/moderations", body)
    await deliver_after(app, model, app.latency(profile).ttft(rng, total))
    return JSONResponse({"id": new_id("modr-"), "model": model, "results": results},
                        model=model, usage=Usage(total))


def register(app: Host) -> None:
    app.router.add("POST", "/v1/moderations", create, "moderations")
