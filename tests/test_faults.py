"""Fault injection on Chat Completions: header grammar, every kind's exact bytes, scenario
rules, seeded probabilities, and the official SDK retrying an injected 429."""

from __future__ import annotations

import time

import orjson
import pytest

from llmsim.config import FaultRates, FaultsConfig
from llmsim.errors import APIError
from llmsim.sim.faults import Fault, fmt_duration, parse_spec
from llmsim.streaming.clock import FakeClock

from . import rawhttp
from .faultkit import CHAT, exchange, server

STREAM = {**CHAT, "stream": True, "max_tokens": 6}


# ------------------------------------------------------------------------------ grammar
@pytest.mark.parametrize("spec,fault", [
    ("429", Fault("status", 429, variant="requests")),
    ("429:tokens", Fault("status", 429, variant="tokens")),
    ("429:quota", Fault("status", 429, variant="quota")),
    ("500", Fault("status", 500)), ("503", Fault("status", 503)),
    ("529", Fault("status", 529)), ("504", Fault("status", 504)),
    ("reset", Fault("reset")), ("hang:250", Fault("hang", 0, ms=250)),
    ("hang:250:504", Fault("hang", 504, ms=250)),
    ("disconnect-after:5", Fault("disconnect", after=5)),
    ("stall-after:3:1500", Fault("stall", after=3, ms=1500)),
    ("error-after:4", Fault("error", 500, after=4)),
    ("error-after:4:503", Fault("error", 503, after=4)),
    ("truncate-after:0", Fault("truncate", after=0)),
])
def test_spec_grammar_round_trips(spec: str, fault: Fault) -> None:
    assert parse_spec(spec) == fault
    assert parse_spec(parse_spec(spec).spec()) == fault


@pytest.mark.parametrize("bad", ["", "418", "429:minutes", "hang", "hang:x", "reset:1",
                                 "disconnect-after", "disconnect-after:-1", "stall-after:3",
                                 "error-after:1:200", "nonsense"])
def test_spec_grammar_rejects(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_spec(bad)


def test_duration_format_like_the_real_api() -> None:
    assert [fmt_duration(s) for s in (0.12, 1, 8.64, 20, 60, 360, 3723.5)] == \
        ["120ms", "1s", "8.64s", "20s", "1m0s", "6m0s", "1h2m3.5s"]


# ------------------------------------------------------------------------------ pre-byte
async def test_invalid_header_is_a_400_naming_the_header() -> None:
    ex = await exchange(server(), STREAM, [("X-LLMSim-Fault", "explode")])
    assert ex.status == 400
    err = ex.json()["error"]
    assert err["param"] == "X-LLMSim-Fault" and err["code"] == "invalid_value"
    assert "'explode'" in err["message"] and "disconnect-after:N" in err["message"]


@pytest.mark.parametrize("stream", [True, False])
async def test_status_faults_exact_envelopes_and_headers(stream: bool) -> None:
    srv = server()
    body = {**CHAT, "stream": stream}
    ex = await exchange(srv, body, [("x-llmsim-fault", "429")])
    assert ex.status == 429 and ex.complete
    assert ex.json() == {"error": {
        "message": "Rate limit reached for gpt-4o in organization org-llmsim on requests per min "
                   "(RPM): Limit 500, Used 500, Requested 1. Please try again in 1s. Visit "
                   "https://platform.openai.com/account/rate-limits to learn more.",
        "type": "requests", "param": None, "code": "rate_limit_exceeded"}}
    assert ex.headers["retry-after"] == "1" and ex.headers["retry-after-ms"] == "1000"
    assert ex.headers["x-request-id"].startswith("req_")
    assert ex.headers["content-type"] == "application/json"

    ex = await exchange(srv, body, [("x-llmsim-fault", "429:tokens")])
    assert ex.json()["error"]["type"] == "tokens"
    assert "tokens per min (TPM)" in ex.json()["error"]["message"]
    ex = await exchange(srv, body, [("x-llmsim-fault", "429:quota")])
    assert ex.json()["error"]["code"] == "insufficient_quota"

    ex = await exchange(srv, body, [("x-llmsim-fault", "500")])
    assert ex.status == 500 and ex.headers["x-should-retry"] == "true"
    assert ex.json() == {"error": {"message": "The server had an error while processing your "
                                              "request. Sorry about that!",
                                   "type": "server_error", "param": None, "code": None}}
    ex = await exchange(srv, body, [("x-llmsim-fault", "503")])
    assert ex.status == 503 and ex.headers["retry-after-ms"] == "1000"
    assert ex.json()["error"]["message"] == ("The engine is currently overloaded, please try "
                                             "again later.")
    ex = await exchange(srv, body, [("x-llmsim-fault", "529")])
    assert ex.status == 529 and ex.json()["error"]["type"] == "overloaded_error"
    ex = await exchange(srv, body, [("x-llmsim-fault", "504")])
    assert ex.status == 504 and ex.json()["error"]["type"] == "timeout_error"


async def test_reset_drops_the_connection_before_any_byte() -> None:
    ex = await exchange(server(), STREAM, [("x-llmsim-fault", "reset")])
    assert ex.aborted and ex.status == 0 and ex.body == b""


async def test_hang_then_drop_or_status_on_fake_clock() -> None:
    clock = FakeClock()
    srv = server(clock)
    t0 = clock.now()
    ex = await exchange(srv, STREAM, [("x-llmsim-fault", "hang:30000")])
    assert ex.aborted and ex.status == 0
    assert clock.now() - t0 == pytest.approx(30.0)
    t0 = clock.now()
    ex = await exchange(srv, STREAM, [("x-llmsim-fault", "hang:2500:504")])
    assert ex.status == 504 and clock.now() - t0 == pytest.approx(2.5)


def test_reset_is_a_real_tcp_reset(srv) -> None:  # type: ignore[no-untyped-def]
    body = orjson.dumps(STREAM)
    s = rawhttp.connect(srv.url)
    s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-llmsim-fault: reset\r\n"
              b"content-length: %d\r\n\r\n%s" % (len(body), body))
    with pytest.raises(ConnectionResetError):
        while s.recv(65536):
            pass
    s.close()


