"""The official Apache RocketMQ 5 clients the v2 front is tested with
(tests/interop/): run as subprocesses, never imported (the Python client
registers apache.rocketmq.v2 in protobuf's process-wide pool, as
basalt.rocketmq.v2 does)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from basalt.common.auth import Credentials
from tests.support.processes import REPO_ROOT

INTEROP = REPO_ROOT / "tests" / "interop"
NODE = INTEROP / "node"

#: Command lines of each client's producer script (endpoints appended; messages
#: as JSON on stdin, receipts as one JSON line on stdout).
PRODUCERS = {
    "python": [sys.executable, str(INTEROP / "python" / "produce.py")],
    "node": ["node", str(NODE / "produce.js")],
}


#: Command lines of each client's SimpleConsumer scenario (tests/interop/*/simple*).
SIMPLE_CONSUMERS = {
    "python": [sys.executable, str(INTEROP / "python" / "simple.py")],
    "node": ["node", str(NODE / "simple.js")],
}
#: Command lines of each client's PushConsumer (tests/interop/*/push*).
PUSH_CONSUMERS = {
    "python": [sys.executable, str(INTEROP / "python" / "push.py")],
    "node": ["node", str(NODE / "push.js")],
}


def run_client(
    command: list[str],
    endpoints: str,
    spec: dict[str, Any],
    timeout_s: float = 60,
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Any:
    """Run an interop script (``args`` after the endpoints, ``env`` added to
    this process's) with ``spec`` as JSON on stdin; the JSON of its last
    stdout line. Asserts it exits 0 (its output in the message)."""
    run = subprocess.run(
        [*command, endpoints, *args], input=json.dumps(spec), capture_output=True, text=True,
        timeout=timeout_s, check=False, env=None if env is None else {**os.environ, **env},
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1])


def produce_signed(
    client: str,
    endpoints: str,
    topic: str,
    credentials: Credentials | None,
    *,
    args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> list[Any]:
    """One message ``from <client>`` to ``topic`` by that official client's
    producer, signed with ``credentials`` (None: unsigned); its receipts. The
    Python client stamps local time with a Z (docs/security.md): run in UTC."""
    spec: dict[str, Any] = {"topic": topic, "messages": [{"body": f"from {client}"}]}
    if credentials is not None:
        spec["credentials"] = {
            "accessKey": credentials.access_key,
            "secretKey": credentials.secret_key,
        }
    out: list[Any] = run_client(
        PRODUCERS[client], endpoints, spec, args=args, env={"TZ": "UTC", **(env or {})}
    )
    return out


def ensure_node_modules() -> None:
    """``npm ci`` in tests/interop/node once, when node_modules is missing
    (package-lock.json pins rocketmq-client-nodejs 1.0.8 and @grpc/grpc-js)."""
    if (NODE / "node_modules").is_dir():
        return
    npm = shutil.which("npm")
    assert npm is not None, "npm is needed for the Node.js interop tests"
    subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=NODE, check=True, timeout=300)
