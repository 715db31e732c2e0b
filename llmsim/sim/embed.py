"""Embedding vectors, sans-IO: deterministic, unit-norm, and similar for similar texts.

A hashed bag-of-tokens projection (feature hashing): every distinct token of the text adds
``±weight`` to :data:`TOUCHES` coordinates of the model's native dimension, chosen and signed
by a keyed hash of ``(seed, token)``; the sum is normalised to unit length. Texts that share
tokens share coordinates, so a paraphrase scores a higher cosine similarity than an unrelated
text (whose expected cosine is 0), which is enough for a retrieval demo to behave plausibly.
``dimensions`` (text-embedding-3-*) keeps the first ``d`` coordinates and normalises again, as
the real models' Matryoshka embeddings are shortened.

Cost: one keyed hash per distinct token (cached, bounded) and ``TOUCHES`` additions; no
dependency beyond the standard library. ``float32`` little-endian bytes for ``base64``.
"""

from __future__ import annotations

import base64
import hashlib
import math
import struct
import sys
from array import array
from collections import Counter
from collections.abc import Iterable

__all__ = ["embed", "to_base64", "TOUCHES"]

TOUCHES = 12  # coordinates one token moves
_CACHE_MAX = 65_536  # distinct (seed, dims, token) entries kept; cleared when full
_cache: dict[tuple[int, int, str], tuple[tuple[int, float], ...]] = {}


def _touches(seed: int, dims: int, token: str) -> tuple[tuple[int, float], ...]:
    key = (seed, dims, token)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    h = hashlib.blake2b(token.encode("utf-8", "surrogatepass"), digest_size=4 * TOUCHES,
                        key=seed.to_bytes(8, "little", signed=True)).digest()
    out = []
    for i in range(TOUCHES):
        (v,) = struct.unpack_from("<I", h, 4 * i)
        out.append((v % dims, 1.0 if v & 0x80000000 else -1.0))
    hit = tuple(out)
    if len(_cache) >= _CACHE_MAX:
        _cache.clear()
    _cache[key] = hit
    return hit


def embed(tokens: Iterable[str], native: int, dimensions: int | None, seed: int) -> list[float]:
    """The unit vector of a text given as its tokens (case and surrounding spaces ignored)."""
    vec = [0.0] * native
    bag = Counter(t.strip().lower() for t in tokens)
    bag.pop("", None)
    if not bag:  # only spaces or punctuation-free emptiness: a fixed direction
        bag["\x00"] = 1
    for token, n in bag.items():
        w = 1.0 + math.log(n)  # sub-linear term frequency
        for i, sign in _touches(seed, native, token):
            vec[i] += sign * w
    if dimensions is not None and dimensions < native:
        vec = vec[:dimensions]
    norm = math.sqrt(math.fsum(x * x for x in vec))
    if norm == 0.0:  # (all of this text's coordinates were cut by `dimensions`)
        vec[0] = 1.0
        return vec
    return [x / norm for x in vec]


def to_base64(vec: list[float]) -> str:
    """``encoding_format: base64``: little-endian float32, base64 (what the SDK decodes)."""
    a = array("f", vec)
    if sys.byteorder != "little":
        a.byteswap()
    return base64.b64encode(a.tobytes()).decode("ascii")