# ------------------------------------------------------------------------------ mid-stream
async def test_disconnect_after_n_tokens() -> None:
    ex = await exchange(server(), STREAM, [("x-llmsim-fault", "disconnect-after:2")])
    assert ex.status == 200 and ex.aborted and not ex.complete
    assert len(ex.chat_tokens()) == 2
    assert b"[DONE]" not in ex.body and b"finish_reason\":\"" not in ex.body


async def test_truncate_after_n_tokens_ends_cleanly_without_terminal() -> None:
    ex = await exchange(server(), STREAM, [("x-llmsim-fault", "truncate-after:3")])
    assert ex.status == 200 and ex.complete and not ex.aborted
    assert len(ex.chat_tokens()) == 3
    assert b"[DONE]" not in ex.body and b'"finish_reason":"length"' not in ex.body


async def test_truncate_beyond_the_stream_drops_only_the_terminal() -> None:
    ex = await exchange(server(), STREAM, [("x-llmsim-fault", "truncate-after:100")])
    assert ex.complete and len(ex.chat_tokens()) == 6
    assert b'"finish_reason":"length"' in ex.body and b"[DONE]" not in ex.body


async def test_error_after_n_tokens_is_the_real_error_chunk() -> None:
    ex = await exchange(server(), STREAM, [("x-llmsim-fault", "error-after:2:503")])
    assert ex.status == 200 and ex.complete
    events = ex.sse()
    assert len(ex.chat_tokens()) == 2
    assert events[-1] == (None, "[DONE]")
    assert events[-2][1] == {"error": {"message": "The server is currently overloaded, please "
                                                  "try again later.", "type": "server_error",
                                       "param": None, "code": "server_error"}}
    assert ex.body.endswith(b'data: {"error":' + orjson.dumps(events[-2][1]["error"])
                            + b"}\n\ndata: [DONE]\n\n")


async def test_stall_after_n_tokens_on_fake_clock() -> None:
    clock = FakeClock()
    srv = server(clock, latency="realistic", ttft_ms=100, itl_ms=10)
    t0 = clock.now()
    ex = await exchange(srv, STREAM, [("x-llmsim-fault", "stall-after:3:2000")])
    assert ex.complete and len(ex.chat_tokens()) == 6 and ex.sse()[-1] == (None, "[DONE]")
    tok_times = [t - t0 for t, c in zip(ex.times, ex.chunks, strict=True)
                 for _ in range(c.count(b'"content":"') - c.count(b'"content":""'))]
    gaps = [round(b - a, 4) for a, b in zip(tok_times, tok_times[1:], strict=False)]
    assert tok_times[0] == pytest.approx(0.1)
    assert gaps == [0.01, 0.01, 2.01, 0.01, 0.01]


async def test_mid_stream_faults_on_non_streamed_requests_act_at_the_start() -> None:
    srv = server()
    ex = await exchange(srv, CHAT, [("x-llmsim-fault", "error-after:3:502")])
    assert ex.status == 502
    ex = await exchange(srv, CHAT, [("x-llmsim-fault", "disconnect-after:3")])
    assert ex.aborted and ex.status == 0
    ex = await exchange(srv, CHAT, [("x-llmsim-fault", "stall-after:3:10")])
    assert ex.status == 200


