"""A validated Responses request (:class:`RespRequest`): what the simulation and the echo
need, as :mod:`.parse` builds it and the hosted tools (:mod:`.hosted`) read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...sim.models import ModelProfile

__all__ = ["RespRequest", "CALLABLE_TOOLS"]

CALLABLE_TOOLS = ("function", "custom")  # tools the simulated model can call


@dataclass(slots=True)
class RespRequest:
    """A validated Responses request: what the simulation and the echo need."""

    body: dict[str, Any]
    profile: ModelProfile
    model: str
    input_items: list[dict[str, Any]]  # this turn's input, normalised (ids, status)
    raw_refs: list[str] = field(default_factory=list)  # item_reference ids to resolve
    instructions: str | None = None
    stream: bool = False
    background: bool = False
    store: bool = True
    previous_response_id: str | None = None
    conversation: str | None = None
    limit: int | None = None  # max_output_tokens
    max_tool_calls: int | None = None
    tools: list[dict[str, Any]] = field(default_factory=list)  # echoed, normalised
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    text_format: dict[str, Any] = field(default_factory=lambda: {"type": "text"})
    verbosity: str = "medium"
    effort: str | None = None  # None for non-reasoning models; "none" = no reasoning
    summary: str | None = None  # reasoning.summary as requested (echoed)
    include: list[str] = field(default_factory=list)
    metadata: dict[str, str] = field(default_factory=dict)
    temperature: float = 1.0
    top_p: float = 1.0
    top_logprobs: int = 0
    presence_penalty: float = 0.0  # accepted and echoed (no effect on the simulated text)
    frequency_penalty: float = 0.0
    truncation: str = "disabled"
    service_tier: str = "auto"
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    compact_threshold: int | None = None  # context_management: compact past this many tokens
    generate: bool = True  # WebSocket warm-up (generate: false) produces no output

    @property
    def encrypted(self) -> bool:
        return "reasoning.encrypted_content" in self.include

    @property
    def callable_tools(self) -> list[dict[str, Any]]:
        return [t for t in self.tools if t["type"] in CALLABLE_TOOLS]
