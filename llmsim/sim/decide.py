"""The one decision: what a simulated model answers to a request, whatever API asked.

Every API family parses its request into an :class:`Ask` (the request as the decision needs
it: no messages or items, no wire names), calls :func:`decide` once, and renders the
:class:`Decision` in its own dialect: Chat Completions as ``choices``/``finish_reason``,
Responses as output items with a ``status``. Nothing here does I/O, counts stats or knows a
wire format; everything random comes from the request's seeded RNG, so the same ``Ask`` and
the same RNG state give the same answer in every dialect.

Order of decisions (and of RNG draws), per choice: the first from the request's RNG itself
(no second generator to seed per request: seeding one costs ~3.5 µs), choice ``i`` ≥ 1 from
``derive(rng, "choice{i}")`` after it, so the first choice is the same whatever ``n``:
the natural length (read from what the request asks, :mod:`llmsim.sim.lengths`, raised to
``min_tokens``; the limit then cuts it), the hidden reasoning size (by the kind of task and the
effort, spent first from the limit), the reasoning summary and encrypted blob, whether and
which tools are called, then either the calls' arguments (schema-valid, cut at the limit) or
the text (plain, echo, fixed or JSON; cut at a stop sequence) and its logprobs. The timing
comes last, from the request RNG: time to first output (TTFT plus the reasoning time) and the
seed of the inter-token gaps (drawn lazily, so a long answer costs no list of floats).

The finish reason is dialect-neutral (:data:`FINISH`): ``stop``, ``length``, ``tool_calls``
or ``content_filter``; Chat sends it as ``finish_reason``, Responses maps it to ``status``
and ``incomplete_details``.

Every type here is a value: built once, never mutated. Only the shared constants
(:data:`AUTO`, :data:`TEXT`) are frozen; the per-request ones are plain ``__slots__``
dataclasses, because a frozen dataclass costs ~85 ns a field to build (an :class:`Ask` 1.8 µs
more), paid per request, per tool and per call on the hot path.
"""

from __future__ import annotations

import base64
import random
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import orjson

from ..errors import APIError
from . import lengths as lens
from . import schema as sch
from . import text as txt
from . import tokens as tok
from .described import described_schema, requested_json
from .latency import Latency
from .models import ModelProfile
from .rng import derive, new_id

if TYPE_CHECKING:
    from ..config import Config

__all__ = ["Ask", "Tool", "ToolChoice", "Output", "Decision", "Choice", "Call", "Reasoning",
           "Usage", "Timing", "decide", "FINISH", "AUTO", "TOOL_CHOICES", "TEXT", "CALL_TOKENS"]

FINISH = ("stop", "length", "tool_calls", "content_filter")
CALL_TOKENS = 4  # completion tokens of a tool call besides its arguments (name, framing)
_K_CHOICES = (1, 1, 1, 2, 2, 3)  # how many tools a parallel call uses (when it may)
_dumps = orjson.dumps


# ------------------------------------------------------------------------------------------
# The request as the decision needs it
# ------------------------------------------------------------------------------------------

@dataclass(slots=True)
class Tool:
    """A tool the model may call: a function (JSON arguments) or a custom tool (free text)."""

    name: str
    kind: str = "function"  # "function" | "custom"
    parameters: dict[str, Any] | None = None  # function: the arguments' JSON Schema
    format: dict[str, Any] | None = None  # custom: text or grammar (the input is free text)
    strict: bool = False
    param: str | None = None  # the request field of the schema (named by a schema 400)
    description: str = ""  # what the tool is for (the agent policy matches the user's words)


@dataclass(frozen=True, slots=True)
class ToolChoice:
    """``tool_choice``: ``none``, ``auto``, ``required``, ``named`` (the tool in ``names``)
    or ``hosted`` (a hosted tool is forced: the simulated model never calls one). With
    ``names`` and ``auto``/``required`` only those tools may be called (``allowed_tools``)."""

    mode: str = "auto"
    names: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class Output:
    """The response format: ``text``, ``json_object`` or ``json_schema`` (``schema``)."""

    kind: str = "text"
    schema: dict[str, Any] | None = None
    param: str | None = None  # the request field of the schema (named by a schema 400)


AUTO = ToolChoice()
TOOL_CHOICES: Mapping[str, ToolChoice] = MappingProxyType(
    {"auto": AUTO, "none": ToolChoice("none"), "required": ToolChoice("required")})
TEXT = Output()


def _no_text() -> str:
    return ""


