"""Fixtures shared by every test tier.

Tests talk to a real Redis: the one on 127.0.0.1:6379 when it answers (CI and
these machines run one), otherwise a `redis-server` this session starts on a
free port. Each test gets its own key prefix and everything under it is
deleted afterwards.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid

import pytest
import redis


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


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
