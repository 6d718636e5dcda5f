"""`specgate up` and `specgate load`: the one-command demo stack and its load driver."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Optional

import typer

from contract.settings import DEFAULT_GPU, DEFAULT_MODEL

from . import DEFAULT_GATEWAY_PORT


def register(app: typer.Typer) -> None:
    @app.command("up")
    def up(
        port: int = typer.Option(DEFAULT_GATEWAY_PORT, help="gateway port"),
        host: str = typer.Option("127.0.0.1", help="gateway bind address"),
        replicas: str = typer.Option(
            "dspark-b8,dspark-b8,off", help="comma-separated profiles of the simulated replicas"
        ),
        gpu: str = typer.Option(DEFAULT_GPU, help="GPU the simulator imitates (h100, h200)"),
        model: str = typer.Option(DEFAULT_MODEL, help="target model the simulator imitates (qwen3-8b, qwen3-14b)"),
        redis_url: Optional[str] = typer.Option(
            None, envvar="SPECGATE_REDIS_URL", help="shared state in Redis (default: in-memory)"
        ),
        state_file: Path = typer.Option(
            None, help="where keys and URLs are written for `specgate load` (default ~/.cache/specgate/up.json)"
        ),
        min_dwell: float = typer.Option(10.0, help="controller: seconds a policy stays before a normal change"),
        time_scale: float = typer.Option(
            10.0, help="simulated replicas run this many times slower than the GPU they imitate, so a laptop's "
                      "load generator reaches the compute-bound regime (1 = real GPU speed)"),
    ) -> None:
        """Run gateway + embedded controller + simulated replicas (2x dspark-b8, 1x off); Ctrl-C stops all."""
        from .up import DEFAULT_STATE_FILE, make_plan, run_up

        profiles = tuple(p.strip() for p in replicas.split(",") if p.strip())
        try:
            plan = make_plan(host=host, port=port, profiles=profiles, gpu=gpu, model=model, redis_url=redis_url,
                             state_file=state_file or DEFAULT_STATE_FILE, min_dwell_s=min_dwell,
                             time_scale=time_scale)
        except ValueError as exc:
            typer.echo(f"specgate up: {exc}", err=True)
            raise typer.Exit(2)
        code = run_up(plan, out=lambda line: typer.echo(line))
        # Everything is stopped by now. What is left of the exit is the interpreter's final
        # collection over the whole heap (FastAPI, pydantic, OpenTelemetry, the controller): the
        # larger part of the exit after Ctrl-C (0.3 s median, 2 s at worst, in 79 stops on a loaded
        # two-core machine; 0.03 s / 1.2 s with the heap frozen), and nothing in it holds a resource.
        gc.freeze()
        raise typer.Exit(code)

    @app.command("load")
    def load(
        rps: float = typer.Option(40.0, help="peak request rate (req/s) of the heavy phase"),
        duration: float = typer.Option(120.0, help="seconds in total"),
        pattern: str = typer.Option("step", help="step (light -> heavy -> light) or constant"),
        state_file: Path = typer.Option(None, help="written by `specgate up` (default ~/.cache/specgate/up.json)"),
        gateway_url: Optional[str] = typer.Option(None, help="override the gateway URL from the state file"),
        max_inflight: int = typer.Option(256, help="cap on concurrent requests"),
        seed: int = typer.Option(0, help="random seed of the workload"),
        report: Optional[Path] = typer.Option(
            None, help="where the HTML report goes (default ~/.cache/specgate/load-<time>.html)"),
        no_report: bool = typer.Option(False, "--no-report", help="write no HTML report"),
    ) -> None:
        """Drive `specgate up` with a mixed-tenant workload; print controller switches as they happen, then
        per phase and tenant tok/s, TTFT, TPOT and acceptance, and write an HTML report with charts."""
        from .load import LoadConfig, default_report_path, load_target, run_load
        from .up import DEFAULT_STATE_FILE

        try:
            target = load_target(state_file or DEFAULT_STATE_FILE, gateway_url)
        except (OSError, ValueError, KeyError) as exc:
            typer.echo(f"specgate load: cannot read the state of `specgate up` ({exc}); is it running?", err=True)
            raise typer.Exit(2)
        if pattern not in ("step", "constant"):
            typer.echo("specgate load: --pattern must be step or constant", err=True)
            raise typer.Exit(2)
        cfg = LoadConfig(rps=rps, duration_s=duration, pattern=pattern, max_inflight=max_inflight, seed=seed,
                         report_path=None if no_report else (report or default_report_path()))
        summary = run_load(target, cfg, out=lambda line: typer.echo(line))
        raise typer.Exit(0 if summary.ok > 0 else 1)
