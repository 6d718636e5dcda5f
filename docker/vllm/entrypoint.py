#!/usr/bin/env python3
"""Entrypoint of the specgate vLLM replica image: launch one speculation profile from env.

Why a Python entrypoint: the launch arguments of a profile (``--speculative-config`` JSON with
the method -- ngram, eagle3, dflash, dspark --, ``num_speculative_tokens``, the drafter,
ngram's prompt-lookup window, DSpark's ``enable_adaptive_verification``;
``--per-request-spec-decode-metrics summary``; the model-runner env) live in ONE place,
``drafters.profiles``, the label grammar in ``contract.profiles``, and the drafter checkpoint
check in ``drafters.checkpoint``. This script only reads the environment, validates, and
``exec``s vLLM, so nothing is duplicated in shell.

Environment:
  SPECGATE_PROFILE          off | ngram-k{2,4,8} | eagle3-k{2,4,8} | dflash-b{4,8,16} |
                            dspark-b{4,8,16}[-av] (required)
  SPECGATE_TARGET_MODEL     target model served by vLLM (HF id or path) (required)
  SPECGATE_DRAFTER_PATH     drafter checkpoint (required by eagle3 / dflash / dspark; ignored by
                            off and ngram). DSpark and DFlash checkpoints (speculators format, a
                            directory) are validated against the target; EAGLE-3 ones are left to vLLM
  SPECGATE_PROMPT_LOOKUP_MIN / SPECGATE_PROMPT_LOOKUP_MAX  ngram window (default 1 / 4; ngram only)
  SPECGATE_SERVED_MODEL_NAME  optional --served-model-name
  SPECGATE_HOST / SPECGATE_PORT  bind address (default 0.0.0.0:8000)
  SPECGATE_VLLM_ARGS        extra vLLM flags, shell-quoted (e.g. "--max-num-seqs 256")
  SPECGATE_SKIP_CHECKPOINT_VALIDATION=1  start even if the drafter check fails (not advised)
  SPECGATE_ROLE             replica (default) | capture. A capture replica serves no tenant: it runs
                            vLLM's extract_hidden_states with specgate's connector and writes the
                            target's hidden states of mirrored requests into the bounded store
                            (docs/drafters.md "Drafters that learn from live traffic"); SPECGATE_PROFILE
                            and SPECGATE_DRAFTER_PATH are then not used, and these apply:
  SPECGATE_CAPTURE_LAYERS   comma-separated hidden-state layer ids (required for capture; `specgate
                            drafter layers --drafter D --target M` prints the ids a drafter trains on)
  SPECGATE_CAPTURE_STORE    store directory (default /dev/shm/specgate-capture: RAM, never disk), or
                            a Mooncake Store spec mooncake://MASTER:PORT/NS?index=redis://... (docs/drafters.md)
  SPECGATE_CAPTURE_MAX_BYTES / SPECGATE_CAPTURE_TTL_S  the store's bounds (default 1 GiB / 86400 s)
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


def _warn(message: str) -> None:
    print(f"specgate-vllm-entrypoint: warning: {message}", file=sys.stderr)


# Methods whose checkpoints drafters.checkpoint validates (speculators-format DSpark / DFlash).
_VALIDATED_METHODS = ("dflash", "dspark")


def _validate_checkpoint(drafter_path: str, target_model: str, profile) -> None:
    """Refuse a drafter vLLM cannot serve, one trained for another target (drafters.checkpoint),
    or one of another method than the profile's (a DFlash checkpoint under dspark-b8, ...)."""
    if os.environ.get("SPECGATE_SKIP_CHECKPOINT_VALIDATION") == "1":
        print("specgate-vllm-entrypoint: WARNING drafter validation skipped", file=sys.stderr)
        return
    if profile.method not in _VALIDATED_METHODS:
        _warn(f"{profile.method} drafter {drafter_path} is not validated by specgate; vLLM checks it at load")
        return
    from drafters.checkpoint import validate_checkpoint

    try:
        report = validate_checkpoint(drafter_path, target_model, profile.label)
    except (OSError, ValueError) as exc:
        _fail(f"drafter checkpoint {drafter_path} could not be read: {exc}")
    for warning in report.warnings:
        _warn(warning)
    if not report.ok:
        _fail(f"drafter checkpoint {drafter_path} refused for {target_model}: " + "; ".join(report.errors))
    kind = report.info.get("type")
    if kind in _VALIDATED_METHODS and kind != profile.method:
        _fail(f"drafter checkpoint {drafter_path} refused for profile {profile.label}: it is a {kind} drafter "
              f"(speculators_model_type={kind!r}); serve it with a {kind}-b* profile or use a {profile.method} drafter")


