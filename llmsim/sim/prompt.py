"""Prompt token accounting (exact with tiktoken, an estimate otherwise).

Chat messages are counted the way OpenAI documents it for its chat models: each message costs
3 tokens of framing plus its role and content (plus 1 for a ``name``), and every reply is
primed with 3 more. Tool definitions are counted as their JSON. Responses input items are
counted alike: 3 tokens of framing per item plus its texts (:func:`input_steps`). Images cost
a fixed 85 tokens (the "low detail" price), audio and files a fixed 256: the simulator never
fetches them.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import Any

import orjson

from . import tokens as tok
from .compaction import summary_tokens
from .hosted import item_parts as hosted_parts

__all__ = ["add_counts", "chat_prompt_tokens", "chat_prompt_steps", "content_text",
           "count_json", "input_steps", "item_steps", "input_prompt_tokens",
           "cached_prefix_tokens"]

IMAGE_TOKENS = 85
BLOB_TOKENS = 256


def content_text(content: Any) -> tuple[str, int]:
    """Text of a message content (string or parts) and the fixed tokens of non-text parts."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    texts: list[str] = []
    extra = 0
    if isinstance(content, list):
        for part in content:
            if not isinstance(part, dict):
                continue
            t = part.get("type")
            if t in ("text", "input_text", "output_text"):
                texts.append(str(part.get("text", "")))
            elif t == "refusal":
                texts.append(str(part.get("refusal", "")))
            elif t in ("image_url", "input_image"):
                extra += IMAGE_TOKENS
            else:
                extra += BLOB_TOKENS
    return "\n".join(texts), extra


def count_json(obj: Any, encoding: str) -> int:
    return tok.count_tokens(orjson.dumps(obj).decode(), encoding)


def add_counts(total: int, texts: Iterable[str], encoding: str,
               cap: int | None = None) -> Generator[int, None, int]:
    """``total`` plus the tokens of ``texts``, counted stepwise (a long text chunk by chunk:
    :func:`tokens.count_tokens_steps`; a short one, the usual case, directly); with ``cap``,
    a :class:`tokens.Bound` as soon as the sum is known to exceed it (the rest is never
    tokenized)."""
    room = cap if cap is not None else 1 << 62
    for s in texts:
        if not s:
            continue
        if total > room:
            return tok.Bound(total)
        if len(s) <= tok.CHUNK_CHARS:
            total += tok.count_tokens(s, encoding)
            yield len(s)
            continue
        c = yield from tok.count_tokens_steps(s, encoding, room - total)
        total += c
        if type(c) is tok.Bound:
            return tok.Bound(total)
    return total


def chat_prompt_steps(messages: list[dict[str, Any]], tools: list[Any] | None, encoding: str,
                      cap: int | None = None) -> Generator[int, None, int]:
    """Prompt tokens of a Chat Completions request, counted stepwise (:func:`add_counts`):
    with ``cap``, a :class:`tokens.Bound` once the prompt is known not to fit in ``cap``."""
    room = cap if cap is not None else 1 << 62
    count = tok.count_tokens
    short = tok.CHUNK_CHARS
    total = 3
    for m in messages:
        if total > room:
            return tok.Bound(total)
        total += 3 + count(str(m.get("role", "")), encoding)
        text, extra = content_text(m.get("content"))
        total += extra
        name = m.get("name")
        if name:
            total += 1
        calls = m.get("tool_calls")
        if len(text) <= short and not calls and (not name or len(str(name)) <= short):
            total += count(text, encoding) + (count(str(name), encoding) if name else 0)
            yield len(text) + 1  # (the usual message: no generator; a place to pause)
            continue
        total = yield from add_counts(total, (
            text, str(name) if name else "", orjson.dumps(calls).decode() if calls else ""),
            encoding, cap)
        if type(total) is tok.Bound:
            return total
    if tools:
        total = yield from add_counts(total, (orjson.dumps(tools).decode(),), encoding, cap)
    return total


def chat_prompt_tokens(messages: list[dict[str, Any]], tools: list[Any] | None,
                       encoding: str) -> int:
    """Prompt tokens of a Chat Completions request."""
    return tok.run_steps(chat_prompt_steps(messages, tools, encoding))


# Responses input items

Item = dict[str, Any]


