"""Advertise the extension on the replica's /metrics.

`specgate_ext_info{version="...",knobs="max_draft,max_batch,schedule,min_confidence"} 1` tells the
gateway (gateway/vllm_metrics.py) and the controller which replicas honour which
knobs; the gateway sends a knob only to replicas listing it, and falls back to
pool routing elsewhere. The gauge lives in the API-server process (the one that
serves /metrics), so it is set when that process builds its engine client
(`AsyncLLM.__init__`), which is also when the replica's configuration is known.

Which knobs a replica lists is a PURE function of its speculative config
(`advertised_knobs`): `max_draft`, `max_batch` and `schedule` whenever speculation is on; `min_confidence`
only for DSpark with adaptive verification (the only vLLM path that computes
draft confidences). A replica without speculation advertises version with an
empty knob list: it is plugin-enabled but has nothing to tune.

`engine_fixes` lists the corrections of vLLM itself in force in the replica's
workers (`expand_batch_to_tokens`, expand_fix.py; the K=0 drafter skips,
`k0_skip_ngram` / `k0_skip_v1_dflash` / `k0_skip_v2_dflash`, draft_skip.py), so
an operator and the controller can tell a patched engine from a stock one, and
the controller prices a step capped at K=0 with or without the drafter's pass
(`contract.knobs.k0_skips_drafter`). The workers are other
processes, so the API server asks them through vLLM's own `collective_rpc`
(the method `specgate_ext_engine_state`, added to the worker wrapper) once the
engine is up, and re-advertises with their answer; until it arrives the label
is empty.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

from prometheus_client import REGISTRY, CollectorRegistry, Gauge

from contract.knobs import honoured_knobs

logger = logging.getLogger("specgate.vllm_ext")

EXT_VERSION = "0.1.0"
METRIC = "specgate_ext_info"
ENGINE_STATE_RPC = "specgate_ext_engine_state"
ENGINE_STATE_TIMEOUT_S = 60.0
_gauge: Gauge | None = None


def advertised_knobs(method: str | None, adaptive_verification: bool) -> tuple[str, ...]:
    """PURE: the knobs a replica with this speculative config honours."""
    return honoured_knobs(bool(method), method == "dspark" and adaptive_verification)


def knobs_from_vllm_config(vllm_config) -> tuple[str, ...]:
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None:
        return ()
    return advertised_knobs(
        getattr(spec, "method", None), bool(getattr(spec, "enable_adaptive_verification", False))
    )


def advertise(
    knobs: tuple[str, ...], engine_fixes: tuple[str, ...] = (), registry: CollectorRegistry = REGISTRY
) -> Gauge:
    """Set the info gauge (idempotent: a second engine client in-process reuses it)."""
    global _gauge
    if _gauge is None:
        _gauge = Gauge(
            METRIC,
            "specgate vLLM extension: version, the per-request knobs (vllm_xargs) this replica honours "
            "and the fixes of vLLM itself in force in its workers",
            ["version", "knobs", "engine_fixes"],
            registry=registry,
            multiprocess_mode="max",
        )
    _gauge.clear()
    _gauge.labels(version=EXT_VERSION, knobs=",".join(knobs), engine_fixes=",".join(engine_fixes)).set(1)
    logger.info(
        "specgate: advertising %s{version=%s,knobs=%s,engine_fixes=%s}",
        METRIC, EXT_VERSION, ",".join(knobs), ",".join(engine_fixes),
    )  # fmt: skip
    return _gauge


def engine_state() -> dict:
    """What this (worker) process knows of the engine fixes, the K=0 drafter skips
    in force among them (draft_skip.py); the RPC's answer."""
    from .draft_skip import active_skips
    from .expand_fix import FIX_NAME, active_fixes, state

    return {"engine_fixes": [*active_fixes(), *active_skips()], FIX_NAME: state()}


def merged_fixes(answers: Iterable[dict]) -> tuple[str, ...]:
    """PURE: the fixes any worker reports (one answer per rank), sorted."""
    return tuple(sorted({fix for answer in answers if isinstance(answer, dict) for fix in answer.get("engine_fixes", ())}))


def install_worker_rpc(wrapper_cls: type) -> bool:
    """Give vLLM's worker wrapper the method `collective_rpc` calls by name."""
    if ENGINE_STATE_RPC in wrapper_cls.__dict__:
        return False
    setattr(wrapper_cls, ENGINE_STATE_RPC, lambda self: engine_state())
    return True


async def _advertise_engine_fixes(engine, knobs: tuple[str, ...]) -> None:
    try:
        answers = await asyncio.wait_for(engine.collective_rpc(ENGINE_STATE_RPC), ENGINE_STATE_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - an old worker, a timeout: the label stays empty
        logger.warning("specgate: the workers did not report their engine fixes; %s lists none", METRIC, exc_info=True)
        return
    advertise(knobs, merged_fixes(answers if isinstance(answers, list) else [answers]))


def install_async_llm_hook(async_llm_cls: type) -> bool:
    """Wrap AsyncLLM.__init__ so the API-server process advertises once configured."""
    from .guard import patch_once

    def wrap_init(orig_init):
        def __init__(self, vllm_config, *args, **kwargs):
            orig_init(self, vllm_config, *args, **kwargs)
            try:
                knobs = knobs_from_vllm_config(vllm_config)
                advertise(knobs)
            except Exception:  # discovery must never take the server down
                logger.exception("specgate: could not register %s", METRIC)
                return
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:  # a synchronous caller: no loop to ask the workers from
                return
            # Held on the engine client: a task nobody references can be collected mid-flight.
            self._specgate_engine_fixes_task = loop.create_task(_advertise_engine_fixes(self, knobs))
            from .step_timing import start_polling

            self._specgate_step_stats_task = start_polling(self)

        return __init__

    return patch_once(async_llm_cls, "_specgate_discovery_patched", {"__init__": wrap_init})
