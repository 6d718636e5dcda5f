"""One request's state as it moves through the stages of the request path
(auth -> parse -> admit -> route -> relay -> outcome).

Each stage reads what earlier stages wrote and writes its own fields; the
outcome stage reads whatever was reached, so a request that failed early
still gets the right status, labels, refunds, spans and access-log line.
Trace timestamps are named fields, taken only when the request is traced
(`root` is set); spans are built from them after the response is out.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contract.policy import SpeculationPolicy
    from contract.settings import TenantConfig
    from contract.telemetry import RequestSpecStats

    from .capture import CapturePlan, StreamSeen, WholeIds
    from .replicas import ReplicaState


@dataclass(slots=True, eq=False)
class RequestContext:
    # -- from the ASGI scope (set by the endpoint) ------------------------
    t0: float  # perf_counter at arrival
    endpoint: str  # "chat" | "completions": the surface, and its metrics label
    path: str  # upstream path, e.g. "/v1/chat/completions"
    authorization: bytes | None = None
    content_length: int | None = None
    session: str | None = None
    traceparent: bytes | None = None
    tracestate: bytes | None = None
    root: Any = None  # the `specgate.request` span; None when not traced
    root_ctx: Any = None  # its context, parent of the auth/route/proxy spans

    # -- auth ----------------------------------------------------------
    tenant: TenantConfig | None = None
    tenant_label: str = "unauthenticated"

    # -- parse ---------------------------------------------------------
    body: dict[str, Any] | None = None
    model: str = ""
    stream: bool = False
    client_xargs: dict[str, Any] | None = None
    replicas: list[ReplicaState] | None = None  # the registry as of the model check; routing ranks these

    # -- admit ---------------------------------------------------------
    reserved: int = 0  # tokens reserved for this request
    reserved_live: bool = False  # a budget reservation exists that must be settled or refunded

    # -- route ---------------------------------------------------------
    policy: SpeculationPolicy | None = None  # what this request follows: the tenant's policy, or its probe arm
    probe: str | None = None  # the tenant's policy has a probe: "probe" (this request drawn into it) or "policy"
    capture: CapturePlan | None = None  # a capture candidate (gateway.capture): ids are asked of the replica

    # -- relay ---------------------------------------------------------
    attempt: ReplicaState | None = None  # the replica the current upstream attempt is on
    replica: ReplicaState | None = None  # the replica whose response is relayed
    t_upstream: float = 0.0  # perf_counter when that attempt started
    status: int = 500
    usage: dict[str, Any] | None = None
    spec_metrics: dict[str, Any] | None = None
    capture_seen: StreamSeen | WholeIds | None = None  # a capture candidate's response as the relay saw it
    # A continued stream (gateway.stream.splice): (replica, its part's stats) per
    # replica that produced part of it; None: one replica produced it all.
    parts: list[tuple[str, RequestSpecStats]] | None = None
    # Every continuation attempt of a broken stream, in order: (replica, "done" |
    # "spliced" (sent bytes, then broke) | "failed" | "refused"); None: none made.
    continuations: list[tuple[str, str]] | None = None
    watcher: asyncio.Future | None = None  # cancels the request when the client disconnects
    response_started: bool = False  # http.response.start was sent: errors from here on go in-band
    response_headers: list[tuple[bytes, bytes]] | None = None  # added to the response (x-ratelimit-*), set by admit
    # Why the gateway itself cancelled this request's task (`abort`), e.g.
    # "shutdown" at the drain deadline or "replica_wedged"; None: it did not.
    abort_reason: str | None = None
    aborted_replica: ReplicaState | None = None  # the wedged replica whose attempt was cancelled
    stream_error: str | None = None  # the code of the SSE error event that ended the stream, if one did
    request_id: str = ""  # set by the endpoint; in error bodies, SSE error events and log lines, never replica details

    # -- trace marks (time.time_ns; only when traced) ---------------------
    t_auth_start_ns: int = 0
    t_auth_end_ns: int = 0  # 0: auth not reached
    authenticated: bool = False
    t_route_start_ns: int = 0
    t_route_end_ns: int = 0
    candidates: list[str] | None = None  # ranked replica names; None: routing not reached

    @property
    def replica_name(self) -> str:
        return "none" if self.replica is None else self.replica.name

    def client_headers(self) -> list[tuple[bytes, bytes]]:
        """The headers every response to this request carries: its id (in
        the gateway's log lines too) and admit's rate-limit headers."""
        extra = [(b"x-request-id", self.request_id.encode())]
        if self.response_headers:
            extra += self.response_headers
        return extra

    @property
    def client_gone(self) -> bool:
        """The disconnect watcher fired (it cancels the request's task)."""
        w = self.watcher
        return w is not None and w.done() and not w.cancelled()
