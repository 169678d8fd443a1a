#!/usr/bin/env bash
# A newcomer's first hour, as a script: each step prints one line, and the
# script stops with a non-zero exit at the first step that fails.
#   1. the README's first command, in a clean venv (pip install torch==2.13.0 -e '.[dev]';
#      --no-venv: reuse this environment), with train.num_steps small
#   2. loading the printed model with transformers, generating through its chat template
#   3. a run on a model directory and JSONL of your own (examples/your_model/make_example.py)
#   4. one bad input per error class: each must exit non-zero with one `Error:` line
#      (data problems among them, named by their line before any process starts)
#   5. the samples the run wrote are readable: RUN_DIR/samples.jsonl
#   6. a LoRA run: the model its last line names is the trained one, not the base
# Usage: scripts/newcomer.sh [--no-venv] [--steps N] [--work DIR]
set -u
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV=1; STEPS=3; WORK="$(mktemp -d /tmp/newcomer-XXXXXX)"
while [ $# -gt 0 ]; do
  case "$1" in
    --no-venv) VENV=0 ;;
    --steps) STEPS="$2"; shift ;;
    --work) WORK="$2"; shift ;;
    *) echo "usage: $0 [--no-venv] [--steps N] [--work DIR]" >&2; exit 2 ;;
  esac; shift
done
mkdir -p "$WORK"
LOG="$WORK/log"; : > "$LOG"
fail() { echo "FAIL  $1 (output: $LOG)"; tail -n 20 "$LOG" | sed 's/^/      /'; exit 1; }
ok() { echo "ok    $1"; }

if [ "$VENV" = 1 ]; then
  python3 -m venv "$WORK/venv" >>"$LOG" 2>&1 || fail "1. make a clean venv"
  (cd "$ROOT" && "$WORK/venv/bin/pip" install -q torch==2.13.0 -e '.[dev]') >>"$LOG" 2>&1 || fail "1. pip install torch==2.13.0 -e '.[dev]'"
  PY="$WORK/venv/bin/python"; AFCTL=("$WORK/venv/bin/afctl")
else
  PY="$(command -v python)"; export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
  AFCTL=("$PY" -m asyncflow.cli.main)
fi
cd "$WORK"

# 1. the README's first command: afctl up examples/local.toml (fewer steps)
"${AFCTL[@]}" up "$ROOT/examples/local.toml" --run-dir "$WORK/first" --set "train.num_steps=$STEPS" >"$WORK/first.out" 2>>"$LOG" \
  || { cat "$WORK/first.out" >>"$LOG"; fail "1. afctl up examples/local.toml --set train.num_steps=$STEPS"; }
MODEL="$(sed -n 's/^model: \([^ ]*\).*/\1/p' "$WORK/first.out")"
[ -n "$MODEL" ] && [ -f "$MODEL/config.json" ] || fail "1. the run printed no loadable model directory"
ok "1. afctl up examples/local.toml ($STEPS steps): $(grep '^done:' "$WORK/first.out" | cut -c1-60)..."

