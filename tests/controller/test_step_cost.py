"""The step-cost learner recovers known curves from scrape-shaped samples.

Two synthetic machines whose knees are ~10x apart: the CPU bed measured in
shared/notes/step-cost-from-vllm-metrics.md (flat 28.3 ms, knee 7.7 tokens,
0.854 ms/token above it) and an H200-like one (flat 8 ms, knee 90 tokens,
roofline-shaped above it). Samples go through `ReplicaSample` counters the
way a /metrics scrape delivers them, so the forward-token reconstruction is
part of what is tested.
"""

from __future__ import annotations

import random

import pytest

from controller.costs import ReplicaCost, prior_for
from controller.signals import ReplicaSample
from controller.step_cost import (
    GENERIC_PRIOR,
    StepCostLearner,
    StepCurve,
    StepPoint,
    described_curve,
    described_points,
    fit_step_curve,
)

CPU = StepCurve(flat_s=0.0283, knee_tokens=7.7, slope_s=0.000854)
H200 = StepCurve(flat_s=0.008, knee_tokens=90.0, slope_s=0.008 / 90)


def scrape_sample(truth: StepCurve, batch: int, drafts: int, accepted: float, prompt_per_step: float,
                  rng: random.Random, noise: float = 0.05, dt_s: float = 1.0) -> ReplicaSample:
    """One 1-s scrape interval of a replica running `batch` requests, each
    drafting `drafts` tokens of which `accepted` are accepted per step."""
    n = batch * (1 + drafts) + prompt_per_step
    step = truth.step_time_s(n) * rng.uniform(1 - noise, 1 + noise)
    steps = max(1.0, round(dt_s / step))
    return ReplicaSample(
        "r", dt_s=steps * step, running=batch, waiting=0, kv_usage=0.1,
        drafts=steps * batch if drafts else 0.0, draft_tokens=steps * batch * drafts,
        accepted_tokens=steps * batch * accepted, iteration_tokens=steps * (batch * (1 + accepted) + prompt_per_step),
        iterations=steps, generation_tokens=steps * batch * (1 + accepted), prompt_tokens=steps * prompt_per_step,
    )


def feed(cost: ReplicaCost, truth: StepCurve, loads: list[int], windows: int, seed: int = 0, noise: float = 0.05) -> None:
    rng = random.Random(seed)
    for batch in loads:
        for drafts, accepted in ((8, 2.0), (0, 0.0)):  # speculation on, then every request capped at 0
            for _ in range(windows):
                s = scrape_sample(truth, batch, drafts, accepted, prompt_per_step=batch * 0.3, rng=rng, noise=noise)
                cost.observe(s.dt_s, s.iterations, s.forward_tokens, 0.0, batch)


@pytest.mark.parametrize("truth,loads", [(CPU, [1, 2, 4, 8, 16, 32, 64]), (H200, [1, 4, 16, 32, 64, 128, 256])],
                         ids=["cpu", "h200"])
def test_learner_recovers_a_known_curve(truth, loads):
    cost = ReplicaCost.for_names()  # no preset: the generic prior only
    feed(cost, truth, loads, windows=6)
    fitted = cost.curve
    assert fitted.knee_tokens == pytest.approx(truth.knee_tokens, rel=0.35)
    for p in cost.learner.points():
        assert fitted.step_time_s(p.tokens) == pytest.approx(truth.step_time_s(p.tokens), rel=0.10)
    assert cost.describe()["learned"] is True


def test_two_knees_ten_times_apart_are_told_apart():
    cpu, gpu = ReplicaCost.for_names(), ReplicaCost.for_names()
    feed(cpu, CPU, [1, 2, 4, 8, 16, 32, 64], windows=6)
    feed(gpu, H200, [1, 4, 16, 32, 64, 128, 256], windows=6)
    assert gpu.knee_tokens(1, 0) / cpu.knee_tokens(1, 0) > 6


def test_a_preset_prior_is_overridden_by_data():
    """An H200 preset on a CPU replica: the CPU's own steps win."""
    cost = ReplicaCost.for_names("h200", "qwen3-8b", profile="off")
    assert cost.describe()["prior"] == "h200/qwen3-8b"
    feed(cost, CPU, [1, 2, 4, 8, 16, 32, 64], windows=6)
    assert cost.curve.knee_tokens == pytest.approx(CPU.knee_tokens, rel=0.35)
    assert cost.curve.flat_s == pytest.approx(CPU.flat_s, rel=0.10)


