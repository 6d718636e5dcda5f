"""`specgate sim-replica` as a real subprocess (how `specgate up` starts replicas)."""

import os
import signal
import subprocess
import sys
import time

import httpx

from contract.vllm_metrics import parse_vllm_metrics
from testbed.procs import free_port


def test_sim_replica_command_serves_and_stops():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specgate.cli", "sim-replica", "--profile", "dspark-b8-av", "--gpu", "h100",
         "--model", "qwen3-14b", "--port", str(port), "--name", "r1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(base + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "sim replica did not become healthy"
            time.sleep(0.2)
        models = httpx.get(base + "/v1/models").json()
        assert models["data"][0]["id"] == "Qwen/Qwen3-14B"
        r = httpx.post(base + "/v1/completions", json={"prompt": "hi", "max_tokens": 8, "ignore_eos": True}, timeout=10)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        snap = parse_vllm_metrics(httpx.get(base + "/metrics").text)
        assert snap.ext_knobs == {"max_draft", "max_batch", "schedule", "min_confidence"} and snap.generation_tokens == 8
        assert snap.model_names == {"Qwen/Qwen3-14B"}
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
