"""Fixtures shared by every test tier.

Tests talk to a real Redis: the one on 127.0.0.1:6379 when it answers (CI and
these machines run one), otherwise a `redis-server` this session starts on a
free port. Each test gets its own key prefix and everything under it is
deleted afterwards.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid

import pytest
import redis

from testbed.procs import free_port


def _redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=0.5).ping())
    except redis.RedisError:
        return False


def wait_for(predicate, timeout: float = 5.0, interval: float = 0.05):
    """Poll `predicate` until it returns something truthy (returned), or fail after `timeout` s."""
    deadline = time.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.time() > deadline:
            raise AssertionError("condition not met within %.1fs" % timeout)
        time.sleep(interval)




@pytest.fixture(scope="session")
def redis_url(tmp_path_factory):
    url = os.environ.get("SPECGATE_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    if _redis_answers(url):
        yield url
        return
    server = shutil.which("redis-server")
    if server is None:
        pytest.fail("no Redis answers at %s and redis-server is not installed" % url)
    port = free_port()
    workdir = tmp_path_factory.mktemp("redis")
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    deadline = time.time() + 10
    while not _redis_answers(url):
        if time.time() > deadline:
            proc.kill()
            pytest.fail("started redis-server did not answer")
        time.sleep(0.05)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def redis_prefix(redis_url):
    """A unique key prefix; every key under it is removed after the test."""
    prefix = f"specgate-test:{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    keys = list(client.scan_iter(match=prefix + "*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


@pytest.fixture
async def redis_store(redis_url, redis_prefix):
    from contract.store.redis_store import RedisStore

    store = RedisStore(redis_url, prefix=redis_prefix)
    yield store
    await store.close()


# Session fixtures that cost a minute or more to build: every module using one runs on the
# same worker, so it is built once (`--dist loadgroup` in scripts/test.sh).
_SHARED_FIXTURES = {  # in precedence order: a module using two takes the first
    "trained": "drafter-training",
    "capture_store": "drafter-training",
    "vllm_ngram_server": "tiny-vllm",
    "vllm_plain_server": "tiny-vllm",
}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups into the node ids
def pytest_collection_modifyitems(config, items):
    """Order and group the suite for parallel workers (pytest-xdist, scripts/test.sh).

    Each module is one unit of work (`xdist_group`), so its module fixtures -- a vLLM
    server, a `specgate up` stack -- are built once; modules that use the same costly
    session fixture (`_SHARED_FIXTURES`) form one unit, so that fixture is too. Units
    holding a `slow` test run first (those that boot vLLM before the rest): a
    200-second unit taken last would run alone while the other workers idle. The order
    inside a unit stays as written."""
    group: dict[str, str] = {}
    weight: dict[str, int] = {}  # 0: slow and booting a vLLM server, 1: slow, 2: the rest
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        name = item.module.__name__
        first_seen.setdefault(name, i)
        shared = [g for f, g in _SHARED_FIXTURES.items() if f in getattr(item, "fixturenames", ())]
        if shared and group.get(name, name) == name:  # a module's first shared fixture names its unit
            group[name] = shared[0]
        group.setdefault(name, name)
        mark = 0 if item.get_closest_marker("slow") and item.get_closest_marker("vllm") else 1 if item.get_closest_marker("slow") else 2
        weight[name] = min(weight.get(name, 2), mark)
    unit_weight: dict[str, int] = {}
    unit_first: dict[str, int] = {}
    for name, g in group.items():
        unit_weight[g] = min(unit_weight.get(g, 2), weight[name])
        unit_first[g] = min(unit_first.get(g, first_seen[name]), first_seen[name])
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group[item.module.__name__]))
    items.sort(key=lambda it: (unit_weight[group[it.module.__name__]], unit_first[group[it.module.__name__]],
                               first_seen[it.module.__name__]))  # fmt: skip
