#!/usr/bin/env bash
# The native engines on one CUDA GPU, on a machine without PyPI (no vLLM: scripts/gpu_check.sh
# is the check of the vLLM path, on a machine that can install it). Each step has its own
# time limit; one summary line per step (PASS/FAIL and its figures), whatever failed.
#
#   scripts/cuda_check.sh unit [OUT]    ~8 min: the gpu tests of the native engines at real size
#                                       (tests/engines/test_cuda_native.py), the decode step eager vs
#                                       compiled at 8, 64 and 256 rows (bench decode), native vs HF
#                                       generate on SmolLM2-135M's shapes (random weights), the weight
#                                       hand-off on a shared GPU (bench weights: nng vs CUDA IPC), the
#                                       trainer's FLOP/s (bench train --config), a 3-step run
#   scripts/cuda_check.sh real [OUT]    ~7 min: SmolLM2-135M-Instruct itself (the GGUF file put
#                                       together from .gpu/smollm2.gguf.part*), examples/smollm2.toml
#                                       on the GPU: TRL's default and fastest paths, sync and async side by side (one quiet
#                                       invocation), then more seeds of each at once
#
# Wheels of the packages the machine lacks (pykka, pynng, msgspec, gguf, trl, datasets, ...)
# in .whl/ are installed into /tmp/site first; the config and tokenizer of SmolLM2 in
# .gpu/smollm2-config/ give the random model its shapes. Figures and logs go to OUT
# (default /tmp/cuda-check): summary.txt, figures.jsonl, logs.tar.gz. docs/cuda.md
# (scripts/cuda_page.py) renders the figures kept in docs/data/cuda_check/.
#
# More seeds set both ``seed`` (TRL's) and ``rollout.engine.seed`` (asyncflow's sampler: the
# global seed does not reach it, docs/config.md); ``data.seed`` stays, so the held-out
# prompts are the same. A machine that takes at most 64 MiB per transfer gets the 98 MB
# GGUF file in two transfers (split -b 50000000 -d -a 1 FILE .gpu/smollm2.gguf.part):
# each copied to /tmp/gguf as it lands, then back into .gpu/ before the `real` phase.
set -u
PHASE="${1:-unit}"
OUT_DIR="${2:-/tmp/cuda-check}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK=/tmp/cuda-work
mkdir -p "$OUT_DIR" "$WORK"
START_S=$(date +%s)
SUMMARY="$OUT_DIR/summary.txt"
FIG="$OUT_DIR/figures.jsonl"
export ASYNCFLOW_CUDA_FIGURES="$FIG"
: >"$SUMMARY"
note() { echo "[$(($(date +%s) - START_S))s] $*"; }
record() { printf '%-4s  %-16s %s\n' "$1" "$2" "$3" | tee -a "$SUMMARY"; }
step() {  # step NAME SECONDS CMD...: output to $WORK/NAME.log
  local name="$1" t="$2"; shift 2
  note "$name (up to ${t}s): $*"
  timeout --kill-after=10 "$t" "$@" >"$WORK/$name.log" 2>&1
}
tailof() { tr '\r' '\n' <"$WORK/$1.log" 2>/dev/null | grep -v -e '^Loading weights' -e '^Writing model shards' | tail -n 4 | tr '\n' ' ' | cut -c1-300; }
finish() {
  (cd "$WORK" && tar czf "$OUT_DIR/logs.tar.gz" --exclude='*.safetensors' --exclude='*.gguf' --exclude='*.bin' \
    --exclude='*.pt' --exclude='checkpoints' --exclude='model' --exclude='final' ./*.log runs 2>/dev/null)
  echo "== cuda_check $PHASE: $(($(date +%s) - START_S))s =="
  cat "$SUMMARY"
}
trap finish EXIT

cd "$ROOT" || exit 1
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.done || record FAIL install "pip --target /tmp/site failed"
fi
export PYTHONPATH="$ROOT:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PY=python3
AF=("$PY" -m asyncflow.cli.main)
GPU="$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1)"
VERS="$("$PY" -c 'import torch, transformers, sys; print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}, cuda {torch.cuda.is_available()}")' 2>&1 | tail -n 1)"
record INFO machine "$GPU; $VERS; $(nproc) cpus"

# the example on the GPU: every role's engine on cuda 0 (the rollout keeps a fifth of the free memory
# for its KV cache), bfloat16 generation beside the trainer's bfloat16 autocast ("auto" on a GPU)
CUDA_SET=(--set cluster.device=cuda --set rollout.engine.device=cuda --set train.engine.device=cuda
  --set 'rollout.devices=[0]' --set 'train.devices=[0]' --set 'reference.devices=[0]'
  --set rollout.engine.kv_cache_fraction=0.05 --set 'rollout.engine.dtype="bfloat16"')

summary_of() {  # summary_of RUN_DIR: one line from summary.json
  "$PY" - "$1" <<'EOF' 2>/dev/null
import json, sys
s = json.load(open(sys.argv[1] + "/summary.json"))
keys = ("steps", "wall_s", "samples_per_s", "reward_first_10pct", "reward_last_10pct", "staleness_max")
parts = [f"{k}={s[k]:.3f}" if isinstance(s.get(k), float) else f"{k}={s.get(k)}" for k in keys]
for k, v in s.items():
    if k.startswith("val") or "heldout" in k or "accuracy" in k:
        parts.append(f"{k}={v}")
print(" ".join(parts))
EOF
}

if [ "$PHASE" = unit ]; then
  step tests 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu -s --timeout 300 tests/engines/test_cuda_native.py
  rc=$?
  line="$(grep -E '[0-9]+ (passed|failed|error)' "$WORK/tests.log" | tail -n 1)"
  [ $rc = 0 ] && record PASS tests "$line" || record FAIL tests "rc $rc: ${line:-$(tailof tests)}"
  grep -h ' = ' "$WORK/tests.log" | grep -E '^cuda_' | while read -r l; do record INFO tests "$l"; done

  if step random-model 40 "$PY" scripts/random_like.py .gpu/smollm2-config "$WORK/smol-random"; then
    record PASS random-model "$(tailof random-model)"
  else
    record FAIL random-model "$(tailof random-model)"
  fi
  # the decode step eager vs compiled (torch.compile, reduce-overhead: CUDA graphs), one graph per rows bucket
  step decode-compile 150 "${AF[@]}" bench decode --device cuda --model "$WORK/smol-random" --dtype bfloat16 \
    --rows 8,64,256 --context 80 --steps 20 --json
  rc=$?
  fig="$(tail -n 1 "$WORK/decode-compile.log")"
  if [ $rc = 0 ] && [ "${fig:0:1}" = "{" ]; then
    echo "{\"bench_decode_bfloat16\": $fig}" >>"$FIG"
    record PASS decode-compile "$(grep -E '^rows [0-9]+:' "$WORK/decode-compile.log" | cut -c1-110 | tr '\n' ';')"
  else
    record FAIL decode-compile "rc $rc: $(tailof decode-compile)"
  fi
  for dtype in bfloat16; do
    step "bench-rollout-$dtype" 60 "${AF[@]}" bench rollout --device cuda --model "$WORK/smol-random" --dtype "$dtype" \
      --num-prompts 64 --batch-size 64 --samples-per-prompt 8 --max-new-tokens 64 --repeats 1 --json
    rc=$?
    fig="$(tail -n 1 "$WORK/bench-rollout-$dtype.log")"
    if [ $rc = 0 ] && [ "${fig:0:1}" = "{" ]; then
      echo "{\"bench_rollout_$dtype\": $fig}" >>"$FIG"
      record PASS "rollout-$dtype" "$(echo "$fig" | cut -c1-300)"
    else
      record FAIL "rollout-$dtype" "rc $rc: $(tailof "bench-rollout-$dtype")"
    fi
  done
  # weight hand-off on a shared GPU: nng chunks (host-staged) against the local transport (CUDA IPC)
  step weights-local 90 "${AF[@]}" bench weights --device cuda --mb 540 --tensor-mb 2 --repeats 3 \
    --transports nng,local --json
  rc=$?
  fig="$(tail -n 1 "$WORK/weights-local.log")"
  if [ $rc = 0 ] && [ "${fig:0:1}" = "{" ]; then
    echo "{\"bench_weights_cuda\": $fig}" >>"$FIG"
    record PASS weights-local "$(echo "$fig" | cut -c1-300)"
  else
    record FAIL weights-local "rc $rc: $(tailof weights-local)"
  fi
  step weights-local-tests 90 "$PY" -m pytest -q -p no:cacheprovider -m gpu --timeout 80 tests/runs/test_weight_local.py
  rc=$?
  line="$(grep -E '[0-9]+ (passed|failed|error)' "$WORK/weights-local-tests.log" | tail -n 1)"
  [ $rc = 0 ] && record PASS weights-local-tests "$line" || record FAIL weights-local-tests "rc $rc: ${line:-$(tailof weights-local-tests)}"
  # the trainer's FLOP/s on the example's step shape against a bfloat16 matmul's, measured on the spot
  step train-flops 120 "${AF[@]}" bench train --config examples/smollm2.toml --model "$WORK/smol-random" "${CUDA_SET[@]}" --json
  rc=$?
  fig="$(tail -n 1 "$WORK/train-flops.log")"
  if [ $rc = 0 ] && [ "${fig:0:1}" = "{" ]; then
    echo "{\"bench_train_cuda\": $fig}" >>"$FIG"
    record PASS train-flops "$(echo "$fig" | cut -c1-300)"
  else
    record FAIL train-flops "rc $rc: $(tailof train-flops)"
  fi
  RUN="$WORK/runs/smoke-async"
  step up-smoke 100 "${AF[@]}" up examples/smollm2.toml --run-dir "$RUN" "${CUDA_SET[@]}" \
    --set "model.path=\"$WORK/smol-random\"" --set train.num_steps=3 --set eval.every_steps=0 --set eval.at_start=false --set train.checkpoint_every=3
  rc=$?
  s="$(summary_of "$RUN")"
  [ $rc = 0 ] && [ -n "$s" ] && record PASS up-smoke "$s" || record FAIL up-smoke "rc $rc: ${s:-$(tailof up-smoke)}"
  exit 0
fi

# -- real: SmolLM2-135M-Instruct --------------------------------------------------------------
if ! ls .gpu/smollm2.gguf.part* >/dev/null 2>&1; then
  record FAIL gguf "no .gpu/smollm2.gguf.part* here"
  exit 1
fi
GGUF="$WORK/smollm2.gguf"
cat .gpu/smollm2.gguf.part* >"$GGUF"
SUM="$(sha256sum "$GGUF" | cut -c1-16)"
WANT="$(cat .gpu/smollm2.gguf.sha256 2>/dev/null | cut -c1-16)"
[ "$SUM" = "$WANT" ] && record PASS gguf "sha256 $SUM ($(stat -c %s "$GGUF") bytes)" || { record FAIL gguf "sha256 $SUM, want $WANT: parts missing"; exit 1; }
MODEL="$ROOT/models/smollm2-135m"
rm -rf "$MODEL"
step import 90 "${AF[@]}" model import-gguf "$GGUF" "$MODEL" && record PASS import "$(tailof import)" || { record FAIL import "$(tailof import)"; exit 1; }

# one quiet invocation: TRL, sync, async on the GPU, seed 0 (samples/s and held-out accuracy)
step peer-seed0 260 "${AF[@]}" bench peer --config examples/smollm2.toml --steps 10 --trl-threads 4 --trl-path default --trl-path fast --json \
  --out "$WORK/runs/peer0" "${CUDA_SET[@]}"
rc=$?
fig="$(tail -n 1 "$WORK/peer-seed0.log")"
if [ $rc = 0 ] && [ "${fig:0:1}" = "{" ]; then
  echo "{\"peer_seed0\": $fig}" >>"$FIG"
  record PASS peer-seed0 "$(echo "$fig" | cut -c1-600)"
else
  record FAIL peer-seed0 "rc $rc: $(tailof peer-seed0)"
fi

# more seeds, all at once (accuracy only: their samples/s share the GPU and the cores)
left=$((400 - ($(date +%s) - START_S)))
if [ "$left" -gt 90 ]; then
  pids=()
  for seed in 1 2 3 4; do
    step "peer-seed$seed" "$left" "${AF[@]}" bench peer --config examples/smollm2.toml --steps 10 --trl-threads 2 --json \
      --out "$WORK/runs/peer$seed" --set "seed=$seed" --set "rollout.engine.seed=$seed" "${CUDA_SET[@]}" &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}"
    rc=$?
    seed=$((i + 1))
    fig="$(tail -n 1 "$WORK/peer-seed$seed.log")"
    if [ $rc = 0 ] && [ "${fig:0:1}" = "{" ]; then
      echo "{\"peer_seed$seed\": $fig}" >>"$FIG"
      record PASS "peer-seed$seed" "$(echo "$fig" | cut -c1-400)"
    else
      record FAIL "peer-seed$seed" "rc $rc: $(tailof "peer-seed$seed")"
    fi
  done
else
  record FAIL more-seeds "not run: ${left}s left"
fi
