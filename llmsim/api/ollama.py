"""Ollama's native API (what the ``ollama`` Python/JS clients and LangChain's ``ChatOllama``
call), a family on the request pipeline (:mod:`llmsim.api.pipeline`):

- ``POST /api/chat`` and ``/api/generate``: NDJSON streams by default (one JSON object a
  line), one JSON object with ``"stream": false``;
- ``POST /api/embed`` (and the legacy ``/api/embeddings``);
- ``GET /api/tags``, ``POST /api/show``, ``GET /api/ps``, ``GET /api/version``.

What the decision core gets: ``messages`` (text, images at fixed tokens, ``tool_calls`` and
``tool`` results) or ``prompt``/``system``/``suffix``, ``tools`` (OpenAI's function format),
``format`` (``"json"`` or a JSON Schema), ``options.num_predict`` (the token limit: -1 and
-2 unbounded, larger values cut to the model's output limit), ``options.stop`` and
``think`` (true/false or ``low``/``medium``/``high``; an unknown model id is taken to think,
a known model that does not think refuses it, as Ollama does).

The final object carries ``done_reason`` (``stop``, ``length``; ``load`` for an empty
request, which loads the model) and the timing fields in nanoseconds from the simulated
timing: ``prompt_eval_duration`` is the time to the first token, ``eval_duration`` the rest,
``total_duration`` their sum (``load_duration`` 0: the model is always loaded). Errors are
Ollama's ``{"error": "..."}`` with the HTTP status.

Accepted and ignored: the other ``options`` (``temperature``, ``num_ctx``, ``seed``…: their
types are checked), ``keep_alive``, ``template``, ``raw``, ``context`` (``/api/generate``
answers no ``context``). Token counts use the model's tokenizer (o200k for an unknown id).
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import APIError, E
from ..messages import JSONResponse, RawResponse, Request, Result
from ..sim import schema as sch
from ..sim import tokens as tok
from ..sim.decide import AUTO, TEXT, Ask, Decision, Output, Tool, Usage
from ..sim.embed import embed
from ..sim.prompt import IMAGE_TOKENS, chat_prompt_steps
from ..sim.rng import request_rng
from ..streaming.dialect import Dialect
from .pipeline import Family, Meta, Parsed, Plan, generate
from .validate import check_request_work, deliver_after, paced

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["register", "OLLAMA", "OLLAMA_GENERATE", "ollama_error"]

VERSION = "0.12.6"  # the Ollama version /api/version reports
_dumps = orjson.dumps
MAX_MESSAGES = 10_000
MAX_TOOLS = 128
MAX_STOPS = 16
MAX_IMAGES = 64
MAX_EMBED_INPUTS = 2048
MAX_EMBED_CHARS = 64 * 1024  # per input
NS = 1_000_000_000
DIGEST = "sha256:" + "0" * 64
OPTION_TYPES: dict[str, tuple[type, ...]] = {
    "num_predict": (int,), "num_ctx": (int,), "num_keep": (int,), "seed": (int,),
    "top_k": (int,), "repeat_last_n": (int,), "num_batch": (int,), "num_gpu": (int,),
    "main_gpu": (int,), "num_thread": (int,), "top_p": (int, float), "min_p": (int, float),
    "typical_p": (int, float), "temperature": (int, float), "repeat_penalty": (int, float),
    "presence_penalty": (int, float), "frequency_penalty": (int, float),
    "stop": (list,), "numa": (bool,), "use_mmap": (bool,), "low_vram": (bool,),
    "vocab_only": (bool,), "penalize_newline": (bool,)}
CHAT_FIELDS = frozenset(("model", "messages", "tools", "format", "options", "stream",
                         "keep_alive", "think", "truncate", "shift"))
GENERATE_FIELDS = frozenset(("model", "prompt", "suffix", "system", "template", "raw",
                             "images", "format", "options", "stream", "keep_alive", "think",
                             "context", "truncate", "shift"))


# ------------------------------------------------------------------------------------------
# Errors and the NDJSON stream
# ------------------------------------------------------------------------------------------

def ollama_error(err: APIError) -> RawResponse:
    """Ollama's error: ``{"error": "<message>"}`` with the status (a missing model is 404)."""
    status = 404 if err.code == "model_not_found" else err.status
    return RawResponse(_dumps({"error": err.message}), status, "application/json; charset=utf-8",
                       list(err.headers or ()), error=err)


