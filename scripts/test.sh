#!/usr/bin/env bash
# The one test command: creates or reuses .venv, installs Basalt with its dev
# tools, then runs the linters, the type checker and the whole pytest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# The end-to-end metrics tests scrape a cluster with a real Prometheus
# (Debian's package; CI runs this as root on a fresh machine).
# tests/deploy/test_compose.py runs docker compose on Debian's engine and a debootstrapped base.
command -v prometheus >/dev/null && command -v dockerd >/dev/null && command -v debootstrap >/dev/null ||
    (DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus docker.io debootstrap ||
        (apt-get update -q &&
            DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus docker.io debootstrap))
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install -qq -e '.[dev,server,spark]' --config-settings editable_mode=strict
.venv/bin/ruff check .
.venv/bin/mypy
exec .venv/bin/python -m pytest "$@"
