"""The Responses API: ``/v1/responses`` (JSON, SSE, background, WebSocket via dispatch),
stored responses (retrieve, delete, cancel, input items, resumable streams), input token
counting, and minimal ``/v1/conversations``.

A create is a :class:`Responses` family of the request pipeline (:mod:`..pipeline`: memo,
seed, prompt cache, answer, delivery): its parse (:func:`parse.parse_body`, then the context:
the stored chain of ``previous_response_id`` or a conversation transcript, plus this input
with ``item_reference`` resolved; :func:`parse.ask` is the request as the decision reads it)
and its hooks (:func:`render.response_out` lays the decision out as output items; a
:class:`state.Record` tracks the response, stored, while its events are rendered as JSON
after the simulated duration, as an SSE/WebSocket stream, or by a background run on the
shared clock).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import orjson

from ...errors import APIError, E, missing
from ...messages import JSONResponse, Request, Result, StreamResponse
from ...sim import text as txt
from ...sim import tokens as tok
from ...sim.cache import Segments
from ...sim.decide import Decision
from ...sim.described import json_hint
from ...sim.prompt import cached_prefix_tokens, input_steps
from ...sim.rng import new_id
from ...state import accounting
from ...streaming.stream import EventStream
from ..caching import openai_cached
from ..pipeline import Family, Meta, Parsed, run_detached
from ..pipeline import register as serve
from ..validate import V, check_request_work, paced
from . import compaction, hosted, render, ws
from .parse import ID_PREFIX, RespRequest, ask, generated_ids, normalize_input, parse_body
from .render import RESPONSES, RespOut
from .state import (
    CANCEL,
    DELETED,
    Conversation,
    PreviousResponses,
    Record,
    ResponsesState,
    Snapshot,
    input_bytes,
    install,
    record_bytes,
    state,
)

if TYPE_CHECKING:
    from ..services import Host, Services

__all__ = ["register", "FAMILY", "is_token_event"]

Item = dict[str, Any]
WATCH_S = 0.2  # --workers > 1: how often a running background response checks for a remote
#               cancel/delete (one indexed sqlite read per running response per period)
REMOTE_CANCEL_WAIT_S = 5.0  # a cancel on another worker waits this long for the owner
is_token_event = RESPONSES.is_token
"""An event that carries one generated token (text, summary or tool-call argument)."""


def _not_found(rid: str) -> APIError:
    return E.response_not_found.at("response_id", id=rid)


def _prev_not_found(rid: str) -> APIError:
    return E.previous_response_not_found.at("previous_response_id", id=rid)


# ------------------------------------------------------------------------------------------
# Context assembly
# ------------------------------------------------------------------------------------------

def _lookup(st: ResponsesState, rid: str) -> Record | Snapshot | None:
    """A stored response: this worker's record, else (``--workers > 1``) the snapshot another
    worker published. A local record deleted through another worker is dropped here."""
    rec = st.store.get(rid)
    sh = st.shared
    if sh is None:
        return rec
    if rec is not None:
        if rec.shared is not None and (rec.terminal or rec.stream is not None) and \
                sh.gone(rid):
            # published, then deleted or evicted from the shared store (its byte budget):
            # no other worker answers for it, so neither does its owner
            _forget(st, rec)
            return None
        return rec
    return sh.get(rid)


def _forget(st: ResponsesState, rec: Record) -> None:
    """``rec`` is gone from the shared store: drop it here too and stop it if it runs, without
    publishing it back (``rec.shared`` stays: its children still read their chain there)."""
    st.store.pop(rec.id)
    if rec.pump is not None:
        sh, rec.shared = rec.shared, None
        try:
            rec.cancel()
        finally:
            rec.shared = sh


def _previous_responses(req: Request) -> PreviousResponses | None:
    """The transport's previous-response cache of ``req`` (a WebSocket create), if any."""
    ctx: PreviousResponses | None = req.context if req.transport == "ws" else None
    return ctx


