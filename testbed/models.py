"""Generate a tiny random-weight Qwen3 checkpoint + a BPE tokenizer with a chat template.

WHY: the real-vLLM test tier needs a model vLLM can load offline (nothing can be
downloaded from a model hub here) and that boots in about a minute on two CPU
cores. A 2-layer Qwen3 with hidden 128 is loaded by vLLM's real Qwen3 code path;
head_dim=64 because vLLM's CPU attention kernels reject smaller heads. The
tokenizer is trained by `tokenizers` on a small built-in corpus (byte-level BPE,
so any text encodes) and carries a ChatML template so `/v1/chat/completions`
works.

Weights are random but seeded, so the checkpoint (and hence greedy output) is
the same on every machine and run (`taught`: then trained, seeded, on one or
two CPU threads; its greedy output is pinned by what it learned, not by float
details).

Run it INSIDE .venv-vllm (the gateway's .venv has no torch):

    .venv-vllm/bin/python testbed/models.py OUT_DIR
    .venv-vllm/bin/python testbed/models.py --arch mid OUT_DIR

`--arch` picks a named architecture (ARCHS); the default `tiny` is the test
tier's model. `taught` is the same architecture and tokenizer, its random
weights then trained for a few hundred steps on a corpus of word chains
(`chain_corpus`): bench/drafter_loop.py's target, whose greedy output depends
on its context the way a language model's does, so a drafter can learn it from
traffic (a random target's output is a hash of the context: only copying a
loop it has already printed generalises). `mid` is bench/real_sweep.py's
~100M-parameter Qwen3 (hidden 1024, 8 layers, 16 heads of 64, tied embeddings, bf16): big enough that a
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
    "taught": (ARCH, "float32", "taught-qwen3-v1"),  # `tiny`, then `teach()` on `chain_corpus()`
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


def domains() -> dict[str, list[str]]:
    """Two disjoint halves of the vocabulary of words: the `code` and `prose`
    prompt distributions of bench/drafter_loop.py and of the taught target's corpus."""
    half = len(_WORDS) // 2
    return {"code": list(_WORDS[:half]), "prose": list(_WORDS[half:])}


# The taught target's corpus: in each domain every word has two likely successors and
# a little noise, so the next word depends on the context (mostly the last word, as
# in a bigram language model) and greedy decoding follows each word's likelier successor.
CHAIN_FIRST, CHAIN_SECOND = 0.7, 0.25  # the rest: any word of the domain


def successor_table(seed: int = SEED) -> dict[str, tuple[str, str]]:
    """Per word, its two successors (each within the word's domain, never itself)."""
    import random

    rng = random.Random(f"successors-{seed}")
    table = {}
    for words in domains().values():
        for w in words:
            first, second = rng.sample([x for x in words if x != w], 2)
            table[w] = (first, second)
    return table


def chain_corpus(sentences: int = 4000, length: int = 40, seed: int = SEED) -> list[str]:
    """Word walks through `successor_table`, each within one domain."""
    import random

    rng = random.Random(f"chains-{seed}")
    table = successor_table(seed)
    doms = list(domains().values())
    out = []
    for _ in range(sentences):
        words = rng.choice(doms)
        w = rng.choice(words)
        walk = [w]
        for _ in range(length - 1):
            r = rng.random()
            w = table[w][0] if r < CHAIN_FIRST else table[w][1] if r < CHAIN_FIRST + CHAIN_SECOND else rng.choice(words)
            walk.append(w)
        out.append(" ".join(walk))
    return out


TEACH_STEPS = 400  # the loss reaches the corpus entropy (~0.94 nats) within ~100


def teach(model, tokenizer_file: str, steps: int = TEACH_STEPS, batch: int = 32, lr: float = 3e-3) -> list[float]:
    """Train `model` (in place, CPU, seeded) on `chain_corpus()` with the
    next-token loss; returns the loss every 100 steps."""
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(tokenizer_file)
    rows = [tok.encode(" " + text).ids for text in chain_corpus()]
    width = min(len(r) for r in rows)
    data = torch.tensor([r[:width] for r in rows], dtype=torch.long)
    gen = torch.Generator().manual_seed(SEED)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(steps):
        idx = torch.randint(0, data.shape[0], (batch,), generator=gen)
        x = data[idx]
        loss = model(input_ids=x, labels=x).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            losses.append(round(loss.item(), 4))
    model.eval()
    return losses


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
    if arch == "taught":
        torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
        losses = teach(model, os.path.join(out_dir, "tokenizer.json"))
        with open(os.path.join(out_dir, "teaching.json"), "w") as f:
            json.dump({"corpus": "chain_corpus", "steps": TEACH_STEPS, "loss_every_100": losses,
                       "successors": {"first": CHAIN_FIRST, "second": CHAIN_SECOND}}, f, indent=2)
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

    parser = argparse.ArgumentParser(description="Generate a tiny Qwen3 checkpoint + tokenizer.")
    parser.add_argument("--arch", choices=sorted(ARCHS), default="tiny", help="named architecture (default: tiny)")
    parser.add_argument("out_dir")
    args = parser.parse_args(argv)
    print(generate(args.out_dir, args.arch))


if __name__ == "__main__":
    main(sys.argv[1:])
