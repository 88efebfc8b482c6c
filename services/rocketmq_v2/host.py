"""Where the v2 front runs: what it reads and dials, in a pull-service or a store-node.

One front, two homes, as RocketMQ 5's proxy has two modes (docs/rocketmq-v2.md):

* **in a pull-service** (RocketMQ 5's "cluster" mode): every store-node is
  reached over gRPC and a route names the access point the client called;
* **in a store-node** (RocketMQ 5's "local" mode, the proxy inside the
  broker): a call for this node's own queues goes to its StoreNode servicer
  in-process (:class:`LocalStoreNode`: no gRPC hop, no serialization), any
  other over gRPC as from a pull-service; a route names each broker's own
  front (:class:`FrontDirectory`), so the official clients send, pop and ack
  where the data is.

:class:`FrontHost` is what either gives the front: the etcd view (topics,
brokers), the channels to store-nodes, and in a store-node the local node
and the directory of fronts. The front keeps nothing else.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from basalt.common.message import encode_host
from basalt.common.receipt import ReceiptHandle
from basalt.services.errors import Refusal, as_refusal, refused
from basalt.services.meta.model import BrokerRegistration, FrontRegistration, TopicConfig
from basalt.store.pop import AckStatus
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

if TYPE_CHECKING:
    from basalt.services.meta.client import MetaClient
    from basalt.services.meta.watch import MetaWatcher
    from basalt.services.pull_service.channels import ChannelPool, StoreHosts
    from basalt.services.pull_service.service import PullServiceServicer


class BrokerLookup(Protocol):
    """A broker's registration by name (the pull-service's forgiving lookup,
    :class:`basalt.services.pull_service.broker_grace.RegisteredBrokers`)."""

    def get(self, name: str) -> BrokerRegistration | None: ...


class LocalServicer(Protocol):
    """What :class:`LocalStoreNode` calls besides the unary RPCs by name
    (:class:`basalt.services.store_node.service.StoreNodeServicer`)."""

    async def send(self, request: sn.SendBatchRequest) -> pb.SendResult: ...

    def start_send(
        self, request: sn.SendBatchRequest, on_done: Callable[[pb.SendResult | Refusal], None]
    ) -> bool: ...

    async def ack_handles(
        self, group: str, topic: str, handles: Sequence[ReceiptHandle]
    ) -> list[AckStatus]: ...


class LocalStoreNode:
    """The store-node a front runs in, called in-process.

    :meth:`call` runs a StoreNode RPC's own method without the gRPC wrapper
    around it (:func:`basalt.services.rpc.rpc_method`), so the checks,
    refusals and answers are what a remote caller gets, minus the call:
    the request and answer objects are handed over, never serialized. A
    refusal raises :class:`Refusal`, as the remote call's
    :func:`basalt.services.errors.downstream_refusal` does. The StoreNode
    methods called so do not use their context (None is passed).

    ``address`` is the node's registered StoreNode address: a broker name is
    this node only while ``brokers/<name>`` names that address (a slave of the
    group is not its broker; the master is called over gRPC). ``store_host``:
    its STOREHOSTADDRESS (``ip:port``), which its records carry.

    :meth:`send_records` and :meth:`ack` are the two calls the official
    clients make once per message (a send, an ack): they skip the request
    and answer messages the RPCs take and give, not only the call."""

    def __init__(
        self, servicer: LocalServicer, broker_name: str, address: str, store_host: str
    ) -> None:
        self.servicer = servicer
        self.broker_name = broker_name
        self.address = address
        self.store_host = encode_host(store_host)
        self._methods: dict[str, Callable[[Any, Any, Any], Awaitable[Any]]] = {}

    def serves(self, broker: str, address: str) -> bool:
        """Whether ``broker`` registered at ``address`` is this node."""
        return broker == self.broker_name and address == self.address

    def _method(self, rpc: str) -> Callable[[Any, Any, Any], Awaitable[Any]]:
        method = self._methods.get(rpc)
        if method is None:
            wrapped = getattr(type(self.servicer), rpc)
            method = self._methods[rpc] = getattr(wrapped, "__wrapped__", wrapped)
        return method

    async def call(self, rpc: str, request: Any) -> Any:
        """StoreNode ``rpc`` in-process: its answer; Refusal when it refuses."""
        try:
            return await self._method(rpc)(self.servicer, request, None)
        except Refusal:
            raise
        except Exception as e:
            raise as_refusal(e, rpc) from None

    def start(self, rpc: str, request: Any) -> asyncio.Task[Any]:
        """:meth:`call` as a task the caller may cancel."""
        return asyncio.ensure_future(self.call(rpc, request))

    async def send_records(self, topic: str, queue_id: int, records: bytes) -> pb.SendResult:
        """Store encoded ``records`` in ``queue_id`` of ``topic`` as a SendBatch
        of records is stored (its checks, its answer); Refusal when refused.
        Answered from the store's write callback (SendStream's way), or by the
        awaited send when the topic must be created first."""
        request = sn.SendBatchRequest(topic=topic, queue_id=queue_id, records=records)
        done: asyncio.Future[pb.SendResult | Refusal] = asyncio.get_running_loop().create_future()

        def settle(outcome: pb.SendResult | Refusal) -> None:
            if not done.done():  # the caller may have gone (its deadline)
                done.set_result(outcome)

        try:
            if not self.servicer.start_send(request, settle):
                return await self.servicer.send(request)
        except Refusal:
            raise
        except Exception as e:
            raise as_refusal(e, "SendBatch") from None
        outcome = await done
        if isinstance(outcome, Refusal):
            raise outcome
        return outcome

    async def ack(
        self, group: str, topic: str, handles: Sequence[ReceiptHandle]
    ) -> list[AckStatus]:
        """Ack decoded handles of this node and ``topic`` (AckMessages' checks);
        each one's status. Refusal when refused (the topic unknown here, the
        node stopping or not master)."""
        try:
            return await self.servicer.ack_handles(group, topic, handles)
        except Refusal:
            raise
        except Exception as e:
            raise as_refusal(e, "AckMessages") from None

    async def send(self, batches: list[sn.SendBatchRequest]) -> list[sn.SendStreamAnswer]:
        """Store each batch (a SendBatch each, side by side); their answers in
        order, each a ``result`` or a ``refused``, as SendStream answers them."""

        async def one(batch: sn.SendBatchRequest) -> sn.SendStreamAnswer:
            try:
                return sn.SendStreamAnswer(result=await self.servicer.send(batch))
            except Exception as e:
                return sn.SendStreamAnswer(refused=refused(as_refusal(e, "SendBatch")))

        if len(batches) == 1:
            return [await one(batches[0])]
        return list(await asyncio.gather(*(one(b) for b in batches)))


class FrontDirectory:
    """The store-nodes' own fronts (``rocketmq-v2/`` in etcd): which endpoint
    serves a broker's queues now. Reads never wait (the watch cache)."""

    def __init__(self, fronts: MetaWatcher[FrontRegistration], brokers: BrokerLookup) -> None:
        self._fronts = fronts
        self._brokers = brokers

    def endpoint_of(self, broker: str) -> str | None:
        """``host:port`` of the front of ``broker``'s master (the member whose
        address ``brokers/<broker>`` names); None when it has none (a broker
        serving no front, or down)."""
        registration = self._brokers.get(broker)
        if registration is None:
            return None
        for front in self._fronts.snapshot().values():
            if front.broker_name == broker and front.address == registration.address:
                return front.endpoint
        return None


