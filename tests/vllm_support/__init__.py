"""Support for the real-vLLM test tier (vLLM's CPU build serving a tiny random Qwen3).

- `env`        : where .venv-vllm is (scripts/setup_vllm_env.sh builds it) and why it may be unusable
- `tiny_model` : script (run inside .venv-vllm) generating the tiny Qwen3 + BPE tokenizer + chat template
- `launcher`   : `VllmServer` / `VllmServerSpec`: start `python -m vllm.entrypoints.openai.api_server`
                 on a free loopback port with extra args/env, wait for readiness, kill the process tree
- `fixtures`   : pytest fixtures (session-scoped servers with and without ngram speculation)

Nothing here imports torch or vllm: the test process runs in the gateway's .venv,
vLLM runs as a subprocess in .venv-vllm. See docs/testing.md.
"""
