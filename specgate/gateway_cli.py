"""`specgate gateway` (run the gateway, with the admin API and optionally the
controller in the same process: `specgate.node`) and `specgate hash-key`
(print the SHA-256 to put in a tenant's `api_key_sha256`)."""

from __future__ import annotations

import sys
from typing import Optional

import typer

from . import DEFAULT_GATEWAY_PORT


def _tune_gc() -> None:
    """Per-request objects die young; long-lived ones (modules, models, app)
    are frozen out of the collector so full collections stop rescanning them.
    Measured in bench/gateway_overhead.py: cuts gateway CPU per request."""
    import gc

    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


def register(app: typer.Typer) -> None:
    @app.command("gateway")
    def gateway(
        config: Optional[str] = typer.Option(None, "--config", "-c", help="YAML config file (also SPECGATE_CONFIG)"),
        host: str = typer.Option("127.0.0.1", help="bind address"),
        port: int = typer.Option(DEFAULT_GATEWAY_PORT, help="bind port"),
        workers: int = typer.Option(1, help="uvicorn worker processes (share state through Redis)"),
        embedded_controller: bool = typer.Option(
            False, "--embedded-controller", help="also run the speculation controller in this process (single node)"
        ),
    ) -> None:
        """Run the OpenAI-compatible gateway in front of the configured replicas."""
        import os

        from contract.settings import ConfigError, load_settings
        from gateway.server import build_config, serve

        try:
            settings = load_settings(config)
        except ConfigError as exc:
            typer.echo(str(exc), err=True)
            raise typer.Exit(code=2)
        if config:
            os.environ["SPECGATE_CONFIG"] = os.path.abspath(config)
        from .node import create_node_app

        _tune_gc()
        if workers > 1:
            if embedded_controller:
                typer.echo("--embedded-controller needs --workers 1 (run `specgate controller` beside several workers)", err=True)
                raise typer.Exit(code=2)
            # Each worker builds its app from SPECGATE_CONFIG and runs gateway.server's drain on its own.
            app_ref = "specgate.node:create_node_app"
            raise typer.Exit(code=serve(build_config(app_ref, settings, host=host, port=port, workers=workers, factory=True)))
        app_obj = create_node_app(settings, controller=embedded_controller)
        raise typer.Exit(code=serve(build_config(app_obj, settings, host=host, port=port)))

    @app.command("hash-key")
    def hash_key_cmd(key: Optional[str] = typer.Argument(None, help="API key (read from stdin when omitted)")) -> None:
        """Print the SHA-256 of an API key for `tenants[].api_key_sha256`."""
        from contract.settings import hash_key

        value = key if key is not None else sys.stdin.readline().strip()
        typer.echo(hash_key(value))
