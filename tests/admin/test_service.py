"""The Admin gRPC service on a real grpc.aio server (port 0) over real etcd,
store-nodes and a pull-service (:func:`tests.support.nodes.cluster`), and as a
real process.

Every refusal is checked for its gRPC status, its RocketMQ code and a message
saying what was wrong, and the service must answer the next call after each.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from basalt.services.cluster.etcd import EtcdProcess, free_port
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from basalt.v1 import admin_pb2 as adm
from basalt.v1 import admin_pb2_grpc as adm_grpc
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.etcd import unique_cluster
from tests.support.nodes import TOPIC, admin_server, cluster
from tests.support.polling import eventually
from tests.support.processes import ServiceProcess
from tests.support.rpc import refused
from tests.support.sessions import Consumer
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

Status = grpc.StatusCode


@asynccontextmanager
async def admin_service(meta_config: MetaConfig) -> AsyncIterator[adm_grpc.AdminAsyncStub]:
    """:func:`admin_server`, and a stub to it."""
    async with admin_server(meta_config) as address, grpc.aio.insecure_channel(address) as channel:
        yield adm_grpc.AdminStub(channel)


def topic_config(
    topic: str,
    read: int = 4,
    write: int = 4,
    perm: int = 6,
    brokers: tuple[str, ...] = (),
    order: bool = False,
) -> pb.TopicConfig:
    return pb.TopicConfig(
        topic=topic,
        read_queue_nums=read,
        write_queue_nums=write,
        perm=perm,
        brokers=brokers,
        order=order,
    )


def update(config: pb.TopicConfig, expected: int | None = None) -> adm.UpdateTopicRequest:
    request = adm.UpdateTopicRequest(config=config)
    if expected is not None:
        request.expected_mod_revision = expected
    return request


@async_test
async def test_topic_rpcs_create_read_compare_and_swap_and_delete(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, topic=None), admin_service(meta_config) as stub:
        assert list((await stub.TopicList(adm.TopicListRequest())).topics) == []

        # Write whatever is there: creates, on every registered store-node.
        created = await stub.UpdateTopic(update(topic_config("Orders")))
        assert created.config == topic_config("Orders", brokers=("broker-a", "broker-b"))
        assert created.mod_revision > 0
        got = await stub.GetTopic(adm.GetTopicRequest(topic="Orders"))
        assert (got.config, got.mod_revision) == (created.config, created.mod_revision)

        # At the revision read: written, and the revision moves on.
        changed = await stub.UpdateTopic(
            update(topic_config("Orders", write=2, order=True), created.mod_revision)
        )
        assert (changed.config.write_queue_nums, changed.config.order) == (2, True)
        assert list(changed.config.brokers) == ["broker-a", "broker-b"]  # empty: kept
        assert changed.mod_revision > created.mod_revision
        # At a stale revision: ABORTED, nothing written.
        status, code, message = await refused(
            stub.UpdateTopic(update(topic_config("Orders", write=1), created.mod_revision))
        )
        assert (status, code) == (Status.ABORTED, pb.RESPONSE_CODE_SYSTEM_BUSY)
        assert f"at mod revision {changed.mod_revision}, not at mod revision" in message
        after = await stub.GetTopic(adm.GetTopicRequest(topic="Orders"))
        assert (after.config, after.mod_revision) == (changed.config, changed.mod_revision)
        # Create only: the topic exists.
        status, code, message = await refused(stub.UpdateTopic(update(topic_config("Orders"), 0)))
        assert (status, code) == (Status.ALREADY_EXISTS, pb.RESPONSE_CODE_TOPIC_EXIST_ALREADY)
        assert "'Orders' already exists" in message
        # Create only, a new topic on one store-node; unset over an existing one.
        only_a = await stub.UpdateTopic(update(topic_config("Audit", brokers=("broker-a",)), 0))
        assert list(only_a.config.brokers) == ["broker-a"]
        overwrite = await stub.UpdateTopic(update(topic_config("Audit", read=8, write=8, perm=4)))
        assert overwrite.config == topic_config("Audit", 8, 8, 4, ("broker-a",))
        assert overwrite.mod_revision > only_a.mod_revision
        assert list((await stub.TopicList(adm.TopicListRequest())).topics) == ["Audit", "Orders"]

        # Delete: then it is unknown everywhere, and a write at a revision is ABORTED.
        await stub.DeleteTopic(adm.DeleteTopicRequest(topic="Audit"))
        for call in (
            stub.DeleteTopic(adm.DeleteTopicRequest(topic="Audit")),
            stub.GetTopic(adm.GetTopicRequest(topic="Audit")),
        ):
            status, code, message = await refused(call)
            assert (status, code) == (Status.NOT_FOUND, pb.RESPONSE_CODE_TOPIC_NOT_EXIST)
            assert message == "topic 'Audit' does not exist"
        status, code, message = await refused(
            stub.UpdateTopic(update(topic_config("Audit"), overwrite.mod_revision))
        )
        assert (status, code) == (Status.ABORTED, pb.RESPONSE_CODE_SYSTEM_BUSY)
        assert "'Audit' is deleted" in message
        assert list((await stub.TopicList(adm.TopicListRequest())).topics) == ["Orders"]


#: (request, status, code, what the message says): refused, nothing written.
BAD_UPDATES = [
    (
        update(topic_config("bad topic!")),
        Status.INVALID_ARGUMENT,
        pb.RESPONSE_CODE_MESSAGE_ILLEGAL,
        "topic 'bad topic!' is not 1-127 characters",
    ),
    (
        update(pb.TopicConfig()),  # no config at all: no topic name
        Status.INVALID_ARGUMENT,
        pb.RESPONSE_CODE_MESSAGE_ILLEGAL,
        "topic '' is not",
    ),
    (
        update(topic_config("Orders", read=0)),
        Status.INVALID_ARGUMENT,
        pb.RESPONSE_CODE_INVALID_PARAMETER,
        "read_queue_nums must be 1..1024, got 0",
    ),
    (
        update(topic_config("Orders", write=2000)),
        Status.INVALID_ARGUMENT,
        pb.RESPONSE_CODE_INVALID_PARAMETER,
        "write_queue_nums must be 1..1024, got 2000",
    ),
    (
        update(topic_config("Orders", write=-3)),
        Status.INVALID_ARGUMENT,
        pb.RESPONSE_CODE_INVALID_PARAMETER,
        "write_queue_nums must be 1..1024, got -3",
    ),
    (
        update(topic_config("Orders", perm=9)),
        Status.INVALID_ARGUMENT,
        pb.RESPONSE_CODE_INVALID_PARAMETER,
        "perm 9: RocketMQ's PermName bits, 0..7",
    ),
    (
        update(topic_config("Orders", brokers=("broker-a", "broker-a"))),
        Status.INVALID_ARGUMENT,
        pb.RESPONSE_CODE_INVALID_PARAMETER,
        "brokers lists a name twice",
    ),
    (
        update(topic_config("Orders", brokers=("no/slash",))),
        Status.INVALID_ARGUMENT,
        pb.RESPONSE_CODE_INVALID_PARAMETER,
        "broker name 'no/slash'",
    ),
    (
        update(topic_config("Orders"), -1),
        Status.INVALID_ARGUMENT,
        pb.RESPONSE_CODE_INVALID_PARAMETER,
        "expected_mod_revision -1",
    ),
    (
        update(topic_config("Orders", brokers=("broker-a", "broker-z"))),
        Status.UNAVAILABLE,
        pb.RESPONSE_CODE_BROKER_NOT_EXIST,
        "no registered store-node named broker-z",
    ),
]


@async_test
async def test_update_topic_refuses_bad_configs_and_writes_nothing(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config, topic=None), admin_service(meta_config) as stub:
        first = await stub.UpdateTopic(update(topic_config("Orders")))
        for request, status, code, says in BAD_UPDATES:
            got_status, got_code, message = await refused(stub.UpdateTopic(request))
            assert (got_status, got_code) == (status, code) and says in message, message
            got = await stub.GetTopic(adm.GetTopicRequest(topic="Orders"))
            assert (got.config, got.mod_revision) == (first.config, first.mod_revision)


@async_test
async def test_malformed_topic_names_and_unreachable_etcd_then_serving_again(
    private_etcd: EtcdProcess,
) -> None:
    config = MetaConfig(
        endpoints=(private_etcd.endpoint,), cluster=unique_cluster(), op_timeout_s=1
    )
    async with admin_service(config) as stub:
        for call in (
            stub.DeleteTopic(adm.DeleteTopicRequest(topic="a/b")),
            stub.GetTopic(adm.GetTopicRequest(topic="")),
        ):
            status, code, message = await refused(call)
            assert (status, code) == (Status.INVALID_ARGUMENT, pb.RESPONSE_CODE_MESSAGE_ILLEGAL)
            assert "is not 1-127 characters of [%|a-zA-Z0-9_-]" in message
        # No store-node registered: a new topic has nowhere to live.
        status, code, message = await refused(stub.UpdateTopic(update(topic_config("T"))))
        assert (status, code) == (Status.UNAVAILABLE, pb.RESPONSE_CODE_BROKER_NOT_EXIST)
        assert message == "no store-node is registered to host the topic"

        await asyncio.to_thread(private_etcd.stop)
        for call in (
            stub.TopicList(adm.TopicListRequest()),
            stub.GetTopic(adm.GetTopicRequest(topic="T")),
            stub.UpdateTopic(update(topic_config("T", brokers=("broker-a",)))),
            stub.DeleteTopic(adm.DeleteTopicRequest(topic="T")),
            stub.ResetOffsetByTime(adm.ResetOffsetByTimeRequest(group="G", topic="T")),
        ):
            status, code, message = await refused(call)
            assert (status, code) == (Status.UNAVAILABLE, pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE)
            assert f"etcd at {private_etcd.endpoint} unreachable" in message

        await asyncio.to_thread(private_etcd.start)
        listed = adm.TopicListResponse()

        async def answered() -> bool:  # once the client's channel has found etcd again
            nonlocal listed
            try:
                listed = await stub.TopicList(adm.TopicListRequest())
            except grpc.aio.AioRpcError as e:
                assert e.code() == Status.UNAVAILABLE, e
                return False
            return True

        await eventually(answered, interval_s=0.1)
        assert list(listed.topics) == []


@async_test
async def test_reset_offset_by_time_fans_out_tells_consumers_and_names_a_failed_store_node(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h, admin_service(meta_config) as stub:
        for broker in ("broker-a", "broker-b"):
            for q in range(4):
                for n in range(q + 1):
                    await h.send(broker, q, b"m%d" % n)
        maxes = {(b, q): q + 1 for b in ("broker-a", "broker-b") for q in range(4)}

        def table(r: adm.ResetOffsetByTimeResponse) -> dict[tuple[str, int], int]:
            return {(o.queue.broker_name, o.queue.queue_id): o.offset for o in r.offsets}

        # No live consumer: every queue of both store-nodes reset, no acks.
        to_max = adm.ResetOffsetByTimeRequest(group="G", topic=TOPIC, timestamp_ms=-1, force=True)
        reset = await stub.ResetOffsetByTime(to_max)
        assert table(reset) == maxes and list(reset.consumer_acks) == []
        assert {o.reset_epoch for o in reset.offsets} == {1}
        to_start = adm.ResetOffsetByTimeRequest(group="G", topic=TOPIC, timestamp_ms=0, force=True)
        assert set(table(await stub.ResetOffsetByTime(to_start)).values()) == {0}

        # A live consumer is told the merged table and confirms it.
        consumer = Consumer(h.stub, "c1", group="G")
        await consumer.open(pb.TopicSubscription(topic=TOPIC))
        reset = await stub.ResetOffsetByTime(to_max)
        assert [(a.client_id, a.outcome) for a in reset.consumer_acks] == [
            ("c1", ps.COMMAND_OUTCOME_OK)
        ]
        (command,) = consumer.commands
        assert list(command.reset_offset.offsets) == list(reset.offsets)
        assert {o.reset_epoch for o in reset.offsets} == {3}

        # Malformed requests, an unknown topic.
        for request, status, code, says in (
            (adm.ResetOffsetByTimeRequest(topic=TOPIC), Status.INVALID_ARGUMENT,
             pb.RESPONSE_CODE_INVALID_PARAMETER, "group must not be empty"),
            (adm.ResetOffsetByTimeRequest(group="G", topic="no such"), Status.INVALID_ARGUMENT,
             pb.RESPONSE_CODE_MESSAGE_ILLEGAL, "topic 'no such' is not"),
            (adm.ResetOffsetByTimeRequest(group="G", topic="Nope"), Status.NOT_FOUND,
             pb.RESPONSE_CODE_TOPIC_NOT_EXIST, "topic 'Nope' does not exist"),
            (adm.ResetOffsetByTimeRequest(group="G", topic=TOPIC, timestamp_ms=-2),
             Status.INVALID_ARGUMENT, pb.RESPONSE_CODE_INVALID_PARAMETER, "timestamp_ms -2"),
            (adm.ResetOffsetByTimeRequest(group="G", topic=TOPIC, ack_timeout_ms=60_001),
             Status.INVALID_ARGUMENT, pb.RESPONSE_CODE_INVALID_PARAMETER, "ack_timeout_ms 60001"),
        ):  # fmt: skip
            got_status, got_code, message = await refused(stub.ResetOffsetByTime(request))
            assert (got_status, got_code) == (status, code) and says in message, message
        assert len(consumer.commands) == 1  # none of those reached a consumer

        # A store-node down: the call fails naming it; broker-a's reset stays and
        # the consumer is not told.
        await h.nodes["broker-b"].stop(grace_s=0.5)
        status, code, message = await refused(stub.ResetOffsetByTime(to_start))
        assert (status, code) == (Status.UNAVAILABLE, pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE)
        assert message.startswith("store-node 'broker-b': UNAVAILABLE: ")
        assert "Reset done on broker-a (it stays; no consumer was told" in message
        assert len(consumer.commands) == 1
        for q in range(4):
            committed = await h.node_stubs["broker-a"].QueryConsumerOffset(
                sn.QueryConsumerOffsetRequest(group="G", topic=TOPIC, queue_id=q)
            )
            assert committed.offset == 0
        # A hosting store-node that is not registered: BROKER_NOT_EXIST, named.
        await h.update_topic(TOPIC, brokers=("broker-a", "broker-c"))
        status, code, message = await refused(stub.ResetOffsetByTime(to_max))
        assert (status, code) == (Status.UNAVAILABLE, pb.RESPONSE_CODE_BROKER_NOT_EXIST)
        assert message.startswith("store-node 'broker-c' is not registered")
        assert "Reset done on broker-a" in message
        await consumer.close()
        assert list((await stub.TopicList(adm.TopicListRequest())).topics) == [TOPIC]


@pytest.fixture
def admin_process(tmp_path: Path, etcd: EtcdProcess) -> Iterator[tuple[ServiceProcess, str]]:
    cluster_name = unique_cluster()
    proc = ServiceProcess(
        tmp_path / "basalt.admin.log",
        "basalt.admin.service_main",
        "--etcd",
        etcd.endpoint,
        "--cluster",
        cluster_name,
    )
    try:
        yield proc, cluster_name
    finally:
        if proc.proc.poll() is None:
            proc.stop(signal.SIGKILL)


@pytest.mark.slow
def test_the_process_serves_until_sigterm(
    admin_process: tuple[ServiceProcess, str], etcd: EtcdProcess
) -> None:
    proc, cluster_name = admin_process
    assert proc.wait_serving() == f"admin-service serving on {proc.address}"

    async def calls() -> list[str]:
        async with MetaClient(MetaConfig(endpoints=(etcd.endpoint,), cluster=cluster_name)) as m:
            await m.create_topic(TopicConfig(topic_name="T"))
        async with grpc.aio.insecure_channel(proc.address) as channel:
            listed = await adm_grpc.AdminStub(channel).TopicList(adm.TopicListRequest())
        return list(listed.topics)

    assert asyncio.run(calls()) == ["T"]
    assert proc.stop(signal.SIGTERM) == 0
    assert "admin service stopped" in proc.log.read_text()


def test_the_process_exits_1_when_etcd_does_not_answer(tmp_path: Path) -> None:
    proc = ServiceProcess(
        tmp_path / "basalt.admin.log",
        "basalt.admin.service_main",
        "--etcd",
        f"127.0.0.1:{free_port()}",
        "--op-timeout-s",
        "0.5",
    )
    assert proc.proc.wait(timeout=SUBPROCESS_TIMEOUT_S) == 1
    assert "unreachable" in proc.log.read_text()
