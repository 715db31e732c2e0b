"""How long an answer is: the natural length of the visible answer and of the hidden reasoning,
read from what the request asks, before any limit applies.

The request's last user text is read (bounded: its first and last :data:`READ_CHARS`
characters) for a *kind* of request — a greeting, a short factual question, an explanation, a
long-form piece, a list, code, math, an extraction, a summary, a rewrite, or plain
conversation — and for explicit cues ("in 50 words", "3 sentences", "list 10", "one word",
"briefly", "in detail"). Each kind's distribution is data, with its source, in
``llmsim/data/lengths.json``: a log-normal, a ratio of the input, or a public trace's own
histogram (plain conversation and legacy code continuation are the Azure LLM inference traces
2023, sampled by inverse CDF). A per-model ``verbosity`` scales the result.

The limit is applied afterwards by the caller (:mod:`llmsim.sim.decide`): an answer whose
natural length exceeds ``max_tokens`` is cut at exactly the limit and finishes ``length``, as
a real model's does.

Length sources (``--max-tokens-mode``): ``natural`` (this model, the default), ``exact``
(every answer fills its limit: benchmarks), ``trace:FILE`` (lengths sampled from a CSV in the
Azure trace format, conditioned on the nearest input size). ``--output-tokens-mean`` replaces
the per-kind model by one prompt-blind log-normal.
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import math
import os
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

__all__ = ["Task", "TOOL_ANSWER", "read_task", "natural_length", "reasoning_length", "load_trace",
           "Trace", "TraceError", "DATA", "KINDS", "READ_CHARS", "parse_source"]

READ_CHARS = 2048  # of the user's text, the first and the last this many characters are read
TRACE_MAX_BYTES = 256 * 1024 * 1024
TRACE_MAX_ROWS = 2_000_000
TRACE_NEIGHBOURS = 32  # a trace length is drawn from this many rows of the nearest input size


def _load_data() -> dict[str, Any]:
    raw = resources.files("llmsim").joinpath("data/lengths.json").read_text("utf-8")
    return json.loads(raw)  # type: ignore[no-any-return]


DATA: dict[str, Any] = _load_data()
KINDS: dict[str, dict[str, Any]] = DATA["kinds"]
_WORDS_PER_TOKEN: float = DATA["words_per_token"]["value"]
_PER_SENTENCE: float = DATA["tokens_per_sentence"]["value"]
_PER_PARAGRAPH: float = DATA["tokens_per_paragraph"]["value"]
_PER_ITEM: float = DATA["tokens_per_item"]["value"]
_CUE_SIGMA: float = DATA["cue_sigma"]["value"]
_BRIEF: float = DATA["brief_factor"]["value"]
_DETAIL: float = DATA["detail_factor"]["value"]
EFFORT_FACTOR: dict[str, float] = {k: float(v) for k, v in DATA["effort_factor"].items()
                                   if k != "source"}


class _Histogram:
    """A trace's output lengths as (value, cumulative count): drawn by inverse CDF."""

    __slots__ = ("values", "cum", "total")

    def __init__(self, pairs: Sequence[Sequence[int]]) -> None:
        self.values = [int(v) for v, _ in pairs]
        self.cum = [int(c) for _, c in pairs]
        self.total = self.cum[-1]

    def draw(self, rng: random.Random) -> int:
        return self.values[bisect.bisect_right(self.cum, int(rng.random() * self.total))]


_HIST = {k: _Histogram(v["histogram"]) for k, v in KINDS.items() if "histogram" in v}


# ------------------------------------------------------------------------------------------
# Reading the request
# ------------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Task:
    """What the request asks for, as the length model needs it: the kind, an explicit target
    length in tokens (a cue such as "in 200 words"; None: the kind's own distribution) and a
    factor from words such as "briefly" or "in detail"."""

    kind: str
    target: float | None = None
    factor: float = 1.0


CONVERSATION = Task("conversation")
TOOL_ANSWER = Task("tool_answer")  # the answer once a tool's result is in
CONTINUATION = Task("code_continuation")

_NUM = r"(\d{1,5}|one|two|three|four|five|six|seven|eight|nine|ten|twelve|fifteen|twenty)"
_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10, "twelve": 12, "fifteen": 15, "twenty": 20}
_WORDS_CUE = re.compile(_NUM + r"[\s-]*words?\b")
_SENTENCES_CUE = re.compile(_NUM + r"[\s-]*sentences?\b")
_PARAGRAPHS_CUE = re.compile(_NUM + r"[\s-]*(?:paragraphs?|paras)\b")
_ITEMS_CUE = re.compile(
    r"\b(?:list|give(?: me)?|name|suggest|provide|generate|top|enumerate)\s+(?:me\s+)?"
    r"(?:the\s+|some\s+)?(?:top\s+)?" + _NUM + r"\b|\b" + _NUM +
    r"\s+(?:\w+\s+)?(?:items|things|ideas|examples|ways|tips|reasons|steps|bullet points|"
    r"bullets|points|names|questions|facts|options|features|benefits|suggestions)\b")
