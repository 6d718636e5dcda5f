"""Running Mooncake Store here: its binaries, its system libraries, and a
master + store node pair for a process tree (tests, the bench).

Why a module of its own: the `mooncake-transfer-engine-non-cuda` wheel links
against three system libraries that plain Debian machines lack
(`libibverbs.so.1`, `libnl-3.so.200`, `libnl-route-3.so.200`; no RDMA device is
needed for TCP, only the libraries). `scripts/setup_vllm_env.sh` unpacks them
into `<venv>/mooncake-sys/` (`apt-get download` + `dpkg -x`, no root needed)
where they are not installed system-wide; this module preloads them for the
Python client and puts them on `LD_LIBRARY_PATH` for the two binaries.

The store's two processes (`mooncake_master`: keys, allocation, eviction
watermark; `mooncake_client`: a store node holding the memory segment the
samples live in, served over TCP) are what `docker-compose.yml`'s
`capture-store` services run; `MooncakeCluster` starts the same pair for a
test or the bench. Writers (the capture replica) and readers (the trainer)
mount no memory of their own: a sample outlives the process that wrote it.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

# In dependency order: each is loaded before the ones that need it.
SYSTEM_LIBS = ("libnl-3.so.200", "libnl-route-3.so.200", "libibverbs.so.1")
SYS_DIR_NAME = "mooncake-sys"  # under the venv (sys.prefix), written by scripts/setup_vllm_env.sh
_LIB_SUBDIRS = ("usr/lib/x86_64-linux-gnu", "lib/x86_64-linux-gnu")
_preloaded = False


def lib_dirs(prefix: str | os.PathLike | None = None) -> list[Path]:
    """The unpacked library directories of `prefix`'s venv (default: this one), if any."""
    root = Path(prefix or sys.prefix) / SYS_DIR_NAME
    return [root / sub for sub in _LIB_SUBDIRS if (root / sub).is_dir()]


def preload_system_libs() -> None:
    """Load the unpacked libraries by path (RTLD_GLOBAL) so that importing
    `mooncake.store` resolves them without LD_LIBRARY_PATH; a library the
    system has is left to the system."""
    global _preloaded
    if _preloaded:
        return
    dirs = lib_dirs()
    for name in SYSTEM_LIBS:
        found = next((d / name for d in dirs if (d / name).exists()), None)
        if found is not None:
            ctypes.CDLL(str(found), mode=ctypes.RTLD_GLOBAL)
    _preloaded = True


def distributed_store_class():
    """`mooncake.store.MooncakeDistributedStore`, its libraries loaded first."""
    preload_system_libs()
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as exc:
        raise ImportError(
            "the Mooncake capture store needs mooncake-transfer-engine-non-cuda (GPU hosts: "
            "mooncake-transfer-engine) and its system libraries: scripts/setup_vllm_env.sh installs both "
            f"into .venv-vllm ({exc})"
        ) from exc
    return MooncakeDistributedStore


def binary(name: str, venv: str | os.PathLike | None = None) -> Path:
    """A binary the wheel ships (`mooncake_master`, `mooncake_client`), found
    without importing the package (which would need the libraries): in this
    interpreter's environment, or in `venv` (the gateway's tests start the
    store from .venv-vllm's wheel)."""
    if venv is not None:
        found = sorted(Path(venv).glob("lib/python3*/site-packages/mooncake"))
        if not found:
            raise FileNotFoundError(f"mooncake is not installed in {venv} (scripts/setup_vllm_env.sh)")
        package = found[0]
    else:
        spec = importlib.util.find_spec("mooncake")
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError("mooncake is not installed in this environment (scripts/setup_vllm_env.sh)")
        package = Path(next(iter(spec.submodule_search_locations)))
    path = package / name
    if not path.exists():
        raise FileNotFoundError(f"the mooncake package ships no {name} ({path})")
    return path


def binary_env(base: dict[str, str] | None = None, prefix: str | os.PathLike | None = None) -> dict[str, str]:
    """An environment in which the binaries find the unpacked libraries."""
    env = dict(os.environ if base is None else base)
    extra = [str(d) for d in lib_dirs(prefix)]
    if extra:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(extra + ([env["LD_LIBRARY_PATH"]] if env.get("LD_LIBRARY_PATH") else []))
    return env


def master_args(port: int, metrics_port: int, host: str = "127.0.0.1") -> list[str]:
    """`mooncake_master`'s flags. Its eviction watermark is left at Mooncake's
    default (0.9 of the segments): the capture store keeps its own bound
    below it (`segment_bytes_for`), so the master never drops a sample the
    index still lists."""
    return [f"--rpc_address={host}", f"--rpc_port={port}", f"--metrics_port={metrics_port}", "--rpc_thread_num=2"]


def store_node_args(master: str, port: int, segment_bytes: int, buffer_bytes: int, host: str = "127.0.0.1") -> list[str]:
    """`mooncake_client`'s flags: a store node holding `segment_bytes` of sample memory."""
    return [
        f"--master_server_address={master}", "--metadata_server=P2PHANDSHAKE", "--protocol=tcp",
        f"--host={host}", f"--port={port}", f"--global_segment_size={segment_bytes}",
        f"--local_buffer_size={buffer_bytes}",
    ]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass
class MooncakeCluster:
    """A master and one store node on loopback, for as long as the context
    lasts (tests, the bench). `segment_bytes`: the node's sample memory;
    `venv`: the environment whose wheel and libraries to run (default: this one)."""

    segment_bytes: int
    buffer_bytes: int = 64 << 20
    log_dir: Path | None = None
    venv: Path | None = None
    master: str = ""
    _procs: list[subprocess.Popen] = field(default_factory=list)
    _logs: list = field(default_factory=list)

    def __enter__(self) -> MooncakeCluster:
        master_port, metrics_port, node_port = _free_port(), _free_port(), _free_port()
        self.master = f"127.0.0.1:{master_port}"
        try:
            self._spawn("master", [str(binary("mooncake_master", self.venv)), *master_args(master_port, metrics_port)])
            self._wait(master_port, "mooncake_master")
            self._spawn("store-node", [str(binary("mooncake_client", self.venv)),
                                       *store_node_args(self.master, node_port, self.segment_bytes, self.buffer_bytes)])
            self._wait(node_port, "mooncake_client")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _spawn(self, name: str, cmd: list[str]) -> None:
        out = subprocess.DEVNULL
        if self.log_dir:
            out = open(self.log_dir / f"mooncake-{name}.log", "wb")  # noqa: SIM115 -- the process writes it until __exit__
            self._logs.append(out)
        self._procs.append(subprocess.Popen(cmd, env=binary_env(prefix=self.venv), stdout=out, stderr=subprocess.STDOUT))

    def _wait(self, port: int, what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not _port_open(port):
            if self._procs[-1].poll() is not None:
                raise RuntimeError(f"{what} exited with {self._procs[-1].returncode} (log dir: {self.log_dir})")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} did not listen on {port} within {timeout_s:.0f}s")
            time.sleep(0.1)

    def __exit__(self, *exc) -> None:
        for proc in reversed(self._procs):
            proc.terminate()
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()
