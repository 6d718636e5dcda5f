"""`specgate up`: the real process tree (gateway + embedded controller in the parent, simulated
replicas as children), used through the real openai SDK, stopped by real signals.

What must hold: it comes up and prints working keys; an SDK call through it works (streaming
too); the admin API shows the demo tenants; and SIGINT / SIGTERM / even SIGKILL of the parent
leave no child process and no bound port behind.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import httpx
import pytest
from openai import OpenAI

from tests.specgate.conftest import REPO, children_of, port_is_free, process_alive, stop

pytestmark = pytest.mark.slow


def _ports(state: dict) -> list[int]:
    return [int(state["gateway_url"].rsplit(":", 1)[1])] + [r["port"] for r in state["replicas"]]


def _wait_gone(pids, timeout_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    alive = list(pids)
    while alive and time.monotonic() < deadline:
        alive = [p for p in alive if process_alive(p)]
        if alive:
            time.sleep(0.1)
    return alive


def _wait_ports_free(ports, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    busy = list(ports)
    while busy and time.monotonic() < deadline:
        busy = [p for p in busy if not port_is_free(p)]
        if busy:
            time.sleep(0.1)
    return busy


def test_up_serves_sdk_calls(stack):
    up = stack
    state = up.state()

    # The banner carries copy-paste examples with a working key.
    tenant = state["tenants"][0]
    assert tenant["key"] in up.output and "curl -s" in up.output and "from openai import OpenAI" in up.output
    assert {r["profile"] for r in state["replicas"]} == {"dspark-b8", "off"}
    assert len(state["replicas"]) == 3
    assert sorted(up.child_pids) == sorted(r["pid"] for r in state["replicas"])

    client = OpenAI(base_url=state["gateway_url"] + "/v1", api_key=tenant["key"], max_retries=0, timeout=30)
    models = client.models.list()
    assert state["model"] in [m.id for m in models.data]
    reply = client.chat.completions.create(
        model=state["model"], messages=[{"role": "user", "content": "Hello!"}], max_tokens=24
    )
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens > 0

    chunks = list(client.chat.completions.create(
        model=state["model"], messages=[{"role": "user", "content": "Stream please"}], max_tokens=16, stream=True
    ))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    # A wrong key gets an OpenAI-shaped 401 through the SDK.
    bad = OpenAI(base_url=state["gateway_url"] + "/v1", api_key="sk-wrong", max_retries=0, timeout=10)
    with pytest.raises(Exception) as err:
        bad.models.list()
    assert getattr(err.value, "status_code", None) == 401

    # The admin API (embedded controller) knows the demo tenants; tenant keys get 403.
    admin = httpx.get(state["gateway_url"] + "/admin/tenants", headers={"Authorization": f"Bearer {state['admin_key']}"})
    assert admin.status_code == 200
    assert {"chat", "code", "batch"} <= {t["tenant"] for t in admin.json()["data"]}
    forbidden = httpx.get(state["gateway_url"] + "/admin/tenants", headers={"Authorization": f"Bearer {tenant['key']}"})
    assert forbidden.status_code == 403


def _doc_admin_examples() -> list[str]:
    text = (REPO / "docs" / "operations.md").read_text()
    section = text.split("## Admin API", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    commands = []
    for block in blocks:
        for cmd in block.replace("\\\n", " ").splitlines():
            cmd = cmd.strip()
            if cmd.startswith("curl "):
                commands.append(cmd)
    return commands


def test_docs_admin_curl_examples_work(stack):
    """Every curl in docs/operations.md's Admin API section answers 2xx on a live stack."""
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    state = stack.state()
    commands = _doc_admin_examples()
    assert len(commands) >= 10
    env = dict(os.environ, GW=state["gateway_url"], ADMIN=f"Authorization: Bearer {state['admin_key']}")
    for cmd in commands:
        proc = subprocess.run(["bash", "-c", cmd + " -o /dev/null -w '%{http_code}'"], env=env, capture_output=True,
                              text=True, timeout=30)
        assert proc.returncode == 0 and proc.stdout.startswith("2"), f"{cmd} -> {proc.stdout} {proc.stderr}"


def _banner_commands(output: str) -> list[str]:
    """The shell commands of the banner's "Try it:" block, as a user would paste them."""
    block = output.split("Try it:", 1)[1].split("Ctrl-C stops everything", 1)[0]
    return [c.strip() for c in block.replace("\\\n", " ").splitlines() if c.strip()]


