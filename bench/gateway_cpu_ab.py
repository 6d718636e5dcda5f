"""Gateway CPU per request, several source trees side by side (A B C, A B C, ...).

Why a second overhead bench: `bench/gateway_overhead.py`'s saturated
throughput rows divide the gateway's CPU time by what it served while the
load generator, the backend and the gateway fight over two cores, and on
this machine the same code moved from 523 to 715 µs per non-streaming
request between two runs. Here the load is a closed loop well below
saturation (8 requests in flight), the gateway and the fake backend are
pinned to one core each, every tree serves the same requests, and the trees
take turns `--rounds` times, so drift hits them alike; the figure is the
gateway's own CPU time (utime + stime from /proc) per request, median and
every round.

    .venv/bin/python bench/gateway_cpu_ab.py --refs WORK,3ea302e --stream
    .venv/bin/python bench/gateway_cpu_ab.py --refs WORK,HEAD~1 -n 4000
    .venv/bin/python bench/gateway_cpu_ab.py --refs WORK,3ea302e --stream --instructions

`--instructions` counts instead of timing: each gateway runs under
valgrind's callgrind (instrumentation off through start-up and warm-up, on
for the measured requests), and the figure is the instructions it executed
per request, less what it executes idle (timers, health checks) for as long
as the requests took, measured right after. Instruction counts do not move
with the machine's load; what still moves (±3 % between rounds) is work
that depends on timing (how reads batch, health checks), so a few per cent
are visible where CPU time swings ±20 %. Slow (~50x): use a few hundred
requests. The callgrind profiles are left in a temporary folder (printed)
for `callgrind_annotate`.

`WORK` is this checkout as it is (uncommitted changes included); any other
ref runs from a temporary git worktree. Needs Redis (--redis-url), as the
gateway's budgets are on, like in gateway_overhead.py, whose helpers and
configuration this reuses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_overhead import (  # noqa: E402
    CHAT,
    KEY,
    ROOT,
    baseline_worktree,
    cpu_seconds,
    drop_worktree,
    free_port,
    pinned,
    start_gateway,
    stop,
    wait_http,
    write_config,
)


async def closed_loop(url: str, n: int, stream: bool, in_flight: int) -> int:
    """Send `n` chat completions, `in_flight` at a time; returns how many got a 200."""
    import aiohttp

    data = json.dumps(dict(CHAT, stream=True) if stream else CHAT).encode()
    headers = {"content-type": "application/json", "authorization": f"Bearer {KEY}"}
    ok = 0
    async with aiohttp.ClientSession() as session:
        gate = asyncio.Semaphore(in_flight)

        async def one() -> None:
            nonlocal ok
            async with gate:
                async with session.post(url + "/v1/chat/completions", data=data, headers=headers) as resp:
                    await resp.read()
                    ok += resp.status == 200

        await asyncio.gather(*(one() for _ in range(n)))
    return ok


class Callgrind:
    """A gateway under callgrind: its executed-instruction counter, read live
    through `callgrind_control` (vgdb), with instrumentation switched on only
    for what is measured."""

    def __init__(self, pid: int):
        self.pid = pid

    def _control(self, *opts: str) -> str:
        out = subprocess.run(["callgrind_control", *opts, str(self.pid)], capture_output=True, text=True, timeout=120, check=False)
        if out.returncode != 0:
            raise RuntimeError(f"callgrind_control {' '.join(opts)}: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout

    def instrument(self, on: bool) -> None:
        self._control(f"--instr={'on' if on else 'off'}")

    def instructions(self) -> int:
        """Instructions executed while instrumented, so far (`-e Ir`: the sum over threads)."""
        text = self._control("-e", "Ir")
        # "  Totals:    Ir\n   Th 1  36,818\n   Th 2  ..." (one line per thread)
        counts = [int(m) for m in re.findall(r"^\s*Th\s+\d+\s+(\d+)", text.replace(",", ""), re.MULTILINE)]
        if not counts:
            if "Totals:" in text:  # nothing executed under instrumentation yet: no thread lines
                return 0
            raise RuntimeError(f"callgrind_control printed no Ir counter: {text!r}")
        return sum(counts)


def callgrind_argv(argv: list[str], out_dir: str) -> list[str]:
    """`argv` under callgrind, instrumentation off until switched on (start-up at ~4x, not ~50x)."""
    return ["valgrind", "-q", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out_dir}/callgrind.%p", *argv]


def count_instructions(args, refs: list[str], trees: dict[str, Path], backend_port: int) -> None:
    """Per tree: start the gateway under callgrind, warm it, then count the
    instructions per request (less idle) over `--rounds` batches of `-n`."""
    per_request: dict[str, list[float]] = {ref: [] for ref in refs}
    idle_rate: dict[str, float] = {}
    out_dir = tempfile.mkdtemp(prefix="specgate-callgrind-")
    print(f"callgrind profiles (written as each gateway exits): {out_dir}", file=sys.stderr)
    for ref in refs:
        # Under callgrind every call takes ~50x longer: a tree with a budget store
        # timeout (0.5 s by default) would count Redis as down and meter locally.
        settings = (trees[ref] / "contract" / "settings.py").read_text()
        extra = {"budget_store_timeout_s": 30.0} if "budget_store_timeout_s" in settings else {}
        extra.update(json.loads(args.gateway_extra) if ref == "WORK" else {})
        cfg = write_config(args, backend_port, f"cpu-ab-{ref}-{time.time()}", "aiohttp", 1.0, extra)
        port = free_port()
        proc = start_gateway(args, cfg, port, trees[ref], wrap=lambda argv: callgrind_argv(argv, out_dir), up_timeout=600)
        url = f"http://127.0.0.1:{port}"
        try:
            asyncio.run(closed_loop(url, 50, args.stream, args.in_flight))  # warm (uninstrumented)
            counter = Callgrind(proc.pid)
            counter.instrument(True)
            for _ in range(args.rounds):
                start, t0 = counter.instructions(), time.monotonic()
                ok = asyncio.run(closed_loop(url, args.n, args.stream, args.in_flight))
                busy, wall = counter.instructions() - start, time.monotonic() - t0
                idle_start = counter.instructions()
                time.sleep(min(wall, 30.0))
                rate = (counter.instructions() - idle_start) / min(wall, 30.0)
                idle_rate[ref] = rate
                per_request[ref].append((busy - rate * wall) / max(ok, 1))
                if ok != args.n:
                    print(f"{ref}: {args.n - ok} of {args.n} requests failed", file=sys.stderr)
        finally:
            stop(proc)
    report(args, refs, per_request, "instructions per {kind} request (callgrind Ir, idle subtracted)",
           lambda x: f"{x / 1e6:8.3f} M", lambda ref: f"idle {idle_rate[ref] / 1e6:.1f} M/s  ")


def report(args, refs: list[str], per_request: dict[str, list[float]], what: str, fmt, extra=lambda ref: "") -> None:
    """One line per tree: the median, every round, and the first tree's ratio to it."""
    kind = "stream" if args.stream else "non-stream"
    first = statistics.median(per_request[refs[0]])
    print(f"gateway {what.format(kind=kind)}, {args.n} requests x {args.rounds} rounds, {args.in_flight} in flight")
    for ref in refs:
        med = statistics.median(per_request[ref])
        print(f"  {ref:12s} median {fmt(med)}  rounds [{', '.join(fmt(x).strip() for x in per_request[ref])}]  "
              f"{extra(ref)}{refs[0]} costs {first / med:.3f}x this")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refs", default="WORK,3ea302e", help="comma-separated trees: WORK (this checkout) or git refs")
    ap.add_argument("-n", type=int, default=3000, help="requests per tree per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--in-flight", type=int, default=8)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--redis-url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--gateway-cpu", default="0")
    ap.add_argument("--backend-cpu", default="1")
    ap.add_argument("--gateway-extra", default="{}", help="JSON merged into WORK's gateway settings (with --instructions)")
    ap.add_argument("--instructions", action="store_true", help="count instructions under callgrind instead of CPU time")
    args = ap.parse_args()
    refs = [r for r in args.refs.split(",") if r]

    backend_port = free_port()
    backend = subprocess.Popen(
        pinned(args.backend_cpu, [sys.executable, "-m", "testbed.fake_openai", "--port", str(backend_port), "--spec", "--knobs"]),
        cwd=ROOT, stdout=subprocess.DEVNULL,
    )
    trees: dict[str, Path] = {}
    gateways: dict[str, tuple[subprocess.Popen, str]] = {}
    try:
        wait_http(f"http://127.0.0.1:{backend_port}/health")
        for ref in refs:
            trees[ref] = ROOT if ref == "WORK" else baseline_worktree(ref)
        if args.instructions:
            count_instructions(args, refs, trees, backend_port)
            return
        for ref in refs:
            cfg = write_config(args, backend_port, f"cpu-ab-{ref}-{time.time()}", "aiohttp", 1.0)
            port = free_port()
            gateways[ref] = (start_gateway(args, cfg, port, trees[ref]), f"http://127.0.0.1:{port}")
            asyncio.run(closed_loop(gateways[ref][1], 500, args.stream, args.in_flight))  # warm
        per_request: dict[str, list[float]] = {ref: [] for ref in refs}
        for _ in range(args.rounds):
            for ref in refs:
                proc, url = gateways[ref]
                before = cpu_seconds(proc.pid)
                ok = asyncio.run(closed_loop(url, args.n, args.stream, args.in_flight))
                per_request[ref].append(1e6 * (cpu_seconds(proc.pid) - before) / max(ok, 1))
                if ok != args.n:
                    print(f"{ref}: {args.n - ok} of {args.n} requests failed", file=sys.stderr)
        report(args, refs, per_request, "CPU per {kind} request (µs)", lambda x: f"{x:7.0f}")
    finally:
        for proc, _ in gateways.values():
            stop(proc)
        backend.terminate()
        for ref, tree in trees.items():
            if ref != "WORK":
                drop_worktree(tree)


if __name__ == "__main__":
    main()