def _no_texts() -> list[str]:
    return []


@dataclass(slots=True)
class Ask:
    """A normalised request: everything :func:`decide` reads, in no API's words.

    ``user_text`` returns the last user message's text (called only in ``--text echo``
    mode); ``after_tool_result`` says the conversation ends with a tool's output (the model
    then usually answers instead of calling again). ``limit`` bounds reasoning and visible
    tokens together; ``effort`` None means no reasoning (a model without it).
    """

    profile: ModelProfile
    prompt_tokens: int = 0
    cached_tokens: int = 0
    user_text: Callable[[], str] = _no_text
    # the instruction and user texts, in order (read only for json_object: the JSON the
    # prompt describes, llmsim.sim.described)
    prompt_texts: Callable[[], list[str]] = _no_texts
    json_hint: bool = False  # the request body mentions JSON (llmsim.sim.described.json_hint)
    after_tool_result: bool = False
    tools: tuple[Tool, ...] = ()
    tool_choice: ToolChoice = AUTO
    parallel_tool_calls: bool = True
    max_tool_calls: int | None = None
    output: Output = TEXT
    limit: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False  # generate exactly ``limit`` tokens (vLLM)
    stops: tuple[str, ...] = ()
    effort: str | None = None
    summary: str | None = None  # reasoning summary mode (None: no summary)
    encrypted: bool = False  # an encrypted reasoning blob is wanted
    n: int = 1
    logprobs: bool = False
    top_logprobs: int = 0
    completion: bool = False  # a legacy completions prompt (continued, not answered)
    cache_write: int = 0  # prompt tokens written to the cache (Anthropic cache_control)
    cache_write_1h: int = 0  # of which with the 1-hour TTL


# ------------------------------------------------------------------------------------------
# The decision
# ------------------------------------------------------------------------------------------

@dataclass(slots=True)
class Call:
    """A tool call: its arguments (JSON text, or a custom tool's input) as token pieces."""

    call_id: str
    name: str
    kind: str  # "function" | "custom"
    arguments: str
    pieces: list[str]
    tokens: int  # completion tokens, CALL_TOKENS included
    complete: bool = True  # False: cut off by the token limit


@dataclass(slots=True)
class Reasoning:
    """Hidden reasoning: its tokens, the summary parts (token pieces), the encrypted blob."""

    tokens: int
    summary: list[list[str]]
    encrypted: str | None = None


@dataclass(slots=True)
class Choice:
    """One answer: text (``pieces``, one token each) or tool calls (``pieces`` None)."""

    index: int
    pieces: list[str] | None
    calls: tuple[Call, ...]
    finish: str  # one of FINISH
    tokens: int  # visible completion tokens
    reasoning: Reasoning | None = None
    logprobs: list[dict[str, Any]] | None = None  # per piece: token, logprob, bytes, top_logprobs
    stop_sequence: str | None = None  # the stop sequence that ended the text, if one did

    @property
    def text(self) -> str | None:
        return None if self.pieces is None else "".join(self.pieces)

    @property
    def reasoning_tokens(self) -> int:
        return self.reasoning.tokens if self.reasoning is not None else 0


@dataclass(slots=True)
class Usage:
    """Billed tokens: the prompt (``cached_tokens`` of it from the cache) and the output,
    reasoning included (as both APIs count it)."""

    prompt_tokens: int
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0  # read from the prompt cache
    cache_write_tokens: int = 0  # written to it (Anthropic's cache_creation_input_tokens)
    cache_write_1h: int = 0  # of those, written with the 1-hour TTL

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.output_tokens


@dataclass(slots=True)
class Timing:
    """When the answer is delivered: ``first`` seconds to the first visible output (TTFT
    plus reasoning time), then one gap per further step, drawn from ``Random(seed)`` on
    demand (the same values on every call)."""

    first: float
    lat: Latency
    seed: int

    def gaps(self, n: int) -> Iterator[float]:
        """The ``n`` gaps between ``n + 1`` consecutive steps (none at zero latency)."""
        lat = self.lat
        if lat.is_zero or n <= 0:
            return iter(())
        return lat.seeded_gaps(self.seed, n)

    def duration(self, steps: int) -> float:
        """Seconds from the request to the last of ``steps`` delivery steps."""
        lat = self.lat
        if lat.is_zero:
            return self.first
        if lat.fixed_itl_ms is not None:
            return self.first + max(0, steps - 1) * lat.fixed_itl_ms / 1000.0
        return self.first + sum(self.gaps(steps - 1))


