"""The producer when a store-node's SendStream breaks: typed errors at once, and
the sends retried on another broker.

First against fake store-nodes (real grpc.aio servers on port 0 whose
SendStream handler aborts or returns mid-stream, and a fake pull-service
whose route names them), then against real processes: two store-nodes on a
real etcd, one killed with SIGKILL while a producer sends continuously.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from basalt.client import ClientError, Producer, ProducerConfig, ServiceUnavailableError
from basalt.client.producer import SendResult, _Stream
from basalt.client.tasks import TaskOwner
from basalt.common.message import Message
from basalt.services.cluster.etcd import EtcdProcess
from basalt.v1 import common_pb2 as pb
from basalt.v1 import pull_service_pb2 as ps
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.etcd import unique_cluster
from tests.support.processes import TOPIC, ServiceProcess, create_topic, start_processes

#: What a fake store-node's SendStream does with the requests it reads.
Behaviour = Callable[
    [AsyncIterator[sn.SendStreamRequest], grpc.aio.ServicerContext[Any, Any]],
    AsyncIterator[sn.SendStreamResponse],
]


async def answer_all(
    requests: AsyncIterator[sn.SendStreamRequest], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[sn.SendStreamResponse]:
    """A healthy store-node: every item stored at the next queue offset."""
    offset = 0
    async for request in requests:
        answers = []
        for item in request.items:
            answers.append(
                sn.SendStreamAnswer(
                    opaque=item.opaque,
                    result=pb.SendResult(
                        status=pb.SEND_STATUS_SEND_OK,
                        queue_offsets=[offset],
                        offset_msg_ids=[f"id{offset}"],
                    ),
                )
            )
            offset += 1
        yield sn.SendStreamResponse(answers=answers)


async def abort_after_first_request(
    requests: AsyncIterator[sn.SendStreamRequest], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[sn.SendStreamResponse]:
    """A store-node failing mid-stream: reads a request, answers nothing, aborts."""
    async for _request in requests:
        await context.abort(grpc.StatusCode.UNAVAILABLE, "store-node going away")
    yield sn.SendStreamResponse()  # pragma: no cover - never reached


async def return_after_first_request(
    requests: AsyncIterator[sn.SendStreamRequest], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[sn.SendStreamResponse]:
    """A store-node ending the stream (status OK) with sends unanswered."""
    async for _request in requests:
        return
    yield sn.SendStreamResponse()  # pragma: no cover - never reached


async def never_answer(
    requests: AsyncIterator[sn.SendStreamRequest], context: grpc.aio.ServicerContext[Any, Any]
) -> AsyncIterator[sn.SendStreamResponse]:
    """A hung store-node: reads every request, answers none."""
    async for _request in requests:
        pass
    yield sn.SendStreamResponse()


class _FakeStoreNode:
    """SendStream only (the other RPCs are unimplemented), counting its calls."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.streams = 0

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            sn.DESCRIPTOR.services_by_name["StoreNode"].full_name,
            {
                "SendStream": grpc.stream_stream_rpc_method_handler(
                    self.SendStream,
                    request_deserializer=sn.SendStreamRequest.FromString,
                    response_serializer=sn.SendStreamResponse.SerializeToString,
                )
            },
        )

    async def SendStream(
        self,
        request_iterator: AsyncIterator[sn.SendStreamRequest],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> AsyncIterator[sn.SendStreamResponse]:
        # An async generator itself: grpc.aio streams responses only from one.
        self.streams += 1
        async for response in self.behaviour(request_iterator, context):
            yield response


class _FakePullService:
    """QueryRoute only: any topic on the fake store-nodes, one writable queue each."""

    def __init__(self, brokers: dict[str, str]) -> None:
        self.brokers = brokers

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            ps.DESCRIPTOR.services_by_name["PullService"].full_name,
            {
                "QueryRoute": grpc.unary_unary_rpc_method_handler(
                    self.QueryRoute,
                    request_deserializer=ps.QueryRouteRequest.FromString,
                    response_serializer=ps.QueryRouteResponse.SerializeToString,
                )
            },
        )

    async def QueryRoute(
        self, request: ps.QueryRouteRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ps.QueryRouteResponse:
        route = pb.TopicRoute(topic=request.topic)
        for name, address in self.brokers.items():
            route.broker_datas.add(broker_name=name, address=address, store_host=address, perm=6)
            route.queue_datas.add(broker_name=name, read_queue_nums=1, write_queue_nums=1, perm=6)
        return ps.QueryRouteResponse(route=route)


@asynccontextmanager
async def fake_cluster(
    **brokers: Behaviour,
) -> AsyncIterator[tuple[str, dict[str, _FakeStoreNode]]]:
    """A fake store-node per keyword (broker name -> behaviour) and a fake
    pull-service routing TOPIC over them; yields the pull-service's address
    and the store-nodes by broker name."""
    servers = []
    nodes: dict[str, _FakeStoreNode] = {}
    addresses: dict[str, str] = {}
    try:
        for name, behaviour in brokers.items():
            server = grpc.aio.server()
            nodes[name] = _FakeStoreNode(behaviour)
            server.add_generic_rpc_handlers((nodes[name].handler(),))
            addresses[name] = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
            servers.append(server)
            await server.start()
        server = grpc.aio.server()
        server.add_generic_rpc_handlers((_FakePullService(addresses).handler(),))
        pull = f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}"
        servers.append(server)
        await server.start()
        yield pull, nodes
    finally:
        for server in servers:
            await server.stop(grace=None)


