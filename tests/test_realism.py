"""Answers shaped like real traffic (issue 36): lengths read from what is asked, true
truncation at the limit, the Azure 2023 traces, length sources, prompt caching (OpenAI's
automatic rule, Anthropic's cache_control), per-model prefill, reasoning by task."""

from __future__ import annotations

import csv
import random
import statistics
import tracemalloc
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest

from llmsim import Config, ServerThread
from llmsim.app import App
from llmsim.config import ConfigError
from llmsim.sim import cache as pc
from llmsim.sim import lengths
from llmsim.sim import tokens as tok
from llmsim.sim.latency import Latency
from llmsim.sim.models import Registry
from tests.test_workers import wait_for, workers2  # noqa: F401  (the fixture)

TRACES = Path(__file__).parent / "data" / "azure-llm-inference-2023"
STORY = "Write a long story about dragons"


@pytest.fixture(scope="module")
def natural() -> Any:
    """The product defaults: natural lengths, instant, seeded."""
    with ServerThread(Config(port=0, latency="instant", seed=5, quiet=True)) as srv:
        assert srv.app.config.max_tokens_mode == "natural"  # the product default
        yield srv


def _oa(srv: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-x", max_retries=0,
                         _strict_response_validation=True)


def _ant(srv: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url + "/anthropic", api_key="sk-ant-x",
                               max_retries=0)


def _chat_len(c: openai.OpenAI, text: str, **kw: Any) -> tuple[int, str]:
    r = c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": text}],
                                  **kw)
    assert r.usage is not None
    return r.usage.completion_tokens, r.choices[0].finish_reason


# --- true truncation ------------------------------------------------------------------------

def test_a_small_limit_truncates_at_exactly_the_limit_everywhere(natural: Any) -> None:
    c = _oa(natural)
    for i in range(50):
        n, finish = _chat_len(c, f"{STORY} ({i})", max_tokens=5)
        assert (n, finish) == (5, "length")
    for i in range(10):
        n, finish = _chat_len(c, f"{STORY} ({i})", max_completion_tokens=5)
        assert (n, finish) == (5, "length")
        r = c.responses.create(model="gpt-4o", input=f"{STORY} ({i})", max_output_tokens=16)
        assert r.status == "incomplete" and r.incomplete_details is not None
        assert r.incomplete_details.reason == "max_output_tokens"
        assert r.usage is not None and r.usage.output_tokens == 16
        lc = c.completions.create(model="gpt-3.5-turbo-instruct", prompt=f"{STORY} ({i})",
                                  max_tokens=5)
        assert lc.usage is not None and lc.usage.completion_tokens == 5
        assert lc.choices[0].finish_reason == "length"
    a = _ant(natural)
    for i in range(20):
        m = a.messages.create(model="claude-sonnet-4-6", max_tokens=5,
                              messages=[{"role": "user", "content": f"{STORY} ({i})"}])
        assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 5


def test_lengths_follow_what_is_asked(natural: Any) -> None:
    c = _oa(natural)
    hi = [_chat_len(c, f"Say hi {i}")[0] for i in range(41)]
    assert statistics.median(hi) <= 15
    essay = [_chat_len(c, f"Write a 1000-word essay on topic {i}")[0] for i in range(21)]
    assert 1100 <= statistics.median(essay) <= 1700, essay
    items = [_chat_len(c, f"List 10 ideas for a party ({i})")[0] for i in range(15)]
    assert 150 <= statistics.median(items) <= 400
    code = [_chat_len(c, f"Write a Python function that parses CSV {i}")[0] for i in range(15)]
    assert statistics.median(code) > 3 * statistics.median(hi)
    one = [_chat_len(c, f"Answer in one word: is the sky blue? {i}")[0] for i in range(15)]
    assert max(one) <= 6
    brief = [_chat_len(c, f"Explain TCP briefly ({i})")[0] for i in range(15)]
    long_ = [_chat_len(c, f"Explain TCP in detail ({i})")[0] for i in range(15)]
    assert statistics.median(brief) * 2 < statistics.median(long_)