_ONE_WORD = re.compile(r"\b(?:one|single|1)[\s-]word\b|\byes or no\b|\btrue or false\b")
_BRIEF_CUE = re.compile(r"\b(?:briefly|brief|concise(?:ly)?|short|shortly|in short|quick(?:ly)?|"
                        r"succinct(?:ly)?|tl;?dr|one sentence|a sentence|one line)\b")
_DETAIL_CUE = re.compile(r"\b(?:in detail|detailed|comprehensive(?:ly)?|thorough(?:ly)?|"
                         r"in depth|in-depth|elaborate|exhaustive(?:ly)?|long|lengthy)\b")
_GREETING = re.compile(
    r"^\W*(?:hi|hello|hey|hiya|howdy|yo|greetings|good (?:morning|afternoon|evening)|"
    r"thanks|thank you|how are you|how's it going|what's up|sup)\b|"
    r"\bsay (?:hi|hello|hey|goodbye|bye|something)\b")
_KIND_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("summary", re.compile(r"\b(?:summari[sz]e|summary|tl;?dr|sum up|recap)\b")),
    ("rewrite", re.compile(r"\b(?:translate|rephrase|paraphrase|rewrite|reword|proofread|"
                           r"(?:correct|fix) (?:the |my )?(?:grammar|spelling))\b")),
    ("code", re.compile(r"```|\b(?:code|function|script|program|implement|refactor|debug|"
                        r"python|javascript|typescript|java|c\+\+|c#|rust|golang|sql|regex|"
                        r"bash|html|css|unit tests?|stack trace|compile|algorithm)\b")),
    ("math", re.compile(r"\b(?:solve|prove|calculate|compute|integral|derivative|equation|"
                        r"probability|theorem)\b|\d+\s*[-+*/^×÷]\s*\d+")),
    ("long_form", re.compile(r"\b(?:essay|story|article|report|blog post|novel|chapter|"
                             r"speech|cover letter|short story|screenplay|fan ?fiction)\b")),
    ("extraction", re.compile(r"\b(?:extract|json|parse|classify|label|categori[sz]e|"
                              r"sentiment)\b")),
    ("list", re.compile(r"\b(?:list|enumerate|bullet points?|brainstorm)\b|"
                        r"\b(?:some|a few|several) (?:ideas|examples|ways|tips|reasons)\b")),
    ("explanation", re.compile(r"\b(?:explain|why|how does|how do|how to|describe|"
                               r"what is the difference|compare|teach me|walk me through|"
                               r"what are the (?:pros|benefits|advantages))\b")),
)
_FACTUAL = re.compile(r"^\W*(?:what|who|when|where|which|how many|how much|how old|how far|"
                      r"how long|is|are|does|do|did|can|was|were)\b")
_CODE_TEXT = re.compile(r"^\s*(?:def |class |import |from \S+ import|function |const |let |"
                        r"var |#include|package |public |private |func |fn |//|#!)|"
                        r"[;{}]\s*$|^\s{2,}\S", re.M)
_CAP_NUMBER = 100_000


def _number(s: str) -> int:
    return min(_CAP_NUMBER, int(s) if s.isdigit() else _NUMBERS.get(s, 0))


def _window(text: str) -> str:
    if len(text) > 2 * READ_CHARS:
        text = text[:READ_CHARS] + "\n" + text[-READ_CHARS:]
    return text.lower()


def read_task(user_text: str, *, completion: bool = False) -> Task:
    """The :class:`Task` of a request whose last user text is ``user_text`` (``completion``:
    a legacy ``/v1/completions`` prompt, continued rather than answered)."""
    if not user_text:
        return CONVERSATION
    if len(user_text) <= MEMO_CHARS:  # (harnesses resend the same prompts: read once)
        return _read_memo(user_text, completion)
    return _read(_window(user_text), completion)


MEMO_CHARS = 512  # texts up to this long are remembered (MEMO_ENTRIES of them: ~1 MiB)
MEMO_ENTRIES = 2048


@lru_cache(maxsize=MEMO_ENTRIES)
def _read_memo(user_text: str, completion: bool) -> Task:
    return _read(user_text.lower(), completion)


