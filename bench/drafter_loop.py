"""The live-traffic drafter loop, end to end on real vLLM CPU servers.

    .venv/bin/python bench/drafter_loop.py            # ~20-50 min on 2 cores
    .venv/bin/python bench/drafter_loop.py --help

What runs (every part is the shipped one; nothing is simulated):
  - the target (`--target`): by default `taught`, the test tier's tiny Qwen3 architecture and
    tokenizer with its weights trained for 400 steps on word chains (testbed/models.py
    `chain_corpus`: in each tenant's half of the vocabulary every word has a likely successor), so
    its greedy output depends on the context as a language model's does; `tiny` is the test tier's
    random-weight model, whose greedy output is a hash of the context that settles into loops;
  - the fleet drafter: an untrained (random-weight) speculators-format DSpark checkpoint, built
    with `DSparkDraftModel.from_training_args` as the test bed does; both tenants start on it;
  - vLLM CPU servers: the fleet replica (DSpark, V2 model runner through the Triton-interpreter
    workaround of the test tier, tests/drafters/vllm_ext/triton_cpu), the capture replica
    (`extract_hidden_states` + specgate's connector into the bounded store on /dev/shm), later the
    canary replica serving tenant A's trained drafter, and an ngram replica for the comparison;
  - the shipped `specgate gateway --embedded-controller` (Redis on 127.0.0.1:6379 or a private one),
    two tenants with different prompt distributions: `code` opts in to capture, `prose` does not;
  - `specgate drafter train` on the captured samples, its offline evaluation, the admin API's
    canary, the controller's rollout rule, and the promotion it publishes.

Prints, per tenant, the measured acceptance length (vLLM's per-request summary, as the gateway
records it) on held-out prompts before and after, ngram's on the same prompts, the offline
(teacher-forced) estimate, captured bytes, the store's high-water mark against its bound, the
training time, and the decision trail (audit + decision history). The JSON lands in --out.

Acceptance, not speed: the Triton interpreter makes DSpark steps slow on a CPU, so tokens/s here
says nothing about a GPU; acceptance length is a property of drafter and target and carries over.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.real_sweep_stack import Gateway, RedisHandle, admin_key, api_key  # noqa: E402
from drafters.capture.mooncake_runtime import MooncakeCluster  # noqa: E402
from drafters.capture.mooncake_store import mooncake_spec, segment_bytes_for  # noqa: E402
from drafters.training.layers import capture_layer_ids_for  # noqa: E402
from testbed import vllm_env  # noqa: E402
from testbed.vllm_server import (  # noqa: E402
    VllmServer,
    VllmServerSpec,
    generate_model,
    ngram_speculation,
)
from testbed.models import SPEC_VERSIONS, domains  # noqa: E402

SERVED = "tiny-qwen3"
TENANTS = ("code", "prose")  # `code` opts in to capture and gets its own drafter; `prose` is the control
CAPTURED_TENANT = "code"
DRAFTER_ID = "code-r1"
TRITON_CPU = REPO / "tests" / "drafters" / "vllm_ext" / "triton_cpu"
DSPARK_ENV = {"TRITON_INTERPRET": "1", "VLLM_USE_V2_MODEL_RUNNER": "1"}
# The two prompt distributions: disjoint halves of the tiny tokenizer's vocabulary of words
# (the taught target's corpus uses the same halves, each with its own word chains).
VOCAB = domains()


def prompts(tenant: str, n: int, seed: int) -> list[str]:
    rng = random.Random(f"{tenant}-{seed}")
    words = VOCAB[tenant]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(12, 24))) for _ in range(n)]


def say(msg: str) -> None:
    print(f"[drafter_loop {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------------------
# processes


def vllm_python(*args: str, timeout_s: float = 1800) -> str:
    proc = subprocess.run(
        [str(vllm_env.python()), *args], capture_output=True, text=True, timeout=timeout_s, cwd=str(REPO),
        env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:2])} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def dspark_server(model: Path, drafter: Path, name: str, log_dir: Path, block: int) -> VllmServer:
    spec = VllmServerSpec(
        model_dir=str(model), name=name, served_model_name=SERVED,
        speculative_config={"method": "dspark", "model": str(drafter), "num_speculative_tokens": block},
        per_request_spec_metrics="summary", env=dict(DSPARK_ENV), pythonpath=[str(TRITON_CPU)], boot_timeout_s=900,
    )  # fmt: skip
    return VllmServer(spec, log_dir)


def capture_server(model: Path, layer_ids: list[int], store: str, max_bytes: int, ttl_s: float, log_dir: Path) -> VllmServer:
    from drafters.capture.replica import capture_replica_args

    spec = VllmServerSpec(
        model_dir=str(model), name="capture", served_model_name=SERVED,
        extra_args=capture_replica_args(layer_ids, str(store), max_bytes, ttl_s), boot_timeout_s=600,
    )  # fmt: skip
    return VllmServer(spec, log_dir)


def gateway_config(replicas: list[dict], capture_url: str, redis_url: str, prefix: str, args) -> dict:
    """`code` opts in at fraction 1 with an hourly budget of exactly the capture phase's requests:
    the gateway's own budget then keeps every later request (held-out, canary) out of the store."""
    tenants = []
    for tenant in TENANTS:
        entry: dict = {"id": tenant, "api_key_sha256": hashlib.sha256(api_key(tenant).encode()).hexdigest()}
        if tenant == CAPTURED_TENANT:
            entry["speculation"] = {"capture": {"fraction": 1.0, "max_per_hour": args.capture_requests}}
        tenants.append(entry)
    return {
        "replicas": replicas,
        "tenants": tenants,
        "admin_key": admin_key(),
        "redis_url": redis_url,
        "redis_prefix": prefix,
        "log_level": "WARNING",
        "gateway": {
            "health_interval_s": 1.0, "health_timeout_s": 30.0, "health_fail_threshold": 10,
            "first_byte_timeout_s": 600.0, "response_timeout_s": 1800.0, "read_timeout_s": 600.0,
            "wedge_after_s": 600.0,  # Triton-interpreted DSpark steps are slow; a slow replica is not a wedged one
            "capture": {"url": capture_url, "model": SERVED, "timeout_s": 300.0, "queue_size": 4096},
        },
        "controller": {
            "tick_s": 2.0,
            "rollout": {"share": args.share, "min_requests": args.min_requests, "max_duration_s": args.canary_budget_s},
        },
    }  # fmt: skip


