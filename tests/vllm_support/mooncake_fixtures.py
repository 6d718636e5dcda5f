"""A real Mooncake Store for tests: the fixture that starts a master and a
store node from .venv-vllm's wheel (`drafters.capture.mooncake_runtime`,
as the bench starts them), a fresh namespace per test, and `mooncake_ops`,
which runs store operations in a .venv-vllm process (mooncake_worker.py:
the Mooncake client needs the wheel, the tensors torch).

    from tests.vllm_support.mooncake_fixtures import MOONCAKE_MAX_BYTES, mooncake_cluster, mooncake_ops, mooncake_store_spec  # noqa: F401
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import uuid
from pathlib import Path

import pytest
import redis

from drafters.capture.mooncake_runtime import MooncakeCluster
from drafters.capture.mooncake_store import mooncake_spec, segment_bytes_for

from testbed import vllm_env
from .fixtures import _skip_or_fail

HERE = Path(__file__).parent
REPO = HERE.parents[1]
# The stores' bound in these tests; the store node's segment is sized for it.
MOONCAKE_MAX_BYTES = 130_000


@pytest.fixture(scope="module")
def mooncake_cluster(tmp_path_factory):
    reason = vllm_env.unavailable_reason()
    if reason is not None:
        _skip_or_fail(reason)
    with MooncakeCluster(segment_bytes_for(MOONCAKE_MAX_BYTES), venv=vllm_env.venv_dir(),
                         log_dir=tmp_path_factory.mktemp("mooncake")) as cluster:
        yield cluster


@contextlib.contextmanager
def fresh_store_spec(cluster: MooncakeCluster, redis_url: str):
    """A store spec with a namespace of its own; its index keys are deleted afterwards."""
    namespace = f"specgate-test-{uuid.uuid4().hex[:12]}"
    try:
        yield mooncake_spec(cluster.master, redis_url, namespace)
    finally:
        client = redis.Redis.from_url(redis_url)
        keys = list(client.scan_iter(match=namespace + ":*"))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture
def mooncake_store_spec(mooncake_cluster, redis_url):
    with fresh_store_spec(mooncake_cluster, redis_url) as spec:
        yield spec


def mooncake_ops(spec: str, ops: list, max_bytes: int = MOONCAKE_MAX_BYTES, ttl_s: float = 60.0) -> list:
    """The ops in one fresh .venv-vllm process (see mooncake_worker.py)."""
    proc = subprocess.run(
        [str(vllm_env.python()), str(HERE / "mooncake_worker.py")],
        input=json.dumps({"spec": spec, "max_bytes": max_bytes, "ttl_s": ttl_s, "ops": ops}),
        capture_output=True, text=True, timeout=120, check=False, cwd=str(REPO), env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
