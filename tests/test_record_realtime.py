"""Record/replay of the Realtime API (issue 33): the official SDK's ``client.realtime.connect``
records through a recording llmsim whose upstream is a second llmsim on 127.0.0.1, then
replays from a fresh server with no upstream; every event validated strictly (as in
tests/test_realtime.py). Hostile upstreams and clients end cleanly with counters released."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from openai import OpenAI
from websockets.exceptions import ConnectionClosed

from llmsim.api.cassette import RECORDER, CassetteError, load_cassettes
from llmsim.config import WebSocketConfig

from .test_realtime import WEATHER, pcm, recv_until, validated
from .upstreams import FakeWSUpstream, TLSFront, WSPeer, make_ca, until


def _oai(srv: Any, key: str = "sk-SECRET-rt") -> OpenAI:
    return OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0)


def _respond(conn: Any, last: str, **response: Any) -> list[dict[str, Any]]:
    """``response.create``: its events, the first output item following ``last`` (the
    conversation's last item) and the response's items all joining the conversation."""
    conn.response.create(response=response) if response else conn.response.create()
    evs = recv_until(conn, "response.done")
    added = [e for e in evs if e["type"] == "conversation.item.added"]
    assert added and added[0]["previous_item_id"] == last
    out_ids = [o["id"] for o in evs[-1]["response"]["output"]]
    assert [e["item"]["id"] for e in added] == out_ids
    conn.conversation.item.retrieve(item_id=out_ids[-1])  # in the conversation
    assert validated(conn.recv_bytes())["item"]["id"] == out_ids[-1]
    return evs


def _user(conn: Any, text: str) -> str:
    conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": text}]})
    return str(recv_until(conn, "conversation.item.done")[-1]["item"]["id"])


def _session(srv: Any) -> list[list[dict[str, Any]]]:
    """A text round trip, then a function call and its result: every response's events."""
    out = []
    with _oai(srv) as c, c.realtime.connect(model="gpt-realtime") as conn:
        assert validated(conn.recv_bytes())["type"] == "session.created"
        conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                     "instructions": "Be brief.", "tools": [WEATHER]})
        assert validated(conn.recv_bytes())["type"] == "session.updated"
        out.append(_respond(conn, _user(conn, "Say hello."), tool_choice="none"))
        evs = _respond(conn, _user(conn, "The weather in Paris?"), tool_choice="required")
        out.append(evs)
        call = evs[-1]["response"]["output"][0]
        conn.conversation.item.create(item={"type": "function_call_output",
                                            "call_id": call["call_id"], "output": "sunny"})
        last = recv_until(conn, "conversation.item.done")[-1]["item"]["id"]
        out.append(_respond(conn, last))
    return out


def _summary(evs: list[dict[str, Any]]) -> dict[str, Any]:
    resp = evs[-1]["response"]
    return {"types": [e["type"] for e in evs],
            "text": "".join(e["delta"] for e in evs if e["type"] in (
                "response.output_text.delta", "response.output_audio_transcript.delta")),
            "audio": b"".join(base64.b64decode(e["delta"]) for e in evs
                              if e["type"] == "response.output_audio.delta"),
            "args": [(o.get("name"), o.get("arguments")) for o in resp["output"]
                     if o["type"] == "function_call"],
            "usage": resp["usage"], "status": resp["status"]}


def _gauges_zero(srv: Any) -> None:
    until(lambda: (srv.app.stats.active_requests, srv.app.stats.active_streams,
                    srv.app.stats.active_websockets) == (0, 0, 0))


