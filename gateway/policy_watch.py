"""Keeps the gateway's view of tenant speculation policies current.

Sources, lowest precedence first: built-in default (speculate, no caps) ->
a tenant's `speculation:` block in the config -> the store's published
PolicySet (controller/admin), where the store's `*` entry applies to tenants
the store does not name but only if the config gave them nothing either.

Updates arrive by pub/sub on POLICIES_CHANNEL (fast path) and by polling the
version key every `policy_poll_s` (fallback when a message is missed or
pub/sub is unavailable).
"""

from __future__ import annotations

import asyncio
import logging

from contract.keys import POLICIES_CHANNEL, POLICIES_VERSION_KEY
from contract.policy import PolicySet, SpeculationPolicy, load_policies, resolve_policy
from contract.store import Store

from .periodic import Loops, every, log_failure

log = logging.getLogger("specgate.gateway.policy")

class PolicyView:
    """The current PolicySet plus a per-tenant cache for the hot path."""

    def __init__(self, configured: dict[str, SpeculationPolicy]) -> None:
        self.configured = configured
        self.policies = PolicySet()
        self._cache: dict[str, SpeculationPolicy] = {}

    def update(self, published: PolicySet) -> None:
        self.policies = published
        self._cache = {}

    def for_tenant(self, tenant: str) -> SpeculationPolicy:
        p = self._cache.get(tenant)
        if p is None:
            p = self._cache[tenant] = resolve_policy(tenant, self.policies, self.configured)
        return p


class PolicyWatcher:
    def __init__(self, store: Store, view: PolicyView, poll_s: float, on_change=None) -> None:
        self.store = store
        self.view = view
        self.poll_s = poll_s
        self.on_change = on_change
        self._loops = Loops()
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        async with self._lock:
            published = await load_policies(self.store)
            if published.version != self.view.policies.version or published.policies != self.view.policies.policies:
                self.view.update(published)
                log.info("policies updated", extra={"fields": {"version": published.version}})
                if self.on_change:
                    self.on_change(published)

    async def _poll_once(self) -> None:
        version = await self.store.get_json(POLICIES_VERSION_KEY)
        if version is not None and int(version) != self.view.policies.version:
            await self.refresh()

    async def _subscribe(self) -> None:
        dropped = 0  # consecutive drops: logged when it starts, not on every retry
        while True:
            try:
                async for _ in self.store.subscribe(POLICIES_CHANNEL):
                    if dropped:
                        log.warning("policy subscription restored", extra={"fields": {"retries": dropped}})
                        dropped = 0
                    await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                dropped += 1
                if dropped == 1:
                    log_failure(log, "policy subscription", exc, "; retrying")
            await asyncio.sleep(self.poll_s)

    async def start(self) -> None:
        try:
            await self.refresh()
        except Exception as exc:
            log_failure(log, "initial policy load", exc, "; using config defaults")
        self._loops.start(every(self.poll_s, self._poll_once, log, "policy poll"), self._subscribe())

    async def stop(self) -> None:
        await self._loops.stop()
