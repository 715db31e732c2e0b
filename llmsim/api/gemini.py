"""Google's Gemini API (the Generative Language API as the google-genai SDK calls it), a family
on the request pipeline (:mod:`llmsim.api.pipeline`):

- ``POST /v1beta/models/{model}:generateContent`` and ``:streamGenerateContent`` (SSE with
  ``?alt=sse``, as the SDK asks; without it, the JSON array the REST API streams),
- ``:countTokens``, ``:embedContent``, ``:batchEmbedContents``,
- ``GET /v1beta/models`` and ``/v1beta/models/{model}``,

each under ``/v1`` too. Keys: ``x-goog-api-key`` or ``?key=``. Request fields are read in the
REST API's camelCase or in snake_case (the JSON mapping of the protos accepts both).

What the decision core gets: ``contents`` (text, function calls and responses; inline data and
files cost fixed tokens), ``systemInstruction``, ``tools[].functionDeclarations`` (their
``parameters`` in Gemini's OpenAPI subset, or ``parametersJsonSchema``), ``toolConfig``
(AUTO / ANY / NONE, ``allowedFunctionNames``), ``generationConfig`` (``maxOutputTokens``
including thoughts, as on the API; ``stopSequences``; ``candidateCount``;
``responseMimeType: application/json`` with ``responseSchema`` / ``responseJsonSchema``;
``thinkingConfig`` with ``thinkingBudget`` and ``includeThoughts``). Answers carry
``usageMetadata`` (prompt, candidates, thoughts, cached and total counts), ``safetyRatings``,
``finishReason`` (STOP, MAX_TOKENS, SAFETY) and ``modelVersion``; errors use Google's
envelope ``{"error": {"code", "message", "status"}}``.

Deviations, documented: token counts use the o200k tokenizer (Gemini's is not public);
implicit caching follows OpenAI's automatic rule (1,024-token prefixes, 128-token steps);
a stream sends one token per chunk (the real service sends larger chunks).
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import APIError, E
from ..messages import JSONResponse, RawResponse, Request
from ..sim import schema as sch
from ..sim import tokens as tok
from ..sim.decide import (
    AUTO,
    TEXT,
    TOOL_CHOICES,
    Ask,
    Decision,
    Output,
    Tool,
    ToolChoice,
    Usage,
)
from ..sim.embed import embed
from ..sim.prompt import chat_prompt_steps
from ..sim.rng import request_rng
from ..streaming.dialect import Dialect
from .pipeline import Family, Meta, Parsed, Plan
from .pipeline import register as serve
from .validate import check_request_work, deliver_after, paced

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["register", "GEMINI_SSE", "GEMINI_ARRAY", "gemini_error"]

_dumps = orjson.dumps
PREFIXES = ("/v1beta", "/v1")
FINISH = {"stop": "STOP", "length": "MAX_TOKENS", "tool_calls": "STOP",
          "content_filter": "SAFETY"}
_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED",
           404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 408: "DEADLINE_EXCEEDED",
           409: "ABORTED", 413: "INVALID_ARGUMENT", 429: "RESOURCE_EXHAUSTED",
           499: "CANCELLED", 500: "INTERNAL", 502: "UNAVAILABLE", 503: "UNAVAILABLE",
           504: "DEADLINE_EXCEEDED", 529: "UNAVAILABLE"}
SAFETY = [{"category": c, "probability": "NEGLIGIBLE"} for c in (
    "HARM_CATEGORY_HATE_SPEECH", "HARM_CATEGORY_DANGEROUS_CONTENT", "HARM_CATEGORY_HARASSMENT",
    "HARM_CATEGORY_SEXUALLY_EXPLICIT")]
HARM_CATEGORIES = frozenset(r["category"] for r in SAFETY) | {
    "HARM_CATEGORY_CIVIC_INTEGRITY", "HARM_CATEGORY_UNSPECIFIED"}
THRESHOLDS = frozenset(("BLOCK_NONE", "BLOCK_ONLY_HIGH", "BLOCK_MEDIUM_AND_ABOVE",
                        "BLOCK_LOW_AND_ABOVE", "HARM_BLOCK_THRESHOLD_UNSPECIFIED", "OFF"))
KNOWN_FIELDS = frozenset((
    "contents", "systemInstruction", "tools", "toolConfig", "generationConfig",
    "safetySettings", "cachedContent", "labels", "model"))
MAX_CONTENTS = 10_000  # contents and parts read per request (each bounded, then counted)
MAX_CANDIDATES = 8
MAX_STOPS = 5
INLINE_TOKENS = 258  # an image or file part (Gemini bills an image at 258 tokens)
MAX_EMBED_BATCH = 250


# ------------------------------------------------------------------------------------------
# Errors: Google's envelope
# ------------------------------------------------------------------------------------------

def gemini_error(err: APIError) -> RawResponse:
    """An error in Google's envelope, with the status name that goes with its code."""
    status = 404 if err.code == "model_not_found" else err.status
    body = {"error": {"code": status, "message": err.message,
                      "status": _STATUS.get(status, "UNKNOWN")}}
    return RawResponse(_dumps(body), status, "application/json; charset=UTF-8",
                       list(err.headers or ()), error=err)


