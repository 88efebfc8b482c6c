"""basalt.v1 without Basalt's SDK (issue 19 §4): a client that uses only the
generated stubs and grpc (tests/interop/basalt-v1-python/client.py, run in its
own interpreter) produces, consumes with decoded messages and a byte cap, and
commits offsets through the pull-service alone, against ``basalt cluster up``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.processes import local_cluster

pytestmark = pytest.mark.slow

CLIENT = Path(__file__).resolve().parents[1] / "interop" / "basalt-v1-python" / "client.py"


def test_a_client_of_only_the_generated_stubs_produces_consumes_and_commits(
    tmp_path: Path,
) -> None:
    with local_cluster(tmp_path / ".basalt") as rows:
        address = {r["role"]: r["address"] for r in rows}
        done = subprocess.run(
            [
                sys.executable,
                str(CLIENT),
                address["admin"],
                address["pull-service"],
                "Interop",
                "G",
            ],
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
