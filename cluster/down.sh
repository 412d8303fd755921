#!/usr/bin/env bash
# Stops the nodes started by cluster/up.sh (SIGTERM, then SIGKILL after 10 s). Data is kept;
# `make clean-cluster` removes it.
set -euo pipefail
cd "$(dirname "$0")/.."
run_dir=.qq-cluster

for pidfile in "$run_dir"/node*.pid; do
    [[ -f $pidfile ]] || continue
    pid=$(cat "$pidfile")
    name=$(basename "$pidfile" .pid)
    if [[ -n $pid && -r /proc/$pid/cmdline ]] && tr '\0' ' ' <"/proc/$pid/cmdline" | grep -q qq-node; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        if kill -0 "$pid" 2>/dev/null; then
            echo "$name (pid $pid) did not stop in 10 s; killing it"
            kill -KILL "$pid" 2>/dev/null || true
        fi
        echo "$name stopped"
    else
        echo "$name not running"
    fi
    rm -f "$pidfile"
done
