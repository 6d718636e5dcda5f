"""A controller-triggered training job that succeeds: the leader's tick starts
`specgate drafter train` for the opted-in tenant once it has enough captured
samples, the job writes a speculators checkpoint that `specgate checkpoint
validate` accepts for the target, and its record (offline acceptance, the
drafter id to serve) and audit entries land in the store; the tenant that did
not opt in gets no job.

Real parts: Redis, `Controller.tick`, the trainer subprocess with torch, the
HF-computed capture store of this package's fixtures. A two-step budget: the
training itself is tested in test_train.py.
"""

from __future__ import annotations

import json

import pytest

from contract.keys import AUDIT_KEY
from contract.settings import Settings, hash_key
from controller import training
from controller.service import Controller
from testbed import vllm_env

from .conftest import OTHER, TENANT, specgate

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


async def test_the_controller_trains_an_opted_in_tenants_drafter(capture_store, untrained_drafter, tiny_model_dir,
                                                                  tmp_path, redis_url, redis_prefix):
    from contract.store.redis_store import RedisStore

    settings = Settings(
        replicas=[{"name": "r0", "url": "http://127.0.0.1:9", "profile": "dspark-b4"}],
        tenants=[{"id": TENANT, "api_key_sha256": hash_key("sk-a"), "speculation": {"capture": {"fraction": 1.0, "max_per_hour": 1000}}},
                 {"id": OTHER, "api_key_sha256": hash_key("sk-b")}],
        redis_url=redis_url, redis_prefix=redis_prefix,
        controller={"instance_id": "ctl-train", "training": {
            "enabled": True, "store_root": str(capture_store), "target": str(tiny_model_dir),
            "out_root": str(tmp_path / "drafters"), "init_from": str(untrained_drafter), "python": str(vllm_env.python()),
            "min_new_samples": 10, "max_minutes": 10, "max_steps": 2,
            "train_args": ["--loss", "ce", "--max-tokens", "1024"]}},
    )  # fmt: skip
    store = RedisStore(redis_url, prefix=redis_prefix)
    ctl = Controller(settings, store)
    try:
        await ctl.tick()
        docs = await training.load(store)
        assert OTHER not in docs  # 12 samples in the store, but it never opted in
        job = docs[TENANT].job
        assert job.running and job.init_from == str(untrained_drafter)
        await ctl.training._task
    finally:
        await ctl.close()
        await store.close()

    docs, audit = await _reload(redis_url, redis_prefix)
    job = docs[TENANT].job
    assert job.state == "succeeded", (job.error, open(job.log).read()[-2000:])
    assert job.result["step"] == 2 and job.result["checkpoint"] == job.checkpoint
    assert {"acceptance_new", "acceptance_current"} <= set(job.result)
    eval_doc = json.loads(open(f"{job.checkpoint}/eval.json").read())
    assert eval_doc["tenant"] == TENANT and eval_doc["current"]["drafter"] == str(untrained_drafter)
    proc = specgate("checkpoint", "validate", job.checkpoint, "--target", str(tiny_model_dir), "--profile", "dspark-b4")
    assert proc.returncode == 0 and proc.stdout.startswith("ok: dspark drafter"), proc.stdout + proc.stderr
    assert [(e["action"], e["target"]) for e in audit] == [("training_finish", TENANT), ("training_start", TENANT)]
    assert audit[0]["detail"]["drafter"] == job.drafter and audit[0]["detail"]["step"] == 2


async def _reload(redis_url: str, prefix: str) -> tuple[dict, list[dict]]:
    from contract.store.redis_store import RedisStore

    store = RedisStore(redis_url, prefix=prefix)
    try:
        return await training.load(store), await store.recent(AUDIT_KEY, 50)
    finally:
        await store.close()
