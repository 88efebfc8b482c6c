"""``basalt admin shrinkTopic`` 8 -> 4 under load: nothing stranded, nothing lost
(real etcd, store-nodes, a pull-service, the SDK's producer and consumer)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from basalt.client import ClientError, ConsumeFromWhere, LitePullConfig, LitePullConsumer, Producer
from basalt.common.message import Message
from basalt.services.meta import MetaConfig
from basalt.v1 import common_pb2 as pb
from tests.support.aio import async_test
from tests.support.nodes import cluster
from tests.support.processes import run_basalt as basalt
from tests.support.sessions import Consumer
from tests.support.timeouts import SUBPROCESS_TEST_TIMEOUT_S


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_shrink_8_to_4_under_load_strands_and_loses_nothing(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, topic=None) as h:
        etcd = ("--etcd", meta_config.endpoints[0], "--cluster", meta_config.cluster)
        code, _, err = await basalt(
            "admin", "updateTopic", "-t", "Shrink", "-r", "8", "-w", "8", *etcd
        )
        assert code == 0, err
        await h.seen(lambda s: s.servicer.view.topics.get("Shrink") is not None)
        code, out, err = await basalt("admin", "shrinkTopic", "-t", "Shrink", "-n", "8", *etcd)
        assert code == 0 and "already 8" in out, err

        session = Consumer(h.stub, "c1", group="G")
        await session.open(pb.TopicSubscription(topic="Shrink"))
        address = h.services[0].address
        acked: set[str] = set()
        got: list[str] = []
        stop = asyncio.Event()

        async def produce() -> None:
            async with Producer(address, group="P") as producer:
                while not stop.is_set():
                    for r in await producer.send_batch([Message("Shrink", b"x")] * 5):
                        acked.add(r.msg_id)
                    await asyncio.sleep(0.005)

        async def consume() -> None:
            config = LitePullConfig(
                consumer_group="G", consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET
            )
            async with LitePullConsumer(address, config=config) as consumer:
                await consumer.assign(await consumer.queues_of("Shrink"))
                idle = 0
                while idle < 3 or not stop.is_set():
                    try:
                        records = await consumer.poll(timeout_ms=200)
                    except ClientError:  # read queues lowered: follow the route
                        await consumer.assign(await consumer.queues_of("Shrink"))
                        continue
                    got.extend(r.uniq_key or "" for r in records)
                    await consumer.commit()
                    idle = 0 if records else idle + 1

        tasks = [asyncio.ensure_future(produce()), asyncio.ensure_future(consume())]
        await asyncio.sleep(1.0)
        code, out, err = await basalt(
            "admin", "shrinkTopic", "-t", "Shrink", "-n", "4", "--wait-s", "30", *etcd
        )
        assert code == 0, err + out
        assert "write_queue_nums -> 4" in out and "read_queue_nums -> 4" in out
        await asyncio.sleep(1.0)  # more sends, now on 4 queues only
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
        await session.close()

        assert len(acked) > 100
        assert sorted(got) == sorted(acked)  # every acknowledged message, once
        code, out, _ = await basalt("admin", "topicRoute", "-t", "Shrink", "--json", *etcd)
        assert {(r["read_queue_nums"], r["write_queue_nums"]) for r in json.loads(out)} == {(4, 4)}


@async_test(timeout_s=SUBPROCESS_TEST_TIMEOUT_S)
async def test_update_topic_never_strands_and_an_unread_empty_topic_shrinks_at_once(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, topic=None) as h:
        etcd = ("--etcd", meta_config.endpoints[0], "--cluster", meta_config.cluster)
        for topic in ("Keep", "Empty"):
            code, _, err = await basalt(
                "admin", "updateTopic", "-t", topic, "-r", "4", "-w", "4", *etcd
            )
            assert code == 0, err
        await h.seen(lambda s: s.servicer.view.topics.get("Keep") is not None)
        ep = ("--endpoints", h.services[0].address)
        code, _, err = await basalt("produce", *ep, "-t", "Keep", "-n", "16", "--size", "8")
        assert code == 0, err

        # updateTopic lowers write at once but keeps read while the removed
        # queues hold what no group was seen to consume, and says how to finish.
        code, out, err = await basalt(
            "admin", "updateTopic", "-t", "Keep", "-r", "2", "-w", "2", *etcd
        )
        assert code == 0, err
        assert "read_queue_nums kept at 4" in out and "shrinkTopic -t Keep -n 2" in out
        config = await h.meta.get_topic("Keep")
        assert config is not None
        assert (config.read_queue_nums, config.write_queue_nums) == (4, 2)
        # shrinkTopic will not guess: nobody subscribes, and the queues hold messages.
        code, _, err = await basalt("admin", "shrinkTopic", "-t", "Keep", "-n", "2", *etcd)
        assert code == 1 and "no live consumer subscribes" in err and "(-g)" in err
        assert "shrinkTopic -t Keep -n 2 -g GROUP --wait-s 60" in err

        # A topic nobody reads whose removed queues never held a message shrinks.
        code, out, err = await basalt("admin", "shrinkTopic", "-t", "Empty", "-n", "2", *etcd)
        assert code == 0, err
        assert "hold no message" in out
        config = await h.meta.get_topic("Empty")
        assert config is not None
        assert (config.read_queue_nums, config.write_queue_nums) == (2, 2)