def _find_previous(req: Request, st: ResponsesState, rid: str) -> Record | Snapshot:
    rec: Record | Snapshot | None = None
    ctx = _previous_responses(req)
    if ctx is not None:
        rec = ctx.cached_response(rid)
    if rec is None:
        rec = _lookup(st, rid)
    if rec is None:
        raise _prev_not_found(rid)
    if not rec.terminal:
        raise E.previous_response_in_progress.at("previous_response_id", id=rid)
    return rec


def _resolve_refs(items: list[Item], history: list[Item], st: ResponsesState) -> list[Item]:
    """Replace ``item_reference`` placeholders by the referenced items (earlier turns of this
    context first, then any stored response): one dict lookup each (``st.items``)."""
    if not any(it.get("type") == "item_reference" for it in items):
        return items
    known = {it.get("id"): it for it in history if it.get("id")}
    out = []
    for i, it in enumerate(items):
        if it.get("type") != "item_reference":
            out.append(it)
            known[it.get("id")] = it
            continue
        hit = known.get(it["id"])
        if hit is None:
            hit = st.items.find(it["id"], st.store)
            if hit is None:
                raise E.item_not_found.at(f"input[{i}]", id=it["id"])
            known[it["id"]] = hit
        out.append(hit)
    return out


_OUTPUTS = frozenset(("function_call_output", "custom_tool_call_output",
                      *hosted.CALL_OF_OUTPUT))
_CALLS = frozenset(("function_call", "custom_tool_call", *hosted.CALL_OF_OUTPUT.values()))


def _check_call_ids(items: list[Item], history: list[Item], given: list[Item]) -> None:
    """Every tool output must answer a tool call of the context (a compacted one too), as
    the real API insists (``given``: the input as sent, which names a bad blob)."""
    if not any(it.get("type") in _OUTPUTS for it in items):
        return  # (nothing to check: no scan of a long history)
    calls = {it.get("call_id") for it in history if it.get("type") in _CALLS}
    calls |= compaction.call_ids(history + items, given)
    for i, it in enumerate(items):
        t = it.get("type")
        if t in _CALLS:
            calls.add(it.get("call_id"))
        elif t in _OUTPUTS and it.get("call_id") not in calls:
            raise E.no_tool_call_for_output.at(f"input[{i}]", call_id=it.get("call_id"))


class Prepared:
    """A request made ready to simulate: validated, context assembled, tokens counted (and,
    for a create, the fields its Response echoes)."""

    __slots__ = ("rr", "parent", "conversation", "input_items", "context", "input_tokens",
                 "cached_tokens", "echo", "kept")

    def __init__(self, rr: RespRequest, parent: Record | Snapshot | None, conv: Conversation | None,
                 input_items: list[Item], context: list[Item], input_tokens: int,
                 cached_tokens: int, echo: dict[str, Any] | None = None,
                 kept: _Kept | None = None) -> None:
        self.rr = rr
        self.parent = parent
        self.conversation = conv
        self.input_items = input_items
        self.context = context
        self.input_tokens = input_tokens
        self.cached_tokens = cached_tokens
        self.echo = echo
        self.kept = kept  # the body memo's entry it was made from (its input_bytes kept there)

    def keeps(self) -> bool:
        """Is this a function of its body's bytes alone (no stored state read)?"""
        return (self.parent is None and self.conversation is None
                and not any(it.get("type") == "item_reference" for it in self.rr.input_items))