def _line(etype: str, data: Any) -> bytes:
    return (data if type(data) is bytes else _dumps(data)) + b"\n"


def _error_line(err: APIError, seq: int) -> bytes:
    return _dumps({"error": err.message}) + b"\n"


def _dialect(endpoint: str) -> Dialect:
    return Dialect(endpoint, numbered=False, sse=_line, sse_error=_error_line,
                   error_events=lambda err: [("error", {"error": err.message})],
                   token_types=frozenset({"token"}), terminals=frozenset({"done", "error"}),
                   stream_headers=b"content-type: application/x-ndjson\r\n"
                                  b"cache-control: no-cache\r\n")


OLLAMA = _dialect("ollama.chat")
OLLAMA_GENERATE = _dialect("ollama.generate")


def _bad(param: str, what: str) -> APIError:
    return E.ollama_invalid.at(param, what=what)


# ------------------------------------------------------------------------------------------
# Parsing
# ------------------------------------------------------------------------------------------

def _profile(app: Services, model: Any, kind: str = "chat") -> Any:
    if not isinstance(model, str) or not model:
        raise _bad("model", "model is required")
    if len(model) > 256:
        raise _bad("model", "a model name of at most 256 characters")
    name = model.removesuffix(":latest")
    prof = app.registry.get(name)
    if prof is None:  # a strict registry (--served-model-name, strict_models)
        raise E.ollama_model_not_found.at("model", model=model)
    return app.model(name, kind=kind)


def _options(body: dict[str, Any], profile: Any) -> tuple[int | None, list[str]]:
    """``options``: the limit (``num_predict``) and stop sequences; the rest type-checked."""
    opts = body.get("options")
    if opts is None:
        return None, []
    if not isinstance(opts, dict):
        raise _bad("options", "an object is required")
    for k, v in opts.items():
        types = OPTION_TYPES.get(k)
        if types is not None and v is not None and (
                not isinstance(v, types) or (bool not in types and isinstance(v, bool))):
            raise _bad(f"options.{k}", f"must be of type {types[0].__name__}")
    limit = None
    n = opts.get("num_predict")
    if n is not None:
        if n == 0 or n < -2:
            raise _bad("options.num_predict", "must be -2, -1 (unbounded) or at least 1")
        limit = min(n, profile.max_output_tokens) if n > 0 else None
    stops = opts.get("stop") or []
    if len(stops) > MAX_STOPS or not all(isinstance(s, str) and s for s in stops):
        raise _bad("options.stop", f"a list of at most {MAX_STOPS} non-empty strings")
    return limit, stops


def _format(body: dict[str, Any], work: sch.Work) -> Output:
    fmt = body.get("format")
    if fmt is None or fmt == "":
        return TEXT
    if fmt == "json":
        return Output("json_object")
    if isinstance(fmt, dict):
        sch.check(fmt, param="format", label="format", code="invalid_argument", work=work)
        return Output("json_schema", fmt, "format")
    raise _bad("format", 'must be "json" or a JSON Schema object')