# Each pattern runs only when the text has one of its trigger words (one pass splits the text
# into words; most prompts then skip most patterns)
_TOKEN = re.compile(r"[a-z0-9'#+]+")
_T_BRIEF = frozenset("briefly brief concise concisely short shortly quick quickly succinct "
                     "succinctly tl tldr sentence line".split())
_T_DETAIL = frozenset("detail detailed comprehensive comprehensively thorough thoroughly "
                      "depth in-depth elaborate exhaustive exhaustively long lengthy".split())
_T_ONE_WORD = frozenset("word no false".split())
_T_GREETING = frozenset("hi hello hey hiya howdy yo greetings good thanks thank how how's "
                        "what's sup say".split())
_T_KIND = {
    "summary": frozenset("summarize summarise summary tl tldr sum recap".split()),
    "rewrite": frozenset("translate rephrase paraphrase rewrite reword proofread correct "
                         "fix".split()),
    "code": frozenset("code function script program implement refactor debug python "
                      "javascript typescript java c c++ c# rust golang sql regex bash html css "
                      "unit stack compile algorithm".split()),
    "math": frozenset("solve prove calculate compute integral derivative equation probability "
                      "theorem".split()),
    "long_form": frozenset("essay story article report blog novel chapter speech cover "
                           "screenplay fan fanfiction".split()),
    "extraction": frozenset("extract json parse classify label categorize categorise "
                            "sentiment".split()),
    "list": frozenset("list enumerate bullet bullets brainstorm some few several".split()),
    "explanation": frozenset("explain why how describe what compare teach walk".split()),
}
_T_UNITS = frozenset("word words sentence sentences paragraph paragraphs paras".split())
_T_ITEMS = frozenset("list give name suggest provide generate top enumerate items things ideas "
                     "examples ways tips reasons steps bullet bullets points names questions "
                     "facts options features benefits suggestions".split())
_DIGIT = re.compile(r"\d")


def _read(text: str, completion: bool) -> Task:
    if completion and _CODE_TEXT.search(text):
        return CONTINUATION
    words = set(_TOKEN.findall(text))
    if words & _T_ONE_WORD and _ONE_WORD.search(text):
        return Task("one_word")
    factor = 1.0
    if words & _T_BRIEF and _BRIEF_CUE.search(text):
        factor *= _BRIEF
    if words & _T_DETAIL and _DETAIL_CUE.search(text):
        factor *= _DETAIL
    kind = "conversation"
    if len(text) <= 80 and words & _T_GREETING and _GREETING.search(text):
        kind = "greeting"
    else:
        for name, pat in _KIND_PATTERNS:
            if (words & _T_KIND[name] or (name == "code" and "```" in text)
                    or (name == "math" and _DIGIT.search(text))) and pat.search(text):
                kind = name
                break
        else:
            if len(text) <= 200 and _FACTUAL.search(text):
                kind = "factual"
    target: float | None = None
    if words & _T_UNITS:
        if (m := _WORDS_CUE.search(text)) and (n := _number(m.group(1))):
            target = n / _WORDS_PER_TOKEN
        elif (m := _SENTENCES_CUE.search(text)) and (n := _number(m.group(1))):
            target = n * _PER_SENTENCE
        elif (m := _PARAGRAPHS_CUE.search(text)) and (n := _number(m.group(1))):
            target = n * _PER_PARAGRAPH
    if target is None and words & _T_ITEMS and (m := _ITEMS_CUE.search(text)) \
            and (n := _number(m.group(1) or m.group(2))):
        target = n * _PER_ITEM + 15
        if kind == "conversation":
            kind = "list"
    if target is not None:  # an explicit length overrides "briefly"/"in detail"
        factor = 1.0
    return Task(kind, target, factor)


# ------------------------------------------------------------------------------------------
# Drawing lengths
# ------------------------------------------------------------------------------------------

def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return median * math.exp(rng.gauss(0.0, sigma)) if sigma > 0 else median


def natural_length(task: Task, rng: random.Random, *, prompt_tokens: int, user_chars: int,
                   verbosity: float = 1.0) -> float:
    """The natural length of the visible answer (tokens, unclipped) for ``task``."""
    if task.target is not None:
        return _lognormal(rng, task.target, _CUE_SIGMA) * verbosity
    spec = KINDS[task.kind]
    hist = _HIST.get(task.kind)
    if hist is not None:
        n: float = hist.draw(rng)
    elif "items" in spec:
        n = _lognormal(rng, spec["items"] * _PER_ITEM + 15, 0.3)
    elif "ratio" in spec:
        n = _lognormal(rng, spec["ratio"] * prompt_tokens, spec["sigma"])
    elif "ratio_of_user" in spec:  # (characters / 4: the user's text is not tokenized again)
        n = _lognormal(rng, spec["ratio_of_user"] * user_chars / 4.0, spec["sigma"])
    else:
        n = _lognormal(rng, spec["median"], spec["sigma"])
    if "min" in spec:
        n = min(spec["max"], max(spec["min"], n))
    return n * task.factor * verbosity