class _Kept:
    """A create that needs no stored state (no ``previous_response_id``, ``conversation`` or
    item reference) as the body memo keeps it: its request, its input items (copied for each
    use, the ids the server generated issued anew: ``fresh``, their indexes), its input
    token count and the fields each Response echoes (and their JSON, as every stream's
    Response objects splice it: :func:`.render.echo_json`). Shared by every create with these
    bytes: read-only, as everything a BodyMemo keeps (but ``held``: the records'
    :func:`.record.input_bytes`, a function of these bytes, set by the first create that
    measures it)."""

    __slots__ = ("rr", "items", "fresh", "tokens", "echo", "echo_json", "held")

    def __init__(self, p: Prepared) -> None:
        self.rr = p.rr
        self.items = orjson.dumps(p.input_items)
        self.fresh = generated_ids(p.rr.body.get("input"))
        self.tokens = p.input_tokens
        self.echo = p.echo
        assert p.echo is not None
        self.echo_json = render.echo_json(p.echo)
        self.held: int | None = None


MEMO, WS_MEMO = "responses", "responses.ws"  # validated creates in App.memos, by transport


def _cache_blocks(p: Prepared) -> list[object]:
    """The input in the order the model reads it, for the prompt cache."""
    return [p.rr.instructions or "", p.rr.tools or [], *p.context]


async def prepare(req: Request, app: Services, body: dict[str, Any], *,
                  count_only: bool = False) -> Prepared:
    """Validate and assemble the context of a create (or input_tokens) request.

    Async only to count a long input in slices (``validate.paced``), never holding the loop.
    (A create looks its body up in the memo first: :mod:`..pipeline`.)"""
    st = state(app)
    rr = parse_body(body, app, transport=req.transport, count_only=count_only)
    parent = None
    conv = None
    history: list[Item] = []
    if rr.previous_response_id is not None:
        parent = _find_previous(req, st, rr.previous_response_id)
        history = parent.context(app.config.responses.max_chain_depth)
    elif rr.conversation is not None:
        conv = st.conversations.get(rr.conversation)
        if conv is None:
            raise E.conversation_not_found.at("conversation", id=rr.conversation)
        history = list(conv.items)
    items = _resolve_refs(rr.input_items, history, st)
    # the context the model reads: before the newest compaction item, its user messages
    # (the item stands for the rest: expanded only there); the input is kept whole
    history, seen = compaction.prune(history, items)
    _check_call_ids(seen, history, items)
    hosted.check_approvals(seen, history)
    cw = rr.profile.context_window
    room = cw - (rr.limit or 0)
    # Counted once, item by item, and only up to what can fit (input_tokens: the whole
    # window); truncation "auto" drops the oldest turns that do not fit (prompt.input_steps).
    cap = cw if count_only else room
    total, first, prefix = await paced(input_steps(
        history, seen, rr.instructions, rr.tools or None, rr.profile.encoding, cap, room,
        rr.truncation == "auto"))
    history = history[first:]
    if total > cap:
        least = "at least " if type(total) is tok.Bound else ""
        asked = f" + {rr.limit} max_output_tokens" if rr.limit and not count_only else ""
        raise E.context_window_exceeded.at("input", least=least, total=total, asked=asked,
                                           window=cw)
    if not count_only:
        per_choice = txt.most_tokens(app.config, rr.limit, echoed=total)
        logprobs = "message.output_text.logprobs" in rr.include
        check_request_work(1, per_choice, rr.top_logprobs if logprobs else 0,
                           param="max_output_tokens")
    cached = cached_prefix_tokens(prefix) if history else 0
    return Prepared(rr, parent, conv, items, history + seen, total, min(cached, total))


# ------------------------------------------------------------------------------------------
# POST /v1/responses: a family of the request pipeline, its state kept through the hooks
# ------------------------------------------------------------------------------------------

def _stream(rec: Record, plan: Iterable[tuple[float, str, Any]], model: str, *,
            observe: bool = False, live: bool = False) -> EventStream:
    """A stream of this response's events (live, background or a replay)."""
    return EventStream(plan, RESPONSES, model=model, id=rec.id, usage=rec.out.counts, fail=rec.failed,
                       on_event=rec.observe if observe else None,
                       observed=Record.OBSERVED if rec.background else Record.OBSERVED_FOREGROUND,
                       on_end=rec.live_ended if live else None)


