#!/usr/bin/env bash
# Performance bisection (issue 35): release builds of several commits, run alternately on
# this machine, scenarios 1 and 2 of each commit's own qq-bench, quorumq alone.
#
#   bench/bisect.sh ROUNDS COMMIT...        e.g. bench/bisect.sh 2 88cbc23 5aad716 HEAD
#   FIRST_ROUND=3 bench/bisect.sh 2 ...      two more rounds, numbered 3 and 4
#
# Each commit is built once (a detached worktree under $BISECT_DIR, the shared target
# directory, binaries copied to $BISECT_DIR/bin/COMMIT; an existing copy is reused). Then,
# ROUNDS times, every commit runs `qq-bench --scenarios 1,2 --only quorumq --no-profile
# --latency-rate $RATE` with its own binaries, in turn (odd rounds in the order given, even
# rounds reversed, so that a drift of the machine does not favour one side). Results go to
# $BISECT_OUT/COMMIT/roundN/results.json; bench/bisect_table.py makes the table.
#
# The machine must be otherwise idle: a build or a test running beside it moves the figures
# more than most changes do.
set -euo pipefail

ROUNDS=${1:?usage: bench/bisect.sh ROUNDS COMMIT...}
shift
[ $# -ge 1 ] || { echo "usage: bench/bisect.sh ROUNDS COMMIT..." >&2; exit 2; }
REPO=$(git rev-parse --show-toplevel)
BISECT_DIR=${BISECT_DIR:-/tmp/qq-bisect}
BISECT_OUT=${BISECT_OUT:-$REPO/bench/results/bisect}
RATE=${RATE:-4000}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/quorumq/target}
mkdir -p "$BISECT_DIR/bin" "$BISECT_OUT"

build() {
  local name=$1 bin="$BISECT_DIR/bin/$1"
  if [ -x "$bin/qq-node" ] && [ -x "$bin/qq-bench" ]; then
    echo "== $name: binaries already in $bin"
    return
  fi
  local src="$BISECT_DIR/src-$name"
  [ -d "$src" ] || git -C "$REPO" worktree add --detach "$src" "$name" >/dev/null
  echo "== $name: building in $src"
  (cd "$src" && cargo build --release -p qq-node -p qq-bench)
  mkdir -p "$bin"
  cp "$CARGO_TARGET_DIR/release/qq-node" "$CARGO_TARGET_DIR/release/qq-bench" "$bin/"
  git -C "$REPO" log -1 --format='%H %cI %s' "$name" > "$bin/commit"
}

for c in "$@"; do build "$c"; done
# The builds above left their binaries in the shared target directory: put this tree's back.
echo "== restoring this tree's release binaries"
(cd "$REPO" && cargo build --release -p qq-node -p qq-bench)

run() {
  local name=$1 round=$2 bin="$BISECT_DIR/bin/$1"
  local out="$BISECT_OUT/$name/round$round"
  mkdir -p "$out"
  cp "$bin/commit" "$BISECT_OUT/$name/commit" 2>/dev/null || true
  echo "== round $round: $name"
  # Run from a scratch directory: older benches write relative paths.
  (cd "$BISECT_DIR" && "$bin/qq-bench" --scenarios 1,2 --only quorumq --no-profile \
     --latency-rate "$RATE" --qq-node-bin "$bin/qq-node" --out "$out") > "$out/log.txt" 2>&1 ||
    echo "   $name round $round failed: see $out/log.txt"
}

FIRST_ROUND=${FIRST_ROUND:-1}
for round in $(seq "$FIRST_ROUND" $((FIRST_ROUND + ROUNDS - 1))); do
  if [ $((round % 2)) -eq 1 ]; then order=("$@"); else
    order=(); for ((i = $#; i >= 1; i--)); do order+=("${!i}"); done
  fi
  for c in "${order[@]}"; do run "$c" "$round"; done
done
python3 "$REPO/bench/bisect_table.py" "$BISECT_OUT" "$@"
