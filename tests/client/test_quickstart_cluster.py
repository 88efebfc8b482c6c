"""What a newcomer meets with ``basalt cluster up``, ``produce``, ``consume`` and the
admin verbs, run from a directory below the cluster's: real processes.

The cluster's data dir is ``<tmp>/.basalt`` and every command runs in
``<tmp>/work/sub`` with no address flag, so each finds the cluster upward.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.support.processes import local_cluster, run_basalt_sync

pytestmark = pytest.mark.slow

ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def test_a_newcomers_session_finds_the_cluster_and_reads_plainly(tmp_path: Path) -> None:
    here = tmp_path / "work" / "sub"
    here.mkdir(parents=True)
    no_env = {"BASALT_ETCD": "", "BASALT_ENDPOINTS": ""}

    def basalt(*argv: str, **env: str) -> tuple[int, str, str]:
        done = run_basalt_sync(*argv, env={**no_env, **env}, cwd=here)
        return done.returncode, done.stdout, done.stderr

    with local_cluster(tmp_path / ".basalt", "--store-nodes", "2") as rows:
        store_node = next(r["address"] for r in rows if r["role"] == "store-node")
        pull_service = next(r["address"] for r in rows if r["role"] == "pull-service")

        # An auto-created topic (TBW102's route), found through ../../.basalt.
        code, out, err = basalt("produce", "-t", "Newcomer", "-n", "6", "--size", "100")
        assert code == 0, err
        msg_id = re.search(r"msgId=([0-9A-F]+),", out)
        assert msg_id is not None, out

        code, out, err = basalt("consume", "-t", "Newcomer", "-g", "G1", "--idle-ms", "500")
        assert code == 0, err
        lines = [line for line in out.splitlines() if line.startswith("Newcomer ")]
        assert len(lines) == 6
        assert {re.search(r"broker=(\S+)", line)[1] for line in lines} <= {  # type: ignore[index]
            "broker-a",
            "broker-b",
        }
        assert all(line.endswith("... (100 bytes)") for line in lines)

        # A bad SQL92 filter: one clear error, before any fetch (no warnings per queue).
        code, _, err = basalt("consume", "-t", "Newcomer", "-g", "G2", "--sql", "a >")
        assert code == 1 and "SUBSCRIPTION_PARSE_FAILED" in err
        assert len(err.strip().splitlines()) == 1, err

        # The msgId produce printed (the UNIQ_KEY) finds the message.
        code, out, err = basalt("admin", "queryMsgById", "-i", msg_id[1], "--json")
        assert code == 0, err
        (found,) = json.loads(out)
        assert found["msg_id"] == msg_id[1] and found["broker"] in ("broker-a", "broker-b")
        assert ISO_MS.match(found["store_time"]) and found["store_ms"] > 0

        code, out, err = basalt("admin", "topicStatus", "-t", "Newcomer", "--json")
        assert code == 0, err
        stored = [q for q in json.loads(out) if q["max_offset"]]
        assert stored and all(ISO_MS.match(q["last_update"]) for q in stored)
        code, out, _ = basalt("admin", "topicStatus", "-t", "Newcomer")
        assert "last_update_ms" not in out and re.search(r"\dT\d\d:\d\d:\d\d\.\d{3}Z", out)

        code, out, err = basalt("admin", "consumerProgress", "-g", "G1", "--json")
        assert code == 0, err
        progress = json.loads(out)
        assert all(q["topic"] == "Newcomer" for q in progress["queues"])
        assert progress["total"] == {"broker_offset": 6, "lag": 0}

        # A store-node's address where a pull-service's belongs: said so.
        code, _, err = basalt("consume", "-t", "Newcomer", "-g", "G1", "--endpoints", store_node)
        assert code == 1
        assert f"{store_node} is not a pull-service (it does not serve basalt.v1.PullService" in err

        # The environment beats the directory.
        code, _, err = basalt(
            "consume", "-t", "Newcomer", "-g", "G3", "--count", "1", BASALT_ENDPOINTS=store_node
        )
        assert code == 1 and "is not a pull-service" in err
        code, _, err = basalt(
            "consume", "-t", "Newcomer", "-g", "G3", "--count", "1", BASALT_ENDPOINTS=pull_service
        )
        assert code == 0, err

        # `cluster status` finds the cluster upward too.
        code, out, err = basalt("cluster", "status", "--json")
        assert code == 0, err
        assert {row["address"] for row in json.loads(out)} >= {store_node, pull_service}

    # Nothing running any more, nothing given: the message names every place looked.
    code, _, err = basalt("admin", "topicList")
    assert code == 2
    assert "no --etcd, no BASALT_ETCD in the environment" in err and ".basalt" in err