def _item_parts(it: Item, enc: str) -> tuple[int, tuple[str, ...]]:
    """An input item's fixed tokens (3 of framing, like chat, its role, non-text parts) and
    the texts whose tokens it adds."""
    t = it.get("type")
    if t == "message":
        text, extra = content_text(it.get("content"))
        return 3 + tok.count_tokens(str(it.get("role", "")), enc) + extra, (text,)
    if t in ("function_call", "custom_tool_call"):
        return 3, (it.get("name", ""), it.get("arguments") or it.get("input") or "")
    if t in ("function_call_output", "custom_tool_call_output"):
        out = it.get("output")
        if isinstance(out, str):
            return 3, (out,)
        text, extra = content_text(out)
        return 3 + extra, (text,)
    if t == "reasoning":
        return 3, tuple(s.get("text", "") for s in it.get("summary") or ())
    if t == "compaction":  # its summary's tokens (llmsim.sim.compaction)
        return 3 + summary_tokens(it.get("encrypted_content")), ()
    return hosted_parts(it)  # hosted tools' items (llmsim.sim.hosted)


def _item_quick(it: Item, enc: str) -> tuple[int, int] | None:
    """(tokens, characters) of an input item whose texts are all short (the usual item,
    counted directly); None for one with a long text (:func:`item_steps`)."""
    total, texts = _item_parts(it, enc)
    size = 1
    for x in texts:
        if len(x) > tok.CHUNK_CHARS:
            return None
        if x:
            total += tok.count_tokens(x, enc)
            size += len(x)
    return total, size


def item_steps(it: Item, enc: str, cap: int | None = None) -> Generator[int, None, int]:
    """Tokens of one input item, counted stepwise (:func:`add_counts`: a
    :class:`~llmsim.sim.tokens.Bound` above ``cap``)."""
    fixed, texts = _item_parts(it, enc)
    return (yield from add_counts(fixed, texts, enc, cap))


def input_steps(history: list[Item], items: list[Item], instructions: str | None,
                tools: list[Item] | None, enc: str, cap: int, room: int,
                truncate: bool) -> Generator[int, None, tuple[int, int, int]]:
    """Input tokens of a Responses request (``history`` then ``items``), each part counted
    once, and nothing past ``cap``: returns ``(total, first, prefix)``.

    ``total`` is the input's tokens, or a :class:`~llmsim.sim.tokens.Bound` above ``cap``
    when it cannot fit (the rest is never tokenized). ``first`` is the first ``history`` item
    kept: with ``truncate`` (truncation "auto") the oldest items that do not fit in ``room``
    are dropped, counting from the newest item back (suffix sums: every item counted once,
    the dropped ones mostly never). ``prefix`` is the kept history with the instructions and
    tools, the cacheable prefix. Each step yields the characters it tokenized."""
    base = 3
    if instructions or tools:
        base = yield from add_counts(3 + (4 if instructions else 0), (
            instructions or "", orjson.dumps(tools).decode() if tools else ""), enc, cap)
    total = base
    for it in items:
        if total > cap:
            return tok.Bound(total), len(history), base
        q = _item_quick(it, enc)
        if q is None:
            c = yield from item_steps(it, enc, cap - total)
        else:
            c = q[0]
            yield q[1]
        total += c
        if type(c) is tok.Bound:
            return tok.Bound(total), len(history), base
    if type(base) is tok.Bound:
        return tok.Bound(total), len(history), base
    kept = 0
    first = len(history)
    if truncate:
        while first > 0 and total + kept <= room:
            it = history[first - 1]
            q = _item_quick(it, enc)
            if q is None:
                c = yield from item_steps(it, enc, room - total - kept)
            else:
                c = q[0]
                yield q[1]
            if total + kept + c > room:
                break
            kept += c
            first -= 1
    else:
        first = 0
        for it in history:
            if total + kept > cap:
                return tok.Bound(total + kept), 0, base + kept
            q = _item_quick(it, enc)
            if q is None:
                c = yield from item_steps(it, enc, cap - total - kept)
            else:
                c = q[0]
                yield q[1]
            kept += c
            if type(c) is tok.Bound:
                return tok.Bound(total + kept), 0, base + kept
    return total + kept, first, base + kept


def input_prompt_tokens(items: list[Item], instructions: str | None,
                        tools: list[Item] | None, enc: str) -> int:
    """Input tokens of a Responses request: 3 per item of framing plus its text, like chat."""
    return tok.run_steps(input_steps([], items, instructions, tools, enc, 1 << 62, 1 << 62,
                                     False))[0]


def cached_prefix_tokens(prefix: int) -> int:
    """Prompt caching as the real API reports it: prefixes of 1024+ tokens, in 128 steps."""
    return 0 if prefix < 1024 else prefix // 128 * 128
