"""Compaction: ``POST /v1/responses/compact`` and ``context_management`` on a create.

A compaction keeps the user messages of a context and replaces everything else (assistant
messages, tool calls and outputs, reasoning, earlier compactions) by one ``compaction`` item
whose opaque blob (:mod:`llmsim.sim.compaction`) llmsim expands when it comes back. In a
later prompt the item costs its summary's tokens; the context before the newest compaction
item is pruned to its user messages (:func:`prune`), for chains through
``previous_response_id`` and for inputs that replay every item alike.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ...errors import E
from ...messages import JSONResponse, Request
from ...sim import compaction as blob
from ...sim.decide import Usage
from ...sim.rng import new_id
from .render import HostedOut

if TYPE_CHECKING:
    from ...sim.latency import Latency
    from ..services import Services

__all__ = ["prune", "call_ids", "compact_items", "auto", "compact", "COMPACT_FIELDS"]

Item = dict[str, Any]
# the fields of the SDK's ResponseCompactParams (openai 3.57)
COMPACT_FIELDS = frozenset(("model", "input", "instructions", "previous_response_id",
                            "prompt_cache_key", "prompt_cache_options", "prompt_cache_retention",
                            "service_tier", "image"))


def _is_user(it: Item) -> bool:
    return it.get("type") == "message" and it.get("role") == "user"


def prune(history: list[Item], items: list[Item]) -> tuple[list[Item], list[Item]]:
    """The context as the model reads it: before the newest compaction item only the user
    messages remain (the compaction stands for the rest)."""
    for j in range(len(items) - 1, -1, -1):
        if items[j].get("type") == "compaction":
            return ([it for it in history if _is_user(it)],
                    [it for it in items[:j] if _is_user(it)] + items[j:])
    for j in range(len(history) - 1, -1, -1):
        if history[j].get("type") == "compaction":
            return [it for it in history[:j] if _is_user(it)] + history[j:], items
    return history, items


def _expand(it: Item, param: str) -> list[Item]:
    try:
        return blob.expand(it.get("encrypted_content"))
    except blob.BlobError:
        raise E.invalid_encrypted_content.at(param) from None


def _param(it: Item, given: list[Item]) -> str:
    """Where a compaction item came from: ``input[i]`` of this request, else the chain."""
    for i, x in enumerate(given):
        if x is it:
            return f"input[{i}].encrypted_content"
    return "previous_response_id"


def call_ids(context: list[Item], given: list[Item]) -> set[Any]:
    """The call ids of the tool calls compacted into the context's compaction item (a later
    tool output may answer one). ``context`` is pruned (:func:`prune`): at most one item,
    so at most one blob is expanded a request."""
    out: set[Any] = set()
    for it in context:
        if it.get("type") == "compaction":
            out.update(c.get("call_id") for c in _expand(it, _param(it, given))
                       if c.get("call_id") is not None)
    return out


def compact_items(context: list[Item], tokens: int) -> tuple[list[Item], Item, int]:
    """Compact ``context`` (``tokens`` input tokens): its user messages, the compaction item
    and the summary's tokens. Earlier compactions are expanded into the new one (bounded:
    :data:`llmsim.sim.compaction.MAX_ITEMS_BYTES`)."""
    users: list[Item] = []
    rest: list[Item] = []
    for it in context:  # (pruned: at most one compaction item)
        if _is_user(it):
            users.append(it)
        elif it.get("type") == "compaction":
            rest.extend(_expand(it, "input"))
        else:
            rest.append(it)
    summary = blob.summary_size(tokens)
    item = {"id": new_id("cmp_"), "type": "compaction",
            "encrypted_content": blob.encode(rest, summary)}
    return users, item, summary


def seconds(lat: Latency, summary: int) -> float:
    """The time a compaction takes: its summary's tokens at the model's pace."""
    return summary * lat.mean_gap()


def auto(context: list[Item], tokens: int, lat: Latency) -> tuple[HostedOut, int]:
    """The compaction item a create with ``context_management`` opens its output with, once
    its input passes the threshold, and its summary tokens (billed as output)."""
    _, item, summary = compact_items(context, tokens)
    added = dict(item, encrypted_content="")
    return HostedOut(item["id"], added, item,
                     [(0.0, "response.compaction.compacting", {})],
                     tail=seconds(lat, summary)), summary


# how the package assembles a create's context (validated, counted): ``prepare(req, app, body)``
Prepare = Callable[[Request, "Services", dict[str, Any]], Awaitable[Any]]


async def compact(req: Request, app: Services, prepare: Prepare) -> JSONResponse:
    """``POST /v1/responses/compact``: the ``response.compaction`` object (the context's user
    messages, then one compaction item), after the time the summary takes; usage billed.
    ``prepare`` assembles the context as a create's (the package's ``prepare``)."""

    body = req.json_object()
    for key in body:
        if key not in COMPACT_FIELDS:
            raise E.unknown_parameter.at(key)
    if body.get("model") is None:
        raise E.missing.at("model")
    p = await prepare(req, app, body)
    if not p.context:
        raise E.compaction_input_empty.at("input")
    users, item, summary = compact_items(p.context, p.input_tokens)
    usage = Usage(p.input_tokens, summary, 0, p.cached_tokens)
    wait = seconds(app.latency(p.rr.profile), summary)
    if wait > 0:
        await app.clock.sleep(wait)
    return JSONResponse({
        "id": new_id("resp_"), "object": "response.compaction",
        "created_at": int(app.clock.time()), "output": [*users, item],
        "usage": {"input_tokens": usage.prompt_tokens,
                  "input_tokens_details": {"cached_tokens": usage.cached_tokens,
                                           "cache_write_tokens": 0},
                  "output_tokens": summary,
                  "output_tokens_details": {"reasoning_tokens": 0},
                  "total_tokens": usage.total_tokens}}, model=p.rr.model, usage=usage)
