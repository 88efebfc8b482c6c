"""``basalt admin <verb>`` run as a user would (``python -m basalt.admin`` processes)
against real etcd, store-nodes and a pull-service."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from basalt.services.meta import MetaConfig
from basalt.v1 import common_pb2 as pb
from tests.support.aio import async_test
from tests.support.nodes import TOPIC, cluster
from tests.support.processes import run_basalt as basalt
from tests.support.sessions import Consumer
from tests.support.stores import wait_indexed as store_wait_indexed
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_topics_status_progress_and_cluster_list(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, topic=None) as h:
        etcd = ("--etcd", meta_config.endpoints[0], "--cluster", meta_config.cluster)
        ep = ("--endpoints", h.services[0].address)

        code, out, err = await basalt(
            "admin", "updateTopic", "-t", "Orders", "-r", "4", "-w", "4", *etcd
        )
        assert code == 0, err
        assert "Orders" in out and "created" in out and "broker-a,broker-b" in out
        code, out, _ = await basalt("admin", "updateTopic", "-t", "Orders", "-w", "2", *etcd)
        assert "updated" in out
        code, out, _ = await basalt("admin", "topicRoute", "-t", "Orders", "--json", *etcd)
        route = json.loads(out)
        assert [(r["broker"], r["read_queue_nums"], r["write_queue_nums"]) for r in route] == [
            ("broker-a", 4, 2),
            ("broker-b", 4, 2),
        ]
        code, out, _ = await basalt("admin", "topicList", *etcd)
        assert out.splitlines()[2:] == ["Orders"]

        await h.seen(lambda s: s.servicer.view.topics.get("Orders") is not None)
        code, _, err = await basalt("produce", *ep, "-t", "Orders", "-n", "20", "--size", "8")
        assert code == 0, err
        code, out, _ = await basalt("admin", "topicStatus", "-t", "Orders", "--json", *etcd)
        status = json.loads(out)
        assert len(status) == 8  # 2 store-nodes x 4 read queues
        assert sum(r["max_offset"] for r in status) == 20
        assert all(r["last_update_ms"] > 0 for r in status if r["max_offset"])
        assert all(r["max_offset"] == 0 for r in status if r["queue"] >= 2)  # write 2

        code, _, err = await basalt(
            "consume", *ep, "-t", "Orders", "-g", "G1", "--count", "12", "--idle-ms", "300"
        )
        assert code == 0, err
        code, out, err = await basalt("admin", "consumerProgress", "-g", "G1", *etcd)
        assert code == 0, err
        total = [line for line in out.splitlines() if line.startswith("(total)")]
        assert total and total[0].split()[-2:] == ["20", "8"]  # 20 stored, 8 behind

        code, out, _ = await basalt("admin", "clusterList", "--json", *etcd)
        assert [b["broker"] for b in json.loads(out)] == ["broker-a", "broker-b"]

        # Clear errors, exit status 1, for what does not exist.
        code, _, err = await basalt("admin", "topicStatus", "-t", "Nope", *etcd)
        assert code == 1 and "topic 'Nope' does not exist" in err
        code, _, err = await basalt("admin", "consumerProgress", "-g", "Nobody", *etcd)
        assert code == 1 and "has no offsets" in err
        code, _, err = await basalt("admin", "updateTopic", "-t", "X", "-b", "broker-z", *etcd)
        assert code == 1 and "broker-z" in err
        code, out, _ = await basalt("admin", "deleteTopic", "-t", "Orders", *etcd)
        assert code == 0 and "deleted" in out
        code, _, err = await basalt("admin", "deleteTopic", "-t", "Orders", *etcd)
        assert code == 1 and "does not exist" in err


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_unreachable_etcd_is_a_clear_failure() -> None:
    from basalt.services.cluster.etcd import free_port

    code, _, err = await basalt("admin", "topicList", "--etcd", f"127.0.0.1:{free_port()}")
    assert code == 1 and "etcd" in err


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_message_queries_consumer_connection_and_broker_status(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        etcd = ("--etcd", meta_config.endpoints[0], "--cluster", meta_config.cluster, "--json")
        ep = ("--endpoints", h.services[0].address)
        code, _, err = await basalt("produce", *ep, "-t", TOPIC, "-n", "10", "--tags", "T")
        assert code == 0, err
        await wait_indexed(h)
        code, out, err = await basalt("admin", "queryMsgByKey", "-t", TOPIC, "-k", "key-3", *etcd)
        assert code == 0, err
        (found,) = json.loads(out)
        assert found["keys"] == "key-3" and found["tags"] == "T"
        code, out, err = await basalt("admin", "queryMsgById", "-i", found["offset_msg_id"], *etcd)
        assert code == 0, err
        assert json.loads(out) == [found]
        code, _, err = await basalt("admin", "queryMsgById", "-i", "nothex", *etcd)
        assert code == 1 and "not an offset message id" in err
        # The producer's message id (UNIQ_KEY) works too, in its topic or in every topic.
        for narrowed in ((), ("-t", TOPIC)):
            code, out, err = await basalt(
                "admin", "queryMsgById", "-i", found["msg_id"], *narrowed, *etcd
            )
            assert code == 0, err
            assert json.loads(out) == [found]
        code, _, err = await basalt("admin", "queryMsgById", "-i", "0" * 32, *etcd)
        assert code == 1 and "give the msgId or offsetMsgId a send printed" in err

        code, out, _ = await basalt("admin", "brokerStatus", "-b", "broker-a", *etcd)
        status = {r["key"]: r["value"] for r in json.loads(out)}
        assert status["brokerName"] == "broker-a" and int(status["commitLogMaxOffset"]) > 0
        code, _, err = await basalt("admin", "brokerStatus", "-b", "broker-z", *etcd)
        assert code == 1 and "broker-z" in err

        code, _, err = await basalt("admin", "consumerConnection", "-g", "G", *etcd)
        assert code == 1 and "no live consumer" in err
        consumer = Consumer(h.stub, "c1", group="G")
        await consumer.open(pb.TopicSubscription(topic=TOPIC))
        code, out, err = await basalt("admin", "consumerConnection", "-g", "G", *etcd)
        assert code == 0, err
        (row,) = json.loads(out)
        assert (row["client_id"], row["pull_service"]) == ("c1", "ps-1")
        assert row["connected_since_ms"] > 0 and TOPIC in row["subscriptions"]
        await consumer.close()


async def wait_indexed(h) -> None:  # type: ignore[no-untyped-def]
    """Until both store-nodes' IndexFiles have caught up (tests.support.stores' wait,
    off the event loop that serves them)."""
    for node in h.nodes.values():
        await asyncio.to_thread(store_wait_indexed, node.store)
