"""Per-replica circuit breaker (closed -> open -> half-open -> closed).

`failures` consecutive failed attempts open it for `open_s`; after that, or
as soon as an active health check succeeds, one probe request is let through
(half-open): success closes it, failure re-opens it. Time is passed in so the state machine is testable without sleeping.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CircuitBreaker:
    failures: int = 5
    open_s: float = 30.0
    consecutive_failures: int = 0
    opened_at: float | None = None
    probe_in_flight: bool = False
    probe_started_at: float = 0.0

    def state(self, now: float) -> str:
        if self.opened_at is None:
            return "closed"
        if now - self.opened_at >= self.open_s:
            return "half_open"
        return "open"

    def allows(self, now: float) -> bool:
        state = self.state(now)
        if state == "closed":
            return True
        # One probe at a time; a probe whose outcome never came back (its
        # client went away) stops blocking after another open period.
        return state == "half_open" and (not self.probe_in_flight or now - self.probe_started_at >= self.open_s)

    def on_attempt(self, now: float) -> None:
        if self.state(now) == "half_open":
            self.probe_in_flight = True
            self.probe_started_at = now

    def on_health_ok(self, now: float) -> None:
        """An active health check answered: an open breaker half-opens at once
        (one probe request may go), so a restarted replica takes traffic
        within one health interval instead of after `open_s` (Envoy's
        `successful_active_health_check_uneject_host`). Consecutive request
        failures still open it again."""
        if self.opened_at is not None and self.state(now) == "open":
            self.opened_at = now - self.open_s
            self.probe_in_flight = False

    def on_success(self) -> None:
        self.consecutive_failures = 0
        self.opened_at = None
        self.probe_in_flight = False

    def on_failure(self, now: float) -> None:
        self.consecutive_failures += 1
        self.probe_in_flight = False
        if self.opened_at is not None or self.consecutive_failures >= self.failures:
            self.opened_at = now
