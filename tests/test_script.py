"""Scripted replies (issue 14): rules matched per request, turns per session, rendered by
every dialect through the same Decision (strict SDK clients)."""

from __future__ import annotations

import json
from typing import Any

import openai
import orjson
import pytest

from llmsim import Config, ServerThread
from llmsim.sim.script import ScriptError, parse_script

from . import rawhttp

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
AGENT = {"rules": [
    {"match": {"tool_result": False, "contains": "weather"},
     "reply": [{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}]},
    {"match": {"tool_result": True},
     "reply": [{"text": "It is sunny in Paris."}]},
]}


def _client(srv: Any, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0,
                         _strict_response_validation=True, **kw)


@pytest.fixture
def scripted(make_server: Any, tmp_path: Any) -> Any:
    path = tmp_path / "agent.json"
    path.write_text(json.dumps(AGENT))
    return make_server(script=str(path))


def test_chat_agent_loop_sync_and_streamed(scripted: Any) -> None:
    c = _client(scripted)
    ask = [{"role": "user", "content": "What's the weather in Paris?"}]
    r = c.chat.completions.create(model="gpt-4o", messages=ask, tools=TOOLS)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "get_weather"
    assert orjson.loads(call.function.arguments) == {"city": "Paris"}
    assert r.usage.completion_tokens >= len('{"city":"Paris"}') // 4  # tool-call tokens
    turn2 = [*ask, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
             {"role": "tool", "tool_call_id": call.id, "content": "sunny"}]
    r2 = c.chat.completions.create(model="gpt-4o", messages=turn2, tools=TOOLS)
    assert r2.choices[0].message.content == "It is sunny in Paris."
    # streamed: the arguments arrive as deltas that the SDK's helper accumulates
    with c.chat.completions.stream(model="gpt-4o", messages=ask, tools=TOOLS) as s:
        final = s.get_final_completion()
    assert orjson.loads(final.choices[0].message.tool_calls[0].function.arguments) == {
        "city": "Paris"}


def test_responses_function_call_and_websocket(scripted: Any) -> None:
    c = _client(scripted)
    tools = [{"type": "function", "name": "get_weather",
              "parameters": TOOLS[0]["function"]["parameters"]}]
    r = c.responses.create(model="gpt-4o", input="weather please", tools=tools)
    fc = [o for o in r.output if o.type == "function_call"][0]
    assert fc.name == "get_weather" and orjson.loads(fc.arguments) == {"city": "Paris"}
    r2 = c.responses.create(model="gpt-4o", previous_response_id=r.id, tools=tools, input=[
        {"type": "function_call_output", "call_id": fc.call_id, "output": "sunny"}])
    assert r2.output_text == "It is sunny in Paris."
    with c.responses.stream(model="gpt-4o", input="weather please", tools=tools) as s:
        final = s.get_final_response()
    assert [o.type for o in final.output] == ["function_call"]


def test_websocket_agent_loop_with_the_sdk(scripted: Any) -> None:
    """The same script over the Responses WebSocket mode (client.responses.connect())."""
    from .test_websocket_sdk import recv_until_terminal

    tools = [{"type": "function", "name": "get_weather",
              "parameters": TOOLS[0]["function"]["parameters"]}]
    with _client(scripted).responses.connect() as conn:
        conn.response.create(model="gpt-4o", input="weather in Paris?", tools=tools)
        events = recv_until_terminal(conn)
        done = events[-1]["response"]
        fc = [o for o in done["output"] if o["type"] == "function_call"][0]
        assert orjson.loads(fc["arguments"]) == {"city": "Paris"}
        assert any(e["type"] == "response.function_call_arguments.delta" for e in events)
        conn.response.create(model="gpt-4o", previous_response_id=done["id"], tools=tools,
                             input=[{"type": "function_call_output", "call_id": fc["call_id"],
                                     "output": "sunny"}])
        final = recv_until_terminal(conn)[-1]["response"]
        text = final["output"][0]["content"][0]["text"]
        assert text == "It is sunny in Paris."


