"""Validation of ``POST /v1/responses`` bodies into a :class:`RespRequest`.

Every check raises :class:`~llmsim.errors.APIError` naming the parameter, in the real API's
wording where it is known. Input items are normalised into the shapes the API returns from
``GET /v1/responses/{id}/input_items`` (each with an ``id`` and a ``status``), so they can be
stored, listed and replayed as context without another conversion.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import APIError, E, missing, quoted
from ...sim import schema as sch
from ...sim.compaction import MAX_BLOB_CHARS, summary_tokens
from ...sim.decide import TEXT, TOOL_CHOICES, Ask, Output, Tool, ToolChoice
from ...sim.models import ModelProfile
from ...sim.prompt import content_text
from ...sim.rng import new_id
from ..validate import FUNCTION_NAME, V, got, unsupported
from . import hosted
from .request import CALLABLE_TOOLS, RespRequest

if TYPE_CHECKING:
    from ..services import Services

__all__ = ["RespRequest", "parse_body", "normalize_input", "ask", "KNOWN_FIELDS", "TOOL_TYPES"]

# Every field of the SDK's ResponseCreateParams (openai 3.52) plus ``stream``; anything else
# is the real API's "Unknown parameter" 400 (catches ``max_tokens`` and other typos).
KNOWN_FIELDS = frozenset((
    "access_programs", "background", "context_management", "conversation", "image", "include",
    "input", "instructions", "max_output_tokens", "max_tool_calls", "metadata", "model",
    "moderation", "parallel_tool_calls", "previous_response_id", "prompt", "prompt_cache_key",
    "prompt_cache_options", "prompt_cache_retention", "reasoning", "safety_identifier",
    "service_tier", "store", "stream", "stream_options", "temperature", "text", "tool_choice",
    "tools", "top_logprobs", "top_p", "truncation", "user", "personality",
    # Open Responses' CreateResponseBody (the SDK's params lack them; the real API echoes them)
    "presence_penalty", "frequency_penalty"))

# tool type -> required fields besides ``type`` (the SDK's Tool union, openai 3.52)
TOOL_TYPES: dict[str, tuple[str, ...]] = {
    "function": ("name",), "file_search": ("vector_store_ids",), "computer": (),
    "computer_use_preview": ("display_height", "display_width", "environment"),
    "web_search": (), "web_search_2025_08_26": (), "web_search_preview": (),
    "web_search_preview_2025_03_11": (), "mcp": ("server_label",),
    "code_interpreter": ("container",), "programmatic_tool_calling": (),
    "image_generation": (), "local_shell": (), "shell": (), "custom": ("name",),
    "namespace": ("description", "name", "tools"), "tool_search": (), "apply_patch": ()}

INCLUDABLE = ("file_search_call.results", "web_search_call.results",
              "web_search_call.action.sources", "message.input_image.image_url",
              "computer_call_output.output.image_url", "code_interpreter_call.outputs",
              "reasoning.encrypted_content", "message.output_text.logprobs")
INPUT_ROLES = ("user", "assistant", "system", "developer")
USER_PARTS = ("input_text", "input_image", "input_file")
ASSISTANT_PARTS = ("output_text", "refusal")
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning",
              "item_reference", "custom_tool_call", "custom_tool_call_output", "compaction",
              *hosted.INPUT_TYPES)
MAX_CONTEXT_MANAGEMENT = 4  # entries of context_management


def _missing(param: str) -> APIError:
    return missing(param)


def _bad_value(param: str, value: Any, allowed: tuple[str, ...]) -> APIError:
    return E.invalid_value.at(param, value=value, allowed=quoted(allowed))


def _need_str(d: dict[str, Any], key: str, p: str) -> str:
    v = d.get(key)
    if v is None:
        raise _missing(f"{p}.{key}")
    if not isinstance(v, str):
        raise E.invalid_type_got.at(f"{p}.{key}", expected="a string", got=got(v))
    return v


# ------------------------------------------------------------------------------------------
# Input items
# ------------------------------------------------------------------------------------------

def _parts(content: Any, role: str, p: str) -> list[dict[str, Any]]:
    """Message content as the API stores it (input_text/... or output_text/refusal parts)."""
    assistant = role == "assistant"
    if isinstance(content, str):
        return [{"type": "output_text", "text": content, "annotations": []} if assistant
                else {"type": "input_text", "text": content}]
    if not isinstance(content, list):
        raise E.invalid_type_got.at(f"{p}.content", got=got(content), expected="one of a "
                                    "string or array of input item content")
    allowed = ASSISTANT_PARTS if assistant else USER_PARTS
    out = []
    for j, part in enumerate(content):
        pp = f"{p}.content[{j}]"
        t = _typed(part, pp, allowed)
        if t in ("input_text", "output_text"):
            text = _need_str(part, "text", pp)
            out.append({"type": t, "text": text, "annotations": []} if t == "output_text"
                       else {"type": t, "text": text})
        elif t == "refusal":
            out.append({"type": "refusal", "refusal": _need_str(part, "refusal", pp)})
        elif t == "input_image":
            if not isinstance(part.get("image_url"), str) and \
                    not isinstance(part.get("file_id"), str):
                raise E.one_of_required.at(pp, fields="'image_url' or 'file_id'")
            detail = part.get("detail", "auto")
            if detail not in ("low", "high", "auto", "original"):
                raise _bad_value(f"{pp}.detail", detail, ("low", "high", "auto", "original"))
            out.append({"type": t, "detail": detail, "image_url": part.get("image_url"),
                        "file_id": part.get("file_id")})
        else:  # input_file
            if not any(isinstance(part.get(k), str)
                       for k in ("file_id", "file_data", "file_url")):
                raise E.one_of_required.at(pp, fields="'file_id', 'file_data' or 'file_url'")
            out.append({k: part[k] for k in ("type", "file_id", "file_data", "file_url",
                                              "filename") if part.get(k) is not None})
    return out


ID_PREFIX = {"message": "msg_", "function_call": "fc_", "custom_tool_call": "ctc_",
             "function_call_output": "fco_", "custom_tool_call_output": "ctco_",
             "reasoning": "rs_", "compaction": "cmp_", **hosted.PREFIX}
"""The prefix of the id an input item of each type gets when the client gave none."""


def _given_id(it: dict[str, Any]) -> str | None:
    given = it.get("id")
    return given if isinstance(given, str) else None


def _item_id(it: dict[str, Any], t: str) -> str:
    """The client's id of an input item, else a new one for its type."""
    given = _given_id(it)
    return given if given is not None else new_id(ID_PREFIX[t])


