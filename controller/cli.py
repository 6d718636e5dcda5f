"""`specgate controller`: run the speculation controller standalone.

Reads the same configuration as the gateway (`--config` YAML / `SPECGATE_*`:
replicas, tenants with TPOT targets, Redis URL) plus `SPECGATE_CONTROLLER_*`.
Several instances may run against one Redis; one leads (TTL lock).
"""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    @app.command("controller")
    def controller_cmd(
        config: Optional[str] = typer.Option(None, "--config", help="gateway/controller YAML config"),
        redis_url: Optional[str] = typer.Option(None, "--redis-url", help="overrides redis_url (required for several instances)"),
        tick_s: Optional[float] = typer.Option(None, "--tick", help="seconds between decisions"),
        metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help="serve /metrics on this port"),
        metrics_host: str = typer.Option("127.0.0.1", "--metrics-host"),
        instance_id: Optional[str] = typer.Option(None, "--id", help="instance id (default host-pid-random)"),
        min_dwell_s: Optional[float] = typer.Option(None, "--min-dwell", help="seconds a policy stays before a normal change"),
        gpu: Optional[str] = typer.Option(None, "--gpu", help="cost-model GPU (h100, h200)"),
        model: Optional[str] = typer.Option(None, "--model", help="cost-model target (qwen3-8b, qwen3-14b)"),
    ) -> None:
        """Run the speculation controller (standalone; leader-elected through the store)."""
        from gateway.config import ConfigError, load_settings
        from gateway.store import create_store

        from .service import Controller, ControllerConfig

        logging.basicConfig(level=logging.INFO, format='{"level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}')
        overrides = {"redis_url": redis_url} if redis_url else {}
        try:
            settings = load_settings(config, **overrides)
        except ConfigError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2)
        cc = {k: v for k, v in dict(tick_s=tick_s, instance_id=instance_id, min_dwell_s=min_dwell_s, gpu=gpu, model=model).items() if v is not None}
        ccfg = ControllerConfig(**cc)
        if settings.redis_url is None:
            typer.echo("warning: no redis_url: the controller runs on a private in-memory store no gateway can read", err=True)

        async def main() -> None:
            store = create_store(settings.redis_url, settings.redis_prefix)
            controller = Controller(settings, store, ccfg)
            server = None
            if metrics_port:
                from prometheus_client import start_http_server

                server, _ = start_http_server(metrics_port, addr=metrics_host, registry=controller.metrics.registry)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            try:
                await controller.run(stop)
            finally:
                await store.close()
                if server is not None:
                    server.shutdown()

        asyncio.run(main())
