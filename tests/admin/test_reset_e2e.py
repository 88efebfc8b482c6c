"""``basalt admin resetOffsetByTime`` on a ``basalt cluster up`` cluster (real
etcd, store-node and pull-service processes) with three push consumers in
their own processes and a producer sending all along: the command returns once
every consumer confirmed, and each queue is consumed again from exactly the
reset point the table shows, which is what SearchOffset gives."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import grpc
import pytest

from basalt.services.cluster.local import CLUSTER_NAME
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.aio import async_test
from tests.support.consumers import assert_one_jump_back, every_queue_jumped_back, producing
from tests.support.polling import eventually
from tests.support.processes import local_cluster
from tests.support.processes import run_basalt as basalt
from tests.support.push_worker import calls, worker
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S

pytestmark = pytest.mark.slow

TOPIC = "ResetE2E"
GROUP = "RG"


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_reset_by_time_with_three_push_consumers_under_production(tmp_path: Path) -> None:
    log = tmp_path / "consumed.log"
    with local_cluster(tmp_path / "cluster") as rows:
        procs = {p["name"]: p for p in rows} | {p["role"]: p for p in rows}
        address = procs["pull-service"]["address"]
        etcd = procs["etcd"]["address"]
        meta_config = MetaConfig(endpoints=(etcd,), cluster=CLUSTER_NAME)
        async with MetaClient(meta_config) as meta:
            await meta.create_topic(
                TopicConfig(
                    topic_name=TOPIC,
                    read_queue_nums=4,
                    write_queue_nums=4,
                    brokers=("broker-a", "broker-b"),
                )
            )
            async with (
                producing(address, TOPIC, pause_s=0.003),
                worker(address, "C1", log, GROUP, TOPIC, "orderly"),
                worker(address, "C2", log, GROUP, TOPIC, "orderly"),
                worker(address, "C3", log, GROUP, TOPIC, "orderly"),
            ):

                async def spread() -> bool:
                    owners = await meta.queue_lock_owners(GROUP)
                    return len(owners) == 8 and set(owners.values()) == {"C1", "C2", "C3"}

                await eventually(spread, timeout_s=30)
                await asyncio.sleep(1.0)
                point = int(time.time() * 1000) - 500
                code, out, err = await basalt(
                    "admin", "resetOffsetByTime", "-g", GROUP, "-t", TOPIC, "-s", str(point),
                    "--etcd", etcd, "--cluster", CLUSTER_NAME, "--json",
                )  # fmt: skip
                assert code == 0, err
                result = json.loads(out)
                reset_to = {
                    (r["broker"], r["queue"]): r["offset"] for r in result if r["queue"] != ""
                }

                def resumed() -> bool:  # consumption goes on from the reset points
                    ordered = sorted(calls(log), key=lambda c: c.start)
                    return every_queue_jumped_back(((c.queue, c.offset) for c in ordered), reset_to)

                await eventually(resumed, timeout_s=30, interval_s=0.1)
            assert len(reset_to) == 8
            confirmed = {r["broker"] for r in result if r["result"] == "OK"}
            assert confirmed == {"consumer C1", "consumer C2", "consumer C3"}, result
            for (broker, qid), offset in reset_to.items():
                async with grpc.aio.insecure_channel(procs[broker]["address"]) as channel:
                    search = await sn_grpc.StoreNodeStub(channel).SearchOffset(
                        sn.SearchOffsetRequest(topic=TOPIC, queue_id=qid, timestamp_ms=point)
                    )
                assert offset == search.offset
        # Orderly listeners, so by call start each queue's offsets only go up
        # (a queue handed over goes on after the last offset consumed: the giver
        # commits the calls that ended, even those whose awaiting task its drop
        # cancelled) but for one jump back, to the queue's reset point.
        ordered = sorted(calls(log), key=lambda c: c.start)
        assert_one_jump_back(((c.queue, c.offset) for c in ordered), reset_to)
