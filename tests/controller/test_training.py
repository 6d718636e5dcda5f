"""Controller-triggered drafter training (controller/training.py): the leader's
tick, the job record in the store, the audit log and the admin route.

Real parts: Redis, `Controller.tick`, the admin app over loopback HTTP, the
`specgate drafter train` subprocess. Here the trainer is pointed at this
environment's interpreter, which has no torch, so every job fails the way a
misconfigured host fails (the successful job, with torch, a real capture store
and a real checkpoint, is tests/drafters/training/test_controller_job.py).
The capture store holds placeholder files: the controller only counts them.
"""

from __future__ import annotations

import contextlib
import sys
import uuid

import httpx
import pytest

from contract.settings import Settings, hash_key
from controller import training
from controller.service import Controller
from drafters.capture.store import SampleStore
from tests.controller.conftest import ADMIN_KEY, TENANT_KEYS
from tests.controller.servers import controller_with_admin
from tests.vllm_support.mooncake_fixtures import (  # noqa: F401
    mooncake_cluster,
    mooncake_ops,
    mooncake_store_spec,
)

ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}", "X-Admin-User": "alice"}


def settings_for(tmp_path, redis_url: str, prefix: str, **training_cfg) -> Settings:
    tenants = [{"id": t, "api_key_sha256": hash_key(k)} for t, k in TENANT_KEYS.items()]
    tenants[0]["speculation"] = {"capture": {"fraction": 0.5, "max_per_hour": 100}}  # alpha opted in; beta, bulk not
    cfg = {"enabled": True, "store_root": str(tmp_path / "store"), "target": str(tmp_path / "target"),
           "out_root": str(tmp_path / "drafters"), "python": sys.executable, "min_new_samples": 3,
           "min_interval_s": 3600, "max_minutes": 1, "max_steps": 2, **training_cfg}
    return Settings(
        replicas=[{"name": "r0", "url": "http://127.0.0.1:9", "profile": "dspark-b8"}],
        tenants=tenants, admin_key=ADMIN_KEY, redis_url=redis_url, redis_prefix=prefix,
        controller={"tick_s": 0.2, "instance_id": "ctl-a", "training": cfg},
    )


def capture(tmp_path, tenant: str, n: int) -> None:
    store = SampleStore(tmp_path / "store")
    for _ in range(n):
        store.put_bytes(tenant, f"req-{uuid.uuid4().hex}", b"x" * 64)


@contextlib.asynccontextmanager
async def rig(tmp_path, redis_url: str, prefix: str, **training_cfg):
    settings = settings_for(tmp_path, redis_url, prefix, **training_cfg)
    async with controller_with_admin(settings, redis_url, prefix, ADMIN) as (store, ctl, http):
        yield store, ctl, http


async def job_of(store, tenant: str) -> training.TrainingJob | None:
    return (await training.load(store)).get(tenant, training.TenantTraining()).job


async def wait_job(ctl: Controller) -> None:
    if ctl.training._task is not None:
        await ctl.training._task


def metric(ctl: Controller, name: str, **labels: str) -> float | None:
    return ctl.metrics.registry.get_sample_value(name, labels)


async def audit_actions(http: httpx.AsyncClient) -> list[tuple[str, str]]:
    return [(e["action"], e["target"]) for e in (await http.get("/admin/audit")).json()["data"]]


async def test_a_job_starts_for_an_opted_in_tenant_with_enough_samples_and_its_failure_is_recorded(tmp_path, redis_url, redis_prefix):
    capture(tmp_path, "alpha", 2)
    capture(tmp_path, "beta", 10)  # never opted in: never trained, whatever it has
    async with rig(tmp_path, redis_url, redis_prefix) as (store, ctl, http):
        await ctl.tick()
        assert await job_of(store, "alpha") is None and await job_of(store, "beta") is None
        assert "2 new samples < 3" in ctl.training.last_verdicts["alpha"].reason
        assert "beta" not in ctl.training.last_verdicts

        capture(tmp_path, "alpha", 2)
        await ctl.tick()
        job = await job_of(store, "alpha")
        assert job is not None and job.running and job.new_samples == 4 and job.started_by == "controller:ctl-a"
        assert job.drafter == f"alpha-{job.id}" and job.checkpoint.startswith(str(tmp_path / "drafters" / "alpha-"))
        assert metric(ctl, "specgate_controller_training_running") == 1.0
        await ctl.tick()  # one job at a time: nothing new while it runs
        await wait_job(ctl)
        assert metric(ctl, "specgate_controller_training_jobs_total", outcome="started") == 1.0
        assert metric(ctl, "specgate_controller_training_jobs_total", outcome="failed") == 1.0
        assert metric(ctl, "specgate_controller_training_jobs_total", outcome="succeeded") is None

        job = await job_of(store, "alpha")
        assert job.state == "failed" and job.finished_at is not None
        assert "torch" in job.error  # the trainer's own message: no interpreter with torch and speculators
        assert [a for a in await audit_actions(http) if a[1] == "alpha"] == [("training_fail", "alpha"), ("training_start", "alpha")]
        view = (await http.get("/admin/tenants/alpha/drafter")).json()
        assert view["training"]["job"]["state"] == "failed" and view["training"]["job"]["id"] == job.id

        capture(tmp_path, "alpha", 5)
        await ctl.tick()  # enough new samples, but the interval since the last job has not passed
        assert (await job_of(store, "alpha")).id == job.id
        assert "next in" in ctl.training.last_verdicts["alpha"].reason
        assert metric(ctl, "specgate_controller_training_running") == 0.0


