import numpy as np
import pytest

from contract.knobs import K0_SKIP_NGRAM, K0_SKIP_V2_DFLASH
from drafters.acceptance import expected_tokens_per_step, get_preset
from drafters import costmodel as cm
from drafters.costmodel import get_gpu, get_model, step_time_s
from drafters.sim import ngram_acceptance as ng
from drafters.sim.engine import EngineConfig, EngineRequest, ReplicaEngine, lookup_k_table, vllm_batch_k_table


def _drain(eng: ReplicaEngine, t: float = 0.0, max_steps: int = 100_000):
    outs = []
    while eng.has_work() and len(outs) < max_steps:
        o = eng.step(t)
        t += o.duration_s
        outs.append(o)
    return outs, t


def test_k_table_lookup_semantics():
    table = ((1, 32, 3), (33, 64, 2), (65, 128, 1))
    assert [lookup_k_table(table, n, 8) for n in (1, 32, 33, 64, 65, 128, 500)] == [3, 3, 2, 2, 1, 1, 1]
    assert lookup_k_table(table, 10, 2) == 2  # capped at num_speculative_tokens
    assert lookup_k_table(((1, 4, 5), (10, 20, 1)), 7, 8) == 5  # gaps carry the previous K
    assert vllm_batch_k_table(8)[-1][2] == 0


def test_single_request_decode_matches_cost_model():
    eng = ReplicaEngine(EngineConfig(gpu="h100", model="qwen3-8b", profile="off"))
    eng.add_request(EngineRequest("a", prompt_tokens=200, max_tokens=101), 0.0)
    outs, _ = _drain(eng)
    assert len(outs) == 101  # 1 prefill step (first token) + 100 decode steps
    decode = outs[1:]
    ctx = 200 + 50
    assert np.mean([o.duration_s for o in decode]) == pytest.approx(
        step_time_s(get_gpu("h100"), get_model("qwen3-8b"), 1, 1, ctx), rel=0.01)
    assert eng.counters.generation_tokens == 101 and eng.counters.prompt_tokens == 200
    assert eng.counters.request_success == {"length": 1} and eng.kv_usage == 0.0


def test_acceptance_length_matches_model():
    eng = ReplicaEngine(EngineConfig(profile="dspark-b8"), np.random.default_rng(3))
    for i in range(40):
        eng.add_request(EngineRequest(str(i), 100, 2000, "humaneval"), 0.0)
    _drain(eng)
    c = eng.counters
    want = expected_tokens_per_step(get_preset("humaneval"), 8)
    assert c.acceptance_length == pytest.approx(want, rel=0.06)
    assert c.accepted_per_pos[:8].sum() == c.num_accepted_tokens
    assert np.all(np.diff(c.accepted_per_pos[:8]) <= 0)


def test_batching_limits_and_chunked_prefill():
    eng = ReplicaEngine(EngineConfig(profile="off", max_num_seqs=4, max_num_batched_tokens=256))
    for i in range(10):
        eng.add_request(EngineRequest(str(i), 1000, 20), 0.0)
    o = eng.step(0.0)
    assert o.num_tokens <= 256 and eng.num_running == 1 and eng.num_waiting == 9  # 1000-token prompt, 256 chunk
    t = o.duration_s
    while eng.has_work():
        o = eng.step(t)
        t += o.duration_s
        assert eng.num_running <= 4 and o.num_tokens <= 256
    assert eng.counters.request_success["length"] == 10


def test_kv_pressure_preempts_and_still_completes():
    eng = ReplicaEngine(EngineConfig(profile="dspark-b4", kv_capacity_tokens=3000))
    for i in range(12):
        eng.add_request(EngineRequest(str(i), 200, 300), 0.0)
    _drain(eng)
    assert eng.counters.num_preemptions > 0
    assert eng.counters.request_success["length"] == 12
    assert eng.counters.generation_tokens >= 12 * 300


