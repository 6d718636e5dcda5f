"""Child-process supervision for `specgate up`.

Why a module of its own: the one-command stack must never leave orphans or
bound ports behind, whatever ends it (Ctrl-C, SIGTERM, a child crashing at
start-up, the parent being killed). Three mechanisms together make that true:

- every child runs in its own session (process group), so a terminal Ctrl-C
  reaches only the parent, which then stops the children in order instead of
  racing them;
- on Linux every child gets PR_SET_PDEATHSIG=SIGTERM, so even a SIGKILLed
  parent takes its children with it;
- `stop_all()` sends SIGTERM to each child's whole process group, waits a
  bounded time, then SIGKILLs what is left and reaps everything.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import IO, Sequence

import httpx

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except OSError:
            pass


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
        proc = subprocess.Popen(
            list(argv),
            env={**os.environ, **(env or {})},
            stdin=subprocess.DEVNULL,
            stdout=log if log else subprocess.DEVNULL,
            stderr=subprocess.STDOUT if log else subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 (no threads hold locks at this point)
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
            _signal_group(child.proc, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for child in self.children:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                child.proc.wait(timeout=remaining)
            except subprocess.TimeoutExpired:
                _signal_group(child.proc, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):  # stuck in D state: keep cleaning the rest
                    child.proc.wait(timeout=5)
            # The group may hold grandchildren (e.g. a worker): make sure none survive.
            _signal_group(child.proc, signal.SIGKILL, only_if_exists=True)
            if child.log:
                child.log.close()


def _signal_group(proc: subprocess.Popen, sig: int, only_if_exists: bool = False) -> None:
    try:
        os.killpg(proc.pid, sig)  # pgid == pid because of start_new_session
    except (ProcessLookupError, PermissionError):
        if not only_if_exists and proc.poll() is None:
            try:
                proc.send_signal(sig)
            except ProcessLookupError:
                pass


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
