"""Gateway test fixtures: real uvicorn servers on loopback ports (each in its
own thread and event loop), the documented fake OpenAI backend
(`testbed/fake_openai.py`) as the replica, real Redis for state."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import httpx
import pytest
import uvicorn

from testbed.fake_openai import FakeBackend
from gateway.app import create_app
from gateway.server import GatewayServer, build_config, find_gateway
from contract.settings import hash_key, load_settings
from testbed.procs import free_port
from tests.conftest import wait_for  # noqa: F401 - re-exported to the gateway tests

KEYS = {"alpha": "sk-alpha-0123456789", "beta": "sk-beta-0123456789", "gamma": "sk-gamma-0123456789"}


class ServerThread:
    """A uvicorn server for one ASGI app, in a background thread. Gateway apps
    run on the server production uses (`gateway.server`: connection limits,
    drain, metrics listener); other apps (the fake backend) on plain uvicorn."""

    def __init__(self, app: Any, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        state, _ = find_gateway(app)
        if state is not None:
            config = build_config(app, state.settings, host="127.0.0.1", port=port, log_level="warning")
            self.server: uvicorn.Server = GatewayServer(config)
        else:
            config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on", access_log=False)
            self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.time() + 20
        # GatewayServer: every listener, the /metrics one included; plain uvicorn: its one.
        while not getattr(self.server, "listening", self.server.started):
            if not self.thread.is_alive():
                raise RuntimeError("server thread exited during start-up")
            if time.time() > deadline:
                raise TimeoutError("server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


@dataclass
class Backend:
    fake: FakeBackend
    server: ServerThread

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.stop()


@dataclass
class Gateway:
    app: Any
    server: ServerThread

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def state(self):
        return self.app.state.gateway

    def v1(self) -> str:
        return self.server.url + "/v1"


@pytest.fixture
def start_backend() -> Callable[..., Backend]:
    started: list[Backend] = []

    def _start(**kwargs: Any) -> Backend:
        fake = FakeBackend(**kwargs)
        b = Backend(fake, ServerThread(fake, free_port()).start())
        started.append(b)
        return b

    yield _start
    for b in started:
        b.stop()


def tenant(name: str, **limits: Any) -> dict[str, Any]:
    return {"id": name, "api_key_sha256": hash_key(KEYS[name]), **limits}


@pytest.fixture
def start_gateway(redis_url, redis_prefix) -> Callable[..., Gateway]:
    started: list[Gateway] = []

    def _start(replicas: list[dict[str, Any]], tenants: list[dict[str, Any]] | None = None, **gateway: Any) -> Gateway:
        """Keyword arguments are settings of the `gateway` section."""
        settings = load_settings(
            replicas=replicas,
            tenants=tenants if tenants is not None else [tenant("alpha"), tenant("beta")],
            redis_url=redis_url,
            redis_prefix=redis_prefix,
            admin_key="admin-secret",
            gateway={"health_interval_s": 30.0, "metrics_interval_s": 0.2, "telemetry_flush_s": 0.1, "policy_poll_s": 0.2, **gateway},
        )
        app = create_app(settings)
        gw = Gateway(app, ServerThread(app, free_port()).start())
        started.append(gw)
        return gw

    yield _start
    for gw in started:
        gw.server.stop()



def backend_requests(backend: Backend) -> list[dict[str, Any]]:
    return httpx.get(backend.url + "/_fake/requests").json()


def run_async(coro):
    return asyncio.run(coro)


def read_until_close(sock: socket.socket, timeout: float = 10.0) -> bytes:
    """Everything a raw connection receives until the server closes it (or `timeout`)."""
    sock.settimeout(timeout)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (ConnectionResetError, socket.timeout):
        pass
    return out
