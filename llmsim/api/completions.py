"""``POST /v1/completions`` (the legacy Completions API): parse → decide → render.

The body is validated into a :class:`CompletionRequest`, normalised into the
:class:`~llmsim.sim.decide.Ask` the one decision module reads, and the
:class:`~llmsim.sim.decide.Decision` is rendered as ``text_completion`` objects: one JSON
object, or SSE chunks (one generated token per chunk, ``data: [DONE]`` at the end) through the
:data:`COMPLETIONS` dialect. Latency, capacity, faults, rate limits and stats apply as to chat:
they are generic layers that only ask the dialect.

``prompt`` is a string, a list of strings, a token array or a list of token arrays; each prompt
gets ``n`` choices (choice ``index = prompt * n + j``, as the real API numbers them).
``max_tokens`` defaults to 16, as the real API's does. ``logprobs`` (0-5) gives the legacy
shape (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``); ``echo`` puts the
prompt before the completion (with ``logprobs``, its tokens too, each with logprob
:data:`ECHO_LOGPROB`: the real API sends null for the first, which the SDK's models reject). ``best_of`` is validated (``>= n``, not with ``stream``) and the ``n`` returned
choices are billed; ``suffix``, the penalties, ``logit_bias`` and ``user`` are validated and
otherwise ignored. vLLM's sampling extensions are accepted as chat accepts them
(``ignore_eos`` and ``min_tokens`` shape the length).

The real OpenAI API serves this endpoint only for its instruct models
(``gpt-3.5-turbo-instruct``, ``davinci-002``, ``babbage-002``); llmsim serves every chat model
here too, as vLLM does, because the benchmark harnesses that use this endpoint (``vllm bench
serve``, inference-perf, aiperf) name whatever model they were configured with.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import APIError, E, missing
from ..messages import Request, Result
from ..sim import text as txt
from ..sim import tokens as tok
from ..sim.cache import Segments
from ..sim.decide import TEXT, Ask, Decision
from ..sim.models import ModelProfile
from ..streaming import encode
from ..streaming.dialect import Dialect
from ..streaming.stream import TokenRun
from .caching import check_retention, openai_cached, openai_segments
from .chat import FINGERPRINT, SERVER_EXTENSIONS, error_events, min_tokens_of, stop_list
from .pipeline import Family, Meta, Parsed, Plan, generate
from .pipeline import register as serve
from .validate import V, check_request_work, got, paced, stream_flags

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["register", "COMPLETIONS", "CompletionRequest", "parse", "ask", "completion_json",
           "stream_plan"]

_dumps = orjson.dumps
DEFAULT_MAX_TOKENS = 16  # the real API's default for this endpoint
MAX_LOGPROBS = 5
MAX_BEST_OF = 20
# the logprob given to each echoed prompt token (the real API sends null for the first one,
# which the SDK's models reject: a number for every token, as the SDK types them)
ECHO_LOGPROB = -1.0

# every body field of the SDK's CompletionCreateParams; anything else is the real API's 400
KNOWN_FIELDS = frozenset((
    "model", "prompt", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs",
    "max_tokens", "n", "presence_penalty", "seed", "stop", "stream", "stream_options", "suffix",
    "temperature", "top_p", "user"))


def is_token_event(etype: str, data: Any) -> bool:
    """Generated tokens travel as ``token`` events (every other chunk is ``chunk``)."""
    return etype == "token"


def token_json(key: tuple[dict[str, Any], int]) -> tuple[bytes, bytes]:
    """The token event, the JSON around the piece: a ``text_completion`` chunk of the
    stream's ``head`` whose one choice (``index``) carries the piece as its text."""
    head, index = key
    return (_dumps(head)[:-1] + b',"choices":[{"text":',
            b',"index":%d,"logprobs":null,"finish_reason":null}],"system_fingerprint":"%s"}'
            % (index, FINGERPRINT.encode()))


COMPLETIONS = Dialect("completions", numbered=False, sse=encode.sse_chat,
                      sse_error=lambda err, seq: encode.sse_error_chat(err.to_dict(), seq),
                      error_events=error_events, is_token=is_token_event,
                      terminals=frozenset({"done"}), token_type="token",
                      token_json=token_json)
"""Legacy completions on the wire: ``text_completion`` SSE chunks (``data:`` lines only, as
chat), a mid-stream failure as the error chunk then ``[DONE]``, no WebSocket mode."""