def test_sessions_have_their_own_cursors(make_server: Any) -> None:
    srv = make_server()
    script = {"rules": [{"reply": [{"text": "one"}, {"text": "two"}], "then": "loop"}]}
    assert rawhttp.request(srv.url, "POST", "/llmsim/scripts", script).status == 200
    msgs = [{"role": "user", "content": "hi"}]

    def say(session: str) -> str:
        c = _client(srv, default_headers={"X-LLMSim-Session": session})
        return c.chat.completions.create(model="gpt-4o", messages=msgs).choices[0].message.content

    assert [say("a"), say("b"), say("a"), say("a"), say("b")] == [
        "one", "one", "two", "one", "two"]
    view = rawhttp.request(srv.url, "GET", "/llmsim/scripts").json()
    assert view["cursors"]["0"] == {"h:a": 3, "h:b": 2}
    assert rawhttp.request(srv.url, "DELETE", "/llmsim/scripts").status == 200
    assert say("a") not in ("one", "two")  # back to the simulation


def test_scripted_429_is_retried_by_the_sdk(make_server: Any) -> None:
    srv = make_server()
    script = {"rules": [{"reply": [
        {"error": {"status": 429, "message": "slow down", "code": "rate_limit_exceeded",
                   "retry_after_s": 0}},
        {"text": "finally"}]}]}
    rawhttp.request(srv.url, "POST", "/llmsim/scripts", script)
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=2)
    r = c.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert r.parse().choices[0].message.content == "finally" and r.retries_taken == 1


def test_exhaustion_error_and_scripted_mid_stream_fault(make_server: Any) -> None:
    srv = make_server()
    rawhttp.request(srv.url, "POST", "/llmsim/scripts", {"rules": [
        {"match": {"endpoint": "chat.completions"}, "reply": [{"fault": "error-after:2"}],
         "then": "error"}]})
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "x"}],
            "max_tokens": 8, "stream": True}
    events = rawhttp.parse_sse(rawhttp.request(srv.url, "POST", "/v1/chat/completions",
                                               body).body)
    assert "error" in orjson.loads(events[-2][1])
    r = rawhttp.request(srv.url, "POST", "/v1/chat/completions", body)
    assert r.status == 400 and orjson.loads(r.body)["error"]["code"] == "script_exhausted"


def test_anthropic_and_completions_render_scripts(make_server: Any) -> None:
    import anthropic

    srv = make_server()
    rawhttp.request(srv.url, "POST", "/llmsim/scripts",
                    {"rules": [{"reply": [{"text": "Scripted answer."}]}]})
    with anthropic.Anthropic(base_url=srv.url + "/anthropic", api_key="x", max_retries=0) as a:
        m = a.messages.create(model="claude-haiku-4-5", max_tokens=50,
                              messages=[{"role": "user", "content": "hi"}])
    assert m.content[0].text == "Scripted answer." and m.stop_reason == "end_turn"
    r = _client(srv).completions.create(model="gpt-4o", prompt="x", max_tokens=50)
    assert r.choices[0].text == "Scripted answer."


@pytest.mark.parametrize("script, where", [
    ({"rules": [{"reply": []}]}, "rules[0].reply"),
    ({"rules": [{"reply": [{"txt": "x"}]}]}, "rules[0].reply[0]"),
    ({"rules": [{"reply": [{"text": "x"}], "then": "later"}]}, "rules[0].then"),
    ({"rules": [{"match": {"regex": "(unclosed"}, "reply": [{"text": "x"}]}]},
     "rules[0].match.regex"),
    ({"rules": [{"reply": [{"tool_calls": [{"name": "f", "arguments": 3}]}]}]},
     "rules[0].reply[0].tool_calls[0].arguments"),
    ({"rules": [{"reply": [{"fault": "reset"}]}]}, "rules[0].reply[0].fault"),
    ({"rules": [{"reply": [{"error": {"status": 200}}]}]}, "rules[0].reply[0].error.status"),
    # a scoped flag or a backreference cannot be run by the linear matcher: refused, not
    # accepted and silently never matching
    ({"rules": [{"match": {"regex": "(?i:w)x"}, "reply": [{"text": "x"}]}]},
     "rules[0].match.regex"),
    ({"rules": [{"match": {"regex": "(a)\\1"}, "reply": [{"text": "x"}]}]},
     "rules[0].match.regex"),
])
def test_bad_scripts_name_the_place(srv: Any, script: Any, where: str) -> None:
    with pytest.raises(ScriptError) as e:
        parse_script(script)
    assert e.value.where == where
    r = rawhttp.request(srv.url, "POST", "/llmsim/scripts", script)
    assert r.status == 400 and orjson.loads(r.body)["error"]["param"] == where


