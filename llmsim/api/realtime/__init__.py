"""The OpenAI Realtime API (``GET /v1/realtime?model=…`` with ``Upgrade: websocket``), as the
official SDK's ``client.realtime.connect(model=…)`` speaks it (GA event names): a mode of the
generic WebSocket connection (:mod:`llmsim.transport.ws`).

A connection holds one session (:mod:`.session`), one conversation (items in order, bounded:
the oldest are dropped past :data:`MAX_ITEMS` / :data:`MAX_CONVERSATION_CHARS`, as the real
service truncates a long conversation), and one input audio buffer, of which only the length
and the VAD's state are kept (:mod:`.audio`). Client events are handled as they arrive; a bad
one gets the Realtime ``error`` event (with the client's ``event_id``) and the connection
stays open.

``response.create`` becomes ``Request(method="POST", path="/v1/realtime", transport="ws")``
dispatched through ``app.dispatch`` with this module's route, so auth, rate limits, faults and
capacity apply as to any request; the handler builds the decision core's
:class:`~llmsim.sim.decide.Ask` from the session and the conversation and answers through
:meth:`~llmsim.app.App.answer` (scripts apply). Its plan is paced by a
:class:`~llmsim.flow.Pump` on the connection's wire: text and transcript deltas like tokens,
audio deltas in real time (a chunk every :data:`CHUNK_MS` of audio; none of it under
``--latency instant``). One response runs at a time, as on the real service.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections import OrderedDict
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import APIError, E, missing, server_error
from ...messages import RawResponse, Request, Result, StreamResponse, check_json_depth
from ...routing import Route, WSMode
from ...sim import schema as sch
from ...sim import tokens as tok
from ...sim.decide import Ask, Decision, Usage
from ...sim.rng import derive, new_id, new_request_id, request_seed, rng_of
from ...state import accounting
from ...streaming.dialect import Dialect
from ...streaming.flow import Pump
from ...streaming.start import start_handler
from ...streaming.stream import EventStream
from .audio import (
    AUDIO_TOKENS_IN_PER_S,
    AUDIO_TOKENS_OUT_PER_S,
    VAD,
    Speech,
    bytes_per_ms,
    speech,
)
from .session import (
    Session,
    decide_tools,
    parse_format,
    parse_max_output,
    parse_modalities,
    parse_tool_choice,
    parse_tools,
    parse_voice,
    tool_choice_of,
)

if TYPE_CHECKING:
    from ..services import Host, Services

__all__ = ["RealtimeWS", "PATHS", "register", "DIALECT", "Item", "Job", "error_event"]

log = logging.getLogger("llmsim")
PATHS = ("/v1/realtime", "/openai/v1/realtime")
ENDPOINT = "realtime"
DEFAULT_MODEL = "gpt-realtime"
CHUNK_MS = 200  # audio per output_audio.delta
MAX_APPEND_B64 = 15 * 1024 * 1024  # base64 characters of one append (the real API's limit)
MAX_BUFFER_MS = 15 * 60 * 1000  # input audio buffer (only its length is held)
MIN_COMMIT_MS = 100
MAX_ITEMS = 4096
MAX_CONVERSATION_CHARS = 4 * 1024 * 1024
MAX_ITEM_CHARS = 1024 * 1024
MAX_EVENT_ID = 128
TRANSCRIBE_WORDS_PER_S = 2.5  # words of simulated transcript per second of speech
TOKEN_TYPES = frozenset({"response.output_text.delta", "response.output_audio_transcript.delta",
                         "response.function_call_arguments.delta"})
CLIENT_EVENTS = ("session.update", "input_audio_buffer.append", "input_audio_buffer.commit",
                 "input_audio_buffer.clear", "conversation.item.create",
                 "conversation.item.retrieve", "conversation.item.truncate",
                 "conversation.item.delete", "response.create", "response.cancel",
                 "output_audio_buffer.clear")


# ------------------------------------------------------------------------------------------
# Wire format
# ------------------------------------------------------------------------------------------

def _ws(etype: str, data: Any) -> bytes:
    """One server event: ``type`` and a fresh ``event_id`` first, then the payload."""
    ev = {"type": etype, "event_id": new_id("event_")}
    ev.update(data)
    return orjson.dumps(ev)


def error_event(err: APIError, client_event_id: str | None = None) -> dict[str, Any]:
    """The SDK's ``RealtimeErrorEvent``."""
    e: dict[str, Any] = {"type": err.type, "code": err.code, "message": err.message,
                         "param": err.param, "event_id": client_event_id}
    return {"type": "error", "event_id": new_id("event_"), "error": e}


def _error_events(err: APIError) -> list[tuple[str, Any]]:
    ev = error_event(err)
    del ev["type"], ev["event_id"]
    return [("error", ev)]


def _no_sse(etype: str, data: Any) -> bytes:
    raise TypeError("the Realtime API has no SSE form")


def _no_sse_error(err: APIError, seq: int) -> bytes:
    raise TypeError("the Realtime API has no SSE form")


DIALECT = Dialect(ENDPOINT, numbered=False, sse=_no_sse, sse_error=_no_sse_error,
                  error_events=_error_events, ws=_ws, token_types=TOKEN_TYPES,
                  terminals=frozenset({"response.done"}))


def _usage_wire(u: Usage, text_in: int, audio_in: int, text_out: int,
                audio_out: int) -> dict[str, Any]:
    return {"total_tokens": u.prompt_tokens + u.output_tokens,
            "input_tokens": u.prompt_tokens, "output_tokens": u.output_tokens,
            "input_token_details": {"text_tokens": text_in, "audio_tokens": audio_in,
                                    "image_tokens": 0, "cached_tokens": u.cached_tokens,
                                    "cached_tokens_details": {"text_tokens": u.cached_tokens,
                                                              "audio_tokens": 0,
                                                              "image_tokens": 0}},
            "output_token_details": {"text_tokens": text_out, "audio_tokens": audio_out}}


