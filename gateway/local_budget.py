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

Why a second ledger (`note`): Redis can come back *empty* (restarted
without persistence). The shared window then no longer holds what this
instance admitted through it before the outage, and paying in only what was
admitted locally would hand the tenant a fresh window on top of it. So the
instance also remembers, per second, what it admitted through the shared
store within the last window: it seeds the local window when an outage
starts (the share is not spent twice), and it is paid in too when the store
is found emptied (`take(emptied=True)`). Placed at "now" in either window,
these counts expire up to one window later than they would have: the
error is on the side of denying, never of over-admitting.
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
        # tenant -> deque of [second, requests, tokens], oldest first: admitted locally
        self._ledger: dict[str, deque[list[int]]] = {}
        # the same, admitted through the shared store (see the module docstring)
        self._shared: dict[str, deque[list[int]]] = {}
        # what `_shared` gained since the local windows were last seeded with it. A ledger
        # of its own, not a "seeded up to second S" mark: an admission noted in the same
        # second as a seed, after it, would fall behind such a mark and never be seeded
        # (a store blip, then more admissions through the store in that second, then an
        # outage: one request more than the share was admitted).
        self._unseeded: dict[str, deque[list[int]]] = {}

    async def decide(self, tenant_id: str, rpm: int, tpm: int, tokens: int, instances: int) -> WindowDecision:
        """Admit or deny one request against this instance's share.

        The returned `used` is scaled back up by `instances`: it estimates
        the tenant's usage across the fleet, so that the `x-ratelimit-*`
        headers keep quoting the tenant's own limits."""
        if self._unseeded:
            await self._seed()
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

    def note(self, tenant_id: str, requests: int, tokens: int) -> None:
        """The shared store admitted this (a request, or a lease's slice):
        remembered for the rest of the window, in case the store loses it."""
        second = int(self._clock())
        _count_into(self._shared, second, self.window_s, tenant_id, requests, tokens)
        _count_into(self._unseeded, second, self.window_s, tenant_id, requests, tokens)

    async def _seed(self) -> None:
        """Put what the shared store admitted since the last seed (within the
        window) into the local windows, so an outage's share counts what came before it."""
        now = int(self._clock())
        pending, self._unseeded = self._unseeded, {}
        for tenant_id, (r, t) in _sums(pending, now - self.window_s, now).items():
            await self._windows.adjust_window(tenant_id, {"requests": r, "tokens": t}, self.window_s)

    def _count(self, tenant_id: str, requests: int, tokens: int) -> None:
        _count_into(self._ledger, int(self._clock()), self.window_s, tenant_id, requests, tokens)

    def take(self, emptied: bool = False) -> dict[str, dict[str, int]]:
        """What is owed to the shared window, per tenant; the ledger starts
        afresh. The local windows are kept: they decay on their own, and
        an outage soon after this one must not hand out a fresh share.
        `emptied`: the store came back without its data, so what it had
        admitted from this instance within the window is owed again too."""
        now = self._clock()
        horizon = now - self.window_s
        owed: dict[str, dict[str, int]] = {}
        sources = (self._ledger, self._shared) if emptied else (self._ledger,)
        for source in sources:
            for tenant_id, (r, t) in _sums(source, horizon, now).items():
                entry = owed.setdefault(tenant_id, {"requests": 0, "tokens": 0})
                entry["requests"] += r
                entry["tokens"] += t
        self._ledger = {}
        return owed

    def give_back(self, owed: dict[str, dict[str, int]]) -> None:
        """Put back what could not be paid in (the store failed again)."""
        for tenant_id, deltas in owed.items():
            self._count(tenant_id, deltas.get("requests", 0), deltas.get("tokens", 0))


def _count_into(ledgers: dict[str, deque[list[int]]], second: int, window_s: int, tenant_id: str, requests: int, tokens: int) -> None:
    """Add to a tenant's per-second ledger, dropping seconds older than the window."""
    ledger = ledgers.get(tenant_id)
    if ledger is None:
        ledger = ledgers[tenant_id] = deque()
    if ledger and ledger[-1][0] == second:
        ledger[-1][1] += requests
        ledger[-1][2] += tokens
        return
    ledger.append([second, requests, tokens])
    horizon = second - window_s
    while ledger[0][0] < horizon:
        ledger.popleft()


def _sums(ledgers: dict[str, deque[list[int]]], start: float, end: float) -> dict[str, tuple[int, int]]:
    """Per tenant, the (requests, tokens) of the seconds in [start, end]; tenants with nothing left out."""
    out = {}
    for tenant_id, ledger in ledgers.items():
        r = sum(e[1] for e in ledger if start <= e[0] <= end)
        t = sum(e[2] for e in ledger if start <= e[0] <= end)
        if r or t:
            out[tenant_id] = (r, t)
    return out
