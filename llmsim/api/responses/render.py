"""Rendering a decided response: Response objects, output items and the SSE event plan.

:func:`response_out` lays a :class:`~llmsim.sim.decide.Decision` out as Responses output items
(a reasoning item, then tool calls or one message), each with its id and status. Everything
else here is a pure function of the request echo and that :class:`RespOut`, so
the same events can be produced again later: a stored response replays its stream for
``GET /v1/responses/{id}?stream=true&starting_after=N`` by rendering the plan again instead of
keeping every event in memory (the decision holds only token pieces, which are references to
the shared vocabulary, so a stored response costs about its text).

Event order (R5, SDK-WIRE-FACTS 1a): ``response.created`` (output ``[]``) → [``response.queued``
for background] → ``response.in_progress`` → per item ``output_item.added`` → parts / deltas /
``.done`` → ``output_item.done`` → one terminal ``response.completed`` or
``response.incomplete``. ``sequence_number`` is stamped by the EventStream (R5.3).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import repeat
from operator import length_hint
from typing import TYPE_CHECKING, Any

import orjson

from ...sim.decide import Decision, Timing, Usage
from ...sim.latency import ConstantGaps
from ...sim.rng import new_id
from ...streaming import encode
from ...streaming.dialect import Dialect
from ...streaming.stream import TokenRun

if TYPE_CHECKING:
    from ...errors import APIError
    from .request import RespRequest

__all__ = ["ReasoningOut", "MessageOut", "CallOut", "HostedOut", "RespOut", "response_out", "no_output",
           "echo_fields", "snapshot", "final_snapshot", "item_json", "plan", "output_text",
           "completed_at", "TERMINAL", "RESPONSES", "TOKEN_EVENTS", "token_json"]

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
PlanItem = tuple[float, str, Any]
# hosted-item events that name their item by output_index only
NO_ITEM_ID = frozenset(("response.shell_call_command.added", "response.shell_call_command.delta",
                        "response.shell_call_command.done"))
# a decision's finish reason → incomplete_details.reason (other reasons: completed)
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


@dataclass(slots=True)
class ReasoningOut:
    """A reasoning item: hidden tokens, the summary parts (token pieces), encrypted blob."""

    id: str
    tokens: int
    parts: list[list[str]]
    encrypted: str | None
    status: str = "completed"


@dataclass(slots=True)
class MessageOut:
    """An assistant message with one ``output_text`` part streamed piece by piece."""

    id: str
    pieces: list[str]
    tokens: int
    status: str = "completed"  # "incomplete" when cut by max_output_tokens
    logprobs: list[dict[str, Any]] | None = None  # include message.output_text.logprobs
    annotations: list[dict[str, Any]] | None = None  # citations of hosted tools' results

    @property
    def text(self) -> str:
        return "".join(self.pieces)


@dataclass(slots=True)
class CallOut:
    """A ``function_call`` (arguments JSON) or ``custom_tool_call`` (free-form input)."""

    id: str
    call_id: str
    name: str
    arguments: str
    pieces: list[str]
    tokens: int
    kind: str = "function_call"
    status: str = "completed"


@dataclass(slots=True)
class HostedOut:
    """An item the server makes itself, not the model's tokens: a compaction, or a hosted
    tool's call (``llmsim.api.responses.hosted``). Its JSON when added and when done, and the
    events between, each ``(delay, type, fields)``: the delay after the event before it
    (the tool's time), the fields besides ``type``, ``item_id`` and ``output_index``."""

    id: str
    added: dict[str, Any]
    done: dict[str, Any]
    steps: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    tail: float = 0.0  # the delay before output_item.done

    @property
    def seconds(self) -> float:
        return sum(d for d, _, _ in self.steps) + self.tail


@dataclass(slots=True)
class RespOut:
    """A decided response as output items: usage, status and timing (``timing`` None: no
    model output, a WebSocket warm-up). ``streamed`` counts the token events of its stream
    (one inter-token gap between consecutive ones)."""

    id: str
    created_at: int
    counts: Usage
    items: list[ReasoningOut | MessageOut | CallOut | HostedOut] = field(default_factory=list)
    status: str = "completed"  # or "incomplete"
    incomplete_reason: str | None = None
    timing: Timing | None = None
    streamed: int = 0
    # seconds from response.created to the terminal event, once known (the stream's plan
    # sums the gaps it draws; else :attr:`duration` draws them)
    elapsed: float | None = None
    extra: float = 0.0  # seconds of server-side work besides the tokens (HostedOut.steps)
    tool_usage: dict[str, Any] | None = None  # hosted tools' billing (Response.tool_usage)

    @property
    def first_delay(self) -> float:
        """Seconds from ``response.created`` to the first visible output."""
        return self.timing.first if self.timing is not None else 0.0

    @property
    def duration(self) -> float:
        """Seconds from ``response.created`` to the terminal event."""
        d = self.elapsed
        if d is None:
            t = self.timing
            d = self.elapsed = (t.duration(self.streamed) if t is not None else 0.0) \
                + self.extra
        return d

    def iter_gaps(self) -> Iterator[float]:
        """The gaps between consecutive token events, same values on every call."""
        return self.timing.gaps(self.streamed - 1) if self.timing is not None else iter(())

    def usage(self) -> dict[str, Any]:
        u = self.counts
        return {"input_tokens": u.prompt_tokens,
                "input_tokens_details": {"cached_tokens": u.cached_tokens,
                                         "cache_write_tokens": 0},
                "output_tokens": u.output_tokens,
                "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
                "total_tokens": u.total_tokens}


def response_out(d: Decision, rid: str, created_at: int) -> RespOut:
    """The decision (one choice) as Responses output: reasoning, then calls or a message."""
    c = d.choices[0]
    items: list[ReasoningOut | MessageOut | CallOut | HostedOut] = []
    streamed = 0
    r = c.reasoning
    if r is not None:
        items.append(ReasoningOut(new_id("rs_"), r.tokens, r.summary, r.encrypted))
        streamed += sum(map(len, r.summary))
    for t in c.calls:
        fn = t.kind == "function"
        items.append(CallOut(new_id("fc_" if fn else "ctc_"), t.call_id, t.name, t.arguments,
                             t.pieces, t.tokens, "function_call" if fn else "custom_tool_call",
                             "completed" if t.complete else "incomplete"))
        streamed += len(t.pieces)
    reason = INCOMPLETE.get(c.finish)
    if c.pieces is not None and (c.pieces or reason is None or r is None):
        # (reasoning that spent the whole max_output_tokens leaves no message, as on the API)
        items.append(MessageOut(new_id("msg_"), c.pieces, c.tokens,
                                "completed" if reason is None else "incomplete", c.logprobs))
        streamed += len(c.pieces)
    return RespOut(rid, created_at, d.usage, items, "completed" if reason is None
                   else "incomplete", reason, d.timing, streamed)


def no_output(rid: str, created_at: int, input_tokens: int, cached_tokens: int) -> RespOut:
    """A response with no model output (WebSocket ``generate: false``): its input only."""
    return RespOut(rid, created_at, Usage(input_tokens, cached_tokens=cached_tokens))


def echo_fields(rr: RespRequest) -> dict[str, Any]:
    """The request fields a Response object echoes (the real API sends all of them)."""
    reasoning = ({"effort": rr.effort, "summary": rr.summary} if rr.profile.reasoning
                 else {"effort": None, "summary": None})
    return {
        "background": rr.background,
        "conversation": {"id": rr.conversation} if rr.conversation else None,
        "instructions": rr.instructions,
        "max_output_tokens": rr.limit,
        "max_tool_calls": rr.max_tool_calls,
        "model": rr.model,
        "parallel_tool_calls": rr.parallel_tool_calls,
        "previous_response_id": rr.previous_response_id,
        "prompt_cache_key": rr.prompt_cache_key,
        "prompt_cache_retention": rr.prompt_cache_retention,
        "reasoning": reasoning,
        "safety_identifier": rr.safety_identifier,
        "service_tier": "default" if rr.service_tier == "auto" else rr.service_tier,
        "store": rr.store,
        "temperature": rr.temperature,
        "text": {"format": rr.text_format, "verbosity": rr.verbosity},
        "tool_choice": rr.tool_choice,
        "tools": rr.tools,
        "top_logprobs": rr.top_logprobs,
        "top_p": rr.top_p,
        "truncation": rr.truncation,
        "user": rr.user,
        "metadata": rr.metadata,
        # required by the Open Responses schema (the SDK's Response tolerates them)
        "presence_penalty": rr.presence_penalty,
        "frequency_penalty": rr.frequency_penalty,
    }


def output_text(output: list[dict[str, Any]]) -> str:
    """The SDK's ``output_text``: every output_text part of every message, joined."""
    if not output:  # (every lifecycle event before the terminal one)
        return ""
    texts = []
    for it in output:
        if it.get("type") == "message":
            for p in it.get("content", ()):
                if p.get("type") == "output_text":
                    texts.append(p.get("text", ""))
    return "".join(texts)


def _head(out: RespOut, status: str, completed_at: int | None, error: dict[str, Any] | None,
          incomplete: str | None) -> dict[str, Any]:
    """The fields a Response object has before the request echo (:func:`snapshot`)."""
    return {"id": out.id, "object": "response", "created_at": out.created_at, "status": status,
            "completed_at": completed_at, "error": error,
            "incomplete_details": {"reason": incomplete} if incomplete else None}


def snapshot(echo: dict[str, Any], out: RespOut, status: str,
             output: list[dict[str, Any]] | None = None, *, usage: bool = False,
             error: dict[str, Any] | None = None, completed_at: int | None = None,
             incomplete: str | None = None) -> dict[str, Any]:
    """A full Response object (the shape of create/retrieve and of every lifecycle event)."""
    out_items = output if output is not None else []
    return {
        **_head(out, status, completed_at, error, incomplete),
        **echo, "output": out_items, "output_text": output_text(out_items),
        "usage": out.usage() if usage else None,
        **({"tool_usage": out.tool_usage} if usage and out.tool_usage is not None else {}),
    }


# RespOut.usage(), rendered (tests/test_responses_stream.py pins them equal)
_USAGE = (b'{"input_tokens":%d,"input_tokens_details":{"cached_tokens":%d,'
          b'"cache_write_tokens":0},"output_tokens":%d,"output_tokens_details":'
          b'{"reasoning_tokens":%d},"total_tokens":%d}')


def echo_json(echo: dict[str, Any]) -> bytes:
    """The request echo as :func:`response_json` splices it (its members, comma first)."""
    return b"," + _dumps(echo)[1:-1] if echo else b""


def response_json(echo: bytes, out: RespOut, status: str, output: bytes = b"[]",
                  text: bytes = b'""', *, usage: bool = False, completed_at: int | None = None,
                  incomplete: str | None = None) -> bytes:
    """The JSON of :func:`snapshot` (no error) from parts rendered already: ``echo``
    (:func:`echo_json`), ``output`` (the items' JSON array) and ``text`` (the JSON of their
    ``output_text``), so that a stream renders each of them once for all its events."""
    u = out.counts
    parts = [_dumps(_head(out, status, completed_at, None, incomplete))[:-1], echo,
             b',"output":', output, b',"output_text":', text, b',"usage":',
             _USAGE % (u.prompt_tokens, u.cached_tokens, u.output_tokens, u.reasoning_tokens,
                       u.total_tokens) if usage else b"null"]
    if usage and out.tool_usage is not None:
        parts += (b',"tool_usage":', _dumps(out.tool_usage))
    parts.append(b"}")
    return b"".join(parts)


def completed_at(out: RespOut) -> int:
    """When the response finishes on the simulated schedule (created_at + its duration)."""
    return int(round(out.created_at + out.duration))


def final_snapshot(echo: dict[str, Any], out: RespOut) -> dict[str, Any]:
    """The terminal Response object (completed or incomplete) with every item done."""
    return snapshot(echo, out, out.status, [item_json(i) for i in out.items], usage=True,
                    completed_at=completed_at(out), incomplete=out.incomplete_reason)


def item_json(item: ReasoningOut | MessageOut | CallOut | HostedOut,
              done: bool = True, text: str | None = None) -> dict[str, Any]:
    """An output item as in ``response.output`` (``done``) or ``output_item.added``
    (``text``: a message's text, when the caller has joined it already)."""
    if type(item) is HostedOut:
        return item.done if done else item.added
    if type(item) is MessageOut:
        content = ([{"type": "output_text", "text": item.text if text is None else text,
                     "annotations": item.annotations or [],
                     "logprobs": item.logprobs or []}] if done else [])
        return {"id": item.id, "type": "message", "status": item.status if done
                else "in_progress", "content": content, "role": "assistant"}
    if type(item) is ReasoningOut:
        d: dict[str, Any] = {"id": item.id, "type": "reasoning",
                             "summary": [{"type": "summary_text", "text": "".join(p)}
                                         for p in item.parts] if done else []}
        if item.encrypted is not None and done:
            d["encrypted_content"] = item.encrypted
        d["status"] = item.status if done else "in_progress"
        return d
    assert type(item) is CallOut
    key = "arguments" if item.kind == "function_call" else "input"
    return {"id": item.id, "type": item.kind, "status": item.status if done else "in_progress",
            key: item.arguments if done else "", "call_id": item.call_id, "name": item.name}


_dumps = orjson.dumps
_TEXT_DELTA = b'{"type":"response.output_text.delta","item_id":%b,"output_index":%d,' \
    b'"content_index":0,"delta":'
_TEXT_DELTA_END = b',"logprobs":[],"sequence_number":'


def token_json(key: tuple[str, int]) -> tuple[bytes, bytes]:
    """The token event, the JSON around the piece: the ``response.output_text.delta`` of
    message ``item_id`` at ``output_index`` (the plan's ``TokenRun`` key), cut before its
    ``sequence_number`` value (the stream's number completes it)."""
    item_id, output_index = key
    return _TEXT_DELTA % (_dumps(item_id), output_index), _TEXT_DELTA_END


TOKEN_EVENTS = frozenset(("response.output_text.delta", "response.function_call_arguments.delta",
                          "response.custom_tool_call_input.delta",
                          "response.reasoning_summary_text.delta"))


def _error_events(err: APIError) -> list[tuple[str, Any]]:
    """A mid-stream failure of a stream with no response record: the ``error`` event (a
    response's own stream reports ``response.failed`` instead, :meth:`Record.failed`)."""
    return [("error", {"type": "error", "code": err.code, "message": err.message,
                       "param": err.param})]


RESPONSES = Dialect("responses", numbered=True, sse=encode.sse_responses, ws=encode.ws_text,
                    sse_error=lambda err, seq: encode.sse_error_responses(err.to_dict(), seq),
                    error_events=_error_events, token_types=TOKEN_EVENTS,
                    token_type="response.output_text.delta", token_json=token_json,
                    terminals=frozenset({"response.completed", "response.incomplete",
                                         "response.failed", "error"}))
"""The Responses API on the wire: named SSE events or WebSocket JSON frames, every event
numbered by the stream."""


# The plan's fixed events, rendered as bytes: each one's JSON cut before its sequence_number
# value, which the stream appends (as for a token). A Response object, an item or a text is
# rendered once for all the events that carry it.
_SEQ = b',"sequence_number":'
# the lifecycle events, each carrying the whole Response
_WITH_RESPONSE = {t: b'{"type":"' + t.encode() + b'","response":%b' + _SEQ
                  for t in ("response.created", "response.queued", "response.in_progress",
                            "response.completed", "response.incomplete")}
_ITEM_ADDED = b'{"type":"response.output_item.added","output_index":%d,"item":%b' + _SEQ
_ITEM_DONE = b'{"type":"response.output_item.done","output_index":%d,"item":%b' + _SEQ
_PART_ADDED = (b'{"type":"response.content_part.added","item_id":%b,"output_index":%d,'
               b'"content_index":0,"part":{"type":"output_text","text":"","annotations":[],'
               b'"logprobs":[]}' + _SEQ)
_TEXT_DONE = (b'{"type":"response.output_text.done","item_id":%b,"output_index":%d,'
              b'"content_index":0,"text":%b,"logprobs":%b' + _SEQ)
_PART_DONE = (b'{"type":"response.content_part.done","item_id":%b,"output_index":%d,'
              b'"content_index":0,"part":{"type":"output_text","text":%b,"annotations":%b,'
              b'"logprobs":%b}' + _SEQ)
_SUMMARY_ADDED = (b'{"type":"response.reasoning_summary_part.added","item_id":%b,'
                  b'"output_index":%d,"summary_index":%d,"part":{"type":"summary_text",'
                  b'"text":""}' + _SEQ)
_SUMMARY_TEXT_DONE = (b'{"type":"response.reasoning_summary_text.done","item_id":%b,'
                      b'"output_index":%d,"summary_index":%d,"text":%b' + _SEQ)
_SUMMARY_DONE = (b'{"type":"response.reasoning_summary_part.done","item_id":%b,'
                 b'"output_index":%d,"summary_index":%d,"part":{"type":"summary_text",'
                 b'"text":%b}' + _SEQ)
_ARGUMENTS_DONE = (b'{"type":"response.function_call_arguments.done","item_id":%b,'
                   b'"output_index":%d,"name":%b,"arguments":%b' + _SEQ)
_INPUT_DONE = (b'{"type":"response.custom_tool_call_input.done","item_id":%b,'
               b'"output_index":%d,"input":%b' + _SEQ)
# a message added and done, :func:`item_json`'s (tests/test_responses_stream.py pins them
# equal)
_MESSAGE_ADDED = b'{"id":%b,"type":"message","status":"in_progress","content":[],"role":"assistant"}'
_MESSAGE = (b'{"id":%b,"type":"message","status":%b,"content":[{"type":"output_text",'
            b'"text":%b,"annotations":%b,"logprobs":%b}],"role":"assistant"}')


def plan(echo: dict[str, Any], out: RespOut, *, background: bool = False,
         warmup: bool = False, rendered: bytes | None = None) -> Iterator[PlanItem]:
    """The event plan ``(offset, type, data)`` (sequence numbers are added by EventStream).

    ``response.created`` is immediate; the first visible output waits ``out.first_delay``
    (TTFT + reasoning time); every later token waits one gap. The lifecycle events and
    every item's added and done events are yielded rendered (``bytes``, see above), the
    others as dicts. ``rendered``: ``echo_json(echo)``, when the caller has it.
    """
    ej = rendered if rendered is not None else echo_json(echo)
    first = response_json(ej, out, "queued" if background else "in_progress")
    yield 0.0, "response.created", _WITH_RESPONSE["response.created"] % first
    if background:
        yield 0.0, "response.queued", _WITH_RESPONSE["response.queued"] % first
    if warmup:  # WebSocket generate: false: created, then completed with no output
        yield 0.0, "response.completed", _WITH_RESPONSE["response.completed"] % response_json(
            ej, out, out.status, usage=True, completed_at=completed_at(out),
            incomplete=out.incomplete_reason)
        return
    # (in_progress shows the Response object created showed, unless that one was queued)
    yield 0.0, "response.in_progress", _WITH_RESPONSE["response.in_progress"] % (
        response_json(ej, out, "in_progress") if background else first)
    pending = out.first_delay
    gaps = out.iter_gaps()
    if type(gaps) is ConstantGaps:  # equal gaps: a token run takes them at once (flow.Pump)
        if out.elapsed is None:
            out.elapsed = pending + sum(repeat(gaps.value, length_hint(gaps))) + out.extra
    else:
        # the gaps, drawn up front in one loop (cheaper per token than drawing each in turn)
        # and summed once for completed_at; held only while the stream runs (a replay draws
        # again)
        drawn = list(gaps)
        if out.elapsed is None:
            out.elapsed = pending + sum(drawn) + out.extra
        gaps = iter(drawn)
    # token events: the first at once (every item's first event takes the first delay,
    # before any token), then one gap each
    # (``lead.pop() if lead else next(gaps, 0.0)``: a token's wait, written out where one is
    # yielded, no call per token)
    lead = [0.0]
    # an item's first event takes what is pending (``w, pending = pending, 0.0``, written out
    # where one is yielded: no closure per plan, no call per item)

    done_items: list[bytes] = []  # each item's JSON when done
    texts: list[tuple[str, bytes | None]] = []  # the output_text parts so far (and JSON)
    for idx, item in enumerate(out.items):
        rid = item.id
        if type(item) is ReasoningOut:
            # the reasoning item opens at once (the client sees the model "thinking")
            yield 0.0, "response.output_item.added", _ITEM_ADDED % (
                idx, _dumps(item_json(item, done=False)))
            rj = _dumps(rid)
            for si, pieces in enumerate(item.parts):
                w, pending = pending, 0.0
                yield w, "response.reasoning_summary_part.added", _SUMMARY_ADDED % (
                    rj, idx, si)
                for p in pieces:
                    d = lead.pop() if lead else next(gaps, 0.0)
                    yield d, "response.reasoning_summary_text.delta", {
                        "type": "response.reasoning_summary_text.delta", "item_id": rid,
                        "output_index": idx, "summary_index": si, "delta": p}
                sj = _dumps("".join(pieces))
                yield 0.0, "response.reasoning_summary_text.done", _SUMMARY_TEXT_DONE % (
                    rj, idx, si, sj)
                yield 0.0, "response.reasoning_summary_part.done", _SUMMARY_DONE % (
                    rj, idx, si, sj)
            done = _dumps(item_json(item))
            w, pending = pending, 0.0
            yield w, "response.output_item.done", _ITEM_DONE % (idx, done)
            done_items.append(done)
            continue
        if type(item) is HostedOut:
            w, pending = pending, 0.0
            yield w, "response.output_item.added", _ITEM_ADDED % (idx, _dumps(item.added))
            for delay, etype, fields in item.steps:
                yield delay, etype, ({"type": etype, "output_index": idx, **fields}
                                     if etype in NO_ITEM_ID else
                                     {"type": etype, "item_id": rid, "output_index": idx,
                                      **fields})
            done = _dumps(item.done)
            yield item.tail, "response.output_item.done", _ITEM_DONE % (idx, done)
            done_items.append(done)
            hosted_text = output_text([item.done])
            if hosted_text:
                texts.append((hosted_text, None))
            continue
        if type(item) is MessageOut:
            rj = _dumps(rid)
            w, pending = pending, 0.0
            yield w, "response.output_item.added", _ITEM_ADDED % (
                idx, _MESSAGE_ADDED % rj)
            yield 0.0, "response.content_part.added", _PART_ADDED % (rj, idx)
            lps = item.logprobs
            if lps is None:  # the hot path: the deltas as one run (stream.TokenRun, the
                # dialect's token event: the bytes the dict below gives), each a gap after
                # the last
                if item.pieces:
                    d = lead.pop() if lead else next(gaps, 0.0)
                    yield d, "response.output_text.delta", TokenRun(item.pieces, gaps,
                                                                    (rid, idx))
            else:
                for p, lp in zip(item.pieces, lps, strict=False):
                    d = lead.pop() if lead else next(gaps, 0.0)
                    yield d, "response.output_text.delta", {
                        "type": "response.output_text.delta", "item_id": rid,
                        "output_index": idx, "content_index": 0, "delta": p,
                        "logprobs": [lp]}
            anns = item.annotations
            for ai, ann in enumerate(anns or ()):
                yield 0.0, "response.output_text.annotation.added", {
                    "type": "response.output_text.annotation.added", "item_id": rid,
                    "output_index": idx, "content_index": 0, "annotation_index": ai,
                    "annotation": ann}
            text = item.text
            tj = _dumps(text)
            lj = _dumps(lps) if lps else b"[]"
            aj = _dumps(anns) if anns else b"[]"
            texts.append((text, tj))
            yield 0.0, "response.output_text.done", _TEXT_DONE % (rj, idx, tj, lj)
            yield 0.0, "response.content_part.done", _PART_DONE % (rj, idx, tj, aj, lj)
            done = _MESSAGE % (rj, _dumps(item.status), tj, aj, lj)
        else:
            assert type(item) is CallOut
            w, pending = pending, 0.0
            yield w, "response.output_item.added", _ITEM_ADDED % (
                idx, _dumps(item_json(item, done=False)))
            fn = item.kind == "function_call"
            dtype = ("response.function_call_arguments.delta" if fn
                     else "response.custom_tool_call_input.delta")
            for p in item.pieces:
                d = lead.pop() if lead else next(gaps, 0.0)
                yield d, dtype, {"type": dtype, "item_id": rid, "output_index": idx,
                                 "delta": p}
            if fn:
                yield 0.0, "response.function_call_arguments.done", _ARGUMENTS_DONE % (
                    _dumps(rid), idx, _dumps(item.name), _dumps(item.arguments))
            else:
                yield 0.0, "response.custom_tool_call_input.done", _INPUT_DONE % (
                    _dumps(rid), idx, _dumps(item.arguments))
            done = _dumps(item_json(item))
        yield 0.0, "response.output_item.done", _ITEM_DONE % (idx, done)
        done_items.append(done)
    final = "response.completed" if out.status == "completed" else "response.incomplete"
    if not texts:
        otj = b'""'
    elif len(texts) == 1 and texts[0][1] is not None:
        otj = texts[0][1]
    else:
        otj = _dumps("".join(t for t, _ in texts))
    resp = response_json(ej, out, out.status, b"[" + b",".join(done_items) + b"]", otj,
                         usage=True, completed_at=completed_at(out),
                         incomplete=out.incomplete_reason)
    w, pending = pending, 0.0
    yield w, final, _WITH_RESPONSE[final] % resp
