"""Estimators: acceptance fitting, decay and shrinkage toward the fleet mean,
step-cost observations."""

from __future__ import annotations

import pytest

from controller.acceptance_fit import (
    ACCEPTANCE_PRIOR,
    draft_length,
    expected_accepted,
    fit_conditional_acceptance,
    method_acceptance_prior,
    method_proposal,
)
from contract.vllm_metrics import StepCell
from contract.telemetry import RequestSpecStats, add_increments
from controller.estimators import TenantEstimator, cap_reach_steps, capped_request_steps
from controller.signals import TenantSample


@pytest.mark.parametrize("a,k", [(0.5, 4), (0.8, 8), (0.9, 3.5)])
def test_fit_inverts_expected_accepted(a, k):
    steps = 1000.0
    accepted = steps * expected_accepted(a, k)
    assert fit_conditional_acceptance(steps, steps * k, accepted) == pytest.approx(a, abs=1e-3)


def test_draft_length_cut_by_confidence():
    assert draft_length(0.8, 8, None) == 8
    assert draft_length(0.8, 8, 0.5) == 3  # 0.8^3 = 0.51 >= 0.5 > 0.8^4
    assert draft_length(0.8, 2, 0.5) == 2
    assert draft_length(0.8, 0, 0.1) == 0


def _sample(tenant, steps, a, k=4, replica="r"):
    return TenantSample(tenant, replica, {
        "requests": steps / 50, "completion_tokens": steps * 2, "prompt_tokens": steps, "num_spec_steps": steps,
        "num_draft_tokens": steps * k, "num_accepted_draft_tokens": steps * expected_accepted(a, k),
    })


def test_thin_tenant_is_shrunk_toward_the_prior_not_the_fleet_and_thick_one_is_not():
    """A thin tenant beside a dominant one keeps mostly the prior, not the
    dominant tenant's acceptance: its own few steps pull it from the prior
    toward its own value."""
    est = TenantEstimator(half_life_s=300, prior_steps=100)
    est.update([_sample("big", 20_000, 0.2), _sample("thin", 5, 0.95), _sample("thick", 20_000, 0.9)])
    thin, n_thin = est.acceptance("thin")
    thick, _ = est.acceptance("thick")
    assert n_thin == 5
    assert abs(thin - ACCEPTANCE_PRIOR) < abs(0.95 - ACCEPTANCE_PRIOR) * 0.2  # mostly the prior...
    assert thin > ACCEPTANCE_PRIOR  # ...moved toward its own 0.95, not the big tenant's 0.2
    assert thick == pytest.approx(0.9, abs=0.01)
    assert est.acceptance("unseen") == (ACCEPTANCE_PRIOR, 0.0)


def test_method_acceptance_is_shrunk_toward_the_methods_prior():
    est = TenantEstimator(prior_steps=100)
    est.update([_sample("thin", 5, 0.9, replica="ng"), _sample("big", 20_000, 0.05, replica="ng")],
               methods={"ng": "ngram"})
    thin = est.method_acceptance("thin")["ngram"]
    prior = method_acceptance_prior("ngram")
    assert prior < ACCEPTANCE_PRIOR
    assert prior < thin < prior + 0.2 * (0.9 - prior)
    assert est.method_acceptance("big")["ngram"] == pytest.approx(0.05, abs=0.01)


def test_decay_has_the_configured_half_life():
    est = TenantEstimator(half_life_s=300)
    est.update([_sample("t", 1000, 0.7)])
    est.decay(300)
    assert est.sums["t"].steps == pytest.approx(500)


def _tokens(tenant, replica, n):
    return TenantSample(tenant, replica, {"requests": 1, "completion_tokens": n})