# ------------------------------------------------------------------------------------------
# Stream formats: SSE (?alt=sse) and the JSON array
# ------------------------------------------------------------------------------------------
# a plan's events: "first" opens the stream (and is a token), "token", "final" (the chunk
# with the finish reason and usage), "close" ends it; "only" is a stream of one chunk

def _sse(etype: str, data: Any) -> bytes:
    return b"data: " + (data if type(data) is bytes else _dumps(data)) + b"\r\n\r\n"


def _array(etype: str, data: Any) -> bytes:
    if etype == "close":
        return b"]"
    body = data if type(data) is bytes else _dumps(data)
    return (b"[" if etype in ("first", "only") else b",\r\n") + body


def _sse_error(err: APIError, seq: int) -> bytes:
    return _sse("final", {"error": {"code": err.status, "message": err.message,
                                    "status": _STATUS.get(err.status, "UNKNOWN")}})


def _array_error(err: APIError, seq: int) -> bytes:
    return _array("final", {"error": {"code": err.status, "message": err.message,
                                      "status": _STATUS.get(err.status, "UNKNOWN")}}) + b"]"


def _error_events(err: APIError) -> list[tuple[str, Any]]:
    return [("final", {"error": {"code": err.status, "message": err.message,
                                 "status": _STATUS.get(err.status, "UNKNOWN")}})]


def _array_error_events(err: APIError) -> list[tuple[str, Any]]:
    return [*_error_events(err), ("close", None)]


# (an SSE stream ends with its last chunk; the array's "close" writes its "]")
GEMINI_SSE = Dialect("gemini.generate", numbered=False, sse=_sse, sse_error=_sse_error,
                     error_events=_error_events, token_types=frozenset({"first", "token"}),
                     terminals=frozenset({"final", "only"}))
GEMINI_ARRAY = Dialect("gemini.generate", numbered=False, sse=_array, sse_error=_array_error,
                       error_events=_array_error_events,
                       token_types=frozenset({"first", "token"}),
                       terminals=frozenset({"close"}),
                       stream_headers=b"content-type: application/json; charset=UTF-8\r\n"
                                      b"cache-control: no-cache\r\n")


# ------------------------------------------------------------------------------------------
# Parsing
# ------------------------------------------------------------------------------------------

