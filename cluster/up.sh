#!/usr/bin/env bash
# Starts the local three-node cluster described by cluster/node{1,2,3}.toml in the background
# and waits until every node is healthy: its GET /healthz (on the node's http_addr) answers
# 200, which a node does once it has joined the cluster and sees a metadata leader. Used by
# `make cluster`. Fails, naming the node and printing the end of its log, when a node exits or
# is not healthy within QQ_CLUSTER_TIMEOUT_S seconds (default 120).
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
timeout_s=${QQ_CLUSTER_TIMEOUT_S:-120}
log_lines=20

for bin in "$node_bin" "$ctl_bin"; do
    if [[ ! -x $bin ]]; then
        echo "cluster/up.sh: $bin not found; run 'make build' first" >&2
        exit 1
    fi
done
if ! command -v curl >/dev/null; then
    echo "cluster/up.sh: curl not found (make deps installs it)" >&2
    exit 1
fi

# `key = "value"` of a node's config file.
config_value() { # node key
    sed -n "s/^$2 *= *\"\(.*\)\"/\1/p" "cluster/node$1.toml" | head -n 1
}
declare -A grpc_addr http_addr amqp_addr
for n in "${nodes[@]}"; do
    grpc_addr[$n]=$(config_value "$n" listen)
    amqp_addr[$n]=$(config_value "$n" amqp_addr)
    http_addr[$n]=$(config_value "$n" http_addr)
    if [[ -z ${http_addr[$n]} ]]; then
        echo "cluster/up.sh: cluster/node$n.toml has no http_addr (needed for /healthz)" >&2
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

show_log() { # node
    echo "===== last $log_lines lines of $run_dir/node$1.log" >&2
    tail -n "$log_lines" "$run_dir/node$1.log" >&2 || true
}

# 200 from the node's /healthz: joined and a metadata leader seen. Prints the status code.
health() { # node
    curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://${http_addr[$1]}/healthz" || true
}

echo "waiting up to ${timeout_s}s for every node's /healthz..."
deadline=$((SECONDS + timeout_s))
pending=("${nodes[@]}")
while ((${#pending[@]} > 0)); do
    still=()
    for n in "${pending[@]}"; do
        code=$(health "$n")
        if [[ $code == 200 ]]; then
            echo "node $n healthy (http://${http_addr[$n]}/healthz)"
            continue
        fi
        # An exited node will never answer: fail now rather than at the deadline.
        if ! is_running "$run_dir/node$n.pid"; then
            echo "cluster/up.sh: node $n exited before it was healthy" >&2
            show_log "$n"
            exit 1
        fi
        still+=("$n")
    done
    pending=("${still[@]}")
    ((${#pending[@]} == 0)) && break
    if ((SECONDS >= deadline)); then
        for n in "${pending[@]}"; do
            echo "cluster/up.sh: node $n not healthy after ${timeout_s}s" \
                "(GET http://${http_addr[$n]}/healthz answered '$(health "$n")')" >&2
            show_log "$n"
        done
        exit 1
    fi
    sleep 0.5
done
status=$("$ctl_bin" --node "${grpc_addr[1]}" status 2>&1 || true)

cat <<MSG

$status

quorumq is up (user guest, password guest; any node answers any request):

$(for n in "${nodes[@]}"; do
    printf '  node %s  gRPC %s (qq.v1.Broker, health, reflection)\n' "$n" "${grpc_addr[$n]}"
    if [[ -n ${amqp_addr[$n]} ]]; then
        printf '          AMQP 0-9-1 amqp://guest:guest@%s/ (RabbitMQ clients: pika, lapin, amqp091-go, ...)\n' \
            "${amqp_addr[$n]}"
    fi
    printf '          page http://%s/   metrics http://%s/metrics   health http://%s/healthz\n' \
        "${http_addr[$n]}" "${http_addr[$n]}" "${http_addr[$n]}"
done)

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
