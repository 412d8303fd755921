#!/usr/bin/env bash
# Three quorumq hosts on one machine: network namespaces joined by a bridge, one qq-node in each.
# This is the cluster the chaos runner (qq-chaos, `make chaos`) cuts apart; it can also be used
# by hand to try partitions. Needs root, iproute2 and iptables (installed when missing).
#
#   cluster/netns.sh up      bridge qqc-br (10.77.0.254/24, the host side: clients run here)
#                            and namespaces qqc1..qqc3 with addresses 10.77.0.1..3
#   cluster/netns.sh start   up, then one qq-node per namespace on 10.77.0.N:7101; configs, data,
#                            logs and pids in .qq-netns/ (repository root); waits for formation
#   cluster/netns.sh stop    stops the nodes started by `start` (data kept)
#   cluster/netns.sh heal    removes every fault: flushes iptables and tc qdiscs in each namespace
#   cluster/netns.sh down    stop, then deletes the namespaces and the bridge
#   cluster/netns.sh status  namespaces, addresses, firewall rules, node pids
#
# Faults by hand, e.g. cut node 1 off from node 2 (clients on the host still reach both):
#   ip netns exec qqc1 iptables -A INPUT -s 10.77.0.2 -j DROP
#   ip netns exec qqc1 iptables -A OUTPUT -d 10.77.0.2 -j DROP
#
# Environment: QQ_NETNS_NODES (3), QQ_NETNS_PREFIX (qqc), QQ_NETNS_SUBNET (10.77.0),
# QQ_NODE_BIN / QQCTL_BIN (else $CARGO_TARGET_DIR/debug/..., default ~/.cache/quorumq/target).
# The chaos runner uses up/heal/down only, with its own prefix (qqx) and QQ_NETNS_NODES=4: the
# fourth namespace hosts the spare nodes its membership nemesis joins and forgets.
set -euo pipefail
cd "$(dirname "$0")/.."

nodes=${QQ_NETNS_NODES:-3}
prefix=${QQ_NETNS_PREFIX:-qqc}
subnet=${QQ_NETNS_SUBNET:-10.77.0}
bridge=$prefix-br
port=7101
cluster_port=7201
run_dir=.qq-netns
target_dir=${CARGO_TARGET_DIR:-$HOME/.cache/quorumq/target}
node_bin=${QQ_NODE_BIN:-$target_dir/debug/qq-node}
ctl_bin=${QQCTL_BIN:-$target_dir/debug/qqctl}

need_root() {
    if [[ $(id -u) != 0 ]]; then
        echo "cluster/netns.sh: network namespaces need root (try: sudo $0 $*)" >&2
        exit 1
    fi
}

install_tools() {
    local missing=""
    command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
    command -v iptables >/dev/null 2>&1 || missing="$missing iptables"
    if [[ -n $missing ]]; then
        echo "installing:$missing"
        apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $missing
    fi
}

ns_exists() { ip netns list | grep -qw "^$1"; }

up() {
    install_tools
    if ! ip link show "$bridge" >/dev/null 2>&1; then
        ip link add "$bridge" type bridge
        ip addr add "$subnet.254/24" dev "$bridge"
        ip link set "$bridge" up
    fi
    for n in $(seq "$nodes"); do
        local ns=$prefix$n
        ns_exists "$ns" && continue
        ip netns add "$ns"
        ip link add "$ns-h" type veth peer name "$ns-n"
        ip link set "$ns-n" netns "$ns"
        ip link set "$ns-h" master "$bridge"
        ip link set "$ns-h" up
        ip netns exec "$ns" ip addr add "$subnet.$n/24" dev "$ns-n"
        ip netns exec "$ns" ip link set "$ns-n" up
        ip netns exec "$ns" ip link set lo up
    done
    echo "namespaces ${prefix}1..$prefix$nodes on $subnet.1..$nodes, host side $subnet.254 ($bridge)"
}

heal() {
    for n in $(seq "$nodes"); do
        local ns=$prefix$n
        ns_exists "$ns" || continue
        ip netns exec "$ns" iptables -F
        ip netns exec "$ns" tc qdisc del dev "$ns-n" root 2>/dev/null || true
    done
    echo "healed: no firewall rules, no qdiscs"
}

