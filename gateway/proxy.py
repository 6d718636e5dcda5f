"""The hot path: `/v1/chat/completions` and `/v1/completions` as a pure ASGI
endpoint (no Starlette request objects, no middleware), because every
microsecond here is paid on every request.

Order of work, each step failing with an OpenAI-shaped error:
auth (401) -> body size (413) -> JSON and shape (400) -> specgate knobs (400)
-> model (404) -> budget reservation (429 + Retry-After) -> routing (503)
-> upstream attempts with failover before the first byte -> relay (SSE
events forwarded as they arrive) -> usage/telemetry accounting.

A client disconnect (seen by a watcher on ASGI `receive`) cancels the work,
which closes the upstream connection so the replica aborts the request —
for streaming and non-streaming requests alike.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from typing import TYPE_CHECKING, Any

import orjson
from redis.exceptions import RedisError

from .errors import GatewayError
from .knobs import KnobError, merged_xargs, validate_client_xargs
from .routing import RouteRequest, affinity_key, rank_replicas
from .spec_telemetry import RequestSpecStats
from .sse import StreamTap, error_event
from .upstream import UpstreamBroken, UpstreamConnectError, UpstreamTimeout

if TYPE_CHECKING:
    from .app import GatewayState

log = logging.getLogger("specgate.gateway.proxy")
access_log = logging.getLogger("specgate.gateway.access")

_JSON = b"application/json"
_perf = time.perf_counter
_now_ns = time.time_ns


class _ClientGone(Exception):
    pass


async def send_error(send, err: GatewayError, extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = err.body()
    headers = [(b"content-type", _JSON), (b"content-length", str(len(body)).encode())]
    headers += err.headers
    if extra_headers:
        headers += extra_headers
    await send({"type": "http.response.start", "status": err.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive, limit: int, content_length: int | None) -> bytes:
    if content_length is not None and content_length > limit:
        raise GatewayError(413, f"Request body of {content_length} bytes exceeds the limit of {limit} bytes.", code="request_too_large")
    chunks = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone()
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise GatewayError(413, f"Request body exceeds the limit of {limit} bytes.", code="request_too_large")
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


class CompletionEndpoint:
    """ASGI endpoint for one OpenAI completion surface ("chat" or "completions")."""

    def __init__(self, state: "GatewayState", kind: str) -> None:
        self.state = state
        self.kind = kind
        self.path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        self.endpoint_label = "chat" if kind == "chat" else "completions"

    async def __call__(self, scope, receive, send) -> None:
        t0 = _perf()
        state = self.state
        if scope["method"] != "POST":
            await send_error(send, GatewayError(405, f"Method {scope['method']} not allowed; use POST."))
            return
        authorization = traceparent = tracestate = session = None
        content_length = None
        session_name = state.session_header
        for key, value in scope["headers"]:
            if key == b"authorization":
                authorization = value
            elif key == b"content-length":
                try:
                    content_length = int(value)
                except ValueError:
                    content_length = None
            elif key == b"traceparent":
                traceparent = value
            elif key == b"tracestate":
                tracestate = value
            elif key == session_name:
                session = value.decode("latin-1")
        tracing = state.tracing
        if not tracing.enabled:
            await self._handle(t0, scope, receive, send, authorization, content_length, traceparent, tracestate, session, None)
            return
        root = tracing.start("specgate.request", tracing.extract(traceparent, tracestate), "server", {"http.route": self.path})
        try:
            status = await self._handle(t0, scope, receive, send, authorization, content_length, traceparent, tracestate, session, root)
            root.set_attribute("http.status_code", status)
        finally:
            root.end()

    async def _handle(self, t0, scope, receive, send, authorization, content_length, traceparent, tracestate, session, root) -> int:
        state = self.state
        settings = state.settings
        tracing = state.tracing
        metrics = state.metrics
        tenant = None
        tenant_label = "unauthenticated"
        reserved = 0
        reserved_live = False
        replica_name = "none"
        status = 500
        watcher: asyncio.Task | None = None
        me = asyncio.current_task()
        gone = False
        root_ctx = None
        marks: list = []
        try:
            # -- auth ---------------------------------------------------
            # The auth and route spans are built after the response has gone
            # out, from timestamps taken here (`_record_spans`): the same
            # spans, but their SDK cost is off the latency path. Only the
            # root and proxy spans must exist before the upstream call, for
            # `traceparent`.
            if root is not None:
                root_ctx = tracing.context_of(root)
                marks = [_now_ns()]
            auth = state.tenants.authenticate(authorization)
            if root is not None:
                marks.append(_now_ns())
                marks.append(auth.tenant is not None)
            if auth.tenant is None:
                raise GatewayError(401, auth.error or "Unauthorized", code="invalid_api_key")
            tenant = auth.tenant
            tenant_label = metrics.tenant_label(tenant.id)

            # -- body -----------------------------------------------------
            raw = await _read_body(receive, settings.max_body_bytes, content_length)
            body = _parse_body(raw, self.kind)
            model = body["model"]
            stream = body.get("stream") is True
            try:
                client_xargs = validate_client_xargs(body.get("vllm_xargs"))
            except KnobError as exc:
                raise GatewayError(400, str(exc), param=exc.param, code="invalid_value") from None

            # -- model ----------------------------------------------------
            replicas = state.replica_list
            if not any(r.serves(model) for r in replicas):
                raise GatewayError(404, f"The model `{model}` does not exist.", param="model", code="model_not_found")

            # From here on a client disconnect cancels this task.
            watcher = asyncio.ensure_future(_watch_disconnect(receive, me))

            # -- budget ---------------------------------------------------
            estimate = state.estimate_tokens(body)
            try:
                decision, reserved = await state.accounting.reserve(tenant, estimate)
            except (OSError, ConnectionError, RedisError) as exc:
                # Fail closed: without the shared store the budget cannot be enforced.
                log.warning("budget store unavailable", extra={"fields": {"error": type(exc).__name__}})
                raise GatewayError(503, "Budget store unavailable; retry shortly.", code="state_store_unavailable") from None
            if decision is not None:
                if not decision.allowed:
                    limit = "tokens" if decision.denied_field == "tokens" else "requests"
                    metrics.child(metrics.rejections, tenant_label, limit).inc()
                    retry = str(int(max(1, decision.retry_after_s)))
                    raise GatewayError(
                        429,
                        f"Rate limit reached for tenant '{tenant.id}' on {limit} per minute. Retry after {retry}s.",
                        code=f"rate_limit_{limit}",
                        headers=[(b"retry-after", retry.encode())],
                    )
                reserved_live = True

            # -- route ----------------------------------------------------
            policy = state.policy_view.for_tenant(tenant.id)
            if root is not None:
                marks.append(_now_ns())
            now = time.monotonic()
            allowed = [r.breaker.allows(now) for r in replicas]
            key = affinity_key(settings.routing, body, session, settings.prefix_chars) if settings.routing != "least_load" else None
            ranked = rank_replicas(replicas, RouteRequest(model, tenant.id, key), policy, allowed=allowed)
            if root is not None:
                marks.append(_now_ns())
                marks.append([r.name for r in ranked])
            if not ranked:
                raise GatewayError(503, f"No healthy replica is available for model `{model}`.", code="no_healthy_replica")

            # -- upstream request body -------------------------------------
            strip_usage = False
            if stream:
                so = body.get("stream_options")
                if not (isinstance(so, dict) and so.get("include_usage") is True):
                    body["stream_options"] = {**(so if isinstance(so, dict) else {}), "include_usage": True}
                    strip_usage = True
            plain_body = orjson.dumps(body)
            bodies: dict[frozenset[str], bytes] = {}

            def body_for(replica) -> bytes:
                """The body for one replica: the policy's knobs where it honours them."""
                knobs = replica.ext_knobs
                cached = bodies.get(knobs)
                if cached is None:
                    xargs = merged_xargs(client_xargs, policy, knobs)
                    if xargs is client_xargs or xargs is None:
                        cached = plain_body
                    else:
                        cached = orjson.dumps({**body, "vllm_xargs": xargs})
                    bodies[knobs] = cached
                return cached

            # -- proxy ----------------------------------------------------
            headers = {"content-type": "application/json", "accept": "text/event-stream" if stream else "application/json"}
            proxy_span = None
            if root is not None:
                proxy_span = tracing.start("proxy", root_ctx, "client", {"specgate.tenant": tenant.id})
                tracing.inject(headers, tracing.context_of(proxy_span))
            elif traceparent:
                headers["traceparent"] = traceparent.decode("latin-1")
                if tracestate:
                    headers["tracestate"] = tracestate.decode("latin-1")
            try:
                resp, replica, t_up = await self._attempts(ranked, body_for, headers)
                replica_name = replica.name
                if proxy_span is not None:
                    proxy_span.set_attribute("specgate.replica", replica_name)
                try:
                    status = resp.status
                    if stream and status == 200:
                        usage, spec_metrics, status = await self._relay_stream(t0, t_up, resp, replica, send, strip_usage)
                    else:
                        usage, spec_metrics = await self._relay_whole(t0, t_up, resp, replica, send, stream)
                finally:
                    replica.inflight -= 1
            finally:
                if proxy_span is not None:
                    proxy_span.end()

            # -- accounting -----------------------------------------------
            if usage is None and reserved_live and status != 200:
                # The replica refused the request (its 4xx/5xx was relayed):
                # nothing was generated, so the token estimate goes back.
                state.accounting.settle(tenant, reserved, 0)
            if usage is not None:
                stats = RequestSpecStats.from_response(usage, spec_metrics)
                actual = stats.prompt_tokens + stats.completion_tokens
                if reserved_live:
                    state.accounting.settle(tenant, reserved, actual)
                state.accounting.record(tenant.id, replica_name, stats)
                metrics.child(metrics.tokens, tenant_label, "prompt").inc(stats.prompt_tokens)
                metrics.child(metrics.tokens, tenant_label, "completion").inc(stats.completion_tokens)
                if stats.num_draft_tokens is not None:
                    metrics.child(metrics.drafted, tenant_label, replica_name).inc(stats.num_draft_tokens)
                    metrics.child(metrics.accepted, tenant_label, replica_name).inc(stats.num_accepted_draft_tokens or 0)
                    if stats.num_spec_steps:
                        metrics.child(metrics.spec_steps, tenant_label, replica_name).inc(stats.num_spec_steps)
                        al = 1.0 + (stats.num_accepted_draft_tokens or 0) / stats.num_spec_steps
                        metrics.child(metrics.acceptance_length, tenant_label, replica_name).observe(al)
        except GatewayError as err:
            status = err.status
            if reserved_live and err.status in (503, 502):
                state.accounting.refund_request(tenant, reserved)
            if not gone:
                try:
                    await send_error(send, err)
                except Exception:
                    pass
        except _ClientGone:
            gone = True
            status = 499
        except asyncio.CancelledError:
            if watcher is not None and watcher.done() and not watcher.cancelled():
                # Our watcher cancelled us: the client went away. The upstream
                # response was closed by the relay's cleanup.
                gone = True
                status = 499
                me.uncancel()
            else:
                raise
        except Exception:
            log.exception("unexpected error in request path", extra={"fields": {"tenant": tenant.id if tenant else None}})
            status = 500
            try:
                await send_error(send, GatewayError(500, "Internal gateway error."))
            except Exception:
                pass
        finally:
            if watcher is not None and not watcher.done():
                watcher.cancel()
        elapsed = _perf() - t0
        if root is not None:
            _record_spans(tracing, root_ctx, marks)
        metrics.child(metrics.requests, tenant_label, replica_name, self.endpoint_label, str(status)).inc()
        metrics.child(metrics.latency, tenant_label, replica_name, str(status)).observe(elapsed)
        if state.settings.access_log:
            access_log.info(
                "request",
                extra={
                    "fields": {
                        "tenant": tenant.id if tenant else None,
                        "endpoint": self.endpoint_label,
                        "replica": replica_name,
                        "status": status,
                        "duration_ms": round(elapsed * 1000, 3),
                    }
                },
            )
        return status

    async def _attempts(self, ranked, body_for, headers: dict[str, str]):
        """Try replicas in rank order; fail over on connect errors and 5xx
        before the first byte. Returns (response, replica, t_upstream_start)."""
        state = self.state
        settings = state.settings
        metrics = state.metrics
        upstream = state.upstream
        last_5xx = None
        last_error = "no replica could be reached"
        n = len(ranked)
        for attempt in range(settings.max_attempts):
            replica = ranked[attempt % n]
            now = time.monotonic()
            if attempt and not replica.breaker.allows(now):
                continue
            if attempt:
                backoff = min(settings.retry_backoff_max_s, settings.retry_backoff_base_s * (2 ** (attempt - 1)))
                await asyncio.sleep(backoff * random.uniform(0.5, 1.0))
            replica.breaker.on_attempt(now)
            body = body_for(replica)
            replica.inflight += 1
            t_up = _perf()
            try:
                resp = await upstream.post(replica.url + self.path, body, headers)
            except UpstreamConnectError as exc:
                replica.inflight -= 1
                replica.breaker.on_failure(time.monotonic())
                metrics.child(metrics.attempts, replica.name, "connect_error").inc()
                last_error = f"replica {replica.name} unreachable: {exc}"
                continue
            except UpstreamTimeout:
                replica.inflight -= 1
                replica.breaker.on_failure(time.monotonic())
                metrics.child(metrics.attempts, replica.name, "timeout").inc()
                raise GatewayError(504, f"Replica {replica.name} did not answer within {settings.first_byte_timeout_s}s.", code="upstream_timeout") from None
            except BaseException:
                replica.inflight -= 1
                raise
            if resp.status >= 500:
                try:
                    data = await resp.read()
                    resp.release()
                except (UpstreamBroken, UpstreamTimeout):
                    resp.abort()
                    data = b""
                except BaseException:  # client gone while reading the error body
                    resp.abort()
                    raise
                finally:
                    replica.inflight -= 1
                replica.breaker.on_failure(time.monotonic())
                metrics.child(metrics.attempts, replica.name, f"http_{resp.status}").inc()
                last_5xx = (resp.status, resp.headers, data)
                continue
            replica.breaker.on_success()
            metrics.child(metrics.attempts, replica.name, "ok").inc()
            return resp, replica, t_up
        if last_5xx is not None:
            status, _headers, data = last_5xx
            if data.startswith(b"{"):
                raise GatewayError(status, "", raw_body=data)  # the replica's own OpenAI-shaped error
            raise GatewayError(502, f"Replica answered {status}.", code="upstream_error")
        raise GatewayError(503, last_error, code="no_healthy_replica")

    async def _relay_whole(self, t0, t_up, resp, replica, send, stream: bool):
        state = self.state
        try:
            data = await resp.read()
        except UpstreamTimeout:
            resp.abort()
            raise GatewayError(504, f"Replica {replica.name} stopped answering.", code="upstream_timeout") from None
        except UpstreamBroken as exc:
            resp.abort()
            raise GatewayError(502, f"Replica {replica.name} broke the connection: {exc}", code="upstream_error") from None
        except BaseException:
            resp.abort()
            raise
        resp.release()
        t_done = _perf()
        overhead = (t_up - t0) + (_perf() - t_done)
        headers = resp.headers + [
            (b"content-length", str(len(data)).encode()),
            (b"x-specgate-replica", replica.name.encode()),
            (b"x-specgate-overhead-ms", f"{overhead * 1000:.3f}".encode()),
        ]
        await send({"type": "http.response.start", "status": resp.status, "headers": headers})
        await send({"type": "http.response.body", "body": data})
        # Everything below runs after the response is out (usage parsing,
        # histograms): off the client's latency.
        state.metrics.child(state.metrics.overhead, self.endpoint_label, "false").observe(overhead)
        state.metrics.child(state.metrics.ttft, replica.name).observe(t_done - t_up)
        usage = spec = None
        if resp.status == 200 and not stream:
            try:
                obj = orjson.loads(data)
                if isinstance(obj, dict):
                    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
                    spec = obj.get("metrics") if isinstance(obj.get("metrics"), dict) else None
            except orjson.JSONDecodeError:
                pass
        return usage, spec

    async def _relay_stream(self, t0, t_up, resp, replica, send, strip_usage: bool):
        state = self.state
        metrics = state.metrics
        tap = StreamTap(strip_usage)
        t_headers = _perf()
        overhead_pre = t_headers - t0 - (t_headers - t_up)
        headers = resp.headers + [
            (b"x-specgate-replica", replica.name.encode()),
            (b"x-specgate-overhead-ms", f"{overhead_pre * 1000:.3f}".encode()),
        ]
        status = 200
        first = True
        t_first = None
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        try:
            async for data in resp.chunks():
                if t_first is None:
                    t_first = _perf()
                    metrics.child(metrics.ttft, replica.name).observe(t_first - t_up)
                out = tap.feed(data)
                if out:
                    await send({"type": "http.response.body", "body": out, "more_body": True})
                    if first:
                        first = False
                        overhead = overhead_pre + (_perf() - t_first)
                        metrics.child(metrics.overhead, self.endpoint_label, "true").observe(overhead)
            rest = tap.tail()
            if rest.strip():
                await send({"type": "http.response.body", "body": rest, "more_body": True})
            resp.release()
        except (UpstreamBroken, UpstreamTimeout) as exc:
            resp.abort()
            status = 502
            replica.breaker.on_failure(time.monotonic())
            log.warning("upstream stream broke", extra={"fields": {"replica": replica.name, "error": type(exc).__name__}})
            await send({"type": "http.response.body", "body": error_event(f"Replica {replica.name} failed mid-stream: {exc}"), "more_body": True})
        except BaseException:
            resp.abort()
            raise
        await send({"type": "http.response.body", "body": b""})
        return tap.usage, tap.metrics, status


def _record_spans(tracing, parent, marks: list) -> None:
    """Emit the auth (and, when reached, route) spans from the timestamps the
    request path took: [auth_start, auth_end, authenticated, route_start,
    route_end, candidates]."""
    if len(marks) >= 3:
        tracing.record("auth", parent, marks[0], marks[1], {"specgate.authenticated": marks[2]})
    if len(marks) >= 6:
        tracing.record("route", parent, marks[3], marks[4], {"specgate.candidates": marks[5]})


async def _watch_disconnect(receive, task: asyncio.Task) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            task.cancel()
            return


def _parse_body(raw: bytes, kind: str) -> dict[str, Any]:
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
    return body
