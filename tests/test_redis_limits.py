"""Rate limits, fault rules and script cursors shared by two replicas through a real Redis
(``--state redis://...``): what one server does, the pair does (issue 16)."""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest
import redis

from llmsim.config import RateLimitConfig
from llmsim.state import redis_limits

from .redis_fixture import RedisServer

MSG = [{"role": "user", "content": "Hello there"}]
KEY = "sk-pair"


def _pair(make_server: Any, url: str, **kw: Any) -> tuple[Any, Any]:
    return make_server(state=url, **kw), make_server(state=url, **kw)


def _sdk(srv: Any, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0,
                         _strict_response_validation=True)


def _chat(srv: Any, headers: dict[str, str] | None = None, key: str = KEY) -> httpx.Response:
    return httpx.post(srv.url + "/v1/chat/completions", json={"model": "gpt-4o",
                                                              "messages": MSG},
                      headers={"authorization": f"Bearer {key}", **(headers or {})},
                      timeout=10)


def _keys(url: str, pattern: str) -> list[bytes]:
    with redis.Redis.from_url(url) as r:
        return sorted(r.scan_iter(pattern))


# -- rate limits -------------------------------------------------------------------------------

def test_rpm_limit_holds_for_the_pair(make_server: Any, redis_url: str) -> None:
    a, b = _pair(make_server, redis_url, ratelimit=RateLimitConfig(rpm=3))
    remaining = []
    with _sdk(a) as ca, _sdk(b) as cb:
        for c in (ca, cb, ca):
            raw = c.chat.completions.with_raw_response.create(model="gpt-4o", messages=MSG)
            raw.parse()
            assert raw.headers["x-ratelimit-limit-requests"] == "3"
            remaining.append(raw.headers["x-ratelimit-remaining-requests"])
        assert remaining == ["2", "1", "0"]  # one bucket, whichever replica took from it
        for c in (cb, ca):
            with pytest.raises(openai.RateLimitError) as ei:
                c.chat.completions.create(model="gpt-4o", messages=MSG)
            err = ei.value
            assert err.code == "rate_limit_exceeded" and err.type == "requests"
            assert "requests per min (RPM): Limit 3, Used 3, Requested 1" in err.message
            assert int(err.response.headers["retry-after"]) >= 1
            assert err.response.headers["x-ratelimit-remaining-requests"] == "0"
    # another key has its own bucket; bucket keys expire (a few windows) and hide the API key
    assert _chat(b, key="sk-other").status_code == 200
    keys = _keys(redis_url, "llmsim:rl:*")
    assert len(keys) == 2 and not any(b"sk-" in k for k in keys)
    with redis.Redis.from_url(redis_url) as r:
        assert all(0 < r.ttl(k) <= redis_limits.BUCKET_TTL_S for k in keys)


def test_concurrent_takes_are_atomic(make_server: Any, redis_url: str) -> None:
    """20 requests at once, half on each replica, against rpm = 10: exactly the bucket's 10
    pass (plus what it refilled meanwhile: one per 6 s), however the takes interleave."""
    a, b = _pair(make_server, redis_url, ratelimit=RateLimitConfig(rpm=10))
    t0 = time.monotonic()
    with ThreadPoolExecutor(20) as pool:
        got = list(pool.map(lambda i: _chat(a if i % 2 else b).status_code, range(20)))
    refilled = int((time.monotonic() - t0) * 10 / 60)
    assert sorted(set(got)) == [200, 429]
    assert 10 <= got.count(200) <= 10 + refilled, (got, refilled)


def test_tpm_refusals_match_one_server(make_server: Any, redis_url: str) -> None:
    a, b = _pair(make_server, redis_url, ratelimit=RateLimitConfig(tpm=300))
    body = {"model": "gpt-4o", "messages": MSG, "max_tokens": 100}  # ~104 tokens a request
    hdr = {"authorization": f"Bearer {KEY}"}
    r1 = httpx.post(a.url + "/v1/chat/completions", json=body, headers=hdr)
    r2 = httpx.post(b.url + "/v1/chat/completions", json=body, headers=hdr)
    assert (r1.status_code, r2.status_code) == (200, 200)
    assert int(r2.headers["x-ratelimit-remaining-tokens"]) < \
        int(r1.headers["x-ratelimit-remaining-tokens"])
    r3 = httpx.post(a.url + "/v1/chat/completions", json=body, headers=hdr)
    assert r3.status_code == 429 and r3.json()["error"]["type"] == "tokens"
    big = httpx.post(b.url + "/v1/chat/completions", json={**body, "max_tokens": 1000},
                     headers=hdr)
    assert big.status_code == 429
    assert big.json()["error"]["message"].startswith("Request too large for gpt-4o")