def producer(pull: str, **config: Any) -> Producer:
    return Producer(pull, group="P", config=ProducerConfig(producer_group="P", **config))


async def outcomes(sends: Sequence[Awaitable[SendResult]]) -> list[SendResult | BaseException]:
    return list(await asyncio.gather(*sends, return_exceptions=True))


# -- a stream whose call ends --------------------------------------------------------------


@pytest.mark.parametrize("behaviour", [abort_after_first_request, return_after_first_request])
@async_test
async def test_a_broken_stream_fails_its_sends_at_once_with_service_unavailable(
    behaviour: Behaviour,
) -> None:
    # No other broker and no retries: the stream's own failure reaches the caller,
    # long before the 30 s deadline.
    async with (
        fake_cluster(**{"broker-a": behaviour}) as (pull, _),
        producer(pull, retry_times_when_send_failed=0, send_msg_timeout_ms=30_000) as p,
    ):
        started = time.monotonic()
        got = await outcomes([p.send(Message(TOPIC, b"%d" % i)) for i in range(20)])
        assert time.monotonic() - started < 15  # not the deadline (30 s): a hang's cap
        assert all(isinstance(e, ServiceUnavailableError) for e in got), got
        assert all("SendStream to 127.0.0.1:" in str(e) for e in got), got


@async_test
async def test_a_send_on_a_stream_whose_reader_ended_fails_at_once() -> None:
    async with (
        fake_cluster(**{"broker-a": abort_after_first_request}) as (pull, _),
        producer(pull) as p,
    ):
        (queue,) = await p.route(TOPIC)
        channel = grpc.aio.insecure_channel(queue.address)
        tasks = TaskOwner()
        stream = _Stream(channel, queue.address, tasks)
        first = asyncio.ensure_future(stream.send(1, [b""]))
        with pytest.raises(ServiceUnavailableError):
            await first
        await asyncio.wait([stream.reader])  # the reader ended (the call aborted)
        assert stream.broken
        # Registered after the reader ended: refused at once, not left to its timeout.
        with pytest.raises(ServiceUnavailableError, match="broke: UNAVAILABLE"):
            await asyncio.wait_for(stream.send(2, [b""]), 5)
        assert stream.waiting == {}
        stream.close()
        await tasks.close()
        await channel.close()