def test_bad_script_file_is_a_start_up_error(tmp_path: Any) -> None:
    import subprocess
    import sys

    bad = tmp_path / "s.toml"
    bad.write_text('[[rules]]\nreply = "nope"\n')
    out = subprocess.run([sys.executable, "-m", "llmsim", "--script", str(bad)],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "rules[0].reply" in out.stderr
    good = tmp_path / "g.toml"
    good.write_text('[[rules]]\nreply = [{text = "from toml"}]\n')
    with ServerThread(Config(port=0, latency="instant", quiet=True, script=str(good))) as srv:
        r = _client(srv).chat.completions.create(model="gpt-4o", messages=[
            {"role": "user", "content": "hi"}])
        assert r.choices[0].message.content == "from toml"


def test_previous_response_id_chains_continue_their_session(make_server: Any) -> None:
    """A follow-up sent with previous_response_id (and no header) continues the session of the
    response it follows; an unrelated request uses the API key's own session."""
    srv = make_server()
    rawhttp.request(srv.url, "POST", "/llmsim/scripts",
                    {"rules": [{"reply": [{"text": "first"}, {"text": "second"}]}]})
    tagged = _client(srv, default_headers={"X-LLMSim-Session": "agent-7"})
    r1 = tagged.responses.create(model="gpt-4o", input="a")
    assert r1.output_text == "first"
    r2 = _client(srv).responses.create(model="gpt-4o", input="b", previous_response_id=r1.id)
    assert r2.output_text == "second"  # agent-7's session, through the chain
    assert _client(srv).responses.create(model="gpt-4o", input="c").output_text == "first"


def test_regex_over_long_text_is_no_match_and_flags_apply(srv: Any) -> None:
    """A regex rule against a long last message that does not match is a plain miss (the
    simulation answers), never a 500; ``(?i)`` makes a rule case-insensitive; ``contains``
    is case-sensitive."""
    script = {"rules": [{"match": {"regex": "weather"}, "reply": [{"text": "R1"}]},
                        {"match": {"regex": "(?i)forecast"}, "reply": [{"text": "R2"}]},
                        {"match": {"contains": "Sunny"}, "reply": [{"text": "R3"}]}]}
    assert rawhttp.request(srv.url, "POST", "/llmsim/scripts", script).status == 200

    def ask(text: str) -> rawhttp.Resp:
        return rawhttp.request(srv.url, "POST", "/v1/chat/completions", {
            "model": "gpt-4o", "max_tokens": 5,
            "messages": [{"role": "user", "content": text}]})

    for n in (40_000, 70_000, 300_000):  # (before: 500 from ~32,000 characters)
        r = ask("x" * n)
        assert r.status == 200, r.body[:200]
        assert r.json()["choices"][0]["message"]["content"] not in ("R1", "R2", "R3")
    # matched far into the text (within the documented 64 KiB)
    r = ask("x" * 60_000 + " weather")
    assert r.json()["choices"][0]["message"]["content"] == "R1"
    assert ask("The FORECAST?").json()["choices"][0]["message"]["content"] == "R2"
    assert ask("sunny").json()["choices"][0]["message"]["content"] not in ("R1", "R2", "R3")
    assert ask("Sunny").json()["choices"][0]["message"]["content"] == "R3"
    rawhttp.request(srv.url, "DELETE", "/llmsim/scripts")


def test_regex_budget_is_shared_and_ends_in_no_match() -> None:
    from llmsim.sim import script as sc

    # a pattern whose every step misses the DFA cache spends far more than one unit a
    # character: the shared budget runs out and the rule does not match (no exception)
    rules = parse_script({"rules": [{"match": {"regex": "(a|b|c|d|e)*z"},
                                     "reply": [{"text": "x"}]}] * 3})
    s = sc.Script(rules)
    work = sc.sch.Work(10)
    assert s._matches(rules[0].match, model="m", endpoint="chat.completions", api_key=None,
                      session=None, user_text="abcde" * 1000, tool_result=False,
                      work=work) is False