def test_record_then_replay_text_and_function_call(make_server: Any, tmp_path: Path) -> None:
    ca, cert, key = make_ca(tmp_path)
    provider = make_server(output_tokens_mean=8, output_tokens_sigma=0, seed=3,
                           api_key=("sk-SECRET-rt",))
    front = TLSFront(cert, key, int(provider.url.rsplit(":", 1)[1]))
    cas = tmp_path / "cassettes"
    # wss:// through the private CA; the key reaches the provider (it refuses any other)
    rec = make_server(record_upstream=front.url, cassettes=str(cas), upstream_ca=str(ca))
    try:
        recorded = _session(rec)
    finally:
        front.close()
    assert front.sni and set(front.sni) == {"localhost"}
    until(lambda: len(list(cas.glob("*.json"))) == 1)
    files = list(cas.glob("*.json"))
    text = files[0].read_text()
    assert "SECRET" not in text and files[0].name.startswith("realtime-gpt-realtime-session-")
    data = json.loads(text)
    assert len(data["responses"]) == 3
    assert data["responses"][2]["client"][0] == {  # the call's output, its call_id dropped
        "type": "conversation.item.create",
        "item": {"type": "function_call_output", "output": "sunny"}}
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


def _b64(ms: int, amp: int = 0) -> str:
    return base64.b64encode(pcm(ms, amp)).decode()


def _voice_turn(srv: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """Audio in (a tone, then silence, in uneven chunks): the server VAD commits the turn
    and answers it; the response's events and every event type seen."""
    seen = []
    with _oai(srv) as c, c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.session.update(session={"type": "realtime", "output_modalities": ["audio"],
                                     "audio": {"input": {"turn_detection": {
                                         "type": "server_vad", "silence_duration_ms": 200}}}})
        assert validated(conn.recv_bytes())["type"] == "session.updated"
        for chunk in (_b64(300), _b64(700, 8000), _b64(250), _b64(500)):
            conn.input_audio_buffer.append(audio=chunk)
        evs = recv_until(conn, "response.done")
        seen = [e["type"] for e in evs]
        out = evs[seen.index("response.created"):]
        # the client stops playing after 100 ms: the item is cut there
        said = out[-1]["response"]["output"][0]["id"]
        conn.conversation.item.truncate(item_id=said, content_index=0, audio_end_ms=100)
        assert validated(conn.recv_bytes())["type"] == "conversation.item.truncated"
    return out, seen


def test_server_vad_turn_with_audio_out_records_and_replays(make_server: Any, tmp_path: Path) -> None:
    provider = make_server(output_tokens_mean=6, output_tokens_sigma=0, seed=4)
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path))
    recorded, seen = _voice_turn(rec)
    assert "input_audio_buffer.speech_stopped" in seen and "input_audio_buffer.committed" in seen
    until(lambda: len(list(tmp_path.glob("*.json"))) == 1)
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    client = data["responses"][0]["client"]
    assert client[-1] == {"type": "input_audio_buffer.committed", "by": "server_vad"}
    assert "audio\": \"" not in json.dumps(client)  # no audio bytes in the cassette
    player = make_server(replay=str(tmp_path), replay_speed=0)
    replayed, _ = _voice_turn(player)
    assert _summary(replayed) == _summary(recorded)
    assert len(_summary(replayed)["audio"]) > 4800 and _summary(replayed)["text"]


