#!/usr/bin/env bash
# Starts the local three-node cluster described by cluster/node{1,2,3}.toml in the background
# and waits until it has formed (a metadata leader is elected). Used by `make cluster`.
#
# Run from anywhere; the nodes run from the repository root, so their data_dir
# ".qq-cluster/nodeN" is <repo>/.qq-cluster/nodeN. Pid files and logs live next to the data:
#   .qq-cluster/nodeN.pid, .qq-cluster/nodeN.log
# Binaries: $QQ_NODE_BIN and $QQCTL_BIN, else $CARGO_TARGET_DIR/debug/{qq-node,qqctl}, with
# CARGO_TARGET_DIR defaulting to ~/.cache/quorumq/target (as in the Makefile).
set -euo pipefail
cd "$(dirname "$0")/.."

target_dir=${CARGO_TARGET_DIR:-$HOME/.cache/quorumq/target}
node_bin=${QQ_NODE_BIN:-$target_dir/debug/qq-node}
ctl_bin=${QQCTL_BIN:-$target_dir/debug/qqctl}
run_dir=.qq-cluster
nodes=(1 2 3)
timeout_s=${QQ_CLUSTER_TIMEOUT_S:-60}

for bin in "$node_bin" "$ctl_bin"; do
    if [[ ! -x $bin ]]; then
        echo "cluster/up.sh: $bin not found; run 'make build' first" >&2
        exit 1
    fi
done
mkdir -p "$run_dir"

# Cluster TLS on first start: the CA in .qq-cluster/ca (its key stays there: nodes get only
# ca.pem), one certificate per node in .qq-cluster/tlsN. Existing files are kept.
for n in "${nodes[@]}"; do
    "$node_bin" certs --ca-dir "$run_dir/ca" --out "$run_dir/tls$n" --name "node$n" >/dev/null
done

is_running() { # pid file → 0 when that pid is a live qq-node
    local pid
    [[ -f $1 ]] || return 1
    pid=$(cat "$1")
    [[ -n $pid && -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q qq-node
}

for n in "${nodes[@]}"; do
    pidfile=$run_dir/node$n.pid
    if is_running "$pidfile"; then
        echo "node $n already running (pid $(cat "$pidfile"))"
        continue
    fi
    echo "--- $(date '+%F %T') starting node $n" >>"$run_dir/node$n.log"
    RUST_LOG=${RUST_LOG:-info} nohup "$node_bin" --config "cluster/node$n.toml" \
        >>"$run_dir/node$n.log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    echo "node $n started (pid $!), log $run_dir/node$n.log"
done

show_logs() {
    for n in "${nodes[@]}"; do
        echo "===== tail of $run_dir/node$n.log" >&2
        tail -n 40 "$run_dir/node$n.log" >&2 || true
    done
}

echo "waiting up to ${timeout_s}s for the cluster to form..."
deadline=$((SECONDS + timeout_s))
while true; do
    for n in "${nodes[@]}"; do
        if ! is_running "$run_dir/node$n.pid"; then
            echo "cluster/up.sh: node $n exited" >&2
            show_logs
            exit 1
        fi
    done
    if status=$("$ctl_bin" --node 127.0.0.1:7101 status 2>/dev/null) &&
        grep -Eq '^metadata leader: [0-9]+' <<<"$status"; then
        break
    fi
    if ((SECONDS >= deadline)); then
        echo "cluster/up.sh: no metadata leader after ${timeout_s}s" >&2
        "$ctl_bin" --node 127.0.0.1:7101 status >&2 || true
        show_logs
        exit 1
    fi
    sleep 0.5
done

cat <<MSG

$status

quorumq is up: three nodes on 127.0.0.1:7101, 127.0.0.1:7102 and 127.0.0.1:7103
(user guest, password guest; any node answers any request).
Nodes talk to each other on 127.0.0.1:7201-7203 over mutual TLS (certificates in
$run_dir/ca and $run_dir/tls{1,2,3}, made on first start; clients need none).

Try:
  alias qqctl=$ctl_bin
  qqctl declare-exchange orders --type topic
  qqctl declare-queue eu-orders --arg x-max-length=1000
  qqctl bind eu-orders orders --key 'eu.#'
  qqctl publish --exchange orders --key eu.fr.new --body hello
  qqctl --node 127.0.0.1:7102 consume eu-orders --count 1
  qqctl list-queues
  qqctl status

Logs: $run_dir/node{1,2,3}.log   Data: $run_dir/node{1,2,3}/   Pids: $run_dir/node{1,2,3}.pid
Stop with 'make cluster-down'; delete all data with 'make clean-cluster'.
MSG