def test_say_hello_briefly_completes_within_64(natural: Any) -> None:
    c = _oa(natural)
    for i in range(200):
        with c.responses.stream(model="gpt-4o", input=f"Say hello briefly ({i})",
                                max_output_tokens=64) as s:
            final = s.get_final_response()  # raises unless response.completed arrives
        assert final.status == "completed"
    for i in range(20):  # a reasoning model spends little thought on a greeting
        r = c.responses.create(model="gpt-5-mini", input=f"Say hello briefly ({i})",
                               max_output_tokens=64)
        assert r.status == "completed", r.usage


def test_reasoning_spends_the_limit_first(natural: Any) -> None:
    c = _oa(natural)
    r = c.responses.create(model="o3", input="Write code to solve sudoku",
                           max_output_tokens=32)
    assert r.status == "incomplete" and r.usage is not None
    assert r.usage.output_tokens_details.reasoning_tokens == 32
    assert [o.type for o in r.output] == ["reasoning"]  # no visible output was reached
    ch = c.chat.completions.create(model="o3", max_completion_tokens=32, messages=[
        {"role": "user", "content": "Write code to solve sudoku"}])
    assert ch.choices[0].finish_reason == "length" and ch.choices[0].message.content == ""


def test_exact_lengths_on_every_family(natural: Any, make_server: Any) -> None:
    c = _oa(natural)
    n, finish = _chat_len(c, "hi", max_tokens=120, extra_body={"ignore_eos": True})
    assert (n, finish) == (120, "length")
    m = _ant(natural).messages.create(model="claude-sonnet-4-6", max_tokens=90,
                                      messages=[{"role": "user", "content": "hi"}],
                                      extra_body={"ignore_eos": True})
    assert m.usage.output_tokens == 90 and m.stop_reason == "max_tokens"
    exact = make_server(max_tokens_mode="exact")
    r = _oa(exact).completions.create(model="gpt-4o", prompt="x", max_tokens=77)
    assert r.usage is not None and r.usage.completion_tokens == 77
    m = _ant(exact).messages.create(model="claude-sonnet-4-6", max_tokens=33,
                                    messages=[{"role": "user", "content": "hi"}])
    assert m.usage.output_tokens == 33


def test_output_tokens_mean_is_prompt_blind(make_server: Any) -> None:
    srv = make_server(max_tokens_mode="natural", output_tokens_mean=40, output_tokens_sigma=0)
    c = _oa(srv)
    assert _chat_len(c, "Say hi")[0] == _chat_len(c, "Write a 2000-word essay")[0] == 40


# --- calibration against the Azure LLM inference traces 2023 ----------------------------------

def _trace(name: str) -> list[tuple[int, int]]:
    with (TRACES / f"AzureLLMInferenceTrace_{name}.csv").open(newline="") as f:
        return [(int(r["ContextTokens"]), int(r["GeneratedTokens"]))
                for r in csv.DictReader(f)]


def _ks(a: list[int], b: list[int]) -> float:
    a, b = sorted(a), sorted(b)
    d = 0.0
    i = j = 0
    while i < len(a) and j < len(b):
        x = min(a[i], b[j])
        while i < len(a) and a[i] <= x:
            i += 1
        while j < len(b) and b[j] <= x:
            j += 1
        d = max(d, abs(i / len(a) - j / len(b)))
    return d


