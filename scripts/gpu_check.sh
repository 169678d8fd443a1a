#!/usr/bin/env bash
# The GPU check: on a fresh machine with one CUDA GPU and PyPI, in under
# 8 minutes, install what the vLLM path needs and check it, then print one summary
# line per check (PASS/FAIL and its figure), whatever failed on the way.
#   1. install: a venv with vllm (pinned: the release the adapter is written for) and
#      this checkout (pip install -e .), plus pytest
#   2. gpu-tests: pytest -m gpu (the vLLM adapter: log-probs against training, weights
#      over CUDA IPC and collective_rpc, a multi-turn continuation, a swap mid-generation)
#   3. bench-rollout: afctl bench rollout --device cuda --against vllm --vllm-eager (native vs
#      vLLM tok/s, both eager: vLLM's torch.compile and CUDA graph capture would not fit the budget)
#   4. up: afctl up examples/gpu.toml for 20 steps on this one GPU (the tiny model and the
#      built-in task in place of the example's model and data, rollout and trainer sharing GPU 0)
# Each step has its own time limit, cut further to what is left of the whole budget.
# Usage: scripts/gpu_check.sh [--no-venv] [--skip-install] [--work DIR] [--budget SECONDS]
#   --no-venv: install into (and run with) the python on PATH
#   --skip-install: install nothing; run the checks with the python on PATH (a rerun)
# Exit status: 0 when every check passed, 1 otherwise.
set -u

VLLM_VERSION="0.33.0"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV=1; INSTALL=1; BUDGET_S=450; WORK=""
while [ $# -gt 0 ]; do
  case "$1" in
    --no-venv) VENV=0 ;;
    --skip-install) INSTALL=0; VENV=0 ;;
    --work) WORK="$2"; shift ;;
    --budget) BUDGET_S="$2"; shift ;;
    *) echo "usage: $0 [--no-venv] [--skip-install] [--work DIR] [--budget SECONDS]" >&2; exit 2 ;;
  esac; shift
done
[ -n "$WORK" ] || WORK="$(mktemp -d /tmp/gpu-check-XXXXXX)"
mkdir -p "$WORK"
START_S=$(date +%s)
DEADLINE_S=$((START_S + BUDGET_S))
SUMMARY=()
FAILED=0

note() { echo "[$(( $(date +%s) - START_S ))s] $*"; }
record() {  # record PASS|FAIL NAME FIGURE
  SUMMARY+=("$(printf '%-4s  %-13s %s' "$1" "$2" "$3")")
  [ "$1" = PASS ] || FAILED=1
}
print_summary() {
  echo
  echo "== gpu_check summary ($(( $(date +%s) - START_S ))s of a ${BUDGET_S}s budget; logs: $WORK) =="
  for line in "${SUMMARY[@]}"; do echo "$line"; done
}
trap print_summary EXIT
trap 'record FAIL interrupted "by a signal"; exit 1' INT TERM

limit() {  # limit CAP RESERVE: seconds for a step, at most CAP, leaving RESERVE for the steps after it
  local left=$((DEADLINE_S - $(date +%s) - $2))
  [ "$left" -lt "$1" ] && echo "$left" || echo "$1"
}
run_step() {  # run_step NAME CAP RESERVE CMD...: runs CMD under a timeout, output to $WORK/NAME.log
  local name="$1" cap="$2" reserve="$3"; shift 3
  local t; t=$(limit "$cap" "$reserve")
  if [ "$t" -lt 10 ]; then
    echo "no time left (budget ${BUDGET_S}s)" >"$WORK/$name.log"
    return 124
  fi
  note "$name: up to ${t}s: $*"
  timeout --kill-after=15 "$t" "$@" >"$WORK/$name.log" 2>&1
}
why() {  # the last lines of a step's log, for the summary line
  tail -n 3 "$WORK/$1.log" 2>/dev/null | tr '\n' ' ' | cut -c1-200
}

# -- 0. the GPU ---------------------------------------------------------------------------
if command -v nvidia-smi >/dev/null 2>&1; then
  GPU="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
else
  GPU="no nvidia-smi"
fi
note "GPU: $GPU"

# -- 1. install ---------------------------------------------------------------------------
install() {
  if [ "$VENV" = 1 ]; then
    python3 -m venv "$WORK/venv" || return 1
    PIP=("$WORK/venv/bin/python" -m pip)
  else
    PIP=(python3 -m pip)
  fi
  "${PIP[@]}" install -q --upgrade pip &&
    "${PIP[@]}" install -q "vllm==$VLLM_VERSION" &&
    (cd "$ROOT" && "${PIP[@]}" install -q -e . "pytest>=8" "pytest-timeout>=2.3")
}
if [ "$VENV" = 1 ]; then PY="$WORK/venv/bin/python"; AFCTL="$WORK/venv/bin/afctl"; else PY="python3"; AFCTL="afctl"; fi
export -f install; export VENV WORK VLLM_VERSION ROOT
if [ "$INSTALL" = 0 ]; then
  if found="$(python3 -c 'import vllm; print("vllm", vllm.__version__)' 2>&1)"; then
    record PASS install "skipped (--skip-install): $found"; INSTALLED=1
  else
    record FAIL install "skipped (--skip-install), and no vllm here: $(echo "$found" | tail -n 1)"; INSTALLED=0
  fi
