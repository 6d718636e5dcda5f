"""`specgate controller`: run the speculation controller standalone.

Reads the one settings tree (`--config` YAML / `SPECGATE_*`: replicas,
tenants with TPOT targets, Redis URL, the `controller` section, e.g.
`SPECGATE_CONTROLLER__TICK_S`). Several instances may run against one Redis;
one leads (TTL lock). `--admin-port` serves the admin API (the controller
owns policies and overrides) and /metrics.
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
        config: Optional[str] = typer.Option(None, "--config", help="specgate YAML config (contract/settings.py)"),
        redis_url: Optional[str] = typer.Option(None, "--redis-url", help="overrides redis_url (required for several instances)"),
        tick_s: Optional[float] = typer.Option(None, "--tick", help="seconds between decisions (controller.tick_s)"),
        admin_port: Optional[int] = typer.Option(None, "--admin-port", help="serve the admin API and /metrics on this port"),
        metrics_port: Optional[int] = typer.Option(None, "--metrics-port", help="serve only /metrics on this port"),
        host: str = typer.Option("127.0.0.1", "--host", "--metrics-host", help="bind address of --admin-port / --metrics-port"),
        instance_id: Optional[str] = typer.Option(None, "--id", help="instance id (controller.instance_id)"),
        min_dwell_s: Optional[float] = typer.Option(None, "--min-dwell", help="controller.decision.min_dwell_s"),
        gpu: Optional[str] = typer.Option(None, "--gpu", help="optional step-cost prior, GPU preset (controller.gpu: h100, h200); the curve is learned either way"),
        model: Optional[str] = typer.Option(None, "--model", help="optional step-cost prior, target preset (controller.model: qwen3-8b, qwen3-14b); with --gpu"),
    ) -> None:
        """Run the speculation controller (standalone; leader-elected through the store)."""
        from contract.settings import ConfigError, load_settings
        from contract.store import create_store

        from .service import Controller

        logging.basicConfig(level=logging.INFO, format='{"level":"%(levelname)s","logger":"%(name)s","msg":"%(message)s"}')
        section = {k: v for k, v in dict(tick_s=tick_s, instance_id=instance_id, gpu=gpu, model=model).items() if v is not None}
        if min_dwell_s is not None:
            section["decision"] = {"min_dwell_s": min_dwell_s}
        overrides: dict = {"redis_url": redis_url} if redis_url else {}
        if section:
            overrides["controller"] = section
        try:
            settings = load_settings(config, **overrides)
        except ConfigError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(2)
        if settings.redis_url is None:
            typer.echo("warning: no redis_url: the controller runs on a private in-memory store no gateway can read", err=True)

        async def main() -> None:
            store = create_store(settings.redis_url, settings.redis_prefix)
            controller = Controller(settings, store)
            server = admin = None
            if metrics_port:
                from prometheus_client import start_http_server

                server, _ = start_http_server(metrics_port, addr=host, registry=controller.metrics.registry)
            if admin_port:
                import uvicorn

                from .admin_app import ControllerAdminHost, create_admin_app

                app = create_admin_app(ControllerAdminHost(settings, store, controller))
                admin = uvicorn.Server(uvicorn.Config(app, host=host, port=admin_port, log_level="warning", access_log=False))
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            admin_task = None
            if admin is not None:
                admin.install_signal_handlers = lambda: None  # this loop owns SIGINT/SIGTERM
                admin_task = asyncio.create_task(admin.serve())
            try:
                await controller.run(stop)
            finally:
                if admin_task is not None:
                    admin.should_exit = True
                    await admin_task
                await store.close()
                if server is not None:
                    server.shutdown()

        asyncio.run(main())
