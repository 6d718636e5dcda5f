"""The instance's in-flight completion requests: the cap that keeps one
instance from queueing without bound, and the one way the gateway ends
requests itself (`abort`): at the drain deadline, or when the replica an
attempt waits on is found wedged.

Why a registry and task cancellation: a request waits inside an upstream
read that only a cancellation interrupts promptly; the request path sees
`ctx.abort_reason` and turns the cancellation into a failover (no byte sent
yet), a continuation or an SSE error event (stream under way), or a 503
(shutdown). Also here: `UpstreamAttempt`, the one place a replica's count
of open upstream attempts (`ReplicaState.open_attempts`) changes.

Names: "in flight" is a request this instance has taken and not answered
(`InflightRequests`); an *attempt* is one upstream request for it, on one
replica, open until its response is done with.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .replicas import ReplicaState
    from .request_context import RequestContext


class InflightRequests(dict):
    """task -> its `RequestContext`, for every completion request in flight.
    A dict itself so that the endpoint's check, add and remove, paid on
    every request, are `len`, item assignment and `del` (no Python calls)."""

    __slots__ = ("limit",)

    def __init__(self, limit: int) -> None:
        super().__init__()
        self.limit = limit

    def abort(self, reason: str, replica: ReplicaState | None = None) -> int:
        """Cancel every request (or those whose current attempt is on
        `replica`) with `reason`; returns how many were cancelled."""
        n = 0
        for task, ctx in list(self.items()):
            if task.done() or ctx.abort_reason is not None:
                continue
            if replica is not None and ctx.attempt is not replica:
                continue
            ctx.abort_reason = reason
            ctx.aborted_replica = replica
            task.cancel()
            n += 1
        return n


def take_abort(ctx: RequestContext, reason: str) -> bool:
    """Whether the cancellation being handled is the gateway's own `abort`
    with `reason` (not the client leaving, not a shutdown); if so it is
    consumed: the task is uncancelled and may go on (fail over, continue)."""
    if ctx.abort_reason != reason or ctx.client_gone:
        return False
    ctx.abort_reason = None
    asyncio.current_task().uncancel()
    return True


class UpstreamAttempt:
    """`with UpstreamAttempt(replica, ctx):` one upstream attempt counts in the
    replica's load from before its request is sent until its response is done
    with, and is the request's current attempt (what a wedge abort targets)."""

    __slots__ = ("replica", "ctx")

    def __init__(self, replica, ctx: RequestContext | None = None) -> None:
        self.replica = replica
        self.ctx = ctx

    def __enter__(self) -> None:
        self.replica.open_attempts += 1
        if self.ctx is not None:
            self.ctx.attempt = self.replica

    def __exit__(self, *exc) -> None:
        self.replica.open_attempts -= 1
        if self.ctx is not None:
            self.ctx.attempt = None
