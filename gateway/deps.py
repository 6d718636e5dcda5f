"""What the request path needs from the gateway, and nothing more.

`proxy.CompletionEndpoint` and its stages depend on this Protocol, not on
`app.GatewayState`: the app module builds the state and the endpoints, so
the request path must not import it back. `GatewayState` satisfies it
structurally; tests may pass any object with these attributes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from contract.policy import PolicySet
    from contract.settings import Settings

    from .accounting import Accounting
    from .auth import TenantDirectory
    from .capture_mirror import CaptureMirror
    from .inflight import InflightRequests
    from .metrics import GatewayMetrics
    from .policy_watch import PolicyView
    from .replicas import Registry, ReplicaState
    from .tracing import Tracing
    from .upstream import Upstream


class RequestPathState(Protocol):
    settings: Settings
    tenants: TenantDirectory
    metrics: GatewayMetrics
    tracing: Tracing
    policy_view: PolicyView
    session_header: bytes  # lower-cased header name carrying the session id
    upstream: Upstream  # set when the app starts
    accounting: Accounting  # set when the app starts
    inflight_requests: InflightRequests  # the instance's in-flight cap and `abort`
    draining_closed: bool  # past the drain's pre-window: new completion requests get 503
    capture: CaptureMirror | None  # the capture mirror; None: capture off (no target configured)

    @property
    def replica_list(self) -> list[ReplicaState]: ...

    def estimate_tokens(self, body: dict) -> int: ...


class ServedState(RequestPathState, Protocol):
    """What the gateway's other routes read (`routes.py`, `metrics_exposure.py`):
    the request path's view plus the registry, the policy set and readiness."""

    registry: Registry

    @property
    def policies(self) -> PolicySet: ...

    def readiness(self) -> tuple[bool, dict]: ...