# ---------------------------------------------------------------------------
# traffic and measurement


def complete(base_url: str, key: str, prompt: str, max_tokens: int) -> dict:
    client = openai.OpenAI(base_url=base_url, api_key=key, timeout=900, max_retries=0)
    resp = client.completions.create(model=SERVED, prompt=prompt, max_tokens=max_tokens, temperature=0)
    body = resp.model_dump()
    spec = (body.get("metrics") or {}).get("speculative_decoding") or {}
    steps, accepted = spec.get("num_spec_steps") or 0, spec.get("num_accepted_draft_tokens") or 0
    return {"text": resp.choices[0].text, "al": 1 + accepted / steps if steps else None, "tokens": resp.usage.completion_tokens}


def run_prompts(base_url: str, tenant: str, texts: list[str], max_tokens: int, concurrency: int = 4) -> list[dict]:
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda p: complete(base_url, api_key(tenant), p, max_tokens), texts))


def mean_al(results: list[dict]) -> float | None:
    values = [r["al"] for r in results if r["al"] is not None]
    return round(statistics.fmean(values), 3) if values else None


def admin(gateway: Gateway, method: str, path: str, body: dict | None = None) -> dict:
    resp = httpx.request(method, gateway.url + path, json=body, headers={"Authorization": f"Bearer {admin_key()}"}, timeout=30)
    try:
        return {"status": resp.status_code, **resp.json()}
    except ValueError:
        return {"status": resp.status_code, "text": resp.text}


def gateway_counter(gateway: Gateway, name: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    text = httpx.get(gateway.url + "/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                out[",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))] = sample.value
    return out


def wait_captures(gateway: Gateway, expected: int, timeout_s: float) -> dict[str, float]:
    """Until the gateway has sent (or given up on) `expected` captures."""
    deadline = time.monotonic() + timeout_s
    counts: dict[str, float] = {}
    while time.monotonic() < deadline:
        counts = gateway_counter(gateway, "specgate_capture_requests_total")
        if sum(counts.values()) >= expected:
            break
        time.sleep(2)
    return counts


