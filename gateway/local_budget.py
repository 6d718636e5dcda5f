"""Budgets enforced by one instance alone while the shared store is down
(`budget_failure_mode: local`).

Why a share and not the whole limit: every instance keeps admitting during
the outage, so each may only spend its part, `limit / live instances`, the
instance count being the last one the heartbeats reported before the store
went away. The sliding window is the embedded store's own (`MemoryStore`),
so the local decisions follow the same arithmetic as the shared ones.

Why a ledger: when the store is back, what was admitted here must be paid
into the shared window (`adjust_window`), or every instance would hand out a
fresh minute's budget on top of what it just admitted. The ledger keeps,
per tenant and per second, the requests and estimated tokens admitted
locally; reconciliation pays in what was admitted within the last window
(older admissions no longer count in a sliding window of that length). The
token estimates are corrected by the ordinary settle adjustments, which wait
in `Accounting` for the store like everything else.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable

from contract.store import MemoryStore, WindowDecision


def local_share(limit: int, instances: int) -> float:
    """This instance's part of one limit during an outage (0: unlimited)."""
    return limit / max(1, instances) if limit else 0.0


class LocalBudget:
    def __init__(self, window_s: int, clock: Callable[[], float] = time.time) -> None:
        self.window_s = window_s
        self._clock = clock
        self._windows = MemoryStore(prefix="", clock=clock)
        # tenant -> deque of [second, requests, tokens], oldest first
        self._ledger: dict[str, deque[list[int]]] = {}

    async def decide(self, tenant_id: str, rpm: int, tpm: int, tokens: int, instances: int) -> WindowDecision:
        """Admit or deny one request against this instance's share.

        The returned `used` is scaled back up by `instances`: it estimates
        the tenant's usage across the fleet, so that the `x-ratelimit-*`
        headers keep quoting the tenant's own limits."""
        n = max(1, instances)
        limits = {"requests": local_share(rpm, n), "tokens": local_share(tpm, n)}
        # As the shared path caps a request's estimate at the limit, the local
        # one caps it at the share, or a large request could never fit in it.
        cost = min(tokens, max(1, math.floor(limits["tokens"]))) if tpm else tokens
        decision = await self._windows.consume_window(tenant_id, {"requests": 1, "tokens": cost}, limits, self.window_s)  # type: ignore[arg-type]
        if decision.allowed:
            self._count(tenant_id, 1, tokens)
        used = {field: value * n for field, value in decision.used.items()}
        return WindowDecision(decision.allowed, decision.retry_after_s, used, decision.denied_field, decision.reset_s)

    def _count(self, tenant_id: str, requests: int, tokens: int) -> None:
        second = int(self._clock())
        ledger = self._ledger.setdefault(tenant_id, deque())
        if ledger and ledger[-1][0] == second:
            ledger[-1][1] += requests
            ledger[-1][2] += tokens
        else:
            ledger.append([second, requests, tokens])
        horizon = second - self.window_s
        while ledger and ledger[0][0] < horizon:
            ledger.popleft()

    def take(self) -> dict[str, dict[str, int]]:
        """What is owed to the shared window, per tenant; the ledger starts
        afresh. The local windows are kept: they decay on their own, and
        an outage soon after this one must not hand out a fresh share."""
        horizon = self._clock() - self.window_s
        owed: dict[str, dict[str, int]] = {}
        for tenant_id, ledger in self._ledger.items():
            r = sum(e[1] for e in ledger if e[0] >= horizon)
            t = sum(e[2] for e in ledger if e[0] >= horizon)
            if r or t:
                owed[tenant_id] = {"requests": r, "tokens": t}
        self._ledger = {}
        return owed

    def give_back(self, owed: dict[str, dict[str, int]]) -> None:
        """Put back what could not be paid in (the store failed again)."""
        for tenant_id, deltas in owed.items():
            self._count(tenant_id, deltas.get("requests", 0), deltas.get("tokens", 0))
