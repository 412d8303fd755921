# quorumq: `make cluster` starts a local three-node cluster, `make test` runs every test.
#
# One cargo profile (debug) and one target directory everywhere, so RocksDB's C++ is compiled
# once and shared by build, test and CI. Override CARGO_TARGET_DIR to move it.

CARGO_TARGET_DIR ?= $(HOME)/.cache/quorumq/target
export CARGO_TARGET_DIR
QQ_NODE_BIN ?= $(CARGO_TARGET_DIR)/debug/qq-node
QQCTL_BIN ?= $(CARGO_TARGET_DIR)/debug/qqctl
export QQ_NODE_BIN QQCTL_BIN

CARGO ?= cargo
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps build cluster cluster-down clean-cluster test test-unit test-integration fmt fmt-check

all: build

# System packages the build needs (protoc for the proto crate, libclang for RocksDB's bindgen)
# and the tests may use (iptables, iproute2). Installs only what is missing.
deps:
	@missing=""; \
	command -v protoc >/dev/null 2>&1 || missing="$$missing protobuf-compiler"; \
	ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	command -v clang >/dev/null 2>&1 || missing="$$missing clang"; \
	command -v iptables >/dev/null 2>&1 || missing="$$missing iptables"; \
	command -v ip >/dev/null 2>&1 || missing="$$missing iproute2"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		$(SUDO) apt-get update && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y $$missing; \
	fi

build: deps
	$(CARGO) build --workspace --all-targets

# Three nodes in the background (cluster/node{1,2,3}.toml), from the repository root.
cluster: deps build
	cluster/up.sh

cluster-down:
	cluster/down.sh

clean-cluster: cluster-down
	rm -rf .qq-cluster

# Unit and property tests in parallel, then the integration tests (qq-tests) one at a time:
# each starts a real cluster of qq-node processes, and the machine may have only 2 cores.
test: deps build test-unit test-integration

test-unit:
	$(CARGO) test --workspace --exclude qq-tests

test-integration:
	$(CARGO) test -p qq-tests -- --test-threads=1

fmt:
	$(CARGO) fmt --all

fmt-check:
	$(CARGO) fmt --all -- --check