# 2. the printed model loads in transformers and answers through its chat template
"$PY" - "$MODEL" >"$WORK/answer.out" 2>>"$LOG" <<'PYEOF' || fail "2. load $MODEL with transformers"
import sys
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
tok, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
ids = tok.apply_chat_template([{"role": "user", "content": "3+4="}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
print(repr(tok.decode(model.generate(**ids, max_new_tokens=4, do_sample=False)[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)))
PYEOF
ok "2. transformers loads $MODEL; '3+4=' through the chat template -> $(tail -n1 "$WORK/answer.out")"

# 3. a model directory and JSONL of your own
"$PY" "$ROOT/examples/your_model/make_example.py" "$WORK/mine" >>"$LOG" 2>&1 || fail "3. write the example model and data"
"${AFCTL[@]}" up "$WORK/mine/run.toml" --run-dir "$WORK/mine-run" >"$WORK/mine.out" 2>>"$LOG" \
  || { cat "$WORK/mine.out" >>"$LOG"; fail "3. afctl up on your own model and JSONL"; }
ok "3. your own Llama + JSONL + reward: $(grep '^done:' "$WORK/mine.out" | cut -c1-60)..."

# 4. one bad input per error class: non-zero exit and one `Error:` line each
bad() {  # NAME EXPECTED-TEXT SETUP-COMMAND AFCTL-ARGS...
  local name="$1" expect="$2" setup="$3"; shift 3
  rm -rf "$WORK/bad"; "$PY" "$ROOT/examples/your_model/make_example.py" "$WORK/bad" >/dev/null 2>>"$LOG" || fail "4. $name: setup"
  eval "$setup"
  "${AFCTL[@]}" up "$WORK/bad/run.toml" --run-dir "$WORK/bad-run" "$@" >"$WORK/bad.out" 2>"$WORK/bad.err"
  local rc=$? line
  cat "$WORK/bad.out" "$WORK/bad.err" >>"$LOG"
  line="$(grep -m1 '^Error:' "$WORK/bad.err")"
  [ "$rc" -ne 0 ] || fail "4. $name: exited 0"
  [ "$(grep -c '^Error:' "$WORK/bad.err")" = 1 ] && [[ "$line" == *"$expect"* ]] || fail "4. $name: no one-line error with '$expect'"
  ok "4. $name -> ${line:0:150}"
}
bad "reward not importable" "cluster.python_path" ":" --set 'reward.functions=["not_there:score"]'
bad "custom role class" "roles[0].cls" 'printf "\n[[roles]]\nname = \"judge\"\ncls = \"my_reward:NoSuchJudge\"\n" >> "$WORK/bad/run.toml"'
if "$PY" -c "import torch, sys; sys.exit(torch.cuda.is_available())"; then
  bad "cuda without CUDA" "no CUDA device" ":" --set rollout.engine.device=cuda --set cluster.device=cuda
fi
bad "data fields" "'prompt'" "echo '{\"question\": \"1+1\", \"answer\": \"2\"}' > \"\$WORK/bad/data.jsonl\""
bad "no chat template" "data.chat_template" ":" --set data.chat_template=true
bad "value out of range" "out of range" ":" --set rollout.sampling.temperature=-1
bad "--set of a wrong type" "--set train.num_steps=abc" ":" --set train.num_steps=abc
bad "an empty prompt" "line 3 has an empty prompt" "sed -i '3s/.*/{\"prompt\": \"\", \"answer\": \"1\"}/' \"\$WORK/bad/data.jsonl\""
bad "a line that is not JSON" "line 2 is not JSON" "sed -i '2s/.*/{not json/' \"\$WORK/bad/data.jsonl\""
bad "a prompt longer than the model holds" "line 4 (" \
  "\"\$PY\" -c 'import json,sys; p=sys.argv[1]; L=open(p).read().splitlines(); L[3]=json.dumps({\"prompt\": \"1+\" * 400 + \"1\", \"answer\": \"2\"}); open(p,\"w\").write(chr(10).join(L)+chr(10))' \"\$WORK/bad/data.jsonl\""

# 5. what the model writes: RUN_DIR/samples.jsonl (logging.samples_every)
"$PY" - "$WORK/first/samples.jsonl" >"$WORK/samples.out" 2>>"$LOG" <<'PYEOF' || fail "5. RUN_DIR/samples.jsonl"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert rows and all({"step", "prompt", "response", "reward"} <= set(r) for r in rows), rows[:1]
print(f"{len(rows)} samples, e.g. {rows[-1]['prompt'][-20:]!r} -> {rows[-1]['response']!r} (reward {rows[-1]['reward']})")
PYEOF
ok "5. RUN_DIR/samples.jsonl: $(tail -n1 "$WORK/samples.out")"

# 6. LoRA: the checkpoint the last line names holds the trained weights
"${AFCTL[@]}" up "$ROOT/examples/local.toml" --run-dir "$WORK/lora" --set "train.num_steps=$STEPS" --set train.engine.lora.rank=8 \
  --set train.engine.lr=1e-3 --set train.engine.lora.save_merged=true --set "train.checkpoint_every=$STEPS" \
  >"$WORK/lora.out" 2>>"$LOG" || { cat "$WORK/lora.out" >>"$LOG"; fail "6. afctl up with LoRA"; }
MERGED="$(sed -n 's/^model: \([^ ]*\) (LoRA.*/\1/p' "$WORK/lora.out")"
[ -n "$MERGED" ] || fail "6. the LoRA run's last line names no merged model"
"$PY" - "$MERGED" "$WORK/lora/model" >"$WORK/lora-check.out" 2>>"$LOG" <<'PYEOF' || fail "6. the merged model is the base one"
import sys
import torch
from transformers import AutoModelForCausalLM
trained, base = (AutoModelForCausalLM.from_pretrained(p).state_dict() for p in sys.argv[1:3])
moved = [k for k in base if "q_proj.weight" in k and not torch.equal(base[k], trained[k])]
assert moved, "from_pretrained on the printed path gives the base weights"
print(f"{len(moved)} adapted q_proj weights differ from the base")
PYEOF
ok "6. LoRA: $(tail -n1 "$WORK/lora-check.out") ($MERGED)"
echo "all steps passed (work dir $WORK)"