def _pct(xs: list[int], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def _compare(got: list[int], want: list[int]) -> None:
    assert _ks(got, want) <= 0.05, _ks(got, want)
    for q in (0.5, 0.9, 0.99):
        assert abs(_pct(got, q) - _pct(want, q)) <= 0.1 * _pct(want, q), (q, got, want)


@pytest.mark.parametrize("name", ["conv", "code"])
def test_the_azure_traces_request_shapes_give_their_lengths(name: str) -> None:
    """Each trace's requests replayed (a prompt of the matching kind at the trace's input
    size: a chat turn for conversation, a code prompt on /v1/completions for code) through
    the server; the output lengths are compared with the trace's."""
    rows = _trace(name)
    rng = random.Random(7)
    # (a heavy tail: p99 within 10% needs thousands of draws)
    sample = rng.sample(rows, 3000 if name == "conv" else len(rows))
    filler = " lorem" if name == "conv" else "\n    x = compute(x)"
    with ServerThread(Config(port=0, latency="instant", seed=11, quiet=True,
                             tokenizer="estimate")) as srv:
        c = _oa(srv)
        got = []
        for i, (ctx, _) in enumerate(sample):
            pad = filler * min(ctx, 8000) if name == "conv" else filler * min(ctx // 6, 400)
            if name == "conv":
                r = c.chat.completions.create(model="trace-model", messages=[
                    {"role": "user", "content": f"Tell me about thing {i}.{pad}"}])
            else:
                r = c.completions.create(model="trace-model", max_tokens=4000,
                                         prompt=f"def handler_{i}(x):{pad}\n")
            assert r.usage is not None
            got.append(r.usage.completion_tokens)
    _compare(got, [g for _, g in rows])


def test_the_shipped_histograms_are_the_traces() -> None:
    for name, kind in (("conv", "conversation"), ("code", "code_continuation")):
        rows = _trace(name)
        hist = lengths.KINDS[kind]["histogram"]
        assert hist[-1][1] == len(rows)
        assert "CC-BY" in lengths.KINDS[kind]["source"]


def test_every_length_parameter_names_its_source() -> None:
    for name, spec in lengths.KINDS.items():
        assert spec.get("source"), name
    for key in ("words_per_token", "cue_sigma", "brief_factor", "detail_factor",
                "effort_factor"):
        assert lengths.DATA[key]["source"], key


def test_trace_length_source(tmp_path: Path, make_server: Any) -> None:
    f = tmp_path / "lengths.csv"
    f.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 + "".join(f"t,{10 + i},{7}\n" for i in range(50))
                 + "".join(f"t,{5000 + i},{300}\n" for i in range(50)))
    srv = make_server(max_tokens_mode=f"trace:{f}")
    c = _oa(srv)
    assert _chat_len(c, "hi")[0] == 7  # a short prompt: the short rows' lengths
    assert _chat_len(c, "word " * 4990)[0] == 300  # a long one: the long rows'
    assert _chat_len(c, "word " * 4990, max_tokens=50) == (50, "length")
    stats = httpx.get(srv.url + "/llmsim/stats").json()
    assert stats["length_source"] == f"trace:{f}"


@pytest.mark.parametrize("content,fragment", [
    ("ContextTokens,Other\n1,2\n", "line 1: need the columns"),
    ("ContextTokens,GeneratedTokens\n1,x\n", "line 2"),
    ("ContextTokens,GeneratedTokens\n1,0\n", "line 2"),
    ("ContextTokens,GeneratedTokens\n", "no rows"),
    ("", "empty"),
])
def test_a_bad_trace_is_refused_at_start_naming_file_and_line(
        tmp_path: Path, content: str, fragment: str) -> None:
    f = tmp_path / "bad.csv"
    f.write_text(content)
    lengths._load_trace.cache_clear()
    with pytest.raises(ConfigError) as ei:
        App(Config(port=0, quiet=True, max_tokens_mode=f"trace:{f}"))
    assert str(f) in str(ei.value) and fragment in str(ei.value)
    with pytest.raises(ConfigError):
        Config(max_tokens_mode="bogus")


def test_the_length_model_reads_a_bounded_window() -> None:
    """A huge prompt is read in two windows of READ_CHARS: the cue at the end is found, the
    middle never scanned."""
    text = "Tell me something. " + "filler " * 200_000 + " Answer in 3 sentences."
    t = lengths.read_task(text)
    assert t.target == 3 * lengths.DATA["tokens_per_sentence"]["value"]


# --- prompt caching --------------------------------------------------------------------------

SYSTEM = "You are a careful assistant. " + " ".join(
    f"Rule {i}: answer about topic {i} with care and cite section {i}." for i in range(160))


def _shared_prefix_tokens(model: str = "gpt-4o") -> int:
    """The tokens of the resent prefix (the system message with its framing), counted."""
    enc = tok.encoding_for_model(model)
    return 3 + 3 + tok.count_tokens("system", enc) + tok.count_tokens(SYSTEM, enc)


def test_openai_prompt_caching_on_chat_completions_and_responses(make_server: Any) -> None:
    srv = make_server(max_tokens_mode="natural")
    c = _oa(srv)
    shared = _shared_prefix_tokens()
    assert shared >= 2000
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "first"}]
    r1 = c.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=4)
    assert r1.usage is not None and r1.usage.prompt_tokens_details is not None
    assert r1.usage.prompt_tokens_details.cached_tokens == 0  # nothing cached yet
    msgs2 = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "second q"}]
    r2 = c.chat.completions.create(model="gpt-4o", messages=msgs2, max_tokens=4)
    assert r2.usage is not None and r2.usage.prompt_tokens_details is not None
    cached = r2.usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached % 128 == 0 and 1024 <= cached <= shared, (cached,
                                                                                    shared)
    assert shared - cached < 128 + 64  # the whole prefix, to the 128-token step
    # another prompt_cache_key routes elsewhere: no hit there
    r3 = c.chat.completions.create(model="gpt-4o", messages=msgs2, max_tokens=4,
                                   prompt_cache_key="tenant-b")
    assert r3.usage is not None and r3.usage.prompt_tokens_details is not None
    assert r3.usage.prompt_tokens_details.cached_tokens == 0
    # a short prompt is never cached
    r4 = c.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}],
                                   max_tokens=4)
    assert r4.usage is not None and r4.usage.prompt_tokens_details is not None
    assert r4.usage.prompt_tokens_details.cached_tokens == 0
    # stateless Responses: the same rule, input_tokens_details.cached_tokens
    x1 = c.responses.create(model="gpt-4o", instructions=SYSTEM, input="first",
                            max_output_tokens=16)
    x2 = c.responses.create(model="gpt-4o", instructions=SYSTEM, input="other question",
                            max_output_tokens=16)
    assert x1.usage is not None and x2.usage is not None
    assert x1.usage.input_tokens_details.cached_tokens == 0
    got = x2.usage.input_tokens_details.cached_tokens
    assert got % 128 == 0 and 1024 <= got <= x2.usage.input_tokens
    # legacy completions: prompt_tokens_details once something is cached
    p1 = c.completions.create(model="gpt-3.5-turbo-instruct", prompt=SYSTEM + " A", max_tokens=2)
    p2 = c.completions.create(model="gpt-3.5-turbo-instruct", prompt=SYSTEM + " B", max_tokens=2)
    assert p1.usage is not None and p2.usage is not None
    assert p1.usage.prompt_tokens_details is None
    assert p2.usage.prompt_tokens_details is not None
    assert p2.usage.prompt_tokens_details.cached_tokens % 128 == 0
    assert 1024 <= (p2.usage.prompt_tokens_details.cached_tokens or 0) <= p2.usage.prompt_tokens
    # counted: /llmsim/stats and vLLM's metric names
    stats = httpx.get(srv.url + "/llmsim/stats").json()
    assert stats["prompt_cache"]["hit_tokens"] >= cached + got
    assert stats["prompt_cache"]["store"]["entries"] > 0
    assert stats["length_source"] == "natural"
    metrics = httpx.get(srv.url + "/metrics").text
    assert "vllm:prefix_cache_queries_total" in metrics
    hits = [ln for ln in metrics.splitlines() if ln.startswith("vllm:prefix_cache_hits_total")]
    assert hits and float(hits[0].split()[-1]) >= cached + got
    with pytest.raises(openai.BadRequestError) as ei:
        c.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=4,
                                  extra_body={"prompt_cache_retention": "forever"})
    assert ei.value.param == "prompt_cache_retention"