@dataclass(frozen=True, slots=True)
class FrontHost:
    """What the front reads and dials (module docstring); built by its process."""

    topics: MetaWatcher[TopicConfig]
    #: The brokers' watch, for the check relay to follow changes.
    broker_watch: MetaWatcher[BrokerRegistration]
    brokers: BrokerLookup
    channels: ChannelPool
    store_hosts: StoreHosts
    meta: MetaClient
    #: Names this front to the store-nodes (their logs of check watchers).
    listener_id: str
    max_message_bytes: int
    #: The store-node this front runs in; None in a pull-service.
    local: LocalStoreNode | None = None
    #: The store-nodes' fronts a route names; None: the access point called.
    fronts: FrontDirectory | None = None

    @classmethod
    def of_pull_service(cls, pull: PullServiceServicer) -> FrontHost:
        """A pull-service's view and channels (RocketMQ 5's cluster mode)."""
        return cls(
            topics=pull.view.topics,
            broker_watch=pull.view.brokers,
            brokers=pull.brokers,
            channels=pull.channels,
            store_hosts=pull.store_hosts,
            meta=pull.meta,
            listener_id=f"rocketmq-v2@{pull.config.pull_service_id}",
            max_message_bytes=pull.config.max_message_bytes,
        )

    def local_at(self, broker: str, address: str) -> LocalStoreNode | None:
        """The local node when ``broker`` registered at ``address`` is it."""
        local = self.local
        return local if local is not None and local.serves(broker, address) else None
