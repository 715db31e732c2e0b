"""The serving engine (llmsim.sim.engine), sans-IO: steps driven with explicit times."""

from __future__ import annotations

import random
import statistics
from dataclasses import replace

import pytest

from llmsim.sim.engine import PROFILES, Engine, EngineProfile, medians, profile
from llmsim.sim.engine import closed_loop as sim_closed_loop

H100 = PROFILES["llama-3.1-8b-h100"]


def small(**kw: object) -> EngineProfile:
    base = replace(H100, t0_ms=10.0, c_ms=0.0, d_ms=0.0, p=4.0, block_size=16,
                   num_blocks=1000, max_num_seqs=4, max_num_batched_tokens=2048,
                   max_waiting=3)
    return replace(base, **kw)  # type: ignore[arg-type]


def run(eng: Engine) -> None:
    while eng.step_end >= 0.0:
        eng.advance(eng.step_end)


def test_admission_is_fifo_under_the_sequence_cap() -> None:
    eng = Engine(small(max_num_seqs=2))
    order: list[int] = []
    seqs = [eng.add(100, 0, 3 + i, 0.0, on_done=lambda s: order.append(s.id))
            for i in range(4)]
    eng.advance(0.0)
    assert [s.state for s in seqs] == [1, 1, 0, 0]  # two run, two wait in order
    run(eng)
    assert order == [1, 2, 3, 4]
    assert seqs[2].admitted_at == seqs[0].finished_at  # the freed seat, at once
    assert seqs[3].admitted_at == seqs[1].finished_at
    assert all(s.produced == s.max_out for s in seqs)


def test_chunked_prefill_under_the_token_budget() -> None:
    eng = Engine(small(max_num_batched_tokens=2048))
    s = eng.add(5000, 0, 3, 0.0)
    eng.advance(0.0)
    tokens = []
    while s.produced == 0:
        tokens.append(eng.step_tokens)
        eng.advance(eng.step_end)
    assert tokens == [2048, 2048, 904]
    assert s.first_at == pytest.approx(0.03)  # three flat steps of 10 ms
    # a decode shares the budget with a newcomer's chunk
    t = eng.add(4000, 0, 1, s.first_at)
    eng.advance(eng.step_end)  # (it came while the decode step of s was formed)
    assert eng.step_tokens == 1 + 2047 and t.scheduled == 2047
    run(eng)


def test_an_arrival_after_a_step_ended_unseen_forms_the_next_step_at_its_end() -> None:
    """``add`` at a time past the step in flight (the server's timer was late) must process
    that step and form the next at its end, as ``advance`` would: no free step."""
    eng = Engine(small())
    a = eng.add(100, 0, 3, 1.0)  # idle: an empty step ends at 1.0
    b = eng.add(100, 0, 3, 1.005)  # the empty step ended unseen
    assert a.admitted_at == 1.0 and eng.step_end == pytest.approx(1.01)
    assert b.state == 0  # waits for the step in flight to end
    run(eng)
    assert a.first_at == pytest.approx(1.01)  # one 10 ms prefill step, not the next arrival
    assert b.admitted_at == pytest.approx(1.01) and b.first_at == pytest.approx(1.02)


def test_step_time_is_flat_then_linear() -> None:
    prof = replace(H100, d_ms=0.0)
    flat = prof.step_time(8) / prof.step_time(1)
    steep = prof.step_time(8192) / prof.step_time(4096)
    assert flat < 1.01 and steep == pytest.approx(2.0, rel=0.02)


def test_preemption_of_the_newest_and_resume() -> None:
    # 24 blocks of 16 tokens: two 150-token prompts fit, their answers do not
    eng = Engine(small(num_blocks=24, max_num_seqs=4))
    a = eng.add(150, 0, 100, 0.0)
    b = eng.add(150, 0, 100, 0.0)
    eng.advance(0.0)
    assert a.state == b.state == 1
    run(eng)
    assert eng.preemptions >= 1 and b.preemptions >= 1 and a.preemptions == 0
    assert a.produced == b.produced == 100  # both complete
    assert b.finished_at > a.finished_at
    assert b.kv_computed > 150  # recomputed its prompt (and answer so far)
    assert eng.free == 24 and not eng.running and not eng.waiting