def _snake(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def _get(d: dict[str, Any], name: str) -> Any:
    """A field by its camelCase name or its snake_case one."""
    v = d.get(name)
    return d.get(_snake(name)) if v is None else v


def _bad(param: str, what: str) -> APIError:
    return E.gemini_invalid_value.at(param, what=what)


def _int(d: dict[str, Any], name: str, where: str, lo: int, hi: int) -> int | None:
    v = _get(d, name)
    if v is None:
        return None
    if isinstance(v, str) and v.lstrip("-").isdigit():  # (int64 fields may come as strings)
        v = int(v)
    if type(v) is not int or not lo <= v <= hi:
        raise _bad(f"{where}{name}", f"must be an integer between {lo} and {hi}")
    return v


def _num(d: dict[str, Any], name: str, where: str, lo: float, hi: float) -> float | None:
    v = _get(d, name)
    if v is None:
        return None
    if type(v) not in (int, float) or not lo <= v <= hi:
        raise _bad(f"{where}{name}", f"must be a number between {lo} and {hi}")
    return float(v)


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(content, dict):
        raise _bad(where, "a Content object ({\"role\", \"parts\"}) is required")
    parts = content.get("parts")
    if not isinstance(parts, list) or not parts:
        raise _bad(f"{where}.parts", "at least one part is required")
    if len(parts) > MAX_CONTENTS:
        raise _bad(f"{where}.parts", f"at most {MAX_CONTENTS} parts")
    for j, p in enumerate(parts):
        if not isinstance(p, dict):
            raise _bad(f"{where}.parts[{j}]", "a Part object is required")
    return parts


def _part_text(p: dict[str, Any]) -> tuple[str, int]:
    """A part's text as the prompt counts it, and its fixed tokens (inline data, files)."""
    if "text" in p:
        t = p["text"]
        return (t if isinstance(t, str) else ""), 0
    fc = _get(p, "functionCall")
    if isinstance(fc, dict):
        return str(fc.get("name", "")) + _dumps(fc.get("args") or {}).decode(), 0
    fr = _get(p, "functionResponse")
    if isinstance(fr, dict):
        return str(fr.get("name", "")) + _dumps(fr.get("response") or {}).decode(), 0
    if _get(p, "inlineData") is not None or _get(p, "fileData") is not None:
        return "", INLINE_TOKENS
    code = _get(p, "executableCode") or _get(p, "codeExecutionResult")
    if isinstance(code, dict):
        return str(code.get("code") or code.get("output") or ""), 0
    return "", 0


_TYPES = {"STRING": "string", "NUMBER": "number", "INTEGER": "integer", "BOOLEAN": "boolean",
          "ARRAY": "array", "OBJECT": "object", "NULL": "null"}
_SCHEMA_KEYS = {"properties", "required", "items", "enum", "description", "format", "minimum",
                "maximum", "minItems", "maxItems", "minLength", "maxLength", "pattern",
                "anyOf", "title", "default", "propertyOrdering", "example"}


def _json_schema(s: Any, where: str, depth: int = 0) -> dict[str, Any]:
    """Gemini's OpenAPI-subset ``Schema`` (upper-case types, ``nullable``) as JSON Schema."""
    if depth > 32:
        raise _bad(where, "the schema is nested too deeply")
    if not isinstance(s, dict):
        raise _bad(where, "a Schema object is required")
    out: dict[str, Any] = {}
    t = s.get("type")
    if t is not None:
        if not isinstance(t, str) or t.upper() not in _TYPES:
            raise _bad(f"{where}.type", f"unknown type {str(t)[:40]!r}")
        out["type"] = _TYPES[t.upper()]
        if s.get("nullable") is True:
            out["type"] = [out["type"], "null"]
    for k, v in s.items():
        if k not in _SCHEMA_KEYS:
            continue
        if k == "properties" and isinstance(v, dict):
            out[k] = {name: _json_schema(sub, f"{where}.properties.{name}", depth + 1)
                      for name, sub in list(v.items())[:1024]}
        elif k == "items":
            out[k] = _json_schema(v, f"{where}.items", depth + 1)
        elif k == "anyOf" and isinstance(v, list):
            out[k] = [_json_schema(sub, f"{where}.anyOf", depth + 1) for sub in v[:64]]
        elif k in ("minItems", "maxItems", "minLength", "maxLength") and isinstance(v, str):
            out[k] = int(v) if v.isdigit() else v  # (int64 as a string in the proto mapping)
        elif k not in ("propertyOrdering", "example"):
            out[k] = v
    if out.get("type") == "object" or "properties" in out:
        out.setdefault("additionalProperties", False)
    return out


def _tools(raw: Any, work: sch.Work) -> tuple[list[Tool], list[dict[str, Any]]]:
    """The function declarations as the decision's tools, and (for the prompt count) their
    JSON."""
    if raw is None:
        return [], []
    if not isinstance(raw, list) or len(raw) > 128:
        raise _bad("tools", "a list of at most 128 Tool objects")
    out: list[Tool] = []
    decls: list[dict[str, Any]] = []
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise _bad(f"tools[{i}]", "a Tool object is required")
        fds = _get(t, "functionDeclarations")
        if fds is None:
            continue  # googleSearch, codeExecution, urlContext...: accepted, never run
        if not isinstance(fds, list) or len(fds) > 512:
            raise _bad(f"tools[{i}].functionDeclarations", "a list of at most 512 functions")
        for j, fd in enumerate(fds):
            where = f"tools[{i}].functionDeclarations[{j}]"
            if not isinstance(fd, dict) or not isinstance(fd.get("name"), str) \
                    or not fd["name"]:
                raise _bad(f"{where}.name", "a function name is required")
            params = _get(fd, "parametersJsonSchema")
            if params is None and fd.get("parameters") is not None:
                params = _json_schema(fd["parameters"], f"{where}.parameters")
            if params is not None:
                if not isinstance(params, dict):
                    raise _bad(f"{where}.parameters", "a Schema object is required")
                sch.check(params, param=f"{where}.parameters", label=f"function "
                          f"'{fd['name']}'", code="invalid_argument", work=work)
            desc = fd.get("description")
            out.append(Tool(fd["name"], "function", params or {"type": "object"}, None,
                            False, f"{where}.parameters", desc if isinstance(desc, str) else ""))
            decls.append({"name": fd["name"], "description": desc, "parameters": params})
    return out, decls


def _tool_choice(cfg: Any, names: set[str]) -> ToolChoice:
    if cfg is None:
        return AUTO
    if not isinstance(cfg, dict):
        raise _bad("toolConfig", "a ToolConfig object is required")
    fcc = _get(cfg, "functionCallingConfig")
    if fcc is None:
        return AUTO
    if not isinstance(fcc, dict):
        raise _bad("toolConfig.functionCallingConfig", "a FunctionCallingConfig is required")
    mode = str(fcc.get("mode", "AUTO")).upper()
    allowed = _get(fcc, "allowedFunctionNames")
    if mode not in ("AUTO", "ANY", "NONE", "VALIDATED", "MODE_UNSPECIFIED"):
        raise _bad("toolConfig.functionCallingConfig.mode", f"unknown mode {mode[:40]!r}")
    if allowed is not None:
        if not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed):
            raise _bad("toolConfig.functionCallingConfig.allowedFunctionNames",
                       "a list of function names")
        if mode != "ANY":
            raise _bad("toolConfig.functionCallingConfig.allowedFunctionNames",
                       "may only be set with mode ANY")
        unknown = [a for a in allowed if a not in names]
        if unknown:
            raise _bad("toolConfig.functionCallingConfig.allowedFunctionNames",
                       f"function {unknown[0][:64]!r} is not declared")
        return ToolChoice("required", frozenset(allowed))
    if mode == "ANY":
        return TOOL_CHOICES["required"]
    if mode == "NONE":
        return TOOL_CHOICES["none"]
    return AUTO


