"""Run a `Controller` loop as a task beside other work in one process.

Used by the single-node composition (`specgate.node`, behind `specgate up`
and `specgate gateway --embedded-controller`): the same `Controller` as the
standalone one, on the host's store (in-memory when no Redis is
configured), so one process serves requests and adapts speculation. With
Redis it still takes the leader lock, so an embedded controller and
standalone ones coexist.

    handle = ControllerTask.start(controller)   # inside a running event loop
    ...
    await handle.stop()
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from .service import Controller


@dataclass
class ControllerTask:
    controller: Controller
    task: asyncio.Task
    _stop: asyncio.Event

    @classmethod
    def start(cls, controller: Controller) -> "ControllerTask":
        """Start the controller loop as a task on the running event loop."""
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(controller.run(stop), name="specgate-controller")
        return cls(controller, task, stop)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop, release leadership; bounded."""
        self._stop.set()
        try:
            await asyncio.wait_for(asyncio.shield(self.task), timeout=timeout_s)
        except asyncio.TimeoutError:
            self.task.cancel()
        except asyncio.CancelledError:
            pass
