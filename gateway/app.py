"""Wiring of the gateway app: state, lifecycle, routes.

`create_app(settings, store=None)` returns a FastAPI app whose two hot
endpoints (`/v1/chat/completions`, `/v1/completions`) are dispatched as pure
ASGI before Starlette's router and middleware stack; everything else
(`/v1/models`, `/health`, `/metrics`) is ordinary FastAPI.
`app.state.gateway` is the `GatewayState` a host process reads
(`.settings`, `.store`, `.registry`, `.policies`); the admin API is the
controller's and is mounted by the composition (`specgate.node`).
"""

from __future__ import annotations

import contextlib
import logging
import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from contract.errors import error_payload, install_error_handlers
from contract.policy import PolicySet
from contract.settings import Settings, load_settings
from contract.store import MemoryStore, Store, create_store

from .accounting import Accounting, estimate_tokens
from .auth import TenantDirectory
from .deps import RequestPathState
from .health import HealthMonitor
from .inflight import InflightRequests
from .logs import configure_logging
from .metrics import GatewayMetrics
from .policy_watch import PolicyView, PolicyWatcher
from .proxy import CompletionEndpoint
from .replicas import Registry
from .tracing import Tracing
from .upstream import create_upstream

log = logging.getLogger("specgate.gateway")


class GatewayState:
    def __init__(self, settings: Settings, store: Store | None = None) -> None:
        self.settings = settings
        self._own_store = store is None
        self.store: Store | None = store
        self.registry = Registry.from_settings(settings)
        self.tenants = TenantDirectory(settings)
        self.metrics = GatewayMetrics(settings.gateway.metrics_top_tenants)
        self.tracing = Tracing(settings.gateway.tracing)
        self.policy_view = PolicyView({t.id: t.speculation for t in settings.tenants if t.speculation is not None})
        self.session_header = settings.gateway.session_header.lower().encode()
        self.upstream = None
        self.accounting: Accounting | None = None
        self.health: HealthMonitor | None = None
        self.watcher: PolicyWatcher | None = None
        self.inflight_requests = InflightRequests(settings.gateway.max_inflight_requests)
        # Drain (gateway.server): `draining` turns /ready 503 at SIGTERM while the
        # listener still accepts; `draining_closed` refuses new completion
        # requests (503) once the pre-drain window is over.
        self.draining = False
        self.draining_closed = False
        self.started = False

    def readiness(self) -> tuple[bool, dict]:
        """/ready: 503 while draining, with no healthy replica, or with the
        budget store down when budgets fail closed (`budget_failure_mode:
        deny`); the store's state is reported either way."""
        healthy = any(r.healthy for r in self.registry)
        store_up = getattr(self.accounting, "store_up", True) if self.accounting is not None else True
        fails_closed = self.settings.gateway.budget_failure_mode == "deny"
        ok = healthy and not self.draining and (store_up or not fails_closed)
        return ok, {
            "ready": ok,
            "draining": self.draining,
            "healthy_replicas": healthy,
            "budget_store": "up" if store_up else "down",
        }

    @property
    def policies(self) -> PolicySet:
        return self.policy_view.policies

    @property
    def replica_list(self):
        return list(self.registry.replicas.values())

    def estimate_tokens(self, body: dict) -> int:
        return estimate_tokens(body, self.settings.gateway.default_max_tokens)

    async def start(self) -> None:
        s = self.settings.gateway
        if self.store is None:
            self.store = create_store(self.settings.redis_url, self.settings.redis_prefix)
        self.upstream = create_upstream(s.upstream_client, s.upstream_pool_size, s.connect_timeout_s, s.first_byte_timeout_s, s.read_timeout_s)
        # Leases save a Redis round trip; the embedded store has none to save.
        lease_fraction = 0.0 if isinstance(self.store, MemoryStore) else s.budget_lease_fraction
        self.accounting = Accounting(
            self.store, s.budget_window_s, telemetry_flush_s=s.telemetry_flush_s, lease_fraction=lease_fraction, lease_s=s.budget_lease_s
        )
        self.accounting.start()
        self.watcher = PolicyWatcher(self.store, self.policy_view, s.policy_poll_s, on_change=lambda p: self.metrics.policy_version.set(p.version))
        await self.watcher.start()
        if not self.settings.tenants and s.allow_anonymous:
            log.warning("no tenants configured: serving every caller as tenant 'anonymous' without a key")
        self.health = HealthMonitor(self.registry, s)
        await self.health.start()
        self.started = True

    async def stop(self) -> None:
        for part in (self.health, self.watcher, self.accounting):
            if part is not None:
                with contextlib.suppress(Exception):
                    await part.stop()
        if self.upstream is not None:
            await self.upstream.close()
        self.tracing.shutdown()
        if self._own_store and self.store is not None:
            await self.store.close()
        self.started = False


class GatewayApp(FastAPI):
    """FastAPI with a pure-ASGI fast lane for the completion endpoints."""

    hot_routes: dict[str, CompletionEndpoint]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            endpoint = self.hot_routes.get(scope["path"])
            if endpoint is not None:
                await endpoint(scope, receive, send)
                return
        await super().__call__(scope, receive, send)


def _openai_error(status: int, message: str, code: str | None = None) -> JSONResponse:
    return JSONResponse(error_payload(status, message, code=code), status_code=status)


def create_app(settings: Settings | None = None, store: Store | None = None) -> GatewayApp:
    settings = settings or load_settings()
    configure_logging(settings.log_level)
    state = GatewayState(settings, store)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        try:
            await state.start()
            yield
        finally:
            await state.stop()

    app = GatewayApp(title="specgate gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.gateway = state
    request_path: RequestPathState = state  # all the hot endpoints see of the state
    app.hot_routes = {
        "/v1/chat/completions": CompletionEndpoint(request_path, "chat"),
        "/v1/completions": CompletionEndpoint(request_path, "completions"),
    }

    install_error_handlers(app)

    @app.get("/health")
    async def health() -> JSONResponse:
        healthy = [r.name for r in state.registry if r.healthy]
        return JSONResponse(
            {"status": "ok" if healthy else "degraded", "healthy_replicas": healthy, "policy_version": state.policies.version},
            status_code=200,
        )

    @app.get("/ready")
    async def ready() -> JSONResponse:
        ok, body = state.readiness()
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        auth = state.tenants.authenticate(request.headers.get("authorization", "").encode("latin-1") or None)
        if auth.tenant is None:
            return _openai_error(401, auth.error or "Unauthorized", code="invalid_api_key")
        return JSONResponse({"object": "list", "data": state.registry.healthy_model_cards()})

    @app.get("/metrics")
    async def metrics() -> Response:
        now = time.monotonic()
        m = state.metrics
        for r in state.registry:
            m.replica_healthy.labels(r.name, r.profile or "unlabelled").set(1 if r.healthy else 0)
            m.replica_inflight.labels(r.name).set(r.inflight)
            m.replica_breaker_open.labels(r.name).set(0 if r.breaker.state(now) == "closed" else 1)
        m.policy_version.set(state.policies.version)
        return Response(m.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app