# ---------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--capture-requests", type=int, default=240, help="requests of the captured tenant while capturing")
    p.add_argument("--other-requests", type=int, default=24, help="requests of the other tenant meanwhile (never captured)")
    p.add_argument("--heldout", type=int, default=12, help="held-out prompts per tenant (never captured, never trained on)")
    p.add_argument("--canary-requests", type=int, default=60, help="most requests per tenant while the canary runs")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight per tenant (vLLM batches them)")
    p.add_argument("--train-minutes", type=float, default=8.0, help="training wall-time bound")
    p.add_argument("--train-steps", type=int, default=400, help="training steps (ce loss: what greedy acceptance rewards)")
    p.add_argument("--share", type=float, default=0.5, help="canary share of the tenant's traffic")
    p.add_argument("--min-requests", type=int, default=10, help="controller.rollout.min_requests per arm")
    p.add_argument("--canary-budget-s", type=float, default=1800.0, help="controller.rollout.max_duration_s")
    p.add_argument("--store-max-mb", type=float, default=32.0, help="capture store bound (MiB)")
    p.add_argument("--store-ttl-s", type=float, default=3600.0)
    p.add_argument("--store", choices=("tmpfs", "mooncake"), default="tmpfs",
                   help="the capture store: a /dev/shm directory, or Mooncake Store (a master and a store node "
                        "started here, the index in the bench's Redis)")
    p.add_argument("--target", choices=("taught", "tiny"), default="taught",
                   help="the target: `taught` (the tiny Qwen3 trained on word chains: its output depends on "
                        "its context as a language model's does) or `tiny` (the test tier's random-weight one)")
    p.add_argument("--out", type=Path, default=REPO / ".cache" / "specgate" / "drafter_loop.json")
    p.add_argument("--log-dir", type=Path, default=None)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:  # noqa: C901 -- one linear script, phase by phase
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="specgate-drafter-loop-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    work = vllm_env.cache_dir() / "drafter-loop"
    work.mkdir(parents=True, exist_ok=True)
    store_root = str(Path("/dev/shm") / f"specgate-drafter-loop-{os.getpid()}")
    max_bytes = int(args.store_max_mb * 2**20)
    mooncake = None
    report: dict = {"args": {k: str(v) for k, v in vars(args).items()}, "phases": {}}
    servers: list[VllmServer] = []
    gateway: Gateway | None = None
    redis = RedisHandle(log_dir)
    say(f"logs: {log_dir}")
    try:
        if args.store == "mooncake":
            mooncake = MooncakeCluster(segment_bytes_for(max_bytes), venv=vllm_env.venv_dir(), log_dir=log_dir).__enter__()
            store_root = mooncake_spec(mooncake.master, redis.url, redis.prefix("capture").rstrip(":"))  # close() clears it
            say(f"capture store: Mooncake Store at {mooncake.master} (store node segment {segment_bytes_for(max_bytes)} B)")
        report["store_backend"] = args.store
        # 0. the target and the fleet's (untrained) drafter
        model = generate_model(vllm_env.cache_dir() / SPEC_VERSIONS[args.target], args.target)
        fleet_drafter = work / "fleet-drafter"
        vllm_python(str(REPO / "tests/drafters/vllm_ext/tiny_dspark.py"), str(model), str(fleet_drafter))
        block = json.loads((fleet_drafter / "config.json").read_text())["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
        layers = capture_layer_ids_for(json.loads((fleet_drafter / "config.json").read_text()),
                                       json.loads((model / "config.json").read_text()))
        say(f"target {model.name}, fleet drafter block {block}, capture layers {layers}")
        report["target"] = model.name
        held = {t: prompts(t, args.heldout, seed=2) for t in TENANTS}

        # 1. ngram on the same target and held-out prompts (the lookup baseline)
        ngram = VllmServer(VllmServerSpec(model_dir=str(model), name="ngram", served_model_name=SERVED,
                                          speculative_config=ngram_speculation(k=block)), log_dir)  # fmt: skip
        servers.append(ngram.start())
        ngram.wait_ready()
        report["ngram"] = {t: mean_al(run_prompts_direct(ngram, held[t], args.max_tokens)) for t in TENANTS}
        ngram.stop()
        servers.remove(ngram)
        say(f"ngram acceptance on held-out: {report['ngram']}")

        # 2. the stack: fleet replica + capture replica + gateway with the embedded controller
        fleet = dspark_server(model, fleet_drafter, "fleet", log_dir, block)
        capture = capture_server(model, layers, store_root, max_bytes, args.store_ttl_s, log_dir)
        for s in (fleet, capture):
            servers.append(s.start())
        for s in (fleet, capture):
            s.wait_ready()
        replicas = [{"url": fleet.url, "name": "fleet", "profile": f"dspark-b{block}" if block in (4, 8, 16) else None}]
        replicas = [{k: v for k, v in r.items() if v is not None} for r in replicas]
        prefix = redis.prefix("loop")
        gateway = Gateway(gateway_config(replicas, capture.url, redis.url, prefix, args), log_dir, "capture", controller=True).start()
        # Speculation on at the full block: the loop measures the drafters' acceptance, not the
        # controller's load response (which would cap a tenant whose estimate is low).
        pin = {"mode": "on", "max_draft_min": block, "note": "bench: speculation on at the full block; acceptance, not load"}
        for t in TENANTS:
            admin(gateway, "PUT", f"/admin/tenants/{t}/override", pin)
        say("phase capture: both tenants through the gateway; only `code` is captured")
        started = time.monotonic()
        before = {}
        for t in TENANTS:
            n = args.capture_requests if t == CAPTURED_TENANT else args.other_requests
            run_prompts(gateway.url + "/v1", t, prompts(t, n, seed=1), args.max_tokens, args.concurrency)
        counts = wait_captures(gateway, args.capture_requests, timeout_s=900)
        for t in TENANTS:  # held-out prompts are measured after the capture counts: never trained on
            before[t] = run_prompts(gateway.url + "/v1", t, held[t], args.max_tokens)
        stats = store_stats(store_root, max_bytes, args.store_ttl_s)
        report["phases"]["capture"] = {"seconds": round(time.monotonic() - started, 1), "capture_counters": counts, "store": stats}
        report["before"] = {t: mean_al(before[t]) for t in TENANTS}
        say(f"acceptance before (fleet drafter, held-out): {report['before']}; captures {counts}; store {stats}")

        # 3. train the captured tenant's drafter on its own traffic
        out_dir = work / f"{DRAFTER_ID}-{os.getpid()}"
        started = time.monotonic()
        cmd = [str(REPO / ".venv/bin/specgate"), "drafter", "train", "--tenant", CAPTURED_TENANT, "--store", str(store_root),
               "--target", str(model), "--init-from", str(fleet_drafter), "--out", str(out_dir),
               "--max-minutes", str(args.train_minutes), "--max-steps", str(args.train_steps), "--loss", "ce",
               "--lr", "1e-2", "--max-tokens", "1024"]  # fmt: skip
        say("$ " + " ".join(cmd))
        subprocess.run(cmd, check=True, cwd=str(REPO), env={**os.environ, "SPECGATE_VLLM_VENV": str(vllm_env.venv_dir())})
        report["phases"]["train"] = {"seconds": round(time.monotonic() - started, 1)}
        report["offline"] = json.loads((out_dir / "eval.json").read_text())
        say(f"offline eval: {report['offline']}")

        # 4. canary: a replica serving the new drafter; the controller decides
        canary = dspark_server(model, out_dir, "canary", log_dir, block)
        servers.append(canary.start())
        canary.wait_ready()
        gateway.stop()
        replicas.append({**replicas[0], "url": canary.url, "name": "canary", "drafter": DRAFTER_ID})
        gateway = Gateway(gateway_config(replicas, capture.url, redis.url, prefix, args), log_dir, "canary", controller=True).start()
        started = time.monotonic()
        report["canary_start"] = admin(gateway, "POST", f"/admin/tenants/{CAPTURED_TENANT}/canary", {"drafter": DRAFTER_ID, "share": args.share})
        say(f"canary started: {report['canary_start']}")
        state = {}
        seed = 10
        while time.monotonic() - started < args.canary_budget_s:
            for t in TENANTS:
                run_prompts(gateway.url + "/v1", t, prompts(t, 8, seed=seed), args.max_tokens, args.concurrency)
            seed += 1
            state = admin(gateway, "GET", f"/admin/tenants/{CAPTURED_TENANT}/drafter")
            say(f"rollout: {state.get('state')} -- {(state.get('verdict') or {}).get('reason', '')}")
            if state.get("state") in ("promoted", "rolled_back") or (seed - 10) * 8 >= args.canary_requests:
                break
        time.sleep(5)  # two controller ticks: the promotion is published
        report["phases"]["canary"] = {"seconds": round(time.monotonic() - started, 1), "rollout": state}

        # 5. after: the same held-out prompts through the gateway
        after = {t: run_prompts(gateway.url + "/v1", t, held[t], args.max_tokens) for t in TENANTS}
        report["after"] = {t: mean_al(after[t]) for t in TENANTS}
        report["lossless"] = {t: [a["text"] for a in after[t]] == [b["text"] for b in before[t]] for t in TENANTS}
        report["trail"] = {
            "history": admin(gateway, "GET", f"/admin/decisions?tenant={CAPTURED_TENANT}"),
            "audit": admin(gateway, "GET", "/admin/audit"),
        }
        report["store_final"] = store_stats(store_root, max_bytes, args.store_ttl_s)
    finally:
        if gateway is not None:
            gateway.stop()
        for s in servers:
            s.stop(grace_s=10)
        if mooncake is not None:
            mooncake.__exit__(None, None, None)
        else:
            subprocess.run(["rm", "-rf", store_root], check=False)
        redis.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2, default=str))
    print_report(report)
    return 0


