"""The one place the gateway's HTTP server is built: uvicorn with the
connection limits of `gateway.http_limits`, a bounded drain on SIGTERM, and
`/metrics` on a listener of its own when `gateway.metrics_port` is set.

Used by `specgate gateway` (one process, or `--workers N`), `specgate up`
and the gateway tests, so what is tested is what runs.

Drain (`GatewayServer`), why each step:
1. SIGTERM (or a first SIGINT): `state.draining = True` at once, so /ready
   answers 503 and load balancers take the instance out of rotation; the
   listener keeps accepting for `drain_pre_s`, because they keep sending
   until they have noticed.
2. Then `state.draining_closed = True` (new completion requests get 503)
   and the listener closes; idle kept-alive connections are closed, busy
   ones close after their response.
3. In-flight requests get `drain_deadline_s`. At the deadline
   `state.inflight_requests.abort("shutdown")` ends them the gateway's way
   (streams under way: an SSE error event and `[DONE]`; the rest: 503),
   and `ABORT_GRACE_S` later uvicorn cancels whatever is left.
4. Exit code 0: uvicorn re-raises the captured signal after its shutdown,
   which would make a clean drain exit 143; this server does not.
A second SIGINT stops at once (in-flight requests are cut).

With `--workers N` uvicorn's supervisor forwards SIGTERM to each worker,
and every worker runs this server (`GatewayMultiprocess`), so each drains
on its own; the supervisor closes its copy of the listening socket at once,
so the port stops accepting when the last worker has closed its listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import signal
import sys
import threading
import time
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE
from uvicorn.supervisors import multiprocess as _multiprocess

from .http_limits import ConnectionLimits, GatewayHttpProtocol, LimitedServerState

log = logging.getLogger("specgate.gateway")

# After the drain deadline's abort, the request tasks get this long to write
# their error events before uvicorn cancels them.
ABORT_GRACE_S = 2.0
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def find_gateway(app: Any) -> tuple[Any, Any]:
    """(GatewayState, metrics app) of a gateway app, through any middleware
    uvicorn wrapped it in (each keeps the wrapped app as `.app`); (None, None)
    for an app that is not a gateway."""
    for _ in range(16):
        if app is None:
            break
        app_state = getattr(app, "state", None)
        gateway = getattr(app_state, "gateway", None)
        if gateway is not None:
            return gateway, getattr(app_state, "metrics_app", None)
        app = getattr(app, "app", None)
    return None, None


def build_config(app: Any, settings, *, host: str = "127.0.0.1", port: int = 8080, workers: int = 1, **overrides: Any) -> uvicorn.Config:
    """uvicorn.Config for a gateway app (an instance, or an import string with
    `factory=True` for workers). `settings` sizes uvicorn's own graceful
    shutdown just above the drain deadline so the drain's abort comes first."""
    g = settings.gateway
    kwargs: dict[str, Any] = dict(
        host=host,
        port=port,
        workers=workers,
        loop="uvloop",
        http=GatewayHttpProtocol,
        ws="none",
        lifespan="on",
        access_log=False,
        # No `server: uvicorn` on every response: it names a library to any
        # client (and is one more header to write per response).
        server_header=False,
        log_config=None,
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=math.ceil(g.drain_deadline_s + ABORT_GRACE_S),
        timeout_keep_alive=g.keep_alive_timeout_s,
    )
    kwargs.update(overrides)
    return uvicorn.Config(app, **kwargs)


