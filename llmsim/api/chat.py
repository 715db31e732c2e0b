"""``POST /v1/chat/completions``: validation, then JSON and SSE rendering of the decision.

Parse → decide → render: the body is validated into a :class:`ChatRequest`, normalised into
the :class:`~llmsim.sim.decide.Ask` the one decision module reads (:func:`ask`), and the
:class:`~llmsim.sim.decide.Decision` is rendered here. Everything the model will say and every
delay is decided before the first byte (so errors are always a proper status line). The
stream plan is a generator of ``(offset, type, data)``: the role chunk at TTFT (after any
hidden reasoning), one content token per chunk at the inter-token pace, all ``n`` choices
advancing in lock-step, then the finish chunk, the optional usage chunk (``choices: []``) and
``[DONE]``. A custom tool call is ``{"type": "custom", "custom": {"name", "input"}}`` as the
SDK models it; streamed, its deltas carry ``custom`` pieces (see :func:`_choice_steps`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import orjson

from ..errors import APIError, E, missing, quoted
from ..messages import Request, Result
from ..sim import schema as sch
from ..sim import text as txt
from ..sim import tokens as tok
from ..sim.decide import (
    AUTO,
    TEXT,
    TOOL_CHOICES,
    Ask,
    Call,
    Choice,
    Decision,
    Output,
    Tool,
    ToolChoice,
)
from ..sim.described import json_hint
from ..sim.models import ModelProfile
from ..sim.prompt import chat_prompt_steps, content_text
from ..streaming import encode
from ..streaming.dialect import Dialect
from ..streaming.stream import TokenRun
from .caching import check_retention
from .pipeline import Family, Meta, Parsed, Plan, generate
from .pipeline import register as serve
from .validate import (
    FUNCTION_NAME,
    V,
    check_request_work,
    got,
    paced,
    stream_flags,
    unsupported,
)

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["register", "ChatRequest", "ChatOut", "parse", "ask", "completion_json",
           "stream_plan"]

ROLES = ("system", "developer", "user", "assistant", "tool", "function")
USER_PARTS = ("text", "image_url", "input_audio", "file")
FINGERPRINT = "fp_llmsim"
_dumps = orjson.dumps


@dataclass(slots=True)
class ChatRequest:
    """A validated chat request: everything the simulation needs."""

    body: dict[str, Any]
    profile: ModelProfile
    model: str
    messages: list[dict[str, Any]]
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    limit: int | None = None  # max_completion_tokens / max_tokens
    stops: list[str] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    tool_choice: Any = None
    parallel_tool_calls: bool = True
    response_format: dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int = 0
    effort: str | None = None
    prompt_tokens: int = 0
    service_tier: str | None = None
    ignore_eos: bool = False  # vLLM extension: always generate exactly the limit
    min_tokens: int = 0  # vLLM extension: never stop before this many tokens


def chat_steps(decision: Decision) -> int:
    """The delivery steps after the role chunk (all choices advance together; a tool call
    takes one step for its head, then one per piece)."""
    choices = decision.choices
    c = choices[0]
    if len(choices) == 1 and c.pieces is not None:  # (one text choice: hot path)
        return len(c.pieces)
    return max((len(c.pieces) if c.pieces is not None
                else 1 + sum(len(t.pieces) + 1 for t in c.calls)) for c in choices)


@dataclass(slots=True)
class ChatOut:
    """A decided answer as Chat Completions delivers it: the decision, the completion's id
    and creation time, and ``steps``, the delivery steps after the role chunk (all choices
    advance together; a tool call takes one step for its head, then one per piece)."""

    id: str
    created: int
    decision: Decision
    steps: int

    @classmethod
    def of(cls, decision: Decision, created: int, id: str) -> ChatOut:
        return cls(id, created, decision, chat_steps(decision))

    @property
    def choices(self) -> tuple[Choice, ...]:
        return self.decision.choices

    @property
    def ttft(self) -> float:
        return self.decision.timing.first

    def iter_gaps(self) -> Iterator[float]:
        """The ``steps - 1`` gaps between consecutive steps, same values on every call."""
        return self.decision.timing.gaps(self.steps - 1)

    def total_time(self) -> float:
        return self.decision.timing.duration(self.steps)

    def usage(self) -> dict[str, Any]:
        u = self.decision.usage
        return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.output_tokens,
                "total_tokens": u.total_tokens,
                "prompt_tokens_details": {"cached_tokens": u.cached_tokens, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": u.reasoning_tokens,
                                              "audio_tokens": 0,
                                              "accepted_prediction_tokens": 0,
                                              "rejected_prediction_tokens": 0}}


# ------------------------------------------------------------------------------------------
# Validation
# ------------------------------------------------------------------------------------------

def _check_messages(messages: list[Any]) -> None:
    turns = False  # a tool message or a tool call: the ordering rules apply
    for i, m in enumerate(messages):
        p = f"messages[{i}]"
        if not isinstance(m, dict):
            raise E.invalid_type.at(p, expected="an object")
        role = m.get("role")
        if role is None:
            raise missing(f"{p}.role")
        if role not in ROLES:
            raise E.invalid_value.at(f"{p}.role", value=role, allowed="'system', 'assistant', "
                                     "'user', 'function', 'tool', and 'developer'")
        content = m.get("content")
        if content is None:
            if role == "assistant" and (m.get("tool_calls") or m.get("function_call")
                                        or "content" in m):
                pass
            elif role == "assistant":
                raise missing(f"{p}.content")
            else:
                raise missing(f"{p}.content")
        elif isinstance(content, list):
            allowed = USER_PARTS if role == "user" else ("text", "refusal")
            for j, part in enumerate(content):
                pp = f"{p}.content[{j}]"
                if not isinstance(part, dict) or "type" not in part:
                    raise missing(f"{pp}.type")
                if part["type"] not in allowed:
                    raise E.invalid_value.at(f"{pp}.type", value=part["type"],
                                             allowed=quoted(allowed))
                if part["type"] == "text" and not isinstance(part.get("text"), str):
                    raise missing(f"{pp}.text")
                if part["type"] == "image_url":
                    iu = part.get("image_url")
                    if not isinstance(iu, dict) or not isinstance(iu.get("url"), str):
                        raise missing(f"{pp}.image_url.url")
        elif not isinstance(content, str):
            raise E.invalid_type_got.at(f"{p}.content", got=got(content),
                                        expected="one of a string or array of objects")
        if role == "tool":
            turns = True
            if not isinstance(m.get("tool_call_id"), str):
                raise missing(f"{p}.tool_call_id")
        tcs = m.get("tool_calls")
        if tcs is not None:
            turns = True
            if role != "assistant" or not isinstance(tcs, list):
                raise E.invalid_param.at(f"{p}.tool_calls")
            for j, tc in enumerate(tcs):
                if not isinstance(tc, dict) or not isinstance(tc.get("function"), dict) \
                        or not isinstance(tc.get("id"), str):
                    raise E.invalid_tool_call.at(f"{p}.tool_calls[{j}]")
    if turns:  # (without either, no rule can be broken)
        _check_tool_turns(messages)


def _check_tool_turns(messages: list[dict[str, Any]]) -> None:
    """The real API's ordering rules: a `tool` message answers a call of the assistant
    message before it, and every such call is answered before the next non-tool message."""
    pending: list[str] | None = None  # call ids of the last assistant turn still unanswered
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            if pending is None:
                raise E.tool_message_orphan.at(f"messages.[{i}].role")
            tid = m["tool_call_id"]
            if tid in pending:
                pending.remove(tid)
            continue
        if pending:
            raise E.tool_calls_unanswered.at(f"messages.[{i}].role", ids=", ".join(pending))
        tcs = m.get("tool_calls") if m["role"] == "assistant" else None
        pending = [tc["id"] for tc in tcs] if tcs else None


def _check_tools(tools: list[Any], work: sch.Work) -> list[dict[str, Any]]:
    out = []
    for i, t in enumerate(tools):
        p = f"tools[{i}]"
        if not isinstance(t, dict):
            raise E.invalid_type.at(p, expected="an object")
        ttype = t.get("type", "function")
        if ttype == "custom":
            c = t.get("custom")
            if not isinstance(c, dict) or not isinstance(c.get("name"), str):
                raise missing(f"{p}.custom.name")
            out.append(t)
            continue
        if ttype != "function":
            raise E.invalid_value.at(f"{p}.type", value=ttype, allowed="'function' and 'custom'")
        fn = t.get("function")
        if not isinstance(fn, dict):
            raise missing(f"{p}.function")
        name = fn.get("name")
        if not isinstance(name, str):
            raise missing(f"{p}.function.name")
        if not FUNCTION_NAME.match(name):
            raise E.name_pattern.at(f"{p}.function.name")
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise E.invalid_type.at(f"{p}.function.parameters", expected="an object")
        if params is not None:
            sch.check(params, param=f"{p}.function.parameters", label=f"function '{name}'",
                      code="invalid_function_parameters", work=work)
        out.append(t)
    return out


def _tool_name(t: dict[str, Any]) -> str:
    return t["custom"]["name"] if t.get("type") == "custom" else t["function"]["name"]


def _check_allowed_tools(at: Any) -> None:
    """`tool_choice: {"type": "allowed_tools", "allowed_tools": {"mode", "tools"}}`."""
    p = "tool_choice.allowed_tools"
    if not isinstance(at, dict):
        raise missing(p)
    mode = at.get("mode")
    if mode not in ("auto", "required"):
        raise E.invalid_value.at(f"{p}.mode", value=mode, allowed="'auto' and 'required'")
    tools = at.get("tools")
    if not isinstance(tools, list):
        raise E.invalid_type.at(f"{p}.tools", expected="an array")
    for i, t in enumerate(tools):
        kind = t.get("type", "function") if isinstance(t, dict) else None
        inner = t.get(kind) if kind in ("function", "custom") else None  # type: ignore[union-attr]
        if not isinstance(inner, dict) or not isinstance(inner.get("name"), str):
            raise missing(f"{p}.tools[{i}].function.name")


# Every body field of the SDK's CompletionCreateParams (openai 3.52); anything else is the
# real API's 400 "Unrecognized request argument supplied".
KNOWN_FIELDS = frozenset((
    "audio", "frequency_penalty", "function_call", "functions", "logit_bias", "logprobs",
    "max_completion_tokens", "max_tokens", "messages", "metadata", "modalities", "model",
    "moderation", "n", "parallel_tool_calls", "prediction", "presence_penalty",
    "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention", "reasoning_effort",
    "response_format", "safety_identifier", "seed", "service_tier", "stop", "store", "stream",
    "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user",
    "verbosity", "web_search_options"))

# Sampling extensions that benchmark harnesses (vLLM's benchmark_serving, genai-perf,
# LLMPerf) send to OpenAI-compatible servers. The real OpenAI API rejects them; a simulator
# that stands in for a vLLM/TGI deployment must take them. `ignore_eos` and `min_tokens` are
# honoured (they shape the output length); the rest are accepted and ignored (README).
SERVER_EXTENSIONS = frozenset((
    "ignore_eos", "min_tokens", "top_k", "min_p", "repetition_penalty", "length_penalty",
    "best_of", "use_beam_search", "skip_special_tokens", "spaces_between_special_tokens",
    "include_stop_str_in_output", "stop_token_ids", "chat_template", "chat_template_kwargs",
    "add_generation_prompt", "continue_final_message", "echo", "priority", "nvext",
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "truncate_prompt_tokens",
    "return_tokens_as_token_ids", "prompt_logprobs", "documents", "mm_processor_kwargs"))


_IGNORED_CHECKS: dict[str, Any] = {
    "presence_penalty": lambda v: v.num("presence_penalty", None, lo=-2, hi=2),
    "frequency_penalty": lambda v: v.num("frequency_penalty", None, lo=-2, hi=2),
    "logit_bias": lambda v: v.dict("logit_bias"),
    "seed": lambda v: v.int("seed"),
    "user": lambda v: v.str("user"),
    "metadata": lambda v: v.metadata(),
    "store": lambda v: v.bool("store"),
    "prediction": lambda v: v.dict("prediction"),
    "web_search_options": lambda v: v.dict("web_search_options"),
    "modalities": lambda v: v.list("modalities"),
    "audio": lambda v: v.dict("audio"),
    "verbosity": lambda v: v.str("verbosity", choices=("low", "medium", "high")),
    "prompt_cache_key": lambda v: v.str("prompt_cache_key"),
    "safety_identifier": lambda v: v.str("safety_identifier"),
}


# The fields of a plain request (a model, its messages, a limit, the sampling knobs and the
# ignored seed and user). A body with no other key skips the validation of the rest, each of
# which would only return its default (hot path; one subset check decides it).
PLAIN_FIELDS = frozenset(("model", "messages", "max_tokens", "max_completion_tokens", "stream",
                          "n", "temperature", "top_p", "seed", "user"))


async def parse(req: Request, app: Services) -> ChatRequest:
    """Validate a Chat Completions body; raise APIError naming the first bad parameter.

    Async only to count a long prompt in slices (``validate.paced``), never holding the loop."""
    body = req.json_object()
    v = V(body)
    profile = app.model(body.get("model"))
    model = body["model"]
    messages = v.list("messages", max_len=app.config.max_input_items)
    if messages is None:
        raise missing("messages")
    if not messages:
        raise E.empty_array.at("messages", min_len=1)
    _check_messages(messages)
    rare = not PLAIN_FIELDS.issuperset(body)  # False: every block under `if rare` is a no-op
    stream, include_usage = stream_flags(v)
    # (`key in body and`: an absent field is its default without a getter call, hot path)
    n = v.int("n", 1, lo=1, hi=128) or 1 if "n" in body else 1
    reasoning = profile.reasoning
    temperature = v.num("temperature", None, lo=0, hi=2) if "temperature" in body else None
    top_p = v.num("top_p", None, lo=0, hi=1) if "top_p" in body else None
    for key in body:  # accepted-and-ignored fields: validated only when present (hot path)
        check = _IGNORED_CHECKS.get(key)
        if check is not None:
            check(v)
        elif key not in KNOWN_FIELDS and key not in SERVER_EXTENSIONS:
            raise E.unrecognized_argument.at(key=key)
    service_tier = v.str("service_tier", None,
                         choices=("auto", "default", "flex", "scale", "priority")) \
        if rare else None
    max_tokens = v.int("max_tokens", None, lo=1)
    max_completion = v.int("max_completion_tokens", None, lo=1) \
        if "max_completion_tokens" in body else None
    if reasoning:
        if max_tokens is not None:
            raise unsupported("max_tokens", model, "Use 'max_completion_tokens' instead.")
        if temperature is not None and temperature != 1:
            raise E.unsupported_default_only.at("temperature", value=body["temperature"],
                                                default=1)
        if top_p is not None and top_p != 1:
            raise E.unsupported_default_only.at("top_p", value=body["top_p"], default=1)
    limit = max_completion if max_completion is not None else max_tokens
    limit_param = "max_completion_tokens" if max_completion is not None else "max_tokens"
    if limit is not None and limit > profile.max_output_tokens:
        raise E.limit_too_large.at(limit_param, limit=limit, max=profile.max_output_tokens,
                                   unit="completion")
    min_tokens = 0
    stops: list[str] = []
    logprobs = False
    top_logprobs: int | None = None
    effort: str | None = None
    tools: list[dict[str, Any]] = []
    tool_choice: Any = None
    parallel: bool | None = True
    rf: dict[str, Any] | None = None
    if rare:
        min_tokens = min_tokens_of(v, limit, limit_param, profile)
        stops = list(stop_list(body))
        logprobs = bool(v.bool("logprobs", False))
        top_logprobs = v.int("top_logprobs", None, lo=0, hi=20)
        if top_logprobs is not None and not logprobs:
            raise E.top_logprobs_without_logprobs.at("top_logprobs")
        if logprobs and reasoning:
            raise unsupported("logprobs", model)
        effort = v.str("reasoning_effort", None,
                       choices=("none", "minimal", "low", "medium", "high", "xhigh"))
        if effort is not None:
            if not reasoning:
                raise unsupported("reasoning_effort", model)
            if effort not in profile.efforts:
                raise E.unsupported_value.at("reasoning_effort", value=effort,
                                             allowed=quoted(profile.efforts))
        tools, tool_choice, parallel, rf = _check_tooling(v, body, messages)
    enc = profile.encoding
    cw = profile.context_window
    # counted up to what can fit: a prompt that cannot is refused without tokenizing it whole
    prompt_tokens = await paced(chat_prompt_steps(messages, tools or None, enc,
                                                  cap=cw - (limit or 0)))
    if prompt_tokens + (limit or 0) > cw:
        # the real API's two wordings; "at least" when counting stopped at what could fit
        least = "at least " if type(prompt_tokens) is tok.Bound else ""
        if limit:
            raise E.context_chat_completion.at("messages", window=cw, least=least,
                                               total=prompt_tokens + limit,
                                               prompt=prompt_tokens, completion=limit)
        raise E.context_chat_messages.at("messages", window=cw, least=least,
                                         prompt=prompt_tokens)
    per_choice = txt.most_tokens(app.config, limit, min_tokens=min_tokens, echoed=prompt_tokens)
    raised = limit is None and min_tokens > app.config.output_tokens_max  # min_tokens drives it
    check_request_work(n, per_choice, (top_logprobs or 0) if logprobs else 0,
                       param="min_tokens" if raised and min_tokens == per_choice else "n")
    ignore_eos = bool(v.bool("ignore_eos", False)) if rare else False
    return ChatRequest(body, profile, model, messages, n, stream, include_usage, limit, stops,
                       tools, tool_choice, bool(parallel), rf, logprobs, top_logprobs or 0,
                       (effort or profile.default_effort) if reasoning else None,
                       prompt_tokens, service_tier, ignore_eos, min_tokens)


def _check_tooling(v: V, body: dict[str, Any], messages: list[dict[str, Any]]
                   ) -> tuple[list[dict[str, Any]], Any, bool | None, dict[str, Any] | None]:
    """``tools``, ``tool_choice``, ``parallel_tool_calls`` and ``response_format``, in that
    order (their schemas share one work bound, llmsim.sim.schema)."""
    schema_work = sch.Work()
    tools = _check_tools(v.list("tools", []) or [], schema_work)
    names = {_tool_name(t) for t in tools}
    tool_choice = body.get("tool_choice")
    if tool_choice is not None:
        if isinstance(tool_choice, str):
            if tool_choice not in ("none", "auto", "required"):
                raise E.invalid_value.at("tool_choice", value=tool_choice,
                                         allowed="'none', 'auto', and 'required'")
            if tool_choice == "required" and not tools:
                raise E.tool_choice_without_tools.at("tool_choice")
        elif isinstance(tool_choice, dict):
            fn = tool_choice.get("function") or tool_choice.get("custom") or {}
            name = fn.get("name") if isinstance(fn, dict) else None
            if tool_choice.get("type") == "allowed_tools":
                _check_allowed_tools(tool_choice.get("allowed_tools"))
            elif not isinstance(name, str):
                raise missing("tool_choice.function.name")
            elif name not in names:
                raise E.tool_choice_unknown_function.at("tool_choice", name=name)
        else:
            raise E.invalid_type.at("tool_choice", expected="one of a string or an object")
    if tool_choice is not None and not tools and tool_choice != "none":
        raise E.tool_choice_without_tools.at("tool_choice")
    parallel = v.bool("parallel_tool_calls", True)
    rf = v.dict("response_format")
    if rf is not None:
        rtype = rf.get("type")
        if rtype not in ("text", "json_object", "json_schema"):
            raise E.invalid_value.at("response_format.type", value=rtype, allowed="'text', "
                                     "'json_object', and 'json_schema'")
        if rtype == "json_schema":
            js = rf.get("json_schema")
            if not isinstance(js, dict):
                raise missing("response_format.json_schema")
            if not isinstance(js.get("name"), str):
                raise missing("response_format.json_schema.name")
            if js.get("schema") is not None and not isinstance(js.get("schema"), dict):
                raise E.invalid_type.at("response_format.json_schema.schema",
                                        expected="an object")
            if js.get("schema") is not None:
                sch.check(js["schema"], param="response_format.json_schema.schema",
                          label=f"response_format '{js['name']}'", code="invalid_json_schema",
                          work=schema_work)
        if rtype == "json_object" and not any(
                "json" in content_text(m.get("content"))[0].lower() for m in messages):
            raise E.json_word_required.at("messages")
    return tools, tool_choice, parallel, rf


def stop_list(body: dict[str, Any]) -> tuple[str, ...]:
    """``stop``: a string or up to 4 strings (chat and legacy completions alike)."""
    stop = body.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        return (stop,)
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > 4:
            raise E.array_too_long.at("stop", max_len=4, length=len(stop))
        return tuple(stop)
    raise E.invalid_type.at("stop", expected="one of a string or array of strings")


def min_tokens_of(v: V, limit: int | None, limit_param: str, profile: ModelProfile) -> int:
    """vLLM's ``min_tokens``: a floor on the length, at most the request's limit (vLLM's rule
    and wording) or, without one, the model's output limit (a length it could never reach)."""
    min_tokens = v.int("min_tokens", 0, lo=0) or 0
    top = limit if limit is not None else profile.max_output_tokens
    if min_tokens > top:
        raise E.min_tokens_too_large.at(
            "min_tokens", value=min_tokens,
            bound=f"{limit_param}={limit}" if limit is not None else
            f"the model's {profile.max_output_tokens} completion tokens")
    return min_tokens