@dataclass(slots=True)
class CompletionRequest:
    """A validated legacy completions request."""

    body: dict[str, Any]
    profile: ModelProfile
    model: str
    prompts: list[str]  # each prompt's text ("" for a token array the tokenizer cannot decode)
    prompt_counts: list[int]  # each prompt's tokens
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    limit: int = DEFAULT_MAX_TOKENS
    stops: tuple[str, ...] = ()
    logprobs: int | None = None
    echo: bool = False
    ignore_eos: bool = False
    min_tokens: int = 0

    @property
    def prompt_tokens(self) -> int:
        return sum(self.prompt_counts)


# ------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------

def vocab_size(encoding: str) -> int:
    """Token ids the model's encoding has (a token array's ids must be below it)."""
    return 200_019 if encoding == "o200k_base" else 100_277


def token_array(value: list[Any], param: str, vocab: int) -> list[int]:
    for i, t in enumerate(value):
        if type(t) is not int:
            raise E.invalid_type_got.at(f"{param}[{i}]", expected="an integer", got=got(t))
        if not 0 <= t < vocab:
            raise E.invalid_token.at(param, token=t, top=vocab - 1)
    return value


def decode_tokens(ids: list[int], encoding: str) -> str:
    enc = tok.get_encoding(encoding)
    if enc is None:
        return ""  # (estimate mode: no vocabulary to decode with)
    try:
        return str(enc.decode(ids))
    except Exception:  # an id the encoding reserves (special tokens): no text
        return ""


def text_or_tokens(body: dict[str, Any], key: str, limit_items: int, encoding: str, *,
                   empty: APIError | None = None) -> list[str | list[int]]:
    """``body[key]`` (legacy ``prompt``, embeddings ``input``) as a list of inputs, each a
    string or a token array: a string, a list of strings, a token array or a list of token
    arrays, at most ``limit_items``. ``empty``: the error for an empty list or string (None:
    empty strings are allowed, an empty list is the real API's ``empty_array``)."""
    p = body.get(key)
    if p is None:
        raise missing(key)
    vocab = vocab_size(encoding)
    if isinstance(p, str):
        if not p and empty is not None:
            raise empty
        return [p]
    if not isinstance(p, list):
        raise E.invalid_type_got.at(key, got=got(p), expected="one of a string, array of "
                                    "strings, array of integers or array of arrays of integers")
    if not p:
        raise empty or E.empty_array.at(key, min_len=1)
    if len(p) > limit_items:
        raise E.array_too_long.at(key, max_len=limit_items, length=len(p))
    if all(type(x) is int for x in p):
        return [token_array(p, key, vocab)]
    out: list[str | list[int]] = []
    for i, x in enumerate(p):
        if isinstance(x, str):
            if not x and empty is not None:
                raise empty
            out.append(x)
        elif isinstance(x, list) and x:
            out.append(token_array(x, f"{key}[{i}]", vocab))
        else:
            raise E.invalid_type_got.at(f"{key}[{i}]", got=got(x), expected="a string or a "
                                        "non-empty array of integers")
    return out


async def parse(req: Request, app: Services) -> CompletionRequest:
    """Validate a legacy completions body; raise APIError naming the first bad parameter."""
    body = req.json_object()
    v = V(body)
    profile = app.model(body.get("model"))
    model = body["model"]
    for key in body:
        if key not in KNOWN_FIELDS and key not in SERVER_EXTENSIONS:
            raise E.unrecognized_argument.at(key=key)
    enc = profile.encoding
    raw = text_or_tokens(body, "prompt", app.config.max_input_items, enc)
    stream, include_usage = stream_flags(v)
    n = v.int("n", 1, lo=1, hi=128) or 1
    best_of = v.int("best_of", None, lo=1, hi=MAX_BEST_OF)
    if best_of is not None:
        if best_of < n:
            raise E.best_of_below_n.at("best_of", best_of=best_of, n=n)
        if stream and best_of > 1:
            raise E.best_of_stream.at("best_of")
    limit = v.int("max_tokens", None, lo=0)
    limit = DEFAULT_MAX_TOKENS if limit is None else limit
    if limit > profile.max_output_tokens:
        raise E.limit_too_large.at("max_tokens", limit=limit, max=profile.max_output_tokens,
                                   unit="completion")
    logprobs = v.int("logprobs", None, lo=0, hi=MAX_LOGPROBS)
    echo = bool(v.bool("echo", False))
    v.num("temperature", None, lo=0, hi=2)
    v.num("top_p", None, lo=0, hi=1)
    v.num("presence_penalty", None, lo=-2, hi=2)
    v.num("frequency_penalty", None, lo=-2, hi=2)
    v.dict("logit_bias")
    v.int("seed")
    v.str("user")
    v.str("suffix")
    stops = stop_list(body)
    min_tokens = min_tokens_of(v, limit, "max_tokens", profile)
    cw = profile.context_window
    counts: list[int] = []
    texts: list[str] = []
    for p in raw:
        if isinstance(p, str):
            # counted up to what can fit: a prompt that cannot is refused without tokenizing
            counts.append(await paced(tok.count_tokens_steps(p, enc, cap=cw - limit)))
            texts.append(p)
        else:
            counts.append(len(p))
            texts.append(decode_tokens(p, enc) if echo or app.config.text == "echo" else "")
    for i, c in enumerate(counts):
        if c + limit > cw:
            least = "at least " if type(c) is tok.Bound else ""
            raise E.context_prompt.at("prompt" if len(counts) == 1 else f"prompt[{i}]",
                                      window=cw, least=least, total=c + limit, prompt=c,
                                      completion=limit)
    most = txt.most_tokens(app.config, limit, min_tokens=min_tokens, echoed=max(counts))
    check_request_work(n * len(raw), most, logprobs or 0, param="n")
    if echo:  # every choice carries its prompt again (with logprobs: a logprob per token)
        check_request_work(n * len(raw), most + max(counts), logprobs or 0, param="echo")
    return CompletionRequest(
        body=body, profile=profile, model=model, prompts=texts, prompt_counts=counts, n=n,
        stream=stream, include_usage=include_usage, limit=limit, stops=stops,
        logprobs=logprobs, echo=echo, ignore_eos=bool(v.bool("ignore_eos", False)),
        min_tokens=min_tokens)