def _effort(profile_reasoning: bool, thinking: Any, limit: int | None) -> str | None:
    """``thinkingConfig`` as an effort: budget 0 is no thinking, -1 (or unset) dynamic
    (``medium``), else the budget's size; a model that does not think ignores it."""
    if not profile_reasoning:
        return None
    if thinking is None:
        return "medium"
    if not isinstance(thinking, dict):
        raise _bad("generationConfig.thinkingConfig", "a ThinkingConfig is required")
    level = _get(thinking, "thinkingLevel")
    if isinstance(level, str) and level.upper() in ("LOW", "MEDIUM", "HIGH", "MINIMAL"):
        return {"MINIMAL": "low", "LOW": "low", "MEDIUM": "medium", "HIGH": "high"}[
            level.upper()]
    budget = _int(thinking, "thinkingBudget", "generationConfig.thinkingConfig.", -1, 32_768)
    if budget is None or budget == -1:
        return "medium"
    if budget == 0:
        return None
    return "low" if budget <= 1024 else "medium" if budget <= 8192 else "high"


async def _parse(req: Request, app: Services, body: dict[str, Any], model: str,
                 stream: bool) -> Parsed:
    profile = app.model(model)
    for key in body:
        if key not in KNOWN_FIELDS and _camel(key) not in KNOWN_FIELDS:
            raise E.gemini_unknown_field.at(key)
    contents = body.get("contents")
    if not isinstance(contents, list) or not contents:
        raise _bad("contents", "contents is not specified" if not contents else
                   "a list of Content objects is required")
    if len(contents) > MAX_CONTENTS:
        raise _bad("contents", f"at most {MAX_CONTENTS} contents")
    chat_like: list[dict[str, Any]] = []
    system = _get(body, "systemInstruction")
    if system is not None:
        if isinstance(system, str):
            system = {"parts": [{"text": system}]}
        sys_parts = _parts(system, "system_instruction")
        chat_like.append({"role": "system",
                          "content": "\n".join(_part_text(p)[0] for p in sys_parts)})
    last_user = ""
    after_tool = False
    extra = 0
    for i, c in enumerate(contents):
        parts = _parts(c, f"contents[{i}]")
        role = c.get("role", "user")
        if role not in ("user", "model", "function", "tool"):
            raise _bad(f"contents[{i}].role", "Please use a valid role: user, model.")
        texts = []
        for p in parts:
            t, fixed = _part_text(p)
            texts.append(t)
            extra += fixed
        chat_like.append({"role": "assistant" if role == "model" else "user",
                          "content": "\n".join(texts)})
        if role != "model":
            plain = [p["text"] for p in parts if isinstance(p.get("text"), str)
                     and not p.get("thought")]
            last_user = "\n".join(plain) or last_user
            after_tool = any(_get(p, "functionResponse") is not None for p in parts)
        else:
            after_tool = False
    work = sch.Work()
    tools, decls = _tools(body.get("tools"), work)
    choice = _tool_choice(_get(body, "toolConfig"), {t.name for t in tools})
    gc = _get(body, "generationConfig") or {}
    if not isinstance(gc, dict):
        raise _bad("generation_config", "a GenerationConfig object is required")
    w = "generation_config."
    limit = _int(gc, "maxOutputTokens", w, 1, profile.max_output_tokens)
    n = _int(gc, "candidateCount", w, 1, MAX_CANDIDATES) or 1
    _num(gc, "temperature", w, 0, 2)
    _num(gc, "topP", w, 0, 1)
    _int(gc, "topK", w, 1, 1_000_000)
    _num(gc, "presencePenalty", w, -2, 2)
    _num(gc, "frequencyPenalty", w, -2, 2)
    _int(gc, "seed", w, -(1 << 31), (1 << 31) - 1)
    stops = _get(gc, "stopSequences") or []
    if not isinstance(stops, list) or len(stops) > MAX_STOPS \
            or not all(isinstance(s, str) for s in stops):
        raise _bad(f"{w}stop_sequences", f"a list of at most {MAX_STOPS} strings")
    mime = _get(gc, "responseMimeType") or "text/plain"
    output = TEXT
    if mime == "application/json":
        js = _get(gc, "responseJsonSchema")
        if js is None and _get(gc, "responseSchema") is not None:
            js = _json_schema(_get(gc, "responseSchema"), f"{w}response_schema")
        if js is not None:
            if not isinstance(js, dict):
                raise _bad(f"{w}response_json_schema", "a JSON Schema object is required")
            sch.check(js, param=f"{w}response_schema", label="the response schema",
                      code="invalid_argument", work=work)
            output = Output("json_schema", js, f"{w}response_schema")
        else:
            output = Output("json_object")
    elif mime not in ("text/plain", "text/x.enum"):
        raise _bad(f"{w}response_mime_type", f"unsupported MIME type {str(mime)[:64]!r}; use "
                   "text/plain, application/json or text/x.enum")
    thinking = _get(gc, "thinkingConfig")
    effort = _effort(profile.reasoning, thinking, limit)
    include = isinstance(thinking, dict) and _get(thinking, "includeThoughts") is True
    settings = _get(body, "safetySettings")
    if settings is not None:
        if not isinstance(settings, list) or len(settings) > 16:
            raise _bad("safety_settings", "a list of at most 16 SafetySetting objects")
        for i, s in enumerate(settings):
            if not isinstance(s, dict) or s.get("category") not in HARM_CATEGORIES \
                    or s.get("threshold") not in THRESHOLDS:
                raise _bad(f"safety_settings[{i}]", "a known category and threshold")
    cw = profile.context_window
    prompt = await paced(chat_prompt_steps(chat_like, decls or None, profile.encoding,
                                           cap=cw))
    prompt += extra
    if prompt > cw:
        raise _bad("contents", f"The input token count ({prompt}) exceeds the maximum number "
                   f"of tokens allowed ({cw}).")
    check_request_work(n, limit or app.config.output_tokens_max, 0, param="candidateCount")
    ask = Ask(profile, prompt, user_text=lambda: last_user,
              prompt_texts=lambda: [m["content"] for m in chat_like if m["role"] != "assistant"],
              json_hint=output.kind != "text", after_tool_result=after_tool,
              tools=tuple(tools), tool_choice=choice, output=output, limit=limit,
              stops=tuple(stops), effort=effort, summary="auto" if include else None, n=n)
    return Parsed(ask, model, stream, body, info={"include_thoughts": include},
                  cache_blocks=lambda: [decls, system, *contents],
                  dialect=(GEMINI_SSE if req.query_one("alt") == "sse" else GEMINI_ARRAY)
                  if stream else None)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(r.title() for r in rest)