def test_adaptive_verification_trims_only_under_load():
    def run(batch):
        eng = ReplicaEngine(EngineConfig(profile="dspark-b16-av", model="qwen3-14b"), np.random.default_rng(1))
        for i in range(batch):
            eng.add_request(EngineRequest(str(i), 100, 200, "chat"), 0.0)
        _drain(eng)
        return eng.counters.verified_draft_tokens / eng.counters.num_draft_tokens

    assert run(1) == pytest.approx(1.0)
    assert run(128) < 0.5


def test_request_knobs_in_engine():
    eng = ReplicaEngine(EngineConfig(profile="dspark-b8-av"), np.random.default_rng(2))
    a = EngineRequest("a", 100, 300, "gsm8k", max_draft=0)
    b = EngineRequest("b", 100, 300, "gsm8k", max_draft=3)
    c = EngineRequest("c", 100, 300, "gsm8k", min_confidence=0.5)
    d = EngineRequest("d", 100, 300, "gsm8k")
    for r in (a, b, c, d):
        eng.add_request(r, 0.0)
    _drain(eng)
    assert a.spec_steps == 0 and a.draft_tokens == 0
    assert b.draft_tokens <= 3 * b.spec_steps
    assert c.draft_tokens / c.spec_steps < d.draft_tokens / d.spec_steps
    assert c.spec_summary()["draft_acceptance_rate"] > d.spec_summary()["draft_acceptance_rate"]


def test_k_table_switches_speculation_off_at_high_batch():
    eng = ReplicaEngine(EngineConfig(profile="dspark-b8", spec_k_table=((1, 16, 8), (17, 1024, 0))))
    for i in range(40):
        eng.add_request(EngineRequest(str(i), 50, 50), 0.0)
    o = eng.step(0.0)
    o = eng.step(o.duration_s)  # 40 running: table says K=0
    assert eng.counters.num_drafts == 0


def test_confidence_floor_needs_adaptive_verification():
    eng = ReplicaEngine(EngineConfig(profile="dspark-b8"), np.random.default_rng(2))
    c = EngineRequest("c", 100, 300, "gsm8k", min_confidence=0.9)
    eng.add_request(c, 0.0)
    _drain(eng)
    assert c.draft_tokens / c.spec_steps > 6  # ignored: static drafting


def _second_step(caps, **truth):
    eng = ReplicaEngine(EngineConfig(profile="dspark-b8", **truth))
    for i, cap in enumerate(caps):
        eng.add_request(EngineRequest(str(i), 50, 100, max_draft=cap), 0.0)
    o = eng.step(0.0)
    return eng.step(o.duration_s)


def test_drafter_runs_for_the_whole_batch_while_anyone_drafts():
    """A per-request cap saves verification, not the batch-wide drafter pass, which
    always covers the full block (vLLM's V2 runner truncates drafts afterwards)."""
    mixed, plain, short = _second_step([0] * 7 + [None]), _second_step([None] * 8), _second_step([1] * 8)
    assert mixed.draft_time_s == pytest.approx(plain.draft_time_s) and mixed.draft_time_s > 0
    assert short.draft_time_s == pytest.approx(plain.draft_time_s)
    assert mixed.num_tokens < plain.num_tokens and short.num_tokens < plain.num_tokens


def test_a_step_whose_requests_are_all_capped_at_zero_skips_the_drafter():
    """drafters.vllm_ext sets the step's K to the largest cap in the batch: K=0 skips the pass."""
    zero, plain = _second_step([0] * 8), _second_step([None] * 8)
    assert zero.draft_time_s == 0.0 and plain.draft_time_s > 0
    assert zero.duration_s < plain.duration_s