def _live(rec: Record, model: str) -> EventStream:
    """The response's live stream (its events observed by the record)."""
    stream = rec.stream = _stream(rec, rec.live_plan(), model, observe=True, live=True)
    return stream


def _follow(rec: Record, after: int, app: Services, model: str) -> StreamResponse:
    """Resume after event ``after``: a stream of the plan again, numbered as the live one
    (:meth:`Record.follow`), hands over the events after it."""
    stream = _stream(rec, rec.follow_plan(app.clock.now()), model)
    rec.follow(stream, after)
    return StreamResponse(stream)


class Responses(Family):
    """``POST /v1/responses`` (WebSocket ``response.create`` too, through dispatch) on the
    request pipeline; the parse assembles the context (chain, conversation, item
    references), the hooks keep the state: ``admit`` (conversation, store and background
    limits; a WebSocket warm-up), ``after_decide`` (output items, hosted tools, compaction;
    the stored :class:`Record`; a background run), ``open_stream``, ``on_complete``."""

    endpoint = "responses"
    seed_path = "/v1/responses"
    dialect = RESPONSES
    id_prefix = "resp_"
    memo = True
    chained = True  # previous_response_id continues a scripted session

    async def parse(self, req: Request, app: Services) -> Parsed:
        body = req.json_object()
        pr = await prepare(req, app, body)
        rr = pr.rr
        pr.echo = render.echo_fields(rr)
        a = ask(rr, pr.context, pr.input_tokens, pr.cached_tokens, json_hint(req.body))
        return Parsed(a, rr.model, rr.stream, body, pr, lambda: _cache_blocks(pr),
                      rr.prompt_cache_retention)

    def keep(self, p: Parsed) -> Any:
        return replace(p, info=_Kept(p.info)) if p.info.keeps() else None

    def reuse(self, kept: Any) -> Parsed:
        """The kept create made ready for one more request: its input items copied (this
        response's own), the ids the server generated issued anew."""
        k: Parsed = kept  # (built directly: dataclasses.replace costs microseconds)
        kk: _Kept = k.info
        items: list[Item] = orjson.loads(kk.items)
        for i in kk.fresh:
            items[i]["id"] = new_id(ID_PREFIX[items[i]["type"]])
        return Parsed(k.ask, k.model, k.stream, k.body,
                      Prepared(kk.rr, None, None, items, list(items), kk.tokens, 0, kk.echo,
                               kk), k.cache_blocks, k.retention)

    def cached(self, app: Services, p: Parsed, seg: Segments | None) -> int:
        """The longest cached prefix (OpenAI's rule), when longer than what the chain's
        previous turn left cached."""
        pr = p.info
        read = openai_cached(app, seg, pr.input_tokens, pr.rr.prompt_cache_retention)
        if read > pr.cached_tokens:
            pr.cached_tokens = read
            return read
        return 0

    def admit(self, req: Request, app: Services, p: Parsed) -> Result | None:
        st = state(app)
        pr = p.info
        rr = pr.rr
        if pr.conversation is not None:  # the input joins the conversation: it must fit there
            st.conversation_item_sizes(pr.input_items, "input")
        if rr.store and st.shared is not None:
            st.shared.check()  # --state redis: 503 now if Redis is down (it must be stored there)
        if rr.background:
            if not st.store.enabled:
                raise E.background_needs_store.at("background")
            cfg = app.config.responses
            if st.active_background >= cfg.background_max_active:
                raise E.too_many_background.at("background", limit=cfg.background_max_active)
        if rr.generate:
            return None
        # WebSocket warm-up: state only, no model output (always streamed, never background)
        out = render.no_output(new_id(self.id_prefix), int(app.clock.time()), pr.input_tokens,
                               pr.cached_tokens)
        return StreamResponse(_live(_new_record(req, app, pr, out), rr.model),
                              usage=out.counts)

    def after_decide(self, req: Request, app: Services, p: Parsed, d: Decision,
                     meta: Meta) -> Result | None:
        pr = p.info
        rr = pr.rr
        assert meta.ask is not None and meta.rng is not None and meta.lat is not None
        if rr.tools and hosted.involved(rr):  # (most have no tools: no call)
            out = hosted.response_out(d, meta.ask, rr, pr.context, pr.input_items, app.config,
                                      meta.rng, meta.lat, meta.id, meta.created)
        else:
            out = render.response_out(d, meta.id, meta.created)
        if rr.compact_threshold is not None and pr.input_tokens > rr.compact_threshold:
            item, summary = compaction.auto(pr.context, pr.input_tokens, meta.lat)
            out.items.insert(0, item)
            out.extra += item.seconds
            u = out.counts
            out.counts = type(u)(u.prompt_tokens, u.output_tokens + summary,
                                 u.reasoning_tokens, u.cached_tokens)
        rec = meta.state = _new_record(req, app, pr, out)
        meta.usage = out.counts
        if rr.background:
            return _start_background(req, rec, app, rr)
        meta.wait = out.duration
        return None

    def open_stream(self, p: Parsed, d: Decision, meta: Meta) -> EventStream:
        return _live(meta.state, p.model)

    def render(self, p: Parsed, d: Decision, meta: Meta) -> Any:
        rec = meta.state
        return render.final_snapshot(rec.echo, rec.out)

    def on_complete(self, p: Parsed, d: Decision, meta: Meta, data: Any) -> None:
        rec = meta.state
        rec.done = len(rec.out.items)
        rec.finish(data)

    def on_abandon(self, p: Parsed, d: Decision, meta: Meta) -> None:
        meta.state.cancel()  # the client went away: a foreground response stops generating