async def test_admin_and_health_are_never_faulted() -> None:
    srv = server()
    ex = await exchange(srv, None, [("x-llmsim-fault", "500")], path="/llmsim/faults",
                        method="GET")
    assert ex.status == 200


# ------------------------------------------------------------------------------ scenarios
async def test_scenario_next_n_then_success_and_listing() -> None:
    srv = server()
    ex = await exchange(srv, {"fault": "503", "count": 2, "model": "gpt-4o",
                              "retry_after_ms": 50}, path="/llmsim/faults")
    assert ex.status == 200
    rule = ex.json()
    assert rule["id"] == "fault_1" and rule["fault"] == "503" and rule["count"] == 2
    other = {**CHAT, "model": "gpt-4o-mini"}
    assert (await exchange(srv, other)).status == 200  # does not match the model
    r1 = await exchange(srv, CHAT)
    assert r1.status == 503 and r1.headers["retry-after-ms"] == "50"
    listed = (await exchange(srv, None, path="/llmsim/faults", method="GET")).json()
    assert listed["data"][0]["fired"] == 1 and listed["data"][0]["seen"] == 1
    assert (await exchange(srv, CHAT)).status == 503
    assert (await exchange(srv, CHAT)).status == 200
    listed = (await exchange(srv, None, path="/llmsim/faults", method="GET")).json()
    assert listed["data"] == [] and listed["fired"]["503"] == 2


async def test_scenario_every_kth_and_delete() -> None:
    srv = server()
    rule = (await exchange(srv, {"fault": "500", "every": 3}, path="/llmsim/faults")).json()
    statuses = [(await exchange(srv, CHAT)).status for _ in range(7)]
    assert statuses == [200, 200, 500, 200, 200, 500, 200]
    got = await exchange(srv, None, path=f"/llmsim/faults/{rule['id']}", method="GET")
    assert got.json()["fired"] == 2
    gone = await exchange(srv, None, path=f"/llmsim/faults/{rule['id']}", method="DELETE")
    assert gone.json() == {"id": rule["id"], "object": "llmsim.fault_rule", "deleted": True}
    assert (await exchange(srv, None, path=f"/llmsim/faults/{rule['id']}",
                           method="DELETE")).status == 404
    assert [(await exchange(srv, CHAT)).status for _ in range(3)] == [200, 200, 200]


async def test_scenario_time_window_and_api_key_and_delete_all() -> None:
    clock = FakeClock()
    srv = server(clock)
    ex = await exchange(srv, [{"fault": "529", "start": 10, "end": 20},
                              {"fault": "500", "api_key": "sk-bad"}], path="/llmsim/faults")
    assert [r["id"] for r in ex.json()["data"]] == ["fault_1", "fault_2"]
    assert (await exchange(srv, CHAT)).status == 200
    assert (await exchange(srv, CHAT, [("authorization", "Bearer sk-bad")])).status == 500
    clock.advance(10)
    assert (await exchange(srv, CHAT)).status == 529
    clock.advance(10)
    assert (await exchange(srv, CHAT)).status == 200
    ex = await exchange(srv, None, path="/llmsim/faults", method="DELETE")
    assert ex.json() == {"object": "list", "deleted": 1}  # the expired window rule is gone
    assert (await exchange(srv, CHAT, [("authorization", "Bearer sk-bad")])).status == 200


async def test_header_none_bypasses_rules() -> None:
    srv = server()
    await exchange(srv, {"fault": "500"}, path="/llmsim/faults")
    assert (await exchange(srv, CHAT, [("x-llmsim-fault", "none")])).status == 200
    assert (await exchange(srv, CHAT)).status == 500


async def test_the_fault_hook_makes_no_coroutine_when_no_fault_can_apply() -> None:
    """The before-hook costs no coroutine per request when nothing is configured (nor with
    the header ``none``), and still decides when a header or a rule is there."""
    from llmsim.api.faults import FAULTS
    from llmsim.messages import Request

    srv = server()
    app = srv.app
    faults = app.feature(FAULTS)
    assert faults is not None and faults.before in app.before
    route, _ = app.router.resolve("POST", "/v1/chat/completions")

    def req(headers: dict[str, str]) -> Request:
        return Request.http("POST", "/v1/chat/completions", {}, headers, orjson.dumps(CHAT),
                            "req_1", "127.0.0.1", 0.0)

    assert faults.before(req({}), route, app) is None
    assert faults.before(req({"x-llmsim-fault": " None "}), route, app) is None
    step = faults.before(req({"x-llmsim-fault": "503"}), route, app)
    assert step is not None
    with pytest.raises(APIError) as got:  # (dispatch renders it)
        await step
    assert got.value.status == 503
    await exchange(srv, {"fault": "500"}, path="/llmsim/faults")
    step = faults.before(req({}), route, app)
    assert step is not None
    with pytest.raises(APIError) as got:
        await step
    assert got.value.status == 500