def test_queue_rejection_when_full() -> None:
    eng = Engine(small(max_num_seqs=1, max_waiting=2))
    eng.add(10, 0, 5, 0.0)
    eng.advance(0.0)  # the first runs
    eng.add(10, 0, 5, 0.0)
    assert not eng.full()
    eng.add(10, 0, 5, 0.0)
    assert eng.full()  # the caller refuses the next one (429/503)
    run(eng)
    assert not eng.full()


def test_prefix_hits_skip_prefill() -> None:
    prof = replace(H100, max_num_batched_tokens=2048)
    cold = Engine(prof)
    c = cold.add(4096, 0, 2, 0.0)
    run(cold)
    warm = Engine(prof)
    w = warm.add(4096, 4010, 2, 0.0)
    run(warm)
    assert w.cached == 4000  # whole blocks of 16 only
    assert w.kv_computed == 4096 - 4000 and c.kv_computed == 4096
    assert w.first_at - w.arrival < (c.first_at - c.arrival) / 2


def test_abort_frees_blocks_and_seat() -> None:
    eng = Engine(small(max_num_seqs=1))
    a = eng.add(100, 0, 50, 0.0)
    b = eng.add(100, 0, 5, 0.0)
    eng.advance(0.05)
    eng.abort(a, 0.05)
    assert b.state == 1 or b.admitted_at >= 0.0 or eng.waiting[0] is b
    run(eng)
    assert b.produced == 5 and eng.free == eng.profile.num_blocks
    assert eng.success == {"stop": 1}


def test_a_prefill_only_sequence_finishes_with_its_prompt() -> None:
    """An embedding: its prompt's chunks share the budget with a decoding sequence; it ends
    at its last chunk's step with no output token."""
    eng = Engine(small(max_num_batched_tokens=2048))
    a = eng.add(10, 0, 100, 0.0)
    e = eng.add(3000, 0, 0, 0.0)
    eng.advance(0.0)
    assert eng.step_tokens == 10 + 2038  # a's prompt, e's first chunk
    run(eng)
    assert e.finished_at == pytest.approx(0.02) and e.produced == 0 and e.first_at < 0
    assert a.produced == 100 and eng.generation_tokens == 100
    assert eng.success == {"stop": 2} and eng.free == eng.profile.num_blocks


def test_a_lead_holds_a_slot_before_the_first_step() -> None:
    """A hosted model's request spends its lead admitted (counted running, its slot taken)
    but not scheduled; the steps go on without it."""
    eng = Engine(small(max_num_seqs=2))
    a = eng.add(10, 0, 20, 0.0)
    b = eng.add(10, 0, 3, 0.0, lead=0.095)
    c = eng.add(10, 0, 3, 0.0)
    eng.advance(0.0)
    assert (a.state, b.state, c.state) == (1, 1, 0) and b.ready_at == pytest.approx(0.095)
    assert eng.step == [a]
    eng.advance(0.09)
    assert b.computed == 0 and a.produced == 9
    run(eng)
    assert b.first_at == pytest.approx(0.11)  # joined the step formed after its lead
    assert c.admitted_at == b.finished_at  # its slot, freed when it finished
    # a free slot: the lead starts on arrival, mid-step (it needs no step)
    f = eng.add(10, 0, 50, 1.0)
    eng.advance(1.0)
    e = eng.add(10, 0, 2, 1.005, lead=0.052)
    assert eng.step == [f] and eng.step_end == pytest.approx(1.01)
    assert e.state == 1 and e.admitted_at == 1.005 and e.ready_at == pytest.approx(1.057)
    run(eng)
    assert e.first_at == pytest.approx(1.07)  # the step formed at 1.06, after its lead
    # an idle engine wakes at the end of a lead
    eng2 = Engine(small())
    d = eng2.add(10, 0, 2, 0.0, lead=0.5)
    eng2.advance(0.0)
    assert eng2.step_end == pytest.approx(0.5) and not eng2.step
    run(eng2)
    assert d.first_at == pytest.approx(0.51) and d.finished_at == pytest.approx(0.52)