def generated_ids(raw: Any) -> list[int]:
    """The indexes of the items :func:`normalize_input` gives new ids (a valid ``input``)."""
    if isinstance(raw, str):
        return [0]
    if not isinstance(raw, list):  # (no input: none)
        return []
    return [i for i, it in enumerate(raw)
            if _given_id(it) is None and it.get("type") != "item_reference"]


def _message(it: dict[str, Any], p: str) -> dict[str, Any]:
    role = it.get("role")
    if role is None:
        raise _missing(f"{p}.role")
    if role not in INPUT_ROLES:
        raise _bad_value(f"{p}.role", role, INPUT_ROLES)
    if "content" not in it or it["content"] is None:
        raise _missing(f"{p}.content")
    item: dict[str, Any] = {"id": _item_id(it, "message"), "type": "message", "role": role,
                            "content": _parts(it["content"], role, p), "status": "completed"}
    if role == "assistant" and isinstance(it.get("phase"), str):
        item["phase"] = it["phase"]
    return item


def _status(it: dict[str, Any], p: str) -> str:
    st = it.get("status", "completed")
    if st is None:
        return "completed"
    if st not in ("in_progress", "completed", "incomplete"):
        raise _bad_value(f"{p}.status", st, ("in_progress", "completed", "incomplete"))
    return st