def test_the_traffic_mix_outlasts_an_idle_spell_and_ages_only_while_its_replica_serves():
    """An idle replica's mix (no traffic, or a paused controller) is its last one,
    not forgotten: the first tenant back does not hold it alone."""
    est = TenantEstimator(mix_half_life_s=5.0)
    est.update([_tokens("a", "r1", 600), _tokens("b", "r1", 400), _tokens("a", "r2", 100)])
    est.decay(600.0, serving=set())  # ten idle minutes
    assert est.replica_mix()["r1"] == pytest.approx({"a": 0.6, "b": 0.4})
    est.decay(1.0, serving={"r1"})  # traffic again: a tenant's first completion after the spell
    est.update([_tokens("a", "r1", 64)])
    mix = est.replica_mix()["r1"]
    assert mix["b"] > 0.3  # b keeps its share; it is not priced at the floor
    # Only serving replicas age, and a call ages them by at most one half-life (a long gap since the last is one
    # tick of evidence, not minutes of it).
    before = est.sums["a"].by_replica["r2"]
    est.decay(600.0, serving={"r1"})
    assert est.sums["a"].by_replica["r2"] == before
    r1 = est.sums["b"].by_replica["r1"]
    est.decay(600.0, serving={"r1", "r2"})
    assert est.sums["b"].by_replica["r1"] == pytest.approx(r1 / 2)
    assert est.sums["a"].by_replica["r2"] == pytest.approx(before / 2)
    est.decay(2.5)  # serving unknown: every replica ages, by the clock
    assert est.sums["a"].by_replica["r2"] == pytest.approx(before / 2 * 0.5**0.5)


def test_new_evidence_moves_a_decayed_estimate():
    est = TenantEstimator(half_life_s=300, prior_steps=10)
    est.update([_sample("t", 5000, 0.5)])
    est.decay(1800)  # six half-lives: old data weighs 1/64
    est.update([_sample("t", 5000, 0.9)])
    assert est.acceptance("t")[0] > 0.85


def test_replica_estimator_learns_step_cost_from_forward_tokens():
    """The interval's forward tokens (rejected drafts included) reach the
    learner, not vLLM's emitted-token `iteration_tokens`."""
    from controller.costs import ReplicaCost
    from controller.estimators import ReplicaEstimator
    from controller.signals import ReplicaSample

    est = ReplicaEstimator()
    cost = ReplicaCost.for_names(profile="ngram-k8")
    est.ensure("r", "off", cost)
    # 10 steps of 40 ms: 16 requests, 8 drafts each of which 2 accepted, 32 prompt tokens.
    sample = ReplicaSample("r", dt_s=0.4, running=16, waiting=0, kv_usage=0.1, drafts=160, draft_tokens=1280,
                           accepted_tokens=320, iteration_tokens=10 * (16 * 3 + 32), iterations=10,
                           generation_tokens=10 * 16 * 3, prompt_tokens=320)
    est.update(sample)
    assert sample.forward_tokens / 10 == pytest.approx(16 + 128 + 32)
    assert est.replicas["r"].tokens_per_step == pytest.approx(176)
    point = cost.learner.points()[0]
    assert point.mean_tokens == pytest.approx(176)
    assert (point.tokens, point.burst_tokens, point.burst_share) == pytest.approx((144, 32, 1.0))  # no prompt size known: even
    assert point.step_s == pytest.approx(0.04)


def test_acceptance_is_kept_per_method():
    """One tenant: ngram accepts little of its text, a trained drafter much;
    each method's replicas are priced with that method's acceptance."""
    est = TenantEstimator(half_life_s=300, prior_steps=10)
    est.update([_sample("t", 5000, 0.2, replica="ng"), _sample("t", 5000, 0.85, replica="ds")],
               methods={"ng": "ngram", "ds": "dspark"})
    by_method = est.method_acceptance("t")
    assert by_method["ngram"] == pytest.approx(0.2, abs=0.03)
    assert by_method["dspark"] == pytest.approx(0.85, abs=0.03)
    overall, _ = est.acceptance("t")
    assert by_method["ngram"] < overall < by_method["dspark"]
    view = est.views({"t"}, {})[0]
    assert view.by_method == by_method



