"""The JSON a prompt describes: for ``response_format: json_object``, a real model answers
with the object its instructions ask for. This finds that description in the prompt text, in
bounded work, as a JSON Schema the generator (:mod:`llmsim.sim.schema`) can fill:

1. a JSON Schema in the prompt (fenced ```json or bare; e.g. instructor's ``Mode.JSON`` /
   ``MD_JSON`` system message carries the pydantic model's ``model_json_schema()``): used
   as is;
2. else an example object (``{"name": "...", "age": 0}``): a schema with the example's keys
   and value types, every key required;
3. else key names the text lists in backticks or quotes next to the words "key", "field" or
   "property" ("respond in JSON with `setup` and `punchline` keys", LangChain's json_mode
   docs): an object of those keys with string values;
4. else key names in plain words after the word JSON ("extract a person as JSON with name
   and age"): an object of those keys, typed by name (``age`` an integer, ``price`` a
   number, ``is_...`` a boolean, the rest strings);
5. else None (the caller keeps its default object).

Bounds: at most :data:`MAX_SCAN_CHARS` of prompt text is read, in one linear pass that finds
the top-level ``{...}`` spans (string-aware, so braces inside strings do not count); at most
:data:`MAX_CANDIDATES` spans of at most :data:`MAX_SPAN_CHARS` each are parsed. Generation is
then paid from the request's schema work meter like any schema.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import orjson

__all__ = ["described_schema", "requested_json", "json_hint", "MAX_SCAN_CHARS",
           "MAX_CANDIDATES", "MAX_SPAN_CHARS"]

MAX_SCAN_CHARS = 256 * 1024
MAX_CANDIDATES = 32
MAX_SPAN_CHARS = 64 * 1024
MAX_KEYS = 32
_SCHEMA_KEYS = ("properties", "$defs", "definitions", "anyOf", "oneOf", "allOf", "items")
_NAMED = re.compile(r"[`'\"]([A-Za-z_][A-Za-z0-9_]{0,63})[`'\"]")
_KEY_WORDS = re.compile(r"\b(keys?|fields?|propert(?:y|ies)|attributes?)\b", re.I)


def _spans(text: str) -> Iterable[str]:
    """Top-level ``{...}`` spans of ``text`` in one pass (strings skipped)."""
    depth = 0
    start = -1
    in_str = False
    esc = False
    for i, ch in enumerate(text):
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            if depth:
                in_str = True
        elif ch == "{":
            if depth == 0:
                start = i
            depth += 1
        elif ch == "}" and depth:
            depth -= 1
            if depth == 0 and i + 1 - start <= MAX_SPAN_CHARS:
                yield text[start:i + 1]


def _is_schema(obj: dict[str, Any]) -> bool:
    t = obj.get("type")
    return any(k in obj for k in _SCHEMA_KEYS) and (t in (None, "object", "array")
                                                    or isinstance(t, list))


def _infer(value: Any, depth: int = 0) -> dict[str, Any]:
    """A schema for values shaped like ``value`` (an example object)."""
    if depth > 16:
        return {}
    if isinstance(value, dict):
        keys = list(value)[:MAX_KEYS * 4]
        return {"type": "object", "properties": {k: _infer(value[k], depth + 1) for k in keys},
                "required": keys, "additionalProperties": False}
    if isinstance(value, list):
        return {"type": "array", "items": _infer(value[0], depth + 1) if value else {},
                "minItems": min(len(value), 3), "maxItems": max(1, min(len(value), 5))}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if value is None:
        return {"type": "null"}
    return {"type": "string"}


def described_schema(texts: Iterable[str]) -> dict[str, Any] | None:
    """The schema of the JSON the prompt ``texts`` describe (see the module doc), or None."""
    budget = MAX_SCAN_CHARS
    tries = MAX_CANDIDATES
    schema: dict[str, Any] | None = None
    example: dict[str, Any] | None = None
    named: list[str] = []
    for text in texts:
        if budget <= 0:
            break
        text = text[:budget]
        budget -= len(text)
        for span in _spans(text):
            if tries <= 0:
                break
            tries -= 1
            try:
                obj = orjson.loads(span)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(obj, dict) or not obj:
                continue
            if _is_schema(obj):
                if schema is None or len(span) > len(orjson.dumps(schema)):
                    schema = obj
            elif example is None:
                example = obj
        if schema is None and example is None and len(named) < MAX_KEYS:
            for sentence in re.split(r"(?<=[.!?\n])", text):
                if _KEY_WORDS.search(sentence):
                    for k in _NAMED.findall(sentence):
                        if k not in named and k.lower() != "json":
                            named.append(k)
    if schema is not None:
        return schema
    if example is not None:
        return _infer(example)
    if named:
        keys = named[:MAX_KEYS]
        return {"type": "object", "properties": {k: {"type": "string"} for k in keys},
                "required": keys, "additionalProperties": False}
    worded = _worded_keys(texts)
    if worded:
        return {"type": "object", "properties": {k: _typed(k) for k in worded},
                "required": worded, "additionalProperties": False}
    return None


# "JSON with name and age", "a JSON object containing the title, author and year": key names
# in plain words after the word JSON (each part 1-3 words, joined with "_")
_PLAIN = re.compile(r"(?i)\bjson\b[^.!?\n]{0,60}?\b(?:with|containing|having|including|"
                    r"of|for)\s+(?:the\s+)?(?:(?:keys?|fields?|properties|attributes)"
                    r"\s*:?\s+)?([^.!?\n]{1,300})")
_PART = re.compile(r"\s*,\s*(?:and\s+|or\s+)?|\s+and\s+|\s+or\s+")
_ARTICLE = re.compile(r"(?i)^(?:the|a|an|their|his|her|its|your)\s+")
_INTEGER = re.compile(r"(?:^|_)(?:age|count|year|years|number|num|quantity|qty|id|rank|"
                      r"day|month|pages|population)(?:$|_)")
_NUMBER = re.compile(r"(?:^|_)(?:price|amount|score|rating|latitude|longitude|lat|lon|"
                     r"weight|height|temperature|percent|percentage|cost|salary)(?:$|_)")
_BOOLEAN = re.compile(r"^(?:is|has|can|should|was)_")


def _worded_keys(texts: Iterable[str]) -> list[str]:
    for text in texts:
        m = _PLAIN.search(text[:MAX_SCAN_CHARS])
        if m is None:
            continue
        keys: list[str] = []
        listed = re.split(r"[:;(\[{]", m.group(1), maxsplit=1)[0]  # (the data may follow)
        for part in _PART.split(listed.strip()):
            words = _ARTICLE.sub("", part.strip()).split()
            if not 1 <= len(words) <= 3 or not all(w.isalpha() for w in words):
                break
            key = "_".join(w.lower() for w in words)
            if key not in keys and key != "json":
                keys.append(key)
            if len(keys) >= MAX_KEYS:
                break
        if keys:
            return keys
    return []


def _typed(key: str) -> dict[str, Any]:
    """A plain-worded key's likely type, from its name (age: integer, price: number, ...)."""
    if _INTEGER.search(key):
        return {"type": "integer", "minimum": 0, "maximum": 120 if "age" in key else 10_000}
    if _NUMBER.search(key):
        return {"type": "number"}
    if _BOOLEAN.search(key):
        return {"type": "boolean"}
    return {"type": "string"}


# "respond in JSON", "return ... json", "JSON format/object/only", "```json": the prompt asks
# for a JSON answer even without response_format (instructor's MD_JSON mode, hand-written
# prompts); a real model then answers with the JSON it describes
_ASKS = re.compile(r"(?i)\b(?:return|respond|answer|reply|output|provide|format|give)\b"
                   r"[^\n]{0,120}?\bjson\b|\bjson[ _-]?(?:format|object|only|schema|"
                   r"code ?block)\b|```json")
_FENCE = re.compile(r"(?i)code ?block|```json")


def json_hint(body: bytes) -> bool:
    """Cheap test on the raw request body: could the prompt ask for JSON at all?"""
    return b"json" in body or b"JSON" in body or b"Json" in body


def requested_json(texts: list[str]) -> tuple[dict[str, Any], bool] | None:
    """When the prompt asks for a JSON answer and describes it: ``(schema, fenced)``, where
    ``fenced`` means the prompt asks for a ```json code block. None otherwise."""
    texts = [t[:MAX_SCAN_CHARS] for t in texts]
    if not any(_ASKS.search(t) for t in texts):
        return None
    schema = described_schema(texts)
    if schema is None:
        return None
    return schema, any(_FENCE.search(t) for t in texts)
