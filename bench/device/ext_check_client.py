"""Client half of bench/device/ext_check.sh: sweep specgate's per-request knobs
against ONE running vLLM replica (DSpark + adaptive verification + the plugin)
and print acceptance, throughput and greedy equality side by side.

Stdlib only (urllib + threads), so it runs in whatever Python serves vLLM.
Each configuration sends the same prompts (greedy, fixed max_tokens) at a fixed
concurrency, with `vllm_xargs` set as the gateway would set it:
  stock            (no knobs: the replica's own behaviour)
  max_draft=0/2/4/8
  min_confidence=0/0.3/0.6
and reports, from vLLM's per-request `metrics.speculative_decoding`:
  drafted/step   num_draft_tokens / num_spec_steps (must be <= cap)
  accept         num_accepted_draft_tokens / num_draft_tokens
  AL             1 + accepted / spec steps (tokens per verification step)
  tok/s          completion tokens / wall time, and its ratio vs stock
  greedy         prompts whose text equals the max_draft=0 (no speculation) text

Exit status 1 when a hard property fails: the extension is not advertised, a
cap is exceeded, or a request errors. Greedy mismatches are printed, not fatal:
on GPUs, verifying K tokens at once and decoding one at a time are different
kernels, so bitwise-equal greedy text is expected but batch-shape numerics can
flip a near-tie token; the count says how often.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import sys
import time
import urllib.request

TOPICS = [
    "Explain how a hash map handles collisions, with an example in Python.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List the steps to make a sourdough starter and keep it alive.",
    "Summarise the causes of the French Revolution in a few paragraphs.",
    "Describe how TCP congestion control works, including slow start.",
    "Write a Python function that merges two sorted lists, and explain it.",
    "What are the trade-offs between SQL and NoSQL databases?",
    "Give a recipe for a vegetable curry, with ingredients and steps.",
]


def post(url: str, body: dict, timeout: float = 600.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def ext_info(base: str) -> str | None:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("specgate_ext_info{"):
                return line
    return None


def run_config(base: str, model: str, prompts: list[str], xargs: dict | None, max_tokens: int, concurrency: int):
    def one(prompt: str):
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        if xargs is not None:
            body["vllm_xargs"] = xargs
        out = post(base + "/v1/completions", body)
        spec = (out.get("metrics") or {}).get("speculative_decoding") or {}
        return out["choices"][0]["text"], out["usage"]["completion_tokens"], spec

    started = time.perf_counter()
    with cf.ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, prompts))
    wall = time.perf_counter() - started
    return wall, results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="http://127.0.0.1:PORT")
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--caps", default="0,2,4,8")
    ap.add_argument("--thresholds", default="0,0.3,0.6")
    args = ap.parse_args()

    failures: list[str] = []
    info = ext_info(args.base)
    print(f"ext: {info}")
    if info is None or "max_draft" not in info:
        failures.append("replica does not advertise specgate_ext_info with max_draft")
    if info is not None and "min_confidence" not in info:
        failures.append("replica does not advertise min_confidence (adaptive verification off?)")

    prompts = [f"{TOPICS[i % len(TOPICS)]} (variant {i})" for i in range(args.prompts)]
    configs: list[tuple[str, dict | None, int | None]] = [("stock", None, None)]
    configs += [(f"max_draft={c}", {"specgate_max_draft": int(c)}, int(c)) for c in args.caps.split(",")]
    configs += [(f"min_conf={t}", {"specgate_min_confidence": float(t)}, None) for t in args.thresholds.split(",")]

    # Warm-up (CUDA graphs, caches) outside the measurement.
    run_config(args.base, args.model, prompts[: args.concurrency], None, 16, args.concurrency)

    rows, reference, stock_tps = [], None, None
    for name, xargs, cap in [configs[1]] + [c for c in configs if c is not configs[1]]:  # max_draft=0 first: reference
        try:
            wall, results = run_config(args.base, args.model, prompts, xargs, args.max_tokens, args.concurrency)
        except Exception as exc:  # noqa: BLE001 - report and continue with the sweep
            failures.append(f"{name}: request failed: {exc!r}")
            continue
        texts = [r[0] for r in results]
        if reference is None:
            reference = texts
        toks = sum(r[1] for r in results)
        drafted = sum(r[2].get("num_draft_tokens", 0) for r in results)
        accepted = sum(r[2].get("num_accepted_draft_tokens", 0) for r in results)
        steps = sum(r[2].get("num_spec_steps", 0) for r in results)
        if cap is not None:
            for text, _, spec in results:
                if spec.get("num_draft_tokens", 0) > cap * spec.get("num_spec_steps", 0):
                    failures.append(f"{name}: drafted {spec['num_draft_tokens']} > cap x steps {spec}")
                    break
        tps = toks / wall
        if name == "stock":
            stock_tps = tps
        rows.append((name, drafted / steps if steps else 0.0, accepted / drafted if drafted else 0.0,
                     1 + accepted / steps if steps else 1.0, tps,
                     sum(a == b for a, b in zip(texts, reference)), len(texts)))  # fmt: skip

    print(f"\n{'config':<16}{'drafted/step':>13}{'accept':>8}{'AL':>7}{'tok/s':>10}{'vs stock':>10}{'greedy==':>10}")
    for name, dps, acc, al, tps, same, n in rows:
        ratio = f"{tps / stock_tps:.2f}x" if stock_tps else "-"
        print(f"{name:<16}{dps:>13.2f}{acc:>8.3f}{al:>7.2f}{tps:>10.1f}{ratio:>10}{same:>6}/{n:<3}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
