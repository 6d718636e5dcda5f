"""`specgate profile ...`, `specgate checkpoint validate ...` and `specgate sim-replica ...`.

Why here: each package owns its commands (`register(app)`), so importing the
CLI stays cheap and this package's dependencies stay local.
"""

from __future__ import annotations

import json
import shlex

import typer


def register(app: typer.Typer) -> None:
    profile_app = typer.Typer(help="Speculation profiles (off, dspark-b4|b8|b16[-av]) and their vLLM launch arguments.",
                              no_args_is_help=True)

    @profile_app.command("show")
    def profile_show(
        label: str = typer.Argument(..., help="profile label, e.g. dspark-b8-av"),
        drafter: str = typer.Option("", "--drafter", help="DSpark drafter checkpoint (path or HF id)"),
        target: str = typer.Option("Qwen/Qwen3-8B", "--target", help="target model served by vLLM"),
        as_json: bool = typer.Option(False, "--json", help="print a JSON object instead of a shell line"),
    ) -> None:
        """Print the `vllm serve` command line (and environment) a profile implies."""
        from .profiles import parse_profile, speculative_config, vllm_env, vllm_launch_args

        try:
            prof = parse_profile(label)
            argv = vllm_launch_args(prof, target, drafter or None)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        env = vllm_env(prof)
        if as_json:
            typer.echo(json.dumps({"profile": prof.label, "argv": argv, "env": env,
                                   "speculative_config": speculative_config(prof, drafter) if prof.speculative else None},
                                  indent=2))
            return
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        typer.echo((prefix + " " if prefix else "") + " ".join(shlex.quote(a) for a in argv))

    @profile_app.command("list")
    def profile_list() -> None:
        """List the profile labels."""
        from .profiles import PROFILE_LABELS

        for label in PROFILE_LABELS:
            typer.echo(label)

    app.add_typer(profile_app, name="profile")

    ckpt_app = typer.Typer(help="DSpark drafter checkpoints (speculators format).", no_args_is_help=True)

    @ckpt_app.command("validate")
    def checkpoint_validate(
        path: str = typer.Argument(..., help="checkpoint directory or its config.json"),
        target: str = typer.Option(..., "--target", help="the replica's target model (HF id or path)"),
        profile: str = typer.Option("", "--profile", help="profile the drafter will serve (checks block size)"),
    ) -> None:
        """Refuse a drafter vLLM cannot serve for TARGET (exit 1 with the reasons)."""
        from .checkpoint import validate_checkpoint

        report = validate_checkpoint(path, target, profile or None)
        for w in report.warnings:
            typer.echo(f"warning: {w}", err=True)
        if not report.ok:
            for e in report.errors:
                typer.echo(f"error: {e}", err=True)
            raise typer.Exit(1)
        typer.echo(f"ok: {report.summary()}")

    app.add_typer(ckpt_app, name="checkpoint")

    @app.command("sim-replica")
    def sim_replica(
        profile: str = typer.Option("off", help="speculation profile (off, dspark-b4|b8|b16[-av])"),
        gpu: str = typer.Option("h200", help="simulated GPU (h100, h200)"),
        model: str = typer.Option("qwen3-8b", help="simulated target model (qwen3-8b, qwen3-14b)"),
        host: str = typer.Option("127.0.0.1"),
        port: int = typer.Option(8000),
        served_model_name: str = typer.Option("", help="model id to serve (default: the HF id, e.g. Qwen/Qwen3-8B)"),
        time_scale: float = typer.Option(1.0, help="wall seconds per simulated second (2 = twice as slow)"),
        workload: str = typer.Option("chat", help="default acceptance preset for requests without a workload hint"),
        max_num_seqs: int = typer.Option(256),
        name: str = typer.Option("sim", help="replica name (DCGM Hostname label)"),
        seed: int = typer.Option(0),
        log_level: str = typer.Option("warning"),
    ) -> None:
        """Run a SIMULATED vLLM replica (no GPU; synthetic text) on HOST:PORT."""
        from . import acceptance, costmodel
        from .profiles import parse_profile
        from .sim.server import SimReplicaSettings, run_sim_replica

        try:
            parse_profile(profile)
            costmodel.get_gpu(gpu)
            costmodel.get_model(model)
            acceptance.get_preset(workload)
            if time_scale <= 0:
                raise ValueError("--time-scale must be > 0")
        except (ValueError, KeyError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        settings = SimReplicaSettings(profile=profile, gpu=gpu, model=model, served_model_name=served_model_name or None,
                                      time_scale=time_scale, default_workload=workload, max_num_seqs=max_num_seqs,
                                      seed=seed, name=name)
        run_sim_replica(settings, host=host, port=port, log_level=log_level)
