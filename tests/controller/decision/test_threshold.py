"""The load threshold (max_batch) search on its own."""

from __future__ import annotations

from controller.decision import DecisionConfig, LoadThresholds, spec_max_batch
from controller.decision import threshold as thr

from .common import model, replica

CHOICE = {"code": 16, "chat": 4, "*": 16}
MIX = {"code": 0.5, "chat": 0.5}


def test_threshold_lies_on_the_grid_where_everyone_off_starts_to_win():
    cfg = DecisionConfig()
    m = model()
    mb = spec_max_batch(m, replica(4, MIX), CHOICE, cfg)
    assert mb in cfg.max_batch_grid and mb >= 4
    above = cfg.max_batch_grid[cfg.max_batch_grid.index(mb) + 1]
    at_next = replica(above, MIX)
    off = {t: 0 for t in CHOICE}
    assert m.goodput(at_next, off) >= m.goodput(at_next, CHOICE) * (1 + cfg.off_margin)
    at_mb = replica(mb, MIX)
    assert m.goodput(at_mb, off) < m.goodput(at_mb, CHOICE) * (1 + cfg.off_margin)


def test_no_threshold_without_a_grid_a_drafter_or_a_crossing():
    m = model()
    assert spec_max_batch(m, replica(4, MIX), CHOICE, DecisionConfig(max_batch_grid=None)) is None
    assert spec_max_batch(m, replica(4, MIX, profile="off", block=0), CHOICE, DecisionConfig()) is None
    assert spec_max_batch(model(acc={"code": 0.99}), replica(1, {"code": 1.0}), {"code": 4, "*": 4},
                          DecisionConfig(max_batch_grid=(2, 3))) is None


def test_search_starts_at_todays_batch():
    cfg = DecisionConfig(max_batch_grid=(4, 8, 16, 32, 64, 128, 256, 512))
    m = model()
    # Grid points below today's batch (100) are where the replica runs: the
    # first crossing above it (128) gives the last point below it.
    assert spec_max_batch(m, replica(100, {"chat": 1.0}), {"chat": 16, "*": 16}, cfg) == 64


def test_thresholds_are_memoised_per_replica_and_joint_choice(monkeypatch):
    calls = []
    real = thr.spec_max_batch
    monkeypatch.setattr(thr, "spec_max_batch", lambda *a: calls.append(a[1].name) or real(*a))
    lt = LoadThresholds(model(), DecisionConfig())
    reps = [replica(4, MIX), replica(4, MIX, name="r2", knobs=False), replica(4, MIX, profile="off", block=0, name="p")]
    first = lt.for_choice(CHOICE, reps)
    assert lt.for_choice(dict(reversed(list(CHOICE.items()))), reps) == first
    assert calls == ["r1"]  # knob-less and off replicas never carry a threshold
    lt.for_choice({**CHOICE, "chat": 0}, reps)
    assert calls == ["r1", "r1"]