async def test_an_admin_request_starts_a_job_on_the_next_tick(tmp_path, redis_url, redis_prefix):
    capture(tmp_path, "alpha", 1)
    async with rig(tmp_path, redis_url, redis_prefix) as (store, ctl, http):
        assert (await http.post("/admin/tenants/beta/drafter/train")).status_code == 400  # not opted in
        assert (await http.post("/admin/tenants/nobody/drafter/train")).status_code == 404
        r = await http.post("/admin/tenants/alpha/drafter/train", json={"note": "new product launch"})
        assert r.status_code == 200 and r.json()["requested_by"].startswith("alice@")
        await ctl.tick()
        job = await job_of(store, "alpha")
        assert job is not None and job.started_by.startswith("alice@") and job.new_samples == 1
        assert (await http.post("/admin/tenants/alpha/drafter/train")).status_code == 409  # its job runs
        await wait_job(ctl)
        doc = (await training.load(store))["alpha"]
        assert doc.requested_by is None and doc.job.state == "failed"
        assert ("training_request", "alpha") in await audit_actions(http)


async def test_a_running_job_whose_process_is_gone_is_given_up(tmp_path, redis_url, redis_prefix):
    async with rig(tmp_path, redis_url, redis_prefix) as (store, ctl, http):
        orphan = training.TrainingJob(id="j1", tenant="alpha", drafter="alpha-j1", started_at=1.0, started_by="x",
                                      owner="ctl-a", checkpoint=str(tmp_path / "drafters" / "alpha-j1"))
        await training.save_one(store, "alpha", training.TenantTraining(job=orphan))
        await ctl.tick()  # ctl-a restarted: nothing waits for j1
        job = await job_of(store, "alpha")
        assert job.id == "j1" and job.state == "failed" and "controller restarted" in job.error


async def test_training_off_refuses_requests(tmp_path, redis_url, redis_prefix):
    async with rig(tmp_path, redis_url, redis_prefix, enabled=False, target="") as (store, ctl, http):
        assert ctl.training is None
        r = await http.post("/admin/tenants/alpha/drafter/train")
        assert r.status_code == 409 and "controller.training.enabled" in r.json()["error"]["message"]


def test_enabled_training_needs_a_target(tmp_path):
    with pytest.raises(ValueError, match="controller.training.target"):
        settings_for(tmp_path, "redis://127.0.0.1:6379/0", "p:", target="")


def test_warm_start_prefers_the_tenants_promoted_drafter_from_a_job():
    from controller.rollout import TenantDrafters

    done = training.TrainingJob(id="j1", tenant="a", drafter="a-j1", state="succeeded", started_at=1.0, started_by="x",
                                owner="o", checkpoint="/ckpt/a-j1")
    doc = training.TenantTraining(job=done)
    assert training.warm_start(TenantDrafters(drafter="a-j1"), doc, "/fleet") == "/ckpt/a-j1"
    assert training.warm_start(TenantDrafters(drafter="hand-made"), doc, "/fleet") == "/fleet"
    assert training.warm_start(None, training.TenantTraining(), None) is None


async def test_samples_in_a_mooncake_store_are_counted_from_its_index(tmp_path, redis_url, redis_prefix, mooncake_store_spec):  # noqa: F811
    # A real Mooncake Store (master + store node) holds the samples; the controller,
    # in this venv without the Mooncake client, counts them from the store's Redis index.
    put = [["put", "alpha", f"req-{i}", 8, i] for i in range(2)] + [["put", "beta", "req-b", 8, 9]]
    mooncake_ops(mooncake_store_spec, put)
    async with rig(tmp_path, redis_url, redis_prefix, store_root=mooncake_store_spec) as (store, ctl, _http):
        await ctl.tick()
        assert "2 new samples < 3" in ctl.training.last_verdicts["alpha"].reason
        mooncake_ops(mooncake_store_spec, [["put", "alpha", "req-2", 8, 2]])
        await ctl.tick()
        job = await job_of(store, "alpha")
        assert job is not None and job.new_samples == 3
        await wait_job(ctl)
        assert "beta" not in ctl.training.last_verdicts
