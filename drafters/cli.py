"""`specgate profile ...`, `specgate checkpoint validate ...`, `specgate drafter train|eval ...` and
`specgate sim-replica ...`.

Why here: each package owns its commands (`register(app)`), so importing the
CLI stays cheap and this package's dependencies stay local.
"""

from __future__ import annotations

import json
import shlex
from typing import Optional

import typer


def register(app: typer.Typer) -> None:
    from contract.profiles import LABEL_PATTERNS

    profile_app = typer.Typer(help=f"Speculation profiles ({LABEL_PATTERNS}) and their vLLM launch arguments.",
                              no_args_is_help=True)

    @profile_app.command("show")
    def profile_show(
        label: str = typer.Argument(..., help=f"profile label: {LABEL_PATTERNS}; e.g. ngram-k4, dspark-b8-av"),
        drafter: str = typer.Option("", "--drafter",
                                    help="drafter checkpoint (path or HF id); required by eagle3/dflash/dspark, unused by ngram"),
        target: str = typer.Option("Qwen/Qwen3-8B", "--target", help="target model served by vLLM"),
        prompt_lookup_min: Optional[int] = typer.Option(None, "--prompt-lookup-min",
                                                        help="ngram only: shortest n-gram matched (default 1)"),
        prompt_lookup_max: Optional[int] = typer.Option(None, "--prompt-lookup-max",
                                                        help="ngram only: longest n-gram matched (default 4)"),
        as_json: bool = typer.Option(False, "--json", help="print a JSON object instead of a shell line"),
    ) -> None:
        """Print the `vllm serve` command line (and environment) a profile implies."""
        from contract.profiles import parse_profile

        from .profiles import speculative_config, vllm_env, vllm_launch_args

        lookup = dict(prompt_lookup_min=prompt_lookup_min, prompt_lookup_max=prompt_lookup_max)
        try:
            prof = parse_profile(label)
            argv = vllm_launch_args(prof, target, drafter or None, **lookup)
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        if drafter and not prof.needs_drafter:
            typer.echo(f"warning: profile {prof.label} uses no drafter checkpoint; --drafter ignored", err=True)
        env = vllm_env(prof)
        if as_json:
            typer.echo(json.dumps({"profile": prof.label, "method": prof.method, "model_runner": prof.model_runner,
                                   "knobs": list(prof.knobs), "argv": argv, "env": env,
                                   "speculative_config": speculative_config(prof, drafter or None, **lookup)},
                                  indent=2))
            return
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
        typer.echo((prefix + " " if prefix else "") + " ".join(shlex.quote(a) for a in argv))

    @profile_app.command("list")
    def profile_list() -> None:
        """List the profile labels."""
        from contract.profiles import PROFILE_LABELS

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

    drafter_app = typer.Typer(help="Per-tenant DSpark drafters trained from captured hidden states (torch runs in a "
                                   "separate interpreter: --python, $SPECGATE_VLLM_VENV or <repo>/.venv-vllm).",
                              no_args_is_help=True)

    def _run_training(args: list[str], python: Optional[str]) -> None:
        from .training.runner import NoTorchError, find_python, run

        try:
            exe = find_python(python)
        except NoTorchError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        rc = run(args, exe)
        if rc:
            raise typer.Exit(rc)

    def _opt(flag: str, value) -> list[str]:
        return [] if value is None else [flag, str(value)]

    from drafters.capture.store import DEFAULT_ROOT

    @drafter_app.command("train")
    def drafter_train(
        tenant: str = typer.Option(..., "--tenant", help="tenant whose captured samples train the drafter"),
        target: str = typer.Option(..., "--target", help="target model directory (the verifier the drafter serves)"),
        out: str = typer.Option(..., "--out", help="checkpoint directory to write (replaced atomically)"),
        store: str = typer.Option(DEFAULT_ROOT, "--store", help="capture store root"),
        init_from: Optional[str] = typer.Option(None, "--init-from",
                                                help="current drafter checkpoint: warm start, its shape and the baseline"),
        profile: Optional[str] = typer.Option(None, "--profile", help="served profile, dspark-bN[-av] (block size N)"),
        max_minutes: float = typer.Option(30.0, "--max-minutes", help="wall time of this run; a rerun resumes"),
        max_steps: int = typer.Option(300, "--max-steps", help="optimizer steps in all, across resumed runs"),
        max_samples: Optional[int] = typer.Option(None, "--max-samples", help="newest training samples to load"),
        max_tokens: int = typer.Option(2048, "--max-tokens", help="tokens per packed batch (memory)"),
        held_out: float = typer.Option(0.2, "--held-out", help="fraction of samples kept aside (by key hash)"),
        lr: float = typer.Option(3e-3, "--lr"),
        loss: str = typer.Option("kl_div", "--loss", help="kl_div, ce, tv or JSON weights (speculators' names)"),
        block_size: Optional[int] = typer.Option(None, "--block-size"),
        markov_rank: Optional[int] = typer.Option(None, "--markov-rank"),
        target_layer_ids: Optional[str] = typer.Option(None, "--target-layer-ids", help="aux ids, e.g. 2,18,33"),
        state_dir: Optional[str] = typer.Option(None, "--state-dir", help="resume state (default OUT.state)"),
        seed: int = typer.Option(0, "--seed"),
        save_every: int = typer.Option(50, "--save-every", help="steps between resumable state snapshots"),
        python: Optional[str] = typer.Option(None, "--python", help="interpreter with torch + speculators"),
    ) -> None:
        """Train TENANT's DSpark drafter from its captured samples; writes a speculators checkpoint,
        training.json and eval.json (offline acceptance of the new and the current drafter)."""
        args = ["train", "--tenant", tenant, "--store", store, "--target", target, "--out", out,
                "--max-minutes", str(max_minutes), "--max-steps", str(max_steps), "--max-tokens", str(max_tokens),
                "--held-out", str(held_out), "--lr", str(lr), "--loss", loss, "--seed", str(seed),
                "--save-every", str(save_every)]
        args += _opt("--init-from", init_from) + _opt("--profile", profile) + _opt("--max-samples", max_samples)
        args += _opt("--block-size", block_size) + _opt("--markov-rank", markov_rank)
        args += _opt("--target-layer-ids", target_layer_ids) + _opt("--state-dir", state_dir)
        _run_training(args, python)

    @drafter_app.command("eval")
    def drafter_eval(
        drafters: list[str] = typer.Argument(..., help="drafter checkpoint directories"),
        tenant: str = typer.Option(..., "--tenant"),
        target: str = typer.Option(..., "--target", help="target model directory"),
        store: str = typer.Option(DEFAULT_ROOT, "--store", help="capture store root"),
        split: str = typer.Option("held-out", "--split", help="held-out, train or all"),
        held_out: float = typer.Option(0.2, "--held-out"),
        out: Optional[str] = typer.Option(None, "--out", help="also write the JSON result here"),
        python: Optional[str] = typer.Option(None, "--python", help="interpreter with torch + speculators"),
    ) -> None:
        """Offline teacher-forced acceptance of DRAFTERS on TENANT's held-out samples."""
        args = ["eval", "--tenant", tenant, "--store", store, "--target", target, "--split", split,
                "--held-out", str(held_out)] + _opt("--out", out) + list(drafters)
        _run_training(args, python)

    @drafter_app.command("layers")
    def drafter_layers(
        target: str = typer.Option(..., "--target", help="target model directory (its config.json)"),
        drafter: Optional[str] = typer.Option(None, "--drafter", help="the drafter checkpoint the samples will train "
                                                                       "(default: the target's default feature layers)"),
    ) -> None:
        """The hidden-state layer ids a capture replica must record for DRAFTER on TARGET (the drafter's
        feature layers + the target's last layer), comma-separated: SPECGATE_CAPTURE_LAYERS."""
        import json
        from pathlib import Path

        from .training.layers import capture_layer_ids_for

        try:
            target_cfg = json.loads((Path(target) / "config.json").read_text())
            drafter_cfg = json.loads((Path(drafter) / "config.json").read_text()) if drafter else {}
            typer.echo(",".join(str(i) for i in capture_layer_ids_for(drafter_cfg, target_cfg)))
        except (OSError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None

    app.add_typer(drafter_app, name="drafter")

    @app.command("sim-replica")
    def sim_replica(
        profile: str = typer.Option("off", help="speculation profile (the simulator models off, ngram-k{2,4,8} and dspark-b{4,8,16}[-av])"),
        gpu: Optional[str] = typer.Option(None, help="simulated GPU (h100, h200; default sim.gpu)"),
        model: Optional[str] = typer.Option(None, help="simulated target model (qwen3-8b, qwen3-14b; default sim.model)"),
        host: str = typer.Option("127.0.0.1"),
        port: int = typer.Option(8000),
        served_model_name: str = typer.Option("", help="model id to serve (default: the HF id, e.g. Qwen/Qwen3-8B)"),
        time_scale: Optional[float] = typer.Option(None, help="wall seconds per simulated second (2 = twice as slow; default sim.time_scale)"),
        workload: Optional[str] = typer.Option(None, help="default acceptance preset for requests without a workload hint (sim.default_workload)"),
        max_num_seqs: Optional[int] = typer.Option(None, help="default sim.max_num_seqs"),
        name: str = typer.Option("sim", help="replica name (DCGM Hostname label)"),
        seed: Optional[int] = typer.Option(None, help="default sim.seed"),
        config: Optional[str] = typer.Option(None, "--config", help="specgate YAML config; its `sim` section sets the defaults"),
        log_level: str = typer.Option("warning"),
    ) -> None:
        """Run a SIMULATED vLLM replica (no GPU; synthetic text) on HOST:PORT."""
        from pydantic import ValidationError

        from contract.settings import ConfigError, describe_error, load_settings

        from . import acceptance, costmodel
        from .sim.engine_types import simulated_profile
        from .sim.server import SimReplicaSettings, run_sim_replica

        flags = dict(gpu=gpu, model=model, time_scale=time_scale, default_workload=workload, max_num_seqs=max_num_seqs, seed=seed)
        try:
            sim = load_settings(config).sim.model_dump()
            sim.update({k: v for k, v in flags.items() if v is not None})
            settings = SimReplicaSettings(**sim, profile=simulated_profile(profile).label, name=name,
                                          served_model_name=served_model_name or None)
            costmodel.get_gpu(settings.gpu)
            costmodel.get_model(settings.model)
            acceptance.get_preset(settings.default_workload)
        except ValidationError as exc:
            typer.echo(describe_error(exc), err=True)
            raise typer.Exit(2) from None
        except (ConfigError, ValueError, KeyError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        run_sim_replica(settings, host=host, port=port, log_level=log_level)