def test_the_drafters_pass_is_charged_per_decoding_request_of_a_drafting_step():
    """vLLM drafts batch-wide: when the token budget (a prefill burst) or a cap
    leaves most requests' drafts unscheduled, those requests still paid for
    the pass. The learner is given the decode batch of the steps that draft,
    not vLLM's draft count (which made a ramp's steps look like a dear flat
    level with a free drafter)."""
    from controller.costs import ReplicaCost
    from controller.estimators import ReplicaEstimator
    from controller.signals import ReplicaSample

    def drafting_per_step(drafts: float) -> tuple[float, float]:
        est, cost = ReplicaEstimator(), ReplicaCost.for_names(profile="dspark-b8")
        est.ensure("r", "dspark-b8", cost)
        # 10 steps of 16 decoding requests; `drafts` of the 160 request-steps had drafts scheduled.
        est.update(ReplicaSample("r", dt_s=0.4, running=16, waiting=0, kv_usage=0.1, drafts=drafts,
                                 draft_tokens=8 * drafts, accepted_tokens=2 * drafts, iteration_tokens=160 + 2 * drafts,
                                 iterations=10, generation_tokens=160 + 2 * drafts, prompt_tokens=0))
        point = cost.learner.points()[0]
        return point.drafting, point.share

    assert drafting_per_step(40) == pytest.approx((16, 1.0))  # 4 drafts a step: every step ran the pass
    assert drafting_per_step(5) == pytest.approx((8, 0.5))  # half a draft a step: about half the steps did
    assert drafting_per_step(0) == pytest.approx((0, 0.0))


def _proposals(tenant, decode_steps, rate, fill, k=8, replica="ng"):
    """Telemetry of requests allowed to draft k tokens that proposed in a
    share `rate` of their decode steps, `fill` x k tokens a proposal."""
    steps = decode_steps * rate
    return TenantSample(tenant, replica, {
        "requests": decode_steps / 60, "completion_tokens": decode_steps, "num_spec_steps": steps,
        "num_draft_tokens": steps * fill * k, "num_accepted_draft_tokens": steps * 1.5,
        "allowed_decode_steps": decode_steps, "allowed_spec_steps": steps,
        "allowed_draft_tokens": steps * fill * k, "allowed_full_tokens": steps * k,
    })


def test_the_proposal_rate_and_fill_are_each_tenants_own():
    """Measured per tenant on ngram, shrunk toward the method's weak prior and
    never toward another tenant: a tenant whose sampled text rarely finds a
    match keeps its own low rate beside one whose greedy text often does."""
    est = TenantEstimator()
    est.update([_proposals("greedy", 20_000, 0.4, 0.7), _proposals("temp1", 20_000, 0.05, 0.6)],
               methods={"ng": "ngram"})
    greedy, temp1 = est.method_proposal("greedy")["ngram"], est.method_proposal("temp1")["ngram"]
    assert greedy.rate == pytest.approx(0.4, abs=0.005) and greedy.fill == pytest.approx(0.7, abs=0.005)
    assert temp1.rate == pytest.approx(0.05, abs=0.005) and temp1.fill == pytest.approx(0.6, abs=0.01)
    view = {v.tenant: v for v in est.views({"greedy", "temp1"}, {})}
    assert view["temp1"].proposal == {"ngram": temp1}


def test_a_thin_tenant_is_shrunk_toward_the_methods_prior_and_a_trained_drafter_needs_none():
    est = TenantEstimator()
    est.update([_proposals("thin", 5, 1.0, 1.0), _proposals("bulk", 50_000, 0.05, 0.5),
                _proposals("ds", 5_000, 1.0, 1.0, replica="ds")], methods={"ng": "ngram", "ds": "dspark"})
    thin = est.method_proposal("thin")["ngram"]
    prior = method_proposal("ngram")
    assert abs(thin.rate - prior.rate) < 0.1 * (1.0 - prior.rate)  # 5 steps barely move the prior...
    assert thin.rate > prior.rate  # ...toward its own 1.0, not toward the bulk tenant's 0.05
    assert est.method_proposal("ds") == {}  # DSpark always proposes its cap: nothing to measure


def test_proposal_evidence_decays_with_the_acceptance():
    est = TenantEstimator(half_life_s=300)
    est.update([_proposals("t", 10_000, 0.4, 0.7)], methods={"ng": "ngram"})
    est.decay(300)
    assert est.method_sums[("t", "ngram")].decode_steps == pytest.approx(5_000)


