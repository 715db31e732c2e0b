"""Client events of the Responses WebSocket mode, parsed as pure functions (no session).

:func:`parse_client_event` turns one complete text message into a :class:`Create` (the body
of a ``POST /v1/responses``, its lane, its ``previous_response_id``) or a :class:`Steer`, or
raises :class:`EventError`: an :class:`~llmsim.errors.APIError` the session sends as the SDK's
``error`` event (with ``stream_id`` when the event named one) while the connection stays open.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

from ...errors import APIError, E, missing
from ...messages import check_json_depth

__all__ = ["STREAM_ID_RE", "Create", "Steer", "EventError", "parse_client_event"]

STREAM_ID_RE = re.compile(r"[A-Za-z0-9_.-]{1,256}\Z")


class EventError(APIError):
    """A client event refused with an ``error`` event; ``stream_id`` is echoed on it."""

    def __init__(self, err: APIError, stream_id: str | None = None) -> None:
        super().__init__(err.status, err.message, type=err.type, param=err.param,
                         code=err.code, headers=err.headers)
        self.stream_id = stream_id


@dataclass(frozen=True, slots=True)
class Create:
    """``response.create``: the Responses body (flat or nested form merged), its lane."""

    stream_id: str | None
    body: dict[str, Any]
    previous_id: str | None


@dataclass(frozen=True, slots=True)
class Steer:
    """``response.steer`` (answered ``response.steer.failed``: steering is not simulated)."""

    previous_id: str
    input: str | list[Any]


def parse_client_event(text: str) -> Create | Steer:
    """One complete client message → its event, or :class:`EventError`."""
    try:
        msg = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise EventError(E.websocket_invalid_json.at(reason=exc)) from None
    if not isinstance(msg, dict):
        raise EventError(E.websocket_not_an_event.at())
    try:
        check_json_depth(msg, text)  # (the same bound as HTTP bodies, before any echo)
    except APIError as exc:
        raise EventError(exc) from None
    etype = msg.get("type")
    if etype is None:
        raise EventError(missing("type"))
    if etype == "response.create":
        return _create(msg)
    if etype == "response.steer":
        return _steer(msg)
    shown = etype if isinstance(etype, str) else orjson.dumps(etype).decode()
    raise EventError(E.invalid_value.at("type", value=shown, allowed="'response.create' "
                                              "and 'response.steer'"))


def _create(msg: dict[str, Any]) -> Create:
    sid = msg.get("stream_id")
    nested = msg.get("response")
    if nested is not None:
        if not isinstance(nested, dict):
            raise EventError(E.invalid_type.at("response", expected="an object"),
                             sid if isinstance(sid, str) else None)
        body = dict(nested)
        if sid is None:
            sid = body.get("stream_id")
        for k, v in msg.items():
            if k not in ("type", "response", "stream_id"):
                body.setdefault(k, v)
    else:
        body = {k: v for k, v in msg.items() if k != "type"}
    body.pop("stream_id", None)
    body.pop("type", None)
    if sid is not None and (not isinstance(sid, str) or not STREAM_ID_RE.match(sid)):
        raise EventError(E.invalid_stream_id.at("stream_id"))
    prev = body.get("previous_response_id")
    return Create(sid, body, prev if isinstance(prev, str) else None)


def _steer(msg: dict[str, Any]) -> Steer:
    prev = msg.get("previous_response_id")
    inp = msg.get("input")
    if not isinstance(prev, str) or not prev:
        raise EventError(missing("previous_response_id"))
    if not isinstance(inp, (str, list)) or (isinstance(inp, list) and not inp):
        raise EventError(E.steer_input_invalid.at("input"))
    return Steer(prev, inp)