# ------------------------------------------------------------------------------------------
# Conversation items
# ------------------------------------------------------------------------------------------

class Item:
    """A conversation item: its wire shape, its text (for the prompt), its tokens, and the
    audio it carries (ms)."""

    __slots__ = ("data", "text", "tokens", "audio_ms", "chars")

    def __init__(self, data: dict[str, Any], text: str, audio_ms: int = 0) -> None:
        self.data = data
        self.text = text
        self.tokens = 0
        self.audio_ms = audio_ms
        self.chars = len(text) + 64

    @property
    def id(self) -> str:
        return str(self.data["id"])


def _audio_ms(b64: str, fmt: dict[str, Any], p: str) -> int:
    if len(b64) > MAX_APPEND_B64:
        raise E.realtime_append_too_large.at(p, size=len(b64), cap=MAX_APPEND_B64)
    try:
        raw = base64.b64decode(b64, validate=True)
    except (binascii.Error, ValueError):
        raise E.realtime_bad_base64.at(p) from None
    return len(raw) // bytes_per_ms(fmt["type"])


def parse_item(raw: Any, p: str, fmt: dict[str, Any]) -> Item:
    """A client's conversation item → :class:`Item` (message or function call/output)."""
    if not isinstance(raw, dict):
        raise E.invalid_type.at(p, expected="an object")
    t = raw.get("type")
    if t is None:
        raise missing(f"{p}.type")
    iid = raw.get("id")
    if iid is None:
        iid = new_id("item_")
    elif not isinstance(iid, str) or not 1 <= len(iid) <= 64:
        raise E.invalid_type.at(f"{p}.id", expected="a string of 1 to 64 characters")
    base = {"id": iid, "object": "realtime.item", "type": t, "status": "completed"}
    if t == "message":
        role = raw.get("role")
        if role not in ("user", "system", "assistant"):
            raise E.invalid_value.at(f"{p}.role", value=str(role)[:64],
                                     allowed="'user', 'system', 'assistant'")
        content = raw.get("content")
        if not isinstance(content, list) or not content:
            raise E.invalid_type.at(f"{p}.content", expected="a non-empty array")
        kinds = {"user": ("input_text", "input_audio"), "system": ("input_text",),
                 "assistant": ("output_text", "output_audio")}[role]
        parts = []
        texts = []
        ms = 0
        for j, c in enumerate(content):
            cp = f"{p}.content[{j}]"
            if not isinstance(c, dict):
                raise E.invalid_type.at(cp, expected="an object")
            ct = c.get("type")
            if ct not in kinds:
                raise E.invalid_value.at(f"{cp}.type", value=str(ct)[:64],
                                         allowed=", ".join(f"'{k}'" for k in kinds))
            if ct in ("input_text", "output_text"):
                text = c.get("text")
                if not isinstance(text, str):
                    raise E.invalid_type.at(f"{cp}.text", expected="a string")
                parts.append({"type": ct, "text": text})
                texts.append(text)
            else:
                audio = c.get("audio")
                transcript = c.get("transcript")
                if transcript is not None and not isinstance(transcript, str):
                    raise E.invalid_type.at(f"{cp}.transcript", expected="a string")
                if audio is not None:
                    if not isinstance(audio, str):
                        raise E.invalid_type.at(f"{cp}.audio", expected="a base64 string")
                    ms += _audio_ms(audio, fmt, f"{cp}.audio")
                part = {"type": ct, "transcript": transcript}
                parts.append(part)
                if transcript:
                    texts.append(transcript)
        text = "\n".join(texts)
        if len(text) > MAX_ITEM_CHARS:
            raise E.realtime_item_too_large.at(p, size=len(text), cap=MAX_ITEM_CHARS)
        return Item({**base, "role": role, "content": parts}, text, ms)
    if t == "function_call":
        name, args = raw.get("name"), raw.get("arguments", "")
        if not isinstance(name, str) or not name:
            raise missing(f"{p}.name")
        if not isinstance(args, str):
            raise E.invalid_type.at(f"{p}.arguments", expected="a string")
        cid = raw.get("call_id") or new_id("call_")
        if not isinstance(cid, str):
            raise E.invalid_type.at(f"{p}.call_id", expected="a string")
        if len(args) > MAX_ITEM_CHARS:
            raise E.realtime_item_too_large.at(p, size=len(args), cap=MAX_ITEM_CHARS)
        return Item({**base, "name": name, "call_id": cid, "arguments": args},
                     name + " " + args)
    if t == "function_call_output":
        cid, out = raw.get("call_id"), raw.get("output")
        if not isinstance(cid, str) or not cid:
            raise missing(f"{p}.call_id")
        if not isinstance(out, str):
            raise E.invalid_type.at(f"{p}.output", expected="a string")
        if len(out) > MAX_ITEM_CHARS:
            raise E.realtime_item_too_large.at(p, size=len(out), cap=MAX_ITEM_CHARS)
        return Item({**base, "call_id": cid, "output": out}, out)
    raise E.invalid_value.at(f"{p}.type", value=str(t)[:64],
                             allowed="'message', 'function_call', 'function_call_output'")


# ------------------------------------------------------------------------------------------
# A response
# ------------------------------------------------------------------------------------------

