"""testbed.vllm_server.cpu_dtype: bf16 only where the CPU computes it natively."""

from __future__ import annotations

from testbed.vllm_server import cpu_dtype, cpu_has_native_bf16


def test_native_bf16_is_read_from_the_cpu_flags():
    assert cpu_has_native_bf16("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n")
    assert cpu_has_native_bf16("flags\t: fpu amx_bf16 amx_tile\n")
    assert not cpu_has_native_bf16("flags\t: fpu sse avx2 fma\n")  # an AVX2-only Zen 3
    assert not cpu_has_native_bf16("")


def test_an_explicit_dtype_is_kept_and_auto_picks_one_of_two():
    assert cpu_dtype("bfloat16") == "bfloat16"
    assert cpu_dtype("float32") == "float32"
    assert cpu_dtype() in ("bfloat16", "float32")
    assert cpu_dtype() == ("bfloat16" if cpu_has_native_bf16() else "float32")