def normalize_input(raw: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """``input`` as stored items, and the ids of ``item_reference`` items (in order).

    ``item_reference`` items are kept in the list as ``{"type": "item_reference", "id"}``
    placeholders; the handler resolves them against stored items.
    """
    if isinstance(raw, str):
        return [{"id": new_id(ID_PREFIX["message"]), "type": "message", "role": "user",
                 "content": [{"type": "input_text", "text": raw}], "status": "completed"}], []
    if not isinstance(raw, list):
        raise E.invalid_type_got.at("input", got=got(raw), expected="one of a string or array "
                                    "of input items")
    items: list[dict[str, Any]] = []
    refs: list[str] = []
    for i, it in enumerate(raw):
        p = f"input[{i}]"
        if not isinstance(it, dict):
            raise E.invalid_type.at(p, expected="an input item object")
        t = it.get("type")
        if t is None:
            if "role" in it:
                t = "message"  # the {role, content} shorthand (EasyInputMessage)
            else:
                raise _missing(f"{p}.type")
        if t not in ITEM_TYPES:
            raise _bad_value(f"{p}.type", t, ITEM_TYPES)
        if t == "message":
            items.append(_message(it, p))
        elif t in ("function_call", "custom_tool_call"):
            name = _need_str(it, "name", p)
            call_id = _need_str(it, "call_id", p)
            key = "arguments" if t == "function_call" else "input"
            val = _need_str(it, key, p)
            items.append({"id": _item_id(it, t), "type": t, "status": _status(it, p), key: val,
                          "call_id": call_id,
                          "name": name})
        elif t in ("function_call_output", "custom_tool_call_output"):
            call_id = _need_str(it, "call_id", p)
            out = it.get("output")
            if out is None:
                raise _missing(f"{p}.output")
            if not isinstance(out, (str, list)):
                raise E.invalid_type.at(f"{p}.output", expected="one of a string or array of "
                                        "content items")
            items.append({"id": _item_id(it, t), "type": t, "call_id": call_id, "output": out,
                          "status": _status(it, p)})
        elif t == "reasoning":
            summ = it.get("summary", [])
            if not isinstance(summ, list):
                raise E.invalid_type.at(f"{p}.summary", expected="an array")
            summary = []
            for j, s in enumerate(summ):
                if not isinstance(s, dict) or not isinstance(s.get("text"), str):
                    raise _missing(f"{p}.summary[{j}].text")
                summary.append({"type": "summary_text", "text": s["text"]})
            item = {"id": _item_id(it, "reasoning"), "type": "reasoning", "summary": summary}
            if isinstance(it.get("encrypted_content"), str):
                item["encrypted_content"] = it["encrypted_content"]
            if isinstance(it.get("content"), list):
                item["content"] = it["content"]
            items.append(item)
        elif t in hosted.INPUT_TYPES:
            items.append(hosted.input_item(it, t, p))
        elif t == "compaction":
            blob = _need_str(it, "encrypted_content", p)
            if summary_tokens(blob) <= 0 or len(blob) > MAX_BLOB_CHARS:  # (expanded lazily)
                raise E.invalid_encrypted_content.at(f"{p}.encrypted_content")
            items.append({"id": _item_id(it, t), "type": t, "encrypted_content": blob})
        else:  # item_reference
            rid = _need_str(it, "id", p)
            refs.append(rid)
            items.append({"type": "item_reference", "id": rid})
    return items, refs


# ------------------------------------------------------------------------------------------
# Tools, tool_choice, text
# ------------------------------------------------------------------------------------------

def _typed(obj: Any, p: str, allowed: tuple[str, ...]) -> str:
    """``obj['type']`` of an object at ``p``, or the 400 naming what is wrong."""
    if not isinstance(obj, dict):
        raise E.invalid_type.at(p, expected="an object")
    t = obj.get("type")
    if t is None:
        raise _missing(f"{p}.type")
    if t not in allowed:
        raise _bad_value(f"{p}.type", t, allowed)
    return t


def _tools(raw: list[Any], work: sch.Work) -> list[dict[str, Any]]:
    out = []
    names: set[str] = set()
    for i, t in enumerate(raw):
        p = f"tools[{i}]"
        tt = _typed(t, p, tuple(TOOL_TYPES))
        for req in TOOL_TYPES[tt]:
            if t.get(req) is None:
                raise _missing(f"{p}.{req}")
        tool = dict(t)
        if tt in ("function", "custom"):
            name = _need_str(t, "name", p)
            if not FUNCTION_NAME.match(name):
                raise E.name_pattern.at(f"{p}.name")
            if name in names:
                raise E.duplicate_tool_name.at(f"{p}.name", name=name)
            names.add(name)
        if tt == "function":
            params = t.get("parameters")
            if params is not None and not isinstance(params, dict):
                raise E.invalid_type.at(f"{p}.parameters", expected="an object")
            if params is not None:
                sch.check(params, param=f"{p}.parameters", label=f"function '{name}'",
                          code="invalid_function_parameters", work=work)
            # the real API echoes every field; strict defaults to true in the Responses API
            tool = {"type": "function", "name": t["name"],
                    "description": t.get("description"), "parameters": params,
                    "strict": t.get("strict", True)}
        elif tt == "mcp" and t.get("server_url") is None and t.get("connector_id") is None:
            raise E.one_of_required.at(p, fields="'server_url' or 'connector_id'")
        out.append(tool)
    hosted.check_tools(out)
    return out


def _tool_choice(tc: Any, tools: list[dict[str, Any]]) -> Any:
    if tc is None:
        return "auto"
    names = {t["name"] for t in tools if t["type"] in CALLABLE_TOOLS}
    if isinstance(tc, str):
        if tc not in ("none", "auto", "required"):
            raise _bad_value("tool_choice", tc, ("none", "auto", "required"))
        if tc == "required" and not tools:
            raise E.tool_choice_required_without_tools.at("tool_choice")
        return tc
    if not isinstance(tc, dict):
        raise E.invalid_type.at("tool_choice", expected="one of a string or an object")
    t = tc.get("type")
    if t is None:
        raise _missing("tool_choice.type")
    if t in ("function", "custom"):
        name = _need_str(tc, "name", "tool_choice")
        if name not in names:
            raise E.tool_choice_not_in_tools.at("tool_choice", name=t)
        return {"type": t, "name": name}
    if t == "allowed_tools":
        mode = tc.get("mode")
        if mode not in ("auto", "required"):
            raise _bad_value("tool_choice.mode", mode, ("auto", "required"))
        allowed = tc.get("tools")
        if not isinstance(allowed, list) or not allowed:
            raise _missing("tool_choice.tools")
        for i, a in enumerate(allowed):  # tool definitions: a callable one is named
            if _typed(a, f"tool_choice.tools[{i}]", tuple(TOOL_TYPES)) in CALLABLE_TOOLS:
                _need_str(a, "name", f"tool_choice.tools[{i}]")
        return {"type": t, "mode": mode, "tools": allowed}
    if t == "mcp":
        _need_str(tc, "server_label", "tool_choice")
        return dict(tc)
    hosted = ("file_search", "web_search_preview", "computer", "computer_use_preview",
              "computer_use", "web_search_preview_2025_03_11", "image_generation",
              "code_interpreter", "apply_patch", "shell", "programmatic_tool_calling")
    if t in ("web_search", "web_search_2025_08_26"):
        # (Open Responses' WebSearchToolChoice; the SDK's Response.tool_choice knows the
        # family only as web_search_preview: echoed so)
        return {"type": "web_search_preview"}
    if t not in hosted:
        raise _bad_value("tool_choice.type", t, ("function", "custom", "allowed_tools", "mcp")
                         + hosted)
    return {"type": t}


def _text(v: V, work: sch.Work) -> tuple[dict[str, Any], str]:
    text = v.dict("text")
    if text is None:
        return {"type": "text"}, "medium"
    tv = V(text, "text.")
    verbosity = tv.str("verbosity", "medium", choices=("low", "medium", "high")) or "medium"
    fmt = tv.dict("format")
    if fmt is None:
        return {"type": "text"}, verbosity
    ft = fmt.get("type")
    if ft is None:
        raise _missing("text.format.type")
    if ft not in ("text", "json_object", "json_schema"):
        raise _bad_value("text.format.type", ft, ("text", "json_schema", "json_object"))
    if ft != "json_schema":
        return {"type": ft}, verbosity
    name = _need_str(fmt, "name", "text.format")
    if not FUNCTION_NAME.match(name):
        raise E.name_pattern.at("text.format.name")
    schema = fmt.get("schema")
    if schema is None:
        raise _missing("text.format.schema")
    if not isinstance(schema, dict):
        raise E.invalid_type.at("text.format.schema", expected="an object")
    sch.check(schema, param="text.format.schema", label=f"response_format '{name}'",
              code="invalid_json_schema", work=work)
    strict = fmt.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise E.invalid_type.at("text.format.strict", expected="a boolean")
    return {"type": "json_schema", "name": name, "schema": schema,
            "description": fmt.get("description"), "strict": strict}, verbosity


# ------------------------------------------------------------------------------------------
# The body
# ------------------------------------------------------------------------------------------

def parse_body(body: dict[str, Any], app: Services, *, transport: str = "http",
               count_only: bool = False) -> RespRequest:
    """Validate a ``POST /v1/responses`` body (or an ``input_tokens`` body: ``count_only``)."""
    for key in body:
        if key not in KNOWN_FIELDS and not (transport == "ws" and key == "generate"):
            raise E.unknown_parameter.at(key)
    v = V(body)
    if count_only and body.get("model") is None:
        profile = app.registry.get("gpt-4o") or app.model("gpt-4o")
        model = profile.id
    else:
        profile = app.model(body.get("model"))
        model = body["model"]
    raw_input = body.get("input")
    if raw_input is None:
        if not count_only and body.get("previous_response_id") is None \
                and body.get("conversation") is None and body.get("prompt") is None:
            raise _missing("input")
        items: list[Any] = []
        refs: list[Any] = []
    else:
        if isinstance(raw_input, list):  # (each item costs work: bounded in number)
            v.list("input", max_len=app.config.max_input_items)
        items, refs = normalize_input(raw_input)
    instructions = v.str("instructions")
    stream = bool(v.bool("stream", False))
    background = bool(v.bool("background", False))
    store = v.bool("store", True)
    prev = v.str("previous_response_id")
    conv = body.get("conversation")
    conv_id: str | None = None
    if conv is not None:
        if isinstance(conv, str):
            conv_id = conv
        elif isinstance(conv, dict) and isinstance(conv.get("id"), str):
            conv_id = conv["id"]
        else:
            raise E.invalid_type.at("conversation", expected="a string or an object with an "
                                    "'id'")
        if prev is not None:
            raise E.mutually_exclusive.at("conversation", names="'previous_response_id' or "
                                          "'conversation'")
    limit = v.int("max_output_tokens", None)
    if limit is not None:
        if limit < 16:
            raise E.integer_below_min.at("max_output_tokens", lo=16, value=limit)
        if limit > profile.max_output_tokens:
            raise E.limit_too_large.at("max_output_tokens", limit=limit,
                                       max=profile.max_output_tokens, unit="output")
    max_tool_calls = v.int("max_tool_calls", None, lo=1)
    schema_work = sch.Work()  # the request's schemas share one bound (llmsim.sim.schema)
    tools = _tools(v.list("tools", [], max_len=hosted.MAX_TOOLS) or [], schema_work)
    tool_choice = _tool_choice(body.get("tool_choice"), tools)
    parallel = v.bool("parallel_tool_calls", True)
    text_format, verbosity = _text(v, schema_work)
    metadata = v.metadata() or {}
    temperature = v.num("temperature", None, lo=0, hi=2)
    top_p = v.num("top_p", None, lo=0, hi=1)
    presence = v.num("presence_penalty", None, lo=-2, hi=2)
    frequency = v.num("frequency_penalty", None, lo=-2, hi=2)
    top_logprobs = v.int("top_logprobs", None, lo=0, hi=20)
    include = v.list("include", []) or []
    for i, inc in enumerate(include):
        if inc not in INCLUDABLE:
            raise _bad_value(f"include[{i}]", inc, INCLUDABLE)
    truncation = v.str("truncation", "disabled", choices=("auto", "disabled")) or "disabled"
    service_tier = v.str("service_tier", "auto",
                         choices=("auto", "default", "flex", "scale", "priority")) or "auto"
    user = v.str("user")
    safety_identifier = v.str("safety_identifier", max_len=64)
    prompt_cache_key = v.str("prompt_cache_key")
    retention = v.str("prompt_cache_retention", None, choices=("in_memory", "24h"))
    compact_threshold = _context_management(v, profile)
    so = v.dict("stream_options")
    if so is not None and not stream and transport != "ws":
        raise E.stream_options_without_stream.at("stream_options")
    v.dict("prompt")
    generate = True
    if transport == "ws":
        g = body.get("generate", True)
        if not isinstance(g, bool):
            raise E.invalid_type.at("generate", expected="a boolean")
        generate = g
    # reasoning
    reasoning = v.dict("reasoning")
    effort: str | None = None
    summary: str | None = None
    if profile.reasoning:
        effort = profile.default_effort
        if temperature is not None and temperature != 1:
            raise unsupported("temperature", model)
        if top_p is not None and top_p != 1:
            raise unsupported("top_p", model)
    if reasoning is not None:
        rv = V(reasoning, "reasoning.")
        e = rv.str("effort", None, choices=("none", "minimal", "low", "medium", "high", "xhigh"))
        summary = rv.str("summary", None, choices=("auto", "concise", "detailed"))
        gs = rv.str("generate_summary", None, choices=("auto", "concise", "detailed"))
        summary = summary or gs
        if not profile.reasoning and (e is not None or summary is not None):
            raise unsupported("reasoning.effort" if e is not None else "reasoning.summary",
                              model)
        if e is not None:
            if e not in profile.efforts:
                raise E.unsupported_value_for_model.at("reasoning.effort", value=e, model=model,
                                                       allowed=quoted(profile.efforts))
            effort = e
    if top_logprobs and profile.reasoning:
        raise unsupported("top_logprobs", model)
    if not store and background:
        raise E.background_needs_store_true.at("background")
    if transport == "ws" and background:
        raise E.background_over_websocket.at("background")
    if text_format["type"] == "json_object" and not count_only:
        words = " ".join(_texts(items)) + " " + (instructions or "")
        if "json" not in words.lower() and prev is None and conv_id is None:
            raise E.json_word_required_input.at("text")
    return RespRequest(
        body=body, profile=profile, model=model, input_items=items, raw_refs=refs,
        instructions=instructions, stream=stream or transport == "ws", background=background,
        store=bool(store), previous_response_id=prev, conversation=conv_id, limit=limit,
        max_tool_calls=max_tool_calls, tools=tools, tool_choice=tool_choice,
        parallel_tool_calls=bool(parallel), text_format=text_format, verbosity=verbosity,
        effort=effort, summary=summary, include=list(include),
        metadata=metadata, temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p, top_logprobs=top_logprobs or 0,
        presence_penalty=presence or 0.0, frequency_penalty=frequency or 0.0,
        truncation=truncation, service_tier=service_tier, user=user,
        safety_identifier=safety_identifier, prompt_cache_key=prompt_cache_key,
        prompt_cache_retention=retention, compact_threshold=compact_threshold,
        generate=generate)


def _context_management(v: V, profile: ModelProfile) -> int | None:
    """``context_management``: the compaction threshold in input tokens (None: never
    compact). A compaction entry without ``compact_threshold`` compacts past 80% of the
    model's context window."""
    entries = v.list("context_management", None, max_len=MAX_CONTEXT_MANAGEMENT)
    threshold = None
    for i, e in enumerate(entries or ()):
        p = f"context_management[{i}]"
        if _typed(e, p, ("compaction",)) == "compaction":
            t = e.get("compact_threshold")
            if t is None:
                t = profile.context_window * 4 // 5
            elif type(t) is not int:
                raise E.invalid_type.at(f"{p}.compact_threshold", expected="an integer")
            elif not 1000 <= t <= profile.context_window:
                raise E.out_of_range.at(f"{p}.compact_threshold", lo=1000,
                                        hi=profile.context_window, value=t)
            threshold = t if threshold is None else min(threshold, t)
    return threshold


def _texts(items: list[dict[str, Any]]) -> list[str]:
    out = []
    for it in items:
        if it.get("type") == "message":
            for part in it["content"]:
                if "text" in part:
                    out.append(part["text"])
    return out


# ------------------------------------------------------------------------------------------
# The request as the decision sees it
# ------------------------------------------------------------------------------------------

TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output", "computer_call_output",
                "shell_call_output", "local_shell_call_output", "apply_patch_call_output",
                "mcp_approval_response")  # (an approved MCP call runs first: hosted.py)


