"""The pytest plugin (llmsim/pytest_plugin.py), judged by test projects that use only it:
pytester runs each project in a fresh pytest process with the installed entry point."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

pytest_plugins = ["pytester"]

AGENT = '''
import pytest
from openai import OpenAI

SCRIPT = {"rules": [{"match": {"contains": "weather"}, "reply": [
    {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
    {"text": "It is sunny in Paris."}]}]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


def run_agent(client, question):
    messages = [{"role": "user", "content": question}]
    while True:
        r = client.chat.completions.create(model="gpt-4o", messages=messages, tools=TOOLS)
        m = r.choices[0].message
        if not m.tool_calls:
            return m.content
        messages.append(m.model_dump(exclude_none=True))
        for c in m.tool_calls:
            messages.append({"role": "tool", "tool_call_id": c.id, "content": "sunny, 24C"})


def test_agent_survives_a_rate_limit(llmsim):
    llmsim.script(SCRIPT)
    llmsim.fault("429", count=1)
    client = OpenAI(max_retries=2)  # base URL and key: from the environment the plugin set
    assert run_agent(client, "What's the weather in Paris?") == "It is sunny in Paris."
    verdict = llmsim.verdict()
    assert verdict.honoured_retry_after and verdict.retries == 1
    assert not verdict.retried_non_retryable
    sent = llmsim.journal("/v1/chat/completions")
    assert [r["status"] for r in sent] == [429, 200, 200]
    assert sent[-1]["body"]["messages"][-1]["role"] == "tool"
    assert "authorization" not in sent[0]["headers"]


def test_each_test_starts_clean(llmsim):
    assert llmsim.journal() == [] and llmsim.verdict().requests == 0
    r = OpenAI().chat.completions.create(model="gpt-4o", messages=[
        {"role": "user", "content": "What's the weather?"}], max_tokens=5)
    assert r.choices[0].message.content != "It is sunny in Paris."  # no script any more


@pytest.mark.llmsim(text="fixed", fixed_text="marked")
def test_marker_settings(llmsim):
    r = OpenAI().chat.completions.create(model="gpt-4o", messages=[
        {"role": "user", "content": "hi"}])
    assert r.choices[0].message.content.startswith("marked")
    assert llmsim.config.text == "fixed"


def test_back_to_the_session_settings(llmsim):
    assert llmsim.config.text == "lorem" and llmsim.config.seed == 0
'''


def test_agent_project_with_script_fault_and_verdict(pytester: Any) -> None:
    pytester.makepyfile(test_agent=AGENT)
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4)


def test_a_misbehaving_client_fails_the_verdict(pytester: Any) -> None:
    # (a retry-after far longer than a busy machine can delay the retry: the client's
    # immediate retry is early however slow the box is)
    pytester.makepyfile(test_bad='''
import httpx

@__import__("pytest").mark.llmsim(**{"faults.retry_after_ms": 30000})
def test_retries_at_once(llmsim):
    llmsim.fault("429", count=1)
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
    hs = {"authorization": "Bearer " + llmsim.api_key}
    with httpx.Client(base_url=llmsim.base_url) as c:
        assert c.post("/chat/completions", json=body, headers=hs).status_code == 429
        assert c.post("/chat/completions", json=body, headers=hs).status_code == 200
    assert llmsim.verdict().honoured_retry_after, "retried before retry-after"


@__import__("pytest").mark.llmsim(**{"faults.retry_after_ms": 60000})
def test_long_retry_after_same(llmsim):
    test_retries_at_once(llmsim)
''')
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*retried before retry-after*"])


def test_ini_settings_and_environment(pytester: Any) -> None:
    pytester.makeini('''
[pytest]
llmsim_settings =
    text = fixed
    fixed_text = from the ini file
    faults.retry_after_ms = 5
''')
    pytester.makepyfile(test_ini='''
import os

def test_settings(llmsim):
    assert llmsim.config.fixed_text == "from the ini file"
    assert llmsim.config.faults.retry_after_ms == 5 and llmsim.config.latency == "instant"
    assert os.environ["OPENAI_BASE_URL"] == llmsim.base_url
    assert os.environ["ANTHROPIC_BASE_URL"] == llmsim.url
    assert os.environ["OPENAI_API_KEY"] == llmsim.api_key
    import anthropic
    msg = anthropic.Anthropic().messages.create(model="claude-sonnet-4-5", max_tokens=50,
        messages=[{"role": "user", "content": "hi"}])
    assert msg.content[0].text.startswith("from")

def test_not_using_it_leaves_the_environment():
    assert os.environ.get("OPENAI_BASE_URL") == "http://untouched"
''')
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider",
                                           "-k", "settings")
    result.assert_outcomes(passed=1)
    pytester._monkeypatch.setenv("OPENAI_BASE_URL", "http://untouched")
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider",
                                           "-k", "not_using")
    result.assert_outcomes(passed=1)


def test_bad_settings_are_a_usage_error(pytester: Any) -> None:
    pytester.makepyfile(test_bad_setting='''
import pytest

@pytest.mark.llmsim(latency="slow")
def test_x(llmsim):
    pass
''')
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)  # the test errors (in its fixture), naming the setting
    result.stdout.fnmatch_lines(["*llmsim settings: latency: 'slow' is not one of*"])


def test_llmsim_never_imports_pytest() -> None:
    code = ("import sys, llmsim, llmsim.ops.cli, llmsim.transport.server, llmsim.app; "
            "sys.exit('pytest' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


def test_handle_in_process() -> None:
    import os

    from llmsim.ops.pytest_plugin import LLMSim, _flatten, _ini_settings

    assert _flatten({"faults": {"p_429": 0.5}, "seed": 1}) == {"faults.p_429": 0.5, "seed": 1}
    assert _ini_settings(["# c", "a = 1", " b.c = 'x' "]) == {"a": "1", "b.c": "x"}
    before = os.environ.get("OPENAI_BASE_URL")
    sim = LLMSim({"text": "fixed", "fixed_text": "scripted or not"})
    sim.start()
    try:
        assert os.environ["OPENAI_BASE_URL"] == sim.base_url == sim.env()["OPENAI_BASE_URL"]
        sim.script([{"reply": [{"text": "from the script"}]}])
        sim.fault("500", count=1)
        from openai import OpenAI

        with OpenAI(max_retries=1) as c:
            r = c.chat.completions.create(model="gpt-4o", messages=[
                {"role": "user", "content": "hi"}])
        assert r.choices[0].message.content == "from the script"
        v = sim.verdict()
        assert (v.failures, v.retries, v.honoured_retry_after) == (1, 1, None)
        assert [e["status"] for e in sim.journal()] == [500, 200]
        assert sim.stats()["requests_total"] >= 2
        sim.reset()
        assert sim.journal() == [] and sim.verdict().requests == 0
        url = sim.url
        sim.start({"seed": 9})  # other settings: a new server, the environment follows
        assert sim.url != url and os.environ["LLMSIM_URL"] == sim.url
        assert sim.config.seed == 9
    finally:
        sim.close()
    assert os.environ.get("OPENAI_BASE_URL") == before