# ------------------------------------------------------------------------------------------
# The request as the decision sees it
# ------------------------------------------------------------------------------------------

def last_user_text(messages: list[dict[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            return content_text(m.get("content"))[0]
    return ""


def _decide_tools(tools: list[dict[str, Any]]) -> tuple[Tool, ...]:
    out = []
    for i, t in enumerate(tools):
        if t.get("type") == "custom":
            c = t["custom"]
            desc = c.get("description")
            out.append(Tool(c["name"], "custom", None, c.get("format"),
                            description=desc if isinstance(desc, str) else ""))
        else:
            fn = t["function"]
            desc = fn.get("description")
            out.append(Tool(fn["name"], "function", fn.get("parameters"), None,
                            fn.get("strict") is True, f"tools[{i}].function.parameters",
                            desc if isinstance(desc, str) else ""))
    return tuple(out)


def _decide_tool_choice(tc: Any) -> ToolChoice:
    if tc is None:
        return AUTO
    if isinstance(tc, str):
        return TOOL_CHOICES[tc]  # "auto" | "none" | "required"
    if tc.get("type") == "allowed_tools":
        at = tc["allowed_tools"]
        return ToolChoice(at["mode"], frozenset(_tool_name(a) for a in at["tools"]))
    fn = tc.get("function") or tc.get("custom")
    return ToolChoice("named", frozenset((fn["name"],)))


def ask(cr: ChatRequest, json_hint: bool = False) -> Ask:
    """The request as :func:`llmsim.sim.decide.decide` needs it (``json_hint``: the raw body
    mentions JSON, :func:`llmsim.sim.described.json_hint`)."""
    messages = cr.messages
    rf = cr.response_format
    output = TEXT
    if rf is not None:
        if rf.get("type") == "json_schema":
            schema = (rf.get("json_schema") or {}).get("schema") or {"type": "object"}
            output = Output("json_schema", schema, "response_format.json_schema.schema")
        elif rf.get("type") == "json_object":
            output = Output("json_object")
    # (positional, in Ask's field order: keywords cost ~0.5 µs a request here)
    return Ask(cr.profile, cr.prompt_tokens, 0, lambda: last_user_text(messages),
               lambda: [content_text(m.get("content"))[0] for m in messages
                        if m.get("role") in ("system", "developer", "user")],
               json_hint, messages[-1].get("role") in ("tool", "function"),
               _decide_tools(cr.tools) if cr.tools else (),
               _decide_tool_choice(cr.tool_choice), cr.parallel_tool_calls, None, output,
               cr.limit, cr.min_tokens, cr.ignore_eos, tuple(cr.stops), cr.effort, None, False,
               cr.n, cr.logprobs, cr.top_logprobs)


# ------------------------------------------------------------------------------------------
# Rendering
# ------------------------------------------------------------------------------------------

def _call_json(t: Call) -> dict[str, Any]:
    if t.kind == "custom":  # ChatCompletionMessageCustomToolCall
        return {"id": t.call_id, "type": "custom", "custom": {"name": t.name,
                                                              "input": t.arguments}}
    return {"id": t.call_id, "type": "function", "function": {"name": t.name,
                                                              "arguments": t.arguments}}


def completion_json(cr: ChatRequest, out: ChatOut) -> dict[str, Any]:
    # the decision's finish reasons are chat's own words (stop, length, tool_calls, ...)
    choices = []
    for c in out.choices:
        msg: dict[str, Any] = {"role": "assistant", "content": c.text, "refusal": None,
                               "annotations": []}
        if c.calls:
            msg["tool_calls"] = [_call_json(t) for t in c.calls]
        choices.append({"index": c.index, "message": msg,
                        "logprobs": {"content": c.logprobs, "refusal": None}
                        if c.logprobs is not None else None,
                        "finish_reason": c.finish})
    return {"id": out.id, "object": "chat.completion", "created": out.created,
            "model": cr.model, "choices": choices, "usage": out.usage(),
            "service_tier": _tier(cr), "system_fingerprint": FINGERPRINT}


def _tier(cr: ChatRequest) -> str:
    return "default" if cr.service_tier in (None, "auto") else cr.service_tier  # type: ignore


def _choice_steps(c: Choice) -> list[dict[str, Any]]:
    """The deltas of one choice after its role chunk, one per step.

    A custom tool call streams ``custom: {name, input}`` pieces without a ``type``: the
    SDK's delta model only knows ``"function"`` (strict validation rejects ``"custom"``
    there, and its stream accumulator cannot complete one), while the accumulated deltas
    still read as the ``ChatCompletionMessageCustomToolCall`` of a non-streamed answer."""
    steps: list[dict[str, Any]] = []
    for j, t in enumerate(c.calls):
        if t.kind == "custom":
            steps.append({"tool_calls": [{"index": j, "id": t.call_id,
                                          "custom": {"name": t.name, "input": ""}}]})
            for p in t.pieces:
                steps.append({"tool_calls": [{"index": j, "custom": {"input": p}}]})
            continue
        steps.append({"tool_calls": [{"index": j, "id": t.call_id, "type": "function",
                                      "function": {"name": t.name, "arguments": ""}}]})
        for p in t.pieces:
            steps.append({"tool_calls": [{"index": j, "function": {"arguments": p}}]})
    return steps


def _chunk(head: dict[str, Any], choice: int, delta: dict[str, Any],
           finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
    """A chunk of the stream's ``head`` whose one choice carries ``delta``."""
    return {**head, "choices": [{"index": choice, "delta": delta, "logprobs": logprobs,
                                 "finish_reason": finish}]}


def stream_plan(cr: ChatRequest, out: ChatOut) -> Iterator[tuple[float, str, Any]]:
    """The SSE plan: role chunks at TTFT, one token per chunk per step, finish, usage, DONE."""
    head = {"id": out.id, "object": "chat.completion.chunk", "created": out.created,
            "model": cr.model, "service_tier": _tier(cr), "system_fingerprint": FINGERPRINT}
    if cr.include_usage:
        head["usage"] = None
    gaps = out.iter_gaps()
    choices = out.choices
    only = choices[0]
    if len(choices) == 1 and only.pieces is not None and only.logprobs is None:
        # the common case, one token per chunk of one text choice: the role chunk, the
        # tokens as one run (stream.TokenRun; the pump renders them without a step of this
        # plan per token, hot path, issue 15), the first due with the role chunk, then a
        # gap each, the finish chunk (the chunks of the loop below, built in place)
        i, pieces, finish, ttft = only.index, only.pieces, only.finish, out.ttft
        usage = out.usage() if cr.include_usage else None
        # (what the rest reads is taken: the decision's objects are not kept for the
        # stream's life, where the collector would walk them)
        del out, choices, only
        yield ttft, "chunk", {**head, "choices": [
            {"index": i, "delta": {"role": "assistant", "content": "", "refusal": None},
             "logprobs": None, "finish_reason": None}]}
        if pieces:
            yield 0.0, "chunk", TokenRun(pieces, gaps, (head, i))
        yield 0.0, "chunk", {**head, "choices": [{"index": i, "delta": {}, "logprobs": None,
                                                  "finish_reason": finish}]}
        if usage is not None:
            yield 0.0, "chunk", {**head, "choices": [], "usage": usage}
        yield 0.0, "done", None
        return
    first = True
    for c in choices:
        role: dict[str, Any] = {"role": "assistant", "content": "" if c.pieces is not None
                                else None, "refusal": None}
        yield (out.ttft if first else 0.0), "chunk", _chunk(head, c.index, role)
        first = False
    seqs = [c.pieces if c.pieces is not None else _choice_steps(c) for c in choices]
    keys = []  # (one key a choice: the pump's template; a loop, so ``head`` is no cell)
    for c in choices:
        keys.append((head, c.index))
    steps = max(len(s) for s in seqs)
    for k in range(steps):
        delay = next(gaps, 0.0) if k else 0.0
        for c, seq in zip(choices, seqs, strict=True):
            if k >= len(seq):
                continue
            item = seq[k]
            if type(item) is str:
                if c.logprobs is not None:
                    yield delay, "chunk", _chunk(head, c.index, {"content": item},
                                                 logprobs={"content": [c.logprobs[k]],
                                                           "refusal": None})
                else:  # (a run of one: the choices take turns)
                    yield delay, "chunk", TokenRun([item], key=keys[c.index])
            else:  # a tool-call delta
                yield delay, "chunk", _chunk(head, c.index, cast(dict[str, Any], item))
            delay = 0.0
    for c in choices:
        yield 0.0, "chunk", _chunk(head, c.index, {}, c.finish)
    if cr.include_usage:
        yield 0.0, "chunk", {**head, "choices": [], "usage": out.usage()}
    yield 0.0, "done", None


def is_token_event(etype: str, data: Any) -> bool:
    """A chunk that carries one generated token (content or tool-call argument fragment)."""
    if etype != "chunk":
        return False
    if type(data) is not dict:  # a token of the template (TokenRun, or its rendering)
        return True
    ch = data.get("choices")
    if not ch:
        return False
    d = ch[0].get("delta") or {}
    return bool(d.get("content")) or bool(d.get("tool_calls")) and "id" not in d["tool_calls"][0]


def token_json(key: tuple[dict[str, Any], int]) -> tuple[bytes, bytes]:
    """Chat's token event, the JSON around the piece: a chunk of the stream's ``head`` whose
    one choice (``index``) carries the piece as its content (the plan's ``TokenRun`` key)."""
    head, index = key
    head_json = _dumps({**head, "choices": None})
    cut = head_json.index(b'"choices":null')
    return (head_json[:cut] + b'"choices":[{"index":%d,"delta":{"content":' % index,
            b'},"logprobs":null,"finish_reason":null}]' + head_json[cut + 14:])


def error_events(err: APIError) -> list[tuple[str, Any]]:
    """A mid-stream failure as the real API sends it: an error object, then [DONE]."""
    return [("chunk", {"error": err.to_dict()}), ("done", None)]


CHAT = Dialect("chat.completions", numbered=False, sse=encode.sse_chat,
               sse_error=lambda err, seq: encode.sse_error_chat(err.to_dict(), seq),
               error_events=error_events, is_token=is_token_event,
               terminals=frozenset({"done"}), token_type="chunk", token_json=token_json)
"""Chat Completions on the wire: ``chat.completion.chunk`` SSE, no sequence numbers,
``[DONE]`` at the end, no WebSocket mode."""


# ------------------------------------------------------------------------------------------
# Handler
# ------------------------------------------------------------------------------------------

class Chat(Family):
    """Chat Completions on the request pipeline (:mod:`llmsim.api.pipeline`): the family
    parses and renders; a resent body is not parsed or counted again (its memo)."""

    endpoint = "chat.completions"
    seed_path = "/v1/chat/completions"
    dialect = CHAT
    id_prefix = "chatcmpl-"
    memo = True

    async def parse(self, req: Request, app: Services) -> Parsed:
        cr = await parse(req, app)
        retention = check_retention(cr.body)
        return Parsed(ask(cr, json_hint(req.body)), cr.model, cr.stream, cr.body, cr,
                      lambda: _cache_blocks(cr), retention)

    def render(self, p: Parsed, d: Decision, meta: Meta) -> Any:
        return completion_json(p.info, ChatOut.of(d, meta.created, meta.id))

    def plan(self, p: Parsed, d: Decision, meta: Meta) -> Plan:
        return stream_plan(p.info, ChatOut.of(d, meta.created, meta.id))

    def steps(self, d: Decision) -> int:
        return chat_steps(d)


FAMILY = Chat()
MEMO = FAMILY.endpoint  # this family's validated-body memo in App.memos


async def create(req: Request, app: Services) -> Result:
    """``POST /v1/chat/completions`` (other routes may serve it too: Azure deployments)."""
    return await generate(req, app, FAMILY)


def _cache_blocks(cr: ChatRequest) -> list[object]:
    """The prompt in the order the model reads it, for the prompt cache: tools, then
    each message."""
    return [cr.tools, *cr.messages] if cr.tools else list(cr.messages)


def register(app: Host) -> None:
    serve(app, FAMILY, [("POST", "/v1/chat/completions")], aliases=True)