def test_capped_request_steps_reads_each_cell_at_its_mean_batch():
    cells = {(4, 8, 1): StepCell(steps=10, seconds=0.3, requests=30, tokens=80),  # mean batch 3
             (32, 64, 0): StepCell(steps=5, seconds=0.5, requests=140, tokens=150),  # mean batch 28
             (64, 64, 0): StepCell(steps=0, seconds=0.0, requests=0, tokens=0)}
    schedule_24 = lambda batch: 8 if batch <= 24 else 0  # noqa: E731
    assert capped_request_steps(cells, schedule_24) == (140, 170)
    assert capped_request_steps(cells, lambda batch: None) == (0, 170)  # uncapped
    assert capped_request_steps({}, schedule_24) == (0, 0)


def test_steps_a_schedule_capped_at_zero_are_not_evidence_of_the_proposal_rate():
    """A tenant whose schedule stops drafting at 24 requests a step, in a phase of
    ~30: its telemetry counts every decode step, and the rate over them all
    reads as a tenant that rarely proposes; over the steps it could draft in, as
    its own rate (0.4)."""
    est = TenantEstimator()
    # 20,000 decode steps; 3/4 of them capped at 0 proposed nothing, the rest at 0.4.
    est.update([_proposals("greedy", 20_000, 0.1, 0.7)], methods={"ng": "ngram"})
    assert est.method_proposal("greedy")["ngram"].rate == pytest.approx(0.1, abs=0.01)
    est.observe_capped("greedy", "ngram", capped=750.0, counted=1000.0)
    assert est.method_proposal("greedy")["ngram"].rate == pytest.approx(0.4, abs=0.02)
    est.observe_capped("nobody", "ngram", capped=1.0, counted=1.0)  # no telemetry: nothing to correct
    assert "nobody" not in est.sums
    # Never below the steps that did propose: a capped share over 100 % of the rest reads 1.
    est.observe_capped("greedy", "ngram", capped=10_000.0, counted=10_000.0)
    assert est.method_proposal("greedy")["ngram"].rate <= 1.0


def test_cap_reach_steps_counts_the_positions_each_cells_cap_allowed():
    cells = {(4, 8, 1): StepCell(steps=10, seconds=0.3, requests=30, tokens=80),  # mean batch 3
             (32, 64, 0): StepCell(steps=5, seconds=0.5, requests=140, tokens=150),  # mean batch 28
             (64, 64, 0): StepCell(steps=0, seconds=0.0, requests=0, tokens=0)}
    schedule = lambda batch: 8 if batch <= 4 else 2  # noqa: E731  ([[4, 8], [512, 2]])
    assert cap_reach_steps(cells, schedule, block=8, positions=10) == [170, 170, *[30] * 6, 0, 0]
    assert cap_reach_steps(cells, lambda batch: None, block=4, positions=6) == [170] * 4 + [0, 0]  # uncapped: the block
    assert cap_reach_steps(cells, lambda batch: 0, block=8, positions=3) == [0, 0, 0]


def _capped_by_schedule(steps_by_cap: dict[int, int], q: float, allowance: int = 8):
    """The gateway's counters (contract.telemetry.add_increments) of requests allowed
    `allowance` drafts whose proposals always fill the cap in force and are accepted
    position by position with probability q, run under a schedule that capped
    `steps_by_cap[c]` of their proposal steps at c."""
    acc: dict[str, float] = {}
    for cap, steps in steps_by_cap.items():
        # Accepted exactly j of c drafts: q^j (1 - q), all c with q^c.
        histogram = [round(steps * q**j * (1 - q)) for j in range(cap)] + [round(steps * q**cap)]
        steps = sum(histogram)
        accepted = sum(j * n for j, n in enumerate(histogram))
        stats = RequestSpecStats(
            completion_tokens=steps + accepted + 1, num_spec_steps=steps, num_draft_tokens=steps * cap,
            num_accepted_draft_tokens=accepted, draft_allowance=allowance,
            acceptance_histogram=tuple(histogram + [0] * (allowance + 1 - len(histogram))),
        )
        add_increments(acc, stats)
    return TenantSample("greedy", "ng", acc)


