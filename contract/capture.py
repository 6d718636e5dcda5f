"""The capture contract: how a tenant's finished request becomes a training
sample for its own drafter, in one place for the three parties that touch it.

    gateway (gateway/capture.py)       mirrors a sampled, finished request to the
                                       capture replica: `capture_request_body`
    capture replica (drafters/capture) vLLM `extract_hidden_states` + specgate's
                                       hidden-states connector writes one sample
                                       per request into the bounded store
    trainer (drafters/training)        reads a tenant's samples by key:
                                       `SampleMeta` from the sample's metadata

Why the sample describes itself (tenant, where the completion starts) instead
of an index kept by the gateway: the trainer runs in another process, often on
another machine than the gateway, and the store evicts samples on its own (TTL,
memory bound); a sample that carries its own description can neither be
orphaned by an index nor outlive it.

A sample is a safetensors file: `hidden_states [T, n_layers, H]` (target
hidden states at the `layer_ids`, model dtype), `token_ids [T]` (int64), and
string metadata under `META_*` keys. T covers the prompt and the completion
but its last token (the capture request re-feeds prompt + completion as a
prompt and generates one token, which vLLM does not capture).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, Field, field_validator

# The key of specgate's block inside a capture request's `kv_transfer_params`
# (vLLM hands `kv_transfer_params` to the KV connector with the request).
CAPTURE_PARAMS_KEY = "specgate_capture"
# Prefix of the request ids the gateway gives capture requests (X-Request-Id).
CAPTURE_REQUEST_PREFIX = "capture-"
# safetensors metadata keys of a sample (values are strings, as safetensors requires).
META_TENANT = "specgate.tenant"
META_PROMPT_TOKENS = "specgate.prompt_tokens"
META_CAPTURED_AT = "specgate.captured_at"
META_LAYER_IDS = "specgate.layer_ids"
META_REQUEST_ID = "specgate.request_id"
SAMPLE_SUFFIX = ".safetensors"

_TENANT_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def tenant_slug(tenant: str) -> str:
    """A tenant id as it may appear in a file name (samples are grouped per tenant).
    Never `.`/`..` nor a hidden name: a leading dot becomes `_`."""
    slug = _TENANT_SAFE.sub("_", tenant) or "_"
    return "_" + slug[1:] if slug.startswith(".") else slug


class CaptureTarget(BaseModel):
    """Where the gateway mirrors captured requests (`gateway.capture`)."""

    model_config = {"extra": "forbid"}

    url: str | None = Field(default=None, description="base URL of the capture replica (vLLM extract_hidden_states); None: capture off")
    model: str | None = Field(default=None, description="served model name on the capture replica; None: the request's model")
    queue_size: int = Field(default=64, ge=1, description="captures waiting to be sent; beyond it new ones are dropped (counted)")
    concurrency: int = Field(default=2, ge=1, description="capture requests in flight at once")
    timeout_s: float = Field(default=60.0, gt=0, description="one capture request (prefill of prompt + completion)")
    max_tokens_per_sample: int = Field(default=4096, ge=2, description="longer requests are not captured")

    @field_validator("url", mode="before")
    @classmethod
    def _url(cls, value: Any) -> Any:
        """An empty URL (an unset compose variable) means capture off."""
        if isinstance(value, str):
            value = value.strip().rstrip("/")
            return value or None
        return value


def capture_request_body(
    model: str, tenant: str, prompt_ids: Sequence[int], completion_ids: Sequence[int]
) -> dict[str, Any]:
    """The /v1/completions body that makes the capture replica record one sample:
    prompt + completion re-fed as token ids, one greedy token generated (what
    speculators' own data generation sends), and the sample's description for
    the connector."""
    ids = [int(t) for t in prompt_ids] + [int(t) for t in completion_ids]
    return {
        "model": model,
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 0.0,
        "kv_transfer_params": {CAPTURE_PARAMS_KEY: {"tenant": tenant, "prompt_tokens": len(prompt_ids)}},
    }


@dataclass(frozen=True)
class SampleMeta:
    """What a sample says about itself."""

    tenant: str
    prompt_tokens: int  # positions [0, prompt_tokens) are prompt; the rest is the target's completion
    captured_at: float
    layer_ids: tuple[int, ...]
    request_id: str = ""

    def to_metadata(self) -> dict[str, str]:
        return {
            META_TENANT: self.tenant,
            META_PROMPT_TOKENS: str(self.prompt_tokens),
            META_CAPTURED_AT: repr(float(self.captured_at)),
            META_LAYER_IDS: ",".join(str(i) for i in self.layer_ids),
            META_REQUEST_ID: self.request_id,
        }

    @classmethod
    def from_metadata(cls, meta: Mapping[str, str] | None) -> "SampleMeta | None":
        """None for a file that is not a specgate sample (no tenant) or is malformed."""
        meta = meta or {}
        try:
            return cls(
                tenant=meta[META_TENANT],
                prompt_tokens=int(meta[META_PROMPT_TOKENS]),
                captured_at=float(meta.get(META_CAPTURED_AT, "0")),
                layer_ids=tuple(int(x) for x in meta.get(META_LAYER_IDS, "").split(",") if x),
                request_id=meta.get(META_REQUEST_ID, ""),
            )
        except (KeyError, ValueError):
            return None


def capture_params(kv_transfer_params: Any) -> tuple[str, int] | None:
    """(tenant, prompt_tokens) from a capture request's kv_transfer_params, or
    None when the request is not a specgate capture (untrusted input: anything
    malformed is not a capture)."""
    block = kv_transfer_params.get(CAPTURE_PARAMS_KEY) if isinstance(kv_transfer_params, dict) else None
    if not isinstance(block, dict):
        return None
    tenant, n = block.get("tenant"), block.get("prompt_tokens")
    if not isinstance(tenant, str) or not tenant or isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return None
    return tenant, n
