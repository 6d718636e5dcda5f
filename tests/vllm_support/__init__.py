"""pytest fixtures for the real-vLLM test tier (vLLM's CPU build serving a tiny random Qwen3).

- `fixtures`          : session-scoped servers with and without ngram speculation, shared per
                        engine configuration (`shared_server`)
- `mooncake_fixtures` : a Mooncake Store master + store node for the capture tests
- `mooncake_worker`   : the child that writes/reads samples across processes

What starts and measures things lives in `testbed/` (shared with bench/): where .venv-vllm is
(`testbed.vllm_env`), the model generators (`testbed.models`), the server launcher
(`testbed.vllm_server`). Nothing here imports torch or vllm: the test process runs in the
gateway's .venv, vLLM runs as a subprocess in .venv-vllm. See docs/testing.md.
"""
