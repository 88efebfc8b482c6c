"""The pull-service's outbound gRPC: one cached channel per address.

Every store-node (and every other pull-service, for forwarded commands) is
reached through one ``grpc.aio`` channel per address, created on first use
and shared by all calls to it: a channel multiplexes any number of
concurrent calls, and creating one per call would cost a TCP and HTTP/2
handshake each time. The channels retry connecting quickly (100 ms up to
1 s backoff rather than gRPC's 1 s up to 120 s) because a restarted
store-node should be readable again within a second, not minutes.

A downstream failure is never passed through as the pull-service's own
error: :func:`basalt.services.errors.downstream_refusal` names the peer that
failed.

Concurrency: one event loop; channels belong to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc

from basalt.common import dial
from basalt.common import tls as transport
from basalt.v1 import pull_service_pb2_grpc as ps_grpc
from basalt.v1 import store_node_pb2 as sn
from basalt.v1 import store_node_pb2_grpc as sn_grpc

log = logging.getLogger(__name__)

_STORE_NODE = sn.DESCRIPTOR.services_by_name["StoreNode"]
#: StoreNode.GetMessages' method path, for the undecoded call.
GET_MESSAGES = dial.rpc_path(_STORE_NODE.methods_by_name["GetMessages"])
#: StoreNode.SendStream's path, opened by :func:`basalt.common.dial.open_stream`.
SEND_STREAM = dial.rpc_path(_STORE_NODE.methods_by_name["SendStream"])
#: How long an evicted channel lets its in-flight calls (held pulls) finish.
_EVICT_GRACE_S = 30.0
#: How long QueryRoute waits for a store-node to say its store host.
_STORE_HOST_TIMEOUT_S = 1.0


class ChannelPool:
    """Channels and stubs by address (TLS when ``tls`` is enabled); :meth:`close`
    them all when stopping."""

    def __init__(self, *, max_message_bytes: int, tls: transport.TlsConfig | None = None) -> None:
        self._tls = tls
        self._options = (
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.min_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
        )
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._store_nodes: dict[str, sn_grpc.StoreNodeAsyncStub] = {}
        self._pull_services: dict[str, ps_grpc.PullServiceAsyncStub] = {}
        self._raw_get_messages: dict[str, grpc.aio.UnaryUnaryMultiCallable[Any, bytes]] = {}
        #: Evicted channels still letting their calls finish, and the task doing it.
        self._evicted: dict[grpc.aio.Channel, asyncio.Task[None]] = {}

    def _channel(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = dial.channel(address, self._tls, options=self._options)
            self._channels[address] = channel
        return channel

    def store_node(self, address: str) -> sn_grpc.StoreNodeAsyncStub:
        stub = self._store_nodes.get(address)
        if stub is None:
            stub = sn_grpc.StoreNodeStub(self._channel(address))
            self._store_nodes[address] = stub
        return stub

    def open_send_stream(self, address: str) -> grpc.aio.StreamStreamCall[Any, Any]:
        """A new StoreNode.SendStream to ``address`` (:func:`basalt.common.dial.open_stream`)."""
        return dial.open_stream(
            self._channel(address),
            SEND_STREAM,
            sn.SendStreamRequest.SerializeToString,
            sn.SendStreamResponse.FromString,
        )

    def get_messages_raw(self, address: str) -> grpc.aio.UnaryUnaryMultiCallable[Any, bytes]:
        """StoreNode.GetMessages answering its serialized PullBatchResponse,
        undecoded (the pull-service passes it through)."""
        call = self._raw_get_messages.get(address)
        if call is None:
            call = self._channel(address).unary_unary(
                GET_MESSAGES,
                request_serializer=sn.GetMessagesRequest.SerializeToString,
                response_deserializer=None,
            )
            self._raw_get_messages[address] = call
        return call

    def pull_service(self, address: str) -> ps_grpc.PullServiceAsyncStub:
        stub = self._pull_services.get(address)
        if stub is None:
            stub = ps_grpc.PullServiceStub(self._channel(address))
            self._pull_services[address] = stub
        return stub

    def evict(self, address: str) -> None:
        """Forget ``address`` (its owner left or moved); its channel closes in the
        background once in-flight calls finish (at most a grace period)."""
        channel = self._channels.pop(address, None)
        self._store_nodes.pop(address, None)
        self._raw_get_messages.pop(address, None)
        self._pull_services.pop(address, None)
        if channel is not None:
            task = asyncio.get_running_loop().create_task(channel.close(_EVICT_GRACE_S))
            self._evicted[channel] = task
            task.add_done_callback(lambda _: self._evicted.pop(channel, None))

    async def close(self) -> None:
        """Close every channel now, evicted ones included (in-flight calls are
        cancelled). Idempotent."""
        closing = list(self._channels.values())
        self._channels.clear()
        self._store_nodes.clear()
        self._raw_get_messages.clear()
        self._pull_services.clear()
        for channel, task in list(self._evicted.items()):
            # Stop waiting out the grace period; the close below finishes the job.
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            closing.append(channel)
        for channel in closing:
            await channel.close()


class StoreHosts:
    """Each store-node's STOREHOSTADDRESS (BrokerData.store_host), asked once per
    (broker, address) through GetRuntimeInfo and remembered: the etcd
    registration holds the gRPC address, which need not be the store host."""

    def __init__(self, channels: ChannelPool) -> None:
        self._channels = channels
        self._known: dict[tuple[str, str], str] = {}

    async def of(self, brokers: dict[str, str]) -> dict[str, str]:
        """``broker name -> address`` to ``broker name -> store host``; a store-node
        that does not answer within a second is left out (asked again next time)."""
        missing = [(n, a) for n, a in brokers.items() if (n, a) not in self._known]
        if missing:
            await asyncio.gather(*(self._ask(n, a) for n, a in missing))
        return {n: self._known[(n, a)] for n, a in brokers.items() if (n, a) in self._known}

    async def _ask(self, name: str, address: str) -> None:
        try:
            info = await self._channels.store_node(address).GetRuntimeInfo(
                sn.GetRuntimeInfoRequest(), timeout=_STORE_HOST_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as e:
            log.info("store host of %s at %s unknown for now: %s", name, address, e.code().name)
            return
        self._known[(name, address)] = info.store_host


def call_timeout_s(context: grpc.aio.ServicerContext[object, object], budget_s: float) -> float:
    """The timeout of a downstream call: ``budget_s``, cut to what is left of the
    caller's own deadline so that the downstream call never outlives it."""
    remaining = context.time_remaining()
    return budget_s if remaining is None else max(0.0, min(budget_s, remaining))
