"""HF-computed samples: capture-format training samples made with HF
transformers instead of a vLLM capture replica.

WHY: the unit tests of the trainer need samples of a known tenant traffic
without booting a capture replica (the lead's integration test runs the real
vLLM capture -> train path). The tensors are what vLLM's `extract_hidden_states`
records (drafters/training/layers.py): id 0 = the embeddings, id k = the
residual stream entering decoder layer k, i.e. the output of layer k-1 (HF's
decoder layers return hidden + residual), id L before the final norm; read
here with forward hooks, so the last id is pre-norm as in vLLM (HF's own
`hidden_states[-1]` is post-norm). Completions are the target's greedy
continuation (what a temperature-0 tenant receives), and the sample holds
prompt + completion minus its last token, as the capture request records it.

Two prompt distributions ("tenants"): word sequences drawn from two disjoint
word lists of the tiny model's corpus, so their continuations differ.

Run inside .venv-vllm (torch):

    PYTHONPATH=. .venv-vllm/bin/python tests/drafters/training/hf_samples.py TARGET_DIR STORE_DIR TENANT N [SEED]
"""

from __future__ import annotations

import random
import sys
import time

DISTRIBUTIONS = {
    "numbers": "one two three four five six seven eight nine ten count list number".split(),
    "nature": "red green blue yellow black white cat dog bird fish tree river mountain city road car".split(),
}
TENANT_DISTRIBUTION = {"tenant-a": "numbers", "tenant-b": "nature"}


def prompts(distribution: str, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(f"{distribution}-{seed}")
    words = DISTRIBUTIONS[distribution]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) for _ in range(n)]


class HFTarget:
    """The target model in HF transformers, greedy generation and capture-format hidden states."""

    def __init__(self, target_dir: str):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(target_dir)
        self.model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
        self.num_layers = self.model.config.num_hidden_layers

    def encode(self, text: str) -> list[int]:
        return self.tok(text)["input_ids"]

    def greedy(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        torch = self.torch
        with torch.no_grad():
            out = self.model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                      eos_token_id=None, pad_token_id=self.tok.pad_token_id)
        return out[0, len(prompt_ids):].tolist()

    def hidden_states(self, ids: list[int], layer_ids: list[int]):
        """[T, len(layer_ids), H] at vLLM's aux-id semantics."""
        torch = self.torch
        inner = self.model.model
        grabbed: dict[int, torch.Tensor] = {}
        hooks = [inner.embed_tokens.register_forward_hook(lambda m, i, o: grabbed.__setitem__(0, o))]
        for k, layer in enumerate(inner.layers):
            hooks.append(layer.register_forward_hook(
                lambda m, i, o, k=k: grabbed.__setitem__(k + 1, o[0] if isinstance(o, tuple) else o)))
        try:
            with torch.no_grad():
                self.model(torch.tensor([ids]))
        finally:
            for h in hooks:
                h.remove()
        return torch.stack([grabbed[i][0] for i in layer_ids], dim=1).contiguous()


def make_samples(target: HFTarget, store, tenant: str, texts: list[str], layer_ids: list[int], *,
                 max_new_tokens: int = 40, prefix: str = "hf") -> list[str]:
    """One sample per prompt into `store` (a drafters.capture.store.SampleStore); returns the request ids."""
    from contract.capture import SampleMeta

    torch = target.torch
    rids = []
    for i, text in enumerate(texts):
        prompt = target.encode(text)
        completion = target.greedy(prompt, max_new_tokens)
        ids = prompt + completion[:-1]
        hs = target.hidden_states(ids, layer_ids)
        rid = f"{prefix}-{tenant}-{i}"
        meta = SampleMeta(tenant=tenant, prompt_tokens=len(prompt), captured_at=time.time(),
                          layer_ids=tuple(layer_ids), request_id=rid)
        store.put(tenant, rid, {"hidden_states": hs, "token_ids": torch.tensor(ids, dtype=torch.long)}, meta)
        rids.append(rid)
    return rids


if __name__ == "__main__":
    if len(sys.argv) not in (5, 6):
        sys.exit(__doc__)
    from drafters.capture.store import SampleStore
    from drafters.training.layers import capture_layer_ids

    target_dir, store_dir, tenant, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    seed = int(sys.argv[5]) if len(sys.argv) == 6 else 0
    t = HFTarget(target_dir)
    layers = capture_layer_ids([0, t.num_layers // 2, t.num_layers], t.num_layers)
    texts = prompts(TENANT_DISTRIBUTION.get(tenant, "numbers"), n, seed)
    print(make_samples(t, SampleStore(store_dir, max_bytes=1 << 30), tenant, texts, layers))
