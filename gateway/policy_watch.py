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

from .speculation_policy import (
    DEFAULT_TENANT,
    POLICIES_CHANNEL,
    POLICIES_VERSION_KEY,
    PolicySet,
    SpeculationPolicy,
    load_policies,
)
from .store import Store

log = logging.getLogger("specgate.gateway.policy")

_DEFAULT = SpeculationPolicy()


def resolve_policy(tenant: str, published: PolicySet, configured: dict[str, SpeculationPolicy]) -> SpeculationPolicy:
    """Pure precedence rule (see module docstring)."""
    if tenant in published.policies:
        return published.policies[tenant]
    if tenant in configured:
        return configured[tenant]
    if DEFAULT_TENANT in published.policies:
        return published.policies[DEFAULT_TENANT]
    return configured.get(DEFAULT_TENANT, _DEFAULT)


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
        self._tasks: list[asyncio.Task] = []
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        async with self._lock:
            published = await load_policies(self.store)
            if published.version != self.view.policies.version or published.policies != self.view.policies.policies:
                self.view.update(published)
                log.info("policies updated", extra={"fields": {"version": published.version}})
                if self.on_change:
                    self.on_change(published)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_s)
            try:
                version = await self.store.get_json(POLICIES_VERSION_KEY)
                if version is not None and int(version) != self.view.policies.version:
                    await self.refresh()
            except Exception:
                log.warning("policy poll failed", exc_info=True)

    async def _subscribe(self) -> None:
        while True:
            try:
                async for _ in self.store.subscribe(POLICIES_CHANNEL):
                    await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("policy subscription dropped; retrying", exc_info=True)
            await asyncio.sleep(self.poll_s)

    async def start(self) -> None:
        try:
            await self.refresh()
        except Exception:
            log.warning("initial policy load failed; using config defaults", exc_info=True)
        self._tasks = [asyncio.create_task(self._poll()), asyncio.create_task(self._subscribe())]

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            try:
                await t
            except (asyncio.CancelledError, Exception):
                pass
