"""testbed.procs: children die with their parent, and a stopped tree leaves nothing behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from testbed.procs import descendants, spawn, stop_tree

# A child that starts a grandchild in a session of its own (out of the child's
# process group, as vLLM's engine core leaves its API server's) and prints its pid.
ESCAPING_GRANDCHILD = (
    "import subprocess, sys, time\n"
    "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
    "print(g.pid, flush=True)\n"
    "time.sleep(600)\n"
)


def _gone(pid: int, within_s: float = 10.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":  # a zombie is dead, waiting for its reaper
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


def test_stop_tree_takes_descendants_that_left_the_group():
    child = spawn([sys.executable, "-c", ESCAPING_GRANDCHILD], stdout=subprocess.PIPE, text=True)
    grandchild = int(child.stdout.readline())
    assert grandchild in descendants(child.pid)
    stop_tree(child, grace_s=5)
    assert child.poll() is not None and _gone(grandchild)


def test_a_child_dies_with_its_sigkilled_parent():
    parent_code = (
        "import sys, time\n"
        "from testbed.procs import spawn\n"
        "c = spawn([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})  # fmt: skip
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=10)
    assert _gone(child)  # PR_SET_PDEATHSIG: SIGTERM when the parent died
