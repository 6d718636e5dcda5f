#!/usr/bin/env python3
"""Entrypoint of the specgate vLLM replica image: launch one speculation profile from env.

Why a Python entrypoint: the launch arguments of a profile (``--speculative-config`` JSON with
``method: dspark``, ``num_speculative_tokens``, ``enable_adaptive_verification``;
``--per-request-spec-decode-metrics summary``; Model Runner V2 env) live in ONE place,
``drafters.profiles``, and the drafter checkpoint check in ``drafters.checkpoint``. This script
only reads the environment, validates, and ``exec``s vLLM, so nothing is duplicated in shell.

Environment:
  SPECGATE_PROFILE          off | dspark-b4 | dspark-b8 | dspark-b16, optional suffix -av (required)
  SPECGATE_TARGET_MODEL     target model served by vLLM (HF id or path) (required)
  SPECGATE_DRAFTER_PATH     DSpark drafter checkpoint dir (required unless the profile is off)
  SPECGATE_SERVED_MODEL_NAME  optional --served-model-name
  SPECGATE_HOST / SPECGATE_PORT  bind address (default 0.0.0.0:8000)
  SPECGATE_VLLM_ARGS        extra vLLM flags, shell-quoted (e.g. "--max-num-seqs 256")
  SPECGATE_SKIP_CHECKPOINT_VALIDATION=1  start even if the drafter check fails (not advised)
Arguments: ``--dry-run`` prints the command and environment as JSON and exits; any other
arguments are appended to vLLM's.
"""

from __future__ import annotations

import json
import os
import shlex
import sys


def _fail(message: str) -> "NoReturn":  # noqa: F821
    print(f"specgate-vllm-entrypoint: {message}", file=sys.stderr)
    raise SystemExit(2)


def _validate_checkpoint(drafter_path: str, target_model: str, profile_label: str) -> None:
    """Refuse a drafter vLLM cannot serve or one trained for another target (drafters.checkpoint)."""
    if os.environ.get("SPECGATE_SKIP_CHECKPOINT_VALIDATION") == "1":
        print("specgate-vllm-entrypoint: WARNING drafter validation skipped", file=sys.stderr)
        return
    from drafters.checkpoint import validate_checkpoint

    try:
        report = validate_checkpoint(drafter_path, target_model, profile_label)
    except (OSError, ValueError) as exc:
        _fail(f"drafter checkpoint {drafter_path} could not be read: {exc}")
    for warning in report.warnings:
        print(f"specgate-vllm-entrypoint: warning: {warning}", file=sys.stderr)
    if not report.ok:
        _fail(f"drafter checkpoint {drafter_path} refused for {target_model}: " + "; ".join(report.errors))


def build_command(environ: dict[str, str], extra: list[str]) -> tuple[list[str], dict[str, str]]:
    from contract.profiles import parse_profile
    from drafters.profiles import vllm_env, vllm_launch_args

    label = environ.get("SPECGATE_PROFILE", "").strip()
    target = environ.get("SPECGATE_TARGET_MODEL", "").strip()
    drafter = environ.get("SPECGATE_DRAFTER_PATH", "").strip() or None
    if not label:
        _fail("SPECGATE_PROFILE is not set (off, dspark-b4, dspark-b8, dspark-b16, optionally -av)")
    if not target:
        _fail("SPECGATE_TARGET_MODEL is not set (the model vLLM serves, e.g. Qwen/Qwen3-8B)")
    try:
        profile = parse_profile(label)
    except ValueError as exc:
        _fail(str(exc))
    if profile.speculative:
        if not drafter:
            _fail(f"profile {profile.label} needs SPECGATE_DRAFTER_PATH (a DSpark drafter checkpoint)")
        _validate_checkpoint(drafter, target, profile.label)
    else:
        drafter = None

    args = ["--host", environ.get("SPECGATE_HOST", "0.0.0.0"), "--port", environ.get("SPECGATE_PORT", "8000")]
    if environ.get("SPECGATE_SERVED_MODEL_NAME"):
        args += ["--served-model-name", environ["SPECGATE_SERVED_MODEL_NAME"]]
    args += shlex.split(environ.get("SPECGATE_VLLM_ARGS", ""))
    args += extra
    argv = vllm_launch_args(profile, target_model=target, drafter_path=drafter, extra_args=args)
    return argv, vllm_env(profile)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    dry_run = "--dry-run" in args
    args = [a for a in args if a != "--dry-run"]
    command, env = build_command(dict(os.environ), args)
    if dry_run:
        print(json.dumps({"argv": command, "env": env}, indent=2))
        return 0
    print("specgate-vllm-entrypoint: exec " + shlex.join(command), file=sys.stderr, flush=True)
    os.environ.update(env)
    os.execvp(command[0], command)
    return 1  # pragma: no cover - exec does not return


if __name__ == "__main__":
    raise SystemExit(main())
