"""ControlCore: what it folds in from each replica scrape besides the replica's own estimate."""

from __future__ import annotations

import pytest

from contract.policy import ProbeSpec, SpeculationPolicy
from contract.telemetry import TelemetryCounters
from contract.vllm_metrics import StepCell, VllmMetricsSnapshot
from controller.core import ControlCore
from controller.decision import TenantState

from .test_estimators import _proposals

# One interval's engine-timed steps: 100 steps of ~30 requests, 100 of ~10.
CELLS = {(32, 64, 0): StepCell(steps=100, seconds=5.0, requests=3000, tokens=3000),
         (16, 16, 1): StepCell(steps=100, seconds=3.0, requests=1000, tokens=3000)}


def _core(policy: SpeculationPolicy) -> ControlCore:
    core = ControlCore()
    core.tenants.update([_proposals("greedy", 20_000, 0.1, 0.7)], methods={"ng": "ngram"})
    core.state = {"greedy": TenantState(k=8, policy=policy)}
    core.observe_replica("ng", "ngram-k8", 0.0, VllmMetricsSnapshot(num_requests_running=20))
    core.observe_replica("ng", "ngram-k8", 1.0, VllmMetricsSnapshot(num_requests_running=20, engine_steps=CELLS))
    return core


def _capped_share(core: ControlCore) -> float:
    s = core.tenants.method_sums[("greedy", "ngram")]
    return s.capped_weight / s.counted_weight


def test_a_scrape_counts_the_request_steps_the_tenants_schedule_capped_at_zero():
    core = _core(SpeculationPolicy(max_draft=8, schedule=((24, 8),)))
    assert _capped_share(core) == pytest.approx(0.75)
    assert core.tenants.method_proposal("greedy")["ngram"].rate > 0.3  # 0.1 over all its steps, 0.4 where it could draft


def test_an_exploring_tenant_is_counted_by_its_probe_arm():
    exploring = SpeculationPolicy(enabled=False, max_draft=0, probe=ProbeSpec(share=0.05, schedule=((12, 8),)))
    assert _capped_share(_core(exploring)) == pytest.approx(0.75)
    uncapped = _core(SpeculationPolicy())
    assert _capped_share(uncapped) == 0.0


def test_a_scrape_counts_the_request_steps_whose_cap_allowed_each_draft_position():
    """The ~10-request steps run at the schedule's 8, the ~30-request ones at 2 (an
    uncapped policy: the replica's block, K=8 from its profile)."""
    core = _core(SpeculationPolicy(max_draft=8, schedule=((16, 8), (64, 2))))
    s = core.tenants.method_sums[("greedy", "ngram")]
    assert s.cap_shares()[:9] == pytest.approx([1.0, 1.0, *[0.25] * 6, 0.0])
    uncapped = _core(SpeculationPolicy()).tenants.method_sums[("greedy", "ngram")]
    assert uncapped.cap_shares()[:9] == pytest.approx([1.0] * 8 + [0.0])


def test_the_gateways_counters_keep_the_traffic_mix_over_an_idle_spell():
    """The telemetry a tick reads says which replicas served; only their mix ages
    (`TenantEstimator.decay`), so a controller that saw no traffic for minutes -- or
    was paused -- prices its tenants at the mix they had, not at the share floor."""
    core = ControlCore()
    totals = {("a", "r"): 0.0, ("b", "r"): 0.0}

    def tick(dt_s: float, **tokens: float) -> None:
        for tenant, n in tokens.items():
            totals[(tenant, "r")] += n
        core.observe_telemetry([TelemetryCounters(t, r, {"requests": v / 64, "completion_tokens": v})
                                for (t, r), v in totals.items()], dt_s)

    tick(0.0)  # the first read is the baseline
    for _ in range(10):
        tick(1.0, a=64, b=64)
    assert core.tenants.replica_mix()["r"]["b"] == pytest.approx(0.5, abs=0.01)
    for _ in range(300):
        tick(1.0)  # five idle minutes: nothing finished anywhere
    tick(1.0, a=64)  # the first completion after the spell
    assert core.tenants.replica_mix()["r"]["b"] > 0.4
