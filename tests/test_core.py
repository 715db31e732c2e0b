"""Tier 1: pure units — encoders, EventStream numbering, the clock, the pump, the router,
the latency model and the text generator."""

from __future__ import annotations

import asyncio
import random

import orjson
import pytest

from llmsim.api.chat import CHAT
from llmsim.api.responses import RESPONSES
from llmsim.errors import APIError
from llmsim.routing import Router
from llmsim.sim import text as txt
from llmsim.sim.latency import Latency
from llmsim.sim.models import Registry
from llmsim.streaming import encode
from llmsim.streaming.clock import FakeClock
from llmsim.streaming.flow import Pump
from llmsim.streaming.stream import DISCONNECT, STOP, EventStream


def test_encoders():
    assert encode.sse_chat("chunk", {"a": 1}) == b'data: {"a":1}\n\n'
    assert encode.sse_chat("chunk", b'{"pre":1}') == b'data: {"pre":1}\n\n'
    assert encode.sse_chat("done", None) == b"data: [DONE]\n\n"
    assert encode.sse_responses("response.created", {"type": "response.created"}) == \
        b'event: response.created\ndata: {"type":"response.created"}\n\n'
    assert encode.ws_text("x", {"b": [1]}) == b'{"b":[1]}'
    assert encode.chunk(b"hello") == b"5\r\nhello\r\n"


def test_event_stream_numbers_responses_events_only():
    plan = [(0.0, "a", {"type": "a"}), (0.1, "b", {"type": "b"}), (0.0, STOP, None)]
    s = EventStream(iter(plan), RESPONSES)
    s.begin(10.0)
    assert s.pull() == (10.0, "a", {"type": "a", "sequence_number": 0})
    assert s.pull() == (pytest.approx(10.1), "b", {"type": "b", "sequence_number": 1})
    assert s.pull()[1] == STOP
    assert s.pull() is None
    c = EventStream(iter([(0.0, "chunk", {"x": 1})]), CHAT)
    c.begin(0)
    assert c.pull()[2] == {"x": 1}


def test_event_stream_deadlines_do_not_drift():
    s = EventStream(iter([(0.01, "t", {})] * 1000), CHAT)
    s.begin(0.0)
    last = None
    while (ev := s.pull()) is not None:
        last = ev[0]
    assert last == pytest.approx(10.0)


class ListSink:
    def __init__(self):
        self.paused = False
        self.frames: list[tuple[float, bytes]] = []
        self.aborted = False
        self.clock = None

    def write_events(self, frames):
        for f in frames:
            self.frames.append((self.clock.now(), f))

    def abort(self):
        self.aborted = True


async def run_pump(plan, kind="chat", pause_at=None):
    clock = FakeClock(start=0.0)
    sink = ListSink()
    sink.clock = clock
    reasons = []
    done = asyncio.Event()
    p = Pump(EventStream(iter(plan), CHAT if kind == "chat" else RESPONSES), clock, encode.sse_chat, sink,
             on_done=lambda r: (reasons.append(r), done.set()))
    p.start()
    await asyncio.wait_for(done.wait(), 5)
    return sink, reasons


@pytest.mark.asyncio
async def test_pump_paces_on_fake_clock_and_coalesces():
    plan = [(0.5, "chunk", {"i": 0}), (0.0, "chunk", {"i": 1}), (0.25, "chunk", {"i": 2}),
            (0.0, "done", None)]
    sink, reasons = await run_pump(plan)
    assert reasons == ["completed"]
    assert [t for t, _ in sink.frames] == [0.5, 0.5, 0.75, 0.75]


@pytest.mark.asyncio
async def test_pump_control_items():
    sink, reasons = await run_pump([(0.1, "chunk", {}), (0.0, DISCONNECT, None),
                                    (0.0, "chunk", {})])
    assert reasons == ["disconnect"] and sink.aborted and len(sink.frames) == 1
    sink, reasons = await run_pump([(0.1, "chunk", {}), (0.1, STOP, None), (0.1, "chunk", {})])
    assert reasons == ["stopped"] and not sink.aborted and len(sink.frames) == 1