def test_no_data_is_the_prior_and_one_load_sets_only_the_level():
    learner = StepCostLearner()
    assert learner.current() == GENERIC_PRIOR.curve
    learner.observe(dt_s=1.0, steps=40, forward_tokens=40 * 3.0, drafting_requests=0, batch=1)
    c = learner.current()
    assert c.step_time_s(3.0) == pytest.approx(0.025, rel=0.05)  # the level is the data's
    assert c.knee_tokens == pytest.approx(GENERIC_PRIOR.curve.knee_tokens, rel=0.2)  # the shape the prior's


def test_converges_within_bounded_ticks_at_steady_load_and_stays_put_under_noise():
    cost = ReplicaCost.for_names()
    feed(cost, CPU, [1, 8, 32], windows=4, seed=1)
    knees = []
    rng = random.Random(2)
    for tick in range(60):  # a minute of steady medium load, 10% noise
        s = scrape_sample(CPU, 16, 8, 2.0, 16 * 0.3, rng, noise=0.10)
        cost.observe(s.dt_s, s.iterations, s.forward_tokens, 0.0, 16)
        knees.append(cost.curve.knee_tokens)
    settled = knees[10:]
    assert max(settled) / min(settled) < 1.5
    assert cost.curve.step_time_s(16 * 9 + 4.8) == pytest.approx(CPU.step_time_s(16 * 9 + 4.8), rel=0.10)
    assert len(cost.learner.points()) <= 12  # bounded memory: bins, not samples


def test_a_slower_machine_is_followed_within_a_few_half_lives():
    cost = ReplicaCost(StepCostLearner(half_life_s=30.0))
    feed(cost, CPU, [1, 16, 64], windows=10)
    slow = StepCurve(CPU.flat_s * 2, CPU.knee_tokens, CPU.slope_s * 2)
    feed(cost, slow, [1, 16, 64], windows=60, seed=3)
    assert cost.curve.step_time_s(4) == pytest.approx(slow.step_time_s(4), rel=0.15)


def test_drafter_cost_is_learned_when_drafting_toggles_at_one_load():
    """At one N, steps with and without a drafter pass differ only by the drafter."""
    truth = StepCurve(0.010, 64, 0.010 / 64, draft_s=0.0002, draft_fixed_s=0.002)
    points = []
    for batch in (1, 4, 16, 64):
        for share in (0.0, 1.0):
            n = batch * 5
            points.append(StepPoint(n, truth.step_time_s(n, batch * share, share), batch * share, share, 10.0))
    fitted = fit_step_curve(points, prior_for(None, None))
    assert fitted.draft_fixed_s == pytest.approx(0.002, rel=0.25)
    assert fitted.draft_s == pytest.approx(0.0002, rel=0.25)


def test_idle_or_thin_intervals_are_not_evidence():
    learner = StepCostLearner()
    assert learner.observe(dt_s=1.0, steps=0.5, forward_tokens=10, drafting_requests=0, batch=1) is False
    assert learner.observe(dt_s=1.0, steps=20, forward_tokens=0, drafting_requests=0, batch=1) is False
    assert learner.points() == []


def test_a_stalled_interval_does_not_erase_the_drafter_cost():
    """One interval in which the engine stalled (a flood of arrivals on the
    server's loop) reads as steps ~50x slower than the curve. In the shape the
    end-to-end test caught -- the stall the only non-drafting point below the
    knee, heavier than the rest -- a plain fit lifts the flat level to it and
    prices the drafter's pass at ~0; the robust refit matches the fit without
    the stall."""
    truth = StepCurve(0.010, 90, 0.010 / 90, draft_s=0.0001, draft_fixed_s=0.002)
    points = [StepPoint(n, truth.step_time_s(n, d, share), d, share, w)
              for n, d, share, w in ((9, 1, 1.0, 0.1), (16.9, 1.7, 0.92, 0.2), (127, 0, 0.0, 0.4), (760, 1, 0.02, 0.1))]
    prior = prior_for("h200", "qwen3-8b", "dspark-b8")
    clean = fit_step_curve(points, prior)
    stalled = fit_step_curve([*points, StepPoint(12.5, 0.6, 0.0, 0.0, 1.2)], prior)
    assert stalled.flat_s == pytest.approx(clean.flat_s, rel=0.05)
    assert stalled.step_time_s(9, 1, 1.0) / stalled.step_time_s(9) == pytest.approx(
        clean.step_time_s(9, 1, 1.0) / clean.step_time_s(9), rel=0.05)
    assert clean.step_time_s(9, 1, 1.0) / clean.step_time_s(9) > 1.15  # the pass is priced (truth: 1.21)