FAMILY = Responses()


def _new_record(req: Request, app: Services, pr: Prepared, out: RespOut) -> Record:
    """The response's :class:`Record`, stored when asked (and published to the other
    workers); a background response too big to store is refused."""
    st = state(app)
    rr = pr.rr
    assert pr.echo is not None
    rec = Record(app, pr.echo, out, pr.input_items, pr.parent, background=rr.background,
                 conversation=pr.conversation,
                 ws_context=_previous_responses(req),
                 warmup=not rr.generate)
    # its size (every record: an unstored one can still be held by a chain); the input's
    # share is a function of the body, kept by the memo's entry once measured
    k = pr.kept
    if k is None:
        rec.nbytes = record_bytes(rec, req.body)
    else:
        held = k.held
        if held is None:
            held = k.held = input_bytes(rec, req.body)
        rec.nbytes = record_bytes(rec, req.body, held)
        rec.echo_json = k.echo_json
    if rr.store and st.put(rec):
        st.items.add(rec, st.store)
        if st.shared is not None:  # --workers > 1: other workers see it too
            rec.shared = st.shared
            if rr.background or rr.stream:  # (a JSON answer's id is unknown until it ends)
                st.shared.publish(rec)
    elif rr.store and rr.background:
        # a foreground response too big to store is answered and not kept (as if evicted at
        # once: clients already see stored responses expire); a background one must be kept
        raise E.response_too_large_to_store.at("background", size=rec.nbytes,
                                               budget=app.config.responses.store_max_bytes)
    return rec


