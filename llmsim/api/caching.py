"""The prompt cache (:mod:`llmsim.sim.cache`) applied to a request: one place for every API
family that reports cached prompt tokens (Chat Completions, legacy completions, Responses with
OpenAI's automatic rule; Anthropic Messages with ``cache_control``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import E
from ..sim.cache import (
    ANTHROPIC_TTL_S,
    OPENAI_MIN_TOKENS,
    OPENAI_TTL_24H_S,
    OPENAI_TTL_S,
    CacheUse,
    Segments,
    segments_of,
)
from ..sim.models import ModelProfile

if TYPE_CHECKING:
    from .services import Services

__all__ = ["openai_segments", "openai_cached", "check_retention", "anthropic_marks",
           "anthropic_cached", "MAX_CACHE_KEY"]

MAX_CACHE_KEY = 1024  # characters of prompt_cache_key


def check_retention(body: dict[str, Any]) -> str | None:
    """``prompt_cache_retention`` (``in_memory`` | ``24h``) and ``prompt_cache_key`` checked;
    returns the retention (None: in memory)."""
    key = body.get("prompt_cache_key")
    if key is not None and (not isinstance(key, str) or len(key) > MAX_CACHE_KEY):
        raise E.invalid_type.at("prompt_cache_key", expected=f"a string of at most "
                                f"{MAX_CACHE_KEY} characters")
    ret = body.get("prompt_cache_retention")
    if ret is not None and ret not in ("in_memory", "24h"):
        raise E.invalid_value.at("prompt_cache_retention", value=ret,
                                 allowed="'in_memory' and '24h'")
    opts = body.get("prompt_cache_options")
    if opts is not None and not isinstance(opts, dict):
        raise E.invalid_type.at("prompt_cache_options", expected="an object")
    return ret if isinstance(ret, str) else None


def openai_segments(app: Services, profile: ModelProfile, body: dict[str, Any],
                    blocks: Callable[[], Sequence[object]], prompt_tokens: int
                    ) -> Segments | None:
    """The prompt's segments for OpenAI's automatic caching (None: too short to be cached,
    caching off, or ``prompt_cache_options.mode`` ``explicit``). A value of the body: a
    family may keep it with its validated-body memo."""
    if prompt_tokens < OPENAI_MIN_TOKENS or app.prompt_cache.max_entries <= 0:
        return None
    opts = body.get("prompt_cache_options")
    if isinstance(opts, dict) and opts.get("mode") == "explicit":
        return None  # (explicit breakpoints: accepted, not simulated)
    key = body.get("prompt_cache_key")
    return segments_of(f"openai\0{profile.id}\0{key if isinstance(key, str) else ''}",
                       blocks(), prompt_tokens)


def openai_cached(app: Services, seg: Segments | None, prompt_tokens: int,
                  retention: str | None) -> int:
    """Cached prompt tokens of this request (the cache then holds its prefix)."""
    if seg is None:
        return 0
    ttl = OPENAI_TTL_24H_S if retention == "24h" else OPENAI_TTL_S
    # (wall-clock time: the shared table's expiries are read by other processes and hosts)
    read = app.prompt_cache.openai(seg, prompt_tokens, app.clock.time(), ttl)
    app.stats.prompt_cache(prompt_tokens, read)
    return read


def anthropic_marks(block: dict[str, Any], where: str, marks: list[tuple[int, float]],
                    index: int) -> None:
    """Record ``block``'s ``cache_control`` (if any) as a breakpoint at block ``index``:
    checked (type ``ephemeral``, ``ttl`` 5m or 1h, at most 4, 1h before 5m)."""
    cc = block.get("cache_control")
    if cc is None:
        return
    if not isinstance(cc, dict) or cc.get("type") != "ephemeral":
        raise E.anthropic_unknown_tag.at(f"{where}.cache_control",
                                         where=f"{where}.cache_control",
                                         allowed="'ephemeral'")
    ttl = cc.get("ttl", "5m")
    if ttl not in ANTHROPIC_TTL_S:
        raise E.anthropic_field_required.at(f"{where}.cache_control.ttl") if ttl is None else \
            E.anthropic_unknown_tag.at(f"{where}.cache_control.ttl",
                                       where=f"{where}.cache_control.ttl",
                                       allowed="'5m', '1h'")
    seconds = ANTHROPIC_TTL_S[ttl]
    if marks and seconds > marks[-1][1]:
        raise E.anthropic_ttl_order.at(f"{where}.cache_control")
    marks.append((index, seconds))
    if len(marks) > 4:
        raise E.anthropic_too_many_breakpoints.at(f"{where}.cache_control", found=len(marks))


def anthropic_cached(app: Services, profile: ModelProfile, blocks: Sequence[object],
                     marks: Sequence[tuple[int, float]], prompt_tokens: int) -> CacheUse:
    """What ``cache_control`` reads and writes for this request."""
    if not marks or app.prompt_cache.max_entries <= 0:
        return CacheUse()
    seg = segments_of(f"anthropic\0{profile.id}", blocks, prompt_tokens, marks)
    use = app.prompt_cache.anthropic(seg, prompt_tokens, app.clock.time(),
                                     profile.cache_min_tokens)
    app.stats.prompt_cache(prompt_tokens, use.read, use.written)
    return use
