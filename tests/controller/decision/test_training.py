"""The rule that says when a tenant's drafter is (re)trained (controller/decision/training.py)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from controller.decision.training import TrainingInputs, training_due

NOW = 1_000_000.0
BASE = TrainingInputs(tenant="t", opted_in=True, new_samples=500, last_started_at=None, requested=False,
                      job_running=False, canary_running=False)


def due(inputs: TrainingInputs, min_new_samples: int = 200, min_interval_s: float = 3600.0):
    return training_due(inputs, min_new_samples=min_new_samples, min_interval_s=min_interval_s, now=NOW)


def test_a_first_job_starts_once_enough_samples_were_captured():
    assert due(BASE).due
    verdict = due(replace(BASE, new_samples=199))
    assert not verdict.due and "199 new samples < 200" in verdict.reason


def test_a_later_job_waits_for_the_interval_and_for_new_samples():
    recent = replace(BASE, last_started_at=NOW - 600)
    verdict = due(recent)
    assert not verdict.due and "next in 3000 s" in verdict.reason
    assert due(replace(BASE, last_started_at=NOW - 3600)).due
    assert not due(replace(BASE, last_started_at=NOW - 7200, new_samples=10)).due


@pytest.mark.parametrize(
    "field, reason",
    [("opted_in", "not opted in"), ("job_running", "another training job"), ("canary_running", "canary")],
)
def test_nothing_starts_without_opt_in_beside_another_job_or_during_a_canary(field, reason):
    value = False if field == "opted_in" else True
    for requested in (False, True):  # an admin's request does not override these
        verdict = due(replace(BASE, requested=requested, **{field: value}))
        assert not verdict.due and reason in verdict.reason


def test_an_admin_request_skips_the_sample_and_interval_thresholds():
    verdict = due(replace(BASE, requested=True, new_samples=3, last_started_at=NOW - 1))
    assert verdict.due and "requested" in verdict.reason