# ------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------

def _usage(d: Decision) -> dict[str, Any]:
    u = d.usage
    visible = u.output_tokens - u.reasoning_tokens
    out: dict[str, Any] = {"promptTokenCount": u.prompt_tokens,
                           "candidatesTokenCount": visible,
                           "totalTokenCount": u.prompt_tokens + u.output_tokens,
                           "promptTokensDetails": [{"modality": "TEXT",
                                                    "tokenCount": u.prompt_tokens}]}
    if u.reasoning_tokens:
        out["thoughtsTokenCount"] = u.reasoning_tokens
    if u.cached_tokens:
        out["cachedContentTokenCount"] = u.cached_tokens
        out["cacheTokensDetails"] = [{"modality": "TEXT", "tokenCount": u.cached_tokens}]
    return out


def _call_args(arguments: str, complete: bool) -> dict[str, Any]:
    try:
        args = orjson.loads(arguments) if complete else {}
    except orjson.JSONDecodeError:
        args = {}
    return args if isinstance(args, dict) else {}


def _candidate(p: Parsed, c: Any) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    r = c.reasoning
    if r is not None and p.info["include_thoughts"] and r.summary:
        parts.append({"text": "".join("".join(s) for s in r.summary), "thought": True})
    if c.pieces is not None and (c.pieces or not parts):
        parts.append({"text": "".join(c.pieces)})
    for call in c.calls:
        parts.append({"functionCall": {"name": call.name,
                                       "args": _call_args(call.arguments, call.complete)}})
    cand: dict[str, Any] = {"content": {"parts": parts, "role": "model"},
                            "finishReason": FINISH.get(c.finish, "STOP"), "index": c.index,
                            "safetyRatings": SAFETY}
    return cand


