"""In-process servers for end-to-end tests: real uvicorn on loopback ports.

The gateway, the HTTP sim replicas (drafters.sim.server — a documented
SIMULATION of vLLM + DSpark on an H200) and the controller all run as tasks
on the test's event loop; every start and stop is bounded.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import AsyncIterator

import uvicorn


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.asynccontextmanager
async def serve(app, timeout_s: float = 20.0) -> AsyncIterator[str]:
    """Run an ASGI app on a free loopback port; yields its base URL."""
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", access_log=False)
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(int(timeout_s / 0.05)):
            if server.started:
                break
            if task.done():
                task.result()
            await asyncio.sleep(0.05)
        else:
            raise TimeoutError(f"server on port {port} did not start")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        try:
            await asyncio.wait_for(task, timeout=10)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            task.cancel()


@contextlib.asynccontextmanager
async def sim_replica(profile: str, name: str, **kw) -> AsyncIterator[str]:
    from drafters.sim.server import SimReplicaSettings, create_app

    settings = SimReplicaSettings(profile=profile, name=name, **kw)
    async with serve(create_app(settings)) as url:
        yield url


async def wait_for(predicate, timeout_s: float, interval_s: float = 0.05, what: str = "condition"):
    """Poll an (async or sync) predicate until truthy; bounded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(interval_s)


@contextlib.asynccontextmanager
async def controller_with_admin(settings, redis_url: str, prefix: str, headers: dict):
    """A `Controller` on its own Redis connection (ticked by the test) and the
    standalone admin app over loopback; yields (store, controller, admin client)."""
    import httpx

    from contract.store.redis_store import RedisStore
    from controller.admin_app import ControllerAdminHost, create_admin_app
    from controller.service import Controller

    async with contextlib.AsyncExitStack() as stack:
        store = RedisStore(redis_url, prefix=prefix)
        stack.push_async_callback(store.close)
        ctl = Controller(settings, store)
        stack.push_async_callback(ctl.close)
        admin_url = await stack.enter_async_context(serve(create_admin_app(ControllerAdminHost(settings, store, ctl))))
        http = await stack.enter_async_context(httpx.AsyncClient(base_url=admin_url, headers=headers, timeout=10))
        yield store, ctl, http
