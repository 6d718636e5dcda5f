"""The stages before the upstream call: auth -> parse -> admit -> route.

Each takes the gateway's state and the request's `RequestContext`, fills in
its part of the context, and fails with a `GatewayError` carrying the
OpenAI-shaped error the client gets:
auth (401) -> body size (413) -> JSON and shape (400) -> specgate knobs (400)
-> model (404, or 503 while its replicas are down) -> budget store (503) /
budget (429 + Retry-After)
-> routing (503).
"""

from __future__ import annotations

import logging
import math
import random
import time
from typing import Any

import orjson
from redis.exceptions import RedisError

from contract.knobs import KnobError, validate_client_xargs

from .asgi_io import read_body
from .budget_guard import StoreDown
from .deps import RequestPathState
from .errors import GatewayError
from .sampling import check_fits_context, check_sampling, completion_limit, fits_context
from .ratelimit_headers import ratelimit_headers
from .request_context import RequestContext
from .routing import RouteRequest, affinity_key, rank_replicas

log = logging.getLogger("specgate.gateway.proxy")

_now_ns = time.time_ns


# -- auth ----------------------------------------------------------------
def authenticate(state: RequestPathState, ctx: RequestContext) -> None:
    traced = ctx.root is not None
    if traced:
        ctx.t_auth_start_ns = _now_ns()
    auth = state.tenants.authenticate(ctx.authorization)
    if traced:
        ctx.t_auth_end_ns = _now_ns()
        ctx.authenticated = auth.tenant is not None
    if auth.tenant is None:
        raise GatewayError(401, auth.error or "Unauthorized", code="invalid_api_key")
    ctx.tenant = auth.tenant
    ctx.tenant_label = state.metrics.tenant_label(auth.tenant.id)


# -- parse ---------------------------------------------------------------
async def parse(state: RequestPathState, ctx: RequestContext, receive) -> None:
    """Body (413, 400), specgate knobs (400), then whether a healthy replica
    serves the model (404 / 503, see `model_unavailable`)."""
    raw = await read_body(receive, state.settings.gateway.max_body_bytes, ctx.content_length)
    body = ctx.body = parse_body(raw, ctx.endpoint)
    model = ctx.model = body["model"]
    ctx.stream = body.get("stream") is True
    ctx.client_xargs = client_knobs(body)
    replicas = ctx.replicas = state.replica_list
    if not any(r.healthy and r.serves(model) for r in replicas):
        raise model_unavailable(model, replicas, state.settings.gateway.health_interval_s)
    check_fits_context(body, model, replicas)


def model_unavailable(model: str, replicas: list, retry_s: float) -> GatewayError:
    """Why no healthy replica serves `model`. 404 only when the gateway can
    tell the model does not exist: some replica is healthy and no replica,
    up or down, serves or ever listed it. A model whose replicas are all down
    is a 503 (retryable: they may be back within a health interval), and so
    is any model while no replica is healthy at all, since the gateway cannot
    know the model list then. Checked before admission so an outage neither
    costs a budget round trip nor hides behind a 429."""
    retry = [(b"retry-after", str(max(1, math.ceil(retry_s))).encode())]
    if any(r.serves(model) for r in replicas):
        return GatewayError(503, f"No healthy replica is available for model `{model}`.", code="no_healthy_replica", headers=retry)
    if not any(r.healthy for r in replicas):
        return GatewayError(
            503,
            f"No replica is healthy, so the gateway cannot tell whether model `{model}` exists; retry shortly.",
            code="no_healthy_replica",
            headers=retry,
        )
    return GatewayError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")


