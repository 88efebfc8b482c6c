"""The source's blocking gRPC calls to a Basalt cluster, on the driver and the executors.

The driver asks the pull-service for routes (``QueryRoute``) and each queue's
store-node for its bounds (``GetMinMaxOffset``), a time's offset
(``SearchOffset``) and, in streaming, a group's progress
(``UpdateConsumerOffset``). Executors only pull, through the pull-service
(``Pull``), so the subscription is applied on the store-node. Every call is
blocking: Spark calls the source from plain threads, with no event loop.

Failures the user can act on become :class:`BasaltSourceError` with a message
naming the endpoint, topic or queue; the original gRPC error is chained.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import grpc

from basalt.client.channels import MAX_MESSAGE_BYTES
from basalt.common import tls as transport
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc

#: Deadline of one metadata call (routes, bounds, searches, commits), seconds.
CALL_TIMEOUT_S = 10.0
#: Deadline of one pull; the store answers at once (no long polling here).
PULL_TIMEOUT_S = 30.0
_CHANNEL_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
)

T = TypeVar("T")
_lock = threading.Lock()
_store_channels: dict[str, grpc.Channel] = {}


class BasaltSourceError(ValueError):
    """A source option the cluster refuses (unknown topic, unreachable
    endpoint, bad subscription) or a read that cannot go on."""


@dataclass(frozen=True, order=True)
class QueueRef:
    """One readable queue of a topic, and the store-node that holds it."""

    topic: str
    broker: str
    queue_id: int
    address: str


def channel(address: str) -> grpc.Channel:
    """A blocking channel to ``address`` with the SDK's message size limit; TLS
    when ``BASALT_TLS_*`` in the environment says so (basalt.common.tls.from_env:
    Spark's executors inherit the driver's environment)."""
    return transport.sync_channel(address, transport.from_env(), options=_CHANNEL_OPTIONS)


def _refusal(what: str, address: str, e: grpc.RpcError) -> BasaltSourceError:
    code = e.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return BasaltSourceError(f"{what}: {address} is unreachable ({code.name}: {e.details()})")
    return BasaltSourceError(f"{what}: {address} answered {code.name}: {e.details()}")


def queues_of(endpoint: str, topics: list[str]) -> list[QueueRef]:
    """Every readable queue of ``topics`` by the pull-service at ``endpoint``,
    sorted; a broker of the route that is not registered (down) is skipped.

    Raises :class:`BasaltSourceError` when a topic does not exist or the
    endpoint does not answer (a store-node's address instead of a
    pull-service's answers UNIMPLEMENTED, also said so)."""
    out: list[QueueRef] = []
    with channel(endpoint) as ch:
        stub = ps_grpc.PullServiceStub(ch)
        for topic in topics:
            try:
                route = stub.QueryRoute(
                    ps.QueryRouteRequest(topic=topic), timeout=CALL_TIMEOUT_S
                ).route
            except grpc.RpcError as e:
                if e.code() == grpc.StatusCode.NOT_FOUND:
                    raise BasaltSourceError(
                        f"topic {topic!r} does not exist (pull-service {endpoint})"
                    ) from e
                raise _refusal(f"route of topic {topic!r}", endpoint, e) from e
            addresses = {b.broker_name: b.address for b in route.broker_datas}
            for qd in route.queue_datas:
                if qd.broker_name in addresses:
                    out.extend(
                        QueueRef(topic, qd.broker_name, q, addresses[qd.broker_name])
                        for q in range(qd.read_queue_nums)
                    )
    return sorted(out)


def _on_store_node(queue: QueueRef, what: str, call: Callable[[sn_grpc.StoreNodeStub], T]) -> T:
    """``call`` on the stub of ``queue``'s store-node; a failure becomes a
    :class:`BasaltSourceError` saying ``what`` failed on which queue.

    Channels are kept per address for the process: planning calls each
    store-node once per queue, and a channel per call would connect again."""
    with _lock:
        ch = _store_channels.get(queue.address)
        if ch is None:
            ch = _store_channels[queue.address] = channel(queue.address)
    try:
        return call(sn_grpc.StoreNodeStub(ch))
    except grpc.RpcError as e:
        raise _refusal(f"{what} of {queue.broker}/{queue.queue_id}", queue.address, e) from e


def min_max(queue: QueueRef) -> tuple[int, int]:
    """The queue's first stored offset and one past its last (0, 0 if never written)."""
    got = _on_store_node(
        queue,
        "offsets",
        lambda stub: stub.GetMinMaxOffset(
            sn.GetMinMaxOffsetRequest(topic=queue.topic, queue_id=queue.queue_id),
            timeout=CALL_TIMEOUT_S,
        ),
    )
    return got.min_offset, got.max_offset


def search_offset(queue: QueueRef, timestamp_ms: int) -> int:
    """``SearchOffset``'s answer for ``timestamp_ms`` on ``queue`` (RocketMQ
    4.x's rule: the first message stored at that ms, else the nearer neighbour)."""
    request = sn.SearchOffsetRequest(
        topic=queue.topic, queue_id=queue.queue_id, timestamp_ms=timestamp_ms
    )
    return _on_store_node(
        queue, "time search", lambda stub: stub.SearchOffset(request, timeout=CALL_TIMEOUT_S)
    ).offset


def commit_offset(queue: QueueRef, group: str, offset: int) -> None:
    """Store ``offset`` as ``group``'s next offset of ``queue`` (unfenced, as
    admin tools commit), so ``consumerProgress`` shows the pipeline."""
    request = sn.UpdateConsumerOffsetRequest(
        group=group, topic=queue.topic, queue_id=queue.queue_id, offset=offset
    )
    _on_store_node(
        queue, "commit", lambda stub: stub.UpdateConsumerOffset(request, timeout=CALL_TIMEOUT_S)
    )


def pull_range(
    endpoint: str,
    *,
    group: str,
    topic: str,
    broker: str,
    queue_id: int,
    start: int,
    end: int,
    subscription: pb.Subscription | None,
    max_nums: int,
) -> Iterator[pb.Records]:
    """The stored records of queue offsets ``[start, end)`` of one queue, pulled
    through the pull-service at ``endpoint`` with ``subscription`` applied on
    the store-node: one :class:`Records` per answer, in offset order. A
    record past ``end`` may be in the last answer: the caller drops it.

    Offsets no longer stored (expired) are skipped to the store's corrected
    offset; a queue that ends before ``end`` (the range was planned on a
    later max) ends the iteration. A refused pull raises
    :class:`BasaltSourceError`."""
    offset = start
    with channel(endpoint) as ch:
        stub = ps_grpc.PullServiceStub(ch)
        queue = pb.MessageQueue(topic=topic, broker_name=broker, queue_id=queue_id)
        while offset < end:
            request = ps.PullRequest(
                group=group, queue=queue, offset=offset, max_nums=min(max_nums, end - offset)
            )
            if subscription is not None:
                request.subscription.CopyFrom(subscription)
            try:
                got = stub.Pull(request, timeout=PULL_TIMEOUT_S)
            except grpc.RpcError as e:
                raise _refusal(f"pull of {topic}/{broker}/{queue_id}@{offset}", endpoint, e) from e
            if got.status == pb.PULL_STATUS_FOUND:
                yield got.records
            elif got.status == pb.PULL_STATUS_NO_NEW_MSG:
                return
            # NO_MATCHED_MSG scanned past non-matching units; OFFSET_ILLEGAL
            # corrects an offset the store no longer holds: both move forward.
            if got.next_begin_offset <= offset:
                return
            offset = got.next_begin_offset


def check_subscription(endpoint: str, group: str, queue: QueueRef, sub: pb.Subscription) -> None:
    """One pull on ``queue`` with ``sub`` at the queue's max offset (so it
    returns no record and counts no read), so that an expression the
    pull-service cannot parse fails on the driver, before any task runs.

    Raises :class:`BasaltSourceError` quoting the pull-service's refusal."""
    request = ps.PullRequest(
        group=group,
        queue=pb.MessageQueue(topic=queue.topic, broker_name=queue.broker, queue_id=queue.queue_id),
        offset=min_max(queue)[1],
        max_nums=1,
        subscription=sub,
    )
    try:
        with channel(endpoint) as ch:
            ps_grpc.PullServiceStub(ch).Pull(request, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.INVALID_ARGUMENT:
            raise BasaltSourceError(
                f"subscription {sub.expression!r} is refused: {e.details()}"
            ) from e
        raise _refusal(f"pull of {queue.topic}/{queue.broker}/{queue.queue_id}", endpoint, e) from e
