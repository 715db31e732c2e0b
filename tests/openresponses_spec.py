"""The Open Responses specification's JSON Schemas (shipped in the PyPI package
``openresponses-py``), as validators of what llmsim sends."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import jsonschema


@cache
def _spec() -> dict[str, Any]:
    specs = sorted(p for p in (resources.files("openresponses") / "openapi").iterdir()
                   if p.name.endswith(".json"))
    doc: dict[str, Any] = json.loads(specs[-1].read_text())  # the newest version shipped
    return doc


@cache
def _validator(name: str) -> jsonschema.protocols.Validator:
    doc = _spec()
    root = {"$ref": f"#/components/schemas/{name}", "components": doc["components"]}
    return jsonschema.Draft202012Validator(root)


def conforms(obj: Any, name: str) -> None:
    """Raise ``jsonschema.ValidationError`` unless ``obj`` is a valid ``name`` (a component
    schema of the spec, e.g. ``ResponseResource``)."""
    _validator(name).validate(obj)


STREAM_EVENTS = {
    "response.created": "ResponseCreatedStreamingEvent",
    "response.queued": "ResponseQueuedStreamingEvent",
    "response.in_progress": "ResponseInProgressStreamingEvent",
    "response.completed": "ResponseCompletedStreamingEvent",
    "response.failed": "ResponseFailedStreamingEvent",
    "response.incomplete": "ResponseIncompleteStreamingEvent",
    "response.output_item.added": "ResponseOutputItemAddedStreamingEvent",
    "response.output_item.done": "ResponseOutputItemDoneStreamingEvent",
    "response.reasoning_summary_part.added": "ResponseReasoningSummaryPartAddedStreamingEvent",
    "response.reasoning_summary_part.done": "ResponseReasoningSummaryPartDoneStreamingEvent",
    "response.content_part.added": "ResponseContentPartAddedStreamingEvent",
    "response.content_part.done": "ResponseContentPartDoneStreamingEvent",
    "response.output_text.delta": "ResponseOutputTextDeltaStreamingEvent",
    "response.output_text.done": "ResponseOutputTextDoneStreamingEvent",
    "response.reasoning_summary_text.delta": "ResponseReasoningSummaryDeltaStreamingEvent",
    "response.reasoning_summary_text.done": "ResponseReasoningSummaryDoneStreamingEvent",
    "response.output_text.annotation.added": "ResponseOutputTextAnnotationAddedStreamingEvent",
    "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaStreamingEvent",
    "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneStreamingEvent",
    "error": "ErrorStreamingEvent",
}


def event_conforms(ev: dict[str, Any]) -> None:
    """A streaming event of a type the spec names is valid (other types: not judged)."""
    name = STREAM_EVENTS.get(ev["type"])
    if name is not None:
        conforms(ev, name)
