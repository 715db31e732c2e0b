"""``POST /v1/embeddings``: parse → vectors (:mod:`llmsim.sim.embed`) → the list object.

``input`` is a string, a list of strings, a token array or a list of token arrays (at most
:data:`MAX_INPUTS`; each at most the model's ``context_window`` tokens, 8192 for OpenAI's
models; all together at most :data:`MAX_TOTAL_TOKENS`), ``dimensions`` shortens the vectors of
the text-embedding-3 models, ``encoding_format`` is ``float`` or ``base64`` (the SDK's default:
little-endian float32), ``user`` is validated and ignored. The answer is held for the model's
time (``ttft_ms`` plus ``prefill_ms_per_1k`` per 1000 input tokens, jittered as a TTFT),
counted as a running request; when a serving engine serves the model (``--engine``, or
capacity on), its input is a prefill-only sequence there and the answer waits for it
(``deliver_after``); usage counts the input tokens.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..errors import APIError, E
from ..messages import JSONResponse, Request
from ..sim import tokens as tok
from ..sim.decide import Usage
from ..sim.embed import embed, to_base64
from ..sim.rng import request_rng
from .completions import decode_tokens, text_or_tokens
from .validate import V, deliver_after, paced

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["register", "create", "MAX_INPUTS", "MAX_TOTAL_TOKENS"]

MAX_INPUTS = 2048  # the real API's limit on inputs per request
MAX_TOTAL_TOKENS = 300_000  # the real API's limit on the tokens of one request
YIELD_EVERY = 16  # inputs embedded between two turns of the event loop
KNOWN_FIELDS = frozenset(("input", "model", "dimensions", "encoding_format", "user"))


def _invalid_input() -> APIError:
    return E.embeddings_invalid_input.at("input")


async def create(req: Request, app: Services) -> JSONResponse:
    body = req.json_object()
    v = V(body)
    profile = app.model(body.get("model"), kind="embedding")
    model = body["model"]
    for key in body:
        if key not in KNOWN_FIELDS:
            raise E.unrecognized_argument.at(key=key)
    enc = profile.encoding
    inputs = text_or_tokens(body, "input", MAX_INPUTS, enc, empty=_invalid_input())
    fmt = v.str("encoding_format", "float", choices=("float", "base64"))
    v.str("user")
    dims = v.int("dimensions", None, lo=1, hi=profile.dimensions)
    if dims is not None and not profile.shortenable:
        raise E.dimensions_unsupported.at("dimensions")
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
            raise E.context_prompt.at("input" if len(inputs) == 1 else f"input[{i}]",
                                      window=limit, least=least, total=n, prompt=n,
                                      completion=0)
        total += n
        if total > MAX_TOTAL_TOKENS:
            raise E.max_tokens_per_request.at("input", total=total, max=MAX_TOTAL_TOKENS)
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
    # (Usage(total): no output tokens, a prefill-only sequence when an engine serves it)
    await deliver_after(app, model, app.latency(profile).ttft(rng, total), Usage(total), req)
    return JSONResponse({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": total, "total_tokens": total}},
                        model=model, usage=Usage(total))


def register(app: Host) -> None:
    app.router.add("POST", "/v1/embeddings", create, "embeddings")
