"""Prompt token accounting (exact with tiktoken, an estimate otherwise).

Chat messages are counted the way OpenAI documents it for its chat models: each message costs
3 tokens of framing plus its role and content (plus 1 for a ``name``), and every reply is
primed with 3 more. Tool definitions are counted as their JSON. Images cost a fixed 85 tokens
(the "low detail" price), audio and files a fixed 256: the simulator never fetches them.
"""

from __future__ import annotations

from typing import Any

import orjson

from . import tokens as tok

__all__ = ["chat_prompt_tokens", "content_text", "count_json"]

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


def chat_prompt_tokens(messages: list[dict[str, Any]], tools: list[Any] | None,
                       encoding: str) -> int:
    """Prompt tokens of a Chat Completions request."""
    total = 3
    for m in messages:
        total += 3
        total += tok.count_tokens(str(m.get("role", "")), encoding)
        text, extra = content_text(m.get("content"))
        if text:
            total += tok.count_tokens(text, encoding)
        total += extra
        if m.get("name"):
            total += 1 + tok.count_tokens(str(m["name"]), encoding)
        if m.get("tool_calls"):
            total += count_json(m["tool_calls"], encoding)
    if tools:
        total += count_json(tools, encoding)
    return total