def _tools(raw: Any, work: sch.Work) -> list[Tool]:
    if raw is None:
        return []
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise _bad("tools", f"a list of at most {MAX_TOOLS} tools")
    out = []
    for i, t in enumerate(raw):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise _bad(f"tools[{i}].function.name", "a function with a name is required")
        params = fn.get("parameters")
        if params is not None:
            if not isinstance(params, dict):
                raise _bad(f"tools[{i}].function.parameters", "a JSON Schema object")
            sch.check(params, param=f"tools[{i}].function.parameters",
                      label=f"function '{fn['name']}'", code="invalid_argument", work=work)
        desc = fn.get("description")
        out.append(Tool(fn["name"], "function", params or {"type": "object"}, None, False,
                        f"tools[{i}].function.parameters", desc if isinstance(desc, str) else ""))
    return out


def _think(body: dict[str, Any], profile: Any) -> tuple[Any, str | None]:
    """``think``: the profile to answer with and the effort (None: no thinking)."""
    think = body.get("think")
    if think is None or think is False:
        return profile, None
    if think is True:
        effort = "medium"
    elif think in ("low", "medium", "high"):
        effort = think
    else:
        raise _bad("think", 'must be true, false, "low", "medium" or "high"')
    if profile.reasoning:
        return profile, effort
    if profile.builtin:
        raise E.ollama_no_thinking.at("think", model=profile.id)
    return replace(profile, reasoning=True), effort  # an unknown model: taken to think


def _images(v: Any, where: str) -> int:
    if v is None:
        return 0
    if not isinstance(v, list) or len(v) > MAX_IMAGES or not all(isinstance(i, str) for i in v):
        raise _bad(where, f"a list of at most {MAX_IMAGES} base64 images")
    return IMAGE_TOKENS * len(v)


def _unknown(body: dict[str, Any], known: frozenset[str]) -> None:
    for k in body:
        if k not in known:
            raise _bad(k, "unknown field")


class _Info:
    __slots__ = ("chat", "think")

    def __init__(self, chat: bool, think: bool) -> None:
        self.chat = chat
        self.think = think


async def _parse(req: Request, app: Services, chat: bool) -> Parsed:
    body = req.json_object()
    _unknown(body, CHAT_FIELDS if chat else GENERATE_FIELDS)
    profile = _profile(app, body.get("model"))
    stream = body.get("stream", True)
    if not isinstance(stream, bool):
        raise _bad("stream", "must be a boolean")
    limit, stops = _options(body, profile)
    work = sch.Work()
    output = _format(body, work)
    profile, effort = _think(body, profile)
    msgs: list[dict[str, Any]] = []
    extra = 0
    last_user = ""
    after_tool = False
    tools: list[Tool] = []
    if chat:
        raw = body.get("messages")
        if not isinstance(raw, list) or len(raw) > MAX_MESSAGES:
            raise _bad("messages", f"a list of at most {MAX_MESSAGES} messages")
        for i, m in enumerate(raw):
            if not isinstance(m, dict):
                raise _bad(f"messages[{i}]", "a message object is required")
            role = m.get("role")
            if role not in ("system", "user", "assistant", "tool"):
                raise _bad(f"messages[{i}].role", f"unknown role {str(role)[:40]!r}")
            content = m.get("content", "")
            if not isinstance(content, str):
                raise _bad(f"messages[{i}].content", "must be a string")
            extra += _images(m.get("images"), f"messages[{i}].images")
            calls = m.get("tool_calls")
            if calls is not None:
                if not isinstance(calls, list) or len(calls) > MAX_TOOLS:
                    raise _bad(f"messages[{i}].tool_calls", "a list of tool calls")
                content += _dumps(calls).decode()
            msgs.append({"role": role, "content": content})
            if role == "user":
                last_user = content
            after_tool = role == "tool"
        tools = _tools(body.get("tools"), work)
    else:
        prompt = body.get("prompt", "")
        system = body.get("system", "")
        suffix = body.get("suffix", "")
        for name, val in (("prompt", prompt), ("system", system), ("suffix", suffix)):
            if not isinstance(val, str):
                raise _bad(name, "must be a string")
        ctx = body.get("context")
        if ctx is not None and (not isinstance(ctx, list) or len(ctx) > profile.context_window):
            raise _bad("context", "a list of token ids within the context window")
        extra += _images(body.get("images"), "images")
        if system:
            msgs.append({"role": "system", "content": system})
        msgs.append({"role": "user", "content": prompt + suffix})
        last_user = prompt
    cw = profile.context_window
    prompt_tokens = await paced(chat_prompt_steps(msgs, [t.parameters for t in tools] or None,
                                                  profile.encoding, cap=cw)) + extra
    if prompt_tokens > cw:
        raise _bad("messages" if chat else "prompt", f"the input ({prompt_tokens} tokens) "
                   f"exceeds the context window ({cw} tokens)")
    check_request_work(1, limit or app.config.output_tokens_max, 0, param="num_predict")
    texts = [m["content"] for m in msgs if m["role"] != "assistant"]
    ask = Ask(profile, prompt_tokens, user_text=lambda: last_user, prompt_texts=lambda: texts,
              json_hint=output.kind != "text", after_tool_result=after_tool,
              tools=tuple(tools), tool_choice=AUTO, output=output, limit=limit,
              stops=tuple(stops), effort=effort, summary="auto" if effort else None)
    return Parsed(ask, body["model"], stream, body, info=_Info(chat, effort is not None))