def ask(cr: CompletionRequest) -> Ask:
    """The request as :func:`llmsim.sim.decide.decide` needs it: every prompt's ``n``
    choices at once (``--text echo`` echoes the last prompt)."""
    last = cr.prompts[-1]
    return Ask(cr.profile, cr.prompt_tokens, user_text=lambda: last, output=TEXT,
               limit=cr.limit, min_tokens=cr.min_tokens, ignore_eos=cr.ignore_eos,
               stops=cr.stops, n=cr.n * len(cr.prompts), logprobs=cr.logprobs is not None,
               top_logprobs=cr.logprobs or 0, completion=True)


def cached_tokens(cr: CompletionRequest, app: Services, retention: str | None) -> int:
    """Prompt tokens read from the prompt cache (OpenAI's automatic rule), each prompt of
    the batch its own prefix."""
    raw = cr.body.get("prompt")
    prompts: list[Any] = [raw] if isinstance(raw, str) or (
        isinstance(raw, list) and raw and type(raw[0]) is int) else list(raw or ())
    if len(prompts) != len(cr.prompt_counts):
        return 0
    total = 0
    for p, count in zip(prompts, cr.prompt_counts, strict=True):
        one: list[object] = [p]
        seg = openai_segments(app, cr.profile, cr.body, one.copy, count)
        total += openai_cached(app, seg, count, retention)
    return total


# ------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------

def _legacy_logprobs(cr: CompletionRequest, pieces: list[str], lps: list[dict[str, Any]],
                     prefix: str, start: int) -> dict[str, Any]:
    """The legacy ``logprobs`` object of one choice (echoed prompt first when ``echo``)."""
    tokens: list[str] = []
    token_lps: list[float] = []
    tops: list[dict[str, float]] = []
    if prefix:
        for t in tok.split_pieces(prefix, cr.profile.encoding):
            tokens.append(t)
            token_lps.append(ECHO_LOGPROB)
            tops.append({t: ECHO_LOGPROB})
    for piece, lp in zip(pieces, lps, strict=False):
        tokens.append(piece)
        token_lps.append(lp["logprob"])
        tops.append({t["token"]: t["logprob"] for t in lp.get("top_logprobs") or ()})
    offsets = []
    pos = start
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops,
            "text_offset": offsets}