def _start_background(req: Request, rec: Record, app: Services,
                      rr: RespRequest) -> JSONResponse | StreamResponse:
    """Run the response on the shared clock with no client (events go to the record;
    :func:`..pipeline.run_detached`: counted as running, through the engine); the caller
    gets the queued Response, or a stream that follows the record live."""
    st = state(app)
    queued = rec.response()
    stream = _stream(rec, rec.live_plan(background=True), rr.model, live=True)
    rec.stream = stream
    st.active_background += 1

    watch = None
    sh = st.shared
    if sh is not None and rec.shared is not None:
        # --workers > 1: a cancel or delete that landed on another worker is a control entry
        # in the shared store; look for it every WATCH_S seconds while this response runs
        def check() -> None:
            nonlocal watch
            watch = None
            try:
                cmd = sh.command(rec.id)
            except APIError:  # --state redis and Redis is down: look again later
                cmd = None
            if cmd == DELETED:  # deleted or evicted through another worker
                _forget(st, rec)
            elif cmd == CANCEL:
                rec.cancel()
            elif rec.pump is not None:
                watch = app.clock.call_later(WATCH_S, check)

        watch = app.clock.call_later(WATCH_S, check)

    def done(reason: str) -> None:
        st.active_background -= 1
        rec.pump = None
        if watch is not None:
            watch.cancel()
        if not rec.terminal:
            rec.cancel()
        elif reason == "completed":  # (the edge of a response no transport writes)
            accounting.billed(app, rec.out.counts)

    # (it starts on the next clock pass, after the POST has been answered with "queued")
    rec.pump = run_detached(req, app, stream, done,
                            observer=lambda t, d, now: rec.observe(t, d))
    if rr.stream:
        return _follow(rec, -1, app, rr.model)
    return JSONResponse(queued)


# ------------------------------------------------------------------------------------------
# Stored responses
# ------------------------------------------------------------------------------------------

def _record(app: Services, req: Request) -> Record | Snapshot:
    rid = req.params.get("id", "")
    rec = _lookup(state(app), rid)
    if rec is None:
        raise _not_found(rid)
    return rec


def _bool_query(req: Request, name: str) -> bool:
    v = req.query_one(name)
    if v is None:
        return False
    if v.lower() in ("true", "1"):
        return True
    if v.lower() in ("false", "0", ""):
        return False
    raise E.not_a_boolean.at(name)


def _int_query(req: Request, name: str, default: int, lo: int, hi: int) -> int:
    v = req.query_one(name)
    if v is None:
        return default
    try:
        n = int(v)
    except ValueError:
        raise E.invalid_type.at(name, expected="an integer") from None
    if not lo <= n <= hi:
        raise E.out_of_range.at(name, lo=lo, hi=hi, value=n)
    return n


async def retrieve(req: Request, app: Services) -> JSONResponse | StreamResponse:
    """``GET /v1/responses/{id}`` (``?stream=true&starting_after=N`` replays/follows)."""
    rec = _record(app, req)
    if _bool_query(req, "stream"):
        after = _int_query(req, "starting_after", -1, -1, 1 << 40)
        if type(rec) is Snapshot:
            if not rec.terminal:
                raise E.follow_on_other_worker.at("stream", id=rec.id, state=rec.status)
            rec = rec.replay(app)
        assert type(rec) is Record
        return _follow(rec, after, app, rec.echo["model"])
    if type(rec) is Snapshot:
        return JSONResponse(rec.response)
    assert type(rec) is Record
    return JSONResponse(rec.response())


async def delete(req: Request, app: Services) -> JSONResponse:
    """``DELETE /v1/responses/{id}`` (a running background response is stopped)."""
    rid = req.params.get("id", "")
    st = state(app)
    rec = st.store.pop(rid)
    found = rec is not None
    sh = st.shared
    if sh is not None:
        if sh.deleted(rid):
            found = False  # already deleted through another worker
        else:
            # the tombstone is written first, so the owner's next publication and its watch
            # see the delete; True when another worker had published the response
            found = sh.delete(rid, found) or found
    if not found:
        raise _not_found(rid)
    if rec is not None and rec.pump is not None:
        rec.cancel()
    return JSONResponse({"id": rid, "object": "response", "deleted": True})


