"""The TransactionProducer against real processes (a store-node and a pull-service
on a real etcd): committed messages are consumed once, rolled back ones never,
UNKNOW ones resolved by the check-back; a producer killed with SIGKILL between
half and commit leaves a half that a new producer of the group resolves; a
store-node killed with SIGKILL before or after a commit ends with the message
delivered once or never, never half-visible."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc

from basalt.client import LocalTransactionState, Message, MessageRecord, TransactionProducer
from basalt.common.record import decode_record
from basalt.services.cluster.etcd import EtcdProcess
from basalt.services.meta import MetaClient, MetaConfig, TopicConfig
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc
from tests.support.aio import async_test
from tests.support.etcd import unique_cluster
from tests.support.polling import eventually
from tests.support.processes import ServiceProcess, store_node_process

TOPIC = "TxE2E"
QUEUES = 2
GROUP = "TxProducers"
COMMIT = LocalTransactionState.COMMIT_MESSAGE
ROLLBACK = LocalTransactionState.ROLLBACK_MESSAGE
UNKNOW = LocalTransactionState.UNKNOW
#: Short check-back settings for the store-node processes.
FAST_CHECKS = (
    "--transaction-timeout-ms",
    "500",
    "--transaction-check-interval-ms",
    "300",
)


@asynccontextmanager
async def txn_cluster(
    tmp_path: Path, etcd: EtcdProcess, processes: list[ServiceProcess]
) -> AsyncIterator[tuple[ServiceProcess, ServiceProcess]]:
    """Store-node broker-a and pull-service ps-1 as processes, TOPIC on broker-a."""
    cluster = unique_cluster()
    common = ("--etcd", etcd.endpoint, "--cluster", cluster, "--lease-ttl-s", "30")
    node = store_node_process(tmp_path, "broker-a", *common, *FAST_CHECKS)
    processes.append(node)
    pull = ServiceProcess(
        tmp_path / "ps-1.log", "basalt.services.pull_service.main", "--id", "ps-1", *common
    )
    processes.append(pull)
    node.wait_serving()
    pull.wait_serving()
    async with MetaClient(MetaConfig(endpoints=(etcd.endpoint,), cluster=cluster)) as meta:
        await meta.create_topic(
            TopicConfig(
                topic_name=TOPIC,
                read_queue_nums=QUEUES,
                write_queue_nums=QUEUES,
                brokers=("broker-a",),
            )
        )
    yield node, pull


async def delivered(address: str) -> list[bytes]:
    """Every body a consumer of TOPIC can read on the store-node, queue by queue."""
    bodies: list[bytes] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = sn_grpc.StoreNodeStub(channel)
        for q in range(QUEUES):
            got = await stub.GetMessage(
                sn.GetMessageRequest(group="C", topic=TOPIC, queue_id=q, max_msg_nums=64)
            )
            if got.status != pb.GET_MESSAGE_STATUS_FOUND:
                continue
            data, pos = got.records.data, 0
            while pos < len(data):
                record = decode_record(data, pos)
                bodies.append(record.body)
                pos += record.store_size
    return sorted(bodies)


def answering(answers: dict[bytes, LocalTransactionState], asked: list[bytes]):  # type: ignore[no-untyped-def]
    """A checker answering by body (UNKNOW for others), recording what it was asked."""

    def checker(record: MessageRecord) -> LocalTransactionState:
        assert record.topic == TOPIC  # the real topic, as RocketMQ's broker restores it
        asked.append(record.body)
        return answers.get(record.body, UNKNOW)

    return checker


@async_test(timeout_s=120)
async def test_commit_rollback_and_unknown_resolved_by_check_back(
    tmp_path: Path, etcd: EtcdProcess, processes: list[ServiceProcess]
) -> None:
    async with txn_cluster(tmp_path, etcd, processes) as (node, pull):
        asked: list[bytes] = []
        checker = answering({b"later-yes": COMMIT, b"later-no": ROLLBACK}, asked)
        async with TransactionProducer(pull.address, group=GROUP, checker=checker) as producer:
            ran: list[bytes] = []

            async def local(message: Message) -> LocalTransactionState:
                ran.append(message.body)
                return {b"yes": COMMIT, b"no": ROLLBACK}.get(message.body, UNKNOW)

            def failing(message: Message) -> LocalTransactionState:
                raise RuntimeError("the database went away")

            results = [
                await producer.send_message_in_transaction(Message(TOPIC, body), local)
                for body in (b"yes", b"no", b"later-yes", b"later-no")
            ]
            results.append(
                await producer.send_message_in_transaction(Message(TOPIC, b"later-yes2"), failing)
            )
            assert ran == [b"yes", b"no", b"later-yes", b"later-no"]
            assert [r.local_transaction_state for r in results] == [
                COMMIT,
                ROLLBACK,
                UNKNOW,
                UNKNOW,
                UNKNOW,
            ]
            assert all(r.ok and r.topic == TOPIC for r in results)
            assert await delivered(node.address) == [b"yes"]

            async def resolved() -> bool:
                return await delivered(node.address) == [b"later-yes", b"yes"]

            await eventually(resolved, timeout_s=30, what="the check-back's commit")
            assert b"later-no" in asked and b"yes" not in asked and b"no" not in asked
            # later-yes2 stays unresolved: the checker keeps answering UNKNOW.
            await eventually(
                lambda: asked.count(b"later-yes2") >= 2, timeout_s=30, what="a second check"
            )
        assert await delivered(node.address) == [b"later-yes", b"yes"]


PRODUCER_SCRIPT = textwrap.dedent(
    """
    import asyncio, sys
    from basalt.client import LocalTransactionState, Message, TransactionProducer

    async def main(address, topic, group):
        async def never(message):
            print("HALF", flush=True)
            await asyncio.Event().wait()  # killed here, between half and commit

        def checker(record):
            return LocalTransactionState.UNKNOW

        async with TransactionProducer(address, group=group, checker=checker) as p:
            await p.send_message_in_transaction(Message(topic, b"orphan"), never)

    asyncio.run(main(*sys.argv[1:]))
    """
)


@async_test(timeout_s=120)
async def test_a_producer_killed_between_half_and_commit_is_resolved_by_a_new_one(
    tmp_path: Path, etcd: EtcdProcess, processes: list[ServiceProcess]
) -> None:
    async with txn_cluster(tmp_path, etcd, processes) as (node, pull):
        proc = subprocess.Popen(
            [sys.executable, "-c", PRODUCER_SCRIPT, pull.address, TOPIC, GROUP],
            stdout=subprocess.PIPE,
        )
        try:
            assert proc.stdout is not None
            line = await asyncio.to_thread(proc.stdout.readline)
            assert line.strip() == b"HALF"
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert await delivered(node.address) == []
        asked: list[bytes] = []
        checker = answering({b"orphan": COMMIT}, asked)
        async with TransactionProducer(pull.address, group=GROUP, checker=checker, topics=[TOPIC]):

            async def resolved() -> bool:
                return await delivered(node.address) == [b"orphan"]

            await eventually(resolved, timeout_s=30, what="the orphan committed by check-back")
            await asyncio.sleep(2)  # more rounds: resolved once, never asked again
            assert asked == [b"orphan"]
        assert await delivered(node.address) == [b"orphan"]


@async_test(timeout_s=180)
async def test_a_store_node_killed_before_or_after_a_commit_delivers_once_or_never(
    tmp_path: Path, etcd: EtcdProcess, processes: list[ServiceProcess]
) -> None:
    async with txn_cluster(tmp_path, etcd, processes) as (node, pull):
        asked: list[bytes] = []
        answers = {b"before": COMMIT, b"after": COMMIT, b"dropped": ROLLBACK}
        # A producer that resolves nothing but "after" (its checker says UNKNOW): the
        # halves of "before" and "dropped" are unresolved when the node dies.
        async with TransactionProducer(
            pull.address, group=GROUP, checker=answering({}, []), topics=[TOPIC]
        ) as first:
            for body in (b"before", b"dropped"):
                await first.send_message_in_transaction(Message(TOPIC, body), lambda m: UNKNOW)
            committed = await first.send_message_in_transaction(
                Message(TOPIC, b"after"), lambda m: COMMIT
            )
            assert committed.local_transaction_state is COMMIT
            assert await delivered(node.address) == [b"after"]
            node.stop(signal.SIGKILL)
        node.start()
        node.wait_serving()
        # Nothing half-visible after recovery: only the commit acknowledged before.
        assert await delivered(node.address) == [b"after"]
        async with TransactionProducer(
            pull.address, group=GROUP, checker=answering(answers, asked), topics=[TOPIC]
        ):

            async def settled() -> bool:
                return await delivered(node.address) == [b"after", b"before"]

            await eventually(settled, timeout_s=60, what="the check-back after the restart")
            await asyncio.sleep(2)
            # "after" was committed with its mark in the same append: never asked again.
            assert b"after" not in asked
            assert sorted(set(asked)) == [b"before", b"dropped"]
        assert await delivered(node.address) == [b"after", b"before"]
