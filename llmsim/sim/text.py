"""What the simulated model says: output length, text pieces (one token each), reasoning size.

Every piece of generated text is exactly one token in cl100k_base and o200k_base (see
:mod:`llmsim.sim.tokens`), so a stream sends one token per content chunk and the reported
``completion_tokens`` is the number of pieces. Echoed or fixed text is split with the real
tokenizer when tiktoken is available (exact), otherwise with a documented estimate.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from . import tokens as tok

__all__ = ["TextOut", "draw_length", "generate", "answer", "apply_stop", "reasoning_tokens",
           "EFFORT_MULTIPLIER", "summary_words", "most_tokens"]

# R4.3.1: reasoning tokens as a multiple of the visible output tokens
EFFORT_MULTIPLIER = {"none": 0.0, "minimal": 0.5, "low": 1.5, "medium": 3.0, "high": 6.0,
                     "xhigh": 10.0}
# R3.2.2: summary length as a share of reasoning tokens
SUMMARY_SHARE = {"concise": 0.05, "auto": 0.10, "detailed": 0.15}


@dataclass(slots=True)
class TextOut:
    """Generated text as pieces, its exact token count, and why it ended."""

    pieces: list[str]
    tokens: int
    finish: str  # "stop" | "length"
    stop: str | None = None  # the stop sequence that ended it (cut before it)

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def draw_length(rng: random.Random, mean: float, sigma: float, lo: int, hi: int) -> int:
    """A completion length from a log-normal with the given mean (not median)."""
    if sigma <= 0:
        n = mean
    else:
        mu = math.log(mean) - sigma * sigma / 2.0
        # rng.lognormvariate(mu, sigma), inlined (the same draws and value: CPython's
        # normalvariate, Kinderman-Monahan; two calls fewer on the hot path)
        rand = rng.random
        log = math.log
        while True:
            u1 = rand()
            u2 = 1.0 - rand()
            z = _NV_MAGICCONST * (u1 - 0.5) / u2
            if z * z / 4.0 <= -log(u2):
                break
        n = math.exp(mu + z * sigma)
    return int(min(hi, max(lo, round(n))))


_NV_MAGICCONST = 4 * math.exp(-0.5) / math.sqrt(2.0)  # random.NV_MAGICCONST


def generate(mode: str, rng: random.Random, *, length: int, limit: int | None,
             source: str = "", encoding: str = "o200k_base") -> TextOut:
    """Text for one choice.

    ``length`` is the natural length for generated modes (lorem, sequence); ``limit`` is the
    hard cap (max_tokens). Echo/fixed text has its own length and is cut at ``limit``.
    """
    if mode in ("echo", "fixed"):
        # (a long source is split only as far as the limit needs)
        pieces, count = tok.split_pieces_counted(source, encoding, stop_after=limit)
        if not pieces:
            pieces, count = ["."], 1
        if limit is not None and count > limit:
            pieces, count = _cut(pieces, limit, encoding), limit
            return TextOut(pieces, count, "length")
        return TextOut(pieces, count, "stop")
    n = length
    finish = "stop"
    if limit is not None and n >= limit:
        n, finish = limit, "length"
    if mode == "sequence":
        pieces = tok.sequence_pieces(n)
    else:
        pieces = tok.lorem_pieces(n, rng)
    return TextOut(pieces, n, finish)


def answer(cfg: Any, rng: random.Random, *, natural: int, limit: int | None,
           user_text: Callable[[], str], encoding: str,
           json_source: str | None = None, exact: bool | None = None) -> TextOut:
    """The visible answer in the configured text mode (``cfg.text``), shared by every API.

    ``json_source`` (structured output) replaces the mode; ``user_text`` is only called for
    ``echo``. With ``max_tokens_mode = "exact"`` (or ``exact=True``, e.g. vLLM's
    ``ignore_eos``) generated modes fill the limit exactly.
    """
    if json_source is not None:
        return generate("fixed", rng, length=natural, limit=limit, source=json_source,
                        encoding=encoding)
    mode = cfg.text
    source = ""
    if mode == "echo":
        source = user_text() or "."
    elif mode == "fixed":
        source = cfg.fixed_text
    if exact is None:
        exact = cfg.max_tokens_mode == "exact"
    length = limit if (limit is not None and mode in ("lorem", "sequence") and exact) else natural
    return generate(mode, rng, length=length, limit=limit, source=source, encoding=encoding)


def most_tokens(cfg: Any, limit: int | None, *, min_tokens: int = 0, echoed: int = 0) -> int:
    """The most tokens :func:`answer` can give one choice (what the per-request work bound,
    ``api.validate.check_request_work``, multiplies): the request's ``limit`` when it sets
    one, else the longest drawn length (``output_tokens_max``) raised by ``min_tokens`` and,
    in echo mode, by ``echoed`` (the echoed text's tokens: at most the prompt's)."""
    if limit is not None:
        return limit
    top = max(cfg.output_tokens_max, min_tokens)
    return max(top, echoed) if cfg.text == "echo" else top


def _cut(pieces: list[str], limit: int, encoding: str) -> list[str]:
    # pieces are one token each except rare merged multi-byte pieces; count as we go
    out: list[str] = []
    total = 0
    for p in pieces:
        c = 1 if len(p) < 3 or p.isascii() else tok.count_tokens(p, encoding)
        if total + c > limit:
            break
        out.append(p)
        total += c
    return out


def apply_stop(out: TextOut, stops: Sequence[str]) -> TextOut:
    """Cut the text before the first stop sequence (which is not returned), like the API."""
    if not stops or out.finish == "length" and not out.pieces:
        return out
    text = out.text
    hits = [(i, s) for s in stops if s and (i := text.find(s)) >= 0]
    if not hits:
        return out
    idx, matched = min(hits)
    kept: list[str] = []
    pos = 0
    for p in out.pieces:
        if pos + len(p) <= idx:
            kept.append(p)
            pos += len(p)
        else:
            if idx > pos:
                kept.append(p[: idx - pos])
            break
    return TextOut(kept, len(kept), "stop", matched)


def reasoning_tokens(rng: random.Random, visible: int, effort: str | None) -> int:
    """Hidden reasoning tokens for ``visible`` output tokens at ``effort`` (R4.3.1), ±20%."""
    mult = EFFORT_MULTIPLIER.get(effort or "medium", 3.0)
    if mult <= 0:
        return 0
    base = max(visible, 16) * mult
    return max(1, int(round(base * rng.uniform(0.8, 1.2))))


def summary_words(reasoning: int, mode: str | None) -> int:
    """Summary length in tokens for a reasoning summary mode (R3.2.2); 0 when not requested."""
    share = SUMMARY_SHARE.get(mode or "", 0.0)
    if share <= 0 or reasoning <= 0:
        return 0
    return max(3, int(round(reasoning * share)))
