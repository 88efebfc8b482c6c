"""basalt.v1 without Basalt's SDK (issue 19 §4): clients that use only the
.proto files and gRPC, run in their own processes against ``basalt cluster up``,
produce, consume with decoded messages under a byte cap, and commit offsets
through the pull-service alone:

* Python, on the generated stubs only (tests/interop/basalt-v1-python/client.py),
  which reports that nothing of basalt.client, basalt.common or
  basalt.services was loaded;
* Node.js with @grpc/proto-loader (tests/interop/basalt-v1-node/client.js; its
  pinned packages installed by ``npm ci`` once, when node_modules is missing).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import local_cluster

pytestmark = pytest.mark.slow

INTEROP = Path(__file__).resolve().parents[1] / "interop"
PROTO = Path(__file__).resolve().parents[2] / "proto"
NODE_CLIENT = INTEROP / "basalt-v1-node"


@pytest.fixture(scope="module")
def addresses(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """One cluster for both clients (each uses its own topic and group)."""
    with local_cluster(tmp_path_factory.mktemp("interop") / ".basalt") as rows:
        yield {r["role"]: r["address"] for r in rows}


def node_command() -> list[str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    assert node and npm, "the Node.js interop test needs node and npm on PATH"
    if not (NODE_CLIENT / "node_modules").is_dir():
        subprocess.run(
            [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
            cwd=NODE_CLIENT,
            check=True,
            capture_output=True,
            timeout=300,
        )
    return [node, str(NODE_CLIENT / "client.js"), str(PROTO)]


@pytest.mark.parametrize("language", ["python", "node"])
def test_a_client_without_the_sdk_produces_consumes_and_commits(
    addresses: dict[str, str], language: str
) -> None:
    if language == "python":
        command = [sys.executable, str(INTEROP / "basalt-v1-python" / "client.py")]
    else:
        command = node_command()
    topic, group = f"Interop-{language}", f"G-{language}"
    done = subprocess.run(
        [*command, addresses["admin"], addresses["pull-service"], topic, group],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["loaded"] == []  # nothing of basalt.client, basalt.common, basalt.services
    received = seen["received"]
    assert [m["msg_id"] for m in received] == seen["sent"]
    assert [m["queue_offset"] for m in received] == list(range(6))
    assert [m["n"] for m in received] == [str(i) for i in range(6)]
    assert received[1]["tags"] == "odd" and received[1]["keys"] == ["key-1"]
    assert all(m["body_len"] == 300 for m in received)
    # The byte cap held every answer to two records, so it took several.
    assert max(seen["batches"]) <= 2 and sum(seen["batches"]) == 6
    assert seen["committed"] == 6
    assert seen["stale_code"] == "RESPONSE_CODE_STALE_RESET_EPOCH"
    assert seen["offset_after_reset"] == 0
    assert seen["epoch_after_reset"] > seen["epoch_before_reset"]