def test_replay_miss_names_the_nearest_and_faults_apply(make_server: Any,
                                                        tmp_path: Path) -> None:
    provider = make_server(output_tokens_mean=8, output_tokens_sigma=0)
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path))
    _session(rec)
    until(lambda: len(list(tmp_path.glob("*.json"))) == 1)
    name = next(tmp_path.glob("*.json")).name
    player = make_server(replay=str(tmp_path), replay_speed=0)
    with _oai(player) as c, c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                     "instructions": "Be brief.", "tools": [WEATHER]})
        validated(conn.recv_bytes())
        _user(conn, "Say goodbye.")
        conn.response.create(response={"tool_choice": "none"})
        evs = recv_until(conn, "response.done")
        assert [e["type"] for e in evs] == ["response.created", "error", "response.done"]
        err = evs[1]["error"]
        assert err["code"] == "cassette_not_found" and name in err["message"]
        assert "at event 1: conversation.item.create with item differing" in err["message"]
        assert evs[-1]["response"]["status"] == "failed"
    # faults apply to replayed responses as to simulated ones
    c = OpenAI(base_url=player.url + "/v1", api_key="x", max_retries=0)
    with c.realtime.connect(model="gpt-realtime",
                            extra_headers={"X-LLMSim-Fault": "error-after:3"}) as conn:
        validated(conn.recv_bytes())
        conn.session.update(session={"type": "realtime", "output_modalities": ["text"],
                                     "instructions": "Be brief.", "tools": [WEATHER]})
        validated(conn.recv_bytes())
        _user(conn, "Say hello.")
        conn.response.create(response={"tool_choice": "none"})
        evs = recv_until(conn, "response.done")
        assert sum(e["type"] == "response.output_text.delta" for e in evs) == 3
        assert evs[-2]["type"] == "error" and evs[-1]["response"]["status"] == "failed"
    _gauges_zero(player)


def test_replay_paces_by_the_recorded_offsets_over_the_speed() -> None:
    from llmsim.api.realtime import Job
    from llmsim.api.realtime.record import _replay_plan

    class Mode:
        items: dict[str, Any] = {}

        def last_id(self) -> str:
            return "item_local"

    recorded = [(0.5, {"type": "response.created", "event_id": "e1",
                       "response": {"id": "resp_rec"}}),
                (0.75, {"type": "response.output_text.delta", "event_id": "e2",
                        "response_id": "resp_rec", "item_id": "item_rec", "delta": "a"}),
                (1.5, {"type": "response.done", "event_id": "e3",
                       "response": {"id": "resp_rec"}})]
    job = Job()
    job.write = False
    for speed, waits in ((1.0, [0.5, 0.25, 0.75]), (2.0, [0.25, 0.125, 0.375]),
                         (0.0, [0.0, 0.0, 0.0])):
        got = list(_replay_plan(job, Mode(), recorded, speed))  # type: ignore[arg-type]
        assert [g[0] for g in got] == waits
        assert [g[1] for g in got] == ["response.created", "response.output_text.delta",
                                       "response.done"]
        assert got[0][2]["response"]["id"] == got[2][2]["response"]["id"] == job.id
        assert got[1][2]["response_id"] == job.id and "event_id" not in got[1][2]


GOOD = {"version": 2, "kind": "realtime", "path": "/v1/realtime", "model": "gpt-realtime",
        "responses": [{"client": [{"type": "response.create"}],
                       "events": [[0.1, {"type": "response.created", "response": {"id": "r"}}],
                                  [0.2, {"type": "response.done", "response": {"id": "r"}}]]}]}


@pytest.mark.parametrize("change, field", [
    ({"path": 5}, "path"),
    ({"responses": "x"}, "responses"),
    ({"responses": [{"client": [5], "events": []}]}, "responses[0].client"),
    ({"responses": [{"client": [], "events": []}]}, "responses[0].events"),
    ({"responses": [{"client": [], "events": [[-1, {"type": "response.created"}]]}]},
     "responses[0].events[0][0]"),
    ({"responses": [{"client": [], "events": [[0.1, {"type": "_wait"}]]}]},
     "responses[0].events[0]"),
    ({"responses": [{"client": [], "events": [[0.1, {"type": "response.done"}]]}]},
     "responses[0].events"),
    ({"responses": [{"client": [], "events": [
        [0.2, {"type": "response.created", "response": {"id": "r"}}],
        [0.1, {"type": "response.done", "response": {"id": "r"}}]]}]},
     "responses[0].events[1][0]"),
    ({"headers": {"x-a": "b\r\nx-evil: 1"}}, "headers.x-a"),
])
def test_hostile_realtime_cassettes_are_refused_at_load(tmp_path: Path, change: dict[str, Any],
                                                        field: str) -> None:
    (tmp_path / "ok.json").write_text(json.dumps(GOOD))
    (tmp_path / "evil.json").write_text(json.dumps({**GOOD, **change}))
    with pytest.raises(CassetteError) as e:
        load_cassettes(str(tmp_path))
    assert "evil.json" in str(e.value) and f": {field}" in str(e.value), str(e.value)
    (tmp_path / "evil.json").unlink()
    assert len(load_cassettes(str(tmp_path)).realtime) == 1


