"""Child processes that die with their parent: what `specgate up`, the tests'
vLLM servers and the benchmarks start.

Why one module: a test run, a bench or the one-command stack must never leave
orphans or bound ports behind, whatever ends it (Ctrl-C, SIGTERM, a child
crashing at start-up, the parent being SIGKILLed by a CI timeout). Three
mechanisms together make that true:

- every child runs in its own session (process group), so a terminal Ctrl-C
  reaches only the parent, which then stops the children in order instead of
  racing them, and one signal reaches a child's whole tree;
- on Linux every child gets PR_SET_PDEATHSIG=SIGTERM (`die_with_parent`, as
  the `preexec_fn`), so even a SIGKILLed parent takes its children with it;
- stopping sends SIGTERM to each child's process group, waits a bounded time,
  then SIGKILLs what is left -- descendants that left the group too
  (`descendants`, read from /proc) -- and reaps everything.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import IO, Sequence

import httpx

_PR_SET_PDEATHSIG = 1
try:  # resolved here, not in the forked child: loading a library between fork and exec can deadlock
    _prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):
    _prctl = None


def die_with_parent() -> None:
    """`preexec_fn`: in the child before exec, ask for SIGTERM when the parent dies (Linux)."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def descendants(pid: int) -> list[int]:
    """All live descendants of pid, from /proc (no psutil in the gateway venv)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    out, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            out.append(child)
            stack.append(child)
    return out


def signal_pids(pids: Sequence[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def signal_group(proc: subprocess.Popen, sig: int, only_if_exists: bool = False) -> None:
    """Signal the child's process group (pgid == pid: started in a new session)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        if not only_if_exists and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)


def stop_tree(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the child's group, SIGKILL after grace_s whatever of its tree is left (group or not); reap."""
    pids = [proc.pid, *descendants(proc.pid)]
    if proc.poll() is None:
        signal_group(proc, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    # Children that ignored SIGTERM or left the group (an engine core, its workers).
    signal_pids([p for p in pids if os.path.exists(f"/proc/{p}")], signal.SIGKILL)
    signal_group(proc, signal.SIGKILL, only_if_exists=True)
    with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in D state: the caller keeps cleaning up
        proc.wait(timeout=30)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the child and every descendant at once: a crash, as a failover test wants it."""
    signal_pids([proc.pid, *descendants(proc.pid)], signal.SIGKILL)
    signal_group(proc, signal.SIGKILL, only_if_exists=True)
    proc.wait(timeout=30)


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on host now, for a child to listen on."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def spawn(argv: Sequence[str], **popen_kwargs) -> subprocess.Popen:
    """Popen in a new session that dies with this process (the rest as Popen takes it)."""
    return subprocess.Popen(
        list(argv),
        start_new_session=True,
        preexec_fn=die_with_parent,  # noqa: PLW1509 (no threads hold locks between fork and exec here)
        **popen_kwargs,
    )


@dataclass
class Child:
    name: str
    argv: list[str]
    proc: subprocess.Popen
    url: str | None = None
    log: IO[bytes] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Supervisor:
    """Starts children and guarantees they are all gone after `stop_all()`."""

    children: list[Child] = field(default_factory=list)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        *,
        env: dict[str, str] | None = None,
        url: str | None = None,
        log_path: str | None = None,
    ) -> Child:
        log = open(log_path, "ab") if log_path else None  # noqa: SIM115 (closed in stop_all)
        proc = spawn(
            argv,
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=log if log else subprocess.DEVNULL,
            stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
            close_fds=True,
        )
        child = Child(name=name, argv=list(argv), proc=proc, url=url, log=log)
        self.children.append(child)
        return child

    def dead(self) -> list[Child]:
        return [c for c in self.children if not c.alive()]

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every child's process group, then SIGKILL stragglers; reap all."""
        for child in reversed(self.children):
            signal_group(child.proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                child.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                signal_group(child.proc, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in D state: keep cleaning the rest
                    child.proc.wait(timeout=5)
            # The group may hold grandchildren (e.g. a worker): make sure none survive.
            signal_group(child.proc, signal.SIGKILL, only_if_exists=True)
            if child.log:
                child.log.close()


def wait_http_ok(url: str, *, timeout_s: float, child: Child | None = None, interval_s: float = 0.2) -> bool:
    """Poll `url` until it answers 2xx; False on timeout or when `child` exits first."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0, trust_env=False) as client:
        while time.monotonic() < deadline:
            if child is not None and not child.alive():
                return False
            try:
                if client.get(url).is_success:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(interval_s)
    return False