@dataclass(slots=True)
class Decision:
    """Everything the model says and when: ``n`` choices, the billed usage, the timing."""

    choices: tuple[Choice, ...]
    usage: Usage
    timing: Timing


# ------------------------------------------------------------------------------------------
# Deciding
# ------------------------------------------------------------------------------------------

def decide(ask: Ask, cfg: Config, rng: random.Random, lat: Latency) -> Decision:
    """Decide the whole answer to ``ask`` (see the module doc for the order of draws).

    Raises a 400 :class:`~llmsim.errors.APIError` only when a schema's generation runs out of
    its work budget (:mod:`llmsim.sim.schema`), before anything is sent."""
    work = sch.Work()  # every value this request generates is paid from one schema budget
    task = _Lazy(ask)
    c = _choice(ask, cfg, rng, 0, work, task)
    if ask.n == 1:  # (the usual request: no loop)
        choices: tuple[Choice, ...] = (c,)
        think = reasoning = c.reasoning_tokens
        out = c.tokens + reasoning
    else:
        choices = (c, *(_choice(ask, cfg, derive(rng, f"choice{i}"), i, work, task)
                         for i in range(1, ask.n)))
        think = max(c.reasoning_tokens for c in choices)
        reasoning = sum(c.reasoning_tokens for c in choices)
        out = sum(c.tokens for c in choices) + reasoning
    first = lat.ttft(rng, ask.prompt_tokens, ask.cached_tokens) + lat.reasoning_time(rng, think)
    return Decision(choices, Usage(ask.prompt_tokens, out, reasoning, ask.cached_tokens,
                                   ask.cache_write, ask.cache_write_1h),
                    Timing(first, lat, rng.getrandbits(64)))


class _Lazy:
    """The request's :class:`~llmsim.sim.lengths.Task`, read from its text on first use
    (an exact-length benchmark request never reads it)."""

    __slots__ = ("ask", "_task")

    def __init__(self, ask: Ask) -> None:
        self.ask = ask
        self._task: lens.Task | None = None

    def get(self) -> lens.Task:
        if self._task is None:
            ask = self.ask
            self._task = lens.TOOL_ANSWER if ask.after_tool_result else \
                lens.read_task(ask.user_text(), completion=ask.completion)
        return self._task


def _natural(ask: Ask, cfg: Config, rng: random.Random, task: _Lazy) -> int:
    """The answer's natural length (before the limit): by the length source
    (:mod:`llmsim.sim.lengths`), clipped to ``--output-tokens-min/-max``, raised to
    ``min_tokens``."""
    lo, hi = cfg.output_tokens_min, cfg.output_tokens_max
    if ask.limit is not None and (ask.ignore_eos or cfg.max_tokens_mode == "exact") \
            and cfg.text in ("lorem", "sequence"):
        return max(ask.limit, ask.min_tokens)  # (the limit decides: nothing to draw)
    if cfg.output_tokens_mean is not None:  # one prompt-blind log-normal
        n = txt.draw_length(rng, cfg.output_tokens_mean, cfg.output_tokens_sigma, lo, hi)
    elif cfg.max_tokens_mode.startswith("trace:"):
        n = min(hi, max(lo, lens.load_trace(cfg.max_tokens_mode[6:]).draw(
            rng, ask.prompt_tokens)))
    else:
        t = task.get()
        x = lens.natural_length(t, rng, prompt_tokens=ask.prompt_tokens,
                                user_chars=len(ask.user_text()) if t.kind == "rewrite" else 0,
                                verbosity=ask.profile.verbosity)
        n = int(min(hi, max(lo, round(x))))
    return max(n, ask.min_tokens)