# -- hostile: bounds and departures end cleanly ------------------------------------------------

def _released(srv: Any) -> None:
    """Every gauge, held byte and recorder task of ``srv`` back to zero."""
    from llmsim.transport.ws import state

    _gauges_zero(srv)
    rec = srv.app.feature(RECORDER)
    until(lambda: not rec.tasks and state(srv.app).pending_bytes == 0)


def _session_created(peer: WSPeer) -> None:
    peer.send(json.dumps({"type": "session.created", "event_id": "e0",
                          "session": {"type": "realtime", "id": "sess_1", "object":
                                      "realtime.session", "model": "gpt-realtime"}}))


def test_oversized_upstream_frame_ends_the_session(make_server: Any, tmp_path: Path) -> None:
    def script(peer: WSPeer) -> None:
        _session_created(peer)
        peer.recv_type("response.create")
        peer.send("x" * 10_000)

    up = FakeWSUpstream(script)
    rec = make_server(record_upstream=up.url, cassettes=str(tmp_path),
                      websocket=WebSocketConfig(max_message_bytes=4096))
    with _oai(rec) as c, c.realtime.connect(model="gpt-realtime") as conn:
        conn.recv_bytes()
        conn.response.create()
        err = validated(conn.recv_bytes())
        assert err["type"] == "error" and err["error"]["code"] == "upstream_error"
        assert "larger than 4096 bytes" in err["error"]["message"]
        with pytest.raises(ConnectionClosed) as ei:
            conn.recv_bytes()
        assert "1011" in str(ei.value)
    until(lambda: up.ended == 1)  # the recorder closed the upstream connection
    _released(rec)
    assert up.headers[0]["authorization"] == "Bearer sk-SECRET-rt"
    assert not list(tmp_path.glob("*.json"))
    up.close()


def test_upstream_closing_mid_response_ends_the_session(make_server: Any,
                                                        tmp_path: Path) -> None:
    def script(peer: WSPeer) -> None:
        _session_created(peer)
        peer.recv_type("response.create")
        peer.send(json.dumps({"type": "response.created", "event_id": "e1", "response": {
            "id": "resp_1", "object": "realtime.response", "status": "in_progress",
            "output": []}}))
        peer.drop()

    up = FakeWSUpstream(script)
    rec = make_server(record_upstream=up.url, cassettes=str(tmp_path))
    with _oai(rec) as c, c.realtime.connect(model="gpt-realtime") as conn:
        conn.recv_bytes()
        conn.response.create()
        assert json.loads(conn.recv_bytes())["type"] == "response.created"
        err = validated(conn.recv_bytes())
        assert err["error"]["code"] == "upstream_error"
        assert "mid-response" in err["error"]["message"]
        with pytest.raises(ConnectionClosed) as ei:
            conn.recv_bytes()
        assert "1011" in str(ei.value)
    _released(rec)
    assert not list(tmp_path.glob("*.json"))  # a response cut short is not written
    up.close()


def test_client_leaving_mid_recording_closes_the_upstream(make_server: Any,
                                                          tmp_path: Path) -> None:
    provider = make_server(latency="realistic", output_tokens_mean=2000, output_tokens_sigma=0)
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path))
    with _oai(rec) as c, c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.response.create()
        assert validated(conn.recv_bytes())["type"] == "response.created"
        assert provider.app.stats.active_websockets == 1
    _released(rec)
    _gauges_zero(provider)  # the upstream session ended with the client's
    assert not list(tmp_path.glob("*.json"))


