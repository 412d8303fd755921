#!/usr/bin/env bash
# A three-node RabbitMQ cluster on loopback for the side-by-side benchmark (qq-bench, `make bench`).
#
#   bench/rabbitmq.sh install        install Debian's rabbitmq-server when missing, without letting
#                                    the package start (or keep running) its default node
#   bench/rabbitmq.sh start-node N   start node N (1..3) in the background and return at once
#   bench/rabbitmq.sh wait-node N    wait until node N has booted
#   bench/rabbitmq.sh up             start the three nodes, join 2 and 3 to 1, wait for all
#   bench/rabbitmq.sh pid N          print the OS pid of node N's beam.smp
#   bench/rabbitmq.sh leader QUEUE   print the number (1..3) of the node leading QUEUE
#   bench/rabbitmq.sh down           stop the three nodes (by pid) and the epmd they used
#   bench/rabbitmq.sh ctl N ARGS...  rabbitmqctl against node N
#
# Node N is benchN@localhost: AMQP on 127.0.0.1:568N, distribution on 2568N, its own epmd on
# port 4379 (so a default RabbitMQ on this machine is never touched), data and logs under
# $QQ_BENCH_RUN_DIR/rabbitmq (default /tmp/qq-bench-run/rabbitmq), one shared Erlang cookie.
# Quorum queues keep RabbitMQ's defaults: confirms after the Ra WAL is fsynced on a majority.
#
# One deliberate setting, the same on all three nodes: the Erlang schedulers do not busy-wait
# (+sbwt none, RabbitMQ's advice for shared hosts). Three nodes share two cores here, so
# busy-waiting schedulers would steal CPU from each other and from the benchmark client.
set -euo pipefail

run_dir=${QQ_BENCH_RUN_DIR:-/tmp/qq-bench-run}/rabbitmq
rmq_bin=/usr/lib/rabbitmq/bin
SUDO=$([ "$(id -u)" = 0 ] || echo sudo)
export ERL_EPMD_PORT=${QQ_BENCH_EPMD_PORT:-4379}
export HOME=$run_dir/home  # rabbitmqctl and the nodes read the cookie from $HOME/.erlang.cookie

node_name() { echo "bench$1@localhost"; }

node_env() { # N -> the environment of node N, one NAME=value per array element
    local n=$1 dir=$run_dir/node$1
    env_of_node=(
        RABBITMQ_NODENAME="$(node_name "$n")"
        RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
        RABBITMQ_NODE_PORT=$((5680 + n))
        RABBITMQ_DIST_PORT=$((25680 + n))
        RABBITMQ_MNESIA_BASE="$dir/mnesia"
        RABBITMQ_LOG_BASE="$dir/log"
        RABBITMQ_CONFIG_FILE="$run_dir/rabbitmq"
        RABBITMQ_ADVANCED_CONFIG_FILE="$run_dir/advanced.config"
        RABBITMQ_ENABLED_PLUGINS_FILE="$run_dir/enabled_plugins"
        RABBITMQ_CONF_ENV_FILE="$run_dir/rabbitmq-env.conf"
        RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="+sbwt none +sbwtdcpu none +sbwtdio none"
    )
}

ctl() { # N args...
    local n=$1
    shift
    "$rmq_bin/rabbitmqctl" -n "$(node_name "$n")" "$@"
}

prepare() {
    mkdir -p "$HOME" "$run_dir"/node{1,2,3}/{mnesia,log}
    if [[ ! -f $HOME/.erlang.cookie ]]; then
        echo "QQBENCHCOOKIE$(date +%s%N)" | tr -dc 'A-Z0-9' >"$HOME/.erlang.cookie"
        chmod 400 "$HOME/.erlang.cookie"
    fi
    # The shovel plugin for scenario 10 (move rate), where a dynamic shovel moves a backlog.
    echo '[rabbitmq_shovel].' >"$run_dir/enabled_plugins"
    echo '[].' >"$run_dir/advanced.config"
    : >"$run_dir/rabbitmq-env.conf"
    cat >"$run_dir/rabbitmq.conf" <<CONF
loopback_users = none
log.console = false
log.file.level = warning
# The three nodes find each other at boot (no rabbitmqctl join_cluster round trips).
cluster_formation.peer_discovery_backend = classic_config
cluster_formation.classic_config.nodes.1 = bench1@localhost
cluster_formation.classic_config.nodes.2 = bench2@localhost
cluster_formation.classic_config.nodes.3 = bench3@localhost
CONF
}

