"""Record/replay of the Realtime API (issue 33): the official SDK's ``client.realtime.connect``
records through a recording llmsim whose upstream is a second llmsim on 127.0.0.1, then
replays from a fresh server with no upstream; every event validated strictly (as in
tests/test_realtime.py). Hostile upstreams and clients end cleanly with counters released."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from openai import OpenAI

from .test_realtime import WEATHER, recv_until, validated


def _until(cond: Any, limit_s: float = 10.0) -> None:
    """Wait for ``cond`` (an event, not a time budget: ``limit_s`` only ends a hung test)."""
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < limit_s, "condition not reached"
        time.sleep(0.02)


def _oai(srv: Any, key: str = "sk-SECRET-rt") -> OpenAI:
    return OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0)


def _session(srv: Any) -> list[list[dict[str, Any]]]:
    """A text round trip, then a function call and its result: every response's events."""
    out = []
    with _oai(srv) as c, c.realtime.connect(model="gpt-realtime") as conn:
        assert validated(conn.recv_bytes())["type"] == "session.created"
        conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                     "instructions": "Be brief.", "tools": [WEATHER]})
        assert validated(conn.recv_bytes())["type"] == "session.updated"
        conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Say hello."}]})
        recv_until(conn, "conversation.item.done")
        conn.response.create(response={"tool_choice": "none"})
        out.append(recv_until(conn, "response.done"))
        conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "The weather in Paris?"}]})
        recv_until(conn, "conversation.item.done")
        conn.response.create(response={"tool_choice": "required"})
        evs = recv_until(conn, "response.done")
        out.append(evs)
        call = evs[-1]["response"]["output"][0]
        conn.conversation.item.create(item={"type": "function_call_output",
                                            "call_id": call["call_id"], "output": "sunny"})
        recv_until(conn, "conversation.item.done")
        conn.response.create()
        out.append(recv_until(conn, "response.done"))
    return out


def _summary(evs: list[dict[str, Any]]) -> dict[str, Any]:
    resp = evs[-1]["response"]
    return {"types": [e["type"] for e in evs],
            "text": "".join(e["delta"] for e in evs if e["type"] == "response.output_text.delta"),
            "args": [(o.get("name"), o.get("arguments")) for o in resp["output"]
                     if o["type"] == "function_call"],
            "usage": resp["usage"], "status": resp["status"]}


def _gauges_zero(srv: Any) -> None:
    _until(lambda: (srv.app.stats.active_requests, srv.app.stats.active_streams,
                    srv.app.stats.active_websockets) == (0, 0, 0))


def test_record_then_replay_text_and_function_call(make_server: Any, tmp_path: Path) -> None:
    provider = make_server(output_tokens_mean=8, output_tokens_sigma=0, seed=3)
    cas = tmp_path / "cassettes"
    rec = make_server(record_upstream=provider.url, cassettes=str(cas))
    recorded = _session(rec)
    _until(lambda: len(list(cas.glob("*.json"))) == 1)
    files = list(cas.glob("*.json"))
    text = files[0].read_text()
    assert "SECRET" not in text and files[0].name.startswith("realtime-gpt-realtime-session-")
    data = json.loads(text)
    assert len(data["responses"]) == 3
    assert recorded[1][-1]["response"]["output"][0]["type"] == "function_call"
    provider.stop()
    player = make_server(replay=str(cas), replay_speed=0)
    replayed = _session(player)
    assert [_summary(e) for e in replayed] == [_summary(e) for e in recorded]
    # fresh ids, consistent within the response
    for a, b in zip(replayed, recorded, strict=True):
        assert a[-1]["response"]["id"] != b[-1]["response"]["id"]
    _gauges_zero(player)
    _gauges_zero(rec)
