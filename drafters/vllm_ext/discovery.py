"""Advertise the extension on the replica's /metrics.

`specgate_ext_info{version="...",knobs="max_draft,max_batch,min_confidence"} 1` tells the
gateway (gateway/vllm_metrics.py) and the controller which replicas honour which
knobs; the gateway sends a knob only to replicas listing it, and falls back to
pool routing elsewhere. The gauge lives in the API-server process (the one that
serves /metrics), so it is set when that process builds its engine client
(`AsyncLLM.__init__`), which is also when the replica's configuration is known.

Which knobs a replica lists is a PURE function of its speculative config
(`advertised_knobs`): `max_draft` whenever speculation is on; `min_confidence`
only for DSpark with adaptive verification (the only vLLM path that computes
draft confidences). A replica without speculation advertises version with an
empty knob list: it is plugin-enabled but has nothing to tune.
"""

from __future__ import annotations

import logging

from prometheus_client import REGISTRY, CollectorRegistry, Gauge

logger = logging.getLogger("specgate.vllm_ext")

EXT_VERSION = "0.1.0"
METRIC = "specgate_ext_info"
_gauge: Gauge | None = None


def advertised_knobs(method: str | None, adaptive_verification: bool) -> tuple[str, ...]:
    """PURE: the knobs a replica with this speculative config honours."""
    if not method:
        return ()
    knobs = ["max_draft", "max_batch"]
    if method == "dspark" and adaptive_verification:
        knobs.append("min_confidence")
    return tuple(knobs)


def knobs_from_vllm_config(vllm_config) -> tuple[str, ...]:
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None:
        return ()
    return advertised_knobs(
        getattr(spec, "method", None), bool(getattr(spec, "enable_adaptive_verification", False))
    )


def advertise(knobs: tuple[str, ...], registry: CollectorRegistry = REGISTRY) -> Gauge:
    """Set the info gauge (idempotent: a second engine client in-process reuses it)."""
    global _gauge
    if _gauge is None:
        _gauge = Gauge(
            METRIC,
            "specgate vLLM extension: version and the per-request knobs (vllm_xargs) this replica honours",
            ["version", "knobs"],
            registry=registry,
            multiprocess_mode="max",
        )
    _gauge.clear()
    _gauge.labels(version=EXT_VERSION, knobs=",".join(knobs)).set(1)
    logger.info("specgate: advertising %s{version=%s,knobs=%s}", METRIC, EXT_VERSION, ",".join(knobs))
    return _gauge


def install_async_llm_hook(async_llm_cls: type) -> bool:
    """Wrap AsyncLLM.__init__ so the API-server process advertises once configured."""
    from .guard import patch_once

    def wrap_init(orig_init):
        def __init__(self, vllm_config, *args, **kwargs):
            orig_init(self, vllm_config, *args, **kwargs)
            try:
                advertise(knobs_from_vllm_config(vllm_config))
            except Exception:  # discovery must never take the server down
                logger.exception("specgate: could not register %s", METRIC)

        return __init__

    return patch_once(async_llm_cls, "_specgate_discovery_patched", {"__init__": wrap_init})
