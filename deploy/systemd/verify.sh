#!/usr/bin/env bash
# `systemd-analyze verify` of qq-node.service (part of `make deploy-check`); skipped, saying so,
# where systemd-analyze is missing. It checks that ExecStart= is executable, so the unit is
# verified as a copy whose ExecStart names a stand-in file. systemd-analyze exits 0 on unknown
# keys and bad values (it logs "ignoring"), so any output fails the check.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! command -v systemd-analyze >/dev/null; then
    echo "deploy/systemd: systemd-analyze not found; qq-node.service not verified"
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
install -m 0755 /dev/null "$tmp/qq-node"
sed "s#/usr/local/bin/qq-node#$tmp/qq-node#" "$here/qq-node.service" >"$tmp/qq-node.service"
out=$(systemd-analyze verify "$tmp/qq-node.service" 2>&1) || true
if [[ -n $out ]]; then
    echo "deploy/systemd/qq-node.service: systemd-analyze verify says:" >&2
    echo "${out//$tmp/deploy/systemd}" >&2
    exit 1
fi
echo "deploy/systemd/qq-node.service: systemd-analyze verify: no complaints"
