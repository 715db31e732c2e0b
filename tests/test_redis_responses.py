"""Stored responses and conversations across replicas sharing ``--state redis://...``.

A real ``redis-server`` (tests/redis_fixture.py) and two llmsim servers in this process, each
request deliberately sent to the *other* one, through the official SDK (strict validation).
One test runs a replica as a real process and kills it (SIGKILL) with a background response in
flight; one stops Redis mid-test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from llmsim import ServerThread
from llmsim.api.responses.state import state
from llmsim.config import ResponsesConfig
from llmsim.state.redis_store import RedisStore
from llmsim.state.redisconn import SharedState
from tests.redis_fixture import RedisServer, free_port
from tests.test_workers import wait_for

Pair = tuple[ServerThread, ServerThread]


def sdk(srv: ServerThread) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0,
                         _strict_response_validation=True)


@pytest.fixture
def pair(make_server: Any, redis_url: str) -> Pair:
    return make_server(state=redis_url), make_server(state=redis_url)


def test_previous_response_id_across_replicas(pair: Pair) -> None:
    a, b = (sdk(s) for s in pair)
    r1 = a.responses.create(model="gpt-4o", input="My name is Ada. Remember it.")
    r2 = b.responses.create(model="gpt-4o", input="What is my name?",
                            previous_response_id=r1.id)
    assert r2.status == "completed"
    # the chain's first turn is context of the second (billed as input on replica b)
    alone = b.responses.create(model="gpt-4o", input="What is my name?", store=False)
    assert r2.usage is not None and alone.usage is not None
    assert r2.usage.input_tokens > alone.usage.input_tokens
    # and the chain continues back on a
    r3 = a.responses.create(model="gpt-4o", input="and again?", previous_response_id=r2.id)
    assert r3.usage is not None and r3.usage.input_tokens > r2.usage.input_tokens
    with pytest.raises(openai.BadRequestError) as e:
        b.responses.create(model="gpt-4o", input="x", previous_response_id="resp_nope")
    assert e.value.code == "previous_response_not_found"


def test_retrieve_replay_delete_across_replicas(pair: Pair) -> None:
    a, b = (sdk(s) for s in pair)
    r = a.responses.create(model="gpt-4o", input="hello")
    got = b.responses.retrieve(r.id)
    assert got.id == r.id and got.status == "completed"
    assert got.output_text == r.output_text
    items = b.responses.input_items.list(r.id)
    assert [i.type for i in items.data] == ["message"]
    # a finished response's events replay from any replica
    events = list(b.responses.retrieve(r.id, stream=True))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    with pytest.raises(openai.BadRequestError):  # only background responses can be
        b.responses.cancel(r.id)
    assert b.responses.delete(r.id) is None
    for c in (a, b):
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        a.responses.delete(r.id)


def test_cancel_background_across_replicas(make_server: Any, redis_url: str) -> None:
    slow = {"state": redis_url, "latency": "realistic", "ttft_ms": 60_000, "itl_ms": 10}
    a, b = (sdk(make_server(**slow)) for _ in range(2))
    r = a.responses.create(model="gpt-4o", input="long task", background=True)
    assert r.status == "queued"
    wait_for(lambda: b.responses.retrieve(r.id).status == "in_progress", 10, "in_progress")
    done = b.responses.cancel(r.id)
    assert done.status == "cancelled"
    assert a.responses.retrieve(r.id).status == "cancelled"


def test_background_completes_and_is_seen_everywhere(pair: Pair) -> None:
    a, b = (sdk(s) for s in pair)
    r = a.responses.create(model="gpt-4o", input="quick", background=True)
    wait_for(lambda: b.responses.retrieve(r.id).status == "completed", 10, "completed on b")


def test_conversations_across_replicas(pair: Pair) -> None:
    a, b = (sdk(s) for s in pair)
    conv = a.conversations.create(metadata={"topic": "t"},
                                  items=[{"type": "message", "role": "user", "content": "hi"}])
    assert b.conversations.retrieve(conv.id).metadata == {"topic": "t"}
    b.conversations.update(conv.id, metadata={"topic": "u"})
    assert a.conversations.retrieve(conv.id).metadata == {"topic": "u"}
    r = b.responses.create(model="gpt-4o", input="hello there", conversation=conv.id)
    items = a.conversations.items.list(conv.id, order="asc")
    # the first item, this turn's input and its output, written by b, read by a
    assert len(items.data) == 3
    assert items.data[-1].id == r.output[-1].id
    a.conversations.items.create(conv.id, items=[{"type": "message", "role": "user",
                                                  "content": "more"}])
    assert len(b.conversations.items.list(conv.id).data) == 4
    assert b.conversations.delete(conv.id).deleted
    with pytest.raises(openai.NotFoundError):
        a.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.create(model="gpt-4o", input="x", conversation=conv.id)


def test_store_entry_and_byte_bounds(make_server: Any, redis_url: str) -> None:
    s1 = make_server(state=redis_url, responses=ResponsesConfig(store_max_entries=3))
    s2 = make_server(state=redis_url, responses=ResponsesConfig(store_max_entries=3))
    a, b = sdk(s1), sdk(s2)
    ids = [(a if i % 2 else b).responses.create(model="gpt-4o", input=f"n{i}").id
           for i in range(5)]
    with pytest.raises(openai.NotFoundError):
        a.responses.retrieve(ids[0])  # the oldest were evicted for everyone
    assert b.responses.retrieve(ids[-1]).id == ids[-1]
    snaps = state(s1.app).shared
    assert snaps is not None and len(snaps.snapshots) == 3


def test_redis_store_bounds_are_atomic_and_exact(redis_server: RedisServer) -> None:
    redis_server.flushall()
    sh = SharedState(redis_server.url())
    st: RedisStore[bytes] = RedisStore(sh, "t", 10, 0, max_bytes=1000, max_value=600,
                                       dumps=lambda v: v, loads=lambda b: b)
    for i in range(4):
        assert st.put(f"k{i}", b"x" * 300)
    # 4 x 300 > 1000: the oldest went; the newest is always kept
    assert len(st) == 3 and st.nbytes == 900 and st.get("k0") is None
    assert not st.put("big", b"y" * 601) and st.refused == 1  # bounded by max_value
    assert st.update("k3", b"z" * 500)  # grows in place: the oldest make room
    assert st.get("k3") == b"z" * 500 and st.get("k1") is None and st.nbytes == 800
    assert not st.update("missing", b"")
    assert st.pop("k2") == b"x" * 300 and st.nbytes == 500 and len(st) == 1
    assert not RedisStore(sh, "off", 0, 0).put("a", b"")  # disabled store keeps nothing


def test_redis_store_ttl(redis_server: RedisServer) -> None:
    redis_server.flushall()
    sh = SharedState(redis_server.url())
    st: RedisStore[bytes] = RedisStore(sh, "ttl", 10, 0.05, dumps=lambda v: v,
                                       loads=lambda b: b)
    st.put("a", b"1")
    wait_for(lambda: st.get("a") is None, 5, "expiry")
    st.put("b", b"2")  # the next write drops the expired entry's index and size
    assert len(st) == 1 and st.nbytes == 1


# -- a replica dies -----------------------------------------------------------------------

@pytest.fixture
def replica_process(redis_url: str) -> Iterator[Callable[[], tuple[str, subprocess.Popen[bytes]]]]:
    procs: list[subprocess.Popen[bytes]] = []

    def start() -> tuple[str, subprocess.Popen[bytes]]:
        port = free_port()
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        p = subprocess.Popen(
            [sys.executable, "-m", "llmsim", "--port", str(port), "--state", redis_url,
             "--latency", "realistic", "--ttft-ms", "60000", "--quiet"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            import http.client
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                return c.getresponse().status == 200
            except OSError:
                return False

        wait_for(up, 30, "replica up")
        return url, p

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def test_killed_replica_leaves_no_background_response_queued(
        make_server: Any, redis_url: str, replica_process: Any) -> None:
    url, proc = replica_process()
    dying = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0,
                          _strict_response_validation=True)
    r = dying.responses.create(model="gpt-4o", input="long task", background=True)
    other = sdk(make_server(state=redis_url))
    wait_for(lambda: other.responses.retrieve(r.id).status == "in_progress", 10,
             "in_progress on the other replica")
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    # its liveness key expires (OWNER_TTL_S): the next read fails the response for everyone
    failed = wait_for(lambda: (x := other.responses.retrieve(r.id)).status == "failed" and x,
                      20, "failed")
    assert failed.error is not None and failed.error.code == "server_error"
    events = list(other.responses.retrieve(r.id, stream=True))
    assert events[-1].type == "response.failed"
    # terminal now: cancel answers it unchanged
    assert other.responses.cancel(r.id).status == "failed"


# -- Redis down ---------------------------------------------------------------------------

def test_redis_down_then_back(make_server: Any, own_redis: Any) -> None:
    rs: RedisServer = own_redis()
    s1, s2 = make_server(state=rs.url()), make_server(state=rs.url())
    a, b = sdk(s1), sdk(s2)
    r = a.responses.create(model="gpt-4o", input="before")
    rs.stop()
    for c in (a, b):
        with pytest.raises(openai.InternalServerError) as e:
            c.responses.create(model="gpt-4o", input="stored")
        assert e.value.status_code == 503 and e.value.code == "shared_state_unavailable"
        assert e.value.response.headers.get("retry-after") == "1"
        with pytest.raises(openai.InternalServerError) as e:
            c.responses.create(model="gpt-4o", input="x", store=False,
                               previous_response_id=r.id)
        assert e.value.status_code == 503
        with pytest.raises(openai.InternalServerError):
            c.conversations.create()
        # what needs no shared state is served
        assert c.responses.create(model="gpt-4o", input="x", store=False).status == "completed"
        chat = c.chat.completions.create(model="gpt-4o",
                                         messages=[{"role": "user", "content": "hi"}])
        assert chat.choices[0].message.content
    rs.start()  # empty (no persistence): the servers reconnect by themselves

    def recovered(c: openai.OpenAI) -> bool:
        try:
            return c.responses.create(model="gpt-4o", input="after").status == "completed"
        except openai.InternalServerError:  # (for retry-after: 1 s after the last failure)
            return False

    for c in (a, b):
        wait_for(lambda c=c: recovered(c), 10, "recovery")  # type: ignore[misc]
    r2 = b.responses.create(model="gpt-4o", input="after, on b")
    assert a.responses.retrieve(r2.id).id == r2.id


def test_publication_lost_while_redis_down_is_retried(make_server: Any, own_redis: Any) -> None:
    """A background response that finishes while Redis is down is published when it is back
    (the owner retries after its heartbeat), so the other replica does not see it running
    forever."""
    rs: RedisServer = own_redis()
    slow = {"state": rs.url(), "latency": "realistic", "ttft_ms": 1500, "itl_ms": 1}
    s1, s2 = make_server(**slow), make_server(**slow)
    a, b = sdk(s1), sdk(s2)
    conv = a.conversations.create()  # its write at the end fails too: the response still ends
    r = a.responses.create(model="gpt-4o", input="x", background=True,
                           max_output_tokens=16, conversation=conv.id)
    wait_for(lambda: b.responses.retrieve(r.id).status == "in_progress", 10, "in_progress")
    rs.stop()
    sh = state(s1.app).shared
    assert sh is not None
    wait_for(lambda: sh.pending, 10, "a failed publication")
    rs.start()
    wait_for(lambda: not sh.pending, 10, "retried")

    def finished() -> bool:
        try:
            return b.responses.retrieve(r.id).status == "incomplete"  # (max_output_tokens)
        except openai.InternalServerError:
            return False

    wait_for(finished, 10, "finished on b")


def test_liveness_is_judged_only_after_a_full_ttl_of_own_beats(redis_server: RedisServer) -> None:
    """After an outage (or at start) another replica may not have beaten yet: it is taken
    as alive until this replica's own beats have reached Redis for OWNER_TTL_S."""
    import time

    from llmsim.state.redisconn import OWNER_TTL_S

    redis_server.flushall()
    sh = SharedState(redis_server.url())
    assert sh.alive("r-unknown")  # no beat of its own yet: cannot judge
    sh._up_since = time.monotonic() - OWNER_TTL_S - 1
    assert not sh.alive("r-unknown") and sh.alive(sh.replica)
    sh.call(lambda r: r.set(sh.key("replica", "r-live"), b"1"))
    assert sh.alive("r-live")


