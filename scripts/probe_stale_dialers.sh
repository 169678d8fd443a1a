#!/bin/bash
# After a restart, does any process still redial the dead instance's address?
#
#   scripts/probe_stale_dialers.sh [CODE_DIR]     (needs strace; CODE_DIR: a checkout, default this one)
#
# Starts examples/local.toml for a long run, kills its rollout host (SIGKILL) once the trainer
# has taken a step, waits for the restart, then counts with strace, for 5 s in each of the run's
# processes and the driver, the connect() calls and those that found nobody (ENOENT for ipc,
# ECONNREFUSED for tcp): a cached nng dialer to a dead address redials it every 20-500 ms.
set -u
CODE=$(cd "${1:-$(dirname "$0")/..}" && pwd)
cd "$CODE"
export PYTHONPATH=$CODE
D=$(mktemp -d /tmp/af-probe.XXXX)
python -m asyncflow.cli.main up examples/local.toml --set train.num_steps=20000 --set train.checkpoint_every=20000 \
  --run-dir "$D/run" > "$D/out.log" 2>&1 &
UP=$!
hosts() { ps -eo pid,args | grep "asyncflow.core.host" | grep -- "directory-$UP-" | grep -v grep; }
for _ in $(seq 120); do sleep 1; grep -q step "$D/run/metrics.jsonl" 2>/dev/null && break; done
RPID=$(hosts | grep -- "--name rollout" | head -1 | awk '{print $1}')
echo "killing the rollout host (pid $RPID)"
kill -9 "$RPID"
for _ in $(seq 60); do sleep 1; hosts | grep -- "--name rollout" | grep -vq "^ *$RPID " && break; done
sleep 8
for P in $(hosts | awk '{print $1}') "$UP"; do
  NAME=$(hosts | grep "^ *$P " | sed 's/.*--name \([^ ]*\).*/\1/'); NAME=${NAME:-driver}
  timeout 5 strace -f -e trace=connect -p "$P" -o "$D/strace.$P" > /dev/null 2>&1
  echo "$NAME (pid $P): connect() in 5 s: $(grep -c 'connect(' "$D/strace.$P"), to nobody: $(grep -c 'ENOENT\|ECONNREFUSED' "$D/strace.$P")"
done
kill -TERM "$UP"; wait "$UP"  # (a background job of a script ignores SIGINT)
rm -rf "$D"