def test_structural_perturbations_change_only_what_they_name():
    """bench/control_sweep.py --sensitivity: a truth the controller's model does not share."""
    plain = _second_step([None] * 8)
    double = _second_step([None] * 8, drafter_cost_scale=2.0)
    assert double.draft_time_s == pytest.approx(2 * plain.draft_time_s)
    assert double.num_tokens == plain.num_tokens
    # vLLM 0.32's V2 runner without the plugin: a step capped at K=0 still drafts, verifies nothing.
    zero_paying = _second_step([0] * 8, k0_pays_drafter=True)
    assert zero_paying.draft_time_s == pytest.approx(plain.draft_time_s)
    assert zero_paying.num_tokens == _second_step([0] * 8).num_tokens
    # ... and the replica says so, as the plugin does where its K=0 skip is not in force.
    assert ReplicaEngine(EngineConfig(profile="dspark-b8")).engine_fixes() == {K0_SKIP_V2_DFLASH}
    assert ReplicaEngine(EngineConfig(profile="dspark-b8", k0_pays_drafter=True)).engine_fixes() == frozenset()
    assert ReplicaEngine(EngineConfig(profile="ngram-k8")).engine_fixes() == {K0_SKIP_NGRAM}
    assert ReplicaEngine(EngineConfig(profile="off")).engine_fixes() == frozenset()


def test_acceptance_drift_moves_a_workloads_requests_over_time():
    eng = ReplicaEngine(EngineConfig(profile="dspark-b8", acceptance_drift=(("code", -0.5),)), np.random.default_rng(0))
    early, late, other = (EngineRequest(n, 50, 100, w) for n, w in (("a", "code"), ("b", "code"), ("c", "chat")))
    eng.add_request(early, 0.0)
    eng.add_request(late, 600.0)  # ten simulated minutes later: -5 logits
    eng.add_request(other, 600.0)
    assert late.accept[0] < 0.2 < early.accept[0]
    assert other.accept[0] > 0.3  # other workloads untouched


def test_adaptive_verification_priced_at_its_start_up_tables_trims_differently():
    """vLLM 0.32 budgets adaptive verification with cost tables profiled at
    start-up at VLLM_ADAPTIVE_VERIFICATION_PROFILE_CONTEXT_LEN (8192). At a
    real context of ~650 tokens the drafter's pass looks dearer than it is, a
    bigger fixed cost amortises more verified drafts, and the engine verifies
    more than pays (measured here: 0.60 vs 0.36 of the drafts at B=64, 5 %
    fewer tokens/s); the step times themselves are unchanged."""
    def run(**truth):
        eng = ReplicaEngine(EngineConfig(profile="dspark-b8-av", **truth), np.random.default_rng(1))
        for i in range(64):
            eng.add_request(EngineRequest(str(i), 500, 300, "chat"), 0.0)
        t = 0.0
        while eng.has_work():
            t += eng.step(t).duration_s
        c = eng.counters
        return c.verified_draft_tokens / c.num_draft_tokens, c.generation_tokens / t

    (share, rate), (tabled_share, tabled_rate) = run(), run(av_profile_context=8192)
    assert tabled_share > 1.3 * share
    assert tabled_rate < rate


# ---------------------------------------------------------------- ngram replicas


def _ngram_run(workload: str, n: int = 64, **kw):
    eng = ReplicaEngine(EngineConfig(profile="ngram-k8"), np.random.default_rng(5))
    reqs = [EngineRequest(str(i), 100, 400, workload, **kw) for i in range(n)]
    for r in reqs:
        eng.add_request(r, 0.0)
    outs, t = _drain(eng)
    return eng, reqs, outs


def test_ngram_requests_propose_in_some_steps_and_report_it_as_vllm_counts():
    """A step whose lookup found nothing is not a speculation step for that request: the per-request
    summaries and the engine's counters show the proposal rate and the bed's acceptance."""
    eng, reqs, _ = _ngram_run("code")
    c = eng.counters
    decode_steps = sum(r.output - 1 - r.accepted_tokens for r in reqs)  # every decode step emits 1 + accepted
    spec_steps = sum(r.spec_steps for r in reqs)
    p = ng.get_preset("code")
    assert spec_steps / decode_steps == pytest.approx(p.propose_rate, abs=0.02)
    assert c.acceptance_length == pytest.approx(1 + ng.accepted_per_proposal(p, 8), abs=0.06)
    assert c.num_draft_tokens / c.num_drafts == pytest.approx(ng.drafted_per_proposal(p, 8), abs=0.2)
    assert (spec_steps, sum(r.draft_tokens for r in reqs), sum(r.accepted_tokens for r in reqs)) == (
        c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens)
    assert c.accepted_per_pos[:8].sum() == c.num_accepted_tokens and np.all(np.diff(c.accepted_per_pos[:8]) <= 0)
    assert c.verified_draft_tokens == c.num_draft_tokens  # no adaptive verification on ngram
    s = reqs[0].spec_summary()
    assert s["num_spec_steps"] == reqs[0].spec_steps and s["num_draft_tokens"] == reqs[0].draft_tokens
    chat, chat_reqs, _ = _ngram_run("chat")
    chat_decode = sum(r.output - 1 - r.accepted_tokens for r in chat_reqs)
    assert sum(r.spec_steps for r in chat_reqs) / chat_decode < 0.6 * spec_steps / decode_steps
    assert chat.counters.acceptance_length < 1.02