peers_toml() {
    local out="peers = ["
    for n in $(seq "$nodes"); do
        out="$out{ id = $n, address = \"$subnet.$n:$port\", cluster_address = \"$subnet.$n:$cluster_port\" }, "
    done
    echo "${out%, }]"
}

start() {
    up
    for bin in "$node_bin" "$ctl_bin"; do
        if [[ ! -x $bin ]]; then
            echo "cluster/netns.sh: $bin not found; run 'make build' first" >&2
            exit 1
        fi
    done
    mkdir -p "$run_dir"
    for n in $(seq "$nodes"); do
        local pidfile=$run_dir/node$n.pid
        if [[ -f $pidfile ]] && kill -0 "$(cat "$pidfile")" 2>/dev/null; then
            echo "node $n already running (pid $(cat "$pidfile"))"
            continue
        fi
        "$node_bin" certs --ca-dir "$run_dir/ca" --out "$run_dir/tls$n" --name "node$n" \
            --host "$subnet.$n" >/dev/null
        cat >"$run_dir/node$n.toml" <<TOML
node_id = $n
listen = "$subnet.$n:$port"
cluster_addr = "$subnet.$n:$cluster_port"
cluster_ca = "$run_dir/tls$n/ca.pem"
cluster_cert = "$run_dir/tls$n/node.pem"
cluster_key = "$run_dir/tls$n/node.key"
$(peers_toml)
data_dir = "$run_dir/node$n"
TOML
        RUST_LOG=${RUST_LOG:-info} nohup ip netns exec "$prefix$n" "$node_bin" \
            --config "$run_dir/node$n.toml" >>"$run_dir/node$n.log" 2>&1 </dev/null &
        echo $! >"$pidfile"
        echo "node $n started in namespace $prefix$n (pid $!), log $run_dir/node$n.log"
    done
    local deadline=$((SECONDS + 60))
    until "$ctl_bin" --node "$subnet.1:$port" status 2>/dev/null | grep -Eq '^metadata leader: [0-9]+'; do
        if ((SECONDS >= deadline)); then
            echo "cluster/netns.sh: no metadata leader after 60 s; see $run_dir/node*.log" >&2
            exit 1
        fi
        sleep 0.5
    done
    "$ctl_bin" --node "$subnet.1:$port" status
    echo
    echo "quorumq is up in namespaces: $(for n in $(seq "$nodes"); do printf '%s ' "$subnet.$n:$port"; done)"
    echo "try: $ctl_bin --node $subnet.2:$port list-queues"
}

stop() {
    for pidfile in "$run_dir"/node*.pid; do
        [[ -f $pidfile ]] || continue
        local pid
        pid=$(cat "$pidfile")
        if kill -0 "$pid" 2>/dev/null; then
            kill -CONT "$pid" 2>/dev/null || true # a paused node cannot stop
            kill -TERM "$pid" 2>/dev/null || true
            for _ in $(seq 100); do
                kill -0 "$pid" 2>/dev/null || break
                sleep 0.1
            done
            kill -KILL "$pid" 2>/dev/null || true
            echo "$(basename "$pidfile" .pid) stopped"
        fi
        rm -f "$pidfile"
    done
}

down() {
    stop
    for n in $(seq "$nodes"); do
        ns_exists "$prefix$n" && ip netns del "$prefix$n"
        ip link del "$prefix$n-h" 2>/dev/null || true
    done
    ip link del "$bridge" 2>/dev/null || true
    echo "namespaces and bridge removed"
}

status() {
    for n in $(seq "$nodes"); do
        local ns=$prefix$n
        if ns_exists "$ns"; then
            echo "== $ns: $(ip netns exec "$ns" ip -4 -o addr show dev "$ns-n" | awk '{print $4}')"
            ip netns exec "$ns" iptables -S | grep -v '^-P' || true
        else
            echo "== $ns: absent"
        fi
        [[ -f $run_dir/node$n.pid ]] && echo "   node pid $(cat "$run_dir/node$n.pid")"
    done
}

cmd=${1:-}
case $cmd in
up | start | stop | heal | down | status)
    need_root "$cmd"
    "$cmd"
    ;;
*)
    sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