def test_an_interval_that_starts_or_ends_idle_is_not_a_step_time():
    """interval / steps is a step time only when requests ran throughout: one
    that starts idle (a load step arriving) holds idle time."""
    from controller.estimators import ReplicaEstimator

    est, cost = ReplicaEstimator(), ReplicaCost.for_names()
    est.ensure("r", "off", cost)

    def sample(start, end):
        return ReplicaSample("r", dt_s=1.0, running=end, waiting=0, kv_usage=0.1, running_at_start=start,
                             iteration_tokens=40, iterations=10, generation_tokens=40, prompt_tokens=0)

    for start, end in ((0, 4), (4, 0), (0, 0)):
        est.update(sample(start, end))
    assert cost.learner.points() == []
    est.update(sample(4, 4))
    assert cost.learner.points()[0].step_s == pytest.approx(0.1)


def test_prefill_bursts_are_read_as_a_mix_of_steps_not_one_average_step():
    """With chunked prefill a share of the steps carries a whole prompt chunk;
    the interval's mean step time then lies above the curve at the mean token
    count wherever the curve bends. Read with the burst model (the chunk size
    known: the mean prompt), the learner recovers the decode step; read as
    one average step it prices a decode-only step at up to ~1.9x (seen on the
    simulator at c=256: `off` priced 2.4x its cost)."""
    def learn(chunk: float | None) -> StepCurve:
        learner, rng = StepCostLearner(prior=prior_for(None, None, "off")), random.Random(0)
        for batch in (4, 8, 16, 32, 64, 128):
            for _ in range(6):
                q, c = 0.3, 512.0  # 30 % of the steps carry a 512-token prompt chunk
                step = (q * H200.step_time_s(batch + c) + (1 - q) * H200.step_time_s(batch)) * rng.uniform(0.97, 1.03)
                steps = round(2.0 / step)
                learner.observe(steps * step, steps, steps * (batch + q * c), 0.0, batch, steps * q * c, chunk)
        return learner.current()

    bursty, smooth = learn(512.0), learn(None)
    for batch in (4, 16, 64, 128):
        assert bursty.step_time_s(batch) == pytest.approx(H200.step_time_s(batch), rel=0.08)
    assert smooth.step_time_s(16) > 1.5 * H200.step_time_s(16)


def test_a_replica_that_always_drafts_still_prices_its_drafter():
    """At one deep batch, always drafting, the drafter's pass and the flat
    level cannot be told apart; a model drafter's generic prior (its pass ~
    0.2 of the target's work for each slot it proposes) splits them, so a
    step without speculation is not charged for a pass it would skip."""
    truth = StepCurve(0.006, 64, 0.056e-3, draft_s=0.12e-3)
    points = [StepPoint(125 * m, truth.step_time_s(125 * m, 125, 1.0), 125, 1.0, 10.0) for m in (4, 5, 6)]
    prior = prior_for(None, None, "dspark-b8")
    assert prior.draft_work_tokens == pytest.approx(0.2 * 9)
    fitted, free = fit_step_curve(points, prior), fit_step_curve(points, GENERIC_PRIOR)

    def gap(c: StepCurve) -> float:
        return c.step_time_s(625, 125, 1.0) - c.step_time_s(625)

    assert gap(fitted) == pytest.approx(gap(truth), rel=0.2)
    assert fitted.step_time_s(125) == pytest.approx(truth.step_time_s(125), rel=0.15)
    assert gap(free) < 0.85 * gap(truth)  # a prior of "free" hands part of the pass to the flat level
    assert prior_for(None, None, "ngram-k8").draft_work_tokens == 0.0  # a model-free drafter


