"""What a simulated Responses model says and when (sans-IO: a seeded RNG in, numbers out).

The whole answer is decided before the first byte: the hidden reasoning size (R4.3.1, bounded
together with the visible output by ``max_output_tokens``), the reasoning summary (R3.2.1,
R3.2.2), function/custom tool calls (R9.2) or a message (plain, echo, fixed, JSON), the exact
token pieces of every delta, and the timing: time to first output (TTFT plus the time spent
"thinking" the reasoning tokens) and one inter-token gap per streamed token.
"""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from ...sim import schema as sch
from ...sim import text as txt
from ...sim import tokens as tok
from ...sim.latency import Latency
from ...sim.prompt import cached_prefix_tokens, content_text, input_steps
from ...sim.rng import derive, new_id
from .parse import RespRequest

if TYPE_CHECKING:
    from ...app import App

__all__ = ["ReasoningOut", "MessageOut", "CallOut", "RespOut", "simulate", "input_steps",
           "cached_prefix_tokens"]

Item = dict[str, Any]


@dataclass(slots=True)
class ReasoningOut:
    """A reasoning item: hidden tokens, the summary parts (token pieces), encrypted blob."""

    id: str
    tokens: int
    parts: list[list[str]]
    encrypted: str | None
    summarized: bool  # a summary was requested (R3.2.1)
    status: str = "completed"


@dataclass(slots=True)
class MessageOut:
    """An assistant message with one ``output_text`` part streamed piece by piece."""

    id: str
    pieces: list[str]
    tokens: int
    status: str = "completed"  # "incomplete" when cut by max_output_tokens
    logprobs: list[dict[str, Any]] | None = None  # include message.output_text.logprobs

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
class RespOut:
    """The decided response: items, usage numbers and timing."""

    id: str
    created_at: int
    items: list[ReasoningOut | MessageOut | CallOut] = field(default_factory=list)
    input_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    visible_tokens: int = 0
    status: str = "completed"  # or "incomplete"
    incomplete_reason: str | None = None
    first_delay: float = 0.0  # seconds from response.created to the first visible output
    gaps: list[float] = field(default_factory=list)  # between consecutive streamed tokens

    @property
    def output_tokens(self) -> int:
        # the real API counts reasoning tokens inside output_tokens (SDK-WIRE-FACTS 1a)
        return self.visible_tokens + self.reasoning_tokens

    @property
    def duration(self) -> float:
        return self.first_delay + sum(self.gaps)

    def usage(self) -> dict[str, Any]:
        out = self.output_tokens
        return {"input_tokens": self.input_tokens,
                "input_tokens_details": {"cached_tokens": self.cached_tokens,
                                         "cache_write_tokens": 0},
                "output_tokens": out,
                "output_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
                "total_tokens": self.input_tokens + out}


# ------------------------------------------------------------------------------------------
# Decisions
# ------------------------------------------------------------------------------------------

def _wants_tools(rr: RespRequest, context: list[Item], rng: random.Random,
                 p_auto: float) -> list[Item]:
    tools = rr.callable_tools
    tc = rr.tool_choice
    if not tools or tc == "none":
        return []
    forced = tc == "required"
    if isinstance(tc, dict):
        t = tc["type"]
        if t in ("function", "custom"):
            return [x for x in tools if x["name"] == tc["name"]][:1]
        if t != "allowed_tools":
            return []  # a hosted tool is forced: llmsim never runs hosted tools
        names = {a.get("name") for a in tc["tools"] if isinstance(a, dict)}
        tools = [x for x in tools if x["name"] in names]
        forced = tc["mode"] == "required"
        if not tools:
            return []
    if not forced:
        last = context[-1].get("type") if context else None
        # after a tool result the model usually answers; otherwise it calls with p_auto
        p = p_auto * (0.2 if last in ("function_call_output", "custom_tool_call_output")
                      else 1.0)
        if rng.random() >= p:
            return []
    k = 1
    if rr.parallel_tool_calls and len(tools) > 1:
        k = rng.choice((1, 1, 1, 2, 2, 3))
    k = min(k, len(tools), rr.max_tool_calls or k)
    return rng.sample(tools, k)


def _call(tool: Item, rng: random.Random, enc: str, work: sch.Work, param: str) -> CallOut:
    if tool["type"] == "custom":
        args = "".join(tok.lorem_pieces(rng.randint(3, 12), rng)).strip()
        pieces, n = tok.split_pieces_counted(args, enc)
        return CallOut(new_id("ctc_"), new_id("call_"), tool["name"], args, pieces, n + 4,
                       kind="custom_tool_call")
    args = orjson.dumps(sch.generate_tool_arguments(tool.get("parameters"), rng, work=work,
                                                    param=param)).decode()
    pieces, n = tok.split_pieces_counted(args, enc)
    return CallOut(new_id("fc_"), new_id("call_"), tool["name"], args, pieces, n + 4)


def _last_user_text(context: list[Item]) -> str:
    for it in reversed(context):
        if it.get("type") == "message" and it.get("role") == "user":
            return content_text(it.get("content"))[0]
    return ""


