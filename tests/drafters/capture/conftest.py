"""Real-vLLM fixtures for the capture tests (tests/vllm_support), and a real
Mooncake Store (master + store node from .venv-vllm's wheel) per module."""

from tests.vllm_support.fixtures import tiny_model_dir, vllm_available, vllm_log_dir  # noqa: F401
from tests.vllm_support.mooncake_fixtures import mooncake_cluster, mooncake_store_spec  # noqa: F401