def test_steps_a_schedule_capped_below_the_allowance_are_not_short_proposals():
    """Greedy's schedule [[4, 8], [512, 2]] in a phase of ~28 requests a step: 3/4 of its
    steps capped at 2. Its proposals fill every cap and keep position i with 0.8, but
    read against the allowance of 8 its fill is 0.44 and position 3's survival 0.08
    (the cap stopped them there, not a rejection): a 2-token draft priced at 0.9 of
    the tokens it verifies, longer drafts as worthless. With the engine's cells under
    the schedule the fill and the survival are the drafts' own."""
    est = TenantEstimator()
    est.update([_capped_by_schedule({2: 30_000, 8: 10_000}, 0.8)], methods={"ng": "ngram"})
    before = est.method_proposal("greedy")["ngram"]
    assert before.fill == pytest.approx(0.44, abs=0.01)
    assert before.survival[2] < 0.2
    cells = {(4, 8, 1): StepCell(steps=10, seconds=0.3, requests=30, tokens=80),  # cap 8
             (32, 64, 0): StepCell(steps=5, seconds=0.5, requests=90, tokens=150)}  # cap 2
    schedule = lambda batch: 8 if batch <= 4 else 2  # noqa: E731
    capped, counted = capped_request_steps(cells, schedule)
    est.observe_capped("greedy", "ngram", capped, counted, cap_reach_steps(cells, schedule, block=8))
    after = est.method_proposal("greedy")["ngram"]
    assert after.fill == pytest.approx(1.0, abs=0.03)
    assert after.drafted(2) == pytest.approx(2 * after.rate, rel=0.03)
    assert after.survival[:8] == pytest.approx([0.8 ** i for i in range(1, 9)], rel=0.05)
    assert after.rate == before.rate  # no step was capped at 0


def _arms(tenant, replica, drafting_tokens, drafting_s_per_token, plain_tokens, plain_s_per_token):
    return TenantSample(tenant, replica, {
        "requests": 1, "probed_drafting_tokens": drafting_tokens,
        "probed_drafting_seconds": drafting_tokens * drafting_s_per_token,
        "probed_plain_tokens": plain_tokens, "probed_plain_seconds": plain_tokens * plain_s_per_token,
    })


def test_the_measured_gain_compares_the_arms_on_each_replica_then_across():
    """Per replica the arms ran in the same steps; across replicas the step
    times differ (here 2x), so the ratio is taken per replica first."""
    est = TenantEstimator()
    est.update([_arms("t", "r0", 500, 0.010, 500, 0.015), _arms("t", "r1", 500, 0.020, 500, 0.030)])
    gain = est.measured_gain("t")
    assert gain.gain == pytest.approx(1.5) and gain.drafting_tokens == 1000 and gain.plain_tokens == 1000
    assert {v.tenant: v for v in est.views({"t"}, {})}["t"].measured_gain == gain


def test_no_measured_gain_without_enough_tokens_in_both_arms_of_one_replica():
    est = TenantEstimator()
    est.update([_arms("t", "r0", 500, 0.01, 20, 0.02), _arms("t", "r1", 20, 0.01, 500, 0.02)])
    assert est.measured_gain("t") is None
    assert est.measured_gain("unseen") is None


def test_evidence_counts_decode_steps_where_proposals_are_rare():
    """A sampled tenant that proposed in 5 % of 4,000 decode steps has 200
    speculation steps but 4,000 steps of evidence of what drafting gives it."""
    est = TenantEstimator()
    est.update([_proposals("temp1", 4_000, 0.05, 0.6)], methods={"ng": "ngram"})
    assert est.acceptance("temp1")[1] == pytest.approx(4_000)
    est.update([_sample("old", 300, 0.7)])  # telemetry without the decode-step counters
    assert est.acceptance("old")[1] == pytest.approx(300)