def _choice(ask: Ask, cfg: Config, rng: random.Random, index: int, work: sch.Work,
            task: _Lazy) -> Choice:
    natural = _natural(ask, cfg, rng, task)
    limit = ask.limit
    reasoning = None
    if ask.profile.reasoning and ask.effort is not None:
        spent, limit = _reasoning_budget(rng, task.get(), ask.effort, limit)
        if spent > 0:
            parts = _summary_parts(rng, txt.summary_words(spent, ask.summary))
            reasoning = Reasoning(spent, parts, _encrypted(rng, spent) if ask.encrypted
                                  else None)
    tools = _wants_tools(ask, rng, cfg.tool_call_probability) if ask.tools else ()
    if tools:
        calls, tokens, cut = _calls(tools, rng, ask.profile.encoding, limit, work)
        finish = "length" if cut else "stop" if ask.tool_choice.mode == "named" else "tool_calls"
        return Choice(index, None, calls, finish, tokens, reasoning)
    out = ask.output
    if out.kind != "text":
        json_source: str | None = _json_source(ask, rng, natural, work)
    elif ask.json_hint and cfg.text == "lorem":
        json_source = _requested_json(ask, rng, work)
    else:
        json_source = None
    t = txt.answer(cfg, rng, natural=natural, limit=limit, encoding=ask.profile.encoding,
                   user_text=ask.user_text, json_source=json_source,
                   exact=True if ask.ignore_eos else None)
    if ask.stops:
        t = txt.apply_stop(t, ask.stops)
    lps = _logprobs(t.pieces, ask.top_logprobs, rng) if ask.logprobs else None
    return Choice(index, t.pieces, (), t.finish, t.tokens, reasoning, lps, t.stop)


def _reasoning_budget(rng: random.Random, task: lens.Task, effort: str,
                      limit: int | None) -> tuple[int, int | None]:
    """Hidden reasoning tokens for ``task`` at ``effort``, and what the limit leaves for the
    visible output. As on the real API the limit (max_completion_tokens / max_output_tokens)
    bounds both together and reasoning is spent first: a reasoning run that reaches the limit
    leaves no visible output (the answer then ends ``length`` / ``incomplete``)."""
    spent = lens.reasoning_length(task, effort, rng)
    if limit is None:
        return spent, None
    spent = min(spent, limit)
    return spent, limit - spent


def _summary_parts(rng: random.Random, total: int) -> list[list[str]]:
    parts: list[list[str]] = []
    left = total
    while left > 0:
        n = left if left <= 80 else rng.randint(30, 60)
        parts.append(tok.lorem_pieces(n, rng))
        left -= n
    return parts


def _encrypted(rng: random.Random, reasoning: int) -> str:
    # opaque, Fernet-looking, size growing with the reasoning (bounded at ~8 KiB)
    n = min(6144, 96 + reasoning * 2)
    return "gAAAAA" + base64.urlsafe_b64encode(rng.randbytes(n)).decode()


def _wants_tools(ask: Ask, rng: random.Random, p_auto: float | None) -> Sequence[Tool]:
    """Which tools this choice calls (none: it answers with text)."""
    tools: Sequence[Tool] = ask.tools
    tc = ask.tool_choice
    mode = tc.mode
    if not tools or mode == "none" or mode == "hosted":
        return ()
    if mode == "named":
        return [t for t in tools if tc.names is not None and t.name in tc.names][:1]
    if tc.names is not None:  # allowed_tools: only these may be called
        tools = [t for t in tools if t.name in tc.names]
        if not tools:
            return ()
    if p_auto is None:  # the agent policy (default)
        if mode != "required" and ask.after_tool_result:
            return ()  # the results are in: answer them in text
        return _relevant(tools, ask, rng)
    if mode != "required":
        # the random policy: after a tool result the model usually answers; otherwise it
        # calls with p_auto
        p = p_auto * (0.2 if ask.after_tool_result else 1.0)
        if rng.random() >= p:
            return ()
    k = 1
    if ask.parallel_tool_calls and len(tools) > 1:
        k = rng.choice(_K_CHOICES)
    k = min(k, len(tools), ask.max_tool_calls or k)
    return rng.sample(tools, k)


_WORD = re.compile(r"[A-Za-z0-9]+")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
MAX_PARALLEL_RELEVANT = 3
MATCH_CHARS = 4096  # the words matched are read from at most this much of the user's text


def _words(text: str) -> set[str]:
    """Lower-case words of 3+ characters, a trailing plural ``s`` dropped (``get_weather``,
    ``getWeather`` and "the weather" all give ``weather``)."""
    out = set()
    for w in _WORD.findall(_CAMEL.sub(" ", text[:MATCH_CHARS]).replace("_", " ")):
        w = w.lower()
        if len(w) >= 3:
            out.add(w[:-1] if len(w) > 3 and w.endswith("s") else w)
    return out