@pytest.mark.asyncio
async def test_pump_cancel_closes_plan():
    closed = []

    def plan():
        try:
            for i in range(100):
                yield 1.0, "chunk", {"i": i}
        finally:
            closed.append(True)

    clock = FakeClock(start=0.0)
    sink = ListSink()
    sink.clock = clock
    reasons = []
    p = Pump(EventStream(plan(), CHAT), clock, encode.sse_chat, sink,
             on_done=reasons.append)
    p.start()
    await asyncio.sleep(0)
    p.cancel()
    p.cancel()  # idempotent
    assert reasons == ["cancelled"] and closed == [True] and clock.pending == 0


def test_router_aliases_params_and_errors():
    r = Router()

    async def h(req, app):
        return None

    r.add("POST", "/v1/things", h, "things")
    r.add("GET", "/v1/things/{id}", h, "thing")
    r.add("DELETE", "/v1/things/{id}", h, "thing")
    assert r.resolve("POST", "/openai/v1/things")[0].name == "things"
    route, params = r.resolve("DELETE", "/v1/things/abc")
    assert params == {"id": "abc"}
    with pytest.raises(APIError) as e:
        r.resolve("GET", "/v1/things")
    assert e.value.status == 405 and ("allow", "POST") in e.value.headers
    with pytest.raises(APIError) as e:
        r.resolve("GET", "/v2/things")
    assert e.value.status == 404


def test_registry_lookup_rules():
    reg = Registry()
    assert reg.get("gpt-4o").id == "gpt-4o"
    snap = reg.get("gpt-4o-2024-08-06")
    assert snap.id == "gpt-4o-2024-08-06" and snap.context_window == 128_000
    # a snapshot id resolves to its base profile; distinct models keep distinct latencies
    assert reg.get("gpt-4o-2024-08-06").itl_ms == reg.get("gpt-4o").itl_ms
    assert reg.get("gpt-4o-mini").itl_ms != reg.get("gpt-4o").itl_ms
    assert reg.get("whatever").owned_by == "llmsim"
    assert Registry(strict=True).get("whatever") is None


def test_latency_modes():
    prof = Registry().get("gpt-4o")
    rng = random.Random(1)
    assert Latency(prof, instant=True).ttft(rng) == 0 and Latency(prof, instant=True).gap(rng) == 0
    fixed = Latency(prof, fixed_ttft_ms=200, fixed_itl_ms=10)
    assert fixed.ttft(rng, 100000) == 0.2 and fixed.gap(rng) == 0.01
    real = Latency(prof)
    gaps = [real.gap(rng) for _ in range(2000)]
    assert 0.25 * 0.012 <= min(gaps) and max(gaps) <= 4 * 0.012
    assert real.ttft(random.Random(2), 100_000) > real.ttft(random.Random(2), 0)  # prefill


def test_text_generate_limits_and_stop():
    rng = random.Random(0)
    out = txt.generate("lorem", rng, length=50, limit=10)
    assert out.tokens == 10 == len(out.pieces) and out.finish == "length"
    out = txt.generate("lorem", rng, length=5, limit=10)
    assert out.tokens == 5 and out.finish == "stop"
    out = txt.apply_stop(txt.generate("fixed", rng, length=0, limit=None,
                                      source="a b c d"), [" c"])
    assert out.text == "a b" and out.finish == "stop"
    lengths = [txt.draw_length(random.Random(i), 150, 0.5, 1, 2048) for i in range(2000)]
    assert 130 < sum(lengths) / len(lengths) < 170


def test_error_envelope():
    e = APIError(429, "slow down", code="rate_limit_exceeded")
    assert orjson.loads(e.body()) == {"error": {"message": "slow down", "type":
                                                "rate_limit_error", "param": None,
                                                "code": "rate_limit_exceeded"}}


def test_router_path_param_spans_slashes():
    r = Router()

    async def h(req, app):
        return None

    r.add("GET", "/v1/models/{id:path}", h, "models")
    assert r.resolve("GET", "/v1/models/meta-llama/Llama-3-8B")[1] == {
        "id": "meta-llama/Llama-3-8B"}


def test_forked_workers_do_not_repeat_ids():
    """--workers forks after llmsim is imported: the child must not continue the parent's id
    stream (two workers once handed out the same response ids)."""
    import os

    from llmsim.sim.rng import new_id, new_request_id

    new_id("resp_"), new_request_id()  # the parent has ids drawn ahead (rng._AHEAD)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, (new_id("resp_") + " " + new_request_id()).encode())
        os._exit(0)
    os.close(w)
    child, child_req = os.read(r, 200).decode().split()
    os.waitpid(pid, 0)
    assert child.startswith("resp_") and child != new_id("resp_")
    assert child_req.startswith("req_") and child_req != new_request_id()