def _json_source(rr: RespRequest, rng: random.Random, length: int, work: sch.Work) -> str:
    fmt = rr.text_format
    if fmt["type"] == "json_schema":
        return orjson.dumps(sch.generate(fmt["schema"], rng, work=work,
                                         param="text.format.schema")).decode()
    words = "".join(tok.lorem_pieces(max(1, length - 6), rng))
    return orjson.dumps({"response": words}).decode()


def _logprobs(pieces: list[str], top: int, rng: random.Random) -> list[dict[str, Any]]:
    """Plausible log-probabilities: the chosen token first among its alternatives."""
    out = []
    for p in pieces:
        lp = round(-abs(rng.gauss(0.0, 0.6)), 6)
        b = list(p.encode())
        alts = [{"token": p, "bytes": b, "logprob": lp}]
        for w in rng.sample(tok.WORDS, max(0, top - 1)):
            alts.append({"token": w, "bytes": list(w.encode()),
                         "logprob": round(lp - rng.uniform(0.5, 6.0), 6)})
        out.append({"token": p, "bytes": b, "logprob": lp, "top_logprobs": alts[:top]})
    return out


def _encrypted(rng: random.Random, reasoning: int) -> str:
    # opaque, Fernet-looking, size growing with the reasoning (bounded at ~8 KiB)
    n = min(6144, 96 + reasoning * 2)
    return "gAAAAA" + base64.urlsafe_b64encode(rng.randbytes(n)).decode()


def _summary_parts(rng: random.Random, total: int) -> list[list[str]]:
    parts: list[list[str]] = []
    left = total
    while left > 0:
        n = left if left <= 80 else rng.randint(30, 60)
        parts.append(tok.lorem_pieces(n, rng))
        left -= n
    return parts


def simulate(rr: RespRequest, context: list[Item], app: App, rng: random.Random,
             lat: Latency, resp_id: str, created_at: int, input_tokens: int,
             cached_tokens: int = 0) -> RespOut:
    """Decide the whole response (``context`` = earlier turns + this input, resolved)."""
    out = RespOut(resp_id, created_at, input_tokens=input_tokens, cached_tokens=cached_tokens)
    if not rr.generate:  # WebSocket warm-up: state only, no model output
        return out
    cfg = app.config
    enc = rr.profile.encoding
    crng = derive(rng, "response")
    natural = txt.draw_length(crng, cfg.output_tokens_mean, cfg.output_tokens_sigma,
                              cfg.output_tokens_min, cfg.output_tokens_max)
    budget = rr.limit
    reasoning = 0
    if rr.profile.reasoning and rr.effort not in (None, "none"):
        reasoning = txt.reasoning_tokens(crng, natural, rr.effort)
        if budget is not None:
            # max_output_tokens bounds reasoning + visible output together
            mult = txt.EFFORT_MULTIPLIER.get(rr.effort or "medium", 3.0)
            reasoning = min(reasoning, budget - 1, int(budget * mult / (1 + mult)))
            budget -= reasoning
    streamed = 0
    if reasoning > 0:
        parts = _summary_parts(crng, txt.summary_words(reasoning, rr.summary))
        streamed += sum(len(p) for p in parts)
        out.items.append(ReasoningOut(new_id("rs_"), reasoning, parts,
                                      _encrypted(crng, reasoning) if rr.encrypted else None,
                                      rr.summary is not None))
    out.reasoning_tokens = reasoning
    calls = _wants_tools(rr, context, crng, cfg.tool_call_probability)
    visible = 0
    work = sch.Work()  # every value this response generates is paid from one schema budget
    if calls:
        for t in calls:
            i = next((i for i, x in enumerate(rr.tools) if x is t), 0)
            c = _call(t, crng, enc, work, f"tools[{i}].parameters")
            if budget is not None and visible + c.tokens > budget:
                keep = max(0, budget - visible - 4)
                c.pieces = c.pieces[:keep]
                c.arguments = "".join(c.pieces)
                c.tokens = min(c.tokens, budget - visible)
                c.status = "incomplete"
                out.status, out.incomplete_reason = "incomplete", "max_output_tokens"
            visible += c.tokens
            streamed += len(c.pieces)
            out.items.append(c)
            if c.status == "incomplete":
                break
    else:
        json_source = (_json_source(rr, crng, natural, work)
                       if rr.text_format["type"] in ("json_object", "json_schema") else None)
        t = txt.answer(cfg, crng, natural=natural, limit=budget, encoding=enc,
                       user_text=lambda: _last_user_text(context), json_source=json_source)
        msg = MessageOut(new_id("msg_"), t.pieces, t.tokens)
        if "message.output_text.logprobs" in rr.include:
            msg.logprobs = _logprobs(t.pieces, rr.top_logprobs, crng)
        if t.finish == "length":
            msg.status = "incomplete"
            out.status, out.incomplete_reason = "incomplete", "max_output_tokens"
        visible += t.tokens
        streamed += len(t.pieces)
        out.items.append(msg)
    out.visible_tokens = visible
    out.first_delay = lat.ttft(crng, input_tokens) + lat.reasoning_time(crng, reasoning)
    if not lat.is_zero and streamed > 1:
        out.gaps = [lat.gap(crng) for _ in range(streamed - 1)]
    return out