@pytest.mark.parametrize("rule,param", [
    ({"count": 1}, "fault"), ({"fault": "bogus"}, "fault"), ({"fault": "500", "count": 0},
                                                             "count"),
    ({"fault": "500", "every": "x"}, "every"), ({"fault": "500", "colour": 1}, "colour"),
    ({"fault": "500", "start": 5, "end": 2}, "end"), ({"fault": "500", "probability": 2},
                                                      "probability"),
])
async def test_bad_rules_are_400_naming_the_field(rule: dict, param: str) -> None:
    ex = await exchange(server(), rule, path="/llmsim/faults")
    assert ex.status == 400 and ex.json()["error"]["param"] == param


# ------------------------------------------------------------------------------ probabilities
async def _statuses(seed: int | None, n: int = 40, **faults: object) -> list[int]:
    srv = server(seed=seed, faults=FaultsConfig(**faults))  # type: ignore[arg-type]
    return [(await exchange(srv, CHAT)).status for _ in range(n)]


async def test_probabilities_are_seeded_and_reproducible() -> None:
    a = await _statuses(5, p_500=0.3, p_429=0.2)
    b = await _statuses(5, p_500=0.3, p_429=0.2)
    assert a == b
    assert {200, 429, 500} <= set(a)  # identical requests are not all alike: occurrences
    assert a != await _statuses(6, p_500=0.3, p_429=0.2)


async def test_probabilities_per_model_override_global() -> None:
    srv = server(faults=FaultsConfig(p_500=0.0, models={"gpt-4o": FaultRates(p_500=1.0)},
                                     endpoints={"chat.completions": FaultRates(p_429=0.0)}))
    assert (await exchange(srv, CHAT)).status == 500
    assert (await exchange(srv, {**CHAT, "model": "gpt-4o-mini"})).status == 200


async def test_random_mid_stream_fault_uses_configured_range() -> None:
    srv = server(faults=FaultsConfig(p_truncate=1.0, after_min=2, after_max=2))
    ex = await exchange(srv, STREAM)
    assert ex.complete and len(ex.chat_tokens()) == 2 and b"[DONE]" not in ex.body


# ------------------------------------------------------------------------------ official SDK
def test_sdk_retries_injected_429_after_retry_after_then_succeeds(srv) -> None:  # type: ignore[no-untyped-def]
    from openai import OpenAI

    rule = rawhttp.request(srv.url, "POST", "/llmsim/faults",
                           {"fault": "429", "count": 2, "retry_after_ms": 150})
    assert rule.status == 200
    with OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=2,
                _strict_response_validation=True) as client:
        t0 = time.monotonic()
        raw = client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
        elapsed = time.monotonic() - t0
    assert raw.parse().choices[0].message.content
    # the SDK waited retry-after-ms (150 ms) before each of its two retries
    assert elapsed >= 0.3
    assert raw.retries_taken == 2
    listed = rawhttp.request(srv.url, "GET", "/llmsim/faults").json()
    assert listed["data"] == [] and listed["fired"]["429"] == 2


def test_sdk_sees_mid_stream_error_as_api_error(srv) -> None:  # type: ignore[no-untyped-def]
    import openai
    from openai import OpenAI

    with OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0,
                _strict_response_validation=True) as client:
        stream = client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], stream=True,
            max_tokens=8, extra_headers={"X-LLMSim-Fault": "error-after:3"})
        got = []
        with pytest.raises(openai.APIError, match="The server had an error"):
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    got.append(chunk.choices[0].delta.content)
        assert len(got) == 3
        with pytest.raises(openai.APIConnectionError):
            client.chat.completions.create(
                model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-LLMSim-Fault": "reset"})


def test_no_socket_leak_after_faults(srv) -> None:  # type: ignore[no-untyped-def]
    for h in ("reset", "disconnect-after:1", "truncate-after:1", "hang:20"):
        try:
            rawhttp.request(srv.url, "POST", "/v1/chat/completions", STREAM,
                            [("x-llmsim-fault", h)])
        except (OSError, Exception):
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        snap = srv.call(lambda: (srv.app.stats.active_streams, srv.app.stats.active_requests))
        if snap == (0, 0):
            break
        time.sleep(0.02)
    assert snap == (0, 0)