def test_the_fit_is_the_best_non_negative_one_not_the_first():
    """Non-negativity by enumerating the parameter subsets must keep the best
    feasible one: taking the first (the drafter's per-request cost pinned at 0
    as soon as the free fit made the fixed part slightly negative) priced this
    truth's 0.12 ms per drafting request as 0 and put 17 ms into the fixed part."""
    truth = StepCurve(0.006, 64, 0.056e-3, draft_s=0.12e-3, draft_fixed_s=0.0)
    rng = random.Random(3)
    points = []
    for drafting, batch in ((70, 118), (90, 121), (110, 127), (124, 125), (100, 130)):
        for m in (4, 6, 8):
            n = 125 * m
            step = truth.step_time_s(n, drafting, drafting / batch) * rng.uniform(0.95, 1.05)
            points.append(StepPoint(n, step, drafting, drafting / batch, 10.0))
    fitted = fit_step_curve(points, prior_for(None, None, "off"))
    assert fitted.draft_s == pytest.approx(truth.draft_s, rel=0.25)
    assert fitted.draft_fixed_s < 0.002


def test_a_profile_with_another_block_is_priced_with_the_pass_scaled_by_its_slots():
    """The drafter proposes block + 1 slots per request; what was learned on
    dspark-b8 prices dspark-b4's per-request pass at 5/9 (the fleet plan
    compares block sizes with it: on the simulator at c=64 it then restarts
    to dspark-b4-av, 0.99x that static, where it used to stay on b8)."""
    cost = ReplicaCost(StepCostLearner(prior=prior_for(None, None, "dspark-b8")))
    truth = StepCurve(0.006, 64, 0.056e-3, draft_s=0.12e-3)
    for m in (3, 5, 7):
        for batch in (16, 32, 64):
            n = batch * m
            steps = round(1.0 / truth.step_time_s(n, batch, 1.0))
            cost.observe(steps * truth.step_time_s(n, batch, 1.0), steps, steps * n, steps * batch, batch, block=8)
    assert cost.observed_block == 8
    off = cost.step_time_s(64, 320, 0, 1000.0)
    b8, b4 = cost.step_time_s(64, 320, 8, 1000.0) - off, cost.step_time_s(64, 320, 4, 1000.0) - off
    assert b8 == pytest.approx(64 * 0.12e-3, rel=0.25)
    fixed = cost.curve.draft_fixed_s  # the pass's weight read: once per step, whatever the block
    assert b4 - fixed == pytest.approx((b8 - fixed) * 5 / 9, rel=1e-6)
    assert b4 < 0.75 * b8


def test_scatter_at_light_load_is_not_read_as_a_knee():
    """Light load's first seconds: intervals at 1.2-1.4 forward tokens per
    step whose times scatter 39-73 ms (prefill shares, idle edges; the real
    bed's scrapes look like this). With a knee allowed at 1 token the fit put
    it there with a slope that priced 4 tokens at 30x one (and switched a
    tenant off that gained 1.8x from drafting); below the 4-token floor the
    scatter is level, not slope."""
    points = [StepPoint(1.31, 0.0659, weight=4.2), StepPoint(1.18, 0.0389, weight=6.3, burst_share=0.03),
              StepPoint(1.36, 0.0728, weight=9.0)]
    curve = fit_step_curve(points)
    assert curve.knee_tokens >= 4.0
    assert curve.step_time_s(4.0) < 1.5 * curve.step_time_s(1.0)


# --- Engine-timed steps (the extension's per-cell counters, contract.vllm_metrics.StepCell) ---

def timed_cells(truth: StepCurve, shapes: list[tuple[int, int, bool]], rng: random.Random, steps: int = 50,
                noise: float = 0.05) -> dict:
    """One scrape interval of engine-timed steps: `steps` steps of each (requests, tokens, drafting) shape."""
    from contract.vllm_metrics import StepCell, step_cell_key

    cells: dict = {}
    for r, n, drafting in shapes:
        key = step_cell_key(r, n, drafting)
        t = sum(truth.step_time_s(n, r if drafting else 0.0, 1.0 if drafting else 0.0, r)
                * rng.uniform(1 - noise, 1 + noise) for _ in range(steps))
        old = cells.get(key, StepCell())
        cells[key] = StepCell(old.steps + steps, old.seconds + t, old.requests + steps * r, old.tokens + steps * n,
                              old.draft_tokens + steps * (n - r))
    return cells