def test_printed_commands_work_when_pasted(stack):
    """Each command `specgate up` prints runs as printed, from the directory
    `make run` runs in: the curl and the SDK example answer, and the load
    hint names an executable that exists (it is run for real in
    test_load_drives_mixed_tenants_and_reports)."""
    commands = _banner_commands(stack.output)
    assert len(commands) == 5, commands
    sdk = next(c for c in commands if " -c 'from openai import OpenAI" in c)
    assert sdk.startswith(".venv/bin/python -c "), sdk  # the environment with the SDK, not whatever is on PATH
    assert (REPO / ".venv/bin/python").exists()
    load = next(c for c in commands if " load " in c)
    exe = load.split()[0]
    assert exe == ".venv/bin/specgate" and (REPO / exe).exists(), load
    assert f"--state-file {stack.state_file}" in load  # a non-default state file is passed on
    runnable = [c for c in commands if c is not load and (c.startswith("curl ") or c is sdk)]
    if shutil.which("curl") is None:
        runnable = [sdk]
    for cmd in runnable:
        proc = subprocess.run(["bash", "-c", cmd], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and proc.stdout.strip(), f"{cmd} -> {proc.returncode} {proc.stdout} {proc.stderr}"
        assert '"error"' not in proc.stdout[:200], f"{cmd} -> {proc.stdout[:300]}"
    proc = subprocess.run([exe, "load", "--help"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--state-file" in proc.stdout, proc.stderr


def test_load_drives_mixed_tenants_and_reports(stack):
    proc = subprocess.run(
        [sys.executable, "-m", "specgate.cli", "load", "--rps", "4", "--duration", "6", "--state-file",
         str(stack.state_file), "--no-report"],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "phase light" in out and "phase heavy" in out
    m = re.search(r"sent (\d+), ok (\d+)", out)
    assert m and int(m.group(2)) > 0 and int(m.group(2)) == int(m.group(1)), out
    assert "controller policy changes during the run" in out


def test_sigint_stops_every_child_and_frees_every_port(stack):
    up = stack
    state = up.state()
    ports = _ports(state)
    assert len(up.child_pids) == 3
    rc = stop(up, signal.SIGINT)
    up.drain()
    assert rc == 0, up.output
    assert "stopped (all child processes exited)" in up.output
    assert _wait_gone(up.child_pids) == [], "replica processes outlived `specgate up`"
    assert _wait_ports_free(ports) == [], "ports still bound after `specgate up` exited"
    assert not up.state_file.exists(), "state file (holds keys) left behind"


def test_sigterm_stops_everything(up_factory):
    up = up_factory("--replicas", "off")
    state = up.wait_ready()
    ports = _ports(state)
    assert len(up.child_pids) == 1
    rc = stop(up, signal.SIGTERM)
    up.drain()
    assert rc == 0, up.output
    assert _wait_gone(up.child_pids) == []
    assert _wait_ports_free(ports) == []


def test_children_die_with_a_killed_parent(up_factory):
    """SIGKILL gives the parent no chance to clean up: the kernel's parent-death signal must."""
    up = up_factory("--replicas", "off")
    state = up.wait_ready()
    kids = list(up.child_pids)
    assert kids
    up.proc.kill()
    up.proc.wait(timeout=10)
    assert _wait_gone(kids) == [], "children survived a SIGKILLed parent"
    assert _wait_ports_free(_ports(state)) == []


def test_port_in_use_fails_cleanly(tmp_path):
    import socket

    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.run(
            [sys.executable, "-m", "specgate.cli", "up", "--port", str(port), "--replicas", "off",
             "--state-file", str(REPO / ".pytest_cache" / f"up-{port}.json")],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        )
    assert proc.returncode != 0
    assert "could not start" in proc.stdout
    assert "stopped (all child processes exited)" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_children_of_reads_proc():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert proc.pid in children_of(os.getpid())
    finally:
        proc.kill()
        proc.wait()


def test_up_uses_redis_when_configured(up_factory, redis_url, redis_prefix):
    """SPECGATE_REDIS_URL switches the embedded stack from in-memory state to Redis."""
    import redis as redis_lib

    up = up_factory("--replicas", "off", env={"SPECGATE_REDIS_URL": redis_url, "SPECGATE_REDIS_PREFIX": redis_prefix})
    state = up.wait_ready()
    assert f"state: redis {redis_url}" in up.output
    tenant = state["tenants"][0]
    client = OpenAI(base_url=state["gateway_url"] + "/v1", api_key=tenant["key"], max_retries=0, timeout=30)
    client.chat.completions.create(model=state["model"], messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    r = redis_lib.Redis.from_url(redis_url)
    deadline = time.monotonic() + 10
    keys: list = []
    while time.monotonic() < deadline and not keys:
        keys = list(r.scan_iter(match=redis_prefix + "*", count=1000))
        time.sleep(0.2)
    r.close()
    assert keys, "nothing was written under the stack's Redis prefix"
    assert stop(up) == 0
