#!/usr/bin/env bash
# The tiny end-to-end run with [cluster] launcher = "ray" on a throwaway Ray cluster
# on this machine: every process host is placed by Ray and talks over tcp with a secret.
#
#   pip install -e '.[ray]'
#   scripts/ray_local_e2e.sh [NUM_STEPS] [RAY_CPUS]
#
# The Ray cluster is started by tests/ray/_ray_head.py and shut down by it when this
# script exits (no `ray stop`: another Ray on the machine is left alone). Ray's token
# auth gets a fresh token in the environment; nothing is written to ~/.ray.
# The same check as a test: python -m pytest tests/ray -m ray -q
set -euo pipefail

num_steps=${1:-3}
ray_cpus=${2:-4}
repo=$(cd "$(dirname "$0")/.." && pwd)
python -c "import ray" 2>/dev/null || { echo "Ray is missing: pip install -e '$repo[ray]'" >&2; exit 2; }

work=$(mktemp -d -t asyncflow-ray-XXXXXX)
token() { python -c 'import secrets; print(secrets.token_hex(32))'; }
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(token) RAY_USAGE_STATS_ENABLED=0
export ASYNCFLOW_SECRET=${ASYNCFLOW_SECRET:-$(token)}
unset RAY_ADDRESS

mkfifo "$work/head_in"
python "$repo/tests/ray/_ray_head.py" "$ray_cpus" < "$work/head_in" > "$work/address" &
head_pid=$!
exec 3> "$work/head_in"  # the head serves while this stays open
trap 'exec 3>&-; wait "$head_pid" || true' EXIT
for _ in $(seq 240); do
    [[ -s "$work/address" ]] && break
    kill -0 "$head_pid" 2>/dev/null || { echo "the local Ray cluster did not start" >&2; exit 1; }
    sleep 0.5
done
export RAY_ADDRESS=$(head -n1 "$work/address")
echo "local Ray cluster at $RAY_ADDRESS; run directory $work/run"

# examples/tiny.toml with NUM_STEPS steps, placed by Ray
sed "s/^num_steps = .*/num_steps = $num_steps/" "$repo/examples/tiny.toml" > "$work/ray_tiny.toml"
cat >> "$work/ray_tiny.toml" <<TOML
[cluster]
launcher = "ray"
[cluster.transport]
scheme = "tcp"
bind_host = "0.0.0.0"   # each host advertises its Ray node's IP
TOML

OMP_NUM_THREADS=1 python -m asyncflow.cli.main up "$work/ray_tiny.toml" --run-dir "$work/run"
echo "summary: $work/run/summary.json"
