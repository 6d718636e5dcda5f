"""The single-node process: the gateway, the admin API and (optionally) the
controller in one process, on one store.

This is the only module that imports both planes. The gateway and the
controller never import each other; they agree through the contract package
(store keys, policies, telemetry, knobs). Here they are wired together:

- the controller reads the gateway's own /metrics scrapes
  (`Registry.snapshots`), so each replica is scraped once per interval;
- the admin API (the controller's router) is mounted beside the gateway's
  routes, with this process as its `AdminHost`;
- the controller starts after the gateway's store and health loops and stops
  before them (one lifespan).

Used by `specgate gateway` (`--embedded-controller`) and `specgate up`.
"""

from __future__ import annotations

import contextlib
from typing import Any

from contract.policy import PolicySet, SpeculationPolicy
from contract.settings import Settings
from contract.store import Store
from controller.admin import router as admin_router
from controller.embedded import ControllerTask
from controller.service import Controller
from gateway.app import GatewayApp, GatewayState, create_app


class GatewayAdminHost:
    """`controller.admin.AdminHost` over a gateway's state."""

    def __init__(self, state: GatewayState) -> None:
        self._state = state
        self.settings = state.settings
        self.controller: Controller | None = None

    @property
    def store(self) -> Store | None:
        return self._state.store

    def is_tenant_key(self, authorization: bytes) -> bool:
        return self._state.tenants.authenticate(authorization).tenant is not None

    def replicas(self) -> list[dict[str, Any]]:
        return [r.describe() for r in self._state.registry]

    async def policies(self) -> PolicySet:
        return self._state.policies

    def policy_for(self, tenant: str, published: PolicySet) -> SpeculationPolicy:
        return self._state.policy_view.for_tenant(tenant)


def create_node_app(settings: Settings | None = None, store: Store | None = None, *, controller: bool = False) -> GatewayApp:
    """The gateway app with the admin API mounted and, with `controller=True`,
    the controller running in the same lifespan on the gateway's store."""
    app = create_app(settings, store)
    state: GatewayState = app.state.gateway
    host = GatewayAdminHost(state)
    app.state.admin = host
    app.include_router(admin_router)
    if controller:
        gateway_lifespan = app.router.lifespan_context

        @contextlib.asynccontextmanager
        async def lifespan(a: Any):
            async with gateway_lifespan(a) as maybe_state:
                host.controller = Controller(state.settings, state.store, snapshots=state.registry.snapshots)
                handle = ControllerTask.start(host.controller)
                try:
                    yield maybe_state
                finally:
                    await handle.stop()

        app.router.lifespan_context = lifespan
    return app