def test_openai_cache_entries_expire() -> None:
    cache = pc.PromptCache(1 << 20)
    seg = pc.segments_of("ns", ["x" * 9000], 2000)
    assert cache.openai(seg, 2000, now=0.0) == 0
    assert cache.openai(seg, 2000, now=100.0) == 1920
    assert cache.openai(seg, 2000, now=100.0 + pc.OPENAI_TTL_S + 1) == 0  # idle too long
    assert cache.openai(seg, 2000, now=200.0 + pc.OPENAI_TTL_S, ttl=pc.OPENAI_TTL_24H_S) == 1920
    assert cache.openai(seg, 2000, now=80_000.0) == 1920  # "24h" retention


def test_the_prompt_cache_is_bounded_in_bytes_and_honest() -> None:
    budget = 256 * 1024
    cache = pc.PromptCache(budget)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for i in range(400):  # distinct ~40 KiB prompts: ~16,000 digests offered
            cache.openai(pc.segments_of("ns", [f"{i} " + "y" * 40_000], 10_000), 10_000, 1.0)
        grown = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    snap = cache.snapshot()
    assert snap["entries"] <= budget // pc.ENTRY_BYTES and snap["evictions"] > 0
    assert snap["bytes"] <= budget
    assert grown <= budget + 64 * 1024, grown  # the per-entry estimate is not an undercount


