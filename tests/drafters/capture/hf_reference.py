"""Run in .venv-vllm: read captured samples through the store's `read` (a
directory or a mooncake:// spec) and compare them with the target's hidden states computed independently by HF
transformers (`output_hidden_states=True`).

Layer id k (vLLM's `extract_hidden_states`) is the hidden state entering
decoder layer k: id 0 = the embeddings, id L = the last layer's output
*before* the final norm. HF's `hidden_states[k]` is the same for k < L, but
its last entry, `hidden_states[L]`, has the final norm applied; so id L is
compared as `norm(captured) == hidden_states[L]`, which checks the
semantics the trainer relies on (verifier_last_hidden_states are pre-norm).

stdin: {"root", "model_dir", "keys": [...]}; stdout (last line): JSON per key.
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM

from drafters.capture.backends import open_store

args = json.loads(sys.stdin.read())
store = open_store(args["root"])
model = AutoModelForCausalLM.from_pretrained(args["model_dir"], torch_dtype=torch.float32).eval()
n_layers = model.config.num_hidden_layers
out = {}
for key in args["keys"]:
    tensors, meta = store.read(key)
    hs, ids = tensors["hidden_states"], tensors["token_ids"]
    with torch.no_grad():
        ref = model(input_ids=ids[None], output_hidden_states=True).hidden_states
        diffs = {}
        for i, layer in enumerate(meta.layer_ids):
            got = hs[:, i].float()
            if layer == n_layers:
                got = model.model.norm(got)
            diffs[str(layer)] = float((got - ref[layer][0]).abs().max())
    out[key] = {
        "shape": list(hs.shape),
        "dtype": str(hs.dtype),
        "token_ids": ids.tolist(),
        "token_dtype": str(ids.dtype),
        "tenant": meta.tenant,
        "prompt_tokens": meta.prompt_tokens,
        "layer_ids": list(meta.layer_ids),
        "request_id": meta.request_id,
        "captured_at": meta.captured_at,
        "max_abs_diff": diffs,
        "ref_scale": float(max(ref[k][0].abs().max() for k in meta.layer_ids)),
        "n_layers": n_layers,
        "hidden_size": model.config.hidden_size,
    }
print(json.dumps(out))