class GatewayServer(uvicorn.Server):
    """uvicorn's server with the connection limits, the drain and the
    metrics listener. `drain_pre_s`/`drain_deadline_s` override the settings
    (`specgate up` drains in a moment; a laptop has no load balancer)."""

    def __init__(self, config: uvicorn.Config, *, drain_pre_s: float | None = None, drain_deadline_s: float | None = None) -> None:
        super().__init__(config)
        self.server_state = LimitedServerState()
        self.gateway = None
        self.drain_pre_s = drain_pre_s
        self.drain_deadline_s = drain_deadline_s
        self.drain_started_at: float | None = None
        self._drain_logged = False
        self._metrics_servers: list[asyncio.base_events.Server] = []
        self._metrics_state: LimitedServerState | None = None

    # Start-up ---------------------------------------------------------------
    async def startup(self, sockets=None) -> None:
        gateway, metrics_app = find_gateway(self.config.loaded_app)
        self.gateway = gateway
        if gateway is not None:
            g = gateway.settings.gateway
            self.server_state.limits = ConnectionLimits.from_settings(g)
            if self.drain_pre_s is None:
                self.drain_pre_s = g.drain_pre_s
            if self.drain_deadline_s is None:
                self.drain_deadline_s = g.drain_deadline_s
            if self.drain_started_at is not None:  # signalled during start-up
                gateway.draining = True
        self.drain_pre_s = 0.0 if self.drain_pre_s is None else self.drain_pre_s
        self.drain_deadline_s = 20.0 if self.drain_deadline_s is None else self.drain_deadline_s
        floor = self.drain_deadline_s + ABORT_GRACE_S
        if self.config.timeout_graceful_shutdown is None or self.config.timeout_graceful_shutdown < floor:
            self.config.timeout_graceful_shutdown = math.ceil(floor)
        await super().startup(sockets)
        metrics_port = gateway.settings.gateway.metrics_port if gateway is not None else None
        if self.started and metrics_port is not None and metrics_app is not None:
            await self._start_metrics_listener(metrics_app, metrics_port)

    @property
    def listening(self) -> bool:
        """Every listener is up: uvicorn's `started` is set once the main one is,
        before `startup` opens the /metrics listener (`metrics_port`)."""
        if not self.started:
            return False
        wants_metrics = self.gateway is not None and self.gateway.settings.gateway.metrics_port is not None
        return not wants_metrics or bool(self._metrics_servers)

    async def _start_metrics_listener(self, metrics_app: Any, port: int) -> None:
        """/metrics alone on `port`, same host, same limits; it stays open
        through the drain (scrapes still answer) and closes last."""
        mconfig = uvicorn.Config(
            metrics_app, lifespan="off", proxy_headers=False, server_header=False, ws="none", log_config=None, access_log=False,
            http=GatewayHttpProtocol,
        )
        mconfig.load()
        state = self._metrics_state = LimitedServerState(self.server_state.limits)
        loop = asyncio.get_running_loop()

        def protocol() -> asyncio.Protocol:
            return GatewayHttpProtocol(config=mconfig, server_state=state, app_state={})

        try:
            # Workers share the metrics port like the main one; a scrape then reads one worker.
            server = await loop.create_server(protocol, host=self.config.host, port=port, reuse_port=self.config.workers > 1)
        except OSError as exc:
            log.error("cannot listen for /metrics on port %s: %s", port, exc)
            for s in self.servers:
                s.close()
            await self.lifespan.shutdown()
            sys.exit(STARTUP_FAILURE)
        self._metrics_servers.append(server)

    # Signals and drain ------------------------------------------------------
    @contextlib.contextmanager
    def capture_signals(self):
        """Like uvicorn's, except that the captured signal is not re-raised
        after shutdown: a drained exit is a clean exit (code 0)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        original = {sig: signal.signal(sig, self.handle_exit) for sig in _SIGNALS}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame) -> None:
        """Signal handler: only flags (no logging, no loop calls)."""
        if self.drain_started_at is None:
            self.begin_drain()
        elif sig == signal.SIGINT:  # a second Ctrl-C: stop now
            self.should_exit = True
            self.force_exit = True

    def begin_drain(self) -> None:
        """Step 1: not ready from now on; the listener closes after `drain_pre_s`."""
        if self.drain_started_at is not None:
            return
        self.drain_started_at = time.monotonic()
        if self.gateway is not None:
            self.gateway.draining = True
        if not self.drain_pre_s:
            self.should_exit = True

    async def on_tick(self, counter: int) -> bool:
        if self.drain_started_at is not None and not self.should_exit:
            if not self._drain_logged:
                self._drain_logged = True
                log.info("draining: /ready answers 503; the listener closes in %.1f s, in-flight requests then get %.1f s",
                         self.drain_pre_s, self.drain_deadline_s)
            if time.monotonic() - self.drain_started_at >= self.drain_pre_s:
                self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets=None) -> None:
        """Steps 2-3 (uvicorn's shutdown closes the listener and waits for the
        requests; the abort timer ends them at the deadline)."""
        if self.gateway is not None:
            self.gateway.draining = True
            self.gateway.draining_closed = True
        abort = asyncio.get_running_loop().call_later(self.drain_deadline_s, self._abort_inflight)
        try:
            await super().shutdown(sockets)
        finally:
            abort.cancel()
            self._close_metrics_listener()

    def _abort_inflight(self) -> None:
        if self.gateway is None:
            return
        n = self.gateway.inflight_requests.abort("shutdown")
        if n:
            log.warning("drain deadline reached: ended %d in-flight request(s)", n)

    def _close_metrics_listener(self) -> None:
        for server in self._metrics_servers:
            server.close()
        if self._metrics_state is not None:
            for connection in list(self._metrics_state.connections):
                connection.transport.close()
        self._metrics_servers = []


class GatewayProcess(_multiprocess.Process):
    """A uvicorn worker process that runs `GatewayServer`."""

    @property
    def server(self) -> uvicorn.Server:
        if self._server is None:
            self._server = GatewayServer(config=self.config)
        return self._server


class GatewayMultiprocess(_multiprocess.Multiprocess):
    """uvicorn's supervisor with `GatewayServer` workers.

    uvicorn builds its workers from the module-level `Process` name in three
    places (start, restart, replace a dead one); swapping that name while
    the supervisor runs is the smallest change that reaches all three. The
    supervisor is a process of its own, so nothing else sees the swap."""

    def run(self) -> None:
        original = _multiprocess.Process
        _multiprocess.Process = GatewayProcess
        try:
            super().run()
        finally:
            _multiprocess.Process = original

    def terminate_all(self) -> None:
        super().terminate_all()
        # Each worker keeps its own copy of the listening socket open through its
        # pre-drain window; the supervisor's copy must not outlive them, or the
        # kernel would keep completing handshakes nobody serves.
        for sock in self.sockets:
            sock.close()


def serve(config: uvicorn.Config, **drain: Any) -> int:
    """Run a gateway config to completion (workers or not); the exit code."""
    if config.workers > 1:
        sock = config.bind_socket()
        GatewayMultiprocess(config, sockets=[sock]).run()
        return 0
    server = GatewayServer(config, **drain)
    server.run()
    return 0 if server.started else STARTUP_FAILURE