def _prompt_texts(instructions: str | None, context: list[dict[str, Any]]) -> list[str]:
    """The instruction and user texts (the JSON a json_object answer follows is described
    there)."""
    out = [instructions] if instructions else []
    out.extend(content_text(it.get("content"))[0] for it in context
               if it.get("type") == "message"
               and it.get("role") in ("system", "developer", "user"))
    return out


def _last_user_text(context: list[dict[str, Any]]) -> str:
    for it in reversed(context):
        if it.get("type") == "message" and it.get("role") == "user":
            return content_text(it.get("content"))[0]
    return ""


def _allowed_name(a: dict[str, Any]) -> str | None:
    t = a.get("type")
    if t in CALLABLE_TOOLS:
        return a.get("name")
    if t == "mcp":
        return f"mcp:{a.get('server_label')}"
    return hosted.FAMILY.get(t or "")


def _decide_tool_choice(tc: Any, tools: list[dict[str, Any]]) -> ToolChoice:
    if isinstance(tc, str):
        return TOOL_CHOICES[tc]  # "auto" | "none" | "required"
    t = tc["type"]
    if t in CALLABLE_TOOLS:
        return ToolChoice("named", frozenset((tc["name"],)))
    if t == "allowed_tools":
        return ToolChoice(tc["mode"], frozenset(n for a in tc["tools"] if isinstance(a, dict)
                                                for n in (_allowed_name(a),) if n))
    # a hosted tool is forced: the decision calls it (none of that type: no call)
    return hosted.forced(tc, tools) or ToolChoice("hosted")


