"""Run the controller inside the gateway process (single-node use).

The embedded controller is the same `Controller` as the standalone one, on
the gateway's own store (in-memory when no Redis is configured), so one
process serves requests and adapts speculation. With Redis it still takes
the leader lock, so an embedded controller and standalone ones coexist.

    handle = start_embedded(app.state.gateway)   # in the gateway's lifespan
    ...
    await handle.stop()
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from .service import Controller, ControllerConfig


@dataclass
class EmbeddedController:
    controller: Controller
    task: asyncio.Task
    _stop: asyncio.Event

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop, release leadership; bounded."""
        self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout=timeout_s)
        except asyncio.TimeoutError:
            self.task.cancel()
        except asyncio.CancelledError:
            pass


def start_embedded(gateway_state: Any, config: ControllerConfig | None = None, **kwargs: Any) -> EmbeddedController:
    """Start the controller loop as a task on the running event loop.

    `gateway_state` is the gateway's `GatewayState` (uses `.settings` and
    `.store`). The controller object is also attached to it as
    `gateway_state.controller` so the admin API can show live state.
    """
    controller = Controller(gateway_state.settings, gateway_state.store, config or ControllerConfig(), **kwargs)
    stop = asyncio.Event()
    task = asyncio.get_running_loop().create_task(controller.run(stop), name="specgate-controller")
    try:
        gateway_state.controller = controller
    except AttributeError:  # slotted state object: the admin API falls back to the store
        pass
    return EmbeddedController(controller, task, stop)


def embed_in_app(app: Any, config: ControllerConfig | None = None) -> None:
    """Wrap a gateway app's lifespan so the controller starts after the
    gateway's store and health loops and stops before them.

    Used by `specgate gateway --embedded-controller` and `specgate up`, so
    single-node deployments and the demo run the same wiring.
    """
    import contextlib

    gateway_lifespan = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def lifespan(a: Any):
        async with gateway_lifespan(a) as maybe_state:
            handle = start_embedded(a.state.gateway, config)
            try:
                yield maybe_state
            finally:
                await handle.stop()

    app.router.lifespan_context = lifespan
