"""Building requests and reading answers of the generated gRPC stubs.

Refusals carry the gRPC status, the RocketMQ response code (in the trailing
metadata ``basalt-response-code``) and a message: :func:`refused` and
:func:`status_of` give the three, so a test checks all of them.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import grpc
import pytest

from basalt.common.record import decode_record, split_records
from basalt.common.status import response_code_of
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from tests.support.nodes import TOPIC


def status_of(error: grpc.aio.AioRpcError | None) -> tuple[grpc.StatusCode, int, str]:
    """The gRPC status, RocketMQ code (-1 if none) and message of a failed call."""
    assert error is not None
    code = response_code_of(error)
    return error.code(), -1 if code is None else code, error.details() or ""


async def refused(call: Awaitable[Any]) -> tuple[grpc.StatusCode, int, str]:
    """Await ``call``, which must fail: its :func:`status_of`."""
    with pytest.raises(grpc.aio.AioRpcError) as e:
        await call
    return status_of(e.value)


def wire(topic: str, body: bytes, **kw: Any) -> pb.Message:
    """A message as the wire carries it."""
    return pb.Message(topic=topic, body=body, **kw)


def pull_request(
    broker: str = "broker-a",
    queue_id: int = 0,
    offset: int = 0,
    *,
    topic: str = TOPIC,
    group: str = "G",
    max_nums: int = 32,
    **kw: Any,
) -> ps.PullRequest:
    """A PullService ``Pull`` of one queue (by default of the in-process cluster's topic)."""
    return ps.PullRequest(
        group=group,
        queue=pb.MessageQueue(topic=topic, broker_name=broker, queue_id=queue_id),
        offset=offset,
        max_nums=max_nums,
        **kw,
    )


def bodies(response: pb.PullResponse) -> list[bytes]:
    """The bodies of the records a pull returned, in order."""
    return [decode_record(r).body for r in split_records(response.records.data)]


async def pull_queue(
    stub: ps_grpc.PullServiceAsyncStub,
    broker: str,
    queue_id: int,
    *,
    commit: bool = True,
    subscription: pb.Subscription | None = None,
    **kw: Any,
) -> list[bytes]:
    """Every matching body of one queue from offset 0, pulling (and, with
    ``commit``, committing each offset reached) until nothing is new."""
    got: list[bytes] = []
    offset = 0
    while True:
        request = pull_request(broker, queue_id, offset, **kw)
        if commit:
            request.commit_offset = offset
        if subscription is not None:
            request.subscription.CopyFrom(subscription)
        r = await stub.Pull(request)
        if r.status == pb.PULL_STATUS_NO_NEW_MSG:
            return got
        assert r.status in (pb.PULL_STATUS_FOUND, pb.PULL_STATUS_NO_MATCHED_MSG), r
        got += bodies(r)
        assert r.next_begin_offset > offset
        offset = r.next_begin_offset
