"""Fixtures for the one-command stack: `specgate up` started as a real process tree."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from testbed.procs import free_port

REPO = Path(__file__).resolve().parents[2]


@dataclass
class UpProcess:
    proc: subprocess.Popen
    state_file: Path
    port: int
    lines: list[str] = field(default_factory=list)
    child_pids: list[int] = field(default_factory=list)
    _q: "queue.Queue[str | None]" = field(default_factory=queue.Queue)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._q.put(line.rstrip("\n"))
        self._q.put(None)

    def wait_for(self, needle: str, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(needle in line for line in self.lines):
                return True
            try:
                line = self._q.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                return any(needle in l for l in self.lines)
            self.lines.append(line)
        return False

    def drain(self, timeout_s: float = 5.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self._q.get(timeout=0.2)
            except queue.Empty:
                if self.proc.poll() is not None:
                    return
                continue
            if line is None:
                return
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def state(self) -> dict:
        return json.loads(self.state_file.read_text())

    def wait_ready(self, timeout_s: float = 120.0) -> dict:
        """Wait for the banner; remember the child pids; return the state file."""
        ok = self.wait_for("Ctrl-C stops everything", timeout_s)
        assert ok, "specgate up did not come up:\n" + self.output
        self.child_pids = children_of(self.proc.pid)
        return self.state()


def start_up(tmp_path: Path, *args: str, env: dict | None = None) -> UpProcess:
    port = free_port()
    state_file = tmp_path / "up.json"
    full_env = {k: v for k, v in os.environ.items() if k != "SPECGATE_REDIS_URL"}
    full_env.update({"PYTHONUNBUFFERED": "1", "XDG_CACHE_HOME": str(tmp_path / "cache")})
    full_env.update(env or {})
    proc = subprocess.Popen(
        [sys.executable, "-m", "specgate.cli", "up", "--port", str(port), "--state-file", str(state_file), *args],
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    up = UpProcess(proc=proc, state_file=state_file, port=port)
    threading.Thread(target=up._pump, daemon=True).start()
    return up


def children_of(pid: int) -> list[int]:
    """Direct children of `pid`, from /proc (no psutil needed)."""
    kids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid ...; comm may contain spaces: split after the last ')'
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid:
            kids.append(int(entry))
    return kids


def process_alive(pid: int) -> bool:
    """True if `pid` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def processes_with_arg(arg: str) -> list[int]:
    """Live processes whose command line contains `arg` (e.g. a unique state-file path)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if arg in cmdline and process_alive(int(entry)):
            found.append(int(entry))
    return found


def port_is_free(port: int) -> bool:
    import socket

    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def stop(up: UpProcess, sig: int = signal.SIGINT, timeout_s: float = 30.0) -> int:
    if up.proc.poll() is None:
        up.proc.send_signal(sig)
    try:
        return up.proc.wait(timeout=timeout_s)
    finally:
        if up.proc.poll() is None:  # never leave a stack behind, even when the test failed
            up.proc.kill()
            up.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """One full `specgate up` (2x dspark-b8 + off) shared by a module's tests; stopped at the end
    unless a test stopped it already (the SIGINT test does, last)."""
    up = start_up(tmp_path_factory.mktemp("up"))
    try:
        up.wait_ready()
        yield up
    finally:
        if up.proc.poll() is None:
            stop(up)
        for pid in up.child_pids:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def up_factory(tmp_path):
    started: list[UpProcess] = []

    def factory(*args: str, env: dict | None = None) -> UpProcess:
        up = start_up(tmp_path, *args, env=env)
        started.append(up)
        return up

    yield factory
    for up in started:
        if up.proc.poll() is None:
            stop(up)
        for pid in up.child_pids:  # belt and braces: a failing test must not leak replicas
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)