elif run_step install 300 170 bash -c install \
  && "$PY" -c "import torch, vllm; assert torch.cuda.is_available(), 'torch sees no CUDA GPU'" >>"$WORK/install.log" 2>&1; then
  record PASS install "vllm $("$PY" -c 'import vllm; print(vllm.__version__)' 2>/dev/null), torch $("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)' 2>/dev/null), $GPU"
  INSTALLED=1
else
  record FAIL install "$(why install)"
  INSTALLED=0
fi

cd "$ROOT" || exit 1
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"  # this checkout, whatever pip did
export VLLM_CONFIGURE_LOGGING=0

# -- 2. the gpu-marked tests -----------------------------------------------------------------
if [ "$INSTALLED" = 1 ]; then
  run_step gpu-tests 170 150 "$PY" -m pytest -q -p no:cacheprovider -m gpu --basetemp="$WORK/pytest" tests/engines tests/runs/test_weight_collective.py
  rc=$?
  line="$(grep -E '[0-9]+ (passed|failed|error)' "$WORK/gpu-tests.log" | tail -n 1)"
  if [ $rc = 0 ]; then record PASS gpu-tests "$line"; else record FAIL gpu-tests "rc $rc: ${line:-$(why gpu-tests)}"; fi
else
  record FAIL gpu-tests "not run: install failed"
fi

# -- 3. native vs vLLM rollout --------------------------------------------------------------
if [ "$INSTALLED" = 1 ]; then
  run_step bench-rollout 80 110 "$AFCTL" bench rollout --device cuda --against vllm --vllm-eager --repeats 2 --json
  rc=$?
  fig="$("$PY" - "$WORK/bench-rollout.log" <<'EOF' 2>/dev/null
import json, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
print(f"native {r['tokens_per_s']:.0f} tok/s vs {r['baseline']} {r['baseline_tokens_per_s']:.0f} tok/s: native/vllm {r['ratio']:.2f} "
      f"({r['num_prompts']} prompts, {r['max_new_tokens']} new tokens, tiny model)")
EOF
)"
  if [ $rc = 0 ] && [ -n "$fig" ]; then record PASS bench-rollout "$fig"; else record FAIL bench-rollout "rc $rc: $(why bench-rollout)"; fi
else
  record FAIL bench-rollout "not run: install failed"
fi

# -- 4. a 20-step run of examples/gpu.toml on this one GPU -----------------------------------
if [ "$INSTALLED" = 1 ]; then
  RUN="$WORK/run-gpu"
  run_step up 150 0 "$AFCTL" up examples/gpu.toml --run-dir "$RUN" \
    --set 'model.path=""' --set model.tiny_warm_start=false \
    --set 'data.path=""' --set data.num_prompts=512 --set data.chat_template=false \
    --set 'reward.functions=["asyncflow.toy.tasks:reward"]' --set reward.num_workers=1 \
    --set train.num_steps=20 --set train.prompts_per_step=8 --set train.checkpoint_every=0 \
    --set 'train.engine.dtype="float32"' --set train.engine.lr=1e-4 --set train.engine.gradient_checkpointing=false \
    --set rollout.prompts_per_call=8 --set rollout.sampling.max_new_tokens=16 \
    --set 'rollout.engine.dtype="float32"' --set rollout.engine.kv_cache_fraction=0.25 \
    --set rollout.engine.max_batch_size=64 --set rollout.engine.enforce_eager=true \
    --set 'train.devices=[0]' --set 'reference.devices=[0]'
  rc=$?
  fig="$("$PY" - "$RUN/summary.json" <<'EOF' 2>/dev/null
import json, sys
s = json.load(open(sys.argv[1]))
print(f"{s['steps']} steps in {s['wall_s']:.0f}s, {s['samples_per_s']:.1f} samples/s, reward first 10% "
      f"{s['reward_first_10pct']:.3f} -> last 10% {s['reward_last_10pct']:.3f}, staleness max {s['staleness_max']}")
EOF
)"
  steps="$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['steps'])" "$RUN/summary.json" 2>/dev/null)"
  if [ $rc = 0 ] && [ "$steps" = 20 ]; then record PASS up "$fig"; else record FAIL up "rc $rc, steps ${steps:-?}: ${fig:-$(why up)}"; fi
else
  record FAIL up "not run: install failed"
fi

exit $FAILED
