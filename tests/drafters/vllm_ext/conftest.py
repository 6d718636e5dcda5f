"""Real-vLLM fixtures for the extension's tests (shared servers from tests/vllm_support)."""

from tests.vllm_support.fixtures import (  # noqa: F401
    tiny_model_dir,
    vllm_available,
    vllm_log_dir,
    vllm_ngram_server,
    vllm_plain_server,
)