# ------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------

def _created_at(meta: Meta) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S.000000000Z", time.gmtime(meta.created))


def _timings(d: Decision, steps: int) -> dict[str, int]:
    """The final object's counts and durations (ns) from the simulated timing; a duration
    is at least 1 ns, so clients' tokens-per-second never divide by zero."""
    first = round(d.timing.first * NS)
    total = max(round(d.timing.duration(steps) * NS), first)
    pe = max(1, first)
    ev = max(1, total - first)
    return {"total_duration": pe + ev, "load_duration": 0,
            "prompt_eval_count": d.usage.prompt_tokens, "prompt_eval_duration": pe,
            "eval_count": d.usage.output_tokens, "eval_duration": ev}


def _args(arguments: str, complete: bool) -> dict[str, Any]:
    try:
        a = orjson.loads(arguments) if complete else {}
    except orjson.JSONDecodeError:
        a = {}
    return a if isinstance(a, dict) else {}


def _calls(c: Any) -> list[dict[str, Any]]:
    return [{"function": {"index": i, "name": t.name, "arguments": _args(t.arguments,
                                                                         t.complete)}}
            for i, t in enumerate(c.calls)]


def _thinking(c: Any) -> str:
    r = c.reasoning
    return "".join("".join(s) for s in r.summary) if r is not None else ""


def _done_reason(c: Any) -> str:
    return "length" if c.finish == "length" else "stop"