def _lookup_overrides(environ: dict[str, str], profile) -> dict[str, int]:
    """SPECGATE_PROMPT_LOOKUP_MIN/MAX as launch overrides (ngram only; ignored with a warning elsewhere)."""
    out: dict[str, int] = {}
    for key, name in (("SPECGATE_PROMPT_LOOKUP_MIN", "prompt_lookup_min"), ("SPECGATE_PROMPT_LOOKUP_MAX", "prompt_lookup_max")):
        raw = environ.get(key, "").strip()
        if not raw:
            continue
        if profile.method != "ngram":
            _warn(f"{key} applies to ngram profiles only; ignored for {profile.label}")
            continue
        try:
            out[name] = int(raw)
        except ValueError:
            _fail(f"{key} must be an integer >= 1, got {raw!r}")
    return out


def _base_args(environ: dict[str, str], extra: list[str]) -> list[str]:
    args = ["--host", environ.get("SPECGATE_HOST", "0.0.0.0"), "--port", environ.get("SPECGATE_PORT", "8000")]
    if environ.get("SPECGATE_SERVED_MODEL_NAME"):
        args += ["--served-model-name", environ["SPECGATE_SERVED_MODEL_NAME"]]
    return args + shlex.split(environ.get("SPECGATE_VLLM_ARGS", "")) + extra


def build_capture_command(environ: dict[str, str], extra: list[str]) -> tuple[list[str], dict[str, str]]:
    """A capture replica: the target with extract_hidden_states + specgate's
    connector (drafters.capture.replica builds the flags)."""
    from drafters.capture.replica import capture_replica_args
    from drafters.capture.store import DEFAULT_MAX_BYTES, DEFAULT_ROOT, DEFAULT_TTL_S

    target = environ.get("SPECGATE_TARGET_MODEL", "").strip()
    if not target:
        _fail("SPECGATE_TARGET_MODEL is not set (the model vLLM serves, e.g. Qwen/Qwen3-8B)")
    raw = environ.get("SPECGATE_CAPTURE_LAYERS", "").strip()
    if not raw:
        _fail("SPECGATE_ROLE=capture needs SPECGATE_CAPTURE_LAYERS (e.g. 1,18,33,36; "
              "`specgate drafter layers --drafter D --target M` prints them)")
    try:
        layers = [int(x) for x in raw.split(",") if x.strip()]
        max_bytes = int(environ.get("SPECGATE_CAPTURE_MAX_BYTES") or DEFAULT_MAX_BYTES)
        ttl_s = float(environ.get("SPECGATE_CAPTURE_TTL_S") or DEFAULT_TTL_S)
        flags = capture_replica_args(layers, environ.get("SPECGATE_CAPTURE_STORE") or DEFAULT_ROOT, max_bytes, ttl_s)
    except ValueError as exc:
        _fail(f"capture replica: {exc}")
    return ["vllm", "serve", target, *flags, *_base_args(environ, extra)], {}


def build_command(environ: dict[str, str], extra: list[str]) -> tuple[list[str], dict[str, str]]:
    role = environ.get("SPECGATE_ROLE", "replica").strip() or "replica"
    if role == "capture":
        return build_capture_command(environ, extra)
    if role != "replica":
        _fail(f"SPECGATE_ROLE must be replica or capture, got {role!r}")
    from contract.profiles import LABEL_PATTERNS, parse_profile
    from drafters.profiles import drafter_kind, vllm_env, vllm_launch_args

    label = environ.get("SPECGATE_PROFILE", "").strip()
    target = environ.get("SPECGATE_TARGET_MODEL", "").strip()
    drafter = environ.get("SPECGATE_DRAFTER_PATH", "").strip() or None
    if not label:
        _fail(f"SPECGATE_PROFILE is not set ({LABEL_PATTERNS})")
    if not target:
        _fail("SPECGATE_TARGET_MODEL is not set (the model vLLM serves, e.g. Qwen/Qwen3-8B)")
    try:
        profile = parse_profile(label)
    except ValueError as exc:
        _fail(str(exc))
    if profile.needs_drafter:
        if not drafter:
            _fail(f"profile {profile.label} needs SPECGATE_DRAFTER_PATH ({drafter_kind(profile)} drafter checkpoint)")
        _validate_checkpoint(drafter, target, profile)
    else:
        if drafter and profile.speculative:
            _warn(f"profile {profile.label} uses no drafter checkpoint; SPECGATE_DRAFTER_PATH ignored")
        drafter = None
    lookup = _lookup_overrides(environ, profile)

    args = _base_args(environ, extra)
    try:
        argv = vllm_launch_args(profile, target_model=target, drafter_path=drafter, extra_args=args, **lookup)
    except ValueError as exc:
        _fail(str(exc))
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