# -- fault rules -------------------------------------------------------------------------------

def test_count_rule_fires_twice_across_the_pair(make_server: Any, redis_url: str) -> None:
    a, b = _pair(make_server, redis_url)
    rule = httpx.post(a.url + "/llmsim/faults", json={"fault": "429", "count": 2}).json()
    assert rule["id"] == "fault_1" and rule["count"] == 2
    seen = httpx.get(b.url + "/llmsim/faults").json()["data"]
    assert [r["id"] for r in seen] == ["fault_1"]  # installed on A, seen by B
    statuses = []
    with _sdk(a) as ca, _sdk(b) as cb:
        for c in (cb, ca, cb, ca):
            try:
                c.chat.completions.create(model="gpt-4o", messages=MSG)
                statuses.append(200)
            except openai.RateLimitError:
                statuses.append(429)
    assert statuses == [429, 429, 200, 200]
    assert httpx.get(a.url + "/llmsim/faults").json()["data"] == []  # exhausted: gone
    assert _keys(redis_url, "llmsim:faults:n:*") == []


def test_every_rule_counts_the_pairs_requests(make_server: Any, redis_url: str) -> None:
    a, b = _pair(make_server, redis_url)
    rid = httpx.post(b.url + "/llmsim/faults", json={"fault": "503", "every": 2}).json()["id"]
    got = [_chat(s).status_code for s in (a, b, a, b, a)]
    assert got == [200, 503, 200, 503, 200]
    one = httpx.get(a.url + f"/llmsim/faults/{rid}").json()
    assert (one["seen"], one["fired"]) == (5, 2)


def test_delete_on_one_replica_clears_for_all(make_server: Any, redis_url: str) -> None:
    a, b = _pair(make_server, redis_url)
    r1 = httpx.post(a.url + "/llmsim/faults", json=[{"fault": "500", "model": "gpt-4o"},
                                                     {"fault": "502"}]).json()["data"]
    assert _chat(a).status_code == 500
    d = httpx.delete(b.url + f"/llmsim/faults/{r1[0]['id']}")
    assert d.json() == {"id": r1[0]["id"], "object": "llmsim.fault_rule", "deleted": True}
    assert _chat(a).status_code == 502  # the next rule now
    assert httpx.get(a.url + f"/llmsim/faults/{r1[0]['id']}").status_code == 404
    assert httpx.delete(b.url + "/llmsim/faults").json() == {"object": "list", "deleted": 1}
    assert _chat(a).status_code == 200 and _chat(b).status_code == 200
    # the header still works, and 'none' still bypasses the (shared) rules
    httpx.post(a.url + "/llmsim/faults", json={"fault": "500"})
    assert _chat(b, {"x-llmsim-fault": "none"}).status_code == 200
    assert _chat(b, {"x-llmsim-fault": "502"}).status_code == 502


