"""Wiring of the gateway app: state, lifecycle, routes.

`create_app(settings, store=None)` returns a FastAPI app whose two hot
endpoints (`/v1/chat/completions`, `/v1/completions`) are dispatched as pure
ASGI before Starlette's router and middleware stack; everything else
(`/v1/models`, `/health`, `/ready`, `/metrics`, `/openapi.json`, `/docs`) is
ordinary FastAPI (`routes.py`, which also documents the completion routes).
`app.state.metrics_app` serves /metrics alone, for a separate listener.
`app.state.gateway` is the `GatewayState` a host process reads
(`.settings`, `.store`, `.registry`, `.policies`); the admin API is the
controller's and is mounted by the composition (`specgate.node`).
"""

from __future__ import annotations

import contextlib
import logging

from fastapi import FastAPI

from contract.errors import install_error_handlers
from contract.policy import PolicySet
from contract.settings import Settings, load_settings
from contract.store import MemoryStore, Store, create_store

from .accounting import Accounting, estimate_tokens
from .auth import TenantDirectory
from .capture_mirror import CaptureMirror, FleetCaptureBudget
from .deps import RequestPathState
from .health import HealthMonitor
from .inflight import InflightRequests
from .logs import configure_logging
from .metrics import GatewayMetrics
from .metrics_exposure import MetricsApp
from .policy_watch import PolicyView, PolicyWatcher
from .proxy import CompletionEndpoint
from .replicas import Registry
from .routes import install_routes
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
        self.metrics = GatewayMetrics(settings.gateway.metrics_top_tenants, settings.gateway.metrics_tenant_labels, settings.controller.half_life_s)
        self.tracing = Tracing(settings.gateway.tracing)
        self.policy_view = PolicyView({t.id: t.speculation for t in settings.tenants if t.speculation is not None})
        self.session_header = settings.gateway.session_header.lower().encode()
        self.upstream = None
        # The capture mirror (gateway.capture_mirror): None while no capture target is configured.
        self.capture: CaptureMirror | None = None
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
        store_up = self.accounting.store_up if self.accounting is not None else True  # before start-up: not known down
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
        self.upstream = create_upstream(s.upstream_client, s.upstream_pool_size, s.connect_timeout_s, s.read_timeout_s, s.upstream_keepalive_s)
        if s.capture.url:
            self.capture = CaptureMirror(s.capture, self.metrics, upstream_client=s.upstream_client, connect_timeout_s=s.connect_timeout_s,
                                     keepalive_s=s.upstream_keepalive_s)
            self.capture.start()
        # Leases save a Redis round trip; the embedded store has none to save.
        lease_fraction = 0.0 if isinstance(self.store, MemoryStore) else s.budget_lease_fraction
        self.accounting = Accounting(
            self.store, s.budget_window_s, telemetry_flush_s=s.telemetry_flush_s, lease_fraction=lease_fraction, lease_s=s.budget_lease_s,
            settings=s, metrics=self.metrics,
        )
        self.accounting.start()
        if self.capture is not None and not isinstance(self.store, MemoryStore):
            self.capture.fleet_budget = FleetCaptureBudget(self.accounting.guard)
        self.watcher = PolicyWatcher(self.store, self.policy_view, s.policy_poll_s, on_change=lambda p: self.metrics.policy_version.set(p.version))
        await self.watcher.start()
        if not self.settings.tenants and s.allow_anonymous:
            log.warning("no tenants configured: serving every caller as tenant 'anonymous' without a key")
        self.health = HealthMonitor(self.registry, s, on_wedged=self._on_wedged)
        await self.health.start()
        self.started = True

    def _on_wedged(self, replica, reason: str) -> None:
        """A replica found wedged: what waits on it is aborted (the request
        path fails those over that have sent no byte yet)."""
        self.metrics.child(self.metrics.ejections, replica.name, reason.replace(" ", "_")).inc()
        n = self.inflight_requests.abort("replica_wedged", replica)
        if n:
            log.warning("aborted requests waiting on a wedged replica", extra={"fields": {"replica": replica.name, "requests": n}})

    async def stop(self) -> None:
        for part in (self.capture, self.health, self.watcher, self.accounting):
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

    app = GatewayApp(
        title="specgate gateway",
        summary="OpenAI-compatible gateway in front of vLLM replicas (tenant keys, budgets, speculation-aware routing)",
        lifespan=lifespan,
        docs_url="/docs" if settings.gateway.docs else None,
        redoc_url=None,
    )
    app.state.gateway = state
    # /metrics for a listener of its own (`metrics_port`); the main app then answers 404 there.
    app.state.metrics_app = MetricsApp(state)
    request_path: RequestPathState = state  # all the hot endpoints see of the state
    app.hot_routes = {
        "/v1/chat/completions": CompletionEndpoint(request_path, "chat"),
        "/v1/completions": CompletionEndpoint(request_path, "completions"),
    }

    install_error_handlers(app)
    install_routes(app, state, app.hot_routes)
    return app