def test_record_byte_bound_ends_the_session(make_server: Any, tmp_path: Path) -> None:
    provider = make_server(output_tokens_mean=400, output_tokens_sigma=0)
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path),
                      record_max_bytes=4000)
    with _oai(rec) as c, c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.response.create()
        types = []
        with pytest.raises(ConnectionClosed):
            while True:
                ev = validated(conn.recv_bytes())
                types.append(ev["type"])
                if ev["type"] == "error":
                    assert "--record-max-bytes" in ev["error"]["message"]
        assert "error" in types and "response.done" not in types
    _released(rec)
    _gauges_zero(provider)
    assert not list(tmp_path.glob("*.json"))


def test_app_stop_ends_recording_tasks(make_server: Any, tmp_path: Path) -> None:
    provider = make_server(latency="realistic", output_tokens_mean=2000, output_tokens_sigma=0)
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path))
    with _oai(rec) as c, c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.response.create()
        assert validated(conn.recv_bytes())["type"] == "response.created"
        tasks = rec.app.feature(RECORDER).tasks
        assert tasks
        rec.stop()
        with pytest.raises(ConnectionClosed):
            while True:
                conn.recv_bytes()
    until(lambda: not tasks)
    _gauges_zero(provider)




def test_upstream_refusing_the_upgrade_is_an_error_event(make_server: Any,
                                                         tmp_path: Path) -> None:
    provider = make_server(api_key=("sk-right",))
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path))
    with _oai(rec, key="sk-wrong") as c, c.realtime.connect(model="gpt-realtime") as conn:
        err = validated(conn.recv_bytes())
        assert err["type"] == "error" and err["error"]["code"] == "upstream_error"
        assert "refused with status 401" in err["error"]["message"]
        with pytest.raises(ConnectionClosed):
            conn.recv_bytes()
    _released(rec)


def _items(conn: Any, n: int) -> None:
    for i in range(n):
        conn.conversation.item.create(item={"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": f"line {i}"}]})


def test_client_events_of_a_session_are_bounded(make_server: Any, tmp_path: Path,
                                                monkeypatch: Any) -> None:
    import llmsim.api.realtime.record as record
    import llmsim.api.realtime.tape as tape

    monkeypatch.setattr(tape, "MAX_TAPE_EVENTS", 3)
    provider = make_server()
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path / "a"))
    with _oai(rec) as c, c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        _items(conn, 4)
        got = []
        with pytest.raises(ConnectionClosed) as ei:
            while True:
                got.append(validated(conn.recv_bytes()))
        assert got[-1]["type"] == "error" and "more client events" in got[-1]["error"]["message"]
        assert "1011" in str(ei.value)
    _released(rec)
    _gauges_zero(provider)
    (tmp_path / "b").mkdir()
    player = make_server(replay=str(tmp_path / "b"))
    with _oai(player) as c, c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        _items(conn, 4)
        with pytest.raises(ConnectionClosed) as ei:
            while True:
                validated(conn.recv_bytes())
        assert "1008" in str(ei.value)
    _gauges_zero(player)
    # and the server events kept
    monkeypatch.setattr(record, "MAX_EVENTS", 5)
    rec2 = make_server(record_upstream=provider.url, cassettes=str(tmp_path / "c"))
    with _oai(rec2) as c, c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        conn.response.create()
        with pytest.raises(ConnectionClosed):
            while True:
                ev = validated(conn.recv_bytes())
                assert ev["type"] != "response.done"
                if ev["type"] == "error":
                    assert "more server events" in ev["error"]["message"]
    _released(rec2)


