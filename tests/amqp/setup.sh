#!/usr/bin/env bash
# Installs the Python client the AMQP tests use (pika, pinned in requirements.txt) when it is
# not importable yet. Safe to run again: it does nothing once pika imports.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if ! python3 -c 'import pika' 2>/dev/null; then
    python3 -m pip install --quiet -r "$here/requirements.txt"
fi