def ask(rr: RespRequest, context: list[dict[str, Any]], input_tokens: int,
        cached_tokens: int, json_hint: bool = False) -> Ask:
    """The request as :func:`llmsim.sim.decide.decide` needs it (``context`` = earlier turns
    plus this input, resolved)."""
    tools: list[Tool] = hosted.decide_tools(rr.tools)
    for i, t in enumerate(rr.tools):  # (usually none)
        kind = t["type"]
        desc = t.get("description")
        desc = desc if isinstance(desc, str) else ""
        if kind == "function":
            tools.append(Tool(t["name"], kind, t["parameters"], None, t["strict"] is True,
                              f"tools[{i}].parameters", desc))
        elif kind == "custom":
            tools.append(Tool(t["name"], kind, None, t.get("format"), description=desc))
    fmt = rr.text_format
    output = TEXT
    if fmt["type"] == "json_schema":
        output = Output("json_schema", fmt["schema"], "text.format.schema")
    elif fmt["type"] == "json_object":
        output = Output("json_object")
    return Ask(rr.profile, input_tokens, cached_tokens,
               user_text=lambda: _last_user_text(context),
               prompt_texts=lambda: _prompt_texts(rr.instructions, context),
               json_hint=json_hint,
               after_tool_result=bool(context) and context[-1].get("type") in TOOL_OUTPUTS,
               tools=tuple(tools) if tools else (),
               tool_choice=_decide_tool_choice(rr.tool_choice, rr.tools),
               parallel_tool_calls=rr.parallel_tool_calls, max_tool_calls=rr.max_tool_calls,
               output=output, limit=rr.limit, effort=rr.effort, summary=rr.summary,
               encrypted=rr.encrypted, logprobs="message.output_text.logprobs" in rr.include,
               top_logprobs=rr.top_logprobs)