class Ollama(Family):
    seed_path = "/api/chat"
    dialect = OLLAMA
    id_prefix = ""
    errors = staticmethod(ollama_error)

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.endpoint = "ollama.chat" if chat else "ollama.generate"
        self.seed_path = "/api/chat" if chat else "/api/generate"
        self.dialect = OLLAMA if chat else OLLAMA_GENERATE

    async def parse(self, req: Request, app: Services) -> Parsed:
        return await _parse(req, app, self.chat)

    def _body(self, p: Parsed, meta: Meta, text: str, thinking: str,
              calls: list[dict[str, Any]] | None, done: bool = False) -> dict[str, Any]:
        out: dict[str, Any] = {"model": p.model, "created_at": _created_at(meta)}
        if not done:
            out["done"] = False
        if self.chat:
            msg: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                msg["thinking"] = thinking
            if calls:
                msg["tool_calls"] = calls
            out["message"] = msg
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        return out

    def render(self, p: Parsed, d: Decision, meta: Meta) -> Any:
        c = d.choices[0]
        out = self._body(p, meta, "".join(c.pieces or ()),
                         _thinking(c) if p.info.think else "", _calls(c), True)
        return {**out, "done": True, "done_reason": _done_reason(c),
                **_timings(d, self.steps(d))}

    def plan(self, p: Parsed, d: Decision, meta: Meta) -> Plan:
        """One line per token (thinking, then text), the tool calls whole once their
        arguments are generated, then the ``done`` line with the timings."""
        c = d.choices[0]
        gaps = d.timing.gaps(1 << 30)
        delay = d.timing.first
        first = True
        if p.info.think and c.reasoning is not None:
            for part in c.reasoning.summary:
                for piece in part:
                    yield (delay if first else next(gaps, 0.0)), "token", self._body(
                        p, meta, "", piece, None)
                    first = False
        for piece in c.pieces or ():
            yield (delay if first else next(gaps, 0.0)), "token", self._body(
                p, meta, piece, "", None)
            first = False
        if c.calls:
            wait = 0.0
            for call in c.calls:
                for _ in call.pieces[1 if first else 0:]:
                    wait += next(gaps, 0.0)
            yield (delay + wait if first else wait), "token", self._body(p, meta, "", "",
                                                                         _calls(c))
            first = False
        yield (delay if first else 0.0), "done", {
            **self._body(p, meta, "", "", None, True), "done": True,
            "done_reason": _done_reason(c), **_timings(d, self.steps(d))}


# ------------------------------------------------------------------------------------------
# Handlers: chat/generate (an empty request loads the model), embeddings, model listings
# ------------------------------------------------------------------------------------------

def _handler(fam: Ollama) -> Any:
    async def handler(req: Request, app: Services) -> Result:
        body = req.json_object()
        empty = body.get("messages") in (None, []) if fam.chat else (
            body.get("prompt") in (None, "") and not body.get("images"))
        if empty:  # Ollama loads the model and answers done_reason "load"
            _unknown(body, CHAT_FIELDS if fam.chat else GENERATE_FIELDS)
            _profile(app, body.get("model"))
            out: dict[str, Any] = {"model": body["model"], "created_at": _created_at(
                Meta("", int(app.clock.time())))}
            if fam.chat:
                out["message"] = {"role": "assistant", "content": ""}
            else:
                out["response"] = ""
            return JSONResponse({**out, "done": True, "done_reason": "load"},
                                model=body["model"])
        return await generate(req, app, fam)
    return handler


def _embed_inputs(body: dict[str, Any], key: str) -> list[str]:
    raw = body.get(key)
    inputs = [raw] if isinstance(raw, str) else raw
    if not isinstance(inputs, list) or not inputs or len(inputs) > MAX_EMBED_INPUTS \
            or not all(isinstance(x, str) for x in inputs):
        raise _bad(key, f"a string or a list of 1 to {MAX_EMBED_INPUTS} strings")
    for i, x in enumerate(inputs):
        if len(x) > MAX_EMBED_CHARS:
            raise _bad(f"{key}[{i}]", f"at most {MAX_EMBED_CHARS} characters")
    return inputs


async def _embed(req: Request, app: Services, legacy: bool) -> JSONResponse:
    body = req.json_object()
    prof = _profile(app, body.get("model"), kind="embedding")
    key = "prompt" if legacy else "input"
    inputs = _embed_inputs(body, key)
    dims = body.get("dimensions")
    if dims is not None and (type(dims) is not int or not 1 <= dims <= prof.dimensions):
        raise _bad("dimensions", f"an integer between 1 and {prof.dimensions}")
    truncate = body.get("truncate", True)
    if not isinstance(truncate, bool):
        raise _bad("truncate", "must be a boolean")
    seed = app.config.seed or 0
    vecs = []
    total = 0
    for i, x in enumerate(inputs):
        pieces = tok.split_pieces(x, prof.encoding) if x else [""]
        if len(pieces) > prof.context_window:
            if not truncate:
                raise _bad(f"{key}[{i}]", "the input length exceeds the context length")
            pieces = pieces[:prof.context_window]
        total += len(pieces)
        vecs.append(embed(pieces, prof.dimensions, dims, seed))
    rng = request_rng(app.config.seed, "/api/embed", body)
    seconds = app.latency(prof).ttft(rng, total)
    # (a prefill-only sequence when an engine serves the model, as /v1/embeddings)
    await deliver_after(app, body["model"], seconds, Usage(total), req)
    if legacy:
        return JSONResponse({"embedding": vecs[0]}, model=body["model"])
    ns = max(1, round(seconds * NS))
    return JSONResponse({"model": body["model"], "embeddings": vecs, "total_duration": ns,
                         "load_duration": 0, "prompt_eval_count": total}, model=body["model"])


