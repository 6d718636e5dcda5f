"""How to run a capture replica: its vLLM command-line arguments and the
connector's configuration knobs, as pure functions.

Why a module apart from `drafters.capture.connector`: the connector imports
torch and vLLM (it runs inside the replica), while the arguments are needed
where neither is installed: the gateway's venv (tests launching a replica),
the bench, the docker entrypoint. Nothing here imports more than the stdlib
and the store's defaults.

A capture replica is a plain vLLM server with two flags:

    --speculative-config  extract_hidden_states: vLLM caches the target's
                          hidden states at `layer_ids` in one KV-cache layer
                          (the layer axis mapped onto the head axis)
    --kv-transfer-config  specgate's connector (loaded by module path) copies
                          them out per finished capture request into the
                          bounded store (drafters.capture.store: a tmpfs
                          directory, or Mooncake Store by a mooncake:// spec)
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .mooncake_store import MooncakeLocation, is_mooncake_spec
from .store import DEFAULT_MAX_BYTES, DEFAULT_ROOT, DEFAULT_TTL_S

CONNECTOR_MODULE = "drafters.capture.connector"
CONNECTOR_CLASS = "SpecgateHiddenStatesConnector"
# The key under which the connector returns a sample's store key in the
# response's `kv_transfer_params` (`SampleStore.read(key)`).
SAMPLE_KEY_PARAM = "specgate_sample"
# The TTL janitor wakes at most this far apart (and at least 4 times per TTL).
MAX_ENFORCE_INTERVAL_S = 60.0


@dataclass(frozen=True)
class CaptureStoreConfig:
    """The connector's `kv_connector_extra_config` knobs, validated."""

    store_root: str = DEFAULT_ROOT
    max_bytes: int = DEFAULT_MAX_BYTES
    ttl_s: float = DEFAULT_TTL_S
    # How often the replica applies the TTL without a write (an idle replica's store still drains).
    enforce_interval_s: float | None = None  # None: min(ttl_s / 4, MAX_ENFORCE_INTERVAL_S)

    def __post_init__(self) -> None:
        if not isinstance(self.store_root, str) or not self.store_root:
            raise ValueError("capture connector: store_root must be a non-empty path or mooncake:// spec")
        if is_mooncake_spec(self.store_root):
            MooncakeLocation.parse(self.store_root)  # a malformed spec fails here, not in the replica
        if isinstance(self.max_bytes, bool) or not isinstance(self.max_bytes, int) or self.max_bytes <= 0:
            raise ValueError(f"capture connector: max_bytes must be a positive integer, got {self.max_bytes!r}")
        for name in ("ttl_s", "enforce_interval_s"):
            value = getattr(self, name)
            if value is None and name == "enforce_interval_s":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"capture connector: {name} must be a positive number, got {value!r}")

    @property
    def interval_s(self) -> float:
        if self.enforce_interval_s is not None:
            return float(self.enforce_interval_s)
        return min(float(self.ttl_s) / 4.0, MAX_ENFORCE_INTERVAL_S)

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, object] | None) -> "CaptureStoreConfig":
        """Read vLLM's `kv_connector_extra_config`; keys of the stock connector
        (`num_writer_threads`, ...) are ignored, unknown specgate ones too."""
        extra = dict(extra or {})
        known = {k: extra[k] for k in ("store_root", "max_bytes", "ttl_s", "enforce_interval_s") if k in extra}
        return cls(**known)

    def extra_config(self) -> dict[str, object]:
        out: dict[str, object] = {"store_root": self.store_root, "max_bytes": self.max_bytes, "ttl_s": self.ttl_s}
        if self.enforce_interval_s is not None:
            out["enforce_interval_s"] = self.enforce_interval_s
        return out


def capture_speculative_config(layer_ids: Sequence[int]) -> dict:
    """vLLM's `extract_hidden_states` method at `layer_ids` (id k = the hidden
    state entering decoder layer k: 0 = embeddings, L = the last layer's
    output before the final norm). vLLM requires exactly one speculative token
    and at least one layer id."""
    ids = [int(i) for i in layer_ids]
    if not ids:
        raise ValueError("capture replica: at least one hidden-state layer id is required")
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"capture replica: layer ids must be distinct and non-negative, got {ids}")
    return {
        "method": "extract_hidden_states",
        "num_speculative_tokens": 1,
        "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": ids}},
    }


def capture_kv_transfer_config(config: CaptureStoreConfig) -> dict:
    return {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": "kv_producer",
        "kv_connector_extra_config": config.extra_config(),
    }


def capture_replica_args(
    layer_ids: Sequence[int],
    store_root: str | os.PathLike = DEFAULT_ROOT,
    max_bytes: int = DEFAULT_MAX_BYTES,
    ttl_s: float = DEFAULT_TTL_S,
    enforce_interval_s: float | None = None,
) -> list[str]:
    """The vLLM CLI arguments that make a server a capture replica (append them
    to `vllm serve MODEL ...`; the repository must be on the server's
    PYTHONPATH so vLLM can import the connector)."""
    config = CaptureStoreConfig(os.fspath(store_root), max_bytes, ttl_s, enforce_interval_s)
    return [
        "--speculative-config",
        json.dumps(capture_speculative_config(layer_ids)),
        "--kv-transfer-config",
        json.dumps(capture_kv_transfer_config(config)),
    ]
