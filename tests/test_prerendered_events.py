"""Token events rendered from their dialect's template (issue 15's per-token hot path, issue
30's one template per dialect): a plan yields its tokens as ``TokenRun`` items, never bytes,
and a stream that hands them over one by one renders each from ``Dialect.token_json``. These
tests pin that the rendering is exactly what the dict of the same event puts on the wire,
in every dialect with a template, that the stream numbers them like dicts, that an
out-of-band claim renumbers a held one, and that the pump counts them as tokens."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from llmsim.api.anthropic import ANTHROPIC
from llmsim.api.chat import CHAT
from llmsim.api.completions import COMPLETIONS
from llmsim.api.responses import RESPONSES
from llmsim.streaming import encode
from llmsim.streaming.clock import FakeClock
from llmsim.streaming.flow import Pump
from llmsim.streaming.stream import EventStream, TokenRun, expand_runs, numbered
from tests.sinks import FrameSink

TOKENS = ["Hello", " wor%ld", ' "q"', "\\", "é", "\n", "%d", ""]
HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m%d",
        "service_tier": "default", "system_fingerprint": "fp"}


def _delta_dict(rid: str, idx: int, piece: str, seq: int) -> dict[str, Any]:
    return {"type": "response.output_text.delta", "item_id": rid, "output_index": idx,
            "content_index": 0, "delta": piece, "logprobs": [], "sequence_number": seq}


def test_text_delta_bytes_equal_the_dict_rendering() -> None:
    rid = 'msg_"odd%id'
    plan = [(0.0, "response.output_text.delta", TokenRun(TOKENS, key=(rid, 3)))]
    stream = EventStream(iter(plan), RESPONSES, first_seq=7)
    got = stream.drain()
    assert [numbered(t, d) for _, t, d in expand_runs(plan)] == [True] * len(TOKENS)
    for k, ((etype, data), piece) in enumerate(zip(got, TOKENS, strict=True)):
        want = _delta_dict(rid, 3, piece, 7 + k)
        assert data == orjson.dumps(want)
        assert encode.sse_responses(etype, data) == encode.sse_responses(etype, want)
        assert encode.ws_text(etype, data) == encode.ws_text(etype, want)
    assert stream.seq == 7 + len(TOKENS)


def _chat_chunk(index: int, piece: str, head: dict[str, Any]) -> dict[str, Any]:
    return {**head, "choices": [{"index": index, "delta": {"content": piece},
                                 "logprobs": None, "finish_reason": None}]}


def _completion_chunk(index: int, piece: str, head: dict[str, Any]) -> dict[str, Any]:
    return {**head, "choices": [{"text": piece, "index": index, "logprobs": None,
                                 "finish_reason": None}], "system_fingerprint": "fp_llmsim"}


def test_every_templated_token_equals_its_dict_rendering() -> None:
    """Chat (with and without the usage field), completions and Anthropic: a token rendered
    from the template is the bytes of the dict its family would send for it."""
    cases: list[tuple[Any, str, Any, Any]] = [
        (CHAT, "chunk", (HEAD, 2), lambda p: _chat_chunk(2, p, HEAD)),
        (CHAT, "chunk", ({**HEAD, "usage": None}, 0),
         lambda p: _chat_chunk(0, p, {**HEAD, "usage": None})),
        (COMPLETIONS, "token", ({"id": "cmpl-1", "object": "text_completion", "created": 1,
                                 "model": "m"}, 1),
         lambda p: _completion_chunk(1, p, {"id": "cmpl-1", "object": "text_completion",
                                            "created": 1, "model": "m"})),
        (ANTHROPIC, "content_block_delta", 3,
         lambda p: {"type": "content_block_delta", "index": 3,
                    "delta": {"type": "text_delta", "text": p}}),
    ]
    for dialect, etype, key, want in cases:
        got = EventStream(iter([(0.0, etype, TokenRun(TOKENS, key=key))]), dialect).drain()
        assert [d for _, d in got] == [orjson.dumps(want(p)) for p in TOKENS]
        assert [dialect.sse(t, d) for t, d in got] == [dialect.sse(etype, want(p))
                                                      for p in TOKENS]


def test_claim_ahead_renumbers_a_held_prerendered_event() -> None:
    stream = EventStream(iter([(0.0, "response.output_text.delta",
                                TokenRun(["a"], key=("msg_1", 0)))]), RESPONSES, first_seq=41)
    held = stream.pull()
    assert held is not None and orjson.loads(held[2])["sequence_number"] == 41
    n, held2 = stream.claim_ahead(held)
    assert n == 41 and held2 is not None and held2[:2] == held[:2]
    assert orjson.loads(held2[2])["sequence_number"] == 42
    assert orjson.loads(held2[2])["delta"] == "a"
    assert stream.seq == 43  # the next event continues after the renumbered one
    # a dict is renumbered in place, as before
    d = {"type": "x", "sequence_number": 5}
    stream2 = EventStream(iter([]), RESPONSES, first_seq=5)
    stream2.seq = 6
    n2, same = stream2.claim_ahead((0.0, "x", d))
    assert n2 == 5 and same is not None and same[2] is d and d["sequence_number"] == 6
    # nothing held: the next number
    assert stream2.claim_ahead(None) == (7, None)


async def test_pump_frames_and_counts_templated_tokens() -> None:
    """Chat's tokens are rendered by the pump in the encoder's ``bytes_frame`` (no encoder
    call) and counted as tokens; the same events through the encoder give the same bytes."""
    clock = FakeClock(start=0.0)

    def make() -> list[tuple[float, str, Any]]:
        return [(0.1, "chunk", {"choices": [{"delta": {"role": "assistant"}}]}),
                *[(0.01, "chunk", TokenRun([str(i)], key=(HEAD, 0))) for i in range(5)],
                (0.0, "done", None)]

    counted: list[int] = []

    def observe(etype: str, data: Any, now: float) -> None:
        raise AssertionError("per_write is used")

    observe.per_write = lambda n, now: counted.append(n)  # type: ignore[attr-defined]
    sink = FrameSink()
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    p = Pump(EventStream(iter(make()), CHAT), clock, encode.sse_chat, sink,
             on_done=done.set_result, observer=observe)
    p.start()
    assert await asyncio.wait_for(done, 5) == "completed"
    assert sink.frames == [encode.sse_chat(t, d) for t, d in
                           EventStream(iter(make()), CHAT).drain()]
    assert sum(counted) == 5


async def test_pump_without_bytes_frame_encodes_tokens_through_the_encoder() -> None:
    """An encoder that declares no ``bytes_frame`` gets every token, rendered by the stream
    from the dialect's template."""
    clock = FakeClock(start=0.0)
    seen: list[Any] = []

    def enc(etype: str, data: Any) -> bytes:
        seen.append(data)
        return b"x"

    sink = FrameSink()
    done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    p = Pump(EventStream(iter([(0.0, "chunk", TokenRun(["a"], key=(HEAD, 0))),
                               (0.0, "done", None)]), CHAT), clock,
             enc, sink, on_done=done.set_result)
    p.start()
    assert await asyncio.wait_for(done, 5) == "completed"
    assert seen == [orjson.dumps(_chat_chunk(0, "a", HEAD)), None]
    assert sink.frames == [b"x", b"x"]