def parse_body(raw: bytes, kind: str) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise GatewayError(400, f"Request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise GatewayError(400, "Request body must be a JSON object.", code="invalid_body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise GatewayError(400, "You must provide a model parameter.", param="model", code="missing_model")
    if kind == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise GatewayError(400, "'messages' must be a non-empty array.", param="messages", code="invalid_value")
    else:
        prompt = body.get("prompt")
        if prompt is None or isinstance(prompt, (bool, int, float, dict)):
            raise GatewayError(400, "'prompt' must be a string or an array.", param="prompt", code="invalid_value")
    if "stream" in body and not isinstance(body["stream"], bool) and body["stream"] is not None:
        raise GatewayError(400, "'stream' must be a boolean.", param="stream", code="invalid_value")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise GatewayError(400, "'stream_options' must be an object.", param="stream_options", code="invalid_value")
    check_sampling(body, kind)
    return body


def client_knobs(body: dict[str, Any]) -> dict[str, Any] | None:
    """The client's own `vllm_xargs`, validated (400 on a bad knob)."""
    try:
        return validate_client_xargs(body.get("vllm_xargs"))
    except KnobError as exc:
        raise GatewayError(400, str(exc), param=exc.param, code="invalid_value") from None


# -- admit ---------------------------------------------------------------
async def admit(state: RequestPathState, ctx: RequestContext) -> None:
    """Reserve one request and a token estimate from the tenant's budget.

    The decision's view of the window becomes the `x-ratelimit-*` headers,
    on the response when admitted (`ctx.response_headers`) and on the 429
    when not. While the budget store is down the accounting decides by
    `budget_failure_mode`: under `deny` it raises `StoreDown` (503 here, with
    the breaker's Retry-After); under `allow` it returns no decision, like an
    unlimited tenant; under `local` the decision is this instance's."""
    tenant = ctx.tenant
    estimate = state.estimate_tokens(ctx.body)
    try:
        decision, ctx.reserved = await state.accounting.reserve(tenant, estimate)
    except StoreDown as down:
        raise store_unavailable(down.retry_after_s) from None
    except (OSError, ConnectionError, RedisError):
        raise store_unavailable(1.0) from None
    if decision is None:  # unlimited tenant, or unmetered while the store is down
        return
    rpm, tpm = tenant.requests_per_minute, tenant.tokens_per_minute
    # Per-request decisions are new objects every time; a lease hit returns
    # the same view object for a second, and its headers are the same bytes.
    cache = state.accounting.headers_cache
    cached = cache.get(tenant.id)
    if cached is not None and cached[0] is decision:
        headers = cached[1]
    else:
        headers = ratelimit_headers(decision, {"requests": rpm, "tokens": tpm}, {"requests": 1, "tokens": min(estimate, tpm)})
        if decision.allowed:
            cache[tenant.id] = (decision, headers)
    if not decision.allowed:
        metrics = state.metrics
        limit = "tokens" if decision.denied_field == "tokens" else "requests"
        metrics.rejections.inc((ctx.tenant_label, limit))
        retry = str(int(max(1, decision.retry_after_s)))
        raise GatewayError(
            429,
            f"Rate limit reached for tenant '{tenant.id}' on {limit} per minute. Retry after {retry}s.",
            code=f"rate_limit_{limit}",
            headers=[(b"retry-after", retry.encode()), *headers],
        )
    ctx.reserved_live = True
    if headers:
        ctx.response_headers = headers


def store_unavailable(retry_after_s: float) -> GatewayError:
    """503 for a budgeted request the store cannot decide (`deny` mode)."""
    retry = str(max(1, math.ceil(retry_after_s)))
    return GatewayError(
        503, "Budget store unavailable; retry shortly.", code="state_store_unavailable", headers=[(b"retry-after", retry.encode())]
    )


# -- route ---------------------------------------------------------------
def route(state: RequestPathState, ctx: RequestContext) -> list:
    """Replicas to try, best first (503 when none is routable)."""
    g = state.settings.gateway
    ctx.policy, ctx.probe = state.policy_view.for_tenant(ctx.tenant.id).draw(random.random())
    traced = ctx.root is not None
    if traced:
        ctx.t_route_start_ns = _now_ns()
    replicas = ctx.replicas
    now = time.monotonic()
    limit = completion_limit(ctx.body)
    allowed = [r.breaker.allows(now) and fits_context(r, ctx.model, limit) for r in replicas]
    key = affinity_key(g.routing, ctx.body, ctx.session, g.prefix_chars) if g.routing != "least_load" else None
    request = RouteRequest(ctx.model, ctx.tenant.id, key, ctx.session or ctx.request_id)
    ranked = rank_replicas(replicas, request, ctx.policy, allowed=allowed)
    if traced:
        ctx.t_route_end_ns = _now_ns()
        ctx.candidates = [r.name for r in ranked]
    if not ranked:
        raise GatewayError(503, f"No healthy replica is available for model `{ctx.model}`.", code="no_healthy_replica")
    capture = state.capture
    if capture is not None:
        ctx.capture = capture.plan(ctx.tenant.id, ctx.tenant_label, ctx.policy, ctx.body, ctx.endpoint, ctx.model)
    return ranked
