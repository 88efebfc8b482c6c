"""Timers through the SDK and the CLI, end to end (real etcd, real store-nodes):
Message(deliver_time_ms=...) arrives not before its time, SendResult.recall_handle
and Producer.recall cancel one, bad input is refused."""

from __future__ import annotations

import asyncio
import base64
import datetime
import re
import time
from pathlib import Path

import pytest

from basalt.client import ClientError, Producer, deliver_after
from basalt.client.quickstart import parse_deliver_at
from basalt.common.message import Message
from basalt.common.recall import RecallHandle
from basalt.services.meta import MetaConfig
from basalt.v1 import common_pb2 as pb
from tests.support.aio import async_test
from tests.support.nodes import TOPIC, cluster
from tests.support.polling import eventually
from tests.support.processes import run_basalt
from tests.support.rpc import pull_queue


@async_test
async def test_a_timer_message_arrives_not_before_its_time_and_recall_cancels_one(
    tmp_path: Path, meta_config: MetaConfig
) -> None:
    async with cluster(tmp_path, meta_config) as h:
        async with Producer(h.services[0].address, group="P") as producer:
            due = deliver_after(2)
            kept = await producer.send(Message(TOPIC, b"kept", tags="TagA", deliver_time_ms=due))
            assert kept.ok and kept.recall_handle
            handle = RecallHandle.decode(kept.recall_handle)
            assert (handle.topic, handle.deliver_time_ms, handle.message_id) == (
                TOPIC,
                due,
                kept.msg_id,
            )
            assert handle.broker_name == kept.broker_name
            # A second one to the same queue, recalled before it is due.
            dropped = await producer.send(Message(TOPIC, b"dropped", deliver_time_ms=due))
            assert await producer.recall(TOPIC, dropped.recall_handle) == dropped.msg_id
            plain = await producer.send(Message(TOPIC, b"plain"))
            assert plain.recall_handle == ""

            async def bodies(queue_id: int, broker: str) -> list[bytes]:
                return await pull_queue(h.stub, broker, queue_id, commit=False)

            async def arrived() -> bool:
                return b"kept" in await bodies(kept.queue_id, kept.broker_name)

            await eventually(arrived, timeout_s=15, what="the timer message")
            assert time.time() * 1000 >= due
            # Same time, same slot: had it not been recalled it would be out by now.
            await asyncio.sleep(0.5)
            assert b"dropped" not in await bodies(dropped.queue_id, dropped.broker_name)
            # Delivered: too late to recall; a handle of another topic; not a handle.
            with pytest.raises(ClientError) as e:
                await producer.recall(TOPIC, kept.recall_handle)
            assert e.value.code == pb.RESPONSE_CODE_QUERY_NOT_FOUND
            with pytest.raises(ClientError):
                await producer.recall("Other", kept.recall_handle)
            with pytest.raises(ValueError, match="recall handle"):
                await producer.recall(TOPIC, "nonsense!")
            with pytest.raises(ValueError, match="cannot be batched"):
                await producer.send_batch(
                    [Message(TOPIC, b"a", deliver_time_ms=due), Message(TOPIC, b"b")]
                )
            # Past the store's timer_max_delay_sec (7 days).
            with pytest.raises(ClientError, match="timer_max_delay_sec") as e:
                await producer.send(
                    Message(TOPIC, b"far", deliver_time_ms=deliver_after(8 * 86400))
                )
            assert e.value.code == pb.RESPONSE_CODE_INVALID_PARAMETER

        code, out, err = await run_basalt(
            "produce", "--endpoints", h.services[0].address, "-t", "CliTimer", "-n", "1",
            "--deliver-after", "30",
        )  # fmt: skip
        assert code == 0, err
        assert "SEND_OK" in out
        found = re.search(r"recallHandle=(\S+)\]", out)
        assert found is not None, out
        assert RecallHandle.decode(found.group(1)).topic == "CliTimer"
        code, _, err = await run_basalt(
            "produce", "--endpoints", h.services[0].address, "-t", "CliTimer", "-n", "1",
            "--deliver-at", "tomorrow",
        )  # fmt: skip
        assert code != 0 and "neither Unix ms nor an ISO 8601 time" in err


def test_deliver_at_takes_unix_ms_and_iso_times() -> None:
    assert parse_deliver_at("1700000000123") == 1_700_000_000_123
    assert parse_deliver_at("2030-01-02T03:04:05") == int(
        datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC).timestamp() * 1000
    )
    assert parse_deliver_at("2030-01-02T03:04:05+02:00") == parse_deliver_at("2030-01-02T01:04:05")
    with pytest.raises(ValueError):
        parse_deliver_at("soon")
    assert abs(deliver_after(1.5) - (time.time() * 1000 + 1500)) < 1000


def test_recall_handles_are_rocketmq_5_3s() -> None:
    # RecallMessageHandle.HandleV1.buildHandle: URL-safe base64 of "v1 topic broker time id".
    handle = RecallHandle("Orders", "broker-a", 1_700_000_000_000, "7F00000100").encode()
    assert (
        handle == base64.urlsafe_b64encode(b"v1 Orders broker-a 1700000000000 7F00000100").decode()
    )
    assert RecallHandle.decode(handle.rstrip("=")) == RecallHandle.decode(handle)
    for bad in ("", "***", base64.urlsafe_b64encode(b"v2 T b 1 id").decode(),
                base64.urlsafe_b64encode(b"v1 T b soon id").decode(),
                base64.urlsafe_b64encode(b"v1 T b 1").decode()):  # fmt: skip
        with pytest.raises(ValueError, match="recall handle"):
            RecallHandle.decode(bad)