def test_values_are_bounded_by_the_body_limit(make_server: Any, redis_url: str) -> None:
    kw = {"state": redis_url, "max_body_bytes": 64 * 1024}
    s1 = make_server(**kw)
    a, b = sdk(s1), sdk(make_server(**kw))
    conv = a.conversations.create()
    big = "x " * 9000  # ~18 KB an item: a conversation keeps at most 64 KiB of them here
    for _ in range(3):
        a.conversations.items.create(conv.id, items=[
            {"type": "message", "role": "user", "content": big}] * 3)
    items = b.conversations.items.list(conv.id, limit=100).data
    assert 0 < len(items) < 9  # the oldest were dropped, the newest are shared
    # a stored response bigger than 2x the body limit is answered but not shared (a later
    # GET is a 404 everywhere, as for an evicted response)
    r = a.responses.create(model="gpt-4o", input="x", max_output_tokens=16000)
    assert r.status == "incomplete" and r.usage is not None and r.usage.output_tokens == 16000
    sh = state(s1.app).shared
    assert sh is not None and sh.snapshots.refused == 1
    for c in (a, b):
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)


def test_the_prompt_cache_is_shared_by_replicas(pair: Pair) -> None:
    """A prefix replica a cached is read on replica b (the shared table in Redis)."""
    a, b = (sdk(s) for s in pair)
    system = " ".join(f"Rule {i}: say {i} politely." for i in range(400))
    msgs = [{"role": "system", "content": system}, {"role": "user", "content": "first"}]
    r1 = a.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=2)
    assert r1.usage is not None and r1.usage.prompt_tokens >= 2048
    msgs[1]["content"] = "second"
    r2 = b.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=2)
    assert r2.usage is not None and r2.usage.prompt_tokens_details is not None
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= 1024 and cached % 128 == 0
