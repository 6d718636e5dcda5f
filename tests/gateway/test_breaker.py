"""Circuit breaker state machine (time passed in, no sleeping)."""

from gateway.breaker import CircuitBreaker


def test_opens_after_consecutive_failures_and_probes_once():
    b = CircuitBreaker(failures=3, open_s=10)
    for t in range(2):
        b.on_failure(t)
    assert b.allows(2) and b.state(2) == "closed"
    b.on_success()
    for t in range(3):
        b.on_failure(t)
    assert b.state(3) == "open" and not b.allows(11.9)
    assert b.state(12) == "half_open" and b.allows(12)
    b.on_attempt(12)
    assert not b.allows(12.5)  # one probe at a time
    b.on_failure(13)
    assert b.state(14) == "open"  # a failed probe re-opens at once
    b.on_attempt(23)
    b.on_success()
    assert b.state(23) == "closed" and b.consecutive_failures == 0


def test_lost_probe_does_not_block_forever():
    b = CircuitBreaker(failures=1, open_s=5)
    b.on_failure(0)
    b.on_attempt(5)  # probe starts, its outcome never arrives
    assert not b.allows(6)
    assert b.allows(10)


def test_a_good_health_check_half_opens_an_open_breaker_at_once():
    b = CircuitBreaker(failures=1, open_s=30)
    b.on_failure(0)
    assert b.state(1) == "open"
    b.on_health_ok(1)
    assert b.state(1) == "half_open" and b.allows(1)  # one probe now, not after 30 s
    b.on_attempt(1)
    assert not b.allows(1.5)
    b.on_failure(2)
    assert b.state(3) == "open"  # a failed probe still re-opens it
    closed = CircuitBreaker()
    closed.on_health_ok(5)
    assert closed.state(5) == "closed" and closed.opened_at is None
