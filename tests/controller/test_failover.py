"""Two real `specgate controller` processes on one Redis: one leads, the
standby takes over when the leader is SIGKILLed (its lock simply expires)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import pytest
import yaml

from contract.keys import LEADER_KEY, STATUS_KEY
from contract.policy import load_policies

from .servers import sim_replica, wait_for

pytestmark = pytest.mark.slow


def _spawn(config: str, instance: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPECGATE_")}
    return subprocess.Popen(
        [sys.executable, "-m", "specgate.cli", "controller", "--config", config, "--tick", "0.2", "--id", instance,
         "--min-dwell", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


async def test_killing_the_active_controller_hands_over_to_the_standby(redis_store, redis_url, redis_prefix, tmp_path):
    async with sim_replica("dspark-b8", "sim-0") as url:
        cfg = tmp_path / "specgate.yaml"
        cfg.write_text(yaml.safe_dump({
            "replicas": [{"name": "sim-0", "url": url, "profile": "dspark-b8"}],
            "redis_url": redis_url,
            "redis_prefix": redis_prefix,
        }))
        a = _spawn(str(cfg), "ctl-A")
        b = None
        try:
            await wait_for(lambda: redis_store.lock_owner(LEADER_KEY), 30, 0.1, "a leader")
            assert await redis_store.lock_owner(LEADER_KEY) == "ctl-A"
            await wait_for(lambda: _published(redis_store), 10, 0.1, "first policies")
            b = _spawn(str(cfg), "ctl-B")
            await asyncio.sleep(3.0)  # B is up and polling the lock
            assert b.poll() is None, b.stderr.read().decode() if b.stderr else ""
            assert await redis_store.lock_owner(LEADER_KEY) == "ctl-A"
            before = (await load_policies(redis_store)).policies

            a.send_signal(signal.SIGKILL)  # no cleanup: the lock must expire
            a.wait(timeout=10)
            await wait_for(lambda: _owner_is(redis_store, "ctl-B"), 15, 0.1, "standby to take over")
            await wait_for(lambda: _status_from(redis_store, "ctl-B"), 5, 0.1, "new leader ticking")
            after = (await load_policies(redis_store)).policies
            # The new leader adopted the published policies: nothing flipped on failover.
            assert {t: p.enabled for t, p in after.items()} == {t: p.enabled for t, p in before.items()}
        finally:
            for proc in (a, b):
                if proc is not None and proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                    try:
                        proc.wait(timeout=10)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait(timeout=5)


async def _published(store) -> bool:
    return (await load_policies(store)).version > 0


async def _owner_is(store, owner: str) -> bool:
    return await store.lock_owner(LEADER_KEY) == owner


async def _status_from(store, owner: str) -> bool:
    status = await store.get_json(STATUS_KEY)
    return bool(status and status.get("leader") == owner)