def test_anthropic_cache_control(make_server: Any) -> None:
    srv = make_server(max_tokens_mode="natural")
    a = _ant(srv)
    system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    first = a.messages.create(model="claude-sonnet-4-6", max_tokens=8, system=system,
                              messages=[{"role": "user", "content": "question one"}])
    u = first.usage
    assert u.cache_read_input_tokens == 0 and (u.cache_creation_input_tokens or 0) >= 1024
    total = u.input_tokens + u.cache_creation_input_tokens
    second = a.messages.create(model="claude-sonnet-4-6", max_tokens=8, system=system,
                               messages=[{"role": "user", "content": "question two!"}])
    v = second.usage
    assert v.cache_read_input_tokens == u.cache_creation_input_tokens
    assert v.cache_creation_input_tokens == 0 and 0 < v.input_tokens < 64
    assert abs(v.input_tokens + v.cache_read_input_tokens - total) <= 8
    # a prefix below the model's minimum (Haiku 4.5: 4,096) is silently not cached
    small = a.messages.create(model="claude-haiku-4-5", max_tokens=8, system=system,
                              messages=[{"role": "user", "content": "q"}])
    assert small.usage.cache_creation_input_tokens == 0
    assert small.usage.cache_read_input_tokens == 0
    # the 1-hour TTL is reported apart
    long_ = [{"type": "text", "text": SYSTEM + " v2",
              "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    h = a.messages.create(model="claude-sonnet-4-6", max_tokens=8, system=long_,
                          messages=[{"role": "user", "content": "q"}])
    assert h.usage.cache_creation is not None
    assert h.usage.cache_creation.ephemeral_1h_input_tokens == h.usage.cache_creation_input_tokens
    # streamed: message_delta carries the cumulative usage, input tokens included
    with a.messages.stream(model="claude-sonnet-4-6", max_tokens=8, system=system,
                           messages=[{"role": "user", "content": "question three"}]) as s:
        deltas = [e for e in s if e.type == "message_delta"]
        final = s.get_final_message()
    assert deltas and deltas[0].usage.input_tokens == final.usage.input_tokens > 0
    assert deltas[0].usage.cache_read_input_tokens == final.usage.cache_read_input_tokens > 0


def test_anthropic_cache_control_bad_input(make_server: Any) -> None:
    a = _ant(make_server())
    five = [{"type": "text", "text": f"part {i}", "cache_control": {"type": "ephemeral"}}
            for i in range(5)]
    with pytest.raises(anthropic.BadRequestError) as ei:
        a.messages.create(model="claude-sonnet-4-6", max_tokens=8, system=five,
                          messages=[{"role": "user", "content": "q"}])
    assert "A maximum of 4 blocks with cache_control" in str(ei.value)
    order = [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}},
             {"type": "text", "text": "b", "cache_control": {"type": "ephemeral", "ttl": "1h"}}]
    with pytest.raises(anthropic.BadRequestError) as ei:
        a.messages.create(model="claude-sonnet-4-6", max_tokens=8, system=order,
                          messages=[{"role": "user", "content": "q"}])
    assert "system.1.cache_control" in str(ei.value)
    for bad in ({"type": "persistent"}, {"type": "ephemeral", "ttl": "2d"}, "yes"):
        with pytest.raises(anthropic.BadRequestError):
            a.messages.create(model="claude-sonnet-4-6", max_tokens=8, messages=[
                {"role": "user", "content": [{"type": "text", "text": "q",
                                              "cache_control": bad}]}])


