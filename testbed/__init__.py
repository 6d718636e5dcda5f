"""What the tests and the benchmarks both start and measure.

`tests/` and `bench/` import from here, never from each other (tests/test_architecture.py):
the vLLM CPU environment and server launcher (`vllm_env`, `vllm_server`), the generated tiny
models (`models`), child processes that die with their parent (`procs`), the fake OpenAI
backend (`fake_openai`), load phases (`phases`), percentiles under one convention (`stats`),
the shared report formatting (`report`), and the lock around generated artefacts (`cache`).
Nothing here imports the gateway, the controller or the CLI: the harness must not depend on
what it measures.
"""
