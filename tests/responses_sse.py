"""Streamed Responses creates read over raw HTTP, each event validated strictly by the openai
SDK's own event types."""

from __future__ import annotations

import json
from typing import Any

import orjson
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from llmsim.streaming.stream import EventStream

from . import rawhttp

SSE_EVENT = TypeAdapter(ResponseStreamEvent)


def strict_sse_events(srv: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The SSE events of ``body`` created with ``stream: true``; each event's name is its type."""
    return strict_events(rawhttp.request(srv.url, "POST", "/v1/responses",
                                         {**body, "stream": True}))


def strict_events(r: Any) -> list[dict[str, Any]]:
    """The SSE events of a streamed answer (``rawhttp``'s), each validated strictly and named
    by its type."""
    assert r.status == 200, r.body
    out = []
    for name, data in r.sse():
        ev = json.loads(data)
        SSE_EVENT.validate_python(ev, strict=True)
        assert name == ev["type"]
        out.append(ev)
    return out


def wire_events(stream: EventStream) -> list[tuple[str, Any]]:
    """Every event of ``stream`` (drained) as a client reads it: its type and the JSON the
    dialect's WebSocket encoder writes, parsed (a Responses plan yields most of its events
    rendered already, as ``bytes``)."""
    enc = stream.dialect.ws
    assert enc is not None
    return [(t, orjson.loads(enc(t, d))) for t, d in stream.drain()]
