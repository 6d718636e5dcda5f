"""Controller-triggered drafter training: the edge around the pure rule
(`controller/decision/training.py`).

The leader, every tick (settings `controller.training`, off by default):
count each opted-in tenant's samples captured since its last job in the
capture store, ask the rule whether a job is due, and start at most one
`specgate drafter train` subprocess (the same command an operator runs: it
finds an interpreter with torch, writes a speculators checkpoint with
`eval.json` atomically). The job's outcome is written to the store when the
process ends -- by the task that waits for it, not by a later tick, so a
leadership change does not lose it -- and audited (`training_start`,
`training_finish`, `training_fail`).

A finished job leaves a *candidate*: checkpoint `OUT_ROOT/<tenant>-<job id>`,
drafter id `<tenant>-<job id>`, offline acceptance new vs current. Serving it
(a replica with `drafter: <id>`) and starting its canary stay with the
operator: the controller does not start inference servers.

Warm start: from the tenant's promoted drafter when a job of this controller
produced it (its checkpoint is known), else from `training.init_from` (the
fleet drafter), else a fresh drafter.

The state is one store document (`contract.keys.TRAINING_KEY`),
`{tenant: TenantTraining}`; read-modify-write as with rollouts (admin writes
are human-paced, the leader is the only other writer).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Iterable, Literal, Mapping

from pydantic import BaseModel, Field

from contract.keys import TRAINING_KEY
from contract.settings import TrainingSettings
from contract.store import Store
from contract.store.tenant_docs import load_docs, save_doc

from .audit import audit
from .decision.training import TrainingInputs, TrainingVerdict, training_due
from .metrics import ControllerMetrics
from .rollout import TenantDrafters

log = logging.getLogger("specgate.controller.training")

PAST_MAX = 20  # earlier jobs kept per tenant
STALE_GRACE_S = 600.0  # a job of another instance older than its time bound + this is given up

JobState = Literal["running", "succeeded", "failed"]


class TrainingJob(BaseModel):
    id: str
    tenant: str
    drafter: str  # the candidate's drafter id (replicas[].drafter once served)
    state: JobState = "running"
    reason: str = ""  # why it started
    started_at: float
    started_by: str
    owner: str  # the controller instance whose process runs it
    new_samples: int = 0
    checkpoint: str
    init_from: str | None = None
    finished_at: float | None = None
    result: dict | None = None  # the trainer's summary (steps, losses, offline acceptance new vs current)
    error: str | None = None
    log: str | None = None  # the trainer's progress and errors

    @property
    def running(self) -> bool:
        return self.state == "running"


class TenantTraining(BaseModel):
    requested_by: str | None = None  # an admin asked for a job; cleared when it starts
    requested_at: float | None = None
    job: TrainingJob | None = None  # the latest
    past: list[TrainingJob] = Field(default_factory=list)  # newest first


# -- the store document --------------------------------------------------------


async def load(store: Store) -> dict[str, TenantTraining]:
    return await load_docs(store, TRAINING_KEY, TenantTraining)


async def save_one(store: Store, tenant: str, doc: TenantTraining) -> None:
    await save_doc(store, TRAINING_KEY, TenantTraining, tenant, doc)


def with_job(doc: TenantTraining, job: TrainingJob) -> TenantTraining:
    """`doc` with `job` as its latest (the previous one moves to `past`)."""
    past = doc.past
    if doc.job is not None and doc.job.id != job.id:
        past = [doc.job, *past][:PAST_MAX]
    return doc.model_copy(update={"job": job, "past": past})


def request(doc: TenantTraining, who: str, now: float) -> TenantTraining:
    return doc.model_copy(update={"requested_by": who, "requested_at": now})


def warm_start(tenant_drafters: TenantDrafters | None, doc: TenantTraining, fleet_init: str | None) -> str | None:
    """The checkpoint a new job starts from: the tenant's promoted drafter when
    one of our jobs produced it, else the fleet drafter (None: fresh)."""
    promoted = tenant_drafters.drafter if tenant_drafters is not None else None
    if promoted:
        for job in [doc.job, *doc.past]:
            if job is not None and job.state == "succeeded" and job.drafter == promoted:
                return job.checkpoint
    return fleet_init


def train_command(settings: TrainingSettings, tenant: str, out: str, init_from: str | None) -> list[str]:
    """The `specgate drafter train` command line of one job."""
    cmd = [sys.executable, "-m", "specgate.cli", "drafter", "train", "--tenant", tenant, "--store", settings.store_root,
           "--target", settings.target, "--out", out, "--max-minutes", str(settings.max_minutes),
           "--max-steps", str(settings.max_steps)]  # fmt: skip
    if init_from:
        cmd += ["--init-from", init_from]
    if settings.python:
        cmd += ["--python", settings.python]
    return [*cmd, *settings.train_args]


def last_json_line(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return None


# -- the jobs ------------------------------------------------------------------


class TrainingJobs:
    """At most one training subprocess of this controller instance at a time."""

    def __init__(self, settings: TrainingSettings, store: Store, owner: str, metrics: ControllerMetrics | None = None) -> None:
        self.settings = settings
        self.store = store
        self.owner = owner
        self.metrics = metrics
        self._task: asyncio.Task | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self.last_verdicts: dict[str, TrainingVerdict] = {}

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def tick(self, opted_in: Iterable[str], rollouts: Mapping[str, TenantDrafters], now: float | None = None) -> TrainingJob | None:
        """Start the first due job (None when none is); give up jobs whose process is gone."""
        now = time.time() if now is None else now
        docs = await load(self.store)
        docs = await self._give_up_orphans(docs, now)
        if self.running:
            return None
        opted_in = list(opted_in)
        since = {t: docs[t].job.started_at if t in docs and docs[t].job is not None else None for t in opted_in}
        # A directory walk (stat per sample) or Redis round trips: off the event loop, which may be an embedding gateway's.
        counts = await asyncio.to_thread(self._count_new, since)
        for tenant in opted_in:
            doc = docs.get(tenant, TenantTraining())
            last = doc.job
            canary = rollouts.get(tenant)
            inputs = TrainingInputs(
                tenant=tenant, opted_in=True, new_samples=counts[tenant],
                last_started_at=last.started_at if last is not None else None,
                requested=doc.requested_by is not None, job_running=any(d.job is not None and d.job.running for d in docs.values()),
                canary_running=canary is not None and canary.rollout is not None and canary.rollout.running,
            )  # fmt: skip
            verdict = training_due(inputs, min_new_samples=self.settings.min_new_samples,
                                   min_interval_s=self.settings.min_interval_s, now=now)
            self.last_verdicts[tenant] = verdict
            if verdict.due:
                return await self._start(tenant, doc, canary, inputs.new_samples, verdict.reason, now)
        return None

    def _count_new(self, since: dict[str, float | None]) -> dict[str, int]:
        from drafters.capture.backends import open_store

        samples = open_store(self.settings.store_root)
        try:
            return {tenant: samples.count(tenant, since=at) for tenant, at in since.items()}
        finally:
            samples.close()

    async def _start(self, tenant: str, doc: TenantTraining, drafters: TenantDrafters | None, new_samples: int,
                     reason: str, now: float) -> TrainingJob:
        job_id = f"{time.strftime('%Y%m%d%H%M%S', time.gmtime(now))}-{uuid.uuid4().hex[:6]}"
        out = str(Path(self.settings.out_root) / f"{tenant}-{job_id}")
        init_from = warm_start(drafters, doc, self.settings.init_from)
        job = TrainingJob(
            id=job_id, tenant=tenant, drafter=f"{tenant}-{job_id}", reason=reason, started_at=now,
            started_by=doc.requested_by or f"controller:{self.owner}", owner=self.owner, new_samples=new_samples,
            checkpoint=out, init_from=init_from, log=f"{out}.log",
        )  # fmt: skip
        await save_one(self.store, tenant, with_job(doc, job).model_copy(update={"requested_by": None, "requested_at": None}))
        await audit(self.store, job.started_by, "training_start", tenant,
                    {"job": job.id, "drafter": job.drafter, "reason": reason, "checkpoint": out, "init_from": init_from})
        log.info("training %s for %s: %s", job.drafter, tenant, reason)
        self._count("started")
        self._task = asyncio.create_task(self._run(job, train_command(self.settings, tenant, out, init_from)))
        return job

    async def _run(self, job: TrainingJob, cmd: list[str]) -> None:
        stdout = b""
        error = None
        try:
            Path(job.checkpoint).parent.mkdir(parents=True, exist_ok=True)
            with open(job.log, "wb") as logfile:
                self._proc = await asyncio.create_subprocess_exec(
                    *cmd, stdout=asyncio.subprocess.PIPE, stderr=logfile, env={**os.environ, "PYTHONUNBUFFERED": "1"}
                )
                stdout, _ = await self._proc.communicate()
            if self._proc.returncode != 0:
                error = f"trainer exited with status {self._proc.returncode}: {_tail(job.log)}"
        except asyncio.CancelledError:
            error = "controller stopped"
            if self._proc is not None and self._proc.returncode is None:
                self._proc.terminate()
                try:
                    await asyncio.wait_for(self._proc.wait(), 10)
                except asyncio.TimeoutError:
                    self._proc.kill()
            await self._finish(job, None, error)
            raise
        except OSError as exc:
            error = f"trainer did not start: {exc}"
        await self._finish(job, None if error else last_json_line(stdout.decode(errors="replace")), error)

    async def _finish(self, job: TrainingJob, result: dict | None, error: str | None) -> None:
        if error is None and result is None:
            error = "trainer printed no result"
        done = job.model_copy(update={"state": "failed" if error else "succeeded", "finished_at": time.time(),
                                      "result": result, "error": error})  # fmt: skip
        doc = (await load(self.store)).get(job.tenant, TenantTraining())
        await save_one(self.store, job.tenant, with_job(doc, done))  # replaces the job in place when it is the latest
        action = "training_fail" if error else "training_finish"
        detail = {"job": job.id, "drafter": job.drafter, "checkpoint": job.checkpoint}
        detail.update({"error": error} if error else {k: (result or {}).get(k) for k in ("step", "stopped", "acceptance_current", "acceptance_new")})
        await audit(self.store, f"controller:{self.owner}", action, job.tenant, detail)
        log.info("%s %s %s: %s", action, job.tenant, job.drafter, error or detail)
        self._count("failed" if error else "succeeded")

    def _count(self, outcome: str) -> None:
        if self.metrics is not None:
            self.metrics.training_jobs.labels(outcome).inc()

    async def _give_up_orphans(self, docs: dict[str, TenantTraining], now: float) -> dict[str, TenantTraining]:
        """Running jobs nobody waits for: ours without a task (a restart) or
        another instance's past their time bound (it died or lost its process)."""
        bound = self.settings.max_minutes * 60 + STALE_GRACE_S
        for tenant, doc in list(docs.items()):
            job = doc.job
            if job is None or not job.running:
                continue
            ours_gone = job.owner == self.owner and not self.running
            stale = job.owner != self.owner and now - job.started_at > bound
            if ours_gone or stale:
                why = "its controller restarted" if ours_gone else f"no result {bound:.0f} s after it started"
                await self._finish(job, None, f"given up: {why}")
                docs = await load(self.store)
        return docs

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001 -- shutting down; _run recorded it
                pass


def _tail(path: str | None, chars: int = 600) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:].strip() if path else ""
    except OSError:
        return ""
