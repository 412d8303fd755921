# quorumq: `make cluster` starts a local three-node cluster, `make test` runs every test.
#
# One cargo profile (debug) and one target directory everywhere, so RocksDB's C++ is compiled
# once and shared by build, test and CI. Override CARGO_TARGET_DIR to move it.

CARGO_TARGET_DIR ?= $(HOME)/.cache/quorumq/target
export CARGO_TARGET_DIR
QQ_NODE_BIN ?= $(CARGO_TARGET_DIR)/debug/qq-node
QQCTL_BIN ?= $(CARGO_TARGET_DIR)/debug/qqctl
export QQ_NODE_BIN QQCTL_BIN

# The previous release, for the rolling-upgrade test (tests/tests/cluster/rolling_upgrade.rs):
# its qq-node is built once from the release's commit, in a target directory of its own (so
# today's binaries are never overwritten), and kept under $(HOME)/.cache/quorumq/previous/.
PREVIOUS_RELEASE ?= 0.1.0
PREVIOUS_COMMIT ?= e344d9b
PREVIOUS_TARGET ?= $(HOME)/.cache/quorumq/release-builds
QQ_PREVIOUS_NODE_BIN ?= $(HOME)/.cache/quorumq/previous/$(PREVIOUS_COMMIT)/qq-node
export QQ_PREVIOUS_NODE_BIN

CARGO ?= cargo
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: previous-release amqp-diff bench-quick bench-quick-baseline check-core-purity all deps build cluster cluster-down clean-cluster test test-integration fmt fmt-check bench bench-deps chaos chaos-short chaos-short-amqp chaos-upgrade chaos-amqp sim sim-short sim-lockstep

all: build

