"""Generate a tiny random-weight Qwen3 checkpoint + a BPE tokenizer with a chat template.

WHY: the real-vLLM test tier needs a model vLLM can load offline (nothing can be
downloaded from a model hub here) and that boots in about a minute on two CPU
cores. A 2-layer Qwen3 with hidden 128 is loaded by vLLM's real Qwen3 code path;
head_dim=64 because vLLM's CPU attention kernels reject smaller heads. The
tokenizer is trained by `tokenizers` on a small built-in corpus (byte-level BPE,
so any text encodes) and carries a ChatML template so `/v1/chat/completions`
works.

Weights are random but seeded, so the checkpoint (and hence greedy output) is
the same on every machine and run.

Run it INSIDE .venv-vllm (the gateway's .venv has no torch):

    .venv-vllm/bin/python tests/vllm_support/tiny_model.py OUT_DIR
    .venv-vllm/bin/python tests/vllm_support/tiny_model.py --arch mid OUT_DIR

`--arch` picks a named architecture (ARCHS); the default `tiny` is the test
tier's model. `mid` is bench/real_sweep.py's ~100M-parameter Qwen3 (hidden
1024, 8 layers, 16 heads of 64, tied embeddings, bf16): big enough that a
2-core CPU turns compute-bound at a few dozen tokens per step, which is the
regime change speculation has to respect; same tokenizer and seed. Each arch
has its own SPEC_VERSIONS entry.

It writes OUT_DIR atomically (a temp dir renamed into place) and is a no-op when
OUT_DIR/.complete exists with the same SPEC_VERSION. This file must not import
pytest or anything from the repo: it runs as a plain script.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

# Bump when the architecture, corpus or template changes (invalidates caches).
SPEC_VERSION = "tiny-qwen3-v2"

ARCH = dict(
    vocab_size=1024,
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
    rope_theta=10000.0,
    # Untied: the LM head is an independent random map, so greedy text walks through varied tokens
    # (a tied tiny model just repeats its last token) and settles into cycles that ngram drafting hits.
    tie_word_embeddings=False,
    rms_norm_eps=1e-6,
)

# Named variants: (architecture, weight dtype, SPEC_VERSION). `tiny` stays the default, unchanged.
MID_ARCH = dict(
    ARCH,
    hidden_size=1024,
    intermediate_size=2816,  # ~104M parameters in all (12.8M per layer + the 1M tied embedding)
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=16,
    head_dim=64,
    tie_word_embeddings=True,
)
ARCHS = {
    "tiny": (ARCH, "float32", SPEC_VERSION),
    "mid": (MID_ARCH, "bfloat16", "mid-qwen3-v1"),
}
SPEC_VERSIONS = {name: version for name, (_, _, version) in ARCHS.items()}
SEED = 1234
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ChatML, as Qwen uses; `add_generation_prompt` opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_WORDS = (
    "the a gateway replica token draft verify accept reject speculation tenant budget request "
    "response stream chunk model server latency throughput queue batch cache prefix policy "
    "controller router health metric counter window limit route fail retry backoff circuit "
    "open closed half quick brown fox jumps over lazy dog one two three four five six seven "
    "eight nine ten hello world user assistant system say tell count list name number color "
    "red green blue yellow black white cat dog bird fish tree river mountain city road car"
).split()


def corpus(lines: int = 3000) -> list[str]:
    """Deterministic pseudo-text: enough repeated structure for BPE merges."""
    import random

    rng = random.Random(SEED)
    out = []
    for i in range(lines):
        n = rng.randint(4, 16)
        sentence = " ".join(rng.choice(_WORDS) for _ in range(n))
        out.append(sentence.capitalize() + rng.choice([".", "!", "?", ","]) + f" {i % 100}")
    return out


def build_tokenizer(out_dir: str) -> dict:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=ARCH["vocab_size"],
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    ids = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": ARCH["max_position_embeddings"],
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "bos_token": None,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
        "added_tokens_decoder": {
            str(i): {"content": t, "special": True, "lstrip": False, "rstrip": False,
                     "normalized": False, "single_word": False}
            for t, i in ids.items()
        },
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out_dir, "special_tokens_map.json"), "w") as f:
        json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f, indent=2)
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    return ids


def build_model(out_dir: str, ids: dict, vocab_size: int, arch: str = "tiny") -> None:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    dims, dtype, _ = ARCHS[arch]
    torch.manual_seed(SEED)
    config = Qwen3Config(
        **{**dims, "vocab_size": vocab_size},
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        torch_dtype=dtype,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    model = Qwen3ForCausalLM(config).to(getattr(torch, dtype)).eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    GenerationConfig(
        bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"]
    ).save_pretrained(out_dir)


def generate(out_dir: str, arch: str = "tiny") -> str:
    version = SPEC_VERSIONS[arch]
    marker = os.path.join(out_dir, ".complete")
    if os.path.exists(marker) and open(marker).read().strip() == version:
        return out_dir
    parent = os.path.dirname(os.path.abspath(out_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tiny-qwen3-", dir=parent)
    try:
        ids = build_tokenizer(tmp)
        from tokenizers import Tokenizer

        vocab_size = Tokenizer.from_file(os.path.join(tmp, "tokenizer.json")).get_vocab_size()
        # The embedding has exactly the tokenizer's size, so every sampled id detokenizes.
        build_model(tmp, ids, vocab_size, arch)
        with open(os.path.join(tmp, ".complete"), "w") as f:
            f.write(version + "\n")
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.replace(tmp, out_dir)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def main(argv: list[str]) -> None:
    import argparse

    parser = argparse.ArgumentParser(description="Generate a random-weight Qwen3 checkpoint + tokenizer.")
    parser.add_argument("--arch", choices=sorted(ARCHS), default="tiny", help="named architecture (default: tiny)")
    parser.add_argument("out_dir")
    args = parser.parse_args(argv)
    print(generate(args.out_dir, args.arch))


if __name__ == "__main__":
    main(sys.argv[1:])
