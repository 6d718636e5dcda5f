"""`specgate up`: the one-command embedded stack.

Gateway + embedded controller in this process, simulated replicas as child
processes, in-memory state (Redis when SPECGATE_REDIS_URL is set). It exists
so that a newcomer without a GPU sees the real thing -- the real gateway,
controller and vLLM-compatible replica surface -- with one command, and so that
`specgate load` has something to drive.

Layout: `make_plan()` is pure (options -> what to start, keys included);
`banner()` renders what to print; `run_up()` does the I/O: start replicas,
wait for health, serve the gateway, stop everything on Ctrl-C/SIGTERM.
Cleanup guarantees (no orphans, no leaked ports) live in `testbed.procs`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import secrets
import signal
import socket
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import httpx

from contract.settings import DEFAULT_GPU, DEFAULT_MODEL

from . import DEFAULT_GATEWAY_PORT
from testbed.procs import Supervisor, free_port, wait_http_ok

DEFAULT_REPLICAS = ("dspark-b8", "dspark-b8", "off")
DEFAULT_STATE_FILE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specgate" / "up.json"

# Demo tenants: a chat-like, a code-like and a batch tenant so the controller has different
# acceptance and load to work with. `workload` tells `specgate load` what to send for each.
DEMO_TENANTS = (
    # id, workload, requests/min, tokens/min, TPOT target (ms)
    ("chat", "chat", 6000, 3_000_000, 40.0),
    ("code", "code", 6000, 3_000_000, None),
    ("batch", "batch", 6000, 3_000_000, None),
)


@dataclass(frozen=True)
class ReplicaSpec:
    name: str
    profile: str
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class TenantSpec:
    id: str
    key: str
    workload: str
    requests_per_minute: int
    tokens_per_minute: int
    tpot_target_ms: float | None = None


@dataclass(frozen=True)
class UpPlan:
    host: str
    port: int
    replicas: tuple[ReplicaSpec, ...]
    tenants: tuple[TenantSpec, ...]
    admin_key: str
    gpu: str
    model: str
    redis_url: str | None
    state_file: Path
    controller_tick_s: float = 1.0
    controller_min_dwell_s: float = 10.0
    sim_args: tuple[str, ...] = field(default_factory=tuple)
    time_scale: float = 1.0

    @property
    def gateway_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::") else self.host
        return f"http://{host}:{self.port}"


def make_plan(
    *,
    host: str = "127.0.0.1",
    port: int = DEFAULT_GATEWAY_PORT,
    profiles: tuple[str, ...] = DEFAULT_REPLICAS,
    replica_ports: tuple[int, ...] | None = None,
    gpu: str = DEFAULT_GPU,
    model: str = DEFAULT_MODEL,
    redis_url: str | None = None,
    state_file: Path = DEFAULT_STATE_FILE,
    token: Callable[[int], str] = secrets.token_urlsafe,
    min_dwell_s: float = 10.0,
    sim_args: tuple[str, ...] = (),
    time_scale: float = 1.0,
) -> UpPlan:
    """Decide names, ports and keys. Pure except for the injected `token` source."""
    if not profiles:
        raise ValueError("at least one replica profile is needed")
    if time_scale <= 0:
        raise ValueError("--time-scale must be > 0")
    ports = replica_ports or tuple(free_port() for _ in profiles)
    if len(ports) != len(profiles):
        raise ValueError("one port per replica profile")
    counts: dict[str, int] = {}
    replicas = []
    for profile, rport in zip(profiles, ports):
        counts[profile] = counts.get(profile, 0) + 1
        replicas.append(ReplicaSpec(name=f"sim-{profile}-{counts[profile]}", profile=profile, port=rport))
    tenants = tuple(
        TenantSpec(id=tid, key=f"sk-{tid}-{token(18)}", workload=wl, requests_per_minute=rpm, tokens_per_minute=tpm,
                   tpot_target_ms=tpot)
        for tid, wl, rpm, tpm, tpot in DEMO_TENANTS
    )
    return UpPlan(host=host, port=port, replicas=tuple(replicas), tenants=tenants, admin_key=f"sk-admin-{token(24)}",
                  gpu=gpu, model=model, redis_url=redis_url, state_file=Path(state_file),
                  controller_min_dwell_s=min_dwell_s, sim_args=tuple(sim_args), time_scale=time_scale)


def settings_for(plan: UpPlan):
    """The Settings of the plan (the real `contract.settings` model validates it)."""
    from contract.settings import ReplicaConfig, Settings, TenantConfig, hash_key

    return Settings(
        replicas=[ReplicaConfig(name=r.name, url=r.url, profile=r.profile) for r in plan.replicas],
        tenants=[
            TenantConfig(id=t.id, api_key_sha256=hash_key(t.key), requests_per_minute=t.requests_per_minute,
                         tokens_per_minute=t.tokens_per_minute, tpot_target_ms=t.tpot_target_ms)
            for t in plan.tenants
        ],
        admin_key=plan.admin_key,
        redis_url=plan.redis_url,
        gateway={"health_interval_s": 1.0, "health_success_threshold": 1},
        controller={"tick_s": plan.controller_tick_s, "gpu": plan.gpu, "model": plan.model,
                    "decision": {"min_dwell_s": plan.controller_min_dwell_s}},
        sim={"gpu": plan.gpu, "model": plan.model, "time_scale": plan.time_scale},
    )


def replica_argv(plan: UpPlan, replica: ReplicaSpec) -> list[str]:
    return [sys.executable, "-m", "specgate.cli", "sim-replica", "--profile", replica.profile, "--gpu", plan.gpu,
            "--model", plan.model, "--host", "127.0.0.1", "--port", str(replica.port), "--name", replica.name,
            "--time-scale", f"{plan.time_scale:g}", *plan.sim_args]


def command_path(name: str, cwd: Path | None = None) -> str:
    """How to run executable `name` of *this* installation (the environment
    `specgate up` runs in): `.venv/bin/python` from the repository root, an
    absolute path elsewhere. Why not plain `python`/`specgate`: the printed
    commands must work when pasted, and the `openai` SDK and `specgate` live
    in this environment, not necessarily on PATH."""
    exe = Path(sys.executable).parent / name
    base = (cwd or Path.cwd()).resolve()
    try:
        return str(exe.relative_to(base))
    except ValueError:
        return str(exe)


def banner(plan: UpPlan, model_id: str, python: str | None = None, specgate: str | None = None) -> str:
    t = plan.tenants[0]
    url = plan.gateway_url
    python = python or command_path("python")
    specgate = specgate or command_path("specgate")
    load = f"{specgate} load --rps 30 --duration 90"
    if plan.state_file != DEFAULT_STATE_FILE:
        load += f" --state-file {plan.state_file}"
    sdk_note = "" if importlib.util.find_spec("openai") else "   # needs the SDK: pip install openai"
    lines = [
        "",
        f"specgate is up: gateway {url}  (controller embedded, state: {'redis ' + plan.redis_url if plan.redis_url else 'in-memory'})",
        "",
        "Tenants (demo keys, valid for this run):",
        *[f"  {x.id:<6} {x.key}   ({x.workload} workload)" for x in plan.tenants],
        f"  admin  {plan.admin_key}",
        "",
        "Try it:",
        f"  curl -s {url}/v1/chat/completions \\",
        f"    -H 'Authorization: Bearer {t.key}' -H 'Content-Type: application/json' \\",
        f"    -d '{{\"model\": \"{model_id}\", \"messages\": [{{\"role\": \"user\", \"content\": \"Hello!\"}}], \"max_tokens\": 32}}'",
        "",
        # One line on purpose: an indented heredoc would not paste (the
        # terminator and the Python code would carry the banner's indent).
        f"  {python} -c 'from openai import OpenAI; c = OpenAI(base_url=\"{url}/v1\", api_key=\"{t.key}\"); "
        f"r = c.chat.completions.create(model=\"{model_id}\", messages=[{{\"role\": \"user\", \"content\": \"Hello!\"}}], "
        f"max_tokens=32); print(r.choices[0].message.content, r.usage)'{sdk_note}",
        "",
        f"  curl -s {url}/admin/tenants -H 'Authorization: Bearer {plan.admin_key}'    # policies + reasons",
        f"  curl -s {url}/metrics | grep specgate_tenant_    # per-tenant speculation on/off, draft cap, acceptance",
        f"  {load}    # in a second terminal: drive it; prints per-phase tok/s, TTFT, TPOT and the controller's switches, then writes an HTML report",
        "",
        "Ctrl-C stops everything.",
    ]
    return "\n".join(lines)


def _state_json(plan: UpPlan, model_id: str, pids: dict[str, int]) -> dict:
    return {
        "pid": os.getpid(),
        "gateway_url": plan.gateway_url,
        "model": model_id,
        "admin_key": plan.admin_key,
        "tenants": [asdict(t) for t in plan.tenants],
        "replicas": [{**asdict(r), "url": r.url, "pid": pids.get(r.name)} for r in plan.replicas],
    }


def _write_state(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # keys inside: owner-only
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2)
    os.replace(tmp, path)


def _remove_own_state(path: Path) -> None:
    """Remove the state file only if this process wrote it: a second `specgate
    up` that fails to start must not orphan the running stack's file."""
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