def test_engine_timed_steps_tell_one_long_verify_from_many_requests():
    """A step of one request verifying 9 tokens and one of 9 requests verifying 9 tokens differ by
    the per-request cost; scrape intervals see only the token count, timed cells see both."""
    truth = StepCurve(0.004, 64, 0.004 / 64, draft_s=0.0001, draft_fixed_s=0.0005, request_s=0.0006)
    learner = StepCostLearner()
    rng = random.Random(4)
    shapes = [(r, r * (1 + k), k > 0) for r in (1, 2, 4, 8, 16, 32) for k in (0, 1, 3, 8)]
    for _ in range(10):
        assert learner.observe_cells(1.0, timed_cells(truth, shapes, rng))
    fitted = learner.current()
    assert fitted.request_s == pytest.approx(truth.request_s, rel=0.25)
    one_long = fitted.step_time_s(9, 1, 1.0, requests=1)
    nine = fitted.step_time_s(9, 0.0, 0.0, requests=9)
    assert one_long == pytest.approx(truth.step_time_s(9, 1, 1.0, 1), rel=0.10)
    assert nine == pytest.approx(truth.step_time_s(9, 0.0, 0.0, 9), rel=0.10)
    assert nine > 1.5 * one_long
    for p in learner.points():
        assert p.predicted_s(fitted) == pytest.approx(p.step_s, rel=0.10)
    assert learner.describe()["source"] == "engine-timed steps"


def test_what_describe_writes_reads_back_as_the_same_curve_and_points():
    """The benchmarks read the learned curve and its points back from /admin/replicas
    (`described_curve`, `described_points`): the same curve, the same points, up to the
    export's rounding; an export without the later terms reads them as 0."""
    truth = StepCurve(0.004, 64, 0.004 / 64, draft_s=0.0001, draft_fixed_s=0.0005, request_s=0.0006)
    learner = StepCostLearner()
    rng = random.Random(6)
    shapes = [(r, r * (1 + k), k > 0) for r in (1, 4, 16, 64) for k in (0, 3)]
    for _ in range(5):
        assert learner.observe_cells(1.0, timed_cells(truth, shapes, rng))
    described = learner.describe()
    fitted, read = learner.current(), described_curve(described)
    for name in ("flat_s", "knee_tokens", "slope_s", "draft_s", "draft_fixed_s", "request_s"):
        assert getattr(read, name) == pytest.approx(getattr(fitted, name), rel=1e-3, abs=1e-7)
    points = sorted(learner.points(), key=lambda p: p.mean_tokens)
    back = described_points(described)
    assert len(back) == len(points) > 4
    for original, copy in zip(points, back):
        assert copy.mean_tokens == pytest.approx(original.mean_tokens, abs=0.1)
        assert copy.predicted_s(read) == pytest.approx(original.predicted_s(fitted), rel=1e-2)
        assert copy.step_s == pytest.approx(original.step_s, rel=1e-2)
    old = described_curve({"flat_ms": 30.0, "knee_tokens": 5.0, "slope_ms_per_token": 1.0})
    assert old == StepCurve(0.03, 5.0, 0.001)


def test_empty_cells_are_not_an_observation():
    from contract.vllm_metrics import StepCell

    learner = StepCostLearner()
    assert not learner.observe_cells(1.0, {})
    assert not learner.observe_cells(1.0, {(1, 1, 0): StepCell()})
    assert learner.current() == GENERIC_PRIOR.curve and learner.observations == 0


def test_the_estimator_prefers_timed_steps_where_the_replica_exports_them():
    from contract.vllm_metrics import StepCell
    from controller.estimators import ReplicaEstimator

    truth = StepCurve(0.004, 64, 0.004 / 64, request_s=0.0006)
    rng = random.Random(5)
    timed, counted = ReplicaEstimator(), ReplicaEstimator()
    for est in (timed, counted):
        est.ensure("r", "ngram-k4", ReplicaCost.for_names())
    for _ in range(6):
        s = scrape_sample(truth, 8, 0, 0.0, 0.0, rng)
        cells = {(8, 8, 0): StepCell(s.iterations, s.dt_s, 8 * s.iterations, 8 * s.iterations, 0.0)}
        timed.update(ReplicaSample(**{**s.__dict__, "engine_steps": cells}))
        counted.update(s)
    assert timed.replicas["r"].cost.learner.timed and not counted.replicas["r"].cost.learner.timed
    assert timed.replicas["r"].cost.learner.points()[0].requests == pytest.approx(8)