def _step_two(profile: str, n: int = 8, max_draft: int | None = None, **truth):
    """The second step (the first decoding one) of ``n`` code requests."""
    eng = ReplicaEngine(EngineConfig(profile=profile, **truth), np.random.default_rng(1))
    reqs = [EngineRequest(str(i), 50, 100, "code", max_draft=max_draft) for i in range(n)]
    for r in reqs:
        eng.add_request(r, 0.0)
    first = eng.step(0.0)
    return eng, reqs, eng.step(first.duration_s)


def test_ngram_steps_pay_the_host_instead_of_a_drafter_pass():
    """No drafter on the GPU; the scheduler's per-request time and the CPU search add to the step,
    because vLLM schedules ngram synchronously. Elsewhere the host overlaps the GPU step."""
    eng, reqs, out = _step_two("ngram-k8")
    verifying = sum(1 for r in reqs if r.spec_steps)
    # the search ran over each context as it was before this step's tokens (1 + accepted each)
    search = cm.ngram_propose_time_s(len(reqs), sum(r.context - 1 - r.accepted_tokens for r in reqs))
    assert out.draft_time_s == 0.0
    assert out.host_s == pytest.approx(cm.host_time_s(8, verifying) + search, rel=1e-9) and out.host_s > 0
    assert out.duration_s == pytest.approx(out.cost.time_s + out.host_s, rel=1e-12)
    for profile in ("dspark-b8", "off"):
        _, _, other = _step_two(profile)
        assert 0 < other.host_s < other.cost.time_s
        assert other.duration_s == pytest.approx(other.cost.time_s + other.draft_time_s, rel=1e-12)
    # the per-request term: eight times the batch, about eight times the host time
    _, _, big = _step_two("ngram-k8", n=64)
    assert 6 * out.host_s < big.host_s < 9 * out.host_s


def test_ngram_search_is_skipped_at_k_zero_unless_the_truth_says_stock_vllm():
    """Every request capped at 0: the plugin runs no search (only the scheduler's time is left);
    stock vLLM at K=0 still searches every context (`k0_pays_drafter`)."""
    _, reqs, zero = _step_two("ngram-k8", max_draft=0)
    assert zero.num_tokens == 8 and all(r.spec_steps == 0 for r in reqs)
    assert zero.host_s == pytest.approx(cm.host_time_s(8, 0))
    _, _, paying = _step_two("ngram-k8", max_draft=0, k0_pays_drafter=True)
    assert paying.host_s > zero.host_s and paying.draft_time_s == 0.0 and paying.num_tokens == 8


