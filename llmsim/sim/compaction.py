"""Compaction blobs: the opaque ``encrypted_content`` of a Responses ``compaction`` item.

A blob stands for the turns a compaction took out of the context (everything but the user
messages: assistant messages, tool calls and their outputs, reasoning). llmsim can expand it
when it comes back as input (a later tool output may answer a call compacted away), and reads
the summary's size from its head without expanding it: a compaction item costs its summary's
tokens in the next prompt, not the tokens of what it replaced.

Layout: ``"gAAAAA"`` (the look of the real blobs) + URL-safe base64 of
``MAGIC | summary tokens (4 bytes, big-endian) | zlib(JSON list of the items)``. Not
encrypted: opaque to clients, which must not read it (as with the real API).
"""

from __future__ import annotations

import base64
import binascii
import zlib
from typing import Any

import orjson

__all__ = ["encode", "summary_tokens", "expand", "summary_size", "BlobError", "MAX_ITEMS_BYTES",
           "MAX_BLOB_CHARS"]

PREFIX = "gAAAAA"
MAGIC = b"LSC1"
_HEAD = len(MAGIC) + 4
_HEAD_CHARS = 12  # base64 characters that decode the head (9 bytes >= _HEAD)
MAX_ITEMS_BYTES = 1 << 20
"""JSON bytes of the compacted items one blob keeps: past it the oldest are dropped (a
summary forgets the distant past too), so a blob is bounded however long the context."""
MAX_BLOB_CHARS = 4 * MAX_ITEMS_BYTES
"""The longest ``encrypted_content`` accepted back (a blob llmsim made is far shorter)."""
SUMMARY_MIN, SUMMARY_MAX = 64, 4096


class BlobError(ValueError):
    """Not a compaction blob llmsim made (or damaged)."""


def summary_size(compacted_tokens: int) -> int:
    """Tokens of the summary a compaction of ``compacted_tokens`` writes (a tenth, bounded):
    its output tokens, and what its item costs in later prompts."""
    return max(SUMMARY_MIN, min(SUMMARY_MAX, compacted_tokens // 10))


def encode(items: list[dict[str, Any]], tokens: int) -> str:
    """The blob of ``items`` (oldest first) with a summary of ``tokens`` tokens."""
    kept = list(items)
    payload = orjson.dumps(kept)
    while len(payload) > MAX_ITEMS_BYTES and kept:
        # drop the oldest half of what is over the budget at a time (few re-serializations)
        over = len(payload) - MAX_ITEMS_BYTES
        drop = max(1, len(kept) * over // len(payload))
        kept = kept[drop:]
        payload = orjson.dumps(kept)
    raw = MAGIC + max(0, min(tokens, 0xFFFFFFFF)).to_bytes(4, "big") + zlib.compress(payload, 6)
    return PREFIX + base64.urlsafe_b64encode(raw).decode()


def _b64(s: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
    except (binascii.Error, ValueError):
        raise BlobError("not base64") from None


def summary_tokens(blob: Any) -> int:
    """The summary tokens a blob records (0 for anything that is not a blob: validated where
    the item is parsed, :func:`expand`)."""
    if type(blob) is not str or not blob.startswith(PREFIX):
        return 0
    try:
        head = _b64(blob[len(PREFIX):len(PREFIX) + _HEAD_CHARS])
    except BlobError:
        return 0
    if head[:len(MAGIC)] != MAGIC or len(head) < _HEAD:
        return 0
    return int.from_bytes(head[len(MAGIC):_HEAD], "big")


def expand(blob: Any) -> list[dict[str, Any]]:
    """The items a blob stands for; :class:`BlobError` if it is not one llmsim made. The
    decompressed size is bounded (:data:`MAX_ITEMS_BYTES`): no zip bomb."""
    if type(blob) is not str or not blob.startswith(PREFIX) or len(blob) > MAX_BLOB_CHARS:
        raise BlobError("not a compaction blob")
    raw = _b64(blob[len(PREFIX):])
    if raw[:len(MAGIC)] != MAGIC or len(raw) < _HEAD:
        raise BlobError("not a compaction blob")
    d = zlib.decompressobj()
    try:
        payload = d.decompress(raw[_HEAD:], MAX_ITEMS_BYTES + 1)
    except zlib.error:
        raise BlobError("damaged") from None
    if len(payload) > MAX_ITEMS_BYTES or not d.eof:
        raise BlobError("damaged")
    try:
        items = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise BlobError("damaged") from None
    if type(items) is not list or not all(type(it) is dict for it in items):
        raise BlobError("damaged")
    return items