def run_prompts_direct(server: VllmServer, texts: list[str], max_tokens: int) -> list[dict]:
    """Straight to a vLLM server (no gateway, no tenant): the ngram comparison."""
    out = []
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", timeout=900, max_retries=0)
    for prompt in texts:
        resp = client.completions.create(model=SERVED, prompt=prompt, max_tokens=max_tokens, temperature=0)
        spec = (resp.model_dump().get("metrics") or {}).get("speculative_decoding") or {}
        steps = spec.get("num_spec_steps") or 0
        out.append({"al": 1 + (spec.get("num_accepted_draft_tokens") or 0) / steps if steps else None})
    return out


def store_stats(root: str, max_bytes: int, ttl_s: float) -> dict:
    """The store's counters (torch-free; Mooncake: read from its Redis index)."""
    from drafters.capture.backends import open_store

    store = open_store(root, max_bytes=max_bytes, ttl_s=ttl_s)
    try:
        stats = store.stats()
    finally:
        store.close()
    return {"bytes": stats.bytes, "samples": stats.samples, "high_water_bytes": stats.high_water_bytes,
            "max_bytes": stats.max_bytes, "evicted_full": stats.evicted_full, "evicted_ttl": stats.evicted_ttl,
            "lost": stats.lost}  # fmt: skip


