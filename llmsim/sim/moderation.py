"""Moderation results, deterministic from the text: every category of the real API with a
score, flagged only where a script rule says so (``{"match": {"endpoint": "moderations",
"regex": ...}, "reply": [{"flag": ["violence"]}]}``, see :mod:`llmsim.sim.script`).

An unflagged category scores below :data:`FLAG_THRESHOLD` (a small value hashed from the
text and the category, like a real benign text's 1e-6..1e-3); a flagged one scores above it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection
from typing import Any

__all__ = ["CATEGORIES", "IMAGE_CATEGORIES", "OMNI_ONLY", "result", "FLAG_THRESHOLD"]

CATEGORIES = ("harassment", "harassment/threatening", "hate", "hate/threatening", "illicit",
              "illicit/violent", "self-harm", "self-harm/instructions", "self-harm/intent",
              "sexual", "sexual/minors", "violence", "violence/graphic")
# the categories omni-moderation applies to images as well as text
IMAGE_CATEGORIES = frozenset(("self-harm", "self-harm/instructions", "self-harm/intent",
                              "sexual", "violence", "violence/graphic"))
OMNI_ONLY = frozenset(("illicit", "illicit/violent"))  # null for text-moderation models
FLAG_THRESHOLD = 0.5


def _unit(key: bytes) -> float:
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2.0 ** 64


def result(text: str, flags: Collection[str], *, omni: bool, images: int = 0,
           seed: int = 0) -> dict[str, Any]:
    """One ``results[]`` entry for ``text`` (plus ``images`` images, omni only) with the
    categories in ``flags`` flagged."""
    base = hashlib.blake2b(text.encode("utf-8", "replace") + seed.to_bytes(8, "big", signed=True),
                           digest_size=16).digest()
    cats: dict[str, bool | None] = {}
    scores: dict[str, float] = {}
    applied: dict[str, list[str]] = {}
    for c in CATEGORIES:
        u = _unit(base + c.encode())
        flagged = c in flags
        if not omni and c in OMNI_ONLY:  # (the SDK's types want a boolean and a number)
            cats[c] = False
            scores[c] = 0.0
        else:
            cats[c] = flagged
            scores[c] = round(0.9 + 0.0999 * u, 6) if flagged else round(1e-6 + 1e-3 * u ** 3, 8)
        kinds = ["text"] if text or not images else []
        if images and c in IMAGE_CATEGORIES:
            kinds.append("image")
        applied[c] = kinds
    out: dict[str, Any] = {"flagged": any(cats.values()), "categories": cats,
                           "category_scores": scores}
    out["category_applied_input_types"] = applied
    return out
