"""The model registry: context windows, output limits, reasoning capability, latency profiles.

Latency numbers are typical public measurements of the hosted models (time to first token and
mean inter-token gap at low load); they are defaults, every one is overridable per model in
the config file (``[models."id"]``) and globally with ``--ttft-ms/--itl-ms``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields, replace

from ..config import ModelSpec

__all__ = ["ModelProfile", "Registry", "BUILTIN", "DEFAULT_PROFILE", "DEFAULT_EMBEDDING"]

GPT5_EFFORTS = ("minimal", "low", "medium", "high")
O_EFFORTS = ("low", "medium", "high")


@dataclass(frozen=True, slots=True)
class ModelProfile:
    """Everything the simulator knows about one model id."""

    id: str
    owned_by: str = "openai"
    created: int = 1715367049
    context_window: int = 128_000
    max_output_tokens: int = 16_384
    reasoning: bool = False
    efforts: tuple[str, ...] = ()
    default_effort: str | None = None
    ttft_ms: float = 400.0  # median time to first token at low load, short prompt
    ttft_jitter: float = 0.25  # log-normal sigma
    itl_ms: float = 12.0  # median inter-token gap
    itl_jitter: float = 0.2  # log-normal sigma
    reasoning_itl_ms: float | None = None  # hidden reasoning token pace (default: itl_ms)
    prefill_ms_per_1k: float = 15.0  # extra TTFT per 1000 uncached prompt tokens
    cached_prefill_ms_per_1k: float = 1.5  # extra TTFT per 1000 prompt tokens read from cache
    cache_min_tokens: int = 1024  # the smallest prefix Anthropic's cache_control caches
    verbosity: float = 1.0  # scales the natural answer length (llmsim.sim.lengths)
    encoding: str = "o200k_base"
    builtin: bool = True
    # "chat" (generates text) | "embedding" (POST /v1/embeddings) | "image" | "speech" |
    # "transcription" | "moderation" (the media endpoints: llmsim.api.media)
    kind: str = "chat"
    dimensions: int = 0  # embedding models: the native vector length
    shortenable: bool = False  # embedding models: accepts `dimensions` (text-embedding-3-*)
    # the media models' work time: "image" seconds for one medium 1024x1024 image; "speech"
    # and "transcription" seconds per second of audio (after ttft_ms); see llmsim.api.media
    gen_s: float = 0.0

    def public(self) -> dict[str, object]:
        """The ``/v1/models`` object: OpenAI's shape, vLLM's model card fields (``root``,
        ``parent``, ``max_model_len``: harnesses such as ``vllm bench serve`` read them) and a
        few useful extras."""
        return {"id": self.id, "object": "model", "created": self.created,
                "owned_by": self.owned_by, "root": self.id, "parent": None,
                "max_model_len": self.context_window, "context_window": self.context_window,
                "max_output_tokens": self.max_output_tokens, "reasoning": self.reasoning}


def _p(id: str, base: Mapping[str, object] | None = None, **kw: object) -> ModelProfile:
    return ModelProfile(id=id, **{**(base or {}), **kw})  # type: ignore[arg-type]


# Prefill (ms per 1000 prompt tokens, uncached / read from the prompt cache), profile data:
# - frontier OpenAI models: ~90 uncached (FIDELITY-ANCHORS: the implied frontier rate); the
#   cached rate solves OpenAI's "cached TTFT 67% faster at 150k+ tokens" for a ~0.45 s base;
# - mini models: 58 from Artificial Analysis' GPT-4.1 mini (0.93 s TTFT at 10k input, 0.35 s
#   base), cached by the same 67% rule; nano: two thirds of mini (assumption);
# - Claude: 106 uncached / 15 cached from Anthropic's prompt-caching launch (Claude 3.5
#   Sonnet, 100k-token prompt 11.5 s uncached, 2.4 s cached, ~0.9 s base), for every Claude.
_FRONTIER = dict(prefill_ms_per_1k=90.0, cached_prefill_ms_per_1k=28.0)
_MINI = dict(prefill_ms_per_1k=58.0, cached_prefill_ms_per_1k=18.0)
_NANO = dict(prefill_ms_per_1k=40.0, cached_prefill_ms_per_1k=12.0)
# cache_control minimums (tokens) per Anthropic's docs: Sonnet 1,024, Haiku 4.5 4,096, the
# newest Opus 512 (sources differ between 512 and 4,096: profile data, overridable)
_CLAUDE = dict(owned_by="anthropic", prefill_ms_per_1k=106.0, cached_prefill_ms_per_1k=15.0)

_GOOGLE = dict(owned_by="google", prefill_ms_per_1k=40.0, cached_prefill_ms_per_1k=10.0)
_G25 = dict(_GOOGLE, reasoning=True, efforts=("low", "medium", "high"), default_effort="medium")
_G5 = dict(context_window=400_000, max_output_tokens=128_000, reasoning=True,
           efforts=GPT5_EFFORTS, default_effort="medium", created=1754425777)
_O = dict(context_window=200_000, max_output_tokens=100_000, reasoning=True, efforts=O_EFFORTS,
          default_effort="medium", created=1744225308)
_G41 = dict(context_window=1_047_576, max_output_tokens=32_768, created=1744316542)

BUILTIN: tuple[ModelProfile, ...] = (
    _p("gpt-5", {**_G5, **_FRONTIER}, ttft_ms=650.0, itl_ms=14.0),
    _p("gpt-5-mini", {**_G5, **_MINI}, ttft_ms=450.0, itl_ms=8.0),
    _p("gpt-5-nano", {**_G5, **_NANO}, ttft_ms=350.0, itl_ms=5.0),
    _p("gpt-5.1", {**_G5, **_FRONTIER, "efforts": ("none",) + GPT5_EFFORTS[1:]}, ttft_ms=600.0,
       itl_ms=13.0),
    _p("gpt-5.2", {**_G5, **_FRONTIER, "efforts": ("none",) + GPT5_EFFORTS[1:] + ("xhigh",)},
       ttft_ms=600.0, itl_ms=13.0),
    _p("gpt-5-codex", {**_G5, **_FRONTIER}, ttft_ms=650.0, itl_ms=14.0),
    _p("o1", {**_O, **_FRONTIER}, ttft_ms=1200.0, itl_ms=18.0, created=1734375816),
    _p("o3", {**_O, **_FRONTIER}, ttft_ms=900.0, itl_ms=14.0),
    _p("o3-mini", {**_O, **_MINI}, ttft_ms=600.0, itl_ms=7.0, created=1737146383),
    _p("o4-mini", {**_O, **_MINI}, ttft_ms=600.0, itl_ms=8.0),
    _p("gpt-4.1", {**_G41, **_FRONTIER}, ttft_ms=500.0, itl_ms=14.0),
    _p("gpt-4.1-mini", {**_G41, **_MINI}, ttft_ms=350.0, itl_ms=9.0),
    _p("gpt-4.1-nano", {**_G41, **_NANO}, ttft_ms=250.0, itl_ms=6.0),
    _p("gpt-4o", _FRONTIER, context_window=128_000, max_output_tokens=16_384, ttft_ms=450.0, itl_ms=12.0),
    _p("gpt-4o-mini", _MINI, context_window=128_000, max_output_tokens=16_384, ttft_ms=350.0,
       itl_ms=10.0, created=1721172741),
    # the Realtime API's models (/v1/realtime)
    _p("gpt-realtime", _FRONTIER, context_window=32_000, max_output_tokens=4_096, ttft_ms=500.0,
       itl_ms=12.0, created=1756339200),
    _p("gpt-realtime-mini", _MINI, context_window=32_000, max_output_tokens=4_096,
       ttft_ms=350.0, itl_ms=9.0, created=1759708800),
    _p("gpt-4-turbo", _FRONTIER, context_window=128_000, max_output_tokens=4_096, ttft_ms=600.0,
       itl_ms=25.0, encoding="cl100k_base", created=1712361441),
    _p("gpt-4", _FRONTIER, context_window=8_192, max_output_tokens=8_192, ttft_ms=700.0, itl_ms=35.0,
       encoding="cl100k_base", created=1687882411),
    _p("gpt-3.5-turbo", _NANO, context_window=16_385, max_output_tokens=4_096, ttft_ms=300.0,
       itl_ms=10.0, encoding="cl100k_base", created=1677610602, owned_by="openai"),
    # embedding models (POST /v1/embeddings): the time is ttft_ms plus prefill_ms_per_1k per
    # 1000 input tokens; context_window is the per-input token limit
    _p("text-embedding-3-small", kind="embedding", dimensions=1536, shortenable=True,
       context_window=8_192, max_output_tokens=0, ttft_ms=60.0, prefill_ms_per_1k=12.0,
       encoding="cl100k_base", created=1705948997, owned_by="system"),
    _p("text-embedding-3-large", kind="embedding", dimensions=3072, shortenable=True,
       context_window=8_192, max_output_tokens=0, ttft_ms=90.0, prefill_ms_per_1k=25.0,
       encoding="cl100k_base", created=1705953180, owned_by="system"),
    _p("text-embedding-ada-002", kind="embedding", dimensions=1536, context_window=8_192,
       max_output_tokens=0, ttft_ms=80.0, prefill_ms_per_1k=15.0, encoding="cl100k_base",
       created=1671217299, owned_by="openai-internal"),
    # Anthropic's Claude models (POST /anthropic/v1/messages, /v1/messages); thinking is
    # enabled per request (`thinking`), so they are not "reasoning" models on OpenAI paths
    _p("claude-sonnet-5-5", _CLAUDE, context_window=1_000_000, max_output_tokens=64_000,
       ttft_ms=900.0, itl_ms=14.0, created=1790812800, cache_min_tokens=1024),
    _p("claude-opus-5-5", _CLAUDE, context_window=1_000_000, max_output_tokens=128_000,
       ttft_ms=1400.0, itl_ms=22.0, created=1790812800, cache_min_tokens=512),
    _p("claude-haiku-5-5", _CLAUDE, context_window=200_000, max_output_tokens=64_000,
       ttft_ms=450.0, itl_ms=6.0, created=1790812800, cache_min_tokens=4096),
    _p("claude-sonnet-4-6", _CLAUDE, context_window=200_000, max_output_tokens=64_000,
       ttft_ms=900.0, itl_ms=14.0, created=1771200000, cache_min_tokens=1024),
    _p("claude-haiku-4-5", _CLAUDE, context_window=200_000, max_output_tokens=64_000,
       ttft_ms=500.0, itl_ms=7.0, created=1760572800, cache_min_tokens=4096),
    # Google's Gemini models (POST /v1beta/models/{model}:generateContent): 2.5 Pro and Flash
    # think by default (thinkingConfig), Flash-Lite and 2.0 do not; TTFT and pace are
    # Artificial Analysis' orders of magnitude (assumption within their ±30%); counts use the
    # o200k tokenizer (Gemini's is not public)
    _p("gemini-2.5-pro", _G25, context_window=1_048_576, max_output_tokens=65_536,
       ttft_ms=1500.0, itl_ms=7.0, created=1750118400),
    _p("gemini-2.5-flash", _G25, context_window=1_048_576, max_output_tokens=65_536,
       ttft_ms=450.0, itl_ms=4.0, created=1750118400),
    _p("gemini-2.5-flash-lite", _GOOGLE, context_window=1_048_576, max_output_tokens=65_536,
       ttft_ms=300.0, itl_ms=3.0, created=1753142400),
    _p("gemini-2.0-flash", _GOOGLE, context_window=1_048_576, max_output_tokens=8_192,
       ttft_ms=350.0, itl_ms=4.0, created=1738713600),
    _p("gemini-embedding-001", kind="embedding", dimensions=3072, shortenable=True,
       context_window=2_048, max_output_tokens=0, ttft_ms=80.0, prefill_ms_per_1k=15.0,
       owned_by="google", created=1752537600),
    _p("text-embedding-004", kind="embedding", dimensions=768, shortenable=True,
       context_window=2_048, max_output_tokens=0, ttft_ms=60.0, prefill_ms_per_1k=12.0,
       owned_by="google", created=1715644800),
    # media models (llmsim.api.images, .audio, .moderations). Assumptions, orders of
    # magnitude only: gpt-image-1 ~20 s for a medium 1024x1024 image (OpenAI: "complex prompts
    # may take up to 2 minutes"), DALL-E 3 ~10 s, DALL-E 2 ~4 s; speech ~10x and
    # transcription ~20x faster than real time after a first-byte delay
    _p("gpt-image-1", kind="image", gen_s=20.0, ttft_ms=0.0, max_output_tokens=0,
       created=1745517030, owned_by="system"),
    _p("gpt-image-1-mini", kind="image", gen_s=10.0, ttft_ms=0.0, max_output_tokens=0,
       created=1759795200, owned_by="system"),
    _p("dall-e-3", kind="image", gen_s=10.0, ttft_ms=0.0, max_output_tokens=0,
       created=1698785189, owned_by="system"),
    _p("dall-e-2", kind="image", gen_s=4.0, ttft_ms=0.0, max_output_tokens=0,
       created=1698798177, owned_by="system"),
    _p("tts-1", kind="speech", gen_s=0.1, ttft_ms=300.0, max_output_tokens=0,
       created=1681940951, owned_by="openai-internal"),
    _p("tts-1-hd", kind="speech", gen_s=0.2, ttft_ms=500.0, max_output_tokens=0,
       created=1699046015, owned_by="system"),
    _p("gpt-4o-mini-tts", kind="speech", gen_s=0.1, ttft_ms=350.0, max_output_tokens=2_000,
       created=1742403959, owned_by="system"),
    _p("whisper-1", kind="transcription", gen_s=0.05, ttft_ms=300.0, max_output_tokens=0,
       created=1677532384, owned_by="openai-internal"),
    _p("gpt-4o-transcribe", kind="transcription", gen_s=0.05, ttft_ms=300.0,
       max_output_tokens=2_000, created=1742068463, owned_by="system"),
    _p("gpt-transcribe", kind="transcription", gen_s=0.05, ttft_ms=300.0,
       max_output_tokens=2_000, created=1780000000, owned_by="system"),
    _p("gpt-4o-mini-transcribe", kind="transcription", gen_s=0.04, ttft_ms=250.0,
       max_output_tokens=2_000, created=1742068596, owned_by="system"),
    _p("omni-moderation-latest", kind="moderation", ttft_ms=150.0, prefill_ms_per_1k=10.0,
       context_window=32_768, max_output_tokens=0, created=1732734466, owned_by="system"),
    _p("text-moderation-latest", kind="moderation", ttft_ms=120.0, prefill_ms_per_1k=10.0,
       context_window=32_768, max_output_tokens=0, encoding="cl100k_base",
       created=1677610602, owned_by="openai-internal"),
    # the legacy completions models (POST /v1/completions)
    _p("gpt-3.5-turbo-instruct", context_window=4_096, max_output_tokens=4_096, ttft_ms=250.0,
       itl_ms=8.0, encoding="cl100k_base", created=1692901427),
    _p("davinci-002", context_window=16_384, max_output_tokens=16_384, ttft_ms=300.0,
       itl_ms=12.0, encoding="cl100k_base", created=1692634301),
    _p("babbage-002", context_window=16_384, max_output_tokens=16_384, ttft_ms=200.0,
       itl_ms=6.0, encoding="cl100k_base", created=1692634615),
)

DEFAULT_PROFILE = ModelProfile(id="default", owned_by="llmsim", context_window=131_072,
                               max_output_tokens=32_768, builtin=False)
DEFAULT_EMBEDDING = ModelProfile(id="default-embedding", owned_by="llmsim", builtin=False,
                                 kind="embedding", dimensions=1536, context_window=8_192,
                                 max_output_tokens=0, ttft_ms=60.0, prefill_ms_per_1k=12.0)
"""An id the registry does not know, asked for embeddings (e.g. a harness's ``BAAI/bge-m3``):
served as a 1536-dimension embedding model."""


class Registry:
    """Model lookup: exact id, then a dated snapshot of a known id (``gpt-4o-2024-08-06``),
    then (unless strict) the default profile under the requested id."""

    def __init__(self, extra: Mapping[str, ModelSpec] | None = None, strict: bool = False,
                 first: str | None = None, served: tuple[str, ...] = ()):
        self.strict = strict or bool(served)
        self._models: dict[str, ModelProfile] = {m.id: m for m in BUILTIN}
        for mid, spec in (extra or {}).items():
            base = self._models.get(mid) or replace(DEFAULT_PROFILE, id=mid, owned_by="user")
            changes = {f.name: getattr(spec, f.name) for f in fields(spec)
                       if getattr(spec, f.name) is not None}
            if changes.get("reasoning") and not base.efforts:
                changes.setdefault("efforts", ("minimal", "low", "medium", "high"))
                changes.setdefault("default_effort", "medium")
            self._models[mid] = replace(base, builtin=base.builtin, **changes)
        if served:  # --served-model-name: exactly these ids (vLLM)
            known = self._models
            self._models = {n: known.get(n) or replace(DEFAULT_PROFILE, id=n, owned_by="vllm")
                            for n in served}
            first = None
        if first is not None:  # listed first (--default-model); an unknown id is added
            prof = self._models.pop(first, None) or replace(DEFAULT_PROFILE, id=first,
                                                            owned_by="user")
            self._models = {first: prof, **self._models}
        self._by_len = sorted(self._models, key=len, reverse=True)
        self._cache: dict[str, ModelProfile | None] = {}

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._models.values())

    def get(self, model: str) -> ModelProfile | None:
        """The profile for ``model``, or None if unknown and the registry is strict."""
        hit = self._cache.get(model)
        if hit is not None or model in self._cache:
            return hit
        prof = self._models.get(model)
        if prof is None:
            for known in self._by_len:
                if model.startswith(known + "-") and model[len(known) + 1:][:1].isdigit():
                    prof = replace(self._models[known], id=model)
                    break
        if prof is None and not self.strict:
            prof = replace(DEFAULT_PROFILE, id=model)
        if len(self._cache) < 4096:  # bounded: keys come from clients
            self._cache[model] = prof
        return prof

    def listed(self) -> list[ModelProfile]:
        return list(self._models.values())