def test_record_modes_once_and_new_episodes(make_server: Any, tmp_path: Path) -> None:
    provider = make_server(output_tokens_mean=8, output_tokens_sigma=0, seed=3)
    cas = tmp_path / "c"
    first = make_server(record_upstream=provider.url, cassettes=str(cas), record_mode="once")
    recorded = _session(first)  # an empty directory: recorded
    until(lambda: len(list(cas.glob("*.json"))) == 1)
    # once, on a directory that holds cassettes: replayed (the upstream is never asked)
    dead = "http://127.0.0.1:9"
    again = make_server(record_upstream=dead, cassettes=str(cas), record_mode="once",
                        replay_speed=0)
    assert [_summary(e) for e in _session(again)] == [_summary(e) for e in recorded]
    # new_episodes: every session goes upstream; one with nothing new is not written again
    f = next(cas.glob("*.json"))
    before = f.stat().st_mtime_ns
    ne = make_server(record_upstream=provider.url, cassettes=str(cas),
                     record_mode="new_episodes")
    _session(ne)
    with _oai(ne) as c, c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        _user(conn, "Something new.")
        conn.response.create()
        recv_until(conn, "response.done")
    until(lambda: len(list(cas.glob("*.json"))) == 2)
    _released(ne)
    assert f.stat().st_mtime_ns == before


def test_tape_keys_ignore_ids_and_chunking_and_digest_audio() -> None:
    from llmsim.api.cassette import VOLATILE
    from llmsim.api.realtime.tape import Tape

    audio = pcm(400, 3000)

    def key(chunks: list[bytes], eid: str, item_id: str, **extra: Any) -> tuple[str, Tape]:
        t = Tape("/v1/realtime", "gpt-realtime", VOLATILE)
        for ch in chunks:
            t.client({"type": "input_audio_buffer.append", "event_id": eid,
                      "audio": base64.b64encode(ch).decode()})
        t.client({"type": "input_audio_buffer.commit", "event_id": eid})
        t.client({"type": "conversation.item.create", "event_id": eid, "previous_item_id": "x",
                  "item": {"id": item_id, "type": "message", "role": "user", "content": [
                      {"type": "input_audio", "audio": base64.b64encode(audio).decode()}]}})
        t.client({"type": "conversation.item.retrieve", "item_id": item_id})  # not key material
        t.client({"type": "response.create", "event_id": eid,
                  "response": {"metadata": {"run": eid}, **extra}})
        return t.cut(), t

    k1, t1 = key([audio], "e1", "item_a")
    k2, _ = key([audio[:1000], audio[1000:]], "e2", "item_b")
    assert k1 == k2
    assert key([audio[:1000]], "e1", "item_a")[0] != k1  # other audio, another key
    assert key([audio], "e1", "item_a", instructions="x")[0] != k1
    text = json.dumps(t1.events)
    assert len(text) < 1000 and base64.b64encode(audio[:30]).decode() not in text
    assert [e["type"] for e in t1.events] == ["input_audio_buffer.append",
                                              "input_audio_buffer.commit",
                                              "conversation.item.create", "response.create"]
    assert t1.events[2]["item"]["content"][0]["audio"]["bytes"] == len(audio)


def test_events_are_held_until_the_upstream_accepts_then_pass_live(make_server: Any,
                                                                   tmp_path: Path) -> None:
    import threading

    accept, seen_created = threading.Event(), threading.Event()
    got: list[dict[str, Any]] = []

    def script(peer: WSPeer) -> None:
        got.append(peer.recv_type("session.update"))  # sent before the upgrade was accepted
        _session_created(peer)
        peer.recv_type("response.create")
        rid = {"id": "resp_1", "object": "realtime.response", "status": "in_progress",
               "output": []}
        peer.send(json.dumps({"type": "response.created", "event_id": "e1",
                              "response": rid}))
        assert seen_created.wait(10)  # the client has it before the upstream goes on
        peer.send(json.dumps({"type": "response.done", "event_id": "e2",
                              "response": {**rid, "status": "completed"}}))

    up = FakeWSUpstream(script, before_accept=lambda: accept.wait(10))
    rec = make_server(record_upstream=up.url, cassettes=str(tmp_path))
    with _oai(rec) as c, c.realtime.connect(model="gpt-realtime") as conn:
        conn.session.update(session={"type": "realtime", "instructions": "held"})
        accept.set()
        assert json.loads(conn.recv_bytes())["type"] == "session.created"
        conn.response.create()
        assert json.loads(conn.recv_bytes())["type"] == "response.created"
        seen_created.set()
        assert json.loads(conn.recv_bytes())["type"] == "response.done"
    until(lambda: len(list(tmp_path.glob("*.json"))) == 1)
    assert got[0]["session"]["instructions"] == "held"
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert [e[1]["type"] for e in data["responses"][0]["events"]] == ["response.created",
                                                                      "response.done"]
    _released(rec)
    up.close()