def test_cached_prefill_matches_the_published_ratio() -> None:
    """Claude 3.5 Sonnet, 100k-token prompt: 11.5 s uncached, 2.4 s cached (0.21)."""
    prof = Registry().get("claude-sonnet-4-6")
    assert prof is not None
    lat = Latency(prof)
    rng = random.Random(3)
    cold = statistics.mean(lat.ttft(rng, 100_000) for _ in range(2000))
    warm = statistics.mean(lat.ttft(rng, 100_000, 99_900) for _ in range(2000))
    assert abs(warm / cold - 0.21) <= 0.1, warm / cold
    assert 9.0 <= cold <= 14.0  # the published 11.5 s, within the stated spread


# --- the three client findings -----------------------------------------------------------------

def test_langchain_json_mode_reads_keys_named_in_words(natural: Any) -> None:
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    llm = ChatOpenAI(model="gpt-4o", base_url=natural.url + "/v1", api_key="sk-x",
                     max_retries=0)
    out = llm.with_structured_output(Person, method="json_mode").invoke(
        "extract a person as JSON with name and age: Ada Lovelace, 36")
    assert isinstance(out, Person) and 0 <= out.age <= 120


def test_langchain_anthropic_stream_reports_input_tokens(natural: Any) -> None:
    from langchain_anthropic import ChatAnthropic

    llm = ChatAnthropic(model="claude-sonnet-4-6", base_url=natural.url + "/anthropic",
                        api_key="sk-ant-x", max_tokens=32, max_retries=0)
    total = None
    for chunk in llm.stream("Say hi"):
        total = chunk if total is None else total + chunk
    assert total is not None and total.usage_metadata is not None
    assert total.usage_metadata["input_tokens"] > 0


def test_anthropic_first_text_arrives_at_the_ttft(make_server: Any) -> None:
    """The plan's delays up to the first text delta add up to the decision's TTFT (the
    first text is due with message_start, not one token gap later)."""
    from llmsim.api import anthropic as fam

    srv = make_server(latency="realistic", ttft_ms=200, itl_ms=20)
    app = srv.app
    prof = app.registry.get("claude-sonnet-4-6")
    from llmsim.sim.decide import Ask, decide
    lat = app.latency(prof)
    d = decide(Ask(prof, 10, user_text=lambda: "Say hi", limit=64), app.config,
               random.Random(1), lat)
    t = 0.0
    for delay, etype, _data in fam._plan("msg_1", "claude-sonnet-4-6", d):
        t += delay
        if etype == "content_block_delta":
            break
    assert t == pytest.approx(d.timing.first) and t == pytest.approx(0.2)


def test_the_prompt_cache_is_shared_by_workers(workers2: Any) -> None:  # noqa: F811
    """With --workers the prefixes one worker cached are hits on every worker (the shared
    table beside the stored responses): every resend reports cached tokens, whichever worker
    the kernel hands the connection to."""
    proc, port, _lines = workers2

    def up() -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(up, what="the workers")
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    seen = set()
    for i in range(12):
        with httpx.Client() as c:  # (a new connection each time: any worker may take it)
            r = c.post(url, json={"model": "gpt-4o", "max_tokens": 2, "messages": [
                {"role": "system", "content": SYSTEM}, {"role": "user", "content": f"q{i}"}]})
        u = r.json()["usage"]
        seen.add(r.headers.get("x-llmsim-worker", ""))
        cached = u["prompt_tokens_details"]["cached_tokens"]
        if i == 0:
            assert cached == 0
        else:
            assert cached >= 1024 and cached % 128 == 0, (i, u)


def test_shared_marks_spread_and_end_at_the_last_segment() -> None:
    assert pc._marks(0) == [] and pc._marks(1) == [0] and pc._marks(5) == [0, 1, 2, 3, 4]
    m = pc._marks(1000)
    assert len(m) <= pc.SHARED_MARKS + 1 and m[-1] == 999 and m == sorted(set(m))