async def cancel(req: Request, app: Services) -> JSONResponse:
    """``POST /v1/responses/{id}/cancel``: only background responses can be cancelled; one
    already in a terminal state (completed, failed, incomplete, cancelled) is returned
    unchanged with 200, as the real API does."""
    rec = _record(app, req)
    if not rec.background:
        raise E.cancel_not_background.at()
    if rec.terminal:
        return JSONResponse(rec.response if type(rec) is Snapshot
                            else rec.response())  # type: ignore[operator]
    if type(rec) is Snapshot:
        return JSONResponse(await _cancel_remote(app, rec))
    assert type(rec) is Record
    rec.cancel()
    return JSONResponse(rec.response())


async def _cancel_remote(app: Services, snap: Snapshot) -> dict[str, Any]:
    """Cancel a background response running on another worker: leave a cancel entry for its
    owner (it looks every ``WATCH_S``) and wait up to ``REMOTE_CANCEL_WAIT_S`` for the
    cancelled snapshot it publishes. An owner that never answers (killed) cannot run the
    response any more: it is then published as cancelled with the output known so far."""
    sh = state(app).shared
    assert sh is not None
    if snap.terminal:
        return snap.response
    sh.request_cancel(snap.id)
    waited = 0.0
    while waited < REMOTE_CANCEL_WAIT_S:
        await app.clock.sleep(WATCH_S / 4)
        waited += WATCH_S / 4
        cur = sh.get(snap.id)
        if cur is None:
            raise _not_found(snap.id)  # deleted meanwhile
        if cur.terminal:
            return cur.response
        snap = cur
    snap.response = dict(snap.response, status="cancelled")
    sh.snapshots.put(snap.id, snap)
    return snap.response


