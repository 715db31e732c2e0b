"""``POST /v1/embeddings``: parse → vectors (:mod:`llmsim.sim.embed`) → the list object.

``input`` is a string, a list of strings, a token array or a list of token arrays (at most
:data:`MAX_INPUTS`; each at most the model's ``context_window`` tokens, 8192 for OpenAI's
models; all together at most :data:`MAX_TOTAL_TOKENS`), ``dimensions`` shortens the vectors of
the text-embedding-3 models, ``encoding_format`` is ``float`` or ``base64`` (the SDK's default:
little-endian float32), ``user`` is validated and ignored. The answer is held for the model's
time (``ttft_ms`` plus ``prefill_ms_per_1k`` per 1000 input tokens, jittered as a TTFT) under
the capacity model, counted as a running request; usage counts the input tokens.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..errors import APIError
from ..messages import JSONResponse, Request
from ..sim import tokens as tok
from ..sim.decide import Usage
from ..sim.embed import embed, to_base64
from ..sim.rng import request_rng
from .completions import decode_tokens, token_array, vocab_size
from .validate import V, deliver_after, got, paced

if TYPE_CHECKING:
    from ..app import App

__all__ = ["register", "create", "MAX_INPUTS", "MAX_TOTAL_TOKENS"]

MAX_INPUTS = 2048  # the real API's limit on inputs per request
MAX_TOTAL_TOKENS = 300_000  # the real API's limit on the tokens of one request
YIELD_EVERY = 16  # inputs embedded between two turns of the event loop
KNOWN_FIELDS = frozenset(("input", "model", "dimensions", "encoding_format", "user"))


def _invalid_input() -> APIError:
    return APIError(400, "'$.input' is invalid. Please check the API reference: "
                    "https://platform.openai.com/docs/api-reference.", param="input",
                    code="invalid_value")


def _inputs(body: dict[str, Any], vocab: int) -> list[str | list[int]]:
    raw = body.get("input")
    if raw is None:
        raise APIError(400, "Missing required parameter: 'input'.", param="input",
                       code="missing_required_parameter")
    if isinstance(raw, str):
        items: list[Any] = [raw]
    elif isinstance(raw, list) and raw and all(type(x) is int for x in raw):
        return [token_array(raw, "input", vocab)]
    elif isinstance(raw, list):
        items = raw
    else:
        raise APIError(400, "Invalid type for 'input': expected one of a string, array of "
                       f"strings, array of integers or array of arrays of integers, but got "
                       f"{got(raw)} instead.", param="input", code="invalid_type")
    if not items:
        raise _invalid_input()
    if len(items) > MAX_INPUTS:
        raise APIError(400, f"Invalid 'input': array too long. Expected an array with maximum "
                       f"length {MAX_INPUTS}, but got an array with length {len(items)} "
                       "instead.", param="input", code="array_above_max_length")
    out: list[str | list[int]] = []
    for i, x in enumerate(items):
        if isinstance(x, str):
            if not x:
                raise _invalid_input()
            out.append(x)
        elif isinstance(x, list) and x:
            out.append(token_array(x, f"input[{i}]", vocab))
        else:
            raise APIError(400, f"Invalid type for 'input[{i}]': expected a non-empty string "
                           f"or array of integers, but got {got(x)} instead.",
                           param=f"input[{i}]", code="invalid_type")
    return out


async def create(req: Request, app: App) -> JSONResponse:
    body = req.json_object()
    v = V(body)
    profile = app.model(body.get("model"), kind="embedding")
    model = body["model"]
    for key in body:
        if key not in KNOWN_FIELDS:
            raise APIError(400, f"Unrecognized request argument supplied: {key}",
                           param=None, code=None)
    enc = profile.encoding
    inputs = _inputs(body, vocab_size(enc))
    fmt = v.str("encoding_format", "float", choices=("float", "base64"))
    v.str("user")
    dims = v.int("dimensions", None, lo=1, hi=profile.dimensions)
    if dims is not None and not profile.shortenable:
        raise APIError(400, "This model does not support specifying dimensions.",
                       param="dimensions", code="invalid_value")
    limit = profile.context_window
    total = 0
    token_lists: list[list[str]] = []
    for i, x in enumerate(inputs):
        if isinstance(x, str):
            n = await paced(tok.count_tokens_steps(x, enc, cap=limit))
            text = x
        else:
            n = len(x)
            text = decode_tokens(x, enc)
        if n > limit:
            least = "at least " if type(n) is tok.Bound else ""
            raise APIError(400, f"This model's maximum context length is {limit} tokens, "
                           f"however you requested {least}{n} tokens ({least}{n} in your "
                           "prompt; 0 for the completion). Please reduce your prompt; or "
                           "completion length.",
                           param="input" if len(inputs) == 1 else f"input[{i}]",
                           code="context_length_exceeded")
        total += n
        if total > MAX_TOTAL_TOKENS:
            raise APIError(400, f"Requested {total} tokens, max {MAX_TOTAL_TOKENS} tokens per "
                           "request.", param="input", code="max_tokens_per_request")
        # token ids embed as their decoded text (or, undecodable, as the ids themselves)
        token_lists.append(tok.split_pieces(text, enc) if text else [str(t) for t in x])
    seed = app.config.seed or 0
    data = []
    for i, pieces in enumerate(token_lists):
        vec = embed(pieces, profile.dimensions, dims, seed)
        data.append({"object": "embedding", "index": i,
                     "embedding": to_base64(vec) if fmt == "base64" else vec})
        if i % YIELD_EVERY == YIELD_EVERY - 1:
            await asyncio.sleep(0)  # a 2048-input request must not hold other clients
    rng = request_rng(app.config.seed, "/v1/embeddings", body)
    await deliver_after(app, model, app.latency(profile).ttft(rng, total))
    return JSONResponse({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": total, "total_tokens": total}},
                        model=model, usage=Usage(total))


def register(app: App) -> None:
    app.router.add("POST", "/v1/embeddings", create, "embeddings")
