"""Prompt token accounting (exact with tiktoken, an estimate otherwise).

Chat messages are counted the way OpenAI documents it for its chat models: each message costs
3 tokens of framing plus its role and content (plus 1 for a ``name``), and every reply is
primed with 3 more. Tool definitions are counted as their JSON. Images cost a fixed 85 tokens
(the "low detail" price), audio and files a fixed 256: the simulator never fetches them.
"""

from __future__ import annotations

from collections.abc import Generator, Iterable
from typing import Any

import orjson

from . import tokens as tok

__all__ = ["add_counts", "chat_prompt_tokens", "chat_prompt_steps", "content_text",
           "count_json"]

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