def reasoning_length(task: Task, effort: str, rng: random.Random) -> int:
    """Hidden reasoning tokens for ``task`` at ``effort`` (before any limit): the kind's
    figure at effort ``medium`` times the effort's factor, log-normal (sigma 0.5, within
    a quarter and four times the median)."""
    factor = EFFORT_FACTOR.get(effort, 1.0)
    base = KINDS[task.kind].get("reasoning", 300)
    if task.kind == "code_continuation" or factor <= 0:
        return 0
    if base <= 0:
        base = KINDS["conversation"]["reasoning"]
    spread = min(4.0, max(0.25, math.exp(rng.gauss(0.0, 0.5))))
    return int(round(base * factor * spread))


# ------------------------------------------------------------------------------------------
# trace:FILE
# ------------------------------------------------------------------------------------------

class TraceError(ValueError):
    """A length trace that cannot be used; the message names the file and the line."""


class Trace:
    """Rows of (input tokens, output tokens), sorted by input: a length for a prompt of ``n``
    tokens is drawn from the :data:`TRACE_NEIGHBOURS` rows of the nearest input sizes."""

    __slots__ = ("inputs", "outputs", "path")

    def __init__(self, rows: list[tuple[int, int]], path: str) -> None:
        rows.sort()
        self.inputs = [r[0] for r in rows]
        self.outputs = [r[1] for r in rows]
        self.path = path

    def draw(self, rng: random.Random, prompt_tokens: int) -> int:
        inputs = self.inputs
        n = len(inputs)
        k = min(TRACE_NEIGHBOURS, n)
        lo = hi = bisect.bisect_left(inputs, prompt_tokens)
        while hi - lo < k:  # grow [lo, hi) towards the nearer neighbour: the k nearest rows
            if lo > 0 and (hi >= n or prompt_tokens - inputs[lo - 1] <= inputs[hi] - prompt_tokens):
                lo -= 1
            else:
                hi += 1
        return self.outputs[lo + int(rng.random() * k)]


def parse_source(mode: str) -> tuple[str, str | None]:
    """``("natural" | "exact" | "trace", path)`` of a ``--max-tokens-mode`` value
    (``cap``, the retired mode, reads as ``natural``)."""
    if mode.startswith("trace:"):
        return "trace", mode[len("trace:"):]
    return ("natural" if mode == "cap" else mode), None


def load_trace(path: str) -> Trace:
    """Read a CSV with ``ContextTokens`` and ``GeneratedTokens`` columns (the Azure LLM
    inference trace format; other columns are ignored), bounded in size and rows."""
    return _load_trace(os.path.abspath(path))


@lru_cache(maxsize=4)
def _load_trace(path: str) -> Trace:
    try:
        size = os.path.getsize(path)
        if size > TRACE_MAX_BYTES:
            raise TraceError(f"{path}: {size} bytes; a length trace is at most "
                             f"{TRACE_MAX_BYTES} bytes")
        with open(path, encoding="utf-8", newline="") as f:
            text = f.read()
    except OSError as e:
        raise TraceError(f"{path}: cannot read ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not UTF-8 text") from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise TraceError(f"{path}: empty (need a header with ContextTokens,GeneratedTokens)")
    names = [h.strip() for h in header]
    try:
        ci, gi = names.index("ContextTokens"), names.index("GeneratedTokens")
    except ValueError:
        raise TraceError(f"{path}: line 1: need the columns ContextTokens and GeneratedTokens "
                         f"(found {', '.join(names[:8])})") from None
    rows: list[tuple[int, int]] = []
    for line, rec in enumerate(reader, start=2):
        if not rec:
            continue
        if len(rows) >= TRACE_MAX_ROWS:
            raise TraceError(f"{path}: more than {TRACE_MAX_ROWS} rows")
        try:
            c, g = int(rec[ci]), int(rec[gi])
        except (ValueError, IndexError):
            raise TraceError(f"{path}: line {line}: ContextTokens and GeneratedTokens must be "
                             "integers") from None
        if c < 0 or g < 1 or g > 1_000_000:
            raise TraceError(f"{path}: line {line}: need ContextTokens >= 0 and "
                             "1 <= GeneratedTokens <= 1000000")
        rows.append((c, g))
    if not rows:
        raise TraceError(f"{path}: no rows")
    return Trace(rows, path)