class _Terminate(Exception):
    """SIGTERM, turned into an exception so every `finally` runs."""


def _on_sigterm(signum, frame):  # noqa: ARG001
    raise _Terminate()


def run_up(plan: UpPlan, out: Callable[[str], None] = print, log_dir: Path | None = None) -> int:
    """Start the stack and block until Ctrl-C/SIGTERM. Returns the exit code."""
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    sup = Supervisor()
    log_dir = log_dir or plan.state_file.parent / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    try:
        if not _port_free(plan.host, plan.port):
            out(f"  x gateway could not start: port {plan.port} on {plan.host} is in use (choose --port)")
            return 1
        slow = f", {plan.time_scale:g}x slower than real time" if plan.time_scale != 1 else ""
        out(f"specgate up: starting {len(plan.replicas)} simulated replicas ({plan.gpu}, {plan.model}{slow}) ...")
        for r in plan.replicas:
            sup.start(r.name, replica_argv(plan, r), url=r.url, log_path=str(log_dir / f"{r.name}.log"))
        for child, r in zip(sup.children, plan.replicas):
            t0 = time.monotonic()
            if not wait_http_ok(r.url + "/health", timeout_s=60, child=child):
                out(f"  x replica {r.name} did not become healthy; log: {log_dir / (r.name + '.log')}")
                _print_tail(out, log_dir / f"{r.name}.log")
                return 1
            out(f"  ok replica {r.name:<16} {r.profile:<10} {r.url}  pid {child.pid}  ({time.monotonic() - t0:.1f}s)")
        out(f"specgate up: starting gateway on {plan.gateway_url} with the embedded controller ...")
        try:
            return asyncio.run(_serve(plan, sup, out))
        except SystemExit as exc:  # uvicorn exits the process when it cannot bind or start
            out(f"  x gateway could not start on {plan.gateway_url} (uvicorn exit {exc.code})")
            return 1
    except (KeyboardInterrupt, _Terminate):
        return 0
    finally:
        out("specgate up: stopping ...")
        sup.stop_all()
        _remove_own_state(plan.state_file)
        signal.signal(signal.SIGTERM, previous)
        out("specgate up: stopped (all child processes exited)")