def _page(req: Request, items: list[Item]) -> dict[str, Any]:
    """Cursor pagination (``after``, ``limit`` 1-100 default 20, ``order`` desc default)."""
    limit = _int_query(req, "limit", 20, 1, 100)
    order = req.query_one("order", "desc")
    if order not in ("asc", "desc"):
        raise E.invalid_value.at("order", value=order, allowed="'asc' and 'desc'")
    seq = items if order == "asc" else items[::-1]
    after = req.query_one("after")
    if after:
        for i, it in enumerate(seq):
            if it.get("id") == after:
                seq = seq[i + 1:]
                break
        else:
            raise E.after_not_found.at("after", id=after)
    data = seq[:limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": len(seq) > limit}


async def input_items(req: Request, app: Services) -> JSONResponse:
    """``GET /v1/responses/{id}/input_items``."""
    rec = _record(app, req)
    return JSONResponse(_page(req, rec.input_items))


async def input_tokens(req: Request, app: Services) -> JSONResponse:
    """``POST /v1/responses/input_tokens``: the input tokens a create would be billed."""
    body = req.json_object()
    p = await prepare(req, app, body, count_only=True)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": p.input_tokens})


# ------------------------------------------------------------------------------------------
# Conversations (minimal: what ``conversation`` needs)
# ------------------------------------------------------------------------------------------

def _conv(app: Services, req: Request) -> Conversation:
    cid = req.params.get("id", "")
    conv = state(app).conversations.get(cid)
    if conv is None:
        raise E.conversation_not_found.at(id=cid)
    return conv


def _items_body(body: dict[str, Any], key: str = "items") -> list[Item]:
    raw = V(body).list(key, [], max_len=20) or []
    items, refs = normalize_input(raw)
    if refs:
        raise E.item_reference_unsupported.at(key)
    return items


async def conv_create(req: Request, app: Services) -> JSONResponse:
    st = state(app)
    if not st.conversations.enabled:
        raise E.conversations_disabled.at()
    body = req.json_object() if req.body else {}
    metadata = V(body).metadata() or {}
    items = _items_body(body)
    sizes = st.conversation_item_sizes(items, "items")
    conv = st.new_conversation(new_id("conv_", 48), int(app.clock.time()), metadata)
    conv.extend(items, sizes)
    st.conversations.put(conv.id, conv, nbytes=conv.nbytes)
    return JSONResponse(conv.json())


async def conv_get(req: Request, app: Services) -> JSONResponse:
    return JSONResponse(_conv(app, req).json())


async def conv_update(req: Request, app: Services) -> JSONResponse:
    conv = _conv(app, req)
    body = req.json_object()
    md = V(body).metadata()
    if md is None:
        raise missing("metadata")
    conv.metadata = md
    conv.save()
    return JSONResponse(conv.json())


async def conv_delete(req: Request, app: Services) -> JSONResponse:
    cid = req.params.get("id", "")
    if state(app).conversations.pop(cid) is None:
        raise E.conversation_not_found.at(id=cid)
    return JSONResponse({"id": cid, "object": "conversation.deleted", "deleted": True})


async def conv_items(req: Request, app: Services) -> JSONResponse:
    return JSONResponse(_page(req, list(_conv(app, req).items)))


async def conv_add_items(req: Request, app: Services) -> JSONResponse:
    conv = _conv(app, req)
    items = _items_body(req.json_object())
    conv.extend(items, state(app).conversation_item_sizes(items, "items"))
    return JSONResponse({"object": "list", "data": items,
                         "first_id": items[0]["id"] if items else None,
                         "last_id": items[-1]["id"] if items else None, "has_more": False})


async def _on_start(app: Host) -> None:
    """--state redis: this replica's liveness key (others fail its orphans once it stops)."""
    if app.shared_state is not None:
        app.shared_state.start_heartbeat()


async def _on_stop(app: Host) -> None:
    """Server shutdown: stop every running background response (no timer outlives it)."""
    for rec in list(state(app).store.values()):
        if rec.pump is not None:
            rec.cancel()
    if app.shared_state is not None:
        await app.shared_state.close()


async def _compact(req: Request, app: Services) -> JSONResponse:
    """``POST /v1/responses/compact`` (:func:`.compaction.compact`, with this package's
    ``prepare``)."""
    return await compaction.compact(req, app, prepare)


async def upgrade_required(req: Request, app: Services) -> JSONResponse:
    """``GET /v1/responses`` without ``Upgrade: websocket``."""
    raise E.websocket_upgrade_required.at(
        headers=[("upgrade", "websocket"), ("sec-websocket-version", "13")])


def register(app: Host) -> None:
    """Add the Responses and Conversations routes."""
    install(app)
    app.on_start.append(_on_start)
    app.on_stop.append(_on_stop)
    serve(app, FAMILY, [("POST", "/v1/responses")], aliases=True)  # (its memos: MEMO, WS_MEMO)
    r = app.router
    r.add("POST", "/v1/responses/input_tokens", input_tokens, "responses.input_tokens")
    r.add("POST", "/v1/responses/compact", _compact, "responses.compact")
    r.add("GET", "/v1/responses/{id}", retrieve, "responses.retrieve", stream_capable=True)
    r.add("DELETE", "/v1/responses/{id}", delete, "responses.delete")
    r.add("POST", "/v1/responses/{id}/cancel", cancel, "responses.cancel")
    r.add("GET", "/v1/responses/{id}/input_items", input_items, "responses.input_items")
    # the WebSocket mode (client.responses.connect()); a plain GET is told to upgrade
    r.add_ws(ws.PATHS, ws.ResponsesWS)
    r.add("GET", "/v1/responses", upgrade_required, "responses.websocket")
    r.add("POST", "/v1/conversations", conv_create, "conversations.create")
    r.add("GET", "/v1/conversations/{id}", conv_get, "conversations.retrieve")
    r.add("POST", "/v1/conversations/{id}", conv_update, "conversations.update")
    r.add("DELETE", "/v1/conversations/{id}", conv_delete, "conversations.delete")
    r.add("GET", "/v1/conversations/{id}/items", conv_items, "conversations.items")
    r.add("POST", "/v1/conversations/{id}/items", conv_add_items, "conversations.items.create")
