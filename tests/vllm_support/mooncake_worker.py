"""Run in .venv-vllm: operations on a Mooncake capture store, one process.

stdin: {"spec", "max_bytes", "ttl_s", "ops": [[op, ...], ...]}; stdout (last
line): one JSON result per op. Ops:
  ["put", tenant, request_id, tokens, seed]  -> {"key", "digest", "bytes"} (stats.bytes after the put)
  ["read", key]                              -> {"digest", "request_id"} or "gone"
  ["delete", key] / ["enforce", seconds_from_now] -> stats as a dict
  ["vanish", key]                            -> removes the object behind the index's back (Mooncake's
                                                own eviction, a restarted store node)
The digest is a SHA-256 over the tensors' names and bytes.
"""

import dataclasses
import hashlib
import json
import sys
import time

import torch

from contract.capture import SampleMeta
from drafters.capture.backends import open_store


def digest(tensors: dict) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


args = json.loads(sys.stdin.read())
store = open_store(args["spec"], max_bytes=args["max_bytes"], ttl_s=args["ttl_s"])
out = []
for op, *rest in args["ops"]:
    if op == "put":
        tenant, rid, tokens, seed = rest
        g = torch.Generator().manual_seed(seed)
        tensors = {"hidden_states": torch.randn(tokens, 3, 128, generator=g), "token_ids": torch.arange(tokens)}
        key = store.put(tenant, rid, tensors, SampleMeta(tenant, 2, time.time(), (0, 1, 2), rid))
        out.append({"key": key.key, "digest": digest(tensors), "bytes": store.stats().bytes})
    elif op == "read":
        try:
            tensors, meta = store.read(rest[0])
            out.append({"digest": digest(tensors), "request_id": meta.request_id})
        except FileNotFoundError:
            out.append("gone")
    elif op == "delete":
        store.delete(rest[0])
        out.append(dataclasses.asdict(store.stats()))
    elif op == "enforce":
        store.enforce(now=time.time() + rest[0])
        out.append(dataclasses.asdict(store.stats()))
    elif op == "vanish":
        out.append(store._mooncake().remove(store._object(rest[0]), True))
    else:
        raise SystemExit(f"unknown op {op}")
print(json.dumps(out))