def test_ngram_perturbations_change_only_what_they_name():
    """bench/control_sweep.py --fleet ngram --sensitivity: prompt lookup behaving otherwise than
    calibrated, which the controller can learn only from what it measures."""
    def truth(workload, now=0.0, **kw):
        eng = ReplicaEngine(EngineConfig(profile="ngram-k8", **kw))
        req = EngineRequest("r", 50, 100, workload)
        eng.add_request(req, now)
        return req.preset

    code, chat = ng.get_preset("code"), ng.get_preset("chat")
    assert truth("code") == code and truth("chat") == chat  # the defaults are the calibration
    halved = truth("code", ngram_propose_scale=(("code", 0.5),))
    assert halved.propose_rate == pytest.approx(code.propose_rate / 2)
    assert (halved.continue_rate, halved.whole_match) == (code.continue_rate, code.whole_match)
    assert truth("chat", ngram_propose_scale=(("code", 0.5),)) == chat
    quoting = truth("chat", ngram_behaves_as=(("chat", "code"),))
    assert quoting.name == "chat"
    assert (quoting.propose_rate, quoting.whole_match) == (code.propose_rate, code.whole_match)
    drifting = (("code", -0.5),)
    assert truth("code", 0.0, acceptance_drift=drifting) == code
    late = truth("code", 600.0, acceptance_drift=drifting)  # -5 logits
    assert late.whole_match < code.whole_match / 50 and late.propose_rate == code.propose_rate
    # the proposer's CPU search, scaled; the scheduler's own time is not
    _, reqs, plain = _step_two("ngram-k8")
    _, _, slow = _step_two("ngram-k8", drafter_cost_scale=10.0)
    search = cm.ngram_propose_time_s(len(reqs), sum(r.context - 1 - r.accepted_tokens for r in reqs))
    assert slow.host_s - plain.host_s == pytest.approx(9 * search, rel=1e-6)
    assert slow.num_tokens == plain.num_tokens


def test_per_request_knobs_cut_ngram_proposals_as_on_dspark():
    eng = ReplicaEngine(EngineConfig(profile="ngram-k8"), np.random.default_rng(3))
    zero = EngineRequest("zero", 100, 300, "code", max_draft=0)
    two = EngineRequest("two", 100, 300, "code", max_draft=2)
    # five requests run together while this one lives (it finishes first): always above its max_batch
    above = EngineRequest("above", 100, 100, "code", max_batch=3)
    short = EngineRequest("short", 100, 300, "code", schedule=((8, 3),))  # batch 5 <= 8: draft length 3
    stock = EngineRequest("stock", 100, 300, "code")
    for r in (zero, two, above, short, stock):
        eng.add_request(r, 0.0)
    _drain(eng)
    assert zero.spec_steps == above.spec_steps == 0 and zero.draft_tokens == above.draft_tokens == 0
    assert 0 < two.draft_tokens <= 2 * two.spec_steps and two.accepted_tokens <= 2 * two.spec_steps
    assert 0 < short.draft_tokens <= 3 * short.spec_steps
    assert stock.draft_tokens > 3 * stock.spec_steps  # the copy is longer when nothing caps it
    # the batch-size table of vLLM caps what the proposer is asked for
    tabled = ReplicaEngine(EngineConfig(profile="ngram-k8", spec_k_table=((1, 1024, 2),)), np.random.default_rng(3))
    r = EngineRequest("t", 100, 300, "code")
    tabled.add_request(r, 0.0)
    _drain(tabled)
    assert 0 < r.draft_tokens <= 2 * r.spec_steps


def test_every_step_lands_in_its_engine_timed_cell():
    """The sim exports the plugin's step timing (drafters/vllm_ext/step_timing.py): each step in the
    cell of its scheduled requests, forward tokens and drafting, the cells summing to the engine's own
    step count, busy time and verified drafts; a step capped at K=0 is a non-drafting one."""
    eng = ReplicaEngine(EngineConfig(profile="ngram-k8"), np.random.default_rng(3))
    for i in range(6):
        eng.add_request(EngineRequest(f"r{i}", 64, 120, "code", max_draft=0 if i % 3 == 0 else None), 0.0)
    outs, _ = _drain(eng)
    cells = eng.counters.engine_steps()
    c = eng.counters
    assert sum(x.steps for x in cells.values()) == c.steps == len([o for o in outs if o.duration_s > 0])
    assert sum(x.seconds for x in cells.values()) == pytest.approx(c.busy_s)
    assert sum(x.draft_tokens for x in cells.values()) == c.verified_draft_tokens
    for (batch, tokens, _), x in cells.items():
        assert batch / 2 < x.requests / x.steps <= batch and tokens / 2 < x.tokens / x.steps <= tokens
    assert any(d == 1 for (_, _, d) in cells) and any(d == 0 for (_, _, d) in cells)  # the last requests, alone at K=0
