#!/usr/bin/env bash
# CPU per message of each process under scenario 1 (quorumq alone, gRPC then AMQP), and the
# Raft entries per second of the queue's group: where a message's cost goes, by process.
#
#   bench/cpu_per_message.sh [qq-bench flags...]     e.g. --qq-set worker_threads=1
#
# Needs the release build (make bench builds it). While qq-bench runs, every 2 s it reads
# utime+stime of each qq-node and qq-bench process from /proc/PID/stat and node 1's
# quorumq_raft_applied_index (its /metrics on 127.0.0.1:7701); it prints, per phase, the
# delivered msg/s of the run's results.md, entries/s, messages per entry, and the CPU of each
# process in microseconds per delivered message (the first two samples and the last of a phase
# are left out: warm-up and wind-down). Which process leads is not said: the busiest node does.
set -euo pipefail
target=${CARGO_TARGET_DIR:-$HOME/.cache/quorumq/target}
out=$(mktemp -d /tmp/qq-cpu-per-message.XXXXXX)
sample() {
    while true; do
        local idx cpu=""
        idx=$(curl -s --max-time 1 http://127.0.0.1:7701/metrics |
            awk '/^quorumq_raft_applied_index\{/ {print $2}' | head -1 || true)
        for p in $(pgrep -f 'release/qq-node|release/qq-bench'); do
            cpu="$cpu $p:$(awk '{print $14+$15}' "/proc/$p/stat" 2>/dev/null || true)"
        done
        echo "$(date +%s.%N) ${idx:--} $cpu" >>"$out/samples"
        sleep 2
    done
}
sample &
sampler=$!
trap 'kill $sampler 2>/dev/null || true' EXIT
"$target/release/qq-bench" --scenarios 1 --only quorumq --no-profile --out "$out" \
    --run-dir /tmp/qq-cpu-per-message-run "$@" >"$out/log" 2>&1
kill $sampler
python3 - "$out" <<'PY'
import re, sys
out = sys.argv[1]
ticks = 100  # USER_HZ
phases, prev = [[]], None
for line in open(out + "/samples"):
    ts, idx, *cpu = line.split()
    if idx == "-":
        continue
    idx = int(idx)
    if prev is not None and idx < prev:
        phases.append([])  # the queue was declared again: the next protocol
    prev = idx
    procs = {}
    for c in cpu:
        pid, _, t = c.partition(":")
        if t:
            procs[pid] = int(t)
    phases[-1].append((float(ts), idx, procs))
md = open(out + "/results.md").read()
m = re.search(r"delivered\+acked \(msg/s\) \| (\d+) \| (\d+)", md)
rates = [int(m.group(1)), int(m.group(2))] if m else []
for name, ph, rate in zip(["gRPC", "AMQP"], phases, rates):
    ph = ph[2:-1]
    if len(ph) < 3:
        print(f"{name}: too few samples")
        continue
    (t0, i0, c0), (t1, i1, c1) = ph[0], ph[-1]
    dt, entries = t1 - t0, (ph[-1][1] - ph[0][1]) / (t1 - t0)
    us = {p: (c1[p] - c0.get(p, 0)) / ticks / dt * 1e6 / rate for p in c1}
    top = ", ".join(f"pid {p}: {v:.0f}" for p, v in sorted(us.items(), key=lambda kv: -kv[1]))
    print(f"{name}: {rate} msg/s, {entries:.0f} entries/s, {rate / entries:.0f} msg/entry; "
          f"CPU us/msg: {top}")
print(f"(run files in {out})")
PY
