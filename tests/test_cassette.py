"""Record/replay (issue 14): record against a local llmsim as the upstream (no outside
network), then replay offline with the official SDK; secrets are never written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest

from llmsim.api.cassette import cassette_key

from . import rawhttp

MSGS = [{"role": "user", "content": "Tell me something"}]


def _client(srv: Any, strict: bool = True) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-SECRET-123", max_retries=0,
                         _strict_response_validation=strict)


def test_record_then_replay(make_server: Any, tmp_path: Path) -> None:
    upstream = make_server(latency="realistic", ttft_ms=20, itl_ms=5, seed=3,
                           max_tokens_mode="cap")
    rec = make_server(record_upstream=upstream.url, cassettes=str(tmp_path))
    c = _client(rec)
    a = c.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=8)
    chunks = list(c.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=6,
                                            stream=True))
    with c.responses.stream(model="gpt-4o", input="hi", max_output_tokens=64) as s:
        r = s.get_final_response()
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 3
    for f in files:
        text = f.read_text()
        assert "sk-SECRET-123" not in text and "authorization" not in text.lower()
    stream_cassette = [json.loads(f.read_text()) for f in files
                       if "events" in json.loads(f.read_text())["response"]]
    offsets = [t for t, _ in stream_cassette[0]["response"]["events"]]
    assert offsets == sorted(offsets) and offsets[-1] > 0.02  # the recorded timing

    player = make_server(replay=str(tmp_path), replay_speed=0)
    p = _client(player)
    b = p.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=8)
    assert b.model_dump() == a.model_dump()  # the very same answer, id included
    again = list(p.chat.completions.create(model="gpt-4o", messages=MSGS, max_tokens=6,
                                           stream=True))
    assert [x.model_dump() for x in again] == [x.model_dump() for x in chunks]
    with p.responses.stream(model="gpt-4o", input="hi", max_output_tokens=64) as s:
        assert s.get_final_response().model_dump() == r.model_dump()


def test_replay_timing_speed_and_fallback(make_server: Any, tmp_path: Path) -> None:
    entry = {"request": {"method": "POST", "path": "/v1/chat/completions",
                         "body": json.dumps({"model": "m1", "messages": MSGS, "stream": True})},
             "response": {"status": 200, "content_type": "text/event-stream",
                          "duration_s": 0.4,
                          "events": [[0.2, 'data: {"x":1}\n\n'], [0.4, "data: [DONE]\n\n"]]}}
    (tmp_path / "a.json").write_text(json.dumps(entry))
    # the replay plan: recorded offsets divided by the speed (deterministic, no wall clock)
    from llmsim.api.cassette import _answer

    for speed, want in ((1.0, [0.2, 0.2]), (2.0, [0.1, 0.1]), (0.0, [0.0, 0.0])):
        res = _answer(entry, speed)
        offsets = [off for off, _t, _d in res.stream._it]  # type: ignore[union-attr]
        assert offsets == pytest.approx(want), speed
    srv = make_server(replay=str(tmp_path), replay_speed=0)
    r = rawhttp.request(srv.url, "POST", "/v1/chat/completions",
                        {"model": "m1", "messages": MSGS, "stream": True})
    assert r.body == b'data: {"x":1}\n\ndata: [DONE]\n\n'
    # another body of the same path, model and stream falls back to that cassette; the same
    # body without stream does not (before: a JSON call got the stream's cassette)
    r = rawhttp.request(srv.url, "POST", "/v1/chat/completions",
                        {"model": "m1", "messages": [{"role": "user", "content": "other"}],
                         "stream": True})
    assert r.status == 200 and r.body == b'data: {"x":1}\n\ndata: [DONE]\n\n'
    r = rawhttp.request(srv.url, "POST", "/v1/chat/completions",
                        {"model": "m1", "messages": MSGS})
    assert r.status == 404 and orjson.loads(r.body)["error"]["code"] == "cassette_not_found"
    assert "stream" in orjson.loads(r.body)["error"]["message"]  # the nearest one's diff
    r = rawhttp.request(srv.url, "POST", "/v1/chat/completions",
                        {"model": "m2", "messages": MSGS})
    assert r.status == 404 and orjson.loads(r.body)["error"]["code"] == "cassette_not_found"


def test_key_ignores_volatile_fields_and_order() -> None:
    a = cassette_key("POST", "/v1/responses", b'{"model":"m","input":"x","user":"u1"}')
    b = cassette_key("POST", "/v1/responses", b'{"input":"x","model":"m","user":"u2"}')
    assert a == b != cassette_key("POST", "/v1/responses", b'{"model":"m","input":"y"}')
    # the path as sent (before: /openai/v1/... and /v1/... shared a key, one overwrote the
    # other's cassette) and stream select a cassette
    assert a != cassette_key("POST", "/openai/v1/responses", b'{"input":"x","model":"m"}')
    assert a != cassette_key("POST", "/v1/responses", b'{"model":"m","input":"x","stream":true}')
    ignore = frozenset(("user", "temperature"))
    assert cassette_key("POST", "/v1/responses", b'{"model":"m","temperature":1}', ignore) == \
        cassette_key("POST", "/v1/responses", b'{"model":"m","temperature":0}', ignore)


def test_bad_configuration(tmp_path: Path) -> None:
    from llmsim import Config

    with pytest.raises(ValueError, match="record_upstream"):
        Config(record_upstream="ftp://api.openai.com")
    with pytest.raises(ValueError, match="record_route"):
        Config(record_upstream="https://api.openai.com", record_route=("gemini",))
    with pytest.raises(ValueError, match="record_mode"):
        Config(record_mode="new_episodes")
    with pytest.raises(ValueError, match="replay_speed"):
        Config(replay_speed=-1.0)
    import subprocess
    import sys

    (tmp_path / "bad.json").write_text("{not json")
    out = subprocess.run([sys.executable, "-m", "llmsim", "--replay", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "cannot load the cassettes" in out.stderr
    out = subprocess.run([sys.executable, "-m", "llmsim", "record"], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2 and "--upstream" in out.stderr


GOOD = {"request": {"method": "POST", "path": "/v1/chat/completions",
                    "body": json.dumps({"model": "m1", "messages": MSGS})},
        "response": {"status": 200, "content_type": "application/json", "body": "{}"}}


def _with(where: str, value: Any) -> Any:
    entry = json.loads(json.dumps(GOOD))
    if where == "":
        return value
    node = entry
    *parts, last = where.split(".")
    for p in parts:
        node = node[p]
    node[last] = value
    return entry


@pytest.mark.parametrize("where, value, field", [
    ("", 5, "(top level)"),
    ("request", 5, "request"),
    ("response", None, "response"),
    ("request.method", 7, "request.method"),
    ("request.path", "no-slash", "request.path"),
    ("request.path", "/" + "a" * 5000, "request.path"),
    ("request.body", {"x": 1}, "request.body"),
    ("response.status", 99999, "response.status"),
    ("response.status", 101, "response.status"),
    ("response.status", True, "response.status"),
    ("response.content_type", "a\r\nx-evil: 1", "response.content_type"),
    ("response.duration_s", 1e12, "response.duration_s"),
    ("response.duration_s", -1, "response.duration_s"),
    ("response.headers", {"x-a": "b\r\nx-evil: 1"}, "response.headers.x-a"),
    ("response.headers", {"bad name": "v"}, "response.headers"),
    ("response.headers", {"content-length": "9"}, "response.headers.content-length"),
    ("response.headers", {f"x-{i}": "v" for i in range(100)}, "response.headers"),
    ("response.events", "nope", "response.events"),
    ("response.events", [[0.1, ""]], "response.events[0][1]"),
    ("response.events", [[1e300, "data: x\n\n"]], "response.events[0][0]"),
    ("response.events", [[0.1]], "response.events[0]"),
    ("response.body", 3, "response.body"),
])
def test_hostile_cassettes_are_refused_at_load_naming_file_and_field(
        tmp_path: Path, where: str, value: Any, field: str) -> None:
    from llmsim.api.cassette import CassetteError, load_cassettes

    (tmp_path / "ok.json").write_text(json.dumps(GOOD))
    (tmp_path / "evil.json").write_text(json.dumps(_with(where, value)))
    with pytest.raises(CassetteError) as e:
        load_cassettes(str(tmp_path))
    assert "evil.json" in str(e.value) and f": {field}" in str(e.value), str(e.value)


def test_hostile_cassette_is_a_start_up_error_not_a_traceback(tmp_path: Path) -> None:
    import subprocess
    import sys

    (tmp_path / "evil.json").write_text(json.dumps(_with("response.status", 99999)))
    out = subprocess.run([sys.executable, "-m", "llmsim", "--replay", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "evil.json: response.status" in out.stderr


def test_not_found_uses_the_family_shape_and_names_the_nearest(make_server: Any,
                                                               tmp_path: Path) -> None:
    ant = {"request": {"method": "POST", "path": "/anthropic/v1/messages",
                       "body": json.dumps({"model": "c1", "max_tokens": 5, "messages": MSGS})},
           "response": {"status": 200, "body": "{}"}}
    (tmp_path / "a.json").write_text(json.dumps(ant))
    srv = make_server(replay=str(tmp_path), replay_speed=0)
    r = rawhttp.request(srv.url, "POST", "/anthropic/v1/messages",
                        {"model": "c2", "max_tokens": 5, "messages": MSGS})
    body = r.json()
    assert r.status == 404 and body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert 'model ("c2" here, "c1" there)' in body["error"]["message"]
    assert "a.json" in body["error"]["message"]
    r = rawhttp.request(srv.url, "POST", "/v1/chat/completions", {"model": "c2"})
    assert r.status == 404 and "No cassette was recorded for POST /v1/chat/completions" in \
        r.json()["error"]["message"]
