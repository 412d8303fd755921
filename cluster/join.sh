#!/usr/bin/env bash
# Adds node N (cluster/nodeN.toml, e.g. cluster/node4.toml) to the running local cluster of
# `make cluster`: makes its certificate from the cluster CA, starts it in the background, asks
# the cluster to let it join (`qqctl join-node N ADDRESS CLUSTER_ADDRESS` through node 1), and
# waits until its /healthz answers 200. It then holds no queue replicas: add some with
# `qqctl grow N PATTERN`. Retire it with `qqctl forget-node N` once it is stopped.
#
#   cluster/join.sh 4
set -euo pipefail
cd "$(dirname "$0")/.."

n=${1:?usage: cluster/join.sh NODE_ID (with cluster/nodeNODE_ID.toml)}
config=cluster/node$n.toml
target_dir=${CARGO_TARGET_DIR:-$HOME/.cache/quorumq/target}
node_bin=${QQ_NODE_BIN:-$target_dir/debug/qq-node}
ctl_bin=${QQCTL_BIN:-$target_dir/debug/qqctl}
run_dir=.qq-cluster
timeout_s=${QQ_CLUSTER_TIMEOUT_S:-120}

[[ -f $config ]] || { echo "cluster/join.sh: $config not found" >&2; exit 1; }
for bin in "$node_bin" "$ctl_bin"; do
    [[ -x $bin ]] || { echo "cluster/join.sh: $bin not found; run 'make cluster' first" >&2; exit 1; }
done
[[ -d $run_dir/ca ]] || { echo "cluster/join.sh: no cluster CA in $run_dir/ca; run 'make cluster' first" >&2; exit 1; }

config_value() { # key
    sed -n "s/^$1 *= *\"\(.*\)\"/\1/p" "$config" | head -n 1
}
listen=$(config_value listen)
cluster_addr=$(config_value cluster_addr)
http_addr=$(config_value http_addr)
advertise=$(config_value advertise)
address=${advertise:-$listen}
first=$(sed -n 's/^listen *= *"\(.*\)"/\1/p' cluster/node1.toml | head -n 1)

"$node_bin" certs --ca-dir "$run_dir/ca" --out "$run_dir/tls$n" --name "node$n" >/dev/null

pidfile=$run_dir/node$n.pid
if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
    echo "node $n already running (pid $(cat "$pidfile"))"
else
    echo "--- $(date '+%F %T') starting node $n" >>"$run_dir/node$n.log"
    RUST_LOG=${RUST_LOG:-info} nohup "$node_bin" --config "$config" \
        >>"$run_dir/node$n.log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    echo "node $n started (pid $!), log $run_dir/node$n.log"
fi

echo "asking the cluster (through $first) to let node $n join..."
"$ctl_bin" --node "$first" join-node "$n" "$address" "$cluster_addr"

deadline=$((SECONDS + timeout_s))
until [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://$http_addr/healthz" || true) == 200 ]]; do
    if ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
        echo "cluster/join.sh: node $n exited" >&2
        tail -n 20 "$run_dir/node$n.log" >&2
        exit 1
    fi
    if ((SECONDS >= deadline)); then
        echo "cluster/join.sh: node $n not healthy after ${timeout_s}s" >&2
        tail -n 20 "$run_dir/node$n.log" >&2
        exit 1
    fi
    sleep 0.5
done
echo "node $n joined and is healthy: gRPC $listen, page http://$http_addr/"
echo "give it replicas with: $ctl_bin grow $n '.*'"
