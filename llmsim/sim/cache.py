"""Prompt caching as the hosted APIs report it: a content-addressed prefix cache per model.

A prompt is cut into *segments* in the order the model reads it (tools, instructions or
system, then each message; a long message in :data:`SEGMENT_CHARS`-character pieces). Each
segment boundary gets a chained digest (BLAKE2b of the previous digest and the segment's
bytes) and its cumulative token count; the cache keeps digests only, never prompt text.

- **OpenAI** (:meth:`PromptCache.openai`): automatic from :data:`OPENAI_MIN_TOKENS` prompt
  tokens, hits reported in :data:`OPENAI_BLOCK`-token increments of the longest cached prefix;
  ``prompt_cache_key`` keeps a separate namespace (it routes requests to the same cache);
  an entry lives :data:`OPENAI_TTL_S` after its last use (``prompt_cache_retention: "24h"``:
  a day).
- **Anthropic** (:meth:`PromptCache.anthropic`): explicit ``cache_control`` breakpoints (up to
  four; ``ttl`` 5m or 1h); a breakpoint's prefix is written when it reaches the model's minimum
  (smaller ones are silently not cached); a read is the longest cached prefix at a block
  boundary at most :data:`LOOKBACK_BLOCKS` blocks before a breakpoint; usage reports the read,
  the written remainder up to the last breakpoint, and the uncached rest.

Token counts at segment boundaries are apportioned from the prompt's counted total by
characters (the prompt is not tokenized twice). The store is bounded by a byte budget
(:data:`ENTRY_BYTES` per digest, least recently used evicted first); nothing here does I/O:
the caller passes ``now``.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from hashlib import blake2b
from typing import Any

import orjson

__all__ = ["PromptCache", "Segments", "CacheUse", "segments_of", "OPENAI_MIN_TOKENS",
           "OPENAI_BLOCK", "OPENAI_TTL_S", "OPENAI_TTL_24H_S", "ANTHROPIC_TTL_S",
           "LOOKBACK_BLOCKS", "ENTRY_BYTES", "SEGMENT_CHARS"]

OPENAI_MIN_TOKENS = 1024
OPENAI_BLOCK = 128
# in-memory retention: Azure documents eviction after 5-10 minutes idle (always within an hour)
OPENAI_TTL_S = 600.0
OPENAI_TTL_24H_S = 86400.0
ANTHROPIC_TTL_S = {"5m": 300.0, "1h": 3600.0}
LOOKBACK_BLOCKS = 20  # Anthropic checks this many block boundaries before each breakpoint
SEGMENT_CHARS = 1024  # a long text is hashed in pieces of this many characters
ENTRY_BYTES = 200  # what one cached digest costs in memory (key, value tuple, dict slot)
DIGEST = 16


@dataclass(slots=True)
class Segments:
    """A prompt's segment boundaries: ``digests[i]`` names the prefix up to and including
    segment ``i``; ``tokens[i]`` is that prefix's token count; ``marks`` lists the segments
    that end a caller-marked block (Anthropic's ``cache_control``) with their TTL."""

    digests: list[bytes]
    tokens: list[int]
    block_ends: list[int]  # the segment index that ends each block (Anthropic's boundaries)
    marks: list[tuple[int, float]]  # (block index, ttl seconds)


@dataclass(slots=True)
class CacheUse:
    """What the cache did for one request: tokens read from it and written to it."""

    read: int = 0
    written: int = 0
    written_1h: int = 0


NO_USE = CacheUse()
SHARED_MARKS = 64  # segment boundaries of one prompt written to the shared store, at most


def _marks(n: int) -> list[int]:
    """The segment indexes a prompt of ``n`` segments shares with other processes: evenly
    spread, the last always (a shared hit is as fine-grained as the spread)."""
    if n <= 0:
        return []
    step = -(-n // SHARED_MARKS)
    out = list(range(step - 1, n, step))
    if not out or out[-1] != n - 1:
        out.append(n - 1)
    return out


def _blocks_bytes(blocks: Iterable[object]) -> list[bytes]:
    out = []
    for b in blocks:
        out.append(b.encode() if isinstance(b, str) else orjson.dumps(
            b, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS))
    return out


def segments_of(namespace: str, blocks: Sequence[object], prompt_tokens: int,
                marks: Sequence[tuple[int, float]] = ()) -> Segments:
    """The segments of a prompt given as ``blocks`` in reading order (each a string or a
    JSON value: a message, a tool, a content block), ``namespace`` (model, cache key) folded
    into the first digest. Token counts are ``prompt_tokens`` apportioned by bytes."""
    raw = _blocks_bytes(blocks)
    total = sum(len(b) for b in raw) or 1
    h = blake2b(namespace.encode(), digest_size=DIGEST).digest()
    digests: list[bytes] = []
    tokens: list[int] = []
    ends: list[int] = []
    seen = 0
    for b in raw:
        for i in range(0, max(len(b), 1), SEGMENT_CHARS):
            piece = b[i:i + SEGMENT_CHARS]
            h = blake2b(h + piece, digest_size=DIGEST).digest()
            seen += len(piece)
            digests.append(h)
            tokens.append(prompt_tokens * seen // total)
        ends.append(len(digests) - 1)
    return Segments(digests, tokens, ends, list(marks))


class PromptCache:
    """The prefix cache of one server (all models: the model is in the namespace)."""

    def __init__(self, budget_bytes: int, shared: Any = None) -> None:
        self.budget_bytes = budget_bytes
        self.max_entries = max(0, budget_bytes // ENTRY_BYTES)
        # the prefixes other processes cached (--workers: sqlite; --state: Redis): a
        # SnapshotStore of digest hex -> (expiry, tokens), read when this process misses and
        # written at up to SHARED_MARKS boundaries a prompt (None: this process only)
        self.shared = shared
        # digest -> (expiry, the prefix's tokens as counted when it was written: a read
        # reports what the write counted, however the rest of the prompt apportions)
        self._entries: OrderedDict[bytes, tuple[float, int]] = OrderedDict()
        self.queries = 0  # prompt tokens looked up (vLLM's prefix_cache_queries: tokens)
        self.hits = 0  # prompt tokens found cached (vLLM's prefix_cache_hits: tokens)
        self.requests = 0
        self.hit_requests = 0
        self.evictions = 0

    # -- the store -------------------------------------------------------------------------
    def _get(self, digest: bytes, now: float) -> int | None:
        hit = self._entries.get(digest)
        if hit is None:
            return None
        if hit[0] <= now:
            del self._entries[digest]
            return None
        return hit[1]

    def _put(self, pairs: Iterable[tuple[bytes, int]], expiry: float) -> None:
        entries = self._entries
        cap = self.max_entries
        if cap <= 0:
            return
        for d, n in pairs:
            old = entries.get(d)
            entries[d] = (expiry, n) if old is None else (max(old[0], expiry), old[1])
            entries.move_to_end(d)
        over = len(entries) - cap
        if over > 0:
            self.evictions += over
            for _ in range(over):
                entries.popitem(last=False)

    def _shared_get(self, digest: bytes, now: float) -> int | None:
        got = self.shared.get(digest.hex())
        if not isinstance(got, tuple) or len(got) != 2 or got[0] <= now:
            return None
        self._put(((digest, int(got[1])),), float(got[0]))  # (kept here from now on)
        return int(got[1])

    def _shared_put(self, pairs: Sequence[tuple[bytes, int]], expiry: float) -> None:
        for d, n in pairs:
            self.shared.put(d.hex(), (expiry, n))

    def _count(self, prompt_tokens: int, read: int) -> None:
        self.requests += 1
        self.queries += prompt_tokens
        if read:
            self.hit_requests += 1
            self.hits += read

    # -- the two rules ---------------------------------------------------------------------
    def openai(self, seg: Segments, prompt_tokens: int, now: float,
               ttl: float = OPENAI_TTL_S) -> int:
        """Cached tokens as OpenAI reports them (``cached_tokens``): the longest cached
        prefix in 128-token steps, from 1,024 tokens; this prompt's prefix is then cached."""
        if prompt_tokens < OPENAI_MIN_TOKENS or not seg.digests:
            return 0
        hit = 0
        found = -1
        for i in range(len(seg.digests) - 1, -1, -1):  # the longest cached prefix
            n = self._get(seg.digests[i], now)
            if n is not None:
                hit, found = n, i
                break
        marks = _marks(len(seg.digests)) if self.shared is not None else []
        if marks and found < marks[-1]:  # other processes may hold a longer one
            lo, hi = 0, len(marks) - 1  # (prefixes are cached whole: a binary search)
            while lo <= hi:
                mid = (lo + hi) // 2
                i = marks[mid]
                if i <= found:
                    lo = mid + 1
                    continue
                n = self._shared_get(seg.digests[i], now)
                if n is None:
                    hi = mid - 1
                else:
                    hit, found, lo = n, i, mid + 1
        read = min(hit, prompt_tokens) // OPENAI_BLOCK * OPENAI_BLOCK
        if read < OPENAI_MIN_TOKENS:
            read = 0
        self._put(zip(seg.digests, seg.tokens, strict=True), now + ttl)
        if marks:
            self._shared_put([(seg.digests[i], seg.tokens[i]) for i in marks], now + ttl)
        self._count(prompt_tokens, read)
        return read

    def anthropic(self, seg: Segments, prompt_tokens: int, now: float,
                  min_tokens: int) -> CacheUse:
        """Anthropic's ``cache_control``: the tokens read (the longest cached prefix found at
        a block boundary within :data:`LOOKBACK_BLOCKS` before a breakpoint), and written (the
        rest up to the last breakpoint that reaches ``min_tokens``)."""
        if not seg.marks:
            return NO_USE
        ends = seg.block_ends
        read = 0
        for b, ttl in sorted(seg.marks, reverse=True):
            for j in range(b, max(-1, b - LOOKBACK_BLOCKS), -1):
                s = ends[j]
                if seg.tokens[s] <= read:
                    break
                n = self._get(seg.digests[s], now)
                if n is None and self.shared is not None:
                    n = self._shared_get(seg.digests[s], now)
                if n is not None:
                    read = min(n, prompt_tokens)
                    self._put(((seg.digests[s], n),), now + ttl)  # a read refreshes it
                    break
        written = written_1h = 0
        for b, ttl in seg.marks:
            s = ends[b]
            stored = self._get(seg.digests[s], now)
            here = seg.tokens[s] if stored is None else stored
            if here < min_tokens:
                continue  # below the model's minimum: silently not cached
            self._put(((seg.digests[s], here),), now + ttl)  # (breakpoints only)
            if self.shared is not None:
                self._shared_put(((seg.digests[s], here),), now + ttl)
            if here > read + written + written_1h:
                grown = here - read - written - written_1h
                if ttl > ANTHROPIC_TTL_S["5m"]:
                    written_1h += grown
                else:
                    written += grown
        self._count(prompt_tokens, read)
        return CacheUse(read, written + written_1h, written_1h)

    def snapshot(self) -> dict[str, int]:
        """For ``/llmsim/stats``: token queries and hits (vLLM counts tokens), requests,
        entries and the byte budget."""
        return {"queries_tokens": self.queries, "hits_tokens": self.hits,
                "requests": self.requests, "hit_requests": self.hit_requests,
                "entries": len(self._entries), "bytes": len(self._entries) * ENTRY_BYTES,
                "budget_bytes": self.budget_bytes, "evictions": self.evictions}

    def reset(self) -> None:
        self.queries = self.hits = self.requests = self.hit_requests = self.evictions = 0
