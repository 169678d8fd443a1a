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
#
# Loopback only: the cluster, the driver and every host listen and dial on 127.0.0.1,
# never on another interface of the machine. RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is
# what does it for Ray (Ray 2.60 turns --node-ip-address 127.0.0.1 into the machine's
# routable address otherwise, and a driver that dials that may hang for minutes);
# by hand: RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 ray start --head --node-ip-address 127.0.0.1.
# afctl up sets it itself when bind_host or the Ray address is a loopback one.
#
# Scale: every host reserves [cluster] ray_cpus_per_host (0.1) of the CPUs the cluster
# declares (RAY_CPUS here), so RAY_CPUS=4 holds 40 hosts; a run that needs more is
# refused at once with the figures. Hosts start in parallel; to time N of them:
#   python scripts/ray_spawn_bench.py --hosts 8,16,24 --ray-cpus 8
set -euo pipefail

num_steps=${1:-3}
ray_cpus=${2:-4}
repo=$(cd "$(dirname "$0")/.." && pwd)
python -c "import ray" 2>/dev/null || { echo "Ray is missing: pip install -e '$repo[ray]'" >&2; exit 2; }

work=$(mktemp -d -t asyncflow-ray-XXXXXX)
token() { python -c 'import secrets; print(secrets.token_hex(32))'; }
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(token) RAY_USAGE_STATS_ENABLED=0
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0  # Ray on 127.0.0.1 only (the head and this driver)
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
bind_host = "127.0.0.1"   # one machine: loopback only (several machines: "0.0.0.0", docs/multi-node.md)
TOML

OMP_NUM_THREADS=1 python -m asyncflow.cli.main up "$work/ray_tiny.toml" --run-dir "$work/run"
echo "summary: $work/run/summary.json"