def test_long_ids_map_each_random_byte_to_an_alphanumeric(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """An id of another length than 24 (a WebSocket create's request id, a container's, a
    conversation's) is one alphanumeric per random byte: byte b is the (b mod 62)th of
    a-z, A-Z, 0-9."""
    import os
    import string

    from llmsim.sim import rng

    alnum = string.ascii_lowercase + string.ascii_uppercase + string.digits
    raw = bytes(range(256))
    monkeypatch.setattr(os, "urandom", lambda n: raw[:n])
    got = rng.new_id("req_", 256)
    assert got == "req_" + "".join(alnum[b % 62] for b in raw)
    monkeypatch.undo()
    ids = {rng.new_id("", 32) for _ in range(100)}
    assert len(ids) == 100 and all(len(i) == 32 and i.isalnum() and i.isascii() for i in ids)


async def test_two_servers_in_one_process_keep_their_own_tokenizer_mode():
    """--tokenizer is per server, not process state: starting a second server with another
    mode does not change the first one's counts."""
    import orjson

    from llmsim import Config, Server
    from llmsim.sim import tokens

    if tokens.get_encoding("o200k_base") is None:
        pytest.skip("the exact tokenizer is not installed (tokens extra)")
    text = "supercalifragilisticexpialidocious " * 20  # (exact 201, estimate 121)
    body = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": text}],
                         "max_tokens": 1})

    async def prompt_tokens(srv: Server) -> int:
        reader, writer = await asyncio.open_connection(srv.host, srv.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d"
                     b"\r\nconnection: close\r\n\r\n%s" % (len(body), body))
        data = await reader.read()
        writer.close()
        return orjson.loads(data.split(b"\r\n\r\n", 1)[1])["usage"]["prompt_tokens"]

    base = {"port": 0, "latency": "instant", "quiet": True}
    async with Server(Config(**base, tokenizer="estimate")) as est:
        first = await prompt_tokens(est)
        async with Server(Config(**base, tokenizer="auto")) as exact:
            exact_n = await prompt_tokens(exact)
            assert await prompt_tokens(est) == first  # unchanged by the second server
        assert first != exact_n


async def test_the_body_is_parsed_once_with_fault_hooks_on(monkeypatch):
    """Fault rules read the model from the body: the hooks and the handler share one parse."""
    import orjson

    from llmsim import Config
    from llmsim.app import App
    from llmsim.messages import Request

    app = App(Config(latency="instant", quiet=True))
    rule = Request("POST", "/llmsim/faults", {}, {}, orjson.dumps(
        {"fault": "500", "model": "some-other-model"}), "r0")
    assert (await app.dispatch(rule)).status == 200
    calls = []
    real = orjson.loads
    monkeypatch.setattr(orjson, "loads", lambda b: (calls.append(1), real(b))[1])
    body = orjson.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}],
                         "max_tokens": 2})
    res = await app.dispatch(Request("POST", "/v1/chat/completions", {}, {}, body, "r1"))
    assert res.status == 200 and len(calls) == 1


def test_new_id_is_prefix_and_24_alphanumerics():
    import base64
    import random as _random

    from llmsim.sim import rng
    ids = {rng.new_id("chatcmpl-") for _ in range(2000)}
    assert len(ids) == 2000
    assert all(i.startswith("chatcmpl-") and len(i) == 33 and i[9:].isalnum() for i in ids)
    state = rng._ID_RNG.getstate()  # the same bits as base64 with "Ab" for "+/"
    try:
        rng._ID_RNG.seed(7)
        rng._ALNUMS[:] = ["", 0]
        got = [rng.new_id("x_") for _ in range(rng._AHEAD + 1)]  # (one more: a new draw)
        ref = _random.Random(7)
        text = ""
        for _ in range(2):
            raw = ref.getrandbits(144 * rng._AHEAD).to_bytes(18 * rng._AHEAD, "little")
            text += base64.b64encode(raw, b"Ab").decode()
        assert got == ["x_" + text[i * 24:(i + 1) * 24] for i in range(rng._AHEAD + 1)]
    finally:
        rng._ID_RNG.setstate(state)
        rng._ALNUMS[:] = ["", 0]
