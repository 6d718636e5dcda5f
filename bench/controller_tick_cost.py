"""What an embedded controller's decisions cost in CPU, per tick.

`bench/real_sweep.py` runs the controller inside the gateway process
(`--embedded-controller`), at the front ends' priority, on the same two
cores as the engines; whatever a tick's decision costs is taken from them.
This starts the same shape of stack as subprocesses on loopback -- two
simulated ngram replicas (`specgate sim-replica --profile ngram-k8`) and
`specgate gateway --embedded-controller` with tenants `greedy` and `temp1`,
1 s ticks -- drives a closed loop of completions at temperature 0 and 1 for
`--seconds`, and reads the controller's own metrics
(`specgate_controller_decide_seconds`, `_decide_cpu_seconds_total`):

    .venv/bin/python bench/controller_tick_cost.py [--seconds 40] [--concurrency 8]

Prints the ticks, the mean wall time and CPU time of a decision, the
share of one core that is at the tick rate, and the gateway process's whole
CPU over the load (relaying, scrapes and the step-cost fits included).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak import Proc, stop_everything  # noqa: E402  (the soak's process handling)
from testbed.procs import free_port, wait_http_ok  # noqa: E402

KEYS = {"greedy": "sk-tick-greedy", "temp1": "sk-tick-temp1"}
ADMIN = "tick-admin"
MODEL = "tick-model"
_SAMPLE = re.compile(r"^(specgate_controller_(?:ticks_total|decide_seconds_count|decide_seconds_sum|decide_cpu_seconds_total)) (\S+)$", re.M)


def process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of one process so far (/proc/<pid>/stat, fields 14-15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _up(ok: bool, what: str) -> None:
    if not ok:
        raise SystemExit(f"[controller_tick_cost] {what} did not come up within 60 s")


async def load(url: str, seconds: float, concurrency: int) -> int:
    """Closed loop, half the workers per tenant; returns the requests done."""
    done = [0]
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        async def worker(tenant: str, temperature: float) -> None:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                r = await http.post("/v1/completions", headers={"authorization": f"Bearer {KEYS[tenant]}"},
                                    json={"model": MODEL, "prompt": "[workload=code] tick", "max_tokens": 32, "temperature": temperature})
                done[0] += r.status_code == 200
        half = max(1, concurrency // 2)
        await asyncio.gather(*[worker("greedy", 0.0) for _ in range(half)], *[worker("temp1", 1.0) for _ in range(half)])
    return done[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--concurrency", type=int, default=8)
    a = ap.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="specgate-tick-"))
    py = sys.executable
    replicas = {}
    for i, name in enumerate(("r0", "r1")):
        port = free_port()
        replicas[name] = Proc(name, [py, "-m", "specgate.cli", "sim-replica", "--profile", "ngram-k8", "--host", "127.0.0.1",
                                     "--port", str(port), "--name", name, "--served-model-name", MODEL, "--seed", str(i)],
                              run_dir / f"{name}.log", port)
    config = {
        "replicas": [{"url": f"http://127.0.0.1:{p.port}", "name": n, "model": MODEL, "profile": "ngram-k8"} for n, p in replicas.items()],
        "tenants": [{"id": t, "api_key_sha256": hashlib.sha256(k.encode()).hexdigest()} for t, k in KEYS.items()],
        "admin_key": ADMIN,
        "log_level": "WARNING",
        "controller": {"tick_s": 1.0},
    }
    (run_dir / "gateway.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    port = free_port()
    gateway = Proc("gateway", [py, "-m", "specgate.cli", "gateway", "--config", str(run_dir / "gateway.yaml"), "--port", str(port),
                               "--embedded-controller"], run_dir / "gateway.log", port)
    url = f"http://127.0.0.1:{port}"
    try:
        for p in replicas.values():
            p.start()
        for p in replicas.values():
            _up(wait_http_ok(f"http://127.0.0.1:{p.port}/health", timeout_s=60), p.name)
        gateway.start()
        _up(wait_http_ok(url + "/ready", timeout_s=60), "gateway")
        cpu_before = process_cpu_s(gateway.pid)
        done = asyncio.run(load(url, a.seconds, a.concurrency))
        gateway_cpu = process_cpu_s(gateway.pid) - cpu_before
        text = httpx.get(url + "/admin/controller/metrics", headers={"authorization": f"Bearer {ADMIN}"}, timeout=10).text
    finally:
        stop_everything()
    values = {m.group(1): float(m.group(2)) for m in _SAMPLE.finditer(text)}
    n = values.get("specgate_controller_decide_seconds_count", 0.0)
    if not n:
        print(f"[controller_tick_cost] no timed decision in the controller's metrics (logs: {run_dir})", file=sys.stderr)
        return 1
    wall = values["specgate_controller_decide_seconds_sum"] / n
    cpu = values["specgate_controller_decide_cpu_seconds_total"] / n
    print(f"{done} requests in {a.seconds:g} s at concurrency {a.concurrency}; {n:.0f} timed decisions "
          f"({values.get('specgate_controller_ticks_total', 0):.0f} ticks)")
    print(f"per decision: wall {wall * 1e3:.1f} ms, CPU {cpu * 1e3:.1f} ms; at one tick a second, {cpu * 100:.1f} % of a core")
    print(f"gateway process (relaying, scrapes, the step-cost fits, decisions): {gateway_cpu:.2f} s of CPU in "
          f"{a.seconds:g} s, {gateway_cpu * 1e3 / max(done, 1):.2f} ms per request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