def test_the_view_carries_the_speculation_steps_behind_the_acceptance():
    est = TenantEstimator()
    est.update([_proposals("temp1", 4_000, 0.05, 0.6)], methods={"ng": "ngram"})
    view = est.views({"temp1"}, {})[0]
    assert view.acceptance_steps == pytest.approx(200) and view.evidence_steps == pytest.approx(4_000)


def _survival_sample(tenant: str, steps: float, q: list[float], replica: str = "ng") -> TenantSample:
    """`steps` proposals whose drafts survive each position i with conditional rate q[i-1]."""
    deltas = dict(_proposals(tenant, steps / 0.4, 0.4, 0.7, replica=replica).deltas)
    reach = steps
    for i, qi in enumerate(q, start=1):
        deltas[f"survival_reach_{i}"], deltas[f"survival_accepted_{i}"] = reach, reach * qi
        reach *= qi
    return TenantSample(tenant, replica, deltas)


def test_the_measured_survival_replaces_the_geometric_shape_and_continues_past_the_cap():
    """A whole-match drafter measured at a cap of 4 (half its proposals fail at once, the rest
    mostly run on): a draft of 8 is priced by continuing the late positions' rate, not along a
    geometric curve fitted to the four, which undervalues it."""
    est = TenantEstimator()
    est.update([_survival_sample("code", 5_000, [0.5, 0.95, 0.95, 0.95])], methods={"ng": "ngram"})
    q = est.method_proposal("code")["ngram"]
    assert q.survival is not None and len(q.survival) == 16
    assert q.survival[:4] == pytest.approx([0.5, 0.475, 0.451, 0.429], abs=0.005)
    assert q.survival[7] / q.survival[6] == pytest.approx(0.95, abs=0.01)  # positions 5-8 continue position 4's rate
    measured_4 = sum(q.survival[:4])
    a = fit_conditional_acceptance(1.0, 4.0, measured_4)  # the geometric curve through the same four positions
    assert 1 + q.rate * sum(q.survival[:8]) == pytest.approx(q.tokens(a, 8))
    assert q.tokens(a, 8) > 1 + q.rate * expected_accepted(a, 8) + 0.2


def test_without_enough_histograms_the_shape_stays_geometric():
    est = TenantEstimator()
    est.update([_survival_sample("few", 10, [0.5, 0.9]), _proposals("none", 5_000, 0.4, 0.7)], methods={"ng": "ngram"})
    assert est.method_proposal("few")["ngram"].survival is None
    assert est.method_proposal("none")["ngram"].survival is None


def test_a_trained_drafters_survival_is_kept_too_and_decays():
    est = TenantEstimator(half_life_s=300)
    est.update([_survival_sample("t", 2_000, [0.8] * 8, replica="ds")], methods={"ds": "dspark"})
    q = est.method_proposal("t")["dspark"]
    assert (q.rate, q.fill) == (1.0, 1.0) and q.survival[2] == pytest.approx(0.8**3, abs=0.01)
    est.decay(300)
    assert est.method_sums[("t", "dspark")].reach[0] == pytest.approx(1_000)


def test_a_replica_view_prices_k0_steps_by_the_skips_the_replica_reports():
    """The decision's `k0_skips_pass` comes from the replica's method and the K=0 skips in
    its `specgate_ext_info{engine_fixes}`; a replica that reports none keeps the plugin's."""
    from contract.knobs import K0_SKIP_NGRAM, K0_SKIP_V2_DFLASH
    from controller.costs import ReplicaCost
    from controller.estimators import ReplicaEstimator, replica_views

    est = ReplicaEstimator()
    cases = {
        "dspark-skips": ("dspark-b8", frozenset({"expand_batch_to_tokens", K0_SKIP_V2_DFLASH}), True),
        "dspark-stock": ("dspark-b8", frozenset({"expand_batch_to_tokens"}), False),
        "dspark-silent": ("dspark-b8", None, True),
        "ngram": ("ngram-k8", frozenset({K0_SKIP_NGRAM}), True),
        "eagle": ("eagle3-k4", frozenset({K0_SKIP_NGRAM}), False),
    }
    for name, (profile, fixes, _) in cases.items():
        est.ensure(name, profile, ReplicaCost.for_names(profile=profile)).engine_fixes = fixes
    views = {v.name: v for v in replica_views(est, {})}
    assert {n: v.k0_skips_pass for n, v in views.items()} == {n: c[2] for n, c in cases.items()}


