"""The gateway's ordinary FastAPI routes, and what `/openapi.json` says about
all of them, the completion endpoints included.

The completion endpoints are answered by the pure-ASGI fast lane
(`app.GatewayApp.__call__` -> `proxy.CompletionEndpoint`) before the router
sees them. Their routes here exist so `/openapi.json` (and `/docs`) document
them; their handlers hand the raw request to the same `CompletionEndpoint`,
so they are a correct fallback (e.g. should a request reach the router
under a path the fast lane did not match) and never parse or re-serialise
the body: unknown fields still reach the replica byte for byte.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from contract.errors import error_payload

from . import openapi_models as oa
from .metrics_exposure import CONTENT_TYPE, UNAUTHORIZED, authorized, render

if TYPE_CHECKING:
    from .deps import ServedState
    from .proxy import CompletionEndpoint

TENANT_KEY = "tenantKey"
METRICS_TOKEN = "metricsToken"


class _Delegate(Response):
    """A 'response' that runs an ASGI endpoint with the route's own scope,
    receive and send: FastAPI wants a Response back, the hot endpoint wants
    the untouched ASGI triple (it reads the body itself)."""

    def __init__(self, endpoint: "CompletionEndpoint") -> None:  # no body, no headers: the endpoint sends its own
        self.endpoint = endpoint
        self.background = None

    async def __call__(self, scope, receive, send) -> None:
        await self.endpoint(scope, receive, send)


def install_routes(app: FastAPI, state: "ServedState", hot_routes: dict[str, "CompletionEndpoint"]) -> None:
    _completion_routes(app, hot_routes)
    _info_routes(app, state)
    if state.settings.gateway.metrics_port is None:
        _metrics_route(app, state)
    _document(app, metrics_token=state.settings.gateway.metrics_token is not None)


def _completion_routes(app: FastAPI, hot_routes: dict[str, "CompletionEndpoint"]) -> None:
    chat, completions = hot_routes["/v1/chat/completions"], hot_routes["/v1/completions"]
    security = {"security": [{TENANT_KEY: []}]}

    @app.post(
        "/v1/chat/completions",
        summary="Chat completion (OpenAI-compatible; streaming with `stream: true`)",
        response_model=None,
        responses=oa.completion_responses(oa.ChatCompletion),
        openapi_extra={**oa.request_body(oa.ChatCompletionRequest), **security},
        tags=["completions"],
    )
    async def chat_completions(request: Request) -> Response:
        return _Delegate(chat)

    @app.post(
        "/v1/completions",
        summary="Text completion (OpenAI-compatible; streaming with `stream: true`)",
        response_model=None,
        responses=oa.completion_responses(oa.Completion),
        openapi_extra={**oa.request_body(oa.CompletionRequest), **security},
        tags=["completions"],
    )
    async def text_completions(request: Request) -> Response:
        return _Delegate(completions)


def _info_routes(app: FastAPI, state: "ServedState") -> None:
    @app.get("/health", response_model=oa.Health, summary="Liveness: always 200; lists the healthy replicas", tags=["operations"])
    async def health() -> JSONResponse:
        healthy = [r.name for r in state.registry if r.healthy]
        return JSONResponse(
            {"status": "ok" if healthy else "degraded", "healthy_replicas": healthy, "policy_version": state.policies.version},
            status_code=200,
        )

    @app.get(
        "/ready",
        response_model=oa.Readiness,
        responses={503: {"model": oa.Readiness, "description": "draining, no healthy replica, or the budget store down with budgets failing closed"}},
        summary="Readiness for a load balancer",
        tags=["operations"],
    )
    async def ready() -> JSONResponse:
        ok, body = state.readiness()
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get(
        "/v1/models",
        response_model=oa.ModelList,
        responses=oa.error_responses(401),
        summary="Models of the configured replicas, healthy or not (see docs/gateway.md)",
        openapi_extra={"security": [{TENANT_KEY: []}]},
        tags=["models"],
    )
    async def models(request: Request) -> JSONResponse:
        auth = state.tenants.authenticate(request.headers.get("authorization", "").encode("latin-1") or None)
        if auth.tenant is None:
            return JSONResponse(error_payload(401, auth.error or "Unauthorized", code="invalid_api_key"), status_code=401)
        return JSONResponse({"object": "list", "data": state.registry.model_cards()})


def _metrics_route(app: FastAPI, state: "ServedState") -> None:
    token = state.settings.gateway.metrics_token

    @app.get(
        "/metrics",
        response_class=Response,
        responses={
            200: {"description": "Prometheus text exposition (`specgate_` prefix)", "content": {"text/plain": {"schema": {"type": "string"}}}},
            **oa.error_responses(401),
        },
        summary="Prometheus metrics",
        openapi_extra={"security": [{METRICS_TOKEN: []}]} if token is not None else None,
        tags=["operations"],
    )
    async def metrics(request: Request) -> Response:
        if not authorized(token, request.headers.get("authorization", "").encode("latin-1") or None):
            return Response(UNAUTHORIZED, status_code=401, media_type="application/json", headers={"www-authenticate": "Bearer"})
        return Response(render(state), media_type=CONTENT_TYPE)


def _document(app: FastAPI, *, metrics_token: bool) -> None:
    """Finish the generated schema once: the request models the completion
    routes reference, and the bearer schemes."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()  # FastAPI caches it in app.openapi_schema; we amend that dict once
        components = schema.setdefault("components", {})
        if "securitySchemes" not in components or TENANT_KEY not in components["securitySchemes"]:
            oa.add_request_schemas(schema)
            schemes = components.setdefault("securitySchemes", {})
            schemes[TENANT_KEY] = {"type": "http", "scheme": "bearer", "description": "a tenant's API key"}
            if metrics_token:
                schemes[METRICS_TOKEN] = {"type": "http", "scheme": "bearer", "description": "`gateway.metrics_token`"}
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
