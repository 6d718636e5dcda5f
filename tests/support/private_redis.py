"""A redis-server of a test's own (`/usr/bin/redis-server`, no persistence)
on a fixed port across restarts, for tests that stop, restart or pause the
store -- never the shared Redis other tests use."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading

import redis

from testbed.procs import free_port
from tests.conftest import wait_for


class PrivateRedis:
    """A redis-server of this test's own, on a fixed port across restarts."""

    def __init__(self, workdir) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None

    def start(self) -> PrivateRedis:
        self.proc = subprocess.Popen(
            [shutil.which("redis-server"), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(self._answers, timeout=10)
        return self

    def _answers(self) -> bool:
        try:
            with redis.Redis(port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5) as r:
                return bool(r.ping())
        except redis.RedisError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
            self.proc = None

    def pause(self, ms: int) -> None:
        """Every client's commands hang for `ms` (the server stays up and accepts connections)."""
        with redis.Redis(port=self.port) as r:
            r.execute_command("CLIENT", "PAUSE", ms, "ALL")

    def stall(self, seconds: float) -> threading.Thread:
        """The server itself busy for `seconds` (a script spinning on `TIME`):
        it reads no socket meanwhile, so a command sent now runs when the
        stall ends, whether or not its client is still waiting. Unlike
        `pause`, which parks the client and drops its command if it goes away.
        Returns once the server has stopped answering, with the thread
        running the stall (join it)."""
        def run() -> None:
            with redis.Redis(port=self.port) as r:
                r.eval(_SPIN, 0, seconds)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        # A PING unanswered for 0.25 s: a loaded machine can delay an idle server's
        # answer by tens of milliseconds, which must not read as the stall.
        wait_for(lambda: not self._answers_within(0.25), timeout=min(5.0, seconds))
        return thread

    def _answers_within(self, timeout_s: float) -> bool:
        """A PING answered within `timeout_s` (a raw socket: redis-py's client retries timeouts)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)


# Busy until ARGV[1] seconds have passed on the server's clock.
_SPIN = """
local function now() local t = redis.call('TIME') return tonumber(t[1]) + tonumber(t[2]) / 1000000 end
local stop = now() + tonumber(ARGV[1])
while now() < stop do end
return 1
"""