def test_a_refused_response_create_does_not_shift_the_keys(make_server: Any,
                                                           tmp_path: Path) -> None:
    provider = make_server(latency="realistic", ttft_ms=300, output_tokens_mean=8,
                           output_tokens_sigma=0, seed=3)
    rec = make_server(record_upstream=provider.url, cassettes=str(tmp_path))
    with _oai(rec) as c, c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        _user(conn, "Say hello.")
        conn.response.create()
        conn.response.create()  # refused by the upstream: a response is running
        evs = recv_until(conn, "response.done")
        err = next(e for e in evs if e["type"] == "error")
        assert err["error"]["code"] == "conversation_already_has_active_response"
        assert err["error"]["event_id"].startswith("event_llmsim_")
        _user(conn, "And again.")
        conn.response.create()
        recorded = recv_until(conn, "response.done")
    until(lambda: len(list(tmp_path.glob("*.json"))) == 1)
    data = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert [len(r["client"]) for r in data["responses"]] == [2, 3]
    player = make_server(replay=str(tmp_path), replay_speed=0)
    with _oai(player) as c, c.realtime.connect(model="gpt-realtime") as conn:
        validated(conn.recv_bytes())
        _user(conn, "Say hello.")
        conn.response.create()
        conn.response.create()
        recv_until(conn, "response.done")
        _user(conn, "And again.")
        conn.response.create()
        assert _summary(recv_until(conn, "response.done")) == _summary(recorded)


def test_bad_realtime_cassette_is_a_start_up_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    bad = json.loads(json.dumps(GOOD))
    bad["responses"][0]["events"].pop()
    (tmp_path / "evil.json").write_text(json.dumps(bad))
    out = subprocess.run([sys.executable, "-m", "llmsim", "--replay", str(tmp_path)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "evil.json: responses[0].events: from response.created to response.done" \
        in out.stderr


def test_a_slow_client_slows_the_upstream_down(make_server: Any, tmp_path: Path) -> None:
    from llmsim.transport.ws import state

    n, size = 300, 32 * 1024
    sent: list[int] = []

    def script(peer: WSPeer) -> None:
        _session_created(peer)
        peer.recv_type("response.create")
        for i in range(n):
            peer.send(json.dumps({"type": "llmsim.test", "i": i, "pad": "x" * size}))
            sent.append(i)

    up = FakeWSUpstream(script)
    rec = make_server(record_upstream=up.url, cassettes=str(tmp_path))
    with _oai(rec) as c, c.realtime.connect(model="gpt-realtime") as conn:
        conn.recv_bytes()
        conn.response.create()
        (ws,) = state(rec.app).sessions
        until(lambda: not ws.mode.resumed.is_set())  # the recorder stopped reading upstream
        assert ws.transport.get_write_buffer_size() < 1024 * 1024  # (not the whole stream)
        got = [json.loads(conn.recv_bytes())["i"] for _ in range(n)]
        assert got == list(range(n))  # resumed: everything, in order
    _released(rec)
    up.close()
