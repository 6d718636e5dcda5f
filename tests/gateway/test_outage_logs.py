"""Expected outages log one line per change of state and never a traceback
(issue 33 item 4): a private `redis-server` stopped and restarted under a
real gateway (policy poller, policy subscription, budget store, flushes),
and its one replica stopped and restarted on the same port."""

from __future__ import annotations

import logging
import shutil
from collections import Counter

import pytest

from gateway.periodic import log_failure
from testbed.fake_openai import FakeBackend
from testbed.procs import free_port

from .conftest import ServerThread, tenant, wait_for
from .test_budget_store_outage import ask, gateway_on, private_redis, ready  # noqa: F401 - fixtures

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self, level: int = logging.INFO) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= level]


@pytest.fixture
def specgate_records():
    """Every record of specgate's loggers, debug included."""
    logger = logging.getLogger("specgate")
    handler = _Records()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate


def test_redis_and_replica_outages_log_one_line_each_way_and_no_traceback(private_redis, gateway_on, specgate_records):
    store = private_redis()
    fake = FakeBackend()
    backend = ServerThread(fake, free_port()).start()
    try:
        gw = gateway_on(
            store.url, backend.url, [tenant("alpha", requests_per_minute=1000)],
            instance_heartbeat_s=0.2, budget_store_retry_s=0.5, health_interval_s=0.2, health_unhealthy_interval_s=0.2,
        )
        logging.getLogger("specgate").setLevel(logging.DEBUG)  # the app's start set its own level
        assert ask(gw.url).status_code == 200

        store.stop()
        for _ in range(3):
            assert ask(gw.url).status_code == 200  # local budget mode
        # Several failed rounds of the poller (its repeats are debug), and the store seen down.
        wait_for(lambda: specgate_records.messages(logging.DEBUG).count("policy poll failed again: ConnectionError") >= 3, timeout=15)
        wait_for(lambda: ready(gw.url)[1]["budget_store"] == "down", timeout=10)
        store.start()
        wait_for(lambda: any(m.startswith("policy poll recovered") for m in specgate_records.messages()), timeout=15)
        wait_for(lambda: ready(gw.url)[1]["budget_store"] == "up", timeout=10)

        port = backend.port
        backend.stop()
        wait_for(lambda: "replica unhealthy" in specgate_records.messages(), timeout=15)
        for _ in range(3):
            assert ask(gw.url).status_code in (502, 503)
        backend = ServerThread(fake, port).start()
        wait_for(lambda: specgate_records.messages().count("replica healthy") == 2, timeout=15)  # at start, and back
        wait_for(lambda: ask(gw.url).status_code == 200, timeout=10)
    finally:
        backend.stop()

    seen = Counter(specgate_records.messages())
    for line in (
        "policy poll failed (further failures are not logged until it recovers)",
        "budget store down",
        "budget store back up",
        "replica unhealthy",
    ):
        assert seen[line] == 1, (line, seen)
    assert seen["replica healthy"] == 2
    assert sum(1 for m in seen.elements() if m.startswith("policy poll recovered")) == 1
    with_traceback = [r.getMessage() for r in specgate_records.records if r.exc_info]
    assert with_traceback == []


def test_an_unexpected_failure_keeps_its_traceback(specgate_records):
    log = logging.getLogger("specgate.test")
    try:
        {}["missing"]
    except KeyError as exc:
        log_failure(log, "a round", exc)
    try:
        raise ConnectionRefusedError(111, "Connection refused")
    except OSError as exc:
        log_failure(log, "a round", exc)
    bug, outage = specgate_records.records[-2:]
    assert (bug.levelno, bug.exc_info is not None) == (logging.ERROR, True)
    assert (outage.levelno, outage.exc_info, outage.fields["error"]) == (logging.WARNING, None, "ConnectionRefusedError")
