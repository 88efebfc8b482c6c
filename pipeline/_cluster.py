"""The source's blocking gRPC calls to a Basalt cluster, on the driver and the executors.

The driver asks the pull-service for routes (``QueryRoute``) and each queue's
store-node for its bounds (``GetMinMaxOffset``), a time's offset
(``SearchOffset``) and, in streaming, a group's progress
(``UpdateConsumerOffset``). Executors look their queues' store-node up in
the route once per task and read from it directly (``GetMessages``, several
queues a call when a partition holds several), the subscription applied on
the store-node; the pull-service is not a relay for the bytes. Every call is
blocking: Spark calls the source from plain threads, with no event loop.

Failures the user can act on become :class:`BasaltSourceError` with a message
naming the endpoint, topic or queue; the original gRPC error is chained.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
from google.protobuf.descriptor import Descriptor

from basalt.client.channels import MAX_MESSAGE_BYTES
from basalt.common import auth, dial
from basalt.common import tls as transport
from basalt.common.protowire import WireFormatError, fields
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
_store_stubs: dict[str, sn_grpc.StoreNodeStub] = {}
#: GetMessages answering its serialized bytes (see :func:`_pull_results`), per address.
_raw_get_messages: dict[str, grpc.UnaryUnaryMultiCallable[sn.GetMessagesRequest, bytes]] = {}


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
    Spark's executors inherit the driver's environment), calls signed with the
    credentials file ``BASALT_CREDENTIALS`` names (auth.credentials_from_env)."""
    return dial.sync_channel(
        address,
        transport.from_env(),
        options=_CHANNEL_OPTIONS,
        credentials=auth.credentials_from_env(),
    )


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
    store-node once per queue, and a channel per call would connect again;
    so is the stub (making one builds a callable per method: a task's
    thousand reads would pay that each)."""
    with _lock:
        stub = _store_stubs.get(queue.address)
        if stub is None:
            ch = channel(queue.address)
            stub = _store_stubs[queue.address] = sn_grpc.StoreNodeStub(ch)
            _raw_get_messages[queue.address] = ch.unary_unary(
                "/basalt.v1.StoreNode/GetMessages",
                request_serializer=sn.GetMessagesRequest.SerializeToString,
                response_deserializer=None,  # the bytes: _pull_results reads them in place
            )
    try:
        return call(stub)
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


def _number(message: Descriptor, field: str) -> int:
    return int(message.fields_by_name[field].number)


_RESULTS = _number(pb.PullBatchResponse.DESCRIPTOR, "results")
_STATUS = _number(pb.PullResponse.DESCRIPTOR, "status")
_NEXT_BEGIN = _number(pb.PullResponse.DESCRIPTOR, "next_begin_offset")
_RECORDS = _number(pb.PullResponse.DESCRIPTOR, "records")
_REFUSED = _number(pb.PullResponse.DESCRIPTOR, "refused")
_DATA = _number(pb.Records.DESCRIPTOR, "data")
_COUNT = _number(pb.Records.DESCRIPTOR, "count")


@dataclass(frozen=True, slots=True)
class _Result:
    """What :func:`read_ranges` needs of one ``PullResponse``."""

    status: int
    next_begin_offset: int
    data: memoryview | None
    refused: str | None
    count: int = 0  # the records ``data`` holds, as the store-node says


def _pull_results(answer: bytes) -> list[_Result]:
    """The entries of a serialized ``PullBatchResponse``, each record block a
    view of ``answer``: protobuf's parse would copy the ~1 MiB blocks into
    the message and reading ``records.data`` would copy them again. Fields
    other than these are skipped (commit, min/max offsets, decoded messages)."""
    out = []
    try:
        for field, entry in fields(memoryview(answer)):
            if field != _RESULTS or not isinstance(entry, memoryview):
                continue
            status = next_begin = count = 0
            data = refused = None
            for number, value in fields(entry):
                if number == _STATUS and isinstance(value, int):
                    status = value
                elif number == _NEXT_BEGIN and isinstance(value, int):
                    next_begin = value
                elif number == _RECORDS and isinstance(value, memoryview):
                    for inner, block in fields(value):
                        if inner == _DATA and isinstance(block, memoryview):
                            data = block
                        elif inner == _COUNT and isinstance(block, int):
                            count = block
                elif number == _REFUSED and isinstance(value, memoryview):
                    refused = pb.Refused.FromString(bytes(value)).message or "refused"
            out.append(_Result(status, next_begin, data, refused, count))
    except WireFormatError as e:
        raise BasaltSourceError(f"a store-node answer has {e}") from None
    return out


#: A queue range to read: (queue, first offset, one past the last).
QueueRange = tuple[QueueRef, int, int]


def queue_ref(endpoint: str, topic: str, broker: str, queue_id: int) -> QueueRef:
    """``topic``'s queue ``queue_id`` on ``broker`` with the store-node address
    the route gives now (an executor asks once per task: a checkpoint or a
    plan holds no address, and a store-node may have moved since).

    Raises :class:`BasaltSourceError` when the route no longer has the queue."""
    for q in queues_of(endpoint, [topic]):
        if q.broker == broker and q.queue_id == queue_id:
            return q
    raise BasaltSourceError(
        f"queue {topic}/{broker}/{queue_id} is not in the route (pull-service {endpoint})"
    )


def read_ranges(
    ranges: Sequence[QueueRange],
    *,
    group: str,
    subscription: pb.Subscription | None,
    max_nums: int,
) -> Iterator[tuple[int, memoryview, int]]:
    """The stored records of each queue range (all on one store-node, no
    queue twice), read from the store-node directly: one ``GetMessages`` per
    round, one entry per range not yet done, ``subscription`` applied on the
    store-node. Yields (index in ``ranges``, the records' bytes: a view of
    the answer, how many records the store-node says they are: 0 when it
    does not say) per answer with records, each range's in offset order. A
    record past a range's end may be in its last answer (a filtered read
    scans on): the caller drops it.

    Offsets no longer stored (expired) are skipped to the store's corrected
    offset; a queue that ends before its range does (planned on a later
    max) ends that range. A refused read raises :class:`BasaltSourceError`.
    Not through the pull-service: it would relay every byte once more (its
    ``Pull`` is ``GetMessage`` on the same store-node)."""
    if not ranges:
        return
    address = ranges[0][0].address
    at = {i: start for i, (_, start, _) in enumerate(ranges)}
    while at := {i: o for i, o in at.items() if o < ranges[i][2]}:
        order = sorted(at)
        request = sn.GetMessagesRequest()
        for i in order:
            queue, _, end = ranges[i]
            entry = request.reads.add(
                group=group,
                topic=queue.topic,
                queue_id=queue.queue_id,
                offset=at[i],
                max_msg_nums=min(max_nums, end - at[i]),
            )
            if subscription is not None:
                entry.subscription.CopyFrom(subscription)
        answer = _on_store_node(
            ranges[order[0]][0],
            "read",
            lambda _: _raw_get_messages[address](request, timeout=PULL_TIMEOUT_S),  # noqa: B023
        )
        results = _pull_results(answer)
        if len(results) != len(order):
            raise BasaltSourceError(
                f"{address} answered {len(results)} reads to a GetMessages of {len(order)}"
            )
        for i, got in zip(order, results, strict=True):
            queue = ranges[i][0]
            if got.refused is not None:
                raise BasaltSourceError(
                    f"read of {queue.topic}/{queue.broker}/{queue.queue_id}@{at[i]}: "
                    f"{address} refused it: {got.refused}"
                )
            if got.status == pb.PULL_STATUS_FOUND and got.data is not None:
                yield i, got.data, got.count
            elif got.status == pb.PULL_STATUS_NO_NEW_MSG:
                at[i] = ranges[i][2]
                continue
            # NO_MATCHED_MSG scanned past non-matching units; OFFSET_ILLEGAL
            # corrects an offset the store no longer holds: both move forward.
            at[i] = got.next_begin_offset if got.next_begin_offset > at[i] else ranges[i][2]


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
