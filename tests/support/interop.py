"""The official Apache RocketMQ 5 clients the v2 front is tested with
(tests/interop/): run as subprocesses, never imported (the Python client
registers apache.rocketmq.v2 in protobuf's process-wide pool, as
basalt.rocketmq.v2 does)."""

from __future__ import annotations

import shutil
import subprocess
import sys

from tests.support.processes import REPO_ROOT

INTEROP = REPO_ROOT / "tests" / "interop"
NODE = INTEROP / "node"

#: Command lines of each client's producer script (endpoints appended; messages
#: as JSON on stdin, receipts as one JSON line on stdout).
PRODUCERS = {
    "python": [sys.executable, str(INTEROP / "python" / "produce.py")],
    "node": ["node", str(NODE / "produce.js")],
}


def ensure_node_modules() -> None:
    """``npm ci`` in tests/interop/node once, when node_modules is missing
    (package-lock.json pins rocketmq-client-nodejs 1.0.8 and @grpc/grpc-js)."""
    if (NODE / "node_modules").is_dir():
        return
    npm = shutil.which("npm")
    assert npm is not None, "npm is needed for the Node.js interop tests"
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE, check=True, timeout=300)