def _prefix(cr: CompletionRequest, index: int) -> str:
    return cr.prompts[index // cr.n] if cr.echo else ""


def completion_json(cr: CompletionRequest, decision: Decision, cid: str,
                    created: int) -> dict[str, Any]:
    choices = []
    for c in decision.choices:
        pieces = c.pieces or []
        prefix = _prefix(cr, c.index)
        lp = (_legacy_logprobs(cr, pieces, c.logprobs or [], prefix, 0)
              if cr.logprobs is not None else None)
        choices.append({"text": prefix + "".join(pieces), "index": c.index, "logprobs": lp,
                        "finish_reason": c.finish})
    return {"id": cid, "object": "text_completion", "created": created, "model": cr.model,
            "choices": choices, "usage": _usage(decision), "system_fingerprint": FINGERPRINT}


def _usage(decision: Decision) -> dict[str, Any]:
    u = decision.usage
    out: dict[str, Any] = {"prompt_tokens": u.prompt_tokens,
                           "completion_tokens": u.output_tokens, "total_tokens": u.total_tokens}
    if u.cached_tokens:
        out["prompt_tokens_details"] = {"cached_tokens": u.cached_tokens, "audio_tokens": 0}
    return out


def _steps(decision: Decision) -> int:
    return max(len(c.pieces or ()) for c in decision.choices)


def stream_plan(cr: CompletionRequest, decision: Decision, cid: str,
                created: int) -> Iterator[tuple[float, str, Any]]:
    """The SSE plan: the echoed prompts (if any) at TTFT, one token per chunk per step (all
    choices in lock-step), a finish chunk per choice, the optional usage chunk, [DONE]."""
    head = {"id": cid, "object": "text_completion", "created": created, "model": cr.model}

    def chunk(index: int, text: str, finish: str | None = None,
              logprobs: Any = None) -> dict[str, Any]:
        return {**head, "choices": [{"text": text, "index": index, "logprobs": logprobs,
                                     "finish_reason": finish}],
                "system_fingerprint": FINGERPRINT}

    choices = decision.choices
    gaps = decision.timing.gaps(max(0, _steps(decision) - 1))
    delay = decision.timing.first
    offsets = [0] * len(choices)
    keys = [(head, c.index) for c in choices]  # (one key a choice: the pump's template)
    if cr.echo:
        for c in choices:
            prefix = _prefix(cr, c.index)
            lp = (_legacy_logprobs(cr, [], [], prefix, 0) if cr.logprobs is not None else None)
            yield delay, "chunk", chunk(c.index, prefix, logprobs=lp)
            offsets[c.index] = len(prefix)
            delay = 0.0
    steps = _steps(decision)
    if len(choices) == 1 and cr.logprobs is None:
        # the common case: the tokens as one run (stream.TokenRun; the pump renders them,
        # hot path, issue 15), the first at ``delay``, then a gap each (the loop below)
        if choices[0].pieces:
            yield delay, "token", TokenRun(choices[0].pieces, gaps, (head, choices[0].index))
            delay = 0.0
        steps = 0
    for k in range(steps):
        if k:
            delay = next(gaps, 0.0)
        for c in choices:
            pieces = c.pieces or []
            if k >= len(pieces):
                continue
            piece = pieces[k]
            if cr.logprobs is not None:
                lp = _legacy_logprobs(cr, [piece], [(c.logprobs or [])[k]], "",
                                      offsets[c.index])
                yield delay, "token", chunk(c.index, piece, logprobs=lp)
            else:  # (a run of one: the choices take turns)
                yield delay, "token", TokenRun([piece], key=keys[c.index])
            offsets[c.index] += len(piece)
            delay = 0.0
    for c in choices:
        yield delay, "chunk", chunk(c.index, "", c.finish)
        delay = 0.0
    if cr.include_usage:
        yield 0.0, "chunk", {**head, "choices": [], "usage": _usage(decision),
                             "system_fingerprint": FINGERPRINT}
    yield 0.0, "done", None


# ------------------------------------------------------------------------------------------
# Handler
# ------------------------------------------------------------------------------------------

class Completions(Family):
    """Legacy completions on the request pipeline; each prompt of a batch is its own
    prefix for the prompt cache (:func:`cached_tokens`)."""

    endpoint = "completions"
    seed_path = "/v1/completions"
    dialect = COMPLETIONS
    id_prefix = "cmpl-"

    async def parse(self, req: Request, app: Services) -> Parsed:
        cr = await parse(req, app)
        return Parsed(ask(cr), cr.model, cr.stream, cr.body, cr,
                      retention=check_retention(cr.body))

    def render(self, p: Parsed, d: Decision, meta: Meta) -> Any:
        return completion_json(p.info, d, meta.id, meta.created)

    def plan(self, p: Parsed, d: Decision, meta: Meta) -> Plan:
        return stream_plan(p.info, d, meta.id, meta.created)

    def steps(self, d: Decision) -> int:
        return _steps(d)

    def cached(self, app: Services, p: Parsed, seg: Segments | None) -> int:
        return cached_tokens(p.info, app, p.retention)


FAMILY = Completions()


async def create(req: Request, app: Services) -> Result:
    """``POST /v1/completions`` (other routes may serve it too: Azure deployments)."""
    return await generate(req, app, FAMILY)


def register(app: Host) -> None:
    serve(app, FAMILY, [("POST", "/v1/completions")], aliases=True)
