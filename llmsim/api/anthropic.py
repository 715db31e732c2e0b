"""Anthropic Messages: ``POST /anthropic/v1/messages`` and ``/v1/messages`` (the Anthropic
SDK's own path under its base URL), ``…/messages/count_tokens`` and ``GET /anthropic/v1/models``.

Parse → decide → render, a dialect of the same decision core as the OpenAI families: the body
is validated into an :class:`~llmsim.sim.decide.Ask` (system, messages with text / image /
document / tool_use / tool_result / thinking blocks, tools with ``input_schema``, tool_choice
auto / any / tool / none, ``thinking`` with ``budget_tokens``, ``stop_sequences``,
``max_tokens`` required) and the :class:`~llmsim.sim.decide.Decision` is rendered as a
``message`` object or the Messages SSE stream (``message_start``, ``content_block_start``,
``ping``, ``content_block_delta`` with ``text_delta`` / ``input_json_delta`` /
``thinking_delta`` / ``signature_delta``, ``content_block_stop``, ``message_delta`` with
``stop_reason`` and usage, ``message_stop``) through the :data:`ANTHROPIC` dialect. Errors use
Anthropic's envelope ``{"type": "error", "error": {"type", "message"}}`` and statuses
(capacity rejections: 529 ``overloaded_error``); every answer carries ``request-id``.

Deviations, documented: token counts use the OpenAI tokenizer of the profile (Claude's own is
not public), thinking text is simulated lorem with a random signature, and the thinking budget
steers the share of reasoning (it is a target, as Claude treats it) rather than a hard cap.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import APIError, E
from ..messages import JSONResponse, RawResponse, Request
from ..sim import schema as sch
from ..sim.cache import NO_USE
from ..sim.decide import AUTO, TEXT, TOOL_CHOICES, Ask, Decision, Tool, ToolChoice
from ..sim.described import json_hint
from ..sim.prompt import chat_prompt_steps, content_text
from ..streaming import encode
from ..streaming.dialect import Dialect
from ..streaming.stream import TokenRun
from .caching import anthropic_cached, anthropic_marks
from .pipeline import Family, Meta, Parsed, Plan
from .pipeline import register as serve
from .validate import V, check_request_work, paced

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["register", "ANTHROPIC", "anthropic_error"]

_dumps = orjson.dumps
MIN_THINKING_BUDGET = 1024  # the real API's floor on budget_tokens
ROLES = ("user", "assistant")
BLOCKS = ("text", "image", "document", "tool_use", "tool_result", "thinking",
          "redacted_thinking", "search_result", "server_tool_use", "web_search_tool_result")
_BLOCK_TAGS = ", ".join(f"'{t}'" for t in BLOCKS)  # pydantic's list: no "and"
KNOWN_FIELDS = frozenset((
    "model", "messages", "max_tokens", "system", "stop_sequences", "stream", "temperature",
    "top_p", "top_k", "tools", "tool_choice", "thinking", "metadata", "service_tier",
    "container", "mcp_servers", "context_management",
    # llmsim's extension (not Anthropic's): answer exactly max_tokens tokens, as vLLM's
    # ignore_eos does on the OpenAI paths (benchmark harnesses)
    "ignore_eos"))
FINISH = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
          "content_filter": "refusal"}

# ------------------------------------------------------------------------------------------
# Errors: Anthropic's envelope and statuses
# ------------------------------------------------------------------------------------------

_ERROR_TYPE = {400: "invalid_request_error", 401: "authentication_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 500: "api_error", 529: "overloaded_error"}


def _error_status_type(err: APIError) -> tuple[int, str]:
    if err.overloaded or err.status in (503, 529):
        return 529, "overloaded_error"
    status = err.status
    if status in _ERROR_TYPE:
        return status, _ERROR_TYPE[status]
    return status, "api_error" if status >= 500 else "invalid_request_error"


def _error_object(err: APIError) -> dict[str, Any]:
    status, etype = _error_status_type(err)
    return {"type": "error", "error": {"type": etype, "message": err.message}}


def anthropic_error(err: APIError) -> RawResponse:
    """An error before the first byte, as the Anthropic API answers it."""
    status, _ = _error_status_type(err)
    return RawResponse(_dumps(_error_object(err)), status, "application/json",
                       list(err.headers), error=err)


# named SSE events (``event: <type>`` then ``data:``): the frame Responses uses, with its
# bytes_frame declaration for the text deltas the plan hands over as a TokenRun
_sse = encode.sse_responses
_TEXT_DELTA = b'{"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":'


def token_json(index: int) -> tuple[bytes, bytes]:
    """The token event, the JSON around the piece: the text delta of content block
    ``index`` (the plan's ``TokenRun`` key)."""
    return _TEXT_DELTA % index, b"}}"


_TOKEN_DELTAS = frozenset(("text_delta", "input_json_delta", "thinking_delta"))


def is_token_event(etype: str, data: Any) -> bool:
    """A delta that carries one generated token (text, tool input or thinking)."""
    if etype != "content_block_delta":
        return False
    if type(data) is not dict:  # a text delta of the template (TokenRun, or its rendering)
        return True
    return data["delta"]["type"] in _TOKEN_DELTAS


ANTHROPIC = Dialect("anthropic.messages", numbered=False, sse=_sse,
                    sse_error=lambda err, seq: _sse("error", _error_object(err)),
                    error_events=lambda err: [("error", _error_object(err))],
                    is_token=is_token_event,
                    terminals=frozenset({"message_stop", "error"}),
                    token_type="content_block_delta", token_json=token_json)
"""Anthropic Messages on the wire: named SSE events, no sequence numbers, ``message_stop`` at
the end, a mid-stream failure as the ``error`` event."""

# ------------------------------------------------------------------------------------------
# Parsing
# ------------------------------------------------------------------------------------------


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise E.anthropic_not_content.at(where)
    for j, b in enumerate(content):
        if not isinstance(b, dict) or b.get("type") not in BLOCKS:
            raise E.anthropic_unknown_block.at(
                f"{where}.{j}.type", where=f"{where}.{j}", allowed=_BLOCK_TAGS,
                tag=b.get("type") if isinstance(b, dict) else repr(b))
        if b["type"] == "text" and not isinstance(b.get("text"), str):
            raise E.anthropic_field_required.at(f"{where}.{j}.text")
    return content


def _block_text(b: dict[str, Any]) -> str:
    t = b["type"]
    if t == "text":
        return str(b.get("text", ""))
    if t == "tool_use":
        return str(b.get("name", "")) + _dumps(b.get("input", {})).decode()
    if t == "tool_result":
        c = b.get("content")
        return content_text(c)[0] if not isinstance(c, str) else c
    if t == "thinking":
        return str(b.get("thinking", ""))
    return ""


def _tools(raw: list[Any], work: sch.Work) -> list[Tool]:
    out = []
    for i, t in enumerate(raw):
        p = f"tools.{i}"
        if not isinstance(t, dict) or not isinstance(t.get("name"), str) or not t["name"]:
            raise E.anthropic_field_required.at(f"{p}.name")
        if t.get("type") not in (None, "custom"):  # server tools (web search, ...): not called
            continue
        schema = t.get("input_schema")
        if not isinstance(schema, dict):
            raise E.anthropic_field_required.at(f"{p}.input_schema")
        sch.check(schema, param=f"{p}.input_schema", label=f"tool '{t['name']}'",
                  code="invalid_value", work=work)
        desc = t.get("description")
        out.append(Tool(t["name"], "function", schema, None, False, f"{p}.input_schema",
                        desc if isinstance(desc, str) else ""))
    return out


def _tool_choice(tc: Any, names: set[str]) -> tuple[ToolChoice, bool]:
    """``(choice, parallel)`` from Anthropic's tool_choice."""
    if tc is None:
        return AUTO, True
    if not isinstance(tc, dict) or tc.get("type") not in ("auto", "any", "tool", "none"):
        raise E.anthropic_unknown_tag.at("tool_choice.type", where="tool_choice",
                                         allowed="'auto', 'any', 'tool', 'none'")
    parallel = tc.get("disable_parallel_tool_use") is not True
    t = tc["type"]
    if t == "tool":
        name = tc.get("name")
        if name not in names:
            raise E.anthropic_tool_not_found.at("tool_choice.name", name=name)
        return ToolChoice("named", frozenset((name,))), parallel
    return TOOL_CHOICES[{"auto": "auto", "any": "required", "none": "none"}[t]], parallel


async def _parse(req: Request, app: Services, body: dict[str, Any], *, count_only: bool = False
                 ) -> tuple[Ask, dict[str, Any]]:
    """The Ask, and what rendering needs (model, thinking, ...)."""
    v = V(body)
    profile = app.model(body.get("model"))
    model = body["model"]
    for key in body:
        if key not in KNOWN_FIELDS:
            raise E.anthropic_extra_input.at(key)
    messages = v.list("messages", max_len=app.config.max_input_items)
    if messages is None:
        raise E.anthropic_field_required.at("messages")
    if not messages and not count_only:
        raise E.anthropic_no_messages.at("messages")
    chat_like: list[dict[str, Any]] = []
    # the prompt as the cache reads it (tools, system, messages: one entry a block) and the
    # blocks marked with cache_control (caching.anthropic_marks)
    cache_blocks: list[object] = []
    marks: list[tuple[int, float]] = []
    raw_tools = body.get("tools")
    if isinstance(raw_tools, list):
        for i, t in enumerate(raw_tools[:app.config.max_input_items]):
            if isinstance(t, dict):
                anthropic_marks(t, f"tools.{i}", marks, len(cache_blocks))
                cache_blocks.append(_unmarked(t))
    system = body.get("system")
    if system is not None:
        sys_blocks = _blocks(system, "system")
        for j, b in enumerate(sys_blocks):
            anthropic_marks(b, f"system.{j}", marks, len(cache_blocks))
            cache_blocks.append(("system", _unmarked(b)))
        chat_like.append({"role": "system",
                          "content": "\n".join(_block_text(b) for b in sys_blocks)})
    last_user = ""
    after_tool = False
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise E.anthropic_not_role.at(f"messages.{i}.role")
        blocks = _blocks(m.get("content"), f"messages.{i}.content")
        for j, b in enumerate(blocks):
            anthropic_marks(b, f"messages.{i}.content.{j}", marks, len(cache_blocks))
            cache_blocks.append((m["role"], _unmarked(b)))
        text = "\n".join(_block_text(b) for b in blocks)
        chat_like.append({"role": m["role"], "content": text})
        if m["role"] == "user":
            texts = [str(b.get("text", "")) for b in blocks if b["type"] == "text"]
            last_user = "\n".join(texts) or last_user
            after_tool = any(b["type"] == "tool_result" for b in blocks)
        else:
            after_tool = False
    limit = v.int("max_tokens", None, lo=1)
    if limit is None and not count_only:
        raise E.anthropic_field_required.at("max_tokens")
    if limit is not None and limit > profile.max_output_tokens:
        raise E.anthropic_max_tokens_too_large.at("max_tokens", limit=limit, model=model,
                                                  max=profile.max_output_tokens)
    stops = v.list("stop_sequences", max_len=8191) or []
    if not all(isinstance(s, str) for s in stops):
        raise E.anthropic_not_strings.at("stop_sequences")
    v.num("temperature", None, lo=0, hi=1)
    v.num("top_p", None, lo=0, hi=1)
    v.int("top_k", None, lo=0)
    v.dict("metadata")
    work = sch.Work()
    tools = _tools(v.list("tools", []) or [], work)
    choice, parallel = _tool_choice(body.get("tool_choice"), {t.name for t in tools})
    thinking = v.dict("thinking")
    effort = None
    if thinking is not None and thinking.get("type") == "enabled":
        budget = V(thinking, "thinking.").int("budget_tokens", None, lo=MIN_THINKING_BUDGET)
        if budget is None:
            raise E.anthropic_field_required.at("thinking.budget_tokens")
        if limit is not None and budget >= limit:
            raise E.anthropic_budget_not_below_max.at("thinking.budget_tokens")
        share = budget / limit if limit else 0.5
        effort = "high" if share >= 0.75 else "medium" if share >= 0.5 else "low"
        profile = replace(profile, reasoning=True, efforts=("low", "medium", "high"))
    elif thinking is not None and thinking.get("type") not in ("disabled", "enabled"):
        raise E.anthropic_unknown_tag.at("thinking.type", where="thinking.type",
                                         allowed="'enabled', 'disabled'")
    cw = profile.context_window
    prompt = await paced(chat_prompt_steps(chat_like, [
        {"name": t.name, "description": t.description, "parameters": t.parameters}
        for t in tools] or None, profile.encoding, cap=cw - (limit or 0)))
    if prompt + (limit or 0) > cw:
        raise E.anthropic_prompt_too_long.at("messages", prompt=prompt, max=cw - (limit or 0))
    ignore_eos = bool(v.bool("ignore_eos", False))
    use = anthropic_cached(app, profile, cache_blocks, marks, prompt) if marks and \
        not count_only else NO_USE
    ask = Ask(profile, prompt, use.read, user_text=lambda: last_user,
              prompt_texts=lambda: [m["content"] for m in chat_like if m["role"] != "assistant"],
              json_hint=json_hint(req.body), after_tool_result=after_tool,
              tools=tuple(tools), tool_choice=choice, parallel_tool_calls=parallel,
              output=TEXT, limit=limit, stops=tuple(stops), effort=effort,
              summary="detailed" if effort is not None else None,
              encrypted=effort is not None, ignore_eos=ignore_eos, cache_write=use.written,
              cache_write_1h=use.written_1h)
    if not count_only:
        check_request_work(1, limit or 1, 0, param="max_tokens")
    return ask, {"model": model, "stream": bool(v.bool("stream", False)),
                 "thinking": effort is not None}


# ------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------

def _unmarked(block: dict[str, Any]) -> dict[str, Any]:
    """A block as the cache reads it: where its breakpoint sits does not change its prefix."""
    if "cache_control" not in block:
        return block
    return {k: v for k, v in block.items() if k != "cache_control"}


def _usage(d: Decision) -> dict[str, Any]:
    """Anthropic's usage: ``input_tokens`` is the uncached rest of the prompt, besides the
    tokens read from the cache and those written to it (by TTL in ``cache_creation``)."""
    u = d.usage
    written = u.cache_write_tokens
    return {"input_tokens": u.prompt_tokens - u.cached_tokens - written,
            "output_tokens": u.output_tokens,
            "cache_creation_input_tokens": written, "cache_read_input_tokens": u.cached_tokens,
            "cache_creation": {"ephemeral_5m_input_tokens": written - u.cache_write_1h,
                               "ephemeral_1h_input_tokens": u.cache_write_1h},
            "service_tier": "standard"}


def _content(d: Decision) -> list[dict[str, Any]]:
    c = d.choices[0]
    out: list[dict[str, Any]] = []
    r = c.reasoning
    if r is not None:
        out.append({"type": "thinking", "thinking": "".join("".join(p) for p in r.summary),
                    "signature": r.encrypted or ""})
    if c.pieces is not None and (c.pieces or not c.calls):
        out.append({"type": "text", "text": "".join(c.pieces)})
    for call in c.calls:
        try:
            args = orjson.loads(call.arguments) if call.complete else {}
        except orjson.JSONDecodeError:
            args = {}
        out.append({"type": "tool_use", "id": call.call_id.replace("call_", "toolu_", 1),
                    "name": call.name, "input": args})
    return out


def _message(mid: str, model: str, d: Decision, done: bool = True) -> dict[str, Any]:
    c = d.choices[0]
    stop = FINISH.get(c.finish, "end_turn")
    if c.calls and c.finish == "stop":  # a forced tool ends with tool_use on Anthropic
        stop = "tool_use"
    if c.stop_sequence is not None:
        stop = "stop_sequence"
    return {"id": mid, "type": "message", "role": "assistant", "model": model,
            "content": _content(d) if done else [],
            "stop_reason": stop if done else None,
            "stop_sequence": c.stop_sequence if done else None,
            "usage": _usage(d) if done else {**_usage(d), "output_tokens": 1}}


def _plan(mid: str, model: str, d: Decision) -> Iterator[tuple[float, str, Any]]:
    c = d.choices[0]
    gaps = d.timing.gaps(1 << 30)
    delay = d.timing.first
    final = _message(mid, model, d)
    yield delay, "message_start", {"type": "message_start",
                                   "message": _message(mid, model, d, done=False)}
    idx = 0
    first = True
    due = True  # the first delta is due with message_start, at the TTFT (as chat's first token)
    for block in final["content"]:
        t = block["type"]
        start: dict[str, Any]
        if t == "thinking":
            start = {"type": "thinking", "thinking": "", "signature": ""}
        elif t == "text":
            start = {"type": "text", "text": ""}
        else:
            start = {**block, "input": {}}
        yield 0.0, "content_block_start", {"type": "content_block_start", "index": idx,
                                           "content_block": start}
        if first:
            yield 0.0, "ping", {"type": "ping"}
            first = False
        if t == "thinking":
            r = c.reasoning
            assert r is not None
            for part in r.summary:
                for piece in part:
                    yield 0.0 if due else next(gaps, 0.0), "content_block_delta", {
                        "type": "content_block_delta", "index": idx,
                        "delta": {"type": "thinking_delta", "thinking": piece}}
                    due = False
            yield 0.0, "content_block_delta", {
                "type": "content_block_delta", "index": idx,
                "delta": {"type": "signature_delta", "signature": block["signature"]}}
        elif t == "text":
            if c.pieces:  # the deltas as one run (stream.TokenRun), each a gap after the last
                yield 0.0 if due else next(gaps, 0.0), "content_block_delta", TokenRun(
                    c.pieces, gaps, idx)
                due = False
        else:
            call = c.calls[idx - len(final["content"]) + len(c.calls)]
            for piece in call.pieces:
                yield 0.0 if due else next(gaps, 0.0), "content_block_delta", {
                    "type": "content_block_delta", "index": idx,
                    "delta": {"type": "input_json_delta", "partial_json": piece}}
                due = False
        yield 0.0, "content_block_stop", {"type": "content_block_stop", "index": idx}
        idx += 1
    yield 0.0, "message_delta", {"type": "message_delta",
                                 "delta": {"stop_reason": final["stop_reason"],
                                           "stop_sequence": final["stop_sequence"]},
                                 "usage": {k: v for k, v in final["usage"].items()
                                           if k in _DELTA_USAGE}}
    yield 0.0, "message_stop", {"type": "message_stop"}


_DELTA_USAGE = ("input_tokens", "output_tokens", "cache_creation_input_tokens",
                "cache_read_input_tokens")


def _steps(d: Decision) -> int:
    c = d.choices[0]
    n = len(c.pieces or ()) + sum(len(t.pieces) for t in c.calls)
    if c.reasoning is not None:
        n += sum(len(p) for p in c.reasoning.summary)
    return max(1, n)


# ------------------------------------------------------------------------------------------
# Handlers
# ------------------------------------------------------------------------------------------

class Messages(Family):
    """Anthropic Messages on the request pipeline: parse (with the request's cache_control
    reads and writes), the message JSON or its SSE stream, a ``request-id`` on every answer."""

    endpoint = "anthropic.messages"
    seed_path = "/v1/messages"
    dialect = ANTHROPIC
    id_prefix = "msg_"
    errors = staticmethod(anthropic_error)

    async def parse(self, req: Request, app: Services) -> Parsed:
        body = req.json_object()
        ask, info = await _parse(req, app, body)
        return Parsed(ask, info["model"], info["stream"], body, info,
                      headers=[("request-id", req.request_id)])

    def render(self, p: Parsed, d: Decision, meta: Meta) -> Any:
        return _message(meta.id, p.model, d)

    def plan(self, p: Parsed, d: Decision, meta: Meta) -> Plan:
        return _plan(meta.id, p.model, d)

    def steps(self, d: Decision) -> int:
        return _steps(d)


FAMILY = Messages()


async def count_tokens(req: Request, app: Services) -> JSONResponse:
    ask, _ = await _parse(req, app, req.json_object(), count_only=True)
    return JSONResponse({"input_tokens": ask.prompt_tokens},
                        headers=[("request-id", req.request_id)])


async def list_models(req: Request, app: Services) -> JSONResponse:
    data = [{"type": "model", "id": m.id, "display_name": m.id.replace("-", " ").title(),
             "created_at": "2025-01-01T00:00:00Z"}
            for m in app.registry.listed() if m.id.startswith("claude")]
    return JSONResponse({"data": data, "has_more": False,
                         "first_id": data[0]["id"] if data else None,
                         "last_id": data[-1]["id"] if data else None})


def register(app: Host) -> None:
    r = app.router
    for prefix in ("/anthropic/v1", "/v1"):
        serve(app, FAMILY, [("POST", f"{prefix}/messages")])
        r.add("POST", f"{prefix}/messages/count_tokens", count_tokens,
              "anthropic.count_tokens", aliases=False, errors=anthropic_error)
    r.add("GET", "/anthropic/v1/models", list_models, "anthropic.models", aliases=False,
          errors=anthropic_error)