async def test_responses_token_runs_are_all_of_the_dialects_token_type() -> None:
    """The pump frames a Responses token with ``event: <token_type>`` without looking at
    its type: every run a Responses plan yields must be of that type (the stream refuses
    another), in every kind of answer (plain, reasoning, tools, logprobs, a refusal-free
    long text), and the pump's frame is what the encoder writes for it."""
    from llmsim import Config
    from llmsim.app import App
    from llmsim.messages import Request, StreamResponse

    app = App(Config(latency="instant", seed=3, max_tokens_mode="exact"))
    tool = {"type": "function", "name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
    bodies = [
        {"model": "gpt-4o-mini", "input": "Hi", "max_output_tokens": 40},
        {"model": "o4-mini", "input": "Think", "max_output_tokens": 400,
         "reasoning": {"effort": "low", "summary": "detailed"}},
        {"model": "gpt-4o-mini", "input": "Weather in Paris?", "tools": [tool],
         "tool_choice": "required"},
        {"model": "gpt-4o-mini", "input": "Hi", "max_output_tokens": 20, "top_logprobs": 2,
         "include": ["message.output_text.logprobs"]},
        {"model": "gpt-4o-mini", "input": "Answer in JSON", "max_output_tokens": 60,
         "text": {"format": {"type": "json_object"}}},
    ]
    frame = encode.sse_responses.bytes_frame(RESPONSES.token_type)  # type: ignore[attr-defined]
    seen_bytes = 0
    for i, body in enumerate(bodies):
        req = Request("POST", "/v1/responses", {}, {}, orjson.dumps({**body, "stream": True}),
                      f"r{i}")
        res = await app.dispatch(req)
        assert type(res) is StreamResponse, (body, getattr(res, "data", None))
        for etype, data in res.stream.drain():
            if type(data) is bytes:
                # (the plan's fixed events come rendered too: the event line names the type
                # their JSON has)
                assert orjson.loads(data)["type"] == etype
                if etype == RESPONSES.token_type:
                    seen_bytes += 1
                    assert frame[0] + data + frame[1] == encode.sse_responses(etype, data)
    assert seen_bytes > 40


def test_a_piece_s_json_is_orjson_s() -> None:
    """The JSON a token's text is written in is orjson's (the template's own encoder)."""
    for t in [*TOKENS, "x" * 40, "é\n\"\\", "\u2028"]:
        assert encode.piece_json(t) == orjson.dumps(t)


def test_on_end_runs_once_when_the_plan_runs_out_or_is_closed() -> None:
    """EventStream's ``on_end`` (what a ``finally`` around the plan did, without a generator
    layer per event): once when the plan runs out, once when the stream is closed early,
    never twice."""
    ended: list[str] = []
    plan = [(0.0, "chunk", {"a": 1}), (0.0, "chunk", {"a": 2})]
    s = EventStream(iter(plan), CHAT, on_end=lambda: ended.append("end"))
    assert len(s.drain()) == 2 and ended == ["end"]
    s.close()
    assert ended == ["end"]
    s = EventStream(iter(plan), CHAT, on_end=lambda: ended.append("closed"))
    assert s.pull() is not None and ended == ["end"]
    s.close()
    s.close()
    assert ended == ["end", "closed"]
