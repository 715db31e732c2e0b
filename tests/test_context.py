"""Typed per-app context, no process-wide state (issue 11): two servers in one process keep
their own tokenizer mode and state directory, the per-request notes are typed fields, and the
capacity queue watch runs on the app's clock."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from llmsim import Config, Server
from llmsim.api.faults import CAPACITY, FAULTS, LIMITS, QUEUE_WATCH_S
from llmsim.api.responses.state import RESPONSES
from llmsim.api.validate import SERVING
from llmsim.app import App
from llmsim.config import CapacityConfig
from llmsim.messages import JSONResponse, Request
from llmsim.sim import tokens
from llmsim.streaming.clock import FakeClock

from .faultkit import CHAT, server
from .memtransport import connect

TEXT = "supercalifragilisticexpialidocious " * 20  # (exact 201 tokens, estimate 121)
CHAT_BODY = {"model": "gpt-4o", "messages": [{"role": "user", "content": TEXT}], "max_tokens": 1}
BASE: dict[str, Any] = {"port": 0, "host": "127.0.0.1", "latency": "instant", "quiet": True}


def _need_exact() -> None:
    if tokens.get_encoding("o200k_base") is None:
        pytest.skip("the exact tokenizer is not installed (tokens extra)")


async def _http(srv: Server, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    raw = orjson.dumps(body) if body is not None else b""
    reader, writer = await asyncio.open_connection(srv.host, srv.port)
    writer.write(b"%s %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\nconnection: close\r\n"
                 b"\r\n%s" % (method.encode(), path.encode(), len(raw), raw))
    data = await reader.read()
    writer.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), orjson.loads(payload)


async def _prompt_tokens(srv: Server) -> int:
    status, data = await _http(srv, "POST", "/v1/chat/completions", CHAT_BODY)
    assert status == 200, data
    return int(data["usage"]["prompt_tokens"])


async def test_two_servers_keep_their_own_tokenizer_and_state_dir(tmp_path: Path) -> None:
    """A second Server built and started in the same task, with the other tokenizer mode and
    no state directory, changes neither the first one's counts nor where it stores; the
    caller's own context is left as it was."""
    _need_exact()
    before = tokens._MODE.get()
    shared = tmp_path / "a"
    shared.mkdir()
    async with Server(Config(**BASE, tokenizer="estimate"), state_dir=str(shared)) as est:
        first = await _prompt_tokens(est)
        status, resp = await _http(est, "POST", "/v1/responses",
                                   {"model": "gpt-4o", "input": "hi", "max_output_tokens": 16})
        assert status == 200, resp
        async with Server(Config(**BASE, tokenizer="auto")) as exact:
            assert tokens._MODE.get() == before
            exact_n = await _prompt_tokens(exact)
            assert await _prompt_tokens(est) == first  # unchanged by the second server
            # the second server has its own (in-memory) store: the first one's response is
            # not there, and nothing of it went to the first one's directory
            status, err = await _http(exact, "GET", f"/v1/responses/{resp['id']}")
            assert status == 404, err
            assert exact.app.state_dir is None and exact.app.feature(RESPONSES) is not None
            assert exact.app.feature(RESPONSES).shared is None
        # a third app on the first one's directory (another worker) reads the response there
        other = App(Config(latency="instant", quiet=True), state_dir=str(shared))
        got = await other.dispatch(Request("GET", f"/v1/responses/{resp['id']}", {}, {}, b"",
                                           "r1"))
        assert isinstance(got, JSONResponse) and got.status == 200
        assert got.data["id"] == resp["id"]
    assert first != exact_n


async def test_building_an_app_sets_no_mode_and_each_dispatch_uses_its_own() -> None:
    _need_exact()
    body = orjson.dumps(CHAT_BODY)

    async def count(app: App) -> int:
        res = await app.dispatch(Request("POST", "/v1/chat/completions", {}, {}, body, "r"))
        assert isinstance(res, JSONResponse)
        return int(res.data["usage"]["prompt_tokens"])

    before = tokens._MODE.get()
    est = App(Config(latency="instant", quiet=True, tokenizer="estimate"))
    exact = App(Config(latency="instant", quiet=True, tokenizer="auto"))
    assert tokens._MODE.get() == before  # building an app changes nothing
    n_est = await count(est)
    n_exact = await count(exact)
    assert n_est != n_exact
    assert await count(est) == n_est and await count(exact) == n_exact


def test_feature_state_is_typed_attributes() -> None:
    app = App(Config(latency="instant", quiet=True))
    assert not hasattr(app, "extensions")
    assert app.feature(FAULTS) is not None and app.feature(CAPACITY) is not None and app.feature(RESPONSES) is not None
    assert app.feature(LIMITS) is None and app.authenticate is None  # not configured
    req = Request("POST", "/v1/chat/completions", {}, {}, b"{}", "r")
    with pytest.raises(AttributeError):
        req.notes.anything = 1  # type: ignore[attr-defined]
    assert not req.parsed and req.json() == {} and req.parsed


async def test_the_queue_watch_runs_on_the_app_clock() -> None:
    """A request queued for a sequence has its connection checked every QUEUE_WATCH_S of the
    app's clock (virtual time here): the first look comes exactly one period after it
    queued, whatever the wall clock did."""
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10,
                 capacity=CapacityConfig(max_seqs=1, queue=5))
    seen: list[tuple[float, set[str]]] = []

    def drop(clients: Any) -> int:
        seen.append((clock.now(), set(clients)))
        return 0

    srv.app.drop_departed = drop
    cap = srv.app.feature(CAPACITY)
    assert cap is not None
    serving = srv.app.feature(SERVING)  # (capacity on: gpt-4o runs on the scheduler)

    def eng() -> Any:
        return serving.ranks_of("gpt-4o")[0]
    raw = orjson.dumps({**CHAT, "stream": True, "max_tokens": 50})
    req = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n%s"
           % (len(raw), raw))
    _p1, tr1 = connect(srv)
    _p1.data_received(req)
    for _ in range(10_000):  # the first request holds the sequence
        await asyncio.sleep(0)
        if eng().running:
            break
    _p2, tr2 = connect(srv)
    _p2.data_received(req)
    for _ in range(10_000):
        await asyncio.sleep(0)
        if eng().waiting:
            break
    queued_at = clock.now()
    assert eng().waiting
    for _ in range(10_000):
        if seen:
            break
        await asyncio.sleep(0)
    assert seen and seen[0][0] == pytest.approx(queued_at + QUEUE_WATCH_S)
    assert seen[0][1] == {_p2.peer}
    tr1.close()
    tr2.close()
    for _ in range(10_000):
        await asyncio.sleep(0)
        if not eng().waiting and not eng().running:
            break
    assert not eng().running and not eng().waiting


def test_forked_workers_never_repeat_request_ids() -> None:
    """The x-request-id stream is reseeded in a forked worker (it was module state copied by
    fork: every worker handed out the supervisor's next ids)."""
    import os

    from llmsim.transport.http import new_request_id

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(w, new_request_id().encode())
        os._exit(0)
    os.close(w)
    child = os.read(r, 100).decode()
    os.waitpid(pid, 0)
    assert child.startswith("req_") and len(child) == 36 and child != new_request_id()
