"""A store-node whose store fails in the background stops pretending.

A real in-process store-node on port 0; an fsync error injected into its
CommitLog flush. Health must turn NOT_SERVING, sends must be refused
UNAVAILABLE / SERVICE_NOT_AVAILABLE with the reason, brokerStatus's runtime
info must name the failure, and what was stored before stays readable.
"""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any, NoReturn

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from basalt.common.record import decode_record
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import run
from tests.support.nodes import NODE_TOPIC as TOPIC
from tests.support.nodes import node
from tests.support.polling import eventually
from tests.support.rpc import refused, wire

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def eio() -> NoReturn:
    raise OSError(errno.EIO, "Input/output error")


async def health_status(channel: grpc.aio.Channel) -> int:
    """The node's overall health (service ""), grpc.health.v1's enum value."""
    health = health_pb2_grpc.HealthStub(channel)
    return int((await health.Check(health_pb2.HealthCheckRequest(service=""))).status)


async def first_record(stub: Any) -> sn.GetMessageResponse:
    """GetMessage of queue 0's first record."""
    return await stub.GetMessage(
        sn.GetMessageRequest(group="G", topic=TOPIC, queue_id=0, offset=0, max_msg_nums=1)
    )


def test_an_fsync_error_turns_the_node_not_serving_and_refuses_sends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            channel = grpc.aio.insecure_channel(running.address)

            async def not_serving() -> bool:
                return await health_status(channel) == NOT_SERVING

            assert await health_status(channel) == health_pb2.HealthCheckResponse.SERVING
            sent = await stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"before")))
            assert sent.result.status == pb.SEND_STATUS_SEND_OK
            monkeypatch.setattr(running.store.commitlog.files, "flush", eio)
            # Enough dirty pages for the ASYNC flusher to flush at its next look.
            await stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"x" * 32 * 1024)))
            await eventually(not_serving, what="health NOT_SERVING")
            code, response_code, message = await refused(
                stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"after")))
            )
            assert code == grpc.StatusCode.UNAVAILABLE
            assert response_code == pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE
            assert "flush-commitlog failed" in message and "Input/output error" in message
            got = await first_record(stub)
            assert got.status == pb.GET_MESSAGE_STATUS_FOUND
            assert decode_record(got.records.data).body == b"before"
            info = await stub.GetRuntimeInfo(sn.GetRuntimeInfoRequest())
            assert "Input/output error" in info.extra["failed:flush-commitlog"]
            await channel.close()

    run(scenario)


def test_emfile_in_the_dispatcher_turns_the_node_not_serving(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        async with node(tmp_path) as (running, stub, _):
            channel = grpc.aio.insecure_channel(running.address)

            async def not_serving() -> bool:
                return await health_status(channel) == NOT_SERVING

            await stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"before")))

            def emfile(*_: object) -> NoReturn:
                raise OSError(errno.EMFILE, "Too many open files")

            # A queue never written before needs a new ConsumeQueue file.
            monkeypatch.setattr(running.store.consume_queues, "find_or_create", emfile)
            await stub.SendMessage(
                sn.SendMessageRequest(message=wire(TOPIC, b"new queue"), queue_id=3)
            )
            await eventually(not_serving, what="health NOT_SERVING")
            code, response_code, message = await refused(
                stub.SendMessage(sn.SendMessageRequest(message=wire(TOPIC, b"after")))
            )
            assert (code, response_code) == (
                grpc.StatusCode.UNAVAILABLE,
                pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
            )
            assert "reput-message-service failed" in message and "Too many open files" in message
            got = await first_record(stub)
            assert decode_record(got.records.data).body == b"before"
            await channel.close()

    run(scenario)
