#!/usr/bin/env bash
# CPU per message of each process under scenario 1: where a message's cost goes, by process,
# the client (qq-bench: qq-client over gRPC, lapin over AMQP) included.
#
#   bench/cpu_per_message.sh [qq-bench flags...]             quorumq: gRPC, then AMQP
#   bench/cpu_per_message.sh --rabbitmq [qq-bench flags...]  RabbitMQ's three nodes, with lapin
#
# Needs the release build (make bench builds it; RabbitMQ: bench/rabbitmq.sh install). While
# qq-bench runs, every 2 s it reads utime+stime of each node and of qq-bench from
# /proc/PID/stat, and for quorumq node 1's quorumq_raft_applied_index (its /metrics on
# 127.0.0.1:7701). It prints, per phase, the delivered msg/s of the run's results.md, for
# quorumq the Raft entries per second and messages per entry, and the CPU of each process in
# microseconds per delivered message (the first two samples and the last of a phase are left
# out: warm-up and wind-down). Which node leads is not said: the busiest node does.
set -euo pipefail
target=${CARGO_TARGET_DIR:-$HOME/.cache/quorumq/target}
side=quorumq
if [[ ${1:-} == --rabbitmq ]]; then
    side=rabbitmq
    shift
fi
out=$(mktemp -d /tmp/qq-cpu-per-message.XXXXXX)
sample() {
    while true; do
        local idx=- cpu=""
        if [[ $side == quorumq ]]; then
            idx=$(curl -s --max-time 1 http://127.0.0.1:7701/metrics |
                awk '/^quorumq_raft_applied_index\{/ {print $2}' | head -1 || true)
        fi
        for p in $(pgrep -f 'release/qq-node|release/qq-bench|beam.smp'); do
            local name
            name=$(tr -d '\0' <"/proc/$p/comm" 2>/dev/null || true)
            cpu="$cpu $p/${name:-?}:$(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null || true)"
        done
        echo "$(date +%s.%N) ${idx:--} $cpu" >>"$out/samples"
        sleep 2
    done
}
sample &
sampler=$!
trap 'kill $sampler 2>/dev/null || true' EXIT
"$target/release/qq-bench" --scenarios 1 --only "$side" --no-profile --out "$out" \
    --run-dir /tmp/qq-cpu-per-message-run "$@" >"$out/log" 2>&1
kill $sampler
python3 - "$out" "$side" <<'PY'
import re, sys
out, side = sys.argv[1], sys.argv[2]
ticks = 100  # USER_HZ
phases, prev = [[]], None
for line in open(out + "/samples"):
    ts, idx, *cpu = line.split()
    procs = {}
    for c in cpu:
        pid, _, t = c.partition(":")
        if t:
            procs[pid] = int(t)
    if side == "rabbitmq":
        # One phase: while qq-bench is busy (its CPU grows by more than a tick per sample).
        bench = next((v for p, v in procs.items() if p.endswith("/qq-bench")), None)
        if prev is not None and bench is not None and bench - prev > 1:
            phases[-1].append((float(ts), 0, procs))
        prev = bench
        continue
    if idx == "-":
        continue
    idx = int(idx)
    if prev is not None and idx < prev:
        phases.append([])  # the queue was declared again: the next protocol
    prev = idx
    phases[-1].append((float(ts), idx, procs))
md = open(out + "/results.md").read()
row = re.search(r"delivered\+acked \(msg/s\) \|([^\n]*)", md).group(1)
cells = [c.strip() for c in row.split("|")]
rate_of = lambda c: int(c) if c.isdigit() else None
if side == "rabbitmq":
    names, rates = ["RabbitMQ"], [rate_of(cells[2])]
else:
    names, rates = ["gRPC", "AMQP"], [rate_of(cells[0]), rate_of(cells[1])]
for name, ph, rate in zip(names, phases, rates):
    ph = ph[2:-1]
    if not rate:
        print(f"{name}: no rate in results.md")
        continue
    if len(ph) < 3:
        print(f"{name}: too few samples")
        continue
    (t0, i0, c0), (t1, i1, c1) = ph[0], ph[-1]
    dt = t1 - t0
    us = {p: (c1[p] - c0.get(p, 0)) / ticks / dt * 1e6 / rate for p in c1}
    top = ", ".join(f"{p}: {v:.0f}" for p, v in sorted(us.items(), key=lambda kv: -kv[1]))
    batching = ""
    if side == "quorumq":
        entries = (i1 - i0) / dt
        batching = f"{entries:.0f} entries/s, {rate / entries:.0f} msg/entry; "
    print(f"{name}: {rate} msg/s, {batching}CPU us/msg (pid/process): {top}, "
          f"all: {sum(us.values()):.0f}")
print(f"(run files in {out})")
PY