def _relevant(tools: Sequence[Tool], ask: Ask, rng: random.Random) -> Sequence[Tool]:
    """The agent policy's calls: the tool whose name and description share the most words
    with the user's last message (ties broken by the seeded RNG, so a question that names no
    tool still calls one, reproducibly); with ``parallel_tool_calls``, also the others that
    match as well (at most :data:`MAX_PARALLEL_RELEVANT`)."""
    asked = _words(ask.user_text())
    scored = sorted(((len(asked & _words(t.name + " " + t.description[:MATCH_CHARS])),
                      rng.random(), i) for i, t in enumerate(tools)), reverse=True)
    top = scored[0][0]
    k = 1
    if ask.parallel_tool_calls and top > 0:
        k = sum(1 for s in scored if s[0] == top)
    k = min(k, MAX_PARALLEL_RELEVANT, ask.max_tool_calls or k)
    return [tools[i] for _, _, i in scored[:k]]


def _calls(tools: Sequence[Tool], rng: random.Random, enc: str, limit: int | None,
           work: sch.Work) -> tuple[tuple[Call, ...], int, bool]:
    """The calls of ``tools`` within ``limit`` tokens: ``(calls, tokens, cut)``. The first
    call that does not fit keeps what is left of the limit (a prefix of its arguments, as the
    real API cuts a call off mid-JSON) and ends the answer; none is started once the limit is
    spent exactly."""
    calls: list[Call] = []
    used = 0
    for t in tools:
        if limit is not None and used >= limit:
            return tuple(calls), used, True
        c = _call(t, rng, enc, work)
        if limit is not None and used + c.tokens > limit:
            left = limit - used
            pieces = c.pieces[:max(0, left - CALL_TOKENS)]
            calls.append(Call(c.call_id, c.name, c.kind, "".join(pieces), pieces, left,
                              complete=False))
            return tuple(calls), limit, True
        calls.append(c)
        used += c.tokens
    return tuple(calls), used, False


def _call(tool: Tool, rng: random.Random, enc: str, work: sch.Work) -> Call:
    if tool.kind == "custom":
        # lorem pieces carry their own leading spaces: joined as they are, single-spaced
        args = "".join(tok.lorem_pieces(rng.randint(3, 12), rng)).strip()
    else:
        args = _dumps(sch.generate_tool_arguments(tool.parameters, rng, work=work,
                                                  param=tool.param)).decode()
    pieces, n = tok.split_pieces_counted(args, enc)
    return Call(new_id("call_"), tool.name, tool.kind, args, pieces, n + CALL_TOKENS)


def _requested_json(ask: Ask, rng: random.Random, work: sch.Work) -> str | None:
    """A plain-text answer to a prompt that asks for JSON it describes: that JSON (in a
    ```json block when the prompt asks for one), as a real model answers."""
    req = requested_json(ask.prompt_texts())
    if req is None:
        return None
    schema, fenced = req
    try:
        sch.check(schema, param="messages", label="the prompt's JSON", code="x", work=work)
        src = _dumps(sch.generate(schema, rng, work=work, param="messages")).decode()
    except APIError:
        return None
    return f"```json\n{src}\n```" if fenced else src


def _json_source(ask: Ask, rng: random.Random, length: int, work: sch.Work) -> str:
    """Structured output: a value of the schema; with json_object, a value of the JSON the
    prompt describes (:mod:`llmsim.sim.described`), else lorem in an object."""
    out = ask.output
    if out.kind == "json_schema":
        return _dumps(sch.generate(out.schema, rng, work=work, param=out.param)).decode()
    described = described_schema(ask.prompt_texts())
    if described is not None:
        try:
            sch.check(described, param="messages", label="the prompt's JSON", code="x",
                      work=work)
            return _dumps(sch.generate(described, rng, work=work, param="messages")).decode()
        except APIError:  # not a schema the generator can fill, or too big: the default
            pass
    words = "".join(tok.lorem_pieces(max(1, length - 6), rng))
    return _dumps({"response": words}).decode()


def _logprobs(pieces: list[str], top: int, rng: random.Random) -> list[dict[str, Any]]:
    """Plausible log-probabilities: the chosen token first among its ``top`` alternatives
    (the shape both APIs share: token, logprob, bytes, top_logprobs)."""
    out = []
    sample = rng.sample
    uniform = rng.uniform
    gauss = rng.gauss
    words = tok.WORDS
    for p in pieces:
        lp = round(-abs(gauss(0.0, 0.6)), 6)
        b = list(p.encode())
        alts = [{"token": p, "logprob": lp, "bytes": b}] if top else []
        for w in sample(words, top - 1) if top > 1 else ():
            alts.append({"token": w, "logprob": round(lp - uniform(0.5, 6.0), 6),
                         "bytes": list(w.encode())})
        out.append({"token": p, "logprob": lp, "bytes": b, "top_logprobs": alts})
    return out
