"""Timer (DELAY) messages, recall and transactions through the v2 front, with the
official Python and Node.js clients (subprocesses, tests/interop/) and raw v2
calls, against ``basalt cluster up`` with two store-nodes (so transaction ids
and recall handles must name theirs)."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from google.protobuf.timestamp_pb2 import Timestamp

from basalt.client import ConsumeFromWhere, LitePullConfig, LitePullConsumer
from basalt.common.recall import RecallHandle
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.services.rocketmq_v2.handles import TransactionId
from tests.support.interop import INTEROP, NODE, ensure_node_modules, run_client
from tests.support.processes import run_basalt_sync
from tests.support.v2_front import FRONTS, V2Cluster, v2_cluster

DELAY = {
    "python": [sys.executable, str(INTEROP / "python" / "delay.py")],
    "node": ["node", str(NODE / "delay.js")],
}
TRANSACTION = {
    "python": [sys.executable, str(INTEROP / "python" / "transaction.py")],
    "node": ["node", str(NODE / "transaction.js")],
}
#: The store-nodes check unresolved halves soon (their defaults are RocketMQ's:
#: a minute), so a test need not wait for it.
STORE_ENV = {
    "BASALT_TRANSACTION_CHECK_INTERVAL_MS": "1000",
    "BASALT_TRANSACTION_TIMEOUT_MS": "1000",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[V2Cluster]:
    ensure_node_modules()
    data = tmp_path_factory.mktemp("v2dt") / "c"
    with v2_cluster(data, "--store-nodes", "2", env=STORE_ENV) as cluster:
        yield cluster


def _topic(cluster: V2Cluster, name: str) -> str:
    """``name`` on both store-nodes."""
    return cluster.topic(name, ("broker-a", "broker-b"))


async def _arrivals(
    cluster: V2Cluster, topic: str, expect: int, timeout_s: float, linger_s: float = 1.5
) -> dict[bytes, float]:
    """Each message body read from ``topic`` (from its first offset) and the
    wall-clock time, Unix ms, it was first seen: polls until ``expect`` came
    (or ``timeout_s``), then ``linger_s`` more (nothing else may come)."""
    consumer = LitePullConsumer(
        cluster.pull,
        config=LitePullConfig(
            consumer_group=f"G-{topic}",
            consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
        ),
    )
    consumer.subscribe(topic)
    seen: dict[bytes, float] = {}
    async with consumer:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(seen) < expect and loop.time() < deadline:
            for r in await consumer.poll(timeout_ms=200):
                seen.setdefault(r.body, time.time() * 1000)
        end = loop.time() + linger_s
        while loop.time() < end:
            for r in await consumer.poll(timeout_ms=200):
                seen.setdefault(r.body, time.time() * 1000)
    return seen


@pytest.mark.parametrize("front", ["pull-service", "store-node"])
@pytest.mark.parametrize("client", sorted(DELAY))
def test_delayed_messages_arrive_not_before_their_time_and_recalled_ones_never(
    cluster: V2Cluster, client: str, front: str
) -> None:
    topic = _topic(cluster, f"V2Delay-{client}-{front}")
    spec = {
        "topic": topic,
        "messages": [
            {"body": f"{client}-early", "delay_s": 2},
            {"body": f"{client}-recalled", "delay_s": 3},
            {"body": f"{client}-late", "delay_s": 5},
        ],
        "recall": [1],
    }
    sent = run_client(DELAY[client], cluster.endpoint(front), spec)
    assert all("message_id" in s for s in sent), sent
    assert all(s["recall_handle"] for s in sent), sent
    # the handle names the store-node holding the timer
    assert {RecallHandle.decode(s["recall_handle"]).broker_name for s in sent} <= {
        "broker-a",
        "broker-b",
    }
    assert sent[1]["recalled"] == sent[1]["message_id"]
    arrived = asyncio.run(_arrivals(cluster, topic, expect=2, timeout_s=30))
    assert set(arrived) == {f"{client}-early".encode(), f"{client}-late".encode()}
    for s, body in ((sent[0], f"{client}-early"), (sent[2], f"{client}-late")):
        assert arrived[body.encode()] >= s["deliver_at_ms"], (body, arrived, s)


@pytest.mark.parametrize("front", ["pull-service", "store-node"])
@pytest.mark.parametrize("client", sorted(TRANSACTION))
def test_transactions_commit_roll_back_and_are_checked_after_the_producer_died(
    cluster: V2Cluster, client: str, front: str
) -> None:
    # Through a store-node's front the producers follow the route to each
    # broker's own front; its check relay watches both store-nodes.
    topic = _topic(cluster, f"V2Txn-{client}-{front}")
    endpoint = cluster.endpoint(front)
    first = {
        "topic": topic,
        "messages": [
            {"body": f"{client}-committed", "end": "commit"},
            {"body": f"{client}-rolled-back", "end": "rollback"},
            {"body": f"{client}-orphan", "end": "hang"},
        ],
    }
    producer = subprocess.Popen(
        [*TRANSACTION[client], endpoint], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert producer.stdin is not None and producer.stdout is not None
    producer.stdin.write(json.dumps(first))
    producer.stdin.close()
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(
        target=lambda: [lines.put(x) for x in producer.stdout or []], daemon=True
    ).start()
    said: list[dict[str, Any]] = []
    try:
        while not any(s.get("half") == f"{client}-orphan" for s in said):
            line = lines.get(timeout=60)
            said.append(json.loads(line))
    finally:
        # killed between the half's send and its commit: only a check resolves it
        os.kill(producer.pid, signal.SIGKILL)
        producer.wait(timeout=30)
    ended = {s["ended"]: s["error"] for s in said if "ended" in s}
    assert ended == {f"{client}-committed": None, f"{client}-rolled-back": None}, said
    halves = {s["half"]: s for s in said if "half" in s}
    orphan = halves[f"{client}-orphan"]
    assert TransactionId.decode(orphan["transaction_id"]).topic == topic
    # another producer of the topic (its group) decides the orphan
    second = {
        "topic": topic, "checker": "commit", "check_until": [f"{client}-orphan"], "wait_s": 60,
    }  # fmt: skip
    run = subprocess.run(
        [*TRANSACTION[client], endpoint], input=json.dumps(second), capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    checks = [json.loads(x) for x in run.stdout.splitlines() if x.startswith("{")]
    checked = [c for c in checks if c.get("checked") == f"{client}-orphan"]
    assert checked, run.stdout + run.stderr
    assert checked[0]["message_id"] == orphan["message_id"]
    assert checked[0]["topic"] == topic
    # the rolled-back half was never checked: it was resolved
    assert not any(c.get("checked") == f"{client}-rolled-back" for c in checks)
    arrived = asyncio.run(_arrivals(cluster, topic, expect=2, timeout_s=30))
    assert set(arrived) == {f"{client}-committed".encode(), f"{client}-orphan".encode()}


def _message(topic: str, body: bytes, message_id: str, **system: Any) -> v2.Message:
    return v2.Message(
        topic=v2.Resource(name=topic),
        system_properties=v2.SystemProperties(message_id=message_id, **system),
        body=body,
    )


def _at(ms: int) -> Timestamp:
    t = Timestamp()
    t.FromMilliseconds(ms)
    return t


@pytest.mark.parametrize("front", FRONTS)
def test_bad_delays_recalls_and_transaction_ids_are_refused_clearly(
    cluster: V2Cluster, front: str
) -> None:
    # The same answers whether the store-node that refuses is called in-process
    # (a store-node's own front) or over gRPC.
    topic = _topic(cluster, f"V2DelayTxnBad-{front}")
    other = _topic(cluster, f"V2DelayTxnOther-{front}")
    channel, stub = cluster.stub(cluster.endpoint(front))
    with channel:

        def send(message: v2.Message) -> sv.SendMessageResponse:
            answer: sv.SendMessageResponse = stub.SendMessage(
                sv.SendMessageRequest(messages=[message]), timeout=10
            )
            return answer

        far = int(time.time() * 1000) + 400 * 86_400_000  # past any store's maximum
        too_late = send(_message(topic, b"far", "01FAR", message_type=v2.DELAY,
                                 delivery_timestamp=_at(far)))  # fmt: skip
        assert too_late.status.code == v2.ILLEGAL_DELIVERY_TIME, too_late.status
        no_time = send(_message(topic, b"no time", "01NOTIME", message_type=v2.DELAY))
        assert no_time.status.code == v2.ILLEGAL_DELIVERY_TIME
        both = send(_message(topic, b"both", "01BOTH", message_type=v2.TRANSACTION,
                             delivery_timestamp=_at(far)))  # fmt: skip
        assert both.status.code == v2.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE

        def end(transaction_id: str, on: str = topic, message_id: str = "01X") -> v2.Status:
            answer: sv.EndTransactionResponse = stub.EndTransaction(
                sv.EndTransactionRequest(
                    topic=v2.Resource(name=on), message_id=message_id,
                    transaction_id=transaction_id, resolution=v2.COMMIT,
                    source=v2.SOURCE_CLIENT,
                ),
                timeout=10,
            )  # fmt: skip
            return answer.status

        assert end("").code == v2.INVALID_TRANSACTION_ID
        assert end("garbled!").code == v2.INVALID_TRANSACTION_ID
        # well formed, but no such half on the store-node
        unknown = TransactionId("broker-a", topic, "7F00000100002A9F00000000DEADBEEF").encode()
        assert end(unknown).code == v2.INVALID_TRANSACTION_ID
        # a real half, ended on another topic, or with another message id
        half = send(_message(topic, b"half", "01HALF", message_type=v2.TRANSACTION))
        assert half.status.code == v2.OK, half.status
        tid = half.entries[0].transaction_id
        assert end(tid, on=other).code == v2.INVALID_TRANSACTION_ID
        assert end(tid, message_id="01WRONG").code == v2.INVALID_TRANSACTION_ID
        # rolled back it is gone: a second end names nothing
        rolled = stub.EndTransaction(
            sv.EndTransactionRequest(
                topic=v2.Resource(name=topic), message_id="01HALF", transaction_id=tid,
                resolution=v2.ROLLBACK, source=v2.SOURCE_CLIENT,
            ),
            timeout=10,
        )  # fmt: skip
        assert rolled.status.code == v2.OK, rolled.status
        assert end(tid, message_id="01HALF").code == v2.INVALID_TRANSACTION_ID

        def recall(handle: str, on: str = topic) -> v2.Status:
            answer: sv.RecallMessageResponse = stub.RecallMessage(
                sv.RecallMessageRequest(topic=v2.Resource(name=on), recall_handle=handle),
                timeout=10,
            )
            return answer.status

        assert recall("garbled!").code == v2.BAD_REQUEST
        assert recall(tid).code == v2.BAD_REQUEST  # a transaction id is no recall handle
        hour = _at(int(time.time() * 1000) + 3_600_000)
        timer = send(_message(topic, b"timer", "01TIMER", message_type=v2.DELAY,
                              delivery_timestamp=hour))  # fmt: skip
        assert timer.status.code == v2.OK, timer.status
        handle = timer.entries[0].recall_handle
        assert recall(handle, on=other).code == v2.BAD_REQUEST
        assert recall(handle).code == v2.OK
    # nothing refused was stored; the rolled-back half and recalled timer never show
    assert asyncio.run(_arrivals(cluster, topic, expect=0, timeout_s=0, linger_s=1.0)) == {}


def test_a_raw_telemetry_stream_gets_the_check_and_its_end_transaction_commits(
    cluster: V2Cluster,
) -> None:
    """The relay as the protocol has it: a publishing client's Telemetry stream
    gets a RecoverOrphanedTransactionCommand for an unresolved half of its
    topic, and its EndTransaction (SOURCE_SERVER_CHECK) commits it."""
    topic = _topic(cluster, "V2RawCheck")
    channel, stub = cluster.stub()
    with channel:
        half = stub.SendMessage(
            sv.SendMessageRequest(
                messages=[_message(topic, b"raw-orphan", "01RAWORPHAN", tag="T",
                                   message_type=v2.TRANSACTION)]
            ),
            timeout=10,
        )  # fmt: skip
        assert half.status.code == v2.OK, half.status
        settings = v2.Settings(
            client_type=v2.PRODUCER, publishing=v2.Publishing(topics=[v2.Resource(name=topic)])
        )
        outgoing: queue.Queue[sv.TelemetryCommand | None] = queue.Queue()
        outgoing.put(sv.TelemetryCommand(settings=settings))
        stream = stub.Telemetry(iter(outgoing.get, None), timeout=60)
        try:
            command = None
            for got in stream:
                if got.HasField("recover_orphaned_transaction_command"):
                    command = got.recover_orphaned_transaction_command
                    break
            assert command is not None
            message = command.message
            assert (message.topic.name, message.body) == (topic, b"raw-orphan")
            assert message.system_properties.message_id == "01RAWORPHAN"
            assert message.system_properties.message_type == v2.TRANSACTION
            assert message.system_properties.tag == "T"
            ended = stub.EndTransaction(
                sv.EndTransactionRequest(
                    topic=v2.Resource(name=topic), message_id=message.system_properties.message_id,
                    transaction_id=command.transaction_id, resolution=v2.COMMIT,
                    source=v2.SOURCE_SERVER_CHECK,
                ),
                timeout=10,
            )  # fmt: skip
            assert ended.status.code == v2.OK, ended.status
        finally:
            outgoing.put(None)
            stream.cancel()
    assert set(asyncio.run(_arrivals(cluster, topic, expect=1, timeout_s=30))) == {b"raw-orphan"}


def test_checks_follow_the_topic_to_a_store_node_added_after_the_client_joined(
    cluster: V2Cluster,
) -> None:
    """The relay's watches follow the route: a topic on broker-a only when the
    client's Telemetry stream joins, then on broker-b too; halves left on
    either store-node are all checked through the stream."""
    made = run_basalt_sync(
        "admin", "updateTopic", "-t", "V2Moving", "-r", "2", "-w", "2", "-b", "broker-a",
        "--etcd", cluster.etcd,
    )  # fmt: skip
    assert made.returncode == 0, made.stdout + made.stderr
    topic = "V2Moving"
    channel, stub = cluster.stub()
    with channel:
        settings = v2.Settings(
            client_type=v2.PRODUCER, publishing=v2.Publishing(topics=[v2.Resource(name=topic)])
        )
        outgoing: queue.Queue[sv.TelemetryCommand | None] = queue.Queue()
        outgoing.put(sv.TelemetryCommand(settings=settings))
        stream = stub.Telemetry(iter(outgoing.get, None), timeout=90)
        try:
            assert next(stream).HasField("settings")  # joined
            _topic(cluster, topic)  # now on broker-a and broker-b
            sent: dict[str, str] = {}
            for i in range(6):  # round robin over both store-nodes' queues
                half = stub.SendMessage(
                    sv.SendMessageRequest(
                        messages=[_message(topic, b"moving-%d" % i, f"01MOVING{i}",
                                           message_type=v2.TRANSACTION)]
                    ),
                    timeout=10,
                )  # fmt: skip
                assert half.status.code == v2.OK, half.status
                sent[f"01MOVING{i}"] = half.entries[0].transaction_id
            brokers = {TransactionId.decode(t).broker_name for t in sent.values()}
            assert brokers == {"broker-a", "broker-b"}
            checked: dict[str, str] = {}
            for got in stream:
                command = got.recover_orphaned_transaction_command
                message_id = command.message.system_properties.message_id
                if message_id in sent and message_id not in checked:
                    checked[message_id] = command.transaction_id
                    ended = stub.EndTransaction(
                        sv.EndTransactionRequest(
                            topic=v2.Resource(name=topic), message_id=message_id,
                            transaction_id=command.transaction_id, resolution=v2.COMMIT,
                            source=v2.SOURCE_SERVER_CHECK,
                        ),
                        timeout=10,
                    )  # fmt: skip
                    assert ended.status.code == v2.OK, ended.status
                if len(checked) == len(sent):
                    break
            assert {TransactionId.decode(t).broker_name for t in checked.values()} == brokers
        finally:
            outgoing.put(None)
            stream.cancel()
    arrived = asyncio.run(_arrivals(cluster, topic, expect=len(sent), timeout_s=30))
    assert set(arrived) == {b"moving-%d" % i for i in range(6)}