@async_test
async def test_sends_on_a_broken_stream_are_retried_on_the_other_broker() -> None:
    async with (
        fake_cluster(**{"broker-a": abort_after_first_request, "broker-b": answer_all}) as (
            pull,
            nodes,
        ),
        producer(pull) as p,
    ):
        # Round robin puts every other send on broker-a, whose stream breaks under
        # them: each is retried on broker-b.
        got = await outcomes([p.send(Message(TOPIC, b"%d" % i)) for i in range(20)])
        assert all(isinstance(r, SendResult) and r.broker_name == "broker-b" for r in got), got
        assert nodes["broker-a"].streams >= 1
        # The broken stream is not reused: later sends open a fresh one (and retry).
        again = await outcomes([p.send(Message(TOPIC, b"again%d" % i)) for i in range(4)])
        assert all(isinstance(r, SendResult) and r.ok for r in again), again
        assert nodes["broker-a"].streams >= 2


@async_test
async def test_a_silent_store_node_fails_the_send_at_its_deadline_saying_so() -> None:
    async with (
        fake_cluster(**{"broker-a": never_answer}) as (pull, _),
        producer(pull, retry_times_when_send_failed=0, send_msg_timeout_ms=300) as p,
    ):
        with pytest.raises(ServiceUnavailableError, match="did not answer within"):
            await p.send(Message(TOPIC, b"x"))


@async_test
async def test_sends_in_flight_when_the_producer_closes_fail_typed() -> None:
    async with fake_cluster(**{"broker-a": never_answer}) as (pull, nodes):
        p = producer(pull, send_msg_timeout_ms=30_000)
        await p.start()
        sends = [asyncio.ensure_future(p.send(Message(TOPIC, b"%d" % i))) for i in range(5)]
        while not nodes["broker-a"].streams:
            await asyncio.sleep(0.01)
        await p.close()
        got = await outcomes(sends)
        assert all(isinstance(e, ServiceUnavailableError) for e in got), got


# -- a real store-node killed ----------------------------------------------------------------


@async_test(timeout_s=120)
async def test_sigkill_of_a_store_node_while_sending_reaches_the_caller_only_as_client_errors(
    tmp_path: Path,
    etcd: EtcdProcess,
    processes: list[ServiceProcess],
) -> None:
    cluster = unique_cluster()
    # A lease longer than the test: the dead node stays in the route, so sends
    # keep being routed to it and must be retried on the other.
    nodes, pull = start_processes(tmp_path, etcd, cluster, 30, processes)
    await create_topic(etcd, cluster)
    # A generous deadline: a loaded CI machine is slow, not broken.
    async with producer(pull.address, send_msg_timeout_ms=15_000) as p:
        killed_at: float | None = None
        after_kill: list[SendResult | BaseException] = []
        unexpected: list[BaseException] = []
        stop = False

        async def sender(k: int) -> None:
            n = 0
            while not stop:
                started = time.monotonic()
                try:
                    outcome: SendResult | BaseException = await p.send(
                        Message(TOPIC, b"%d-%d" % (k, n))
                    )
                except ClientError as e:
                    outcome = e
                except Exception as e:  # the bug: anything else leaking out
                    unexpected.append(e)
                    outcome = e
                if killed_at is not None and started > killed_at:
                    after_kill.append(outcome)
                n += 1

        senders = [asyncio.ensure_future(sender(k)) for k in range(8)]
        await asyncio.sleep(1.0)
        nodes["broker-a"].stop(signal.SIGKILL)  # returns once the process is gone
        killed_at = time.monotonic()
        await asyncio.sleep(2.0)
        stop = True
        await asyncio.gather(*senders)
        # The dead node was in the route throughout (its lease outlives the
        # test), so round robin kept sending there first: every such send was
        # retried on broker-b.
        assert {q.broker_name for q in await p.route(TOPIC, refresh=True)} == {
            "broker-a",
            "broker-b",
        }

    assert unexpected == []
    # Every send started after the kill succeeded, on the survivor.
    assert len(after_kill) >= 10
    assert all(isinstance(r, SendResult) and r.ok for r in after_kill), [
        r for r in after_kill if not isinstance(r, SendResult)
    ][:5]
    assert {r.broker_name for r in after_kill if isinstance(r, SendResult)} == {"broker-b"}
