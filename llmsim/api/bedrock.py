"""Amazon Bedrock Runtime (what boto3's ``bedrock-runtime`` client calls), families on the
request pipeline (:mod:`llmsim.api.pipeline`):

- ``POST /model/{modelId}/converse`` and ``/converse-stream`` (the Converse API: one
  message shape for every model; the stream in the AWS event-stream framing);
- ``POST /model/{modelId}/invoke`` and ``/invoke-with-response-stream`` for Anthropic-on-
  Bedrock bodies (``anthropic_version: "bedrock-2023-05-31"``, the Messages API without
  ``model``), parsed and rendered by the Anthropic family (:mod:`llmsim.api.anthropic`), and
  for Amazon Nova bodies (``schemaVersion: "messages-v1"``: Converse's shapes).

The event stream (``application/vnd.amazon.eventstream``): each message is
``total length | headers length | prelude CRC32 | headers | JSON payload | message CRC32``
(big-endian, CRCs by :func:`zlib.crc32`), headers ``:event-type``, ``:content-type`` and
``:message-type`` (``event``, or ``exception`` with ``:exception-type`` for a failure
mid-stream). Converse streams ``messageStart``, ``contentBlockStart`` (tool use),
``contentBlockDelta`` (text, ``toolUse.input`` pieces, ``reasoningContent``),
``contentBlockStop``, ``messageStop`` and ``metadata`` (usage and ``latencyMs``); an invoke
stream sends ``chunk`` events whose ``bytes`` are the base64 of Anthropic's stream events,
the last with ``amazon-bedrock-invocationMetrics``.

Model ids: an ARN's last segment, a cross-region prefix (``us.``, ``eu.``, …), the vendor
(``anthropic.``) and the version suffix (``-v1:0``) are removed to find the profile
(``us.anthropic.claude-haiku-4-5-20251001-v1:0`` → ``claude-haiku-4-5``); the id as sent is
the model the generic hooks see. Authorization: a SigV4 header is accepted (its access key id
is the key ``--api-key`` checks), its signature verified against ``--aws-keys`` when given;
a Bedrock API key (``Authorization: Bearer``) works as any key. Errors: the status and ``x-amzn-errortype`` of Bedrock's
exceptions (``ValidationException``, ``AccessDeniedException``,
``ResourceNotFoundException``, ``ThrottlingException``, ``ModelTimeoutException``,
``InternalServerException``, ``ServiceUnavailableException``) with ``{"message": ...}``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import struct
import zlib
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import orjson

from ..errors import APIError, E
from ..messages import RawResponse, Request, Result
from ..routing import Route
from ..sim import schema as sch
from ..sim.decide import AUTO, TEXT, TOOL_CHOICES, Ask, Decision, Tool, ToolChoice
from ..sim.prompt import IMAGE_TOKENS, chat_prompt_steps
from ..streaming.dialect import Dialect
from ..streaming.stream import expand_runs
from . import anthropic as anth
from .pipeline import Family, Meta, Parsed, Plan
from .pipeline import register as serve
from .validate import check_request_work, paced

if TYPE_CHECKING:
    from .services import Host, Services

__all__ = ["register", "bedrock_error", "frame", "resigned", "aws_secrets", "CONVERSE_STREAM",
           "INVOKE_STREAM"]

_dumps = orjson.dumps
ANTHROPIC_VERSION = "bedrock-2023-05-31"
MAX_MESSAGES = 10_000
MAX_BLOCKS = 10_000  # content blocks per message
MAX_TOOLS = 512
MAX_STOPS = 4
DOC_TOKENS = 256  # a document or video block
_EXC = {400: "ValidationException", 401: "AccessDeniedException", 403: "AccessDeniedException",
        404: "ResourceNotFoundException", 408: "ModelTimeoutException",
        409: "ConflictException", 413: "ValidationException", 424: "ModelErrorException",
        429: "ThrottlingException", 500: "InternalServerException",
        502: "ServiceUnavailableException", 503: "ServiceUnavailableException",
        504: "ModelTimeoutException", 529: "ServiceUnavailableException"}
_STATUS = {"AccessDeniedException": 403, "ServiceUnavailableException": 503,
           "ModelTimeoutException": 408}
_PREFIX = re.compile(r"^(?:(?:us|eu|apac|global|us-gov|jp|au|ca)\.)?"
                     r"(?:(?:anthropic|amazon|meta|mistral|cohere|ai21|deepseek|openai|qwen|"
                     r"writer|twelvelabs|stability)\.)?")
_SUFFIX = re.compile(r"(?:-v\d+(?::\d+)?|:\d+)$")
STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
        "content_filter": "content_filtered"}
CONVERSE_FIELDS = frozenset((
    "messages", "system", "inferenceConfig", "toolConfig", "guardrailConfig",
    "additionalModelRequestFields", "additionalModelResponseFieldPaths", "promptVariables",
    "requestMetadata", "performanceConfig", "modelId"))


# ------------------------------------------------------------------------------------------
# Errors and the event-stream framing
# ------------------------------------------------------------------------------------------

def _exception(err: APIError) -> tuple[int, str]:
    if err.code is not None and err.code.endswith("Exception"):  # (a SigV4 refusal)
        return err.status, err.code
    name = "ResourceNotFoundException" if err.code == "model_not_found" else \
        _EXC.get(err.status, "InternalServerException" if err.status >= 500
                 else "ValidationException")
    return _STATUS.get(name, 404 if err.code == "model_not_found" else err.status), name


def bedrock_error(err: APIError) -> RawResponse:
    """Bedrock's error: the exception's status, ``x-amzn-errortype`` and ``{"message"}``."""
    status, name = _exception(err)
    headers = [*(err.headers or ()), ("x-amzn-errortype", f"{name}:http://internal.amazon.com/"
                                                          "coral/com.amazon.bedrock/")]
    return RawResponse(_dumps({"message": err.message}), status, "application/json", headers,
                       error=err)


def frame(headers: list[tuple[str, str]], payload: bytes) -> bytes:
    """One event-stream message: the prelude (lengths and their CRC), string headers
    (type 7), the payload and the CRC of everything before it."""
    hb = b"".join(bytes((len(k),)) + k.encode() + b"\x07" + struct.pack(">H", len(v.encode()))
                  + v.encode() for k, v in headers)
    prelude = struct.pack(">II", 16 + len(hb) + len(payload), len(hb))
    head = prelude + struct.pack(">I", zlib.crc32(prelude)) + hb + payload
    return head + struct.pack(">I", zlib.crc32(head))


def _event(etype: str, payload: bytes) -> bytes:
    return frame([(":event-type", etype), (":content-type", "application/json"),
                  (":message-type", "event")], payload)


def _exception_frame(err: APIError) -> bytes:
    name = _exception(err)[1]
    if name == "InternalServerException" and err.status >= 500:
        name = "ModelStreamErrorException"
    etype = name[0].lower() + name[1:]
    return frame([(":exception-type", etype), (":content-type", "application/json"),
                  (":message-type", "exception")], _dumps({"message": err.message}))


def _converse_frame(etype: str, data: Any) -> bytes:
    if etype == "exception":  # a failure mid-stream (a fault): the exception message
        return _exception_frame(data)
    return _event(etype, data if type(data) is bytes else _dumps(data))


def _invoke_frame(etype: str, data: Any) -> bytes:
    if etype == "exception":
        return _exception_frame(data)
    raw = data if type(data) is bytes else _dumps(data)
    return _event("chunk", b'{"bytes":"' + base64.b64encode(raw) + b'"}')


NOVA_SCHEMA = "messages-v1"
NOVA_FIELDS = frozenset(("schemaVersion", "messages", "system", "inferenceConfig",
                         "toolConfig"))
_STREAM_HEADERS = b"content-type: application/vnd.amazon.eventstream\r\n"
CONVERSE_STREAM = Dialect("bedrock.converse", numbered=False, sse=_converse_frame,
                          sse_error=lambda err, seq: _exception_frame(err),
                          error_events=lambda err: [("exception", err)],
                          token_types=frozenset({"contentBlockDelta"}),
                          terminals=frozenset({"metadata", "exception"}),
                          stream_headers=_STREAM_HEADERS)
INVOKE_STREAM = Dialect("bedrock.invoke", numbered=False, sse=_invoke_frame,
                        sse_error=lambda err, seq: _exception_frame(err),
                        error_events=lambda err: [("exception", err)],
                        token_types=frozenset({"content_block_delta"}),
                        # (the Anthropic plan's text deltas: its token template)
                        token_type="content_block_delta", token_json=anth.token_json,
                        terminals=frozenset({"message_stop", "exception"}),
                        stream_headers=_STREAM_HEADERS)
NOVA_STREAM = Dialect("bedrock.invoke", numbered=False, sse=_invoke_frame,
                      sse_error=lambda err, seq: _exception_frame(err),
                      error_events=lambda err: [("exception", err)],
                      token_types=frozenset({"contentBlockDelta"}),
                      terminals=frozenset({"metadata", "exception"}),
                      stream_headers=_STREAM_HEADERS)


# ------------------------------------------------------------------------------------------
# Parsing
# ------------------------------------------------------------------------------------------

def _bad(where: str, what: str) -> APIError:
    return E.bedrock_invalid.at(where, what=what)


def profile_name(model_id: str) -> str:
    """The registry id of a Bedrock model id or ARN (see the module doc)."""
    name = model_id.rsplit("/", 1)[-1]
    return _SUFFIX.sub("", _PREFIX.sub("", name, count=1), count=1) or name


def _model(req: Request) -> str:
    m = req.params.get("model", "")
    if not m or len(m) > 2048:
        raise _bad("modelId", "a model id of 1 to 2048 characters is required")
    return m


def _block_text(b: dict[str, Any], where: str) -> tuple[str, int, bool]:
    """A content block's text as the prompt counts it, its fixed tokens, and whether it is a
    tool result."""
    if "text" in b:
        if not isinstance(b["text"], str):
            raise _bad(f"{where}.text", "must be a string")
        return b["text"], 0, False
    if "image" in b:
        return "", IMAGE_TOKENS, False
    if "document" in b or "video" in b:
        return "", DOC_TOKENS, False
    if "toolUse" in b:
        tu = b["toolUse"]
        if not isinstance(tu, dict) or not isinstance(tu.get("name"), str):
            raise _bad(f"{where}.toolUse", "toolUseId, name and input are required")
        return tu["name"] + _dumps(tu.get("input")).decode(), 0, False
    if "toolResult" in b:
        tr = b["toolResult"]
        if not isinstance(tr, dict) or not isinstance(tr.get("content"), list):
            raise _bad(f"{where}.toolResult", "toolUseId and content are required")
        parts = []
        for c in tr["content"][:MAX_BLOCKS]:
            if isinstance(c, dict):
                parts.append(c["text"] if isinstance(c.get("text"), str) else
                             _dumps(c.get("json")).decode())
        return "\n".join(parts), 0, True
    if "reasoningContent" in b or "cachePoint" in b or "guardContent" in b:
        return "", 0, False
    raise _bad(where, "a content block (text, image, document, video, toolUse, toolResult, "
               "reasoningContent, cachePoint, guardContent) is required")


def _tool_config(raw: Any, work: sch.Work) -> tuple[list[Tool], ToolChoice, list[Any]]:
    if raw is None:
        return [], AUTO, []
    if not isinstance(raw, dict) or not isinstance(raw.get("tools"), list) \
            or not 0 < len(raw["tools"]) <= MAX_TOOLS:
        raise _bad("toolConfig.tools", f"a list of 1 to {MAX_TOOLS} tools")
    tools: list[Tool] = []
    decls: list[Any] = []
    for i, t in enumerate(raw["tools"]):
        where = f"toolConfig.tools.{i}.toolSpec"
        if isinstance(t, dict) and "cachePoint" in t:
            continue
        spec = t.get("toolSpec") if isinstance(t, dict) else None
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) \
                or not re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", spec["name"]):
            raise _bad(f"{where}.name", "a name of 1 to 64 letters, digits, _ or -")
        schema = spec.get("inputSchema")
        js = schema.get("json") if isinstance(schema, dict) else None
        if not isinstance(js, dict):
            raise _bad(f"{where}.inputSchema.json", "a JSON Schema object is required")
        sch.check(js, param=f"{where}.inputSchema.json", label=f"tool '{spec['name']}'",
                  code="validation_error", work=work)
        desc = spec.get("description")
        tools.append(Tool(spec["name"], "function", js, None, False,
                          f"{where}.inputSchema.json", desc if isinstance(desc, str) else ""))
        decls.append({"name": spec["name"], "description": desc, "parameters": js})
    tc = raw.get("toolChoice")
    choice = AUTO
    if tc is not None:
        if not isinstance(tc, dict) or len(tc) != 1:
            raise _bad("toolConfig.toolChoice", "one of auto, any or tool")
        kind, val = next(iter(tc.items()))
        if kind == "any":
            choice = TOOL_CHOICES["required"]
        elif kind == "tool":
            name = val.get("name") if isinstance(val, dict) else None
            if name not in {t.name for t in tools}:
                raise _bad("toolConfig.toolChoice.tool.name", "names no tool in toolConfig")
            choice = ToolChoice("named", frozenset((name,)))
        elif kind != "auto":
            raise _bad("toolConfig.toolChoice", "one of auto, any or tool")
    return tools, choice, decls


def _thinking(extra: Any, limit: int | None) -> str | None:
    """``additionalModelRequestFields.thinking`` (Claude's extended thinking) as an effort."""
    if extra is None:
        return None
    if not isinstance(extra, dict):
        raise _bad("additionalModelRequestFields", "must be an object")
    th = extra.get("thinking", extra.get("reasoning_config"))
    if not isinstance(th, dict) or th.get("type") != "enabled":
        return None
    budget = th.get("budget_tokens")
    if type(budget) is not int or budget < anth.MIN_THINKING_BUDGET:
        raise _bad("additionalModelRequestFields.thinking.budget_tokens",
                   f"an integer of at least {anth.MIN_THINKING_BUDGET}")
    if limit is not None and budget >= limit:
        raise _bad("additionalModelRequestFields.thinking.budget_tokens",
                   "must be less than inferenceConfig.maxTokens")
    share = budget / limit if limit else 0.5
    return "high" if share >= 0.75 else "medium" if share >= 0.5 else "low"


async def _parse_converse(req: Request, app: Services, stream: bool,
                          body: dict[str, Any] | None = None) -> Parsed:
    body = req.json_object() if body is None else body
    for k in body:
        if k not in CONVERSE_FIELDS:
            raise _bad(k, "unknown field")
    model_id = _model(req)
    profile = app.model(profile_name(model_id), param="modelId")
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs or len(msgs) > MAX_MESSAGES:
        raise _bad("messages", f"a list of 1 to {MAX_MESSAGES} messages")
    chat_like: list[dict[str, Any]] = []
    system = body.get("system")
    if system is not None:
        if not isinstance(system, list) or len(system) > MAX_BLOCKS:
            raise _bad("system", "a list of system content blocks")
        texts = [_block_text(b, f"system.{i}")[0] if isinstance(b, dict) else ""
                 for i, b in enumerate(system)]
        chat_like.append({"role": "system", "content": "\n".join(texts)})
    extra = 0
    last_user = ""
    after_tool = False
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise _bad(f"messages.{i}.role", "must be user or assistant")
        content = m.get("content")
        if not isinstance(content, list) or not content or len(content) > MAX_BLOCKS:
            raise _bad(f"messages.{i}.content", f"a list of 1 to {MAX_BLOCKS} content blocks")
        texts = []
        tool_result = False
        for j, b in enumerate(content):
            if not isinstance(b, dict):
                raise _bad(f"messages.{i}.content.{j}", "a content block object")
            t, fixed, tr = _block_text(b, f"messages.{i}.content.{j}")
            texts.append(t)
            extra += fixed
            tool_result = tool_result or tr
        chat_like.append({"role": m["role"], "content": "\n".join(texts)})
        if m["role"] == "user":
            plain = [b["text"] for b in content if isinstance(b.get("text"), str)]
            last_user = "\n".join(plain) or last_user
            after_tool = tool_result
        else:
            after_tool = False
    ic = body.get("inferenceConfig") or {}
    if not isinstance(ic, dict):
        raise _bad("inferenceConfig", "must be an object")
    limit = ic.get("maxTokens")
    if limit is not None and (type(limit) is not int
                              or not 1 <= limit <= profile.max_output_tokens):
        raise _bad("inferenceConfig.maxTokens",
                   f"an integer between 1 and {profile.max_output_tokens}")
    for name, hi in (("temperature", 1.0), ("topP", 1.0)):
        v = ic.get(name)
        if v is not None and (type(v) not in (int, float) or not 0 <= v <= hi):
            raise _bad(f"inferenceConfig.{name}", f"a number between 0 and {hi}")
    stops = ic.get("stopSequences") or []
    if not isinstance(stops, list) or len(stops) > MAX_STOPS \
            or not all(isinstance(s, str) and s for s in stops):
        raise _bad("inferenceConfig.stopSequences", f"at most {MAX_STOPS} non-empty strings")
    work = sch.Work()
    tools, choice, decls = _tool_config(body.get("toolConfig"), work)
    effort = _thinking(body.get("additionalModelRequestFields"), limit)
    if effort is not None:
        profile = replace(profile, reasoning=True, efforts=("low", "medium", "high"))
    cw = profile.context_window
    prompt = await paced(chat_prompt_steps(chat_like, decls or None, profile.encoding,
                                           cap=cw)) + extra
    if prompt > cw:
        raise _bad("messages", f"the input ({prompt} tokens) is longer than the model's "
                   f"context window ({cw} tokens)")
    check_request_work(1, limit or app.config.output_tokens_max, 0,
                       param="inferenceConfig.maxTokens")
    texts_all = [m["content"] for m in chat_like if m["role"] != "assistant"]
    ask = Ask(profile, prompt, user_text=lambda: last_user, prompt_texts=lambda: texts_all,
              after_tool_result=after_tool, tools=tuple(tools), tool_choice=choice,
              output=TEXT, limit=limit, stops=tuple(stops), effort=effort,
              summary="detailed" if effort else None, encrypted=effort is not None)
    return Parsed(ask, model_id, stream, body)


# ------------------------------------------------------------------------------------------
# Converse rendering
# ------------------------------------------------------------------------------------------

def _stop(c: Any) -> str:
    if c.stop_sequence is not None:
        return "stop_sequence"
    if c.calls and c.finish == "stop":
        return "tool_use"
    return STOP.get(c.finish, "end_turn")


def _usage(d: Decision) -> dict[str, Any]:
    u = d.usage
    return {"inputTokens": u.prompt_tokens, "outputTokens": u.output_tokens,
            "totalTokens": u.prompt_tokens + u.output_tokens}


def _args(call: Any) -> dict[str, Any]:
    try:
        a = orjson.loads(call.arguments) if call.complete else {}
    except orjson.JSONDecodeError:
        a = {}
    return a if isinstance(a, dict) else {}


def _tool_id(call: Any) -> str:
    return call.call_id.replace("call_", "tooluse_", 1)


def _latency_ms(d: Decision, steps: int) -> int:
    return round(d.timing.duration(steps) * 1000)


class Converse(Family):
    endpoint = "bedrock.converse"
    seed_path = "/model/converse"
    dialect = CONVERSE_STREAM
    errors = staticmethod(bedrock_error)

    def __init__(self, stream: bool) -> None:
        self.stream = stream

    async def parse(self, req: Request, app: Services) -> Parsed:
        return await _parse_converse(req, app, self.stream)

    def render(self, p: Parsed, d: Decision, meta: Meta) -> Any:
        return {**converse_output(d), "metrics": {"latencyMs": _latency_ms(d, self.steps(d))}}

    def plan(self, p: Parsed, d: Decision, meta: Meta) -> Plan:
        return converse_plan(d, self.steps(d))


def converse_output(d: Decision) -> dict[str, Any]:
    """Converse's answer without its metrics (also Nova's InvokeModel answer)."""
    c = d.choices[0]
    content: list[dict[str, Any]] = []
    r = c.reasoning
    if r is not None:
        content.append({"reasoningContent": {"reasoningText": {
            "text": "".join("".join(s) for s in r.summary),
            "signature": r.encrypted or ""}}})
    if c.pieces is not None and (c.pieces or not c.calls):
        content.append({"text": "".join(c.pieces)})
    for call in c.calls:
        content.append({"toolUse": {"toolUseId": _tool_id(call), "name": call.name,
                                    "input": _args(call)}})
    return {"output": {"message": {"role": "assistant", "content": content}},
            "stopReason": _stop(c), "usage": _usage(d)}


def converse_plan(d: Decision, steps: int) -> Plan:
    """Converse's stream events (also Nova's InvokeModel stream, each wrapped in a chunk)."""
    c = d.choices[0]
    gaps = d.timing.gaps(1 << 30)
    yield d.timing.first, "messageStart", {"role": "assistant"}
    due = True
    idx = 0
    r = c.reasoning
    if r is not None:
        for part in r.summary:
            for piece in part:
                yield (0.0 if due else next(gaps, 0.0)), "contentBlockDelta", {
                    "delta": {"reasoningContent": {"text": piece}},
                    "contentBlockIndex": idx}
                due = False
        yield 0.0, "contentBlockDelta", {"delta": {"reasoningContent": {
            "signature": r.encrypted or ""}}, "contentBlockIndex": idx}
        yield 0.0, "contentBlockStop", {"contentBlockIndex": idx}
        idx += 1
    if c.pieces is not None and (c.pieces or not c.calls):
        for piece in c.pieces:
            yield (0.0 if due else next(gaps, 0.0)), "contentBlockDelta", {
                "delta": {"text": piece}, "contentBlockIndex": idx}
            due = False
        yield 0.0, "contentBlockStop", {"contentBlockIndex": idx}
        idx += 1
    for call in c.calls:
        yield 0.0, "contentBlockStart", {"start": {"toolUse": {
            "toolUseId": _tool_id(call), "name": call.name}}, "contentBlockIndex": idx}
        for piece in call.pieces:
            yield (0.0 if due else next(gaps, 0.0)), "contentBlockDelta", {
                "delta": {"toolUse": {"input": piece}}, "contentBlockIndex": idx}
            due = False
        yield 0.0, "contentBlockStop", {"contentBlockIndex": idx}
        idx += 1
    yield 0.0, "messageStop", {"stopReason": _stop(c)}
    yield 0.0, "metadata", {"usage": _usage(d),
                            "metrics": {"latencyMs": _latency_ms(d, steps)}}


# ------------------------------------------------------------------------------------------
# InvokeModel: Anthropic bodies, rendered by the Anthropic family
# ------------------------------------------------------------------------------------------

class Invoke(Family):
    endpoint = "bedrock.invoke"
    seed_path = "/model/invoke"
    dialect = INVOKE_STREAM
    id_prefix = "msg_bdrk_"
    errors = staticmethod(bedrock_error)

    def __init__(self, stream: bool) -> None:
        self.stream = stream

    async def parse(self, req: Request, app: Services) -> Parsed:
        body = req.json_object()
        model_id = _model(req)
        name = profile_name(model_id)
        if body.get("schemaVersion") == NOVA_SCHEMA or (
                name.startswith("nova") and "anthropic_version" not in body):
            return await _parse_nova(req, app, body, self.stream)
        if "anthropic_version" not in body and "claude" not in name:
            raise _bad("body", "this simulator serves InvokeModel for Anthropic Claude bodies "
                       "(anthropic_version \"bedrock-2023-05-31\") and Amazon Nova bodies "
                       f"(schemaVersion \"{NOVA_SCHEMA}\"); use Converse for others")
        if body.get("anthropic_version") != ANTHROPIC_VERSION:
            raise _bad("anthropic_version", f'must be "{ANTHROPIC_VERSION}"')
        for k in ("model", "stream"):
            if k in body:
                raise _bad(k, f"extraneous key [{k}] is not permitted")
        inner = {k: v for k, v in body.items() if k not in ("anthropic_version",
                                                              "anthropic_beta")}
        inner["model"] = name
        ask, info = await anth._parse(req, app, inner)
        return Parsed(ask, model_id, self.stream, body, info=name)

    def render(self, p: Parsed, d: Decision, meta: Meta) -> Any:
        u = d.usage
        # (render runs before the pipeline builds the answer: its headers can still grow)
        p.headers.extend([("x-amzn-bedrock-input-token-count", str(u.prompt_tokens)),
                          ("x-amzn-bedrock-output-token-count", str(u.output_tokens)),
                          ("x-amzn-bedrock-invocation-latency",
                           str(_latency_ms(d, self.steps(d))))])
        if p.info is None:  # Nova
            return converse_output(d)
        return anth._message(meta.id, p.info, d)

    def plan(self, p: Parsed, d: Decision, meta: Meta) -> Plan:
        if p.info is None:  # Nova: Converse's events, each one a chunk's JSON
            for delay, etype, data in converse_plan(d, self.steps(d)):
                if etype == "metadata":
                    data = {"usage": data["usage"],
                            "amazon-bedrock-invocationMetrics": _invocation_metrics(
                                d, self.steps(d))}
                yield delay, etype, {etype: data}
            return
        for delay, etype, data in expand_runs(anth._plan(meta.id, p.info, d)):
            if etype == "ping":
                continue  # (Bedrock's stream has no pings)
            if etype == "message_stop":
                data = {**data, "amazon-bedrock-invocationMetrics": _invocation_metrics(
                    d, self.steps(d))}
            yield delay, etype, data

    def steps(self, d: Decision) -> int:
        return anth._steps(d)


def _invocation_metrics(d: Decision, steps: int) -> dict[str, int]:
    u = d.usage
    return {"inputTokenCount": u.prompt_tokens, "outputTokenCount": u.output_tokens,
            "invocationLatency": _latency_ms(d, steps),
            "firstByteLatency": round(d.timing.first * 1000)}


async def _parse_nova(req: Request, app: Services, body: dict[str, Any], stream: bool) -> Parsed:
    """An Amazon Nova InvokeModel body: Converse's messages, system and toolConfig, with
    ``inferenceConfig`` in Nova's snake_case (``max_new_tokens``, ``top_p``, ``top_k``)."""
    for k in body:
        if k not in NOVA_FIELDS:
            raise _bad(k, "extraneous key is not permitted")
    ic = body.get("inferenceConfig")
    if ic is not None and not isinstance(ic, dict):
        raise _bad("inferenceConfig", "must be an object")
    conv: dict[str, Any] = {k: body[k] for k in ("messages", "system", "toolConfig")
                            if k in body}
    if ic:
        top_k = ic.get("top_k")
        if top_k is not None and (type(top_k) is not int or not 0 <= top_k <= 128):
            raise _bad("inferenceConfig.top_k", "an integer between 0 and 128")
        renamed = {"max_new_tokens": "maxTokens", "top_p": "topP", "temperature": "temperature",
                   "stopSequences": "stopSequences"}
        for k in ic:
            if k not in renamed and k != "top_k":
                raise _bad(f"inferenceConfig.{k}", "extraneous key is not permitted")
        conv["inferenceConfig"] = {renamed[k]: v for k, v in ic.items() if k in renamed}
    p = await _parse_converse(req, app, stream, conv)
    p.body = body
    p.info = None
    p.dialect = NOVA_STREAM if stream else None
    return p


# ------------------------------------------------------------------------------------------
# SigV4 verification (--aws-keys)
# ------------------------------------------------------------------------------------------

def _hmac(key: bytes, msg: str) -> bytes:
    return hmac.new(key, msg.encode(), hashlib.sha256).digest()


def _signature(method: str, path: str, query: Mapping[str, list[str]],
               headers: Mapping[str, str], body: bytes, fields: dict[str, str],
               secret: str) -> str:
    """The SigV4 signature of a request, for the credential scope and signed headers of its
    ``Authorization`` fields: the canonical request (the path percent-encoded again, as AWS
    does for every service but S3), the string to sign and the derived signing key, as the
    SDKs compute them."""
    cred = fields.get("Credential", "").split("/")
    names = fields.get("SignedHeaders", "").split(";")
    pairs = sorted((quote(k, safe="-_.~"), quote(v, safe="-_.~"))
                   for k, vs in query.items() for v in vs)
    canonical = "\n".join([
        method, quote(path or "/", safe="/~"), "&".join(f"{k}={v}" for k, v in pairs),
        "".join(f"{n}:{' '.join(headers.get(n, '').split())}\n" for n in names),
        fields.get("SignedHeaders", ""),
        headers.get("x-amz-content-sha256") or hashlib.sha256(body).hexdigest()])
    to_sign = "\n".join(["AWS4-HMAC-SHA256", headers.get("x-amz-date", ""), "/".join(cred[1:]),
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(("AWS4" + secret).encode(), cred[1])
    for part in cred[2:]:
        key = _hmac(key, part)
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


def _fields(auth: str) -> dict[str, str] | None:
    """The fields of a SigV4 ``Authorization`` value (None: not SigV4)."""
    if not auth.startswith("AWS4-HMAC-SHA256 "):
        return None
    return dict(p.strip().partition("=")[::2] for p in auth[17:].split(",")[:16])


def sigv4_error(req: Request, secrets: dict[str, str]) -> APIError | None:
    """Why ``req``'s SigV4 signature does not hold for ``secrets`` (key id → secret), or
    None. The request date is not compared with the clock."""
    fields = _fields(req.headers.get("authorization", ""))
    if fields is None:
        return E.bedrock_missing_auth.at()
    cred = fields.get("Credential", "").split("/")
    if len(cred) != 5 or cred[0] not in secrets:
        return E.bedrock_unknown_key.at()
    names = fields.get("SignedHeaders", "").split(";")
    if len(names) > 64 or "host" not in names:
        return E.bedrock_bad_signature.at()
    want = _signature(req.method, req.path, req.query, req.headers, req.body, fields,
                      secrets[cred[0]])
    if not hmac.compare_digest(want, fields.get("Signature", "")):
        return E.bedrock_bad_signature.at()
    return None


def resigned(method: str, path: str, query: Mapping[str, list[str]],
             headers: list[tuple[str, str]], body: bytes,
             secrets: dict[str, str]) -> list[tuple[str, str]]:
    """``headers`` (the ``host`` among them: where they go) with the SigV4 signature made
    again for that host and ``path``, when the request's key id has a secret in
    ``secrets``; else as they are. (The recorder forwards a request signed for llmsim's
    own address: the upstream checks the host it signed.)"""
    hs = dict(headers)
    fields = _fields(hs.get("authorization", ""))
    if fields is None:
        return headers
    cred = fields.get("Credential", "").split("/")
    names = fields.get("SignedHeaders", "").split(";")
    if len(cred) != 5 or cred[0] not in secrets or len(names) > 64:
        return headers
    sig = _signature(method, path, query, hs, body, fields, secrets[cred[0]])
    auth = (f"AWS4-HMAC-SHA256 Credential={fields['Credential']}, "
            f"SignedHeaders={fields['SignedHeaders']}, Signature={sig}")
    return [(k, auth if k == "authorization" else v) for k, v in headers]


def aws_secrets(app: Services) -> dict[str, str]:
    """``--aws-keys`` as key id → secret."""
    return dict(k.split(":", 1) for k in app.config.aws_keys)


def _sigv4_hook(secrets: dict[str, str]) -> Any:
    async def check(req: Request, route: Route, app: Services) -> Result | None:
        if route.name.startswith("bedrock."):
            err = sigv4_error(req, secrets)
            if err is not None:
                return bedrock_error(err)
        return None
    return check


def register(app: Host) -> None:
    if app.config.aws_keys:
        app.before.append(_sigv4_hook(aws_secrets(app)))
    base = "/model/{model}"
    serve(app, Converse(False), [("POST", f"{base}/converse")], streaming=False)
    serve(app, Converse(True), [("POST", f"{base}/converse-stream")], streaming=True)
    serve(app, Invoke(False), [("POST", f"{base}/invoke")], streaming=False)
    serve(app, Invoke(True), [("POST", f"{base}/invoke-with-response-stream")],
          streaming=True)