def test_bad_and_too_many_rules(make_server: Any, redis_url: str,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _pair(make_server, redis_url)
    bad = httpx.post(a.url + "/llmsim/faults", json={"fault": "429", "count": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "count"
    assert httpx.get(b.url + "/llmsim/faults").json()["data"] == []  # nothing stored
    monkeypatch.setattr(redis_limits, "MAX_RULES", 2)
    for s in (a, b):
        assert httpx.post(s.url + "/llmsim/faults", json={"fault": "500", "model": "x"}
                          ).status_code == 200
    full = httpx.post(a.url + "/llmsim/faults", json={"fault": "500"})
    assert full.status_code == 429 and full.json()["error"]["code"] == "too_many_rules"


# -- script cursors ----------------------------------------------------------------------------

SCRIPT = {"rules": [{"match": {"endpoint": "chat.completions"},
                     "reply": [{"text": "first turn"}, {"text": "second turn"},
                               {"text": "third turn"}], "then": "error"}]}


def _said(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def test_script_continues_on_the_other_replica(make_server: Any, redis_url: str) -> None:
    a, b = _pair(make_server, redis_url)
    for s in (a, b):  # the script is loaded per replica; its cursors are shared
        assert httpx.post(s.url + "/llmsim/scripts", json=SCRIPT).status_code == 200
    sess = {"x-llmsim-session": "agent-1"}
    assert _said(_chat(a, sess)) == "first turn"
    assert _said(_chat(b, sess)) == "second turn"
    assert _said(_chat(b, {"x-llmsim-session": "agent-2"})) == "first turn"  # its own run
    assert _said(_chat(a, sess)) == "third turn"
    out = _chat(b, sess)
    assert out.status_code == 400 and out.json()["error"]["code"] == "script_exhausted"
    with _sdk(b, key="sk-anon") as cb:  # the API key's session, through the strict SDK
        said = [cb.chat.completions.create(model="gpt-4o", messages=MSG)  # type: ignore
                .choices[0].message.content for _ in range(1)]
    assert said == ["first turn"] and _said(_chat(a, key="sk-anon")) == "second turn"
    with redis.Redis.from_url(redis_url) as r:
        cursors = [k for k in r.scan_iter("llmsim:script:*:cur:*")]
        assert cursors and all(0 < r.ttl(k) <= redis_limits.CURSOR_TTL_S for k in cursors)
    # installing the script again starts every replica's cursors over
    httpx.post(a.url + "/llmsim/scripts", json=SCRIPT)
    assert _said(_chat(b, sess)) == "first turn"


# -- Redis down --------------------------------------------------------------------------------

def _until(fn: Callable[[], httpx.Response], status: int, tries: int = 5) -> httpx.Response:
    r = fn()
    for _ in range(tries):
        if r.status_code == status:
            break
        r = fn()
    return r


def test_redis_down_then_back(make_server: Any, own_redis: Callable[[], RedisServer]) -> None:
    rs = own_redis()
    limited = make_server(state=rs.url(), ratelimit=RateLimitConfig(rpm=100))
    plain = make_server(state=rs.url())
    httpx.post(plain.url + "/llmsim/faults", json={"fault": "500", "model": "gpt-4o-mini"})
    assert _chat(limited).status_code == 200 and _chat(plain).status_code == 200
    rs.stop()
    r = _chat(limited)  # the limit needs Redis: a clear 503, never a silent pass
    assert r.status_code == 503 and r.headers["retry-after"] == "1"
    err = r.json()["error"]
    assert err["code"] == "shared_state_unavailable" and "Shared state" in err["message"]
    assert _chat(plain).status_code == 200  # matches no rule: needs nothing from Redis
    mini = httpx.post(plain.url + "/v1/chat/completions",
                      json={"model": "gpt-4o-mini", "messages": MSG})
    assert mini.status_code == 503  # its rule's counter is in Redis
    assert mini.json()["error"]["code"] == "shared_state_unavailable"
    lst = httpx.get(plain.url + "/llmsim/faults")
    assert lst.status_code == 503 and lst.json()["error"]["code"] == "shared_state_unavailable"
    rs.start()  # an empty Redis: buckets start full, the rule is gone
    assert _until(lambda: _chat(limited), 200).status_code == 200
    assert _until(lambda: httpx.post(plain.url + "/v1/chat/completions",
                                     json={"model": "gpt-4o-mini", "messages": MSG}),
                  200).status_code == 200


def test_late_token_charge_and_anthropic_headers(make_server: Any, redis_url: str) -> None:
    a, b = _pair(make_server, redis_url, ratelimit=RateLimitConfig(rpm=10, tpm=1000))
    r1 = _chat(a)  # no max_tokens: charged its output afterwards (in the background)
    used = r1.json()["usage"]["completion_tokens"]
    assert r1.headers["x-ratelimit-remaining-tokens"] == "996"  # the prompt estimate only
    with redis.Redis.from_url(redis_url) as r:
        (tk,) = _keys(redis_url, "llmsim:rl:*:t")
        for _ in range(500):  # the charge lands soon after the answer; wait for it
            if float(r.hget(tk, "l") or 0) < 996 - used + 1:
                break
            time.sleep(0.01)
        assert float(r.hget(tk, "l") or 0) < 996 - used + 1
    msg = httpx.post(b.url + "/anthropic/v1/messages",
                     json={"model": "gpt-4o", "max_tokens": 50, "messages": MSG},
                     headers={"x-api-key": KEY, "anthropic-version": "2023-06-01"})
    assert msg.status_code == 200
    assert msg.headers["anthropic-ratelimit-requests-limit"] == "10"
    assert msg.headers["anthropic-ratelimit-requests-remaining"] == "8"  # A's request counts


def test_previous_response_id_link_is_shared(make_server: Any, redis_url: str) -> None:
    a, b = _pair(make_server, redis_url)
    script = {"rules": [{"reply": [{"text": "first"}, {"text": "second"}]}]}
    for s in (a, b):
        httpx.post(s.url + "/llmsim/scripts", json=script)
    with _sdk(a) as ca, _sdk(b) as cb:
        tagged = ca.with_options(default_headers={"X-LLMSim-Session": "agent-7"})
        r1 = tagged.responses.create(model="gpt-4o", input="a")
        assert r1.output_text == "first"
        assert _keys(redis_url, f"llmsim:script:*:chain:{r1.id}")  # the link is in Redis
        r2 = ca.responses.create(model="gpt-4o", input="b", previous_response_id=r1.id)
        assert r2.output_text == "second"  # agent-7's session, through the link
        assert cb.responses.create(model="gpt-4o", input="c").output_text == "first"


def test_rule_windows_expire_for_all(make_server: Any, redis_url: str) -> None:
    a, b = _pair(make_server, redis_url)
    past = httpx.post(a.url + "/llmsim/faults",
                      json={"fault": "500", "start": 1_000_000_000, "end": 1_000_000_001})
    assert past.status_code == 200
    assert _chat(b).status_code == 200  # its window has passed: it never fires
    assert httpx.get(b.url + "/llmsim/faults").json()["data"] == []  # and is removed
    with redis.Redis.from_url(redis_url) as r:
        assert r.hlen("llmsim:faults:rules") == 0


def test_scripted_request_with_redis_down(make_server: Any,
                                          own_redis: Callable[[], RedisServer]) -> None:
    rs = own_redis()
    srv = make_server(state=rs.url())
    httpx.post(srv.url + "/llmsim/scripts", json=SCRIPT)
    assert _said(_chat(srv)) == "first turn"
    rs.stop()
    r = _chat(srv)
    assert r.status_code == 503 and r.json()["error"]["code"] == "shared_state_unavailable"
    emb = httpx.post(srv.url + "/v1/embeddings", json={"model": "text-embedding-3-small",
                                                       "input": "x"})
    assert emb.status_code == 200  # not scripted, no limits: served
    rs.start()
    assert _said(_until(lambda: _chat(srv), 200)) == "first turn"  # an empty Redis: start over


def test_oversized_rule_fields_are_refused(make_server: Any, redis_url: str) -> None:
    a = make_server(state=redis_url)
    for field, value in (("model", "m" * 5000), ("fault", "5" * 5000),
                         ("api_key", "k" * 5000)):
        r = httpx.post(a.url + "/llmsim/faults", json={"fault": "500", field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field
        assert "at most 1024 characters" in r.json()["error"]["message"]
    with redis.Redis.from_url(redis_url) as r:
        assert r.hlen("llmsim:faults:rules") == 0


def test_ws_rule_installed_on_one_fires_once_on_the_other(make_server: Any,
                                                          redis_url: str) -> None:
    from .test_faults_responses import TERMINALS
    from .test_websocket_raw import RawWS

    a, b = _pair(make_server, redis_url)
    httpx.post(a.url + "/llmsim/faults", json={"fault": "503", "transport": "ws", "count": 1})
    assert _chat(b).status_code == 200  # an HTTP request does not match a ws rule
    ws = RawWS(b.url)
    try:
        for want in ("error", "response.completed"):  # fires once, then the rule is spent
            ws.send_json({"type": "response.create", "model": "gpt-4o", "input": "Hello"})
            while (ev := ws.recv_json())["type"] not in TERMINALS | {"error"}:
                pass
            assert ev["type"] == want, ev
            if want == "error":
                assert ev["status"] == 503
    finally:
        ws.close()
    assert httpx.get(a.url + "/llmsim/faults").json()["data"] == []
