"""``GET /health``, ``GET /v1/models``, ``GET /v1/models/{id}``, and vLLM's ``POST /tokenize``
and ``POST /detokenize`` (the shapes vLLM's OpenAI-compatible server answers; token ids are
the model encoding's with the ``tokens`` extra, else stable hashed ids that only
``/detokenize`` of this server does not invert: it answers 501 then)."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

from ..errors import E, missing
from ..messages import JSONResponse, Request
from ..sim import tokens as tok
from ..sim.prompt import content_text
from .completions import decode_tokens, token_array, vocab_size
from .validate import V, paced

if TYPE_CHECKING:
    from .services import Host, Services


async def health(req: Request, app: Services) -> JSONResponse:
    return JSONResponse({"status": "ok"})


async def list_models(req: Request, app: Services) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [m.public() for m in app.registry.listed()]})


async def get_model(req: Request, app: Services) -> JSONResponse:
    mid = req.params["id"]
    prof = app.registry.get(mid)
    if prof is None:
        raise E.model_not_found_retrieve.at("model", model=mid)
    return JSONResponse(prof.public())


MAX_DETOKENIZE = 1 << 20  # token ids one /detokenize may carry


async def tokenize(req: Request, app: Services) -> JSONResponse:
    """vLLM ``POST /tokenize``: ``{model, prompt}`` or ``{model, messages}`` →
    ``{count, max_model_len, tokens, token_strs}``."""
    body = req.json_object()
    v = V(body)
    profile = app.model(body.get("model"))
    enc = profile.encoding
    if "messages" in body:
        messages = v.list("messages", max_len=app.config.max_input_items) or []
        text = "".join(content_text(m.get("content"))[0] if isinstance(m, dict) else ""
                       for m in messages)
    else:
        text = v.str("prompt")  # type: ignore[assignment]
        if text is None:
            raise missing("prompt")
    count = await paced(tok.count_tokens_steps(text, enc, cap=profile.context_window))
    if count > profile.context_window:
        raise E.context_tokenize.at("prompt", window=profile.context_window, count=count)
    encoder = tok.get_encoding(enc)
    if encoder is not None:
        ids = list(encoder.encode_ordinary(text))
    else:  # estimate mode: stable ids for the estimated pieces
        vocab = vocab_size(enc)
        ids = [int.from_bytes(hashlib.blake2b(p.encode(), digest_size=4).digest(), "little")
               % vocab for p in tok.split_pieces(text, enc)]
    return JSONResponse({"count": len(ids), "max_model_len": profile.context_window,
                         "tokens": ids, "token_strs": None})


async def detokenize(req: Request, app: Services) -> JSONResponse:
    """vLLM ``POST /detokenize``: ``{model, tokens}`` → ``{prompt}``."""
    body = req.json_object()
    profile = app.model(body.get("model"))
    ids = V(body).list("tokens", max_len=MAX_DETOKENIZE)
    if ids is None:
        raise missing("tokens")
    token_array(ids, "tokens", vocab_size(profile.encoding))
    if tok.get_encoding(profile.encoding) is None:
        raise E.detokenize_unavailable.at()
    return JSONResponse({"prompt": decode_tokens(ids, profile.encoding)})


def register(app: Host) -> None:
    r = app.router
    r.add("GET", "/health", health, "health")
    r.add("GET", "/v1/models", list_models, "models")
    r.add("GET", "/v1/models/{id:path}", get_model, "models")
    r.add("POST", "/tokenize", tokenize, "tokenize")
    r.add("POST", "/detokenize", detokenize, "detokenize")
