"""The request journal and the client verdict (issue 35): what the client sent, and how it
behaved against injected faults. Timings on a FakeClock (exact gaps), the SDK on a real one."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from llmsim.api.clients import CLIENTS, JOURNAL_BODY_BYTES, MAX_KEYS, MAX_PENDING
from llmsim.config import Config, ConfigError, FaultsConfig
from llmsim.streaming.clock import FakeClock

from . import rawhttp
from .faultkit import CHAT, exchange, server

KEY = [("authorization", "Bearer sk-one")]
STREAM = {**CHAT, "stream": True, "max_tokens": 20}


def verdict(srv: Any, key: str = "sk-one") -> dict[str, Any]:
    v = srv.app.feature(CLIENTS).keys.get(key)
    assert v is not None, f"no verdict for {key}"
    return v.public()  # type: ignore[no-any-return]


async def test_retry_after_honoured_and_early() -> None:
    clock = FakeClock()
    srv = server(clock, faults=FaultsConfig(retry_after_ms=2000))
    await srv.start()
    try:
        fault = [*KEY, ("x-llmsim-fault", "429")]
        assert (await exchange(srv, CHAT, fault)).status == 429
        clock.advance(2.0)  # waits as asked
        assert (await exchange(srv, CHAT, fault)).status == 429
        clock.advance(0.5)  # comes back early
        assert (await exchange(srv, CHAT, KEY)).status == 200
        v = verdict(srv)
        assert (v["failures"], v["retries"], v["retry_after_sent"]) == (2, 2, 2)
        assert (v["retry_after_honoured"], v["retry_after_early"]) == (1, 1)
        assert v["honoured_retry_after"] is False and v["gaps_ms"] == [2000.0, 500.0]
        assert v["backoff_grew"] is False  # the second wait was shorter
        assert v["unretried_failures"] == 0 and not v["retried_non_retryable"]
    finally:
        await srv.close()


async def test_backoff_growth_and_non_retryable() -> None:
    clock = FakeClock()
    srv = server(clock)
    await srv.start()
    try:
        for wait in (0.25, 0.5, 1.0):  # a 500 carries no retry-after: the client's backoff
            assert (await exchange(srv, CHAT, [*KEY, ("x-llmsim-fault", "500")])).status == 500
            clock.advance(wait)
        assert (await exchange(srv, CHAT, KEY)).status == 200
        v = verdict(srv)
        assert v["retries"] == 3 and v["backoff_grew"] is True
        assert v["honoured_retry_after"] is None  # nothing asked it to wait
        bad = {"model": "gpt-4o"}  # no messages: a 400 the SDKs never retry
        for _ in range(2):
            assert (await exchange(srv, bad, KEY)).status == 400
        v = verdict(srv)
        assert v["non_retryable_retries"] == 1 and v["retried_non_retryable"] is True
        assert v["unretried_failures"] == 1  # the last 400 was (rightly) not sent again
        # a different request after a failure is not a retry
        other = [("authorization", "Bearer sk-two")]
        assert (await exchange(srv, CHAT, [*other, ("x-llmsim-fault", "503")])).status == 503
        assert (await exchange(srv, {**CHAT, "max_tokens": 3}, other)).status == 200
        assert verdict(srv, "sk-two")["retries"] == 0
    finally:
        await srv.close()


async def test_streams_interrupted_resumed_and_abandoned() -> None:
    clock = FakeClock()
    srv = server(clock)
    await srv.start()
    try:
        ex = await exchange(srv, STREAM, [*KEY, ("x-llmsim-fault", "disconnect-after:3")])
        assert ex.aborted and not ex.complete
        ex = await exchange(srv, STREAM, KEY)  # asks again: resumed
        assert ex.complete
        v = verdict(srv)
        assert (v["streams_interrupted"], v["streams_resumed"], v["retries"]) == (1, 1, 1)
        slow = server(clock, latency="realistic", ttft_ms=10, itl_ms=1000)
        await slow.start()
        try:  # the client leaves a slow stream after a few passes
            ex = await exchange(slow, {**STREAM, "max_tokens": 500}, KEY, max_passes=40)
            assert not ex.complete
            await exchange(slow, CHAT, [("authorization", "Bearer sk-none")])  # (lets it end)
            assert verdict(slow)["streams_abandoned"] == 1
        finally:
            await slow.close()
    finally:
        await srv.close()


async def test_a_responses_stream_resumed_with_starting_after() -> None:
    srv = server(FakeClock())
    await srv.start()
    try:
        body = {"model": "gpt-4o", "input": "hi", "stream": True, "max_output_tokens": 50}
        ex = await exchange(srv, body, [*KEY, ("x-llmsim-fault", "disconnect-after:3")],
                            path="/v1/responses")
        assert ex.aborted
        rid = orjson.loads(ex.body.split(b"data: ", 1)[1].split(b"\n", 1)[0])["response"]["id"]
        assert verdict(srv)["unretried_failures"] == 1
        ex = await exchange(srv, None, KEY, method="GET",
                            path=f"/v1/responses/{rid}?stream=true&starting_after=2")
        assert ex.status == 200 and ex.complete
        v = verdict(srv)
        assert (v["streams_interrupted"], v["streams_resumed"]) == (1, 1)
        assert v["retries"] == 0 and v["unretried_failures"] == 0
        assert srv.app.feature(CLIENTS).watched == 0
    finally:
        await srv.close()


async def test_healthy_traffic_leaves_no_state() -> None:
    srv = server(FakeClock())
    await srv.start()
    try:
        for _ in range(5):
            assert (await exchange(srv, CHAT, KEY)).status == 200
            assert (await exchange(srv, STREAM, KEY)).complete
        w = srv.app.feature(CLIENTS)
        assert w.keys == {} and w.watched == 0 and w.chains == {} and w.journal is None
    finally:
        await srv.close()


async def test_verdict_bounds() -> None:
    srv = server(FakeClock())
    await srv.start()
    try:
        w = srv.app.feature(CLIENTS)
        for i in range(MAX_PENDING + 5):  # distinct failed requests of one key
            body = {**CHAT, "max_tokens": i + 1}
            assert (await exchange(srv, body, [*KEY, ("x-llmsim-fault", "500")])).status == 500
        assert len(w.keys["sk-one"].pending) == MAX_PENDING
        for i in range(MAX_KEYS + 3):
            await exchange(srv, CHAT, [("authorization", f"Bearer k{i}"),
                                       ("x-llmsim-fault", "500")])
        assert len(w.keys) == MAX_KEYS and w.watched == MAX_KEYS
    finally:
        await srv.close()


async def test_journal_contents_and_bounds() -> None:
    srv = server(FakeClock(), journal=3)
    await srv.start()
    try:
        hs = [*KEY, ("api-key", "sk-one"), ("x-trace", "t1")]
        assert (await exchange(srv, CHAT, hs)).status == 200
        assert (await exchange(srv, CHAT, [("x-llmsim-fault", "429")])).status == 429
        assert (await exchange(srv, STREAM, hs)).complete
        e = srv.app.feature(CLIENTS).journal
        rows = [x.public(False) for x in e.items]
        assert [(r["method"], r["path"], r["status"], r["stream"]) for r in rows] == [
            ("POST", "/v1/chat/completions", 200, False),
            ("POST", "/v1/chat/completions", 429, False),
            ("POST", "/v1/chat/completions", 200, True)]
        assert rows[0]["body"] == CHAT and rows[0]["headers"]["x-trace"] == "t1"
        assert "authorization" not in rows[0]["headers"] and "api-key" not in rows[0]["headers"]
        assert rows[0]["api_key"] == "sk-one" and rows[1]["api_key"] == "-"
        assert rows[2]["end"] == "completed"
        assert (await exchange(srv, CHAT, hs)).status == 200
        assert [x.seq for x in e.items] == [2, 3, 4] and e.dropped == 1  # at most 3
        big = {**CHAT, "user": "u" * (JOURNAL_BODY_BYTES * 2)}
        assert (await exchange(srv, big, hs)).status == 200
        last = e.items[-1].public(False)
        assert last["body_truncated"] and last["body_bytes"] > JOURNAL_BODY_BYTES
        assert len(last["body"]) == JOURNAL_BODY_BYTES
        assert e.bytes <= srv.config.journal_max_bytes
        got = (await exchange(srv, None, path="/llmsim/journal?since=4", method="GET")).json()
        assert [r["seq"] for r in got["data"]] == [5]
        bad = await exchange(srv, None, path="/llmsim/journal?since=x", method="GET")
        assert bad.status == 400 and bad.json()["error"]["param"] == "since"
        assert (await exchange(srv, None, path="/llmsim/journal", method="DELETE")).status == 200
        assert len(e.items) == 0 and e.bytes == 0
    finally:
        await srv.close()


async def test_journal_byte_budget() -> None:
    srv = server(FakeClock(), journal=1000, journal_max_bytes=256 * 1024)
    await srv.start()
    try:
        body = {**CHAT, "user": "u" * 60_000}
        for _ in range(10):
            assert (await exchange(srv, body, KEY)).status == 200
        j = srv.app.feature(CLIENTS).journal
        assert 0 < len(j.items) < 10 and j.bytes <= 256 * 1024 and j.dropped == 10 - len(j.items)
    finally:
        await srv.close()


def test_journal_off_and_settings() -> None:
    with pytest.raises(ConfigError, match="journal_max_bytes"):
        Config(journal_max_bytes=10)
    with pytest.raises(ConfigError, match="journal:"):
        Config(journal=-1)


def test_http_views_and_reset(make_server: Any) -> None:
    srv = make_server()
    r = rawhttp.request(srv.url, "GET", "/llmsim/journal")
    assert r.status == 404 and r.json()["error"]["code"] == "journal_off"
    assert rawhttp.request(srv.url, "POST", "/v1/chat/completions", CHAT,
                           [*KEY, ("x-llmsim-fault", "429")]).status == 429
    lst = rawhttp.request(srv.url, "GET", "/llmsim/clients").json()
    assert [d["api_key"] for d in lst["data"]] == ["sk-one"]
    one = rawhttp.request(srv.url, "GET", "/llmsim/clients/sk-one").json()
    assert one["failures"] == 1 and one["honoured_retry_after"] is None
    never = rawhttp.request(srv.url, "GET", "/llmsim/clients/sk-never").json()
    assert never["requests"] == 0  # an empty record, not a 404
    assert rawhttp.request(srv.url, "DELETE", "/llmsim/clients").status == 200
    assert rawhttp.request(srv.url, "GET", "/llmsim/clients").json()["data"] == []


def test_keys_masked_when_keys_are_configured(make_server: Any) -> None:
    srv = make_server(api_key=("sk-secret-key-1",), journal=10)
    hs = [("authorization", "Bearer sk-secret-key-1"), ("x-llmsim-fault", "500")]
    assert rawhttp.request(srv.url, "POST", "/v1/chat/completions", CHAT, hs).status == 500
    text = rawhttp.request(srv.url, "GET", "/llmsim/clients").body
    text += rawhttp.request(srv.url, "GET", "/llmsim/journal").body
    assert b"sk-secret-key-1" not in text and b"sk-" in text


def test_openai_sdk_honours_retry_after(make_server: Any) -> None:
    from openai import BadRequestError, OpenAI, RateLimitError

    srv = make_server(faults=FaultsConfig(retry_after_ms=50), journal=100)
    rule = {"fault": "429", "count": 2}
    assert rawhttp.request(srv.url, "POST", "/llmsim/faults", rule).status == 200
    with OpenAI(base_url=srv.url + "/v1", api_key="sk-sdk", max_retries=3) as c:
        c.chat.completions.create(**CHAT)
    v = orjson.loads(rawhttp.request(srv.url, "GET", "/llmsim/clients/sk-sdk").body)
    assert v["retries"] == 2 and v["honoured_retry_after"] is True
    assert v["retry_after_honoured"] == 2 and not v["retried_non_retryable"]
    assert all(g >= 50 * 0.95 for g in v["gaps_ms"])
    # the SDK does not retry a 400 (and says so in the verdict)
    with OpenAI(base_url=srv.url + "/v1", api_key="sk-sdk2", max_retries=3) as c:
        with pytest.raises(BadRequestError):
            c.chat.completions.create(model="gpt-4o", messages=[])
    v = orjson.loads(rawhttp.request(srv.url, "GET", "/llmsim/clients/sk-sdk2").body)
    assert v["failures"] == 1 and v["retries"] == 0 and v["unretried_failures"] == 1
    # max_retries=0 gives up: a failure left unretried
    rawhttp.request(srv.url, "POST", "/llmsim/faults", {"fault": "429", "count": 1})
    with OpenAI(base_url=srv.url + "/v1", api_key="sk-sdk3", max_retries=0) as c:
        with pytest.raises(RateLimitError):
            c.chat.completions.create(**CHAT)
    v = orjson.loads(rawhttp.request(srv.url, "GET", "/llmsim/clients/sk-sdk3").body)
    assert v["unretried_failures"] == 1 and v["honoured_retry_after"] is None
