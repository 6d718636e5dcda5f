#!/usr/bin/env bash
# GPU check for the specgate vLLM extension (issue 4), prepared for an H200 with vLLM 0.33.x.
#
# Serves a target + DSpark drafter WITH adaptive verification (V2 model runner,
# CUDA graphs) and the specgate plugin, then sweeps per-request knobs with
# bench/device/ext_check_client.py: max_draft 0/2/4/8 and min_confidence
# 0/0.3/0.6 next to stock, printing drafted tokens/step, acceptance, AL,
# throughput (and its ratio vs stock) and greedy equality vs max_draft=0.
#
# Usage (from the repo root, on the GPU machine):
#   bench/device/ext_check.sh                      # tiny random target + drafter (mechanics only)
#   TARGET=/models/Qwen3-8B DRAFTER=/models/qwen3-8b-dspark bench/device/ext_check.sh   # real numbers
# Env: PYTHON (default python3, must have vllm 0.33.x + torch CUDA), PORT (8123), K (8),
#      PROMPTS (64), MAX_TOKENS (128), CONCURRENCY (16), BOOT_TIMEOUT (900 s).
# Nothing is downloaded: the machine has no network. Without TARGET/DRAFTER the
# script builds the tiny random Qwen3 (testbed/models.py) and a
# tiny DSpark drafter with the real `speculators` package
# (tests/drafters/vllm_ext/tiny_dspark.py; needs speculators 0.9 installed) --
# random weights mean ~0 acceptance, so that run checks mechanics (caps, the
# confidence floor under real adaptive verification, losslessness), not speed.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
PORT=${PORT:-8123}
K=${K:-8}
OUT=${OUT:-/tmp/specgate-ext-check}
mkdir -p "$OUT"
say() { printf '[ext_check] %s\n' "$*"; }

"$PY" - <<'PYEOF'
import importlib.metadata as md, sys
v = md.version("vllm")
import torch
print(f"[ext_check] vllm {v} | torch {torch.__version__} | cuda {torch.cuda.is_available()} "
      f"{torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''}")
if not v.startswith("0.33."):
    sys.exit(f"[ext_check] the plugin is verified for vllm 0.33.x on GPUs, found {v}")
if not torch.cuda.is_available():
    sys.exit("[ext_check] no CUDA device")
PYEOF

# The plugin is loaded through the `vllm.general_plugins` entry point: install specgate (no deps).
if ! "$PY" -c 'import importlib.metadata as m, sys; sys.exit(0 if any(e.value == "drafters.vllm_ext:register" for e in m.entry_points(group="vllm.general_plugins")) else 1)'; then
  say "installing specgate (editable, no deps, offline) for the vllm.general_plugins entry point"
  if ! "$PY" -m pip install -q --no-deps --no-build-isolation -e . ; then
    # No network on the device and maybe no setuptools: register the entry point by hand
    # (a .pth pointing at this checkout + a minimal dist-info carrying entry_points.txt).
    say "pip could not install it offline; writing a minimal dist-info instead"
    "$PY" - "$(pwd)" <<'PYEOF'
import os, sys, sysconfig
repo, site = sys.argv[1], sysconfig.get_paths()["purelib"]
info = os.path.join(site, "specgate_ext_check-0.0.0.dist-info")
os.makedirs(info, exist_ok=True)
open(os.path.join(info, "METADATA"), "w").write("Metadata-Version: 2.1\nName: specgate-ext-check\nVersion: 0.0.0\n")
open(os.path.join(info, "entry_points.txt"), "w").write("[vllm.general_plugins]\nspecgate = drafters.vllm_ext:register\n")
open(os.path.join(info, "RECORD"), "w").write("")
open(os.path.join(site, "specgate_ext_check.pth"), "w").write(repo + "\n")
print("[ext_check] entry point registered via", info)
PYEOF
  fi
fi

if [ -z "${TARGET:-}" ] || [ -z "${DRAFTER:-}" ]; then
  TARGET=$OUT/tiny-qwen3
  DRAFTER=$OUT/tiny-dspark
  say "no TARGET/DRAFTER given: building tiny random models in $OUT (mechanics check only)"
  HF_HUB_OFFLINE=1 "$PY" testbed/models.py "$TARGET"
  HF_HUB_OFFLINE=1 "$PY" tests/drafters/vllm_ext/tiny_dspark.py "$TARGET" "$DRAFTER"
  K=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["block_size"])' "$DRAFTER/config.json")
fi

SPEC=$(printf '{"method":"dspark","model":"%s","num_speculative_tokens":%s,"enable_adaptive_verification":true}' "$DRAFTER" "$K")
LOG=$OUT/vllm-serve.log
say "serving $TARGET with $SPEC (log: $LOG)"
# No --enforce-eager: adaptive verification needs full CUDA graphs.
VLLM_USE_V2_MODEL_RUNNER=1 HF_HUB_OFFLINE=1 "$PY" -m vllm.entrypoints.openai.api_server \
  --model "$TARGET" --served-model-name target --host 127.0.0.1 --port "$PORT" \
  --speculative-config "$SPEC" --per-request-spec-decode-metrics summary \
  --max-num-seqs 64 --seed 0 --disable-uvicorn-access-log >"$LOG" 2>&1 &
SERVER=$!
cleanup() { kill "$SERVER" 2>/dev/null || true; sleep 3; kill -9 "$SERVER" 2>/dev/null || true; }
trap cleanup EXIT

deadline=$(( $(date +%s) + ${BOOT_TIMEOUT:-900} ))
until curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1; do
  if ! kill -0 "$SERVER" 2>/dev/null; then say "server died during boot:"; tail -n 60 "$LOG"; exit 1; fi
  if [ "$(date +%s)" -gt "$deadline" ]; then say "server not ready in time:"; tail -n 60 "$LOG"; exit 1; fi
  sleep 2
done
say "ready; plugin lines from the server log:"
grep -h "specgate" "$LOG" | sed 's/^/  /' | head -n 12 || true

set +e
"$PY" bench/device/ext_check_client.py --base "http://127.0.0.1:$PORT" --model target \
  --prompts "${PROMPTS:-64}" --max-tokens "${MAX_TOKENS:-128}" --concurrency "${CONCURRENCY:-16}" \
  --caps 0,2,4,8 --thresholds 0,0.3,0.6
rc=$?
set -e
say "vLLM spec counters after the sweep:"
curl -s "http://127.0.0.1:$PORT/metrics" | grep -E '^vllm:spec_decode_num_(drafts|draft_tokens|accepted_tokens)_total' | sed 's/^/  /' || true
grep -h "Traceback\|ERROR" "$LOG" | head -n 5 | sed 's/^/  server: /' || true
exit $rc