def test_a_k0_cell_counts_as_drafting_where_the_replica_s_k0_steps_run_the_pass():
    """The plugin labels a cell by the step's draft length; where the replica reports
    no K=0 skip for its method, a K=0 step ran the drafter's pass too, and its cell is
    merged into the drafting one of its shape. Where the skip is in force (or the
    replica reports no fixes: the plugin's), and on an `off` replica, cells stay."""
    from contract.knobs import K0_SKIP_V2_DFLASH
    from controller.estimators import passes_run

    cells = {(64, 64, 0): StepCell(10, 0.2, 640, 640, 0), (64, 256, 1): StepCell(5, 0.15, 320, 1280, 960),
             (64, 64, 1): StepCell(2, 0.05, 128, 128, 0)}
    stock = passes_run(cells, "dspark", frozenset({"expand_batch_to_tokens"}))
    assert set(stock) == {(64, 64, 1), (64, 256, 1)}
    assert stock[(64, 64, 1)].values() == pytest.approx((12, 0.25, 768, 768, 0))
    assert stock[(64, 256, 1)] == cells[(64, 256, 1)]
    assert passes_run(cells, "eagle3", None).keys() == stock.keys()  # EAGLE's first forward always runs
    for method, fixes in (("dspark", frozenset({K0_SKIP_V2_DFLASH})), ("dspark", None), ("off", frozenset())):
        assert passes_run(cells, method, fixes) == cells


def test_the_learner_finds_the_pass_of_a_replica_whose_k0_steps_still_run_it():
    """A stock V2 DSpark replica (no K=0 skip in force) running every step with the
    pass, its tenants capped at 0 in half of them: read as labelled, the K=0 half
    looked like plain decode steps as dear as drafting ones, and the learner put the
    pass into the per-request term, pricing a step without it (an `off` replica) at
    nearly a drafting one's cost. Read as drafting, the pass is left to the drafter's
    prior and `off` is priced below it."""
    from controller.costs import ReplicaCost
    from controller.estimators import ReplicaEstimator
    from controller.signals import ReplicaSample

    flat, slope, knee, pass_per_request = 0.005, 60e-6, 90.0, 110e-6  # the truth: every step runs the pass

    def step(batch: int, tokens: int) -> float:
        return flat + slope * max(0.0, tokens - knee) + pass_per_request * batch

    est, cost = ReplicaEstimator(), ReplicaCost.for_names(profile="dspark-b8")
    est.ensure("r", "dspark-b8", cost)
    for i in range(60):
        batch = (16, 32, 64, 128)[i % 4]
        # Per interval, 50 steps capped at 0 (label 0) and 50 drafting 2 tokens a request (label 1).
        cells = {(batch, 2 ** (t - 1).bit_length(), int(d)): StepCell(50, 50 * step(batch, t), 50 * batch, 50 * t,
                                                                        50 * (t - batch))
                 for d, t in ((False, batch), (True, 3 * batch))}
        est.update(ReplicaSample("r", dt_s=1.0, running=batch, waiting=0, kv_usage=0.1, drafts=50 * batch,
                                 draft_tokens=100 * batch, accepted_tokens=50 * batch, iteration_tokens=200 * batch,
                                 iterations=100, generation_tokens=100 * batch, supports_knobs=True,
                                 engine_fixes=frozenset({"expand_batch_to_tokens"}), engine_steps=cells))
    with_pass, without = cost.step_time_s(128, 128, 8, 1024.0), cost.step_time_s(128, 128, 0, 1024.0)
    truth_pass = pass_per_request * 128
    assert with_pass - without >= 0.5 * truth_pass
    assert without <= step(128, 128) - 0.5 * truth_pass
