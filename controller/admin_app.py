"""The standalone controller's own HTTP surface: the admin API
(`controller.admin`) and /metrics, for `specgate controller --admin-port`.

In a single-node process the same router is mounted beside the gateway's
routes by `specgate.node`; here the host knows the replicas from the
configuration and the controller's last scrape, and policies from the store.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response

from contract.errors import install_error_handlers
from contract.policy import PolicySet, SpeculationPolicy, load_policies, resolve_policy
from contract.settings import Settings, hash_key
from contract.store import Store

from .admin import router
from .service import Controller


class ControllerAdminHost:
    """`AdminHost` for a controller process without a gateway."""

    def __init__(self, settings: Settings, store: Store, controller: Controller | None) -> None:
        self.settings = settings
        self.store = store
        self.controller = controller
        self._tenant_hashes = {t.api_key_sha256 for t in settings.tenants}
        self._configured = {t.id: t.speculation for t in settings.tenants if t.speculation is not None}

    def is_tenant_key(self, authorization: bytes) -> bool:
        scheme, _, key = authorization.decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and hash_key(key.strip()) in self._tenant_hashes

    def replicas(self) -> list[dict[str, Any]]:
        healthy = {}
        if self.controller is not None:
            healthy = {n: e.healthy for n, e in self.controller.core.replicas.replicas.items()}
        return [
            {"name": r.name, "url": r.url, "profile": r.profile, "healthy": healthy.get(r.name)}
            for r in self.settings.replicas
        ]

    async def policies(self) -> PolicySet:
        return await load_policies(self.store)

    def policy_for(self, tenant: str, published: PolicySet) -> SpeculationPolicy:
        return resolve_policy(tenant, published, self._configured)


def create_admin_app(host: ControllerAdminHost) -> FastAPI:
    app = FastAPI(title="specgate controller", docs_url=None, redoc_url=None)
    app.state.admin = host
    install_error_handlers(app)
    app.include_router(router)

    @app.get("/metrics")
    async def metrics() -> Response:
        if host.controller is None:
            return Response("", media_type="text/plain; version=0.0.4; charset=utf-8")
        return Response(host.controller.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/health")
    async def health() -> dict:
        leader = bool(host.controller and host.controller.is_leader)
        return {"status": "ok", "leader": leader}

    return app
