"""Real-vLLM fixtures for the capture tests (tests/vllm_support)."""

from tests.vllm_support.fixtures import tiny_model_dir, vllm_available, vllm_log_dir  # noqa: F401