install() {
    if [[ -x $rmq_bin/rabbitmq-server ]]; then
        return
    fi
    echo "installing rabbitmq-server (Debian package)"
    # The package's postinst starts a default node through invoke-rc.d; a policy-rc.d that says
    # "no" keeps it from doing so. Only add one when the machine has none, and remove it after.
    local added_policy=""
    if [[ ! -e /usr/sbin/policy-rc.d ]]; then
        printf '#!/bin/sh\nexit 101\n' | $SUDO tee /usr/sbin/policy-rc.d >/dev/null
        $SUDO chmod +x /usr/sbin/policy-rc.d
        added_policy=1
    fi
    $SUDO apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q rabbitmq-server
    [[ -n $added_policy ]] && $SUDO rm -f /usr/sbin/policy-rc.d
    # In case a service manager started it anyway: the default node is not ours to keep running.
    if command -v systemctl >/dev/null 2>&1 && systemctl is-active --quiet rabbitmq-server 2>/dev/null; then
        $SUDO systemctl stop rabbitmq-server || true
    fi
}

start_node() {
    local n=$1 log=$run_dir/node$1.out
    prepare
    echo "--- $(date '+%F %T') starting $(node_name "$n")" >>"$log"
    node_env "$n"
    env "${env_of_node[@]}" nohup "$rmq_bin/rabbitmq-server" >>"$log" 2>&1 </dev/null &
}

wait_node() { # until node N accepts AMQP connections (its listener opens last in boot)
    local n=$1 port=$((5680 + $1))
    local deadline=$((SECONDS + ${QQ_BENCH_RABBIT_TIMEOUT_S:-180}))
    until (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            echo "bench/rabbitmq.sh: $(node_name "$n") did not start; see $run_dir/node$n.out" >&2
            tail -n 30 "$run_dir/node$n.out" >&2 || true
            exit 1
        fi
        sleep 0.25
    done
}

pid() { # the pid file the node writes at boot, if that process still runs
    local file=$run_dir/node$1/mnesia/$(node_name "$1").pid p
    [[ -f $file ]] || return 0
    p=$(tr -dc '0-9' <"$file")
    if [[ -n $p && -r /proc/$p/comm && $(cat "/proc/$p/comm") == beam.smp ]]; then
        echo "$p"
    fi
}

up() {
    prepare
    # Node 1 first: it forms the cluster, and 2 and 3 join it as they boot (classic_config).
    for n in 1 2 3; do
        if [[ -n $(pid "$n") ]]; then
            echo "$(node_name "$n") already running"
        else
            start_node "$n"
        fi
        [[ $n == 1 ]] && wait_node 1
    done
    for n in 1 2 3; do wait_node "$n"; done
    local running
    running=$(ctl 1 eval 'length(rabbit_nodes:all_running()).' 2>/dev/null | tr -dc '0-9')
    if [[ $running != 3 ]]; then
        echo "bench/rabbitmq.sh: expected 3 running nodes in the cluster, got '$running'" >&2
        exit 1
    fi
    echo "RabbitMQ: three clustered nodes on 127.0.0.1:5681-5683"
}

leader() {
    local n name
    name=$(ctl 1 list_queues -q --no-table-headers name leader 2>/dev/null |
        awk -v q="$1" '$1 == q { print $2 }')
    for n in 1 2 3; do
        if [[ $name == "$(node_name "$n")" ]]; then
            echo "$n"
            return
        fi
    done
    echo "bench/rabbitmq.sh: no leader for queue $1 (got '$name')" >&2
    exit 1
}

down() {
    local n p pids=()
    for n in 1 2 3; do
        p=$(pid "$n" || true)
        [[ -n $p ]] && pids+=("$p")
    done
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    # Wait for the processes themselves: a stopping node removes its pid file early.
    for p in "${pids[@]}"; do
        for _ in $(seq 1 120); do
            [[ -d /proc/$p ]] || break
            sleep 0.25
        done
    done
    # A node that did not stop in 30 s (one with thousands of queues, swamped), or whose pid
    # file was already gone, is killed: left running, it took 115 % of a core from the next
    # scenario's clusters. Ours are the Erlang VMs started with this run's HOME.
    pkill -9 -f "beam.smp.* -home $HOME " 2>/dev/null || true
    for _ in $(seq 1 40); do
        pgrep -f "beam.smp.* -home $HOME " >/dev/null || break
        sleep 0.25
    done
    # The epmd on our own port was started by our first node; it has nothing left to serve.
    # It refuses to stop while a node is still registered, so give the nodes a moment.
    for _ in $(seq 1 20); do
        epmd -port "$ERL_EPMD_PORT" -kill >/dev/null 2>&1 && break
        sleep 0.25
    done
}

cmd=${1:-}
shift || true
case $cmd in
install) install ;;
start-node) start_node "$1" ;;
wait-node) wait_node "$1" ;;
up) up ;;
pid) pid "$1" ;;
leader) leader "$1" ;;
down) down ;;
ctl) ctl "$@" ;;
*)
    sed -n '2,20p' "$0" >&2
    exit 2
    ;;
esac