class Gemini(Family):
    endpoint = "gemini.generate"
    seed_path = "/v1beta/models:generateContent"
    dialect = GEMINI_SSE
    id_prefix = ""
    errors = staticmethod(gemini_error)

    def __init__(self, stream: bool) -> None:
        self.stream = stream

    async def parse(self, req: Request, app: Services) -> Parsed:
        body = req.json_object()
        return await _parse(req, app, body, _model_of(req), self.stream)

    def render(self, p: Parsed, d: Decision, meta: Meta) -> Any:
        return {"candidates": [_candidate(p, c) for c in d.choices], "usageMetadata": _usage(d),
                "modelVersion": p.model, "responseId": _response_id(meta)}

    def plan(self, p: Parsed, d: Decision, meta: Meta) -> Plan:
        return _plan(p, d, meta)


def _response_id(meta: Meta) -> str:
    return base64.urlsafe_b64encode(meta.id.encode()[-16:].ljust(16, b"0")).decode()[:22]


def _plan(p: Parsed, d: Decision, meta: Meta) -> Iterator[tuple[float, str, Any]]:
    """One chunk per token (text, then whole function calls when their arguments are
    generated), the last with the finish reason and the full usage."""
    rid = _response_id(meta)
    head = {"modelVersion": p.model, "responseId": rid}
    prompt_usage = {"promptTokenCount": d.usage.prompt_tokens,
                    "totalTokenCount": d.usage.prompt_tokens}
    c = d.choices[0]  # (candidateCount > 1 streams the first candidate's deltas, then all)
    gaps = d.timing.gaps(1 << 30)
    delay = d.timing.first
    first = True
    include = p.info["include_thoughts"]
    if c.reasoning is not None and include:
        for part in c.reasoning.summary:
            for piece in part:
                yield (delay if first else next(gaps, 0.0)), "first" if first else "token", {
                    "candidates": [{"content": {"parts": [{"text": piece, "thought": True}],
                                                "role": "model"}, "index": 0}],
                    "usageMetadata": prompt_usage, **head}
                first = False
    for piece in c.pieces or ():
        yield (delay if first else next(gaps, 0.0)), "first" if first else "token", {
            "candidates": [{"content": {"parts": [{"text": piece}], "role": "model"},
                            "index": 0}], "usageMetadata": prompt_usage, **head}
        first = False
    wait = delay if first else 0.0
    for call in c.calls:  # a call arrives whole, once its arguments are generated
        for _ in call.pieces[1:]:
            wait += next(gaps, 0.0)
        yield (wait if first else wait + next(gaps, 0.0)), "first" if first else "token", {
            "candidates": [{"content": {"parts": [{"functionCall": {
                "name": call.name, "args": _call_args(call.arguments, call.complete)}}],
                "role": "model"}, "index": 0}], "usageMetadata": prompt_usage, **head}
        first = False
        wait = 0.0
    final = {"candidates": [{**_candidate(p, x), "content": {"parts": [{"text": ""}],
                                                             "role": "model"}}
                            for x in d.choices], "usageMetadata": _usage(d), **head}
    if len(d.choices) > 1:  # the other candidates whole, with the finish
        final["candidates"] = [_candidate(p, x) if x.index else {**_candidate(p, x), "content": {
            "parts": [{"text": ""}], "role": "model"}} for x in d.choices]
    yield (delay if first else 0.0), "only" if first else "final", final
    if p.dialect is GEMINI_ARRAY:
        yield 0.0, "close", None