# System packages the build needs (protoc for the proto crate, libclang for RocksDB's bindgen)
# and the tests may use (iptables, iproute2 for the chaos hosts, DejaVu Sans for the charts,
# headless Chromium and chromedriver for the management page's browser test).
# Installs only what is missing.
deps:
	@missing=""; \
	command -v protoc >/dev/null 2>&1 || missing="$$missing protobuf-compiler"; \
	ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	command -v clang >/dev/null 2>&1 || missing="$$missing clang"; \
	command -v curl >/dev/null 2>&1 || missing="$$missing curl"; \
	command -v iptables >/dev/null 2>&1 || missing="$$missing iptables"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	command -v tc >/dev/null 2>&1 || missing="$$missing iproute2"; \
	python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || missing="$$missing python3-venv"; \
	[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing="$$missing fonts-dejavu-core"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	[ -x /usr/bin/chromedriver ] || missing="$$missing chromium-driver"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; \
	fi

build: deps
	$(CARGO) build --workspace --all-targets

# Release $(PREVIOUS_RELEASE)'s qq-node (commit $(PREVIOUS_COMMIT), from this repository's
# history): about 15 minutes the first time (RocksDB), then nothing.
previous-release: deps
	@if [ ! -x "$(QQ_PREVIOUS_NODE_BIN)" ]; then \
		set -e; src=$$(mktemp -d); \
		echo "building release $(PREVIOUS_RELEASE)'s qq-node from $(PREVIOUS_COMMIT) in $$src"; \
		git archive $(PREVIOUS_COMMIT) | tar -x -C $$src; \
		(cd $$src && CARGO_TARGET_DIR=$(PREVIOUS_TARGET) $(CARGO) build -p qq-node); \
		mkdir -p $$(dirname "$(QQ_PREVIOUS_NODE_BIN)"); \
		cp $(PREVIOUS_TARGET)/debug/qq-node "$(QQ_PREVIOUS_NODE_BIN)"; \
		rm -rf $$src; \
	fi
	@echo "previous release $(PREVIOUS_RELEASE): $(QQ_PREVIOUS_NODE_BIN)"

# Three nodes in the background (cluster/node{1,2,3}.toml), from the repository root.
cluster: deps build
	cluster/up.sh

cluster-down:
	cluster/down.sh

clean-cluster: cluster-down
	rm -rf .qq-cluster

# Every test of the workspace. The integration tests (tests/, crate qq-tests) start real
# qq-node processes; they run one cluster at a time by themselves (a lock in TestCluster), so
# no --test-threads is needed on a 2-core machine. Always --workspace: selecting single
# packages changes feature unification and makes cargo rebuild RocksDB.
test: deps build previous-release check-core-purity deploy-check
	$(CARGO) test --workspace
	$(MAKE) --no-print-directory sim-short
	$(MAKE) --no-print-directory chaos-short
	$(MAKE) --no-print-directory chaos-short-amqp
	$(MAKE) --no-print-directory chaos-upgrade

# Chaos runs (qq-chaos): a three-node cluster in network namespaces, cut, killed and paused
# while a workload runs; the checker fails the run if a confirmed message is lost, a dead
# letter is wrong or missing, or the replicas disagree. Needs root (namespaces, iptables).
# Reports, histories, timelines and node logs go to .qq-chaos/.
# qq-chaos exits 0 on PASS, 1 on FAIL, 2 when it could not run, and 3 on SKIPPED or PARTIAL: no
# check failed but a nemesis asked for injected no fault (docs/chaos.md "Results"). The runs of
# `make test` fail on any of them: their nemeses always strike here (a unit test checks their
# schedules). The matrices accept 3: netem is missing on kernels without sch_netem, and the
# combined run has room for fewer faults than kinds; the table's result column says which.
QQ_CHAOS_BIN ?= $(CARGO_TARGET_DIR)/debug/qq-chaos
CHAOS_SEED ?= 42
CHAOS_DURATION ?= 150

# Appended to a matrix's command: exit 3 (SKIPPED or PARTIAL) is reported, not failed.
CHAOS_PARTIAL_OK = || { status=$$?; [ $$status -eq 3 ] && echo "chaos: not every nemesis injected a fault (result column of the matrix)"; [ $$status -eq 3 ]; }

# About a minute of partitions plus leader kills with a fixed seed: part of `make test`.
chaos-short: deps build
	$(SUDO) $(QQ_CHAOS_BIN) --scenario short --node-bin $(QQ_NODE_BIN)

# The same over AMQP 0-9-1: lapin clients that reconnect, republish and resubscribe (docs/amqp.md
# "Chaos over AMQP"). Part of `make test`.
chaos-short-amqp: deps build
	$(SUDO) $(QQ_CHAOS_BIN) --scenario short-amqp --node-bin $(QQ_NODE_BIN)

# A rolling upgrade under load: the nodes start with the previous release's qq-node and the
# rolling-restart nemesis moves each to today's (lost 0, unexpected 0, every node upgraded).
# Part of `make test`, about 2.5 minutes.
chaos-upgrade: deps build previous-release
	$(SUDO) $(QQ_CHAOS_BIN) --scenario upgrade --node-bin $(QQ_NODE_BIN) \
		--start-bin $(QQ_PREVIOUS_NODE_BIN)

# The cluster simulator (qq-sim, docs/simulation.md): three nodes in one process on a simulated
# network, under a plan of faults drawn from a seed (partitions, one-way cuts, bridges, delay,
# loss, resets, crashes, pauses, clock skew), with the chaos workload and checks. No root needed.
# `make sim` runs SEEDS new seeds (from FIRST_SEED, default: the time; PROTOCOL=amqp for the AMQP
# workload); a failing seed prints the
# command that replays it. `make sim-short`, part of `make test`, runs the regression seeds in
# crates/qq-sim/seeds.txt (about 50 s each), the first of them again over AMQP 0-9-1. Traces and
# reports go to .qq-sim/.
QQ_SIM_BIN ?= $(CARGO_TARGET_DIR)/debug/qq-sim
SEEDS ?= 10
SIM_DURATION ?= 30
sim: deps build
	$(QQ_SIM_BIN) --seeds $(SEEDS) --duration $(SIM_DURATION) $(if $(FIRST_SEED),--first-seed $(FIRST_SEED)) \
		$(if $(PROTOCOL),--protocol $(PROTOCOL))

# `make sim-lockstep` runs SEEDS seeds on one schedule (every node on one thread and one
# virtual clock, docs/simulation.md "One schedule"), each replayed with the command it prints:
# 600 messages through one queue, or with CHAOS=S the chaos workload for S seconds (with the
# plan's membership change and wiped disk); NODES=3..5. Its regression seeds run in
# `make test` (qq-sim's replay tests).
sim-lockstep: deps build
	$(QQ_SIM_BIN) --lockstep --seeds $(SEEDS) $(if $(FIRST_SEED),--first-seed $(FIRST_SEED)) \
		$(if $(CHAOS),--chaos $(CHAOS)) $(if $(NODES),--nodes $(NODES))

SIM_SEEDS = $$(grep -o '^[0-9]\+' crates/qq-sim/seeds.txt | paste -sd, -)
sim-short: deps build
	$(QQ_SIM_BIN) --duration $(SIM_DURATION) --seed-list $(SIM_SEEDS)
	$(QQ_SIM_BIN) --duration $(SIM_DURATION) --protocol amqp --seed-list $$(grep -o '^[0-9]\+' crates/qq-sim/seeds.txt | head -1)

# The AMQP differential test: the scripted sessions of tests/amqp/diff.py against the local
# cluster (`make cluster` first), compared field by field with RabbitMQ 3.10's recorded
# transcript; prints every difference not in tests/amqp/known-differences.json and exits 1 if
# there is one. AMQP_DIFF_REFERENCE=<file> compares with another recording.
AMQP_DIFF_REFERENCE ?= tests/amqp/rabbitmq-3.10.json
amqp-diff:
	bash tests/amqp/setup.sh
	$(QQCTL_BIN) put-user qqdiff-noconf --new-password qqdiff-noconf
	$(QQCTL_BIN) --vhost / set-permissions qqdiff-noconf --configure ''
	$(QQCTL_BIN) put-user qqdiff-novhost --new-password qqdiff-novhost
	python3 tests/amqp/diff.py record amqp://guest:guest@127.0.0.1:5672/%2f .qq-cluster/amqp-diff.json
	python3 tests/amqp/diff.py compare $(AMQP_DIFF_REFERENCE) .qq-cluster/amqp-diff.json

# The full matrix: every nemesis alone for CHAOS_DURATION seconds, then all of them together;
# prints one table (also .qq-chaos/matrix-seed-$(CHAOS_SEED)/matrix.md). About 40 minutes.
chaos: deps build
	$(SUDO) $(QQ_CHAOS_BIN) --matrix --nemesis all --seed $(CHAOS_SEED) \
		--duration $(CHAOS_DURATION) --node-bin $(QQ_NODE_BIN) $(CHAOS_PARTIAL_OK)

# Partitions and kills over AMQP 0-9-1: each nemesis alone for CHAOS_DURATION seconds, then
# together (.qq-chaos/matrix-seed-$(CHAOS_SEED)-amqp/matrix.md). About 17 minutes.
chaos-amqp: deps build
	$(SUDO) $(QQ_CHAOS_BIN) --matrix --nemesis partition-halves,isolate-leader,kill-leader \
		--seed $(CHAOS_SEED) --duration $(CHAOS_DURATION) --protocol amqp --node-bin $(QQ_NODE_BIN) \
		$(CHAOS_PARTIAL_OK)

# The queue state machine must stay pure: no async runtime, RPC, Raft or storage in qq-core's
# dependency tree (STYLE.md "A strict one-way crate graph").
check-core-purity:
	@if $(CARGO) tree -p qq-core -e normal --prefix none | grep -E '^(tokio|tonic|openraft|rocksdb|librocksdb-sys|prost) '; then \
		echo "qq-core must not depend on the crates above"; exit 1; \
	else echo "qq-core is pure: no tokio, tonic, openraft, rocksdb in its tree"; fi

# The Kubernetes manifests (deploy/kubernetes/*.yaml) against the API schemas of each version in
# KUBERNETES_VERSIONS, strictly (an unknown field fails), with the kubernetes-validate package
# from PyPI in a venv under ~/.cache/quorumq (Debian's pip refuses system installs; the venv
# needs python3-venv); then deploy/kubernetes/check.py: names that must agree across objects;
# then `systemd-analyze verify` of deploy/systemd/qq-node.service where systemd is installed.
DEPLOY_VENV ?= $(HOME)/.cache/quorumq/venv-deploy
KUBERNETES_VERSIONS ?= 1.28.0 1.37.0
.PHONY: deploy-check
deploy-check:
	@[ -x $(DEPLOY_VENV)/bin/kubernetes-validate ] || { python3 -m venv $(DEPLOY_VENV) && \
		$(DEPLOY_VENV)/bin/pip install --quiet 'kubernetes-validate==1.37.0'; }
	@for v in $(KUBERNETES_VERSIONS); do \
		$(DEPLOY_VENV)/bin/kubernetes-validate --strict --quiet -k $$v deploy/kubernetes/*.yaml || exit 1; \
		echo "deploy/kubernetes/*.yaml: valid against the Kubernetes $$v API schemas"; \
	done
	$(DEPLOY_VENV)/bin/python deploy/kubernetes/check.py deploy/kubernetes/*.yaml
	deploy/systemd/verify.sh

# Only the integration tests (still --workspace, for the reason above).
test-integration: deps build
	$(CARGO) test --workspace --test cluster

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check

# Side-by-side benchmark against RabbitMQ quorum queues (crates/qq-bench, bench/). Release
# build of every binary (never a single package: see above), then three quorumq nodes and three
# RabbitMQ nodes on loopback, every scenario against both (scenarios 1-4 also against quorumq's
# AMQP port with lapin, RabbitMQ's client: the qq/AMQP column); prints the table and writes
# bench/results/{results.json,results.md,latency.png}. BENCH_ARGS passes flags, e.g.
# `make bench BENCH_ARGS=--quick` (a smoke run) or `BENCH_ARGS='--scenarios 1,2'`.
# After it, the scale figures (issue 14) in runs of their own, each on fresh clusters:
# scenario 12 (declare rate, idle CPU and RSS, failover and restart with 1 000 and 10 000
# queues) into bench/results/scale/, then scenario 3 with 1 000 active queues into
# bench/results/scale-3/ (in one run, scenario 3's traffic left the nodes' memory in scenario
# 12's idle baseline); with --quick in BENCH_ARGS, their quick form. BENCH_SCALE_ARGS replaces
# those flags (both runs get them); BENCH_SCALE=0 skips these runs.
BENCH_ARGS ?=
BENCH_SCALE ?= 1
BENCH_SCALE_ARGS ?= $(if $(findstring --quick,$(BENCH_ARGS)),--quick,--many-queues 1000 --scale-queues 1000,10000)
bench: deps bench-deps
	$(CARGO) build --workspace --release --bins
	$(CARGO_TARGET_DIR)/release/qq-bench $(BENCH_ARGS)
	if [ "$(BENCH_SCALE)" != 0 ]; then \
	  $(CARGO_TARGET_DIR)/release/qq-bench --scenarios 12 --no-profile \
	    --out bench/results/scale $(BENCH_SCALE_ARGS) && \
	  $(CARGO_TARGET_DIR)/release/qq-bench --scenarios 3 --no-profile \
	    --out bench/results/scale-3 $(BENCH_SCALE_ARGS); \
	fi

# The quick check before merging a change on the hot path: quorumq alone, scenario 1 and
# scenario 2 at 4 000 msg/s, three runs on one fresh cluster (about 3 minutes after the build),
# medians printed beside the baseline's and as a ratio (bench/results/quick.json).
# bench-quick-baseline stores this machine's baseline (bench/results/quick-baseline.json):
# measure it on the commit you compare against. BENCH_QUICK_ARGS adds flags (e.g. --runs 5).
BENCH_QUICK_ARGS ?=
bench-quick: deps
	$(CARGO) build --workspace --release --bins
	$(CARGO_TARGET_DIR)/release/qq-bench --quick-check --no-profile $(BENCH_QUICK_ARGS)

bench-quick-baseline: deps
	$(CARGO) build --workspace --release --bins
	$(CARGO_TARGET_DIR)/release/qq-bench --quick-check --no-profile --save-baseline $(BENCH_QUICK_ARGS)

# docs/benchmarks.md's current figures, made from bench/results/{,scale/,scale-3/}results.json
# by bench/docs.py (standard library only); run after `make bench`. `python3 bench/docs.py
# --check` exits 1 when the page no longer matches the result files.
.PHONY: bench-docs
bench-docs:
	python3 bench/docs.py

# What the benchmark needs besides the build: RabbitMQ (Debian's rabbitmq-server, kept from
# starting its default node), perf for the profile, DejaVu Sans for the plot.
bench-deps:
	bench/rabbitmq.sh install
	@missing=""; \
	command -v perf >/dev/null 2>&1 || missing="$$missing linux-perf"; \
	[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing="$$missing fonts-dejavu-core"; \
	[ -x /usr/bin/chromium ] || missing="$$missing chromium"; \
	[ -x /usr/bin/chromedriver ] || missing="$$missing chromium-driver"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; \
	fi
