"""How the gateway's `/metrics` is served: on the main listener, or as
`app.state.metrics_app` for a separate internal listener (`metrics_port`),
optionally behind a bearer token (`metrics_token`).

Why a token and a separate app: /metrics lists tenants and their token
counts, which the public listener should not hand to anyone who asks.
The token is compared in constant time (`hmac.compare_digest`), like the
admin key, so response timing does not leak it byte by byte.
"""

from __future__ import annotations

import hmac
import time
from typing import TYPE_CHECKING

from contract.errors import error_body
from contract.policy import served_tenants

if TYPE_CHECKING:
    from .deps import ServedState

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_JSON = b"application/json"


def render(state: "ServedState") -> bytes:
    """Refresh the replica and per-tenant gauges, then render the exposition."""
    now = time.monotonic()
    m = state.metrics
    for r in state.registry:
        m.replica_healthy.labels(r.name, r.profile or "unlabelled").set(1 if r.healthy else 0)
        m.replica_inflight.labels(r.name).set(r.open_attempts)
        m.replica_breaker_open.labels(r.name).set(0 if r.breaker.state(now) == "closed" else 1)
    m.policy_version.set(state.policies.version)
    _tenant_gauges(state)
    return m.render()


def _tenant_gauges(state: "ServedState") -> None:
    """Each served tenant's policy as this gateway applies it (the same
    `PolicyView` the request path reads) and its recent acceptance length."""
    m = state.metrics
    for tenant in m.tenant_gauge_ids(served_tenants(state.settings)):
        policy = state.policy_view.for_tenant(tenant)
        m.tenant_enabled.labels(tenant).set(1 if policy.enabled else 0)
        cap = 0 if not policy.enabled else (-1 if policy.max_draft is None else policy.max_draft)
        m.tenant_max_draft.labels(tenant).set(cap)
        al = m.recent_acceptance.value(tenant)
        if al is not None:
            m.tenant_acceptance_length.labels(tenant).set(al)


def authorized(token: str | None, authorization: bytes | None) -> bool:
    """True when no token is configured, or `Authorization: Bearer <token>` matches."""
    if token is None:
        return True
    if not authorization:
        return False
    scheme, _, given = authorization.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    return hmac.compare_digest(given.strip(), token.encode())


UNAUTHORIZED = error_body(401, "A valid metrics token is required: `Authorization: Bearer <metrics_token>`.", code="invalid_metrics_token")


class MetricsApp:
    """Plain ASGI app serving only `GET /metrics` from one `GatewayState`, for
    a listener of its own. It has no lifespan work: the main app's lifespan
    starts and stops the state it reads."""

    def __init__(self, state: "ServedState") -> None:
        self.state = state

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["path"] != "/metrics":
            await _send(send, 404, error_body(404, "Not Found"), _JSON)
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _send(send, 405, error_body(405, f"Method {scope['method']} not allowed; use GET."), _JSON, [(b"allow", b"GET")])
            return
        authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if not authorized(self.state.settings.gateway.metrics_token, authorization):
            await _send(send, 401, UNAUTHORIZED, _JSON, [(b"www-authenticate", b"Bearer")])
            return
        body = render(self.state)
        await _send(send, 200, b"" if scope["method"] == "HEAD" else body, CONTENT_TYPE.encode(), length=len(body))


async def _send(send, status: int, body: bytes, content_type: bytes, headers=(), length: int | None = None) -> None:
    out = [(b"content-type", content_type), (b"content-length", str(len(body) if length is None else length).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})