async def embed_new(req: Request, app: Services) -> JSONResponse:
    return await _embed(req, app, False)


async def embed_legacy(req: Request, app: Services) -> JSONResponse:
    return await _embed(req, app, True)


def _details(p: Any) -> dict[str, Any]:
    family = p.id.split("-")[0].split(":")[0]
    return {"parent_model": "", "format": "gguf", "family": family, "families": [family],
            "parameter_size": "8B", "quantization_level": "Q4_K_M"}


def _entry(p: Any) -> dict[str, Any]:
    name = p.id if ":" in p.id else p.id + ":latest"
    return {"name": name, "model": name, "modified_at": "2025-01-01T00:00:00Z",
            "size": 4_920_753_328, "digest": DIGEST, "details": _details(p)}


async def tags(req: Request, app: Services) -> JSONResponse:
    return JSONResponse({"models": [_entry(p) for p in app.registry.listed()]})


async def ps(req: Request, app: Services) -> JSONResponse:
    expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(app.clock.time() + 300))
    return JSONResponse({"models": [{**_entry(p), "expires_at": expires,
                                     "size_vram": 4_920_753_328, "context_length":
                                     p.context_window} for p in app.registry.listed()]})


async def show(req: Request, app: Services) -> JSONResponse:
    body = req.json_object()
    model = body.get("model") or body.get("name")
    name = model.removesuffix(":latest") if isinstance(model, str) else model
    prof = app.registry.get(name) if isinstance(name, str) and name else None
    if prof is None:
        raise E.ollama_model_not_found.at("model", model=str(model))
    caps = ["embedding"] if prof.kind == "embedding" else ["completion", "tools"] + (
        ["thinking"] if prof.reasoning else [])
    family = _details(prof)["family"]
    return JSONResponse({
        "modelfile": f"FROM {prof.id}\n", "parameters": "", "template": "{{ .Prompt }}",
        "details": _details(prof), "capabilities": caps,
        "model_info": {"general.architecture": family, "general.parameter_count": 8_000_000_000,
                       f"{family}.context_length": prof.context_window},
        "modified_at": "2025-01-01T00:00:00Z"})


async def version(req: Request, app: Services) -> JSONResponse:
    return JSONResponse({"version": VERSION})


def register(app: Host) -> None:
    r = app.router
    for fam, path in ((Ollama(True), "/api/chat"), (Ollama(False), "/api/generate")):
        r.add("POST", path, _handler(fam), fam.endpoint, aliases=False, stream_capable=True,
              errors=ollama_error, stream_default=True)
    r.add("POST", "/api/embed", embed_new, "ollama.embed", aliases=False, errors=ollama_error)
    r.add("POST", "/api/embeddings", embed_legacy, "ollama.embed", aliases=False,
          errors=ollama_error)
    r.add("GET", "/api/tags", tags, "ollama.models", aliases=False, errors=ollama_error)
    r.add("GET", "/api/ps", ps, "ollama.models", aliases=False, errors=ollama_error)
    r.add("POST", "/api/show", show, "ollama.models", aliases=False, errors=ollama_error)
    r.add("GET", "/api/version", version, "ollama.models", aliases=False, errors=ollama_error)
