"""What selects a recorded Realtime response: the client's events so far, normalised (no I/O).

A Realtime cassette is one recorded session. Each response in it carries the client events
sent since the response before it (``client``) and the server events of the response with
their offsets (``events``); a response's *key* digests the path, the model and every client
event of the session up to the one that asked for it. Normalised: ``event_id``, item and
response ids, ``call_id`` and the ignored fields (``--match-ignore``, the HTTP ``VOLATILE``
ones) are dropped; audio is replaced by its digest and length, and a run of
``input_audio_buffer.append`` events counts as one (how a client chunks its audio does not
matter). A turn the server VAD commits is one marker event, without the audio: where the
VAD cut the buffer is the server's choice, not the client's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
import re
from typing import Any

import orjson

__all__ = ["Tape", "normalise", "validate", "file_name", "RealtimeError", "SERVER_TURN",
           "MAX_TAPE_EVENTS"]

# client events that ask nothing of the model (not part of the key)
SKIPPED = frozenset(("conversation.item.retrieve", "output_audio_buffer.clear"))
ID_FIELDS = frozenset(("event_id", "item_id", "previous_item_id", "response_id"))
ITEM_IDS = frozenset(("id", "call_id"))
SERVER_TURN: dict[str, Any] = {"type": "input_audio_buffer.committed", "by": "server_vad"}
MAX_TAPE_EVENTS = 1 << 16  # client events of one session kept as key material
MAX_RESPONSES = 1 << 16
MAX_EVENTS = 1 << 20
MAX_DURATION_S = 3600.0


def _digest(b64: Any) -> Any:
    """An audio payload → its digest and length (what is kept of it)."""
    if not isinstance(b64, str):
        return b64
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raw = b64.encode()
    return {"sha256": hashlib.sha256(raw).hexdigest()[:32], "bytes": len(raw)}


def _item(it: Any, ignore: frozenset[str]) -> Any:
    if not isinstance(it, dict):
        return it
    out = {k: v for k, v in it.items() if k not in ITEM_IDS and k not in ignore}
    content = out.get("content")
    if isinstance(content, list):
        out["content"] = [{k: (_digest(v) if k == "audio" else v) for k, v in c.items()}
                          if isinstance(c, dict) else c for c in content]
    return out


def _fields(obj: Any, ignore: frozenset[str]) -> Any:
    return {k: v for k, v in obj.items() if k not in ignore} if isinstance(obj, dict) else obj


def normalise(msg: dict[str, Any], ignore: frozenset[str]) -> dict[str, Any]:
    """One client event as key material (see the module doc)."""
    out = {k: v for k, v in msg.items() if k not in ID_FIELDS and k not in ignore}
    if "item" in out:
        out["item"] = _item(out["item"], ignore)
    if "session" in out:
        out["session"] = _fields(out["session"], ignore)
    r = out.get("response")
    if isinstance(r, dict):
        r = _fields(r, ignore)
        if isinstance(r.get("input"), list):
            r["input"] = [_item(i, ignore) for i in r["input"]]
        out["response"] = r
    return out


def _canon(ev: Any) -> bytes:
    return orjson.dumps(ev, option=orjson.OPT_SORT_KEYS) + b"\n"


class Tape:
    """The key material of one session as it grows: normalised client events, a running
    digest over them, and the audio run not yet closed. ``cut()`` marks where a response was
    asked for and returns its key."""

    def __init__(self, path: str, model: str, ignore: frozenset[str]) -> None:
        self.ignore = ignore
        self.events: list[dict[str, Any]] = []
        self.size = 0  # bytes of the canonical events (against the session's budget)
        self._hash = hashlib.sha256(f"realtime {path} {model}\n".encode())
        self._audio: Any = None  # hashlib object of the open append run
        self._audio_bytes = 0

    def client(self, msg: dict[str, Any]) -> None:
        """A client event (a dict: other messages are the server's to refuse)."""
        t = msg.get("type")
        if t in SKIPPED:
            return
        if t == "input_audio_buffer.append":
            b64 = msg.get("audio")
            if isinstance(b64, str):
                try:
                    raw = base64.b64decode(b64, validate=True)
                except (binascii.Error, ValueError):
                    raw = b64.encode()
                if self._audio is None:
                    self._audio = hashlib.sha256()
                self._audio.update(raw)
                self._audio_bytes += len(raw)
                return
        self._close_audio()
        self.add(normalise(msg, self.ignore))

    def server_turn(self) -> None:
        """The server VAD committed the buffer: the open audio run becomes a turn marker."""
        self._audio = None
        self._audio_bytes = 0
        self.add(dict(SERVER_TURN))

    def add(self, ev: dict[str, Any]) -> None:
        """A normalised event (also how a loaded cassette's events are replayed in)."""
        if len(self.events) >= MAX_TAPE_EVENTS:
            raise OverflowError(f"more than {MAX_TAPE_EVENTS} client events")
        data = _canon(ev)
        self.size += len(data)
        self.events.append(ev)
        self._hash.update(data)

    def _close_audio(self) -> None:
        if self._audio is not None:
            d, n = self._audio.hexdigest()[:32], self._audio_bytes
            self._audio = None
            self._audio_bytes = 0
            self.add({"type": "input_audio_buffer.append", "audio": {"sha256": d, "bytes": n}})

    def cut(self) -> str:
        """The key of a response asked for now (the open audio run is closed first)."""
        self._close_audio()
        return self._hash.hexdigest()[:32]


class RealtimeError(ValueError):
    """A Realtime cassette that cannot be served (the message names the field)."""


def _seconds(v: Any, where: str) -> float:
    if type(v) not in (int, float) or not math.isfinite(v) or not 0 <= v <= MAX_DURATION_S:
        raise RealtimeError(f"{where}: a number of seconds, 0 to {MAX_DURATION_S:g}")
    return float(v)


def validate(entry: dict[str, Any]) -> dict[str, Any]:
    """A Realtime cassette (``"kind": "realtime"``) checked field by field; RealtimeError
    names the field."""
    path, model = entry.get("path"), entry.get("model")
    if type(path) is not str or not path.startswith("/") or len(path) > 2048 \
            or not path.isprintable():
        raise RealtimeError("path: the WebSocket path, e.g. /v1/realtime")
    if type(model) is not str or len(model) > 256:
        raise RealtimeError("model: a string of at most 256 characters")
    rs = entry.get("responses")
    if not isinstance(rs, list) or len(rs) > MAX_RESPONSES:
        raise RealtimeError(f"responses: a list of at most {MAX_RESPONSES} responses")
    out = []
    n_client = n_events = 0
    for i, r in enumerate(rs):
        w = f"responses[{i}]"
        if not isinstance(r, dict):
            raise RealtimeError(f"{w}: an object with client and events")
        client, events = r.get("client"), r.get("events")
        if not isinstance(client, list) or not all(
                isinstance(c, dict) and type(c.get("type")) is str for c in client):
            raise RealtimeError(f"{w}.client: a list of client events (objects with a type)")
        n_client += len(client)
        if n_client > MAX_TAPE_EVENTS:
            raise RealtimeError(f"{w}.client: more than {MAX_TAPE_EVENTS} client events")
        if not isinstance(events, list) or not events:
            raise RealtimeError(f"{w}.events: a non-empty list of [offset_s, event]")
        n_events += len(events)
        if n_events > MAX_EVENTS:
            raise RealtimeError(f"{w}.events: more than {MAX_EVENTS} events")
        evs = []
        last = 0.0
        for j, ev in enumerate(events):
            ew = f"{w}.events[{j}]"
            if not isinstance(ev, list) or len(ev) != 2 or not isinstance(ev[1], dict) \
                    or type(ev[1].get("type")) is not str or not ev[1]["type"][:1].isalpha():
                raise RealtimeError(f"{ew}: [offset_s, event] with the event an object with "
                                    "a type")
            t = _seconds(ev[0], f"{ew}[0]")
            if t < last:
                raise RealtimeError(f"{ew}[0]: offsets must not decrease")
            last = t
            evs.append((t, ev[1]))
        if evs[0][1]["type"] != "response.created" or evs[-1][1]["type"] != "response.done":
            raise RealtimeError(f"{w}.events: from response.created to response.done")
        for _, ev in (evs[0], evs[-1]):
            if not isinstance(ev.get("response"), dict) or type(
                    ev["response"].get("id")) is not str:
                raise RealtimeError(f"{w}.events: response.created and response.done carry "
                                    "the response (with its id)")
        out.append({"client": client, "events": evs})
    return {"version": 2, "kind": "realtime", "path": path, "model": model,
            "headers": entry.get("headers") or {}, "responses": out}


def file_name(model: str, key: str) -> str:
    """A Realtime cassette's file name (the key of its last response)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model)[:64].strip("._") or "none"
    return f"realtime-{slug}-session-{key[:12]}.json"