def print_report(report: dict) -> None:
    print("\n== drafter loop: measured acceptance length (tokens per target step), held-out prompts ==")
    print(f"{'tenant':8} {'ngram':>7} {'before':>8} {'after':>8} {'after/before':>13}")
    for t in TENANTS:
        b, a, n = (report.get(k, {}).get(t) for k in ("before", "after", "ngram"))
        ratio = f"{a / b:.2f}x" if a and b else "-"
        print(f"{t:8} {n or '-':>7} {b or '-':>8} {a or '-':>8} {ratio:>13}")
    if "offline" in report:
        print(f"offline (teacher-forced, {CAPTURED_TENANT} held-out samples): {json.dumps(report['offline'])}")
    for name, phase in report.get("phases", {}).items():
        print(f"phase {name}: {phase.get('seconds')} s")
    if "store_final" in report:
        s = report["phases"]["capture"]["store"]
        print(f"capture store ({report.get('store_backend', 'tmpfs')}): {s['bytes']} B in {s['samples']} samples after "
              f"capture; high-water {s['high_water_bytes']} B of {s['max_bytes']} B bound; evicted full/ttl/lost "
              f"{s['evicted_full']}/{s['evicted_ttl']}/{s.get('lost', 0)}")
    rollout = report.get("phases", {}).get("canary", {}).get("rollout") or {}
    print(f"rollout: {rollout.get('state')} -- {(rollout.get('rollout') or {}).get('reason')}")
    print(f"lossless (same text before/after): {report.get('lossless')}")


if __name__ == "__main__":
    sys.exit(main())