def test_hosted_profile_steps_are_the_itl_alone_then_bend() -> None:
    from llmsim.sim.engine import hosted_profile

    p = hosted_profile("m", 12.0, 90.0, 0.1, 8, 4, 128_000)
    assert p.step_time(1, 1) == pytest.approx(0.012, abs=1e-12)
    assert p.step_time(4, 4) < 0.0121  # memory-bound: flat
    assert p.step_time(64, 64) == pytest.approx((0.09 * 64 + 1.2 * 64) / 1000, rel=0.01)
    assert p.step_time(1000, 1) == pytest.approx(0.0912, rel=0.01)  # prefill at its rate
    assert p.solo(20_000, 3) == pytest.approx(
        2 * p.step_time(8192) + p.step_time(20_000 - 16_384) + 3 * p.step_time(1))
    assert (p.max_num_seqs, p.max_waiting, p.hosted) == (8, 4, True)
    # a slope past the ITL: even one sequence is compute-bound
    assert hosted_profile("m", 10.0, 0.0, 2.0, 1, 0, 10).step_time(1, 1) == \
        pytest.approx(0.02)


def test_unknown_profile_names_the_choices() -> None:
    with pytest.raises(KeyError, match="llama-3.1-8b-h100"):
        profile("nope")


def closed_loop(prof: EngineProfile, conc: int, rounds: int = 4, prompt: int = 1024,
                out: int = 128, seed: int = 1, think: float = 0.002) -> tuple[float, float]:
    """``conc`` staggered clients (seeded) taking up to ``think`` seconds between requests
    (sim.engine.closed_loop): the median TPOT and TTFT past the first round."""
    seqs = sim_closed_loop(prof, conc, rounds, prompt, out, random.Random(seed), think)
    assert all(s.produced == out for s in seqs)
    return medians(seqs)


def test_h100_profile_matches_the_published_sweep() -> None:
    """vLLM 0.21, H100, Llama-3.1-8B: TPOT x1.02 / x1.69 / x7.2 at concurrency 4/16/64
    (within 10%); TTFT x1.64 / x3.0 / x6.2 (within 25%)."""
    tpot1, ttft1 = closed_loop(H100, 1)
    for conc, tpot_ratio, ttft_ratio in ((4, 1.02, 1.64), (16, 1.69, 3.0), (64, 7.2, 6.2)):
        tpot, ttft = closed_loop(H100, conc)
        assert tpot / tpot1 == pytest.approx(tpot_ratio, rel=0.10), conc
        assert ttft / ttft1 == pytest.approx(ttft_ratio, rel=0.25), conc


def test_a_burst_is_prefilled_in_arrival_order_in_full_budget_steps() -> None:
    """vLLM V1's scheduler (first come first served, chunked prefill under the token
    budget): 64 prompts of 1024 tokens arriving at once fill eight steps of
    ``max_num_batched_tokens`` with prefill, in arrival order; the median first token waits
    for half the burst's prefill work, far above the published sweep's 87 ms p50 (which
    the staggered loop above matches: docs/engine.md, "With vllm bench serve")."""
    eng = Engine(H100)
    seqs = [eng.add(1024, 0, 128, 0.0) for _ in range(64)]
    tokens = []
    for _ in range(9):
        eng.advance(eng.step_end)
        tokens.append(eng.step_tokens)
    assert tokens[:8] == [H100.max_num_batched_tokens] * 8
    assert tokens[8] < H100.max_num_batched_tokens  # the last chunk and the decodes
    while seqs[-1].first_at < 0.0:
        eng.advance(eng.step_end)
    firsts = [s.first_at for s in seqs]
    assert firsts == sorted(firsts)  # in arrival order
    assert firsts[0] == pytest.approx(H100.step_time(8192, 8))
    assert statistics.median(firsts) >= 32 * 1024 * H100.c_ms / 1000 > 4 * 0.087
