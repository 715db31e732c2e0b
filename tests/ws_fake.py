"""A tiny stand-in for ``POST /v1/responses`` used by the WebSocket tests only when the real
Responses module is not installed. It follows the WS contract: always streams over WS, rejects
``background``, honours ``generate: false`` and resolves ``previous_response_id`` in the
connection cache, then in its own store. It exists so the transport can be tested alone; it is
not a second implementation of the product."""

from __future__ import annotations

import os
import time
from typing import Any

from llmsim.api.responses import RESPONSES
from llmsim.errors import APIError
from llmsim.messages import JSONResponse, Request, StreamResponse
from llmsim.sim.rng import new_id
from llmsim.streaming.stream import EventStream


def has_real(app: Any) -> bool:
    """Whether the app already serves ``POST /v1/responses`` (the real module)."""
    try:
        route, _ = app.router.resolve("POST", "/v1/responses")
    except APIError:
        return False
    return not isinstance(route.handler, FakeResponses)


class FakeResponses:
    """The fake's handler with its own store of responses (one per app)."""

    def __init__(self) -> None:
        self.store: dict[str, Any] = {}

    async def __call__(self, req: Request, app: Any) -> JSONResponse | StreamResponse:
        return await create(req, app, self.store)


def install(app: Any) -> None:
    """Register the fake unless the real Responses module is present (``WSFAKE=1`` forces
    the fake, to test the transport alone)."""
    if has_real(app) and not os.environ.get("WSFAKE"):
        return
    app.router.add("POST", "/v1/responses", FakeResponses(), "responses", stream_capable=True)


def _response(rid: str, model: str, status: str, output: list[Any], prev: str | None,
              usage: dict[str, Any] | None, metadata: Any = None) -> dict[str, Any]:
    return {"id": rid, "object": "response", "created_at": int(time.time()), "model": model,
            "status": status, "output": output, "parallel_tool_calls": True,
            "tool_choice": "auto", "tools": [], "previous_response_id": prev, "error": None,
            "incomplete_details": None, "instructions": None, "metadata": metadata,
            "temperature": 1.0, "top_p": 1.0, "usage": usage}


async def create(req: Request, app: Any,
                 fake_store: dict[str, Any]) -> JSONResponse | StreamResponse:
    body = req.json_object()
    ws = req.transport == "ws"
    model = body.get("model")
    if not isinstance(model, str):
        raise APIError(400, "Missing required parameter: 'model'.", param="model",
                       code="missing_required_parameter")
    if ws and body.get("background"):
        raise APIError(400, "background is not supported over WebSocket.", param="background",
                       code="invalid_value")
    prev = body.get("previous_response_id")
    if prev is not None:
        rec = req.context.cached_response(prev) if ws else None
        if rec is None:
            rec = fake_store.get(prev)
        if rec is None:
            raise APIError(400, f"Previous response with id '{prev}' not found.",
                           param="previous_response_id", code="previous_response_not_found")
    n = int(body.get("max_output_tokens") or app.config.output_tokens_mean)
    generate = body.get("generate", True) is not False
    rid = new_id("resp_")
    itl = (app.config.itl_ms or 0.0) / 1000.0
    store = body.get("store", True) is not False
    meta = body.get("metadata") or {}

    def plan():  # type: ignore[no-untyped-def]
        yield 0.0, "response.created", {"type": "response.created", "response": _response(
            rid, model, "in_progress", [], prev, None)}
        output: list[Any] = []
        out_tokens = 0
        if generate:
            yield 0.0, "response.in_progress", {"type": "response.in_progress",
                                                "response": _response(rid, model,
                                                                      "in_progress", [], prev,
                                                                      None)}
            mid = new_id("msg_")
            item = {"id": mid, "type": "message", "role": "assistant", "status": "in_progress",
                    "content": []}
            yield 0.0, "response.output_item.added", {"type": "response.output_item.added",
                                                      "output_index": 0, "item": item}
            part = {"type": "output_text", "text": "", "annotations": []}
            yield 0.0, "response.content_part.added", {
                "type": "response.content_part.added", "item_id": mid, "output_index": 0,
                "content_index": 0, "part": part}
            words = [f"w{i} " for i in range(n)]
            for w in words:
                yield itl, "response.output_text.delta", {
                    "type": "response.output_text.delta", "item_id": mid, "output_index": 0,
                    "content_index": 0, "delta": w, "logprobs": []}
            text = "".join(words)
            yield 0.0, "response.output_text.done", {
                "type": "response.output_text.done", "item_id": mid, "output_index": 0,
                "content_index": 0, "text": text, "logprobs": []}
            done_part = {"type": "output_text", "text": text, "annotations": []}
            yield 0.0, "response.content_part.done", {
                "type": "response.content_part.done", "item_id": mid, "output_index": 0,
                "content_index": 0, "part": done_part}
            done_item = {**item, "status": "completed", "content": [done_part]}
            yield 0.0, "response.output_item.done", {"type": "response.output_item.done",
                                                     "output_index": 0, "item": done_item}
            output = [done_item]
            out_tokens = n
        usage = {"input_tokens": 3, "input_tokens_details": {"cached_tokens": 0,
                                                             "cache_write_tokens": 0},
                 "output_tokens": out_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": 3 + out_tokens}
        final = _response(rid, model, "completed", output, prev, usage, meta)
        if ws:
            req.context.cache_response({"id": rid, "response": final})
        if store:
            fake_store[rid] = final
        yield 0.0, "response.completed", {"type": "response.completed", "response": final}

    stream = EventStream(plan(), RESPONSES, model=model)
    if ws or body.get("stream"):
        return StreamResponse(stream)
    events = stream.drain()
    return JSONResponse(events[-1][1]["response"])