class Job:
    """One response: its settings (session + response.create overrides), its context, the
    dispatch task, then its pump."""

    __slots__ = ("id", "req", "task", "pump", "res", "done", "streaming", "track",
                 "answered", "first_step", "instructions", "modalities", "tools",
                 "tool_choice", "limit", "voice", "fmt", "speed", "context", "write",
                 "metadata", "output", "usage", "model", "parallel", "ended", "mode",
                 "current", "kind", "said", "played_ms")

    def __init__(self) -> None:
        self.id = new_id("resp_")
        self.req: Request | None = None
        self.task: asyncio.Task[None] | None = None
        self.pump: Pump | None = None
        self.res: StreamResponse | None = None
        self.done = False
        self.streaming = False
        self.track: Any = None
        self.answered = False
        self.first_step = False
        self.output: list[dict[str, Any]] = []  # output items done so far
        self.usage: dict[str, Any] | None = None
        self.ended = False  # response.done was written
        self.instructions = ""
        self.modalities: list[str] = []
        self.tools: list[dict[str, Any]] = []
        self.tool_choice: Any = "auto"
        self.limit: int | str = "inf"
        self.voice = "alloy"
        self.fmt: dict[str, Any] = {}
        self.speed = 1.0
        self.context: list[Item] = []
        self.write = True  # the output joins the conversation ("auto"; "none": out of band)
        self.metadata: Any = None
        self.model = ""
        self.parallel = True
        self.mode: RealtimeWS | None = None
        self.current: Item | None = None  # the output item being said
        self.kind = ""  # its kind: "text", "audio" or "call"
        self.said: list[str] = []  # its pieces sent so far
        self.played_ms = 0  # its audio sent so far

    def finish_current(self, status: str) -> dict[str, Any] | None:
        """The output item being said ends (done, cancelled or failed) with what was said:
        its final form, in the response's output and (being the same Item) the
        conversation."""
        it = self.current
        if it is None:
            return None
        self.current = None
        text = "".join(self.said)
        if self.kind == "call":
            data = {**it.data, "status": status, "arguments": text}
            it.text = f"{data['name']} {text}"
        else:
            part = {"type": "output_text", "text": text} if self.kind == "text" else \
                {"type": "output_audio", "transcript": text}
            data = {**it.data, "status": status, "content": [part]}
            it.text = text
            it.audio_ms = self.played_ms
        it.data = data
        chars = len(it.text) + 64
        mode = self.mode
        if mode is not None and mode.items.get(it.id) is it:  # (still in the conversation)
            mode.chars += chars - it.chars
        it.chars = chars
        it.tokens = (tok.count_tokens(it.text, "o200k_base") + 4
                     + it.audio_ms * AUDIO_TOKENS_IN_PER_S // 1000)
        self.output.append(data)
        return data

    def running(self) -> bool:
        return not self.done

    def wire(self, status: str, details: dict[str, Any] | None = None,
             output: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return {"object": "realtime.response", "id": self.id, "status": status,
                "status_details": details, "output": output if output is not None else [],
                "conversation_id": "conv_default" if self.write else None,
                "output_modalities": list(self.modalities),
                "max_output_tokens": self.limit,
                "audio": {"output": {"format": dict(self.fmt), "voice": self.voice}},
                "usage": self.usage, "metadata": self.metadata}


async def _generate(req: Request, app: Services) -> Result:
    """The route's handler: decide and plan the response of ``req.context`` (a Job)."""
    job: Job = req.context
    profile = app.model(job.model)
    enc = profile.encoding
    text_in = sum(it.tokens for it in job.context) + tok.count_tokens(job.instructions, enc)
    audio_in = sum(it.audio_ms for it in job.context) * AUDIO_TOKENS_IN_PER_S // 1000
    last = job.context[-1] if job.context else None

    def user_text() -> str:
        for it in reversed(job.context):
            if it.data.get("role") == "user":
                return it.text
        return ""

    def prompt_texts() -> list[str]:
        return [job.instructions] + [it.text for it in job.context
                                     if it.data.get("type") == "message"]

    ask = Ask(profile, text_in + audio_in, user_text=user_text, prompt_texts=prompt_texts,
              after_tool_result=last is not None
              and last.data.get("type") == "function_call_output",
              tools=decide_tools(job.tools, "tools"),
              tool_choice=tool_choice_of(job.tool_choice),
              parallel_tool_calls=job.parallel,
              limit=job.limit if isinstance(job.limit, int) else None)
    body = req.json()
    rng = rng_of(request_seed(app.config.seed, "/v1/realtime", body))
    lat = app.latency(profile)
    d = app.answer_now(ask, rng, lat) or await app.answer(req, ENDPOINT, ask, rng, lat)
    audio = "audio" in job.modalities
    speeches: list[Speech | None] = []
    audio_out = text_out = 0
    for c in d.choices[:1]:
        if c.pieces is not None and audio:
            sp = speech(c.pieces, job.voice, job.speed, job.fmt["type"],
                        derive(rng, "voice"))
            speeches.append(sp)
            audio_out += round(sp.duration * AUDIO_TOKENS_OUT_PER_S)
    text_out = d.usage.output_tokens
    usage = Usage(text_in + audio_in, text_out + audio_out, d.usage.reasoning_tokens,
                  d.usage.cached_tokens)
    job.usage = _usage_wire(usage, text_in, audio_in, text_out, audio_out)
    stream = EventStream(_plan(app, job, d, speeches[0] if speeches else None, req), DIALECT,
                         model=job.model, usage=usage, fail=lambda err: _fail(job, err))
    return StreamResponse(stream, usage=usage)


def _fail(job: Job, err: APIError) -> list[tuple[str, Any]]:
    """A response failing mid-stream (an injected fault): the error, then response.done."""
    job.ended = True
    job.finish_current("incomplete")
    return _error_events(err) + [("response.done", {"response": job.wire(
        "failed", {"type": "failed", "error": {"type": err.type, "code": err.code}},
        job.output)})]


def _plan(app: Services, job: Job, d: Decision, sp: Speech | None,
          req: Request) -> Iterator[tuple[float, str, Any]]:
    """The response's events: ``(delay after the previous, type, data)``."""
    rid = job.id
    mode = job.mode
    assert mode is not None
    yield 0.0, "response.created", {"response": job.wire("in_progress")}
    yield 0.0, "rate_limits.updated", {"rate_limits": _rate_limits(req)}
    c = d.choices[0]
    lat = d.timing.lat
    zero = lat.is_zero
    gaps = d.timing.gaps(max(0, d.usage.output_tokens + 64))
    first = d.timing.first
    idx = 0
    if c.pieces is not None:
        iid = new_id("item_")
        item: dict[str, Any] = {"id": iid, "object": "realtime.item", "type": "message",
                                "role": "assistant", "status": "in_progress", "content": []}
        head = {"response_id": rid, "output_index": idx}
        yield 0.0, "response.output_item.added", {**head, "item": dict(item)}
        prev = _begin_item(job, mode, item, "audio" if sp is not None else "text")
        if job.write:
            yield 0.0, "conversation.item.added", {"previous_item_id": prev, "item": dict(item)}
        at = {**head, "item_id": iid, "content_index": 0}
        said = job.said
        if sp is None:
            yield 0.0, "response.content_part.added", {**at, "part": {"type": "text",
                                                                      "text": ""}}
            wait = first
            for piece in c.pieces:
                said.append(piece)
                yield wait, "response.output_text.delta", {**at, "delta": piece}
                wait = next(gaps, 0.0)
            text = "".join(c.pieces)
            yield 0.0, "response.output_text.done", {**at, "text": text}
            yield 0.0, "response.content_part.done", {**at, "part": {"type": "text",
                                                                     "text": text}}
        else:
            yield 0.0, "response.content_part.added", {**at, "part": {"type": "audio",
                                                                      "transcript": ""}}
            yield from _audio_events(at, c.pieces, sp, first, zero, job)
            text = "".join(c.pieces)
            yield 0.0, "response.output_audio.done", dict(at)
            yield 0.0, "response.output_audio_transcript.done", {**at, "transcript": text}
            yield 0.0, "response.content_part.done", {**at, "part": {"type": "audio",
                                                                     "transcript": text}}
            job.played_ms = round(sp.duration * 1000)
        done = job.finish_current("incomplete" if c.finish == "length" else "completed")
        yield 0.0, "response.output_item.done", {**head, "item": done}
        if job.write:
            yield 0.0, "conversation.item.done", {"previous_item_id": prev, "item": done}
    else:
        wait = first
        for call in c.calls:
            iid = new_id("item_")
            item = {"id": iid, "object": "realtime.item", "type": "function_call",
                    "status": "in_progress", "name": call.name, "call_id": call.call_id,
                    "arguments": ""}
            head = {"response_id": rid, "output_index": idx}
            yield 0.0, "response.output_item.added", {**head, "item": dict(item)}
            prev = _begin_item(job, mode, item, "call")
            if job.write:
                yield 0.0, "conversation.item.added", {"previous_item_id": prev,
                                                       "item": dict(item)}
            at = {**head, "item_id": iid, "call_id": call.call_id}
            for piece in call.pieces:
                job.said.append(piece)
                yield wait, "response.function_call_arguments.delta", {**at, "delta": piece}
                wait = next(gaps, 0.0)
            yield 0.0, "response.function_call_arguments.done", {
                **at, "name": call.name, "arguments": call.arguments}
            done = job.finish_current("completed" if call.complete else "incomplete")
            yield 0.0, "response.output_item.done", {**head, "item": done}
            if job.write:
                yield 0.0, "conversation.item.done", {"previous_item_id": prev, "item": done}
            idx += 1
    details = None
    status = "completed"
    if c.finish == "length":
        status = "incomplete"
        details = {"type": "incomplete", "reason": "max_output_tokens"}
    job.ended = True
    yield 0.0, "response.done", {"response": job.wire(status, details, job.output)}


def _begin_item(job: Job, mode: RealtimeWS, item: dict[str, Any], kind: str) -> str | None:
    """An output item starts: it joins the conversation now (so a client can truncate the
    audio it is playing), filled in as it is said (:meth:`Job.finish_current`). Returns the
    item before it."""
    prev = mode.last_id() if job.write else None
    live = Item(dict(item), "")
    job.current, job.kind, job.said, job.played_ms = live, kind, [], 0
    if job.write:
        mode.add_item(live, emit=False)
    return prev


def _audio_events(at: dict[str, Any], pieces: list[str], sp: Speech, first: float,
                  zero: bool, job: Job | None = None) -> Iterator[tuple[float, str, Any]]:
    """Transcript deltas at their words' times, audio deltas every CHUNK_MS (real time),
    merged in time order; the last event is due when the audio ends."""
    step = CHUNK_MS / 1000.0
    n_chunks = max(1, -(-sp.samples // (sp.rate * CHUNK_MS // 1000)))
    timeline = sorted([(sp.starts[i], 1, i) for i in range(len(pieces))]
                      + [(k * step, 0, k) for k in range(n_chunks)])
    chunks = sp.chunks(CHUNK_MS)
    prev: float | None = None
    for t, kind, i in timeline:
        wait = 0.0 if zero else first + t if prev is None else t - prev
        prev = t
        if kind == 1:
            if job is not None:
                job.said.append(pieces[i])
            yield wait, "response.output_audio_transcript.delta", {**at, "delta": pieces[i]}
        else:
            if job is not None:
                job.played_ms = min(round(sp.duration * 1000), (i + 1) * CHUNK_MS)
            yield wait, "response.output_audio.delta", {
                **at, "delta": base64.b64encode(next(chunks, b"")).decode()}
    if not zero:
        # the audio plays until its end: what follows (done) is due then
        yield max(0.0, sp.duration - (prev or 0.0)), "_audio_end", None


def _rate_limits(req: Request) -> list[dict[str, Any]]:
    """``rate_limits.updated``: the request and token buckets of ``--rate-limit`` as this
    response was admitted, else the nominal limits of an unlimited server (nothing used)."""
    snap = req.notes.ratelimit
    if snap is None:
        return [{"name": "requests", "limit": 10000, "remaining": 10000, "reset_seconds": 0.0},
                {"name": "tokens", "limit": 10000000, "remaining": 10000000,
                 "reset_seconds": 0.0}]
    return [{"name": name, "limit": b.limit, "remaining": b.remaining,
             "reset_seconds": round(b.reset_in(), 3)}
            for name, b in (("requests", snap.req), ("tokens", snap.tok)) if b is not None]


# ------------------------------------------------------------------------------------------
# The mode
# ------------------------------------------------------------------------------------------

ROUTE = Route("POST", "/v1/realtime", _generate, ENDPOINT, stream_capable=True, streaming=True)


class RealtimeWS(WSMode):
    """The Realtime mode of one connection: session, conversation, audio buffer, response."""

    route = ROUTE  # what a response is dispatched to (the replay mode has its own)

    def __init__(self, app: Host, handshake: Request) -> None:
        self.app = app
        q = handshake.query.get("model") or [""]
        self.session = Session(q[0][:256] or DEFAULT_MODEL)
        self.session.id = new_id("sess_")
        self.items: OrderedDict[str, Item] = OrderedDict()
        self.chars = 0
        self.buffer_ms = 0  # audio in the input buffer
        self.buffer_item = new_id("item_")  # the id the next committed audio item gets
        self.vad = self._new_vad()
        self.job: Job | None = None
        self.turns = 0  # committed audio turns (seeds their transcripts)
        self._hello = False

    # -- WSMode ------------------------------------------------------------------------------
    def attach(self, conn: Any) -> None:  # (transport.ws.WSConnection)
        super().attach(conn)
        # (after the 101, which the transport writes once attach returns)
        asyncio.get_running_loop().call_soon(self._created)

    def _created(self) -> None:
        if not self.conn.closing and not self._hello:
            self._hello = True
            self.send("session.created", {"session": self.session.wire()})

    @property
    def idle(self) -> bool:
        return self.job is None

    def resume(self) -> None:
        if self.job is not None and self.job.pump is not None:
            self.job.pump.resume()

    def gone(self) -> None:
        self.items.clear()
        self.chars = 0

    def error_event(self, err: APIError, **extra: Any) -> dict[str, Any]:
        if err.code == "websocket_connection_limit_reached":  # the Realtime API's wording
            limit = self.app.config.websocket.connection_time_limit_s
            err = E.realtime_session_expired.at(
                span=f"{limit / 60:g} minutes" if limit >= 60 else f"{limit:g} seconds")
        return error_event(err, extra.get("event_id"))

    def stop(self, reason: str) -> None:
        job = self.job
        if job is None:
            return
        if job.pump is not None:
            job.pump.cancel(reason)  # → _pump_done
        elif job.task is not None and not job.task.done():
            job.task.cancel()  # → _run sees CancelledError → _job_done
        if job.pump is None and (job.task is None or job.task.done()) and not job.done:
            self._job_done(job, reason)

    # -- helpers -------------------------------------------------------------------------------
    def send(self, etype: str, data: dict[str, Any]) -> None:
        self.conn.wire.write_events([_ws(etype, data)])

    def _new_vad(self) -> VAD:
        s = self.session
        td = s.turn_detection
        return VAD(s.in_format["type"], float(td.get("threshold", 0.5)) if td else 0.5,
                   int(td.get("prefix_padding_ms", 300)) if td else 0, s.vad_silence_ms())

    def last_id(self) -> str | None:
        return next(reversed(self.items), None) if self.items else None

    def add_item(self, item: Item, emit: bool = True, after: str | None = "") -> None:
        """Append ``item`` (or insert it after ``after``: None = at the start), dropping the
        oldest items past the conversation's bounds; ``emit``: send added + done."""
        item.tokens = tok.count_tokens(item.text, "o200k_base") + 4 if item.text else 4
        item.tokens += item.audio_ms * AUDIO_TOKENS_IN_PER_S // 1000
        prev = self.last_id() if after == "" else after
        self.items[item.id] = item
        if after != "":
            self._reorder(item.id, after)
        self.chars += item.chars
        while len(self.items) > 1 and (len(self.items) > MAX_ITEMS
                                       or self.chars > MAX_CONVERSATION_CHARS):
            _, old = self.items.popitem(last=False)
            self.chars -= old.chars
        if emit:
            self.send("conversation.item.added", {"previous_item_id": prev, "item": item.data})
            self.send("conversation.item.done", {"previous_item_id": prev, "item": item.data})

    def _reorder(self, iid: str, after: str | None) -> None:
        keys = list(self.items)
        keys.remove(iid)
        pos = 0 if after is None else keys.index(after) + 1
        keys.insert(pos, iid)
        for k in keys[pos:]:
            self.items.move_to_end(k)

    # -- client events ----------------------------------------------------------------------
    def message(self, text: str) -> None:
        eid: str | None = None
        try:
            try:
                msg = orjson.loads(text)
            except orjson.JSONDecodeError as exc:
                raise E.websocket_invalid_json.at(reason=exc) from None
            if not isinstance(msg, dict):
                raise E.websocket_not_an_event.at()
            e = msg.get("event_id")
            if isinstance(e, str):
                eid = e[:MAX_EVENT_ID]
            check_json_depth(msg, text)
            etype = msg.get("type")
            if etype is None:
                raise missing("type")
            fn = _HANDLERS.get(etype) if isinstance(etype, str) else None
            if fn is None:
                shown = etype if isinstance(etype, str) else orjson.dumps(etype).decode()
                raise E.invalid_value.at("type", value=shown,
                                         allowed=", ".join(f"'{t}'" for t in CLIENT_EVENTS))
            fn(self, msg)
        except APIError as exc:
            self.conn.send_event(error_event(exc, eid))

    def _session_update(self, msg: dict[str, Any]) -> None:
        s = msg.get("session")
        if s is None:
            raise missing("session")
        before = (self.session.in_format["type"], repr(self.session.turn_detection))
        self.session.update(s, sch.Work())
        if (self.session.in_format["type"], repr(self.session.turn_detection)) != before:
            ms = self.vad.ms
            self.vad = self._new_vad()
            self.vad.ms = ms
        self.send("session.updated", {"session": self.session.wire()})

    def _append(self, msg: dict[str, Any]) -> None:
        audio = msg.get("audio")
        if audio is None:
            raise missing("audio")
        if not isinstance(audio, str):
            raise E.invalid_type.at("audio", expected="a base64 string")
        if len(audio) > MAX_APPEND_B64:
            raise E.realtime_append_too_large.at("audio", size=len(audio), cap=MAX_APPEND_B64)
        try:
            raw = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise E.realtime_bad_base64.at("audio") from None
        fmt = self.session.in_format["type"]
        ms = len(raw) // bytes_per_ms(fmt)
        if self.buffer_ms + ms > MAX_BUFFER_MS:
            raise E.realtime_buffer_full.at(ms=self.buffer_ms + ms, cap=MAX_BUFFER_MS)
        td = self.session.turn_detection
        if td is None:
            self.vad.skip(len(raw))
            self.buffer_ms += ms
            return
        start = self.vad.ms
        for ev in self.vad.feed(raw):
            if ev.kind == "start":
                self.send("input_audio_buffer.speech_started",
                          {"audio_start_ms": ev.ms, "item_id": self.buffer_item})
                job = self.job
                if job is not None and td.get("interrupt_response", True):
                    self._cancel(job, "turn_detected")
            else:
                self.send("input_audio_buffer.speech_stopped",
                          {"audio_end_ms": ev.ms, "item_id": self.buffer_item})
                self.buffer_ms += max(0, ev.ms - start)
                start = ev.ms
                self._commit(speech_ms=self.vad.speech_ms)
                if td.get("create_response", True):
                    self._create({}, auto=True)
        self.buffer_ms += max(0, self.vad.ms - start)

    def _commit_event(self, msg: dict[str, Any]) -> None:
        if self.buffer_ms < MIN_COMMIT_MS:
            raise E.realtime_commit_empty.at(ms=self.buffer_ms)
        self._commit(speech_ms=self.vad.speech_ms or self.buffer_ms)

    def _commit(self, speech_ms: int) -> None:
        iid = self.buffer_item
        ms = self.buffer_ms
        prev = self.last_id()
        self.buffer_ms = 0
        self.buffer_item = new_id("item_")
        self.vad.reset_turn()
        self.send("input_audio_buffer.committed", {"previous_item_id": prev, "item_id": iid})
        tr = self.session.transcription
        part = {"type": "input_audio", "transcript": None}
        item = Item({"id": iid, "object": "realtime.item", "type": "message",
                     "role": "user", "status": "completed", "content": [part]}, "", ms)
        self.add_item(item)
        if tr is None:
            return
        self.turns += 1
        rng = rng_of(request_seed(self.app.config.seed, "/v1/realtime/transcription",
                                  {"turn": self.turns, "ms": ms}))
        words = max(1, round(speech_ms / 1000 * TRANSCRIBE_WORDS_PER_S))
        pieces = tok.lorem_pieces(words, rng)
        text = "".join(pieces).strip()
        for p in pieces:
            self.send("conversation.item.input_audio_transcription.delta",
                      {"item_id": iid, "content_index": 0, "delta": p})
        part["transcript"] = text
        item.text = text
        item.tokens += tok.count_tokens(text, "o200k_base")
        self.send("conversation.item.input_audio_transcription.completed",
                  {"item_id": iid, "content_index": 0, "transcript": text,
                   "usage": {"type": "duration", "seconds": round(ms / 1000, 3)}})

    def _clear(self, msg: dict[str, Any]) -> None:
        self.buffer_ms = 0
        self.vad.reset_turn()
        self.send("input_audio_buffer.cleared", {})

    def _item_create(self, msg: dict[str, Any]) -> None:
        if "item" not in msg:
            raise missing("item")
        item = parse_item(msg["item"], "item", self.session.in_format)
        if item.id in self.items:
            raise E.invalid_value.at("item.id", value=item.id,
                                     allowed="an id not used in this conversation")
        after: str | None = ""
        if "previous_item_id" in msg:
            prev = msg["previous_item_id"]
            if prev == "root":
                after = None
            elif prev is not None:
                if not isinstance(prev, str) or prev not in self.items:
                    raise E.realtime_item_not_found.at("previous_item_id", what="inserting",
                                                       id=str(prev))
                after = prev
        self.add_item(item, after=after)

    def _find(self, msg: dict[str, Any], what: str) -> Item:
        iid = msg.get("item_id")
        if iid is None:
            raise missing("item_id")
        it = self.items.get(iid) if isinstance(iid, str) else None
        if it is None:
            raise E.realtime_item_not_found.at("item_id", what=what, id=str(iid))
        return it

    def _retrieve(self, msg: dict[str, Any]) -> None:
        it = self._find(msg, "retrieving")
        self.send("conversation.item.retrieved", {"item": it.data})

    def _delete(self, msg: dict[str, Any]) -> None:
        it = self._find(msg, "deleting")
        del self.items[it.id]
        self.chars -= it.chars
        self.send("conversation.item.deleted", {"item_id": it.id})

    def _truncate(self, msg: dict[str, Any]) -> None:
        it = self._find(msg, "truncating")
        ci, end = msg.get("content_index", 0), msg.get("audio_end_ms")
        if end is None:
            raise missing("audio_end_ms")
        if isinstance(end, bool) or not isinstance(end, int) or end < 0:
            raise E.invalid_type.at("audio_end_ms", expected="a non-negative integer")
        content = it.data.get("content")
        if (it.data.get("role") != "assistant" or not isinstance(ci, int)
                or not isinstance(content, list) or not 0 <= ci < len(content)
                or content[ci].get("type") != "output_audio"):
            raise E.realtime_truncate_invalid.at("content_index", reason="only an assistant "
                                                 "message's output_audio part can be "
                                                 "truncated")
        if end > it.audio_ms:
            raise E.realtime_truncate_invalid.at("audio_end_ms", reason=f"{end} ms is beyond "
                                                 f"the audio's {it.audio_ms} ms")
        # as the real API: the truncated audio's transcript is dropped from the context
        content[ci] = {"type": "output_audio", "transcript": None}
        it.audio_ms = end
        it.text = ""
        self.send("conversation.item.truncated", {"item_id": it.id, "content_index": ci,
                                                  "audio_end_ms": end})

    def _response_create(self, msg: dict[str, Any]) -> None:
        r = msg.get("response", {})
        if not isinstance(r, dict):
            raise E.invalid_type.at("response", expected="an object")
        self._create(r)

    def _create(self, r: dict[str, Any], auto: bool = False) -> None:
        conn = self.conn
        if conn.draining:
            raise E.server_shutting_down.at()
        if self.job is not None:
            if auto:
                return  # (server VAD: a turn during a response that was not interrupted)
            raise E.realtime_active_response.at(id=self.job.id)
        s = self.session
        job = Job()
        job.model = s.model
        allowed = {"instructions", "output_modalities", "tools", "tool_choice",
                   "max_output_tokens", "audio", "conversation", "metadata", "input", "prompt"}
        for k in r:
            if k not in allowed:
                raise E.unknown_parameter.at(f"response.{k}")
        work = sch.Work()
        job.instructions = s.instructions
        if "instructions" in r:
            v = r["instructions"]
            if not isinstance(v, str):
                raise E.invalid_type.at("response.instructions", expected="a string")
            job.instructions = v[:MAX_ITEM_CHARS]
        job.modalities = (parse_modalities(r["output_modalities"], "response.output_modalities")
                          if "output_modalities" in r else list(s.output_modalities))
        job.tools = parse_tools(r["tools"], "response.tools", work) if "tools" in r \
            else s.tools
        job.tool_choice = parse_tool_choice(r["tool_choice"], "response.tool_choice",
                                            job.tools) if "tool_choice" in r \
            else s.tool_choice
        if isinstance(job.tool_choice, dict) and job.tool_choice["name"] not in {
                t["name"] for t in job.tools}:
            job.tool_choice = "auto"
        job.limit = parse_max_output(r["max_output_tokens"], "response.max_output_tokens") \
            if "max_output_tokens" in r else s.max_output_tokens
        job.parallel = s.parallel_tool_calls
        job.voice, job.fmt, job.speed = s.voice, dict(s.out_format), s.speed
        if "audio" in r:
            a = r["audio"]
            o = a.get("output") if isinstance(a, dict) else None
            if not isinstance(o, dict):
                raise E.invalid_type.at("response.audio.output", expected="an object")
            if "voice" in o:
                job.voice = parse_voice(o["voice"], "response.audio.output.voice")
            if "format" in o:
                job.fmt = parse_format(o["format"], "response.audio.output.format")
        conv = r.get("conversation", "auto")
        if conv not in ("auto", "none"):
            raise E.invalid_value.at("response.conversation", value=str(conv)[:64],
                                     allowed="'auto', 'none'")
        job.write = conv == "auto"
        md = r.get("metadata")
        if md is not None and (not isinstance(md, dict) or len(md) > 16 or not all(
                isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= 512
                for k, v in md.items())):
            raise E.invalid_type.at("response.metadata", expected="an object of at most 16 "
                                    "string values")
        job.metadata = md
        if "input" in r:
            job.context = self._input(r["input"])
        else:
            job.context = list(self.items.values())
        hs = conn.handshake
        body: dict[str, Any] = {"model": job.model, "instructions": job.instructions,
                "input": [it.text for it in job.context],
                "output_modalities": job.modalities, "voice": job.voice,
                "tools": [t["name"] for t in job.tools]}
        if isinstance(job.limit, int):
            body["max_output_tokens"] = job.limit
        req = Request(method="POST", path="/v1/realtime", query=hs.query, headers=hs.headers,
                      body=orjson.dumps(body), request_id=new_request_id(),
                      transport="ws", client=hs.client, received_at=self.app.clock.now(),
                      context=job)
        job.mode = self
        job.req = req
        self.job = job
        self.app.stats.request_open()
        self.conn.defer(self._start_job, job, None)  # (the next loop pass, as HTTP's)

    def _input(self, raw: Any) -> list[Item]:
        if not isinstance(raw, list):
            raise E.invalid_type.at("response.input", expected="an array")
        if len(raw) > MAX_ITEMS:
            raise E.array_too_long.at("response.input", max_len=MAX_ITEMS, length=len(raw))
        out = []
        for i, it in enumerate(raw):
            p = f"response.input[{i}]"
            if isinstance(it, dict) and it.get("type") == "item_reference":
                ref = it.get("id")
                found = self.items.get(ref) if isinstance(ref, str) else None
                if found is None:
                    raise E.realtime_item_not_found.at(f"{p}.id", what="referencing",
                                                       id=str(ref))
                out.append(found)
            else:
                item = parse_item(it, p, self.session.in_format)
                item.tokens = tok.count_tokens(item.text, "o200k_base") + 4
                out.append(item)
        return out

    def _cancel_event(self, msg: dict[str, Any]) -> None:
        job = self.job
        rid = msg.get("response_id")
        if job is None or (rid is not None and rid != job.id):
            raise E.realtime_cancel_not_active.at()
        self._cancel(job, "client_cancelled")

    def _noop(self, msg: dict[str, Any]) -> None:
        """``output_audio_buffer.clear`` is for WebRTC/SIP; over WebSocket the client holds
        the audio it plays: nothing to do."""

    # -- running a response --------------------------------------------------------------------
    def _start_job(self, job: Job, _: None = None) -> None:
        if not job.done:
            job.task = start_handler(self._run(job), job.running, job)

    async def _run(self, job: Job) -> None:
        assert job.req is not None
        try:
            res = await self.app.dispatch(job.req, self.route)
        except asyncio.CancelledError:
            self._job_done(job, "cancelled")
            return
        except Exception:
            log.exception("realtime dispatch failed")
            res = RawResponse(server_error().body(), status=500)
        job.task = None
        try:
            self._answer(job, res)
        except Exception:
            log.exception("realtime response failed")
            if job.pump is not None:
                job.pump.cancel("error")
            self._job_done(job, "error")

    def _answer(self, job: Job, res: Result) -> None:
        assert job.req is not None
        if type(res) is StreamResponse:
            job.res = res  # type: ignore[assignment]
            if job.done or self.conn.closing:
                res.stream.close()  # type: ignore[union-attr]
                self._close_stream(job, "cancelled")
                self._job_done(job, "cancelled")
                return
            job.streaming = job.answered = True
            job.track = accounting.stream_started(self.app, job.req, ENDPOINT, res,  # type: ignore[arg-type]
                                                  transport="ws")

            def error_frame(err: APIError, seq: int) -> bytes:
                return orjson.dumps(error_event(err))

            job.pump = Pump(res.stream, self.app.clock, _ws, self.conn.wire,  # type: ignore[union-attr]
                            lambda reason: self._pump_done(job, reason), job.track.observe,
                            error_frame)
            job.pump.start(job.req.received_at if job.first_step else None)
            return
        if job.done or self.conn.closing:
            self._job_done(job, "cancelled")
            return
        job.answered = True
        accounting.response_sent(self.app, job.req, ENDPOINT, res.status, res, transport="ws")
        if getattr(res, "abort", False):  # fault injection: drop the connection
            self._job_done(job, "disconnect")
            self.conn.wire.abort()
            return
        err = _error_of(res)
        # the response was accepted, then failed: created, the error, done (failed)
        self.send("response.created", {"response": job.wire("in_progress")})
        self.conn.send_event(error_event(err))
        job.ended = True
        self.send("response.done", {"response": job.wire(
            "failed", {"type": "failed", "error": {"type": err.type, "code": err.code}})})
        self._job_done(job, "error")

    def _cancel(self, job: Job, reason: str) -> None:
        """End ``job`` now (client_cancelled / turn_detected) with its response.done."""
        if job.done:
            return
        if not job.ended and job.streaming:
            job.ended = True
            job.finish_current("incomplete")
            self.send("response.done", {"response": job.wire(
                "cancelled", {"type": "cancelled", "reason": reason}, job.output)})
        if job.pump is not None:
            job.pump.cancel("cancelled")
        elif job.task is not None and not job.task.done():
            job.task.cancel()
        else:
            self._job_done(job, "cancelled")

    def _pump_done(self, job: Job, reason: str) -> None:
        self._close_stream(job, reason)
        self._job_done(job, reason)

    def _close_stream(self, job: Job, reason: str) -> None:
        accounting.close_job_stream(self.app, job, reason)

    def _job_done(self, job: Job, reason: str) -> None:
        if job.done:
            return
        job.done = True
        job.pump = None
        if job.res is not None:  # (decided, never pumped)
            self._close_stream(job, reason)
        if not job.answered and job.req is not None:
            accounting.request_gone(self.app, job.req, ENDPOINT, transport="ws")
        if self.job is job:
            self.job = None
        self.app.stats.request_close()
        conn = self.conn
        if conn.draining and not conn.closing and self.idle:
            conn.close(1001, "server shutting down")


def _error_of(res: Result) -> APIError:
    """The error a refused response was answered with (dispatch renders every error it
    decides with the error object attached, :func:`~llmsim.messages.error_result`)."""
    e = getattr(res, "error", None)
    return e if isinstance(e, APIError) else server_error()


_HANDLERS = {
    "session.update": RealtimeWS._session_update,
    "input_audio_buffer.append": RealtimeWS._append,
    "input_audio_buffer.commit": RealtimeWS._commit_event,
    "input_audio_buffer.clear": RealtimeWS._clear,
    "conversation.item.create": RealtimeWS._item_create,
    "conversation.item.retrieve": RealtimeWS._retrieve,
    "conversation.item.truncate": RealtimeWS._truncate,
    "conversation.item.delete": RealtimeWS._delete,
    "response.create": RealtimeWS._response_create,
    "response.cancel": RealtimeWS._cancel_event,
    "output_audio_buffer.clear": RealtimeWS._noop,
}


def register(app: Host) -> None:
    app.router.add_ws(PATHS, RealtimeWS)