def _port_free(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def _print_tail(out, path: Path, lines: int = 15) -> None:
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines()[-lines:]:
            out("    | " + line)


# A laptop has no load balancer to wait for: Ctrl-C stops accepting at once and
# gives in-flight requests a moment (a second Ctrl-C stops at once).
UP_DRAIN_DEADLINE_S = 3.0


async def _serve(plan: UpPlan, sup: Supervisor, out: Callable[[str], None]) -> int:
    from contract.store import create_store
    from gateway.server import GatewayServer, build_config

    from .node import create_node_app

    settings = settings_for(plan)
    store = create_store(settings.redis_url, settings.redis_prefix)
    app = create_node_app(settings, store, controller=True)
    server = GatewayServer(build_config(app, settings, host=plan.host, port=plan.port, log_level="warning"),
                           drain_pre_s=0.0, drain_deadline_s=UP_DRAIN_DEADLINE_S)
    logging.getLogger("uvicorn.error").addFilter(_ShutdownCancellations(server))
    serve_task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if serve_task.done():
                with contextlib.suppress(SystemExit):
                    await serve_task
                out(f"  x gateway could not start on {plan.gateway_url} (port in use?)")
                return 1
            await asyncio.sleep(0.05)
        routable = asyncio.create_task(_wait_routable(plan, out))
        await asyncio.wait({routable, serve_task}, return_when=asyncio.FIRST_COMPLETED)
        if not routable.done():  # Ctrl-C/SIGTERM while starting: the server has drained already
            routable.cancel()
            return 0
        model_id = routable.result()
        _write_state(plan.state_file, _state_json(plan, model_id, {c.name: c.pid for c in sup.children}))
        out(banner(plan, model_id))
        watch = asyncio.create_task(_watch_children(sup, out))
        try:
            await serve_task
        finally:
            watch.cancel()
        return 0
    finally:
        if not serve_task.done():
            server.should_exit = True
            await serve_task
        with contextlib.suppress(Exception):  # bounded: a Redis that stopped answering must not hold the exit
            await asyncio.wait_for(store.close(), timeout=5.0)


class _ShutdownCancellations(logging.Filter):
    """Drop uvicorn's traceback for requests it cancels itself at shutdown.

    On Ctrl-C the drain gives in-flight requests `UP_DRAIN_DEADLINE_S`, then uvicorn cancels what is left
    and logs each CancelledError with a traceback; at that point the cancellation is the expected
    outcome of the user's Ctrl-C, not an error worth a screenful. Everything else still logs.
    """

    def __init__(self, server) -> None:
        super().__init__()
        self.server = server

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (self.server.should_exit and isinstance(exc, asyncio.CancelledError))


async def _wait_routable(plan: UpPlan, out, timeout_s: float = 30.0) -> str:
    """Wait until the gateway sees every replica healthy; return the served model id."""
    headers = {"Authorization": f"Bearer {plan.tenants[0].key}"}
    deadline = time.monotonic() + timeout_s
    model_id = plan.model
    async with httpx.AsyncClient(base_url=plan.gateway_url, timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError, ValueError, KeyError):
                health = (await client.get("/health")).json()
                if len(health.get("healthy_replicas", [])) == len(plan.replicas):
                    models = (await client.get("/v1/models", headers=headers)).json()["data"]
                    if models:
                        model_id = models[0]["id"]
                        out(f"  ok gateway sees {len(plan.replicas)}/{len(plan.replicas)} replicas healthy; model {model_id}")
                        return model_id
            await asyncio.sleep(0.2)
    out("  ! not every replica is healthy in the gateway yet; continuing")
    return model_id


async def _watch_children(sup: Supervisor, out) -> None:
    reported: set[str] = set()
    while True:
        await asyncio.sleep(1.0)
        for child in sup.dead():
            if child.name not in reported:
                reported.add(child.name)
                out(f"  ! replica {child.name} exited with code {child.proc.returncode}; the gateway routes around it")
