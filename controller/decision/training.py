"""When a tenant's drafter is worth (re)training: a pure rule.

Training is the expensive step of the drafter loop (minutes to hours of an
accelerator), and a new drafter is only worth proving on live traffic when it
saw traffic the current one did not. So a job is due for a tenant when

* the tenant opted in to capture (its policy carries `capture`): other tenants
  have no samples and never get a drafter of their own;
* no job of this controller runs (one at a time: training shares the host
  with the capture store and, on a CPU box, with everything else);
* no canary of the tenant runs (a new candidate would race the one being
  proved; the verdict comes first);
* at least `min_new_samples` samples were captured since its last job started
  (all of them for a first job), and
* `min_interval_s` passed since its last job started,

or when an admin asked for one (`POST /admin/tenants/{t}/drafter/train`): a
request skips the sample and interval thresholds, never the first three.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TrainingInputs:
    tenant: str
    opted_in: bool
    new_samples: int  # captured since the last job started (all, for a first job)
    last_started_at: float | None  # epoch s of the tenant's last job
    requested: bool  # an admin asked for a job
    job_running: bool  # any job of this controller runs now
    canary_running: bool  # the tenant's canary is being proved


@dataclass(frozen=True)
class TrainingVerdict:
    due: bool
    reason: str


def training_due(inputs: TrainingInputs, *, min_new_samples: int, min_interval_s: float, now: float) -> TrainingVerdict:
    """Whether to start a training job for `inputs.tenant` now, and why (not)."""
    if not inputs.opted_in:
        return TrainingVerdict(False, "tenant has not opted in to capture")
    if inputs.job_running:
        return TrainingVerdict(False, "another training job runs")
    if inputs.canary_running:
        return TrainingVerdict(False, "a canary of the tenant's drafter is being proved")
    if inputs.requested:
        return TrainingVerdict(True, f"requested by an admin ({inputs.new_samples} new samples)")
    if inputs.new_samples < min_new_samples:
        return TrainingVerdict(False, f"{inputs.new_samples} new samples < {min_new_samples}")
    if inputs.last_started_at is not None and now - inputs.last_started_at < min_interval_s:
        wait = min_interval_s - (now - inputs.last_started_at)
        return TrainingVerdict(False, f"last job started {now - inputs.last_started_at:.0f} s ago; next in {wait:.0f} s")
    return TrainingVerdict(True, f"{inputs.new_samples} new samples >= {min_new_samples}")
