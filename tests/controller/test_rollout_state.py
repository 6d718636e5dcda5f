"""The rollout document's transitions and arms (controller/rollout.py), pure: no store."""

from __future__ import annotations

import pytest

from contract.policy import CanarySpec, CaptureSpec, SpeculationPolicy
from contract.settings import ReplicaConfig, RolloutSettings
from contract.telemetry import TelemetryCounters
from controller import rollout as ro
from controller.decision.rollout import RolloutVerdict

REPLICAS = [ReplicaConfig(name="a", url="http://127.0.0.1:1"), ReplicaConfig(name="b", url="http://127.0.0.1:2"),
            ReplicaConfig(name="c", url="http://127.0.0.1:3", drafter="t-v2")]


def counters(tenant: str, replica: str, n: float, mean: float) -> TelemetryCounters:
    return TelemetryCounters(tenant, replica, {"requests": n, "al_requests": n, "al_sum": n * mean,
                                               "al_sumsq": n * mean * mean, "num_spec_steps": 10 * n})


def test_start_refusals():
    empty = ro.TenantDrafters()
    doc = ro.start(empty, "t-v2", 0.25, now=100.0, by="alice", replicas=REPLICAS, baseline={})
    assert doc.canary == CanarySpec(drafter="t-v2", share=0.25) and doc.rollout.started_by == "alice"
    with pytest.raises(ro.RolloutRefused) as e:
        ro.start(doc, "t-v2", 0.25, now=101.0, by="bob", replicas=REPLICAS, baseline={})
    assert e.value.status == 409
    with pytest.raises(ro.RolloutRefused) as e:
        ro.start(empty, "t-v9", 0.25, now=101.0, by="bob", replicas=REPLICAS, baseline={})
    assert e.value.status == 400 and "no configured replica" in str(e.value)
    with pytest.raises(ro.RolloutRefused) as e:
        ro.start(ro.TenantDrafters(rolled_back=["t-v2"]), "t-v2", 0.25, now=1.0, by="x", replicas=REPLICAS, baseline={})
    assert e.value.status == 400 and "rolled back" in str(e.value)
    with pytest.raises(ro.RolloutRefused) as e:
        ro.start(ro.TenantDrafters(drafter="t-v2"), "t-v2", 0.25, now=1.0, by="x", replicas=REPLICAS, baseline={})
    assert e.value.status == 400


def test_arms_count_from_the_baseline_and_split_by_the_candidates_replicas():
    before = [counters("t", "a", 50, 1.5), counters("t", "c", 40, 1.1), counters("u", "c", 9, 3.0)]
    doc = ro.start(ro.TenantDrafters(), "t-v2", 0.3, now=0.0, by="x", replicas=REPLICAS, baseline=ro.baseline_of(before, "t"))
    assert set(doc.rollout.baseline) == {"a", "c"}  # only this tenant's counters
    after = [counters("t", "a", 80, 1.5), counters("t", "b", 20, 2.0), counters("t", "c", 70, 1.1 * 40 / 70 + 3.0 * 30 / 70),
             counters("u", "c", 500, 3.0)]
    cand, inc = ro.arms(doc.rollout, "t", after, REPLICAS)
    assert cand.al_requests == pytest.approx(30) and cand.mean == pytest.approx(3.0)  # only the 30 new requests on c
    assert inc.al_requests == pytest.approx(50)  # 30 new on a, 20 on b (new replica: no baseline)
    assert inc.mean == pytest.approx((30 * 1.5 + 20 * 2.0) / 50)
    # Counters that went backwards were reset: everything now on that replica is new.
    cand, _ = ro.arms(doc.rollout, "t", [counters("t", "c", 12, 2.0)], REPLICAS)
    assert cand.al_requests == 12


def test_verdicts_promote_roll_back_and_abort():
    doc = ro.start(ro.TenantDrafters(drafter="t-v1"), "t-v2", 0.3, now=0.0, by="x", replicas=REPLICAS, baseline={})
    up = ro.conclude(doc, RolloutVerdict("promote", "better", {"diff": 1}), now=9.0, by="ctl")
    assert up.drafter == "t-v2" and up.rollout.state == "promoted" and up.canary is None and up.rollout.stats == {"diff": 1}
    assert up.note == "drafter t-v2 promoted: better"
    down = ro.conclude(doc, RolloutVerdict("rollback", "worse", {}), now=9.0, by="ctl")
    assert down.drafter == "t-v1" and down.rolled_back == ["t-v2"] and down.canary is None
    assert ro.conclude(doc, RolloutVerdict("wait", "more", {}), now=9.0, by="ctl") == doc
    gone = ro.abort(doc, now=5.0, by="bob", note="maintenance")
    assert gone.rollout.state == "aborted" and gone.rolled_back == [] and gone.note == "canary t-v2 aborted by bob: maintenance"
    with pytest.raises(ro.RolloutRefused):
        ro.abort(gone, now=6.0, by="bob")
    # The tick's re-check: a verdict on a canary that was aborted meanwhile is not written.
    assert ro.same_canary(doc, doc) and not ro.same_canary(gone, doc)
    again = ro.start(gone, "t-v2", 0.3, now=10.0, by="x", replicas=REPLICAS, baseline={})
    assert not ro.same_canary(again, doc) and [p.state for p in again.past] == ["aborted"]


def test_step_judges_running_canaries_only_when_enabled():
    doc = ro.start(ro.TenantDrafters(), "t-v2", 0.3, now=0.0, by="x", replicas=REPLICAS, baseline={})
    worse = [TelemetryCounters("t", "c", {"al_requests": 40, "al_sum": 40 * 1.2, "al_sumsq": 40 * 1.2**2 + 0.4}),
             TelemetryCounters("t", "a", {"al_requests": 40, "al_sum": 40 * 2.0, "al_sumsq": 40 * 2.0**2 + 0.4})]
    cfg = RolloutSettings(min_requests=30)
    s = ro.step({"t": doc}, worse, REPLICAS, cfg, now=60.0, by="ctl", tenants={"t"})
    assert s.verdicts["t"].verdict == "rollback" and s.docs["t"].rolled_back == ["t-v2"] and "t" in s.ended
    off = ro.step({"t": doc}, worse, REPLICAS, cfg.model_copy(update={"enabled": False}), now=60.0, by="ctl", tenants={"t"})
    assert off.verdicts == {} and off.docs["t"] == doc


def test_carried_fields():
    configured = {"t": SpeculationPolicy(capture=CaptureSpec(fraction=0.2), drafter="t-cfg"), "u": None}
    doc = ro.start(ro.TenantDrafters(), "t-v2", 0.3, now=0.0, by="x", replicas=REPLICAS, baseline={})
    c = ro.carried(["t", "u"], {"t": doc}, configured)
    assert c["t"].drafter == "t-cfg" and c["t"].canary == CanarySpec(drafter="t-v2", share=0.3)
    assert c["t"].capture == CaptureSpec(fraction=0.2) and c["t"].note.startswith("canary t-v2")
    assert (c["u"].drafter, c["u"].canary, c["u"].capture) == (None, None, None)
    promoted = ro.conclude(doc, RolloutVerdict("promote", "better", {}), now=1.0, by="ctl")
    assert ro.carried(["t"], {"t": promoted}, configured)["t"].drafter == "t-v2"  # the promotion wins over the config
