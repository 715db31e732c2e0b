"""Per-request randomness and ids.

With a server seed, a request's RNG is derived from the seed and the request's canonical
content (method, path, JSON body with sorted keys), never from a shared counter, so the same
request gives the same text, token counts and delays whatever runs concurrently. A request's
own ``seed`` parameter (or ``temperature: 0``) makes it reproducible even without a server
seed. Without either, runs vary. Ids (``chatcmpl-…``, ``resp_…``) are always unique: they come
from a separate source so identical requests can still be stored side by side.
"""

from __future__ import annotations

import binascii
import hashlib
import os
import random
import zlib
from typing import Any

import orjson

__all__ = ["request_rng", "request_seed", "rng_of", "new_id", "new_request_id", "derive", "seeded", "DELIVERY_ONLY"]

# Fields that change how an answer is delivered or filed, not what the model says: the same
# seeded request gives the same text streamed or not, stored or not, tagged or not.
DELIVERY_ONLY = frozenset({"stream", "stream_options", "background", "store", "metadata", "user",
                           "safety_identifier", "prompt_cache_key", "service_tier", "include",
                           "generate"})


def request_rng(seed: int | None, path: str, body: Any, *, salt: str = "") -> random.Random:
    """The RNG for one request (see module doc)."""
    return rng_of(request_seed(seed, path, body, salt=salt))


def rng_of(seed: int | None) -> random.Random:
    """The RNG of a :func:`request_seed` (None: the shared unseeded one)."""
    return _UNSEEDED if seed is None else seeded(seed)


def request_seed(seed: int | None, path: str, body: Any, *, salt: str = "") -> int | None:
    """The seed :func:`request_rng` seeds a request's RNG with, or None when nothing is to be
    reproduced (a value: a handler may keep it with the validated body)."""
    req_seed = None
    if isinstance(body, dict):
        s = body.get("seed")
        if isinstance(s, int) and not isinstance(s, bool):
            req_seed = s
        elif body.get("temperature") == 0:
            req_seed = 0
    if seed is None and req_seed is None:
        return None  # nothing to reproduce: no fresh generator to seed (~10 µs)
    if isinstance(body, dict) and not DELIVERY_ONLY.isdisjoint(body):
        body = {k: v for k, v in body.items() if k not in DELIVERY_ONLY}
    try:
        canon = orjson.dumps(body, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        canon = repr(body).encode()
    digest = _blake2b(f"{seed}|{path}|{salt}|".encode() + canon, digest_size=16).digest()
    return int.from_bytes(digest, "little")


def seeded(seed: int) -> random.Random:
    """``random.Random(seed)`` for a non-negative int, seeded by the C method directly (the
    same state; without the Python ``__init__``/``seed`` wrappers, ~0.4 µs a request)."""
    r = _new(random.Random)
    _c_seed(r, seed)
    r.gauss_next = None  # type: ignore[attr-defined]  # (random.Random.seed sets it too)
    return r


_blake2b = hashlib.blake2b
_new = random.Random.__new__
_c_seed: Any = random.Random.__mro__[1].seed  # type: ignore[attr-defined]  # _random's


def derive(rng: random.Random, label: str) -> random.Random:
    """An independent child RNG (e.g. one per choice), reproducible from the parent."""
    if rng is _UNSEEDED:
        return rng
    return seeded(rng.getrandbits(64) ^ (zlib.crc32(label.encode()) << 64))


_UNSEEDED = random.Random()
_ID_RNG = random.Random()  # ids: unique, never part of a seeded answer  # shared by every unseeded request (runs vary, as documented)
_ALNUM = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
# byte b -> _ALNUM[b % 62]: a random byte's character in one C-level translate
_ALNUM_OF_BYTE = bytes(ord(_ALNUM[b % 62]) for b in range(256))
_b64 = binascii.b2a_base64
_ALT_AB = bytes.maketrans(b"+/", b"Ab")  # ids are alphanumeric: "+" -> "A", "/" -> "b"


def _reseed_after_fork() -> None:
    # --workers forks: a child must not continue its parent's id stream, or two workers
    # hand out the same response ids (a stored response would be overwritten by another's)
    _ID_RNG.seed()
    _UNSEEDED.seed()
    _HEX[:] = ["", 0]  # (nor what the parent drew ahead)
    _ALNUMS[:] = ["", 0]


os.register_at_fork(after_in_child=_reseed_after_fork)


# Ids are cut from random text drawn ahead, _AHEAD ids at a time (one draw and one
# conversion instead of one per id: ~1 µs a request on the hot path), from the id stream.
_AHEAD = 64
_HEX: list[Any] = ["", 0]  # hex digits drawn ahead, and the position of the next unused one
_ALNUMS: list[Any] = ["", 0]  # alphanumerics drawn ahead (base64 with "+/" -> "Ab")


def new_request_id() -> str:
    """An ``x-request-id`` like the real API's: ``req_`` and 32 hex digits (the id stream,
    so forked workers never repeat each other's)."""
    buf, at = _HEX
    if at >= len(buf):
        buf = _HEX[0] = _ID_RNG.getrandbits(128 * _AHEAD).to_bytes(16 * _AHEAD, "little").hex()
        at = 0
    _HEX[1] = at + 32
    return "req_" + buf[at:at + 32]


def new_id(prefix: str, length: int = 24) -> str:
    """A unique id like the real API's: ``chatcmpl-…``, ``resp_…``, ``msg_…``, ``call_…``."""
    if length == 24:  # the common case: 144 random bits as 24 alphanumerics, no syscall
        buf, at = _ALNUMS
        if at >= len(buf):
            raw = _ID_RNG.getrandbits(144 * _AHEAD).to_bytes(18 * _AHEAD, "little")
            # base64.b64encode(raw, b"Ab") without its per-call translation table
            buf = _ALNUMS[0] = _b64(raw, newline=False).translate(_ALT_AB).decode()
            at = 0
        _ALNUMS[1] = at + 24
        return prefix + buf[at:at + 24]
    return prefix + os.urandom(length).translate(_ALNUM_OF_BYTE).decode()
