"""Rate limits (token buckets, x-ratelimit-* headers, 429 + retry-after) and API-key auth."""

from __future__ import annotations

import pytest

from llmsim.config import Limits, RateLimitConfig
from llmsim.sim.ratelimit import estimate_tokens
from llmsim.streaming.clock import FakeClock

from . import rawhttp
from .faultkit import CHAT, exchange, server

KEY = [("authorization", "Bearer sk-one")]


def _rl(h: dict[str, str]) -> tuple[str, ...]:
    return tuple(h.get(f"x-ratelimit-{k}-{w}", "-") for w in ("requests", "tokens")
                 for k in ("limit", "remaining", "reset"))


async def test_request_bucket_headers_decrease_and_reset() -> None:
    clock = FakeClock()
    srv = server(clock, ratelimit=RateLimitConfig(rpm=3))
    seen = []
    for _ in range(3):
        ex = await exchange(srv, CHAT, KEY)
        assert ex.status == 200
        seen.append(_rl(ex.headers)[:3])
    # 3 per minute = one request back every 20 s; reset = time until the bucket is full
    assert seen == [("3", "2", "20s"), ("3", "1", "40s"), ("3", "0", "1m0s")]
    ex = await exchange(srv, CHAT, KEY)
    assert ex.status == 429
    assert ex.headers["retry-after"] == "20" and ex.headers["retry-after-ms"] == "20000"
    assert _rl(ex.headers)[:3] == ("3", "0", "1m0s")
    assert ex.json()["error"] == {
        "message": "Rate limit reached for gpt-4o in organization org-llmsim on requests per "
                   "min (RPM): Limit 3, Used 3, Requested 1. Please try again in 20s. Visit "
                   "https://platform.openai.com/account/rate-limits to learn more.",
        "type": "requests", "param": None, "code": "rate_limit_exceeded"}
    clock.advance(5)
    ex = await exchange(srv, CHAT, KEY)
    assert ex.status == 429 and ex.headers["retry-after-ms"] == "15000"
    clock.advance(15)
    ex = await exchange(srv, CHAT, KEY)
    assert ex.status == 200 and _rl(ex.headers)[:3] == ("3", "0", "1m0s")
    clock.advance(60)
    ex = await exchange(srv, CHAT, KEY)
    assert _rl(ex.headers)[:3] == ("3", "2", "20s")
    # another key has its own buckets
    ex = await exchange(srv, CHAT, [("authorization", "Bearer sk-two")])
    assert _rl(ex.headers)[:3] == ("3", "2", "20s")


async def test_token_bucket_counts_prompt_estimate_plus_max_tokens() -> None:
    clock = FakeClock()
    srv = server(clock, ratelimit=RateLimitConfig(tpm=600))
    body = {**CHAT, "max_tokens": 100}
    prompt, mx = estimate_tokens(body)
    assert (prompt, mx) == (4, 100)  # "user" + "Hello there": 15 chars, ~4 chars a token
    ex = await exchange(srv, body, KEY)
    assert _rl(ex.headers) == ("-", "-", "-", "600", "496", "10.4s")
    for _ in range(4):
        await exchange(srv, body, KEY)
    ex = await exchange(srv, body, KEY)
    assert ex.status == 429 and ex.json()["error"]["type"] == "tokens"
    assert "Limit 600, Used 520, Requested 104" in ex.json()["error"]["message"]
    assert ex.headers["retry-after-ms"] == "2400"  # 24 tokens missing at 10 tokens/s
    big = await exchange(srv, {**CHAT, "max_tokens": 1000}, KEY)
    assert big.status == 429 and "Request too large" in big.json()["error"]["message"]


async def test_output_is_charged_afterwards_without_max_tokens() -> None:
    clock = FakeClock()
    srv = server(clock, ratelimit=RateLimitConfig(tpm=10_000), output_tokens_mean=50,
                 output_tokens_sigma=0.0)
    await exchange(srv, CHAT, KEY)
    ex = await exchange(srv, CHAT, KEY)
    # first: 4 at admission + 50 generated afterwards; second: 4 at admission
    assert ex.headers["x-ratelimit-remaining-tokens"] == str(10_000 - 54 - 4)
    ex = await exchange(srv, {**CHAT, "stream": True}, KEY)
    ex = await exchange(srv, CHAT, KEY)
    assert ex.headers["x-ratelimit-remaining-tokens"] == str(10_000 - 3 * 54 - 4)


async def test_model_and_key_tables() -> None:
    rl = RateLimitConfig(rpm=100, models={"gpt-4o": Limits(rpm=1)},
                         keys={"sk-vip": Limits(rpm=50)})
    srv = server(FakeClock(), ratelimit=rl)
    assert (await exchange(srv, CHAT, KEY)).headers["x-ratelimit-limit-requests"] == "1"
    assert (await exchange(srv, CHAT, KEY)).status == 429
    mini = await exchange(srv, {**CHAT, "model": "gpt-4o-mini"}, KEY)
    assert mini.status == 200 and mini.headers["x-ratelimit-limit-requests"] == "100"
    vip = await exchange(srv, CHAT, [("authorization", "Bearer sk-vip")])
    assert vip.status == 200 and vip.headers["x-ratelimit-limit-requests"] == "50"


async def test_rate_limits_off_by_default_no_headers() -> None:
    ex = await exchange(server(), CHAT, KEY)
    assert not any(k.startswith("x-ratelimit") for k in ex.headers)


# ------------------------------------------------------------------------------ auth
async def test_api_key_auth() -> None:
    srv = server(api_key=("sk-good", "sk-other"))
    ex = await exchange(srv, CHAT)
    assert ex.status == 401
    assert ex.json()["error"]["message"].startswith("You didn't provide an API key.")
    assert ex.json()["error"]["type"] == "invalid_request_error"
    ex = await exchange(srv, CHAT, [("authorization", "Bearer sk-wrong-key-1234")])
    assert ex.status == 401
    assert ex.json()["error"] == {
        "message": "Incorrect API key provided: sk-**********1234. You can find your API key "
                   "at https://platform.openai.com/account/api-keys.",
        "type": "invalid_request_error", "param": None, "code": "invalid_api_key"}
    assert (await exchange(srv, CHAT, [("authorization", "Bearer sk-good")])).status == 200
    assert (await exchange(srv, CHAT, [("api-key", "sk-other")])).status == 200
    assert (await exchange(srv, None, path="/v1/models", method="GET")).status == 401
    # observability and steering stay reachable without a key
    assert (await exchange(srv, None, path="/health", method="GET")).status == 200
    assert (await exchange(srv, None, path="/llmsim/faults", method="GET")).status == 200


def test_sdk_authentication_error(make_server) -> None:  # type: ignore[no-untyped-def]
    import openai
    from openai import OpenAI

    st = make_server(api_key=("sk-good",))
    with OpenAI(base_url=st.url + "/v1", api_key="sk-bad", max_retries=0,
                _strict_response_validation=True) as c:
        with pytest.raises(openai.AuthenticationError) as ei:
            c.models.list()
        assert ei.value.code == "invalid_api_key"
    with OpenAI(base_url=st.url + "/v1", api_key="sk-good", max_retries=0,
                _strict_response_validation=True) as c:
        assert c.models.list().data
    assert rawhttp.request(st.url, "GET", "/health").status == 200