def _model_of(req: Request) -> str:
    m = req.params.get("model", "")
    return m.removeprefix("models/")


# ------------------------------------------------------------------------------------------
# countTokens, embeddings, models
# ------------------------------------------------------------------------------------------

async def count_tokens(req: Request, app: Services) -> JSONResponse:
    body = req.json_object()
    inner = _get(body, "generateContentRequest")
    if isinstance(inner, dict):
        body = inner
    p = await _parse(req, app, {k: v for k, v in body.items() if k != "model"},
                     _model_of(req), False)
    n = p.ask.prompt_tokens
    return JSONResponse({"totalTokens": n,
                         "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n}]})


def _embed_one(app: Services, model: str, req_body: dict[str, Any], where: str,
               seed: int) -> tuple[dict[str, Any], int]:
    """One ContentEmbedding and the tokens of its input."""
    profile = app.model(model, kind="embedding")
    content = req_body.get("content")
    parts = _parts(content, f"{where}content")
    text = "\n".join(_part_text(p)[0] for p in parts)
    dims = _int(req_body, "outputDimensionality", where, 1, profile.dimensions)
    if len(text) > 64 * 1024:
        raise _bad(f"{where}content", "the text is longer than this simulator embeds "
                   "(64 KiB)")
    pieces = tok.split_pieces(text, profile.encoding) if text else [""]
    if len(pieces) > profile.context_window:
        raise _bad(f"{where}content", f"at most {profile.context_window} tokens")
    return {"values": embed(pieces, profile.dimensions, dims, seed)}, len(pieces)


async def embed_content(req: Request, app: Services) -> JSONResponse:
    body = req.json_object()
    model = _model_of(req)
    seed = request_rng(app.config.seed, "/v1beta:embedContent", body).getrandbits(32)
    out, n = _embed_one(app, model, body, "", seed)
    await _held(req, app, model, body, "/v1beta:embedContent:t", n)
    return JSONResponse({"embedding": out}, model=model)


async def batch_embed(req: Request, app: Services) -> JSONResponse:
    body = req.json_object()
    model = _model_of(req)
    reqs = body.get("requests")
    if not isinstance(reqs, list) or not reqs or len(reqs) > MAX_EMBED_BATCH:
        raise _bad("requests", f"a list of 1 to {MAX_EMBED_BATCH} EmbedContentRequest objects")
    seed = request_rng(app.config.seed, "/v1beta:batchEmbedContents", body).getrandbits(32)
    out = []
    total = 0
    for i, r in enumerate(reqs):
        if not isinstance(r, dict):
            raise _bad(f"requests[{i}]", "an EmbedContentRequest object is required")
        m = str(r.get("model") or model).removeprefix("models/")
        if m != model:
            raise _bad(f"requests[{i}].model", f"must be the batch's model models/{model}")
        one, n = _embed_one(app, model, r, f"requests[{i}].", seed + i)
        out.append(one)
        total += n
    await _held(req, app, model, body, "/v1beta:batchEmbedContents:t", total)
    return JSONResponse({"embeddings": out}, model=model)


async def _held(req: Request, app: Services, model: str, body: Any, path: str,
                tokens: int) -> None:
    """Hold an embedding answer for the model's time over ``tokens`` of input, counted as
    running; a prefill-only sequence when an engine serves the model (as /v1/embeddings)."""
    lat = app.latency(app.model(model, kind="embedding"))
    await deliver_after(app, model, lat.ttft(request_rng(app.config.seed, path, body), tokens),
                        Usage(tokens), req)


def _model_json(p: Any) -> dict[str, Any]:
    emb = p.kind == "embedding"
    return {"name": f"models/{p.id}", "baseModelId": p.id, "version": "001",
            "displayName": p.id.replace("-", " ").title(),
            "description": f"{p.id} (simulated by llmsim)",
            "inputTokenLimit": p.context_window, "outputTokenLimit": p.max_output_tokens or 1,
            "supportedGenerationMethods": ["embedContent", "batchEmbedContents"] if emb else
            ["generateContent", "countTokens", "streamGenerateContent"],
            **({} if emb else {"temperature": 1.0, "maxTemperature": 2.0, "topP": 0.95,
                               "topK": 64, "thinking": p.reasoning})}


async def list_models(req: Request, app: Services) -> JSONResponse:
    models = [_model_json(m) for m in app.registry.listed() if m.id.startswith(("gemini",
                                                                               "text-embedding-004"))]
    size = req.query_one("pageSize")
    n = int(size) if size and size.isdigit() and 0 < int(size) <= 1000 else 50
    token = req.query_one("pageToken")
    start = int(token) if token and token.isdigit() else 0
    page = models[start:start + n]
    out: dict[str, Any] = {"models": page}
    if start + n < len(models):
        out["nextPageToken"] = str(start + n)
    return JSONResponse(out)


async def get_model(req: Request, app: Services) -> JSONResponse:
    model = _model_of(req)
    prof = app.registry.get(model)
    if prof is None:
        raise E.gemini_model_not_found.at(model=model)
    return JSONResponse(_model_json(prof))


def register(app: Host) -> None:
    for prefix in PREFIXES:
        base = f"{prefix}/models/{{model}}"
        serve(app, Gemini(False), [("POST", f"{base}:generateContent")], streaming=False)
        serve(app, Gemini(True), [("POST", f"{base}:streamGenerateContent")], streaming=True)
        r = app.router
        r.add("POST", f"{base}:countTokens", count_tokens, "gemini.count_tokens",
              aliases=False, errors=gemini_error)
        r.add("POST", f"{base}:embedContent", embed_content, "gemini.embed", aliases=False,
              errors=gemini_error)
        r.add("POST", f"{base}:batchEmbedContents", batch_embed, "gemini.embed",
              aliases=False, errors=gemini_error)
    app.router.add("GET", "/v1beta/models/{model}", get_model, "gemini.models", aliases=False,
                   errors=gemini_error)
    app.router.add("GET", "/v1beta/models", list_models, "gemini.models", aliases=False,
                   errors=gemini_error)
    # GET /v1/models is OpenAI's too: a Google key (x-goog-api-key, ?key=) asks for Gemini's
    for path, mine in (("/v1/models", list_models), ("/v1/models/{model}", get_model)):
        theirs = app.router.resolve("GET", path.replace("{model}", "x"))[0]
        app.router.add("GET", path if "{" not in path else "/v1/models/{id:path}",
                       _either(mine, theirs.handler), theirs.name, aliases=False)


def _either(mine: Any, theirs: Any) -> Any:
    async def handler(req: Request, app: Services) -> Any:
        if req.headers.get("x-goog-api-key") is not None or req.query_one("key") is not None:
            if "id" in req.params:
                object.__setattr__(req, "params", {"model": req.params["id"]})
            return await mine(req, app)
        return await theirs(req, app)
    return handler
