"""Running a store-node: the gRPC server, health, reflection, graceful stop.

:func:`start_store_node` opens the store, registers the StoreNode service,
``grpc.health.v1`` (SERVING once the store has recovered, NOT_SERVING for good
once a background service of the store fails - see store.failures) and
reflection, and
binds the address (port 0 picks a free port, for tests). :meth:`RunningStoreNode.stop`
is the SIGTERM path: refuse new work, let in-flight calls finish within the
grace period, then shut the store down cleanly (flush, dispatch catches up,
``abort`` removed) off the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health

from basalt.common.tls import TlsConfig
from basalt.services.meta.model import Perm
from basalt.services.process import (
    add_health_and_reflection,
    add_port,
    add_servicer,
    grpc_server,
    set_serving,
)
from basalt.services.store_node.ha.role import GroupMember
from basalt.services.store_node.long_polling import PullRequestHoldService
from basalt.services.store_node.service import StoreNodeConfig, StoreNodeServicer
from basalt.services.store_node.topics import TopicDirectory
from basalt.store import MessageStore, MessageStoreConfig
from basalt.store.failures import StoreFailure
from basalt.v1 import replication_pb2, store_node_pb2

log = logging.getLogger(__name__)

STORE_NODE_SERVICE = store_node_pb2.DESCRIPTOR.services_by_name["StoreNode"].full_name


@dataclass(slots=True)
class RunningStoreNode:
    """A started store-node; :meth:`stop` it exactly once."""

    server: grpc.aio.Server
    port: int
    store: MessageStore
    servicer: StoreNodeServicer
    health: health.aio.HealthServicer
    #: This node's broker group membership (None: a node without etcd).
    group: GroupMember | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def stop(self, grace_s: float = 5.0) -> bool:
        """Graceful stop: NOT_SERVING, no new calls, in-flight ones finish (up to
        ``grace_s``), then the store shuts down; returns whether it did so cleanly
        (see :meth:`MessageStore.shutdown`). A master hands its group over to a
        caught-up slave first (docs/replication.md#election-and-fencing)."""
        if self.group is not None:
            await self.group.hand_over(grace_s)
        self.servicer.writable = False
        self.servicer.hold.wake_all()  # held pulls answer now instead of being cancelled
        self.servicer.streams.end()  # producers' and consumers' streams end once answered
        await self.servicer.stop_transaction_checks()  # watch streams end, no round left
        await set_serving(self.health, STORE_NODE_SERVICE, False)
        await self.server.stop(grace_s)
        await self.servicer.hold.drain()  # no filtered read left in a thread
        if self.group is not None:
            await self.group.close()  # its member key goes now: the others need not wait
        self.servicer.metrics.close()
        clean = await asyncio.to_thread(self.store.shutdown)
        if clean:
            log.info("store-node stopped; store shut down cleanly")
        else:
            log.error("store-node stopped; the store did NOT shut down cleanly (abort left)")
        return clean


async def start_store_node(
    node: StoreNodeConfig,
    store_config: MessageStoreConfig,
    topics: TopicDirectory,
    *,
    listen: str = "127.0.0.1:0",
    ready: asyncio.Future[None] | None = None,
    tls: TlsConfig | None = None,
    broker_perm: Callable[[], Perm] | None = None,
    group: Callable[[MessageStore], GroupMember] | None = None,
) -> RunningStoreNode:
    """Recover and open the store, then serve it on ``listen`` (with TLS when
    ``tls`` is enabled: basalt.services.process.add_port).

    ``ready``, when given, is work the node needs before it serves (the topic
    cache's first listing from etcd) that runs while the store recovers on its
    thread: awaited before the server starts, cancelled if the store fails to
    open; if it fails, the store is shut down and its exception raised.
    ``broker_perm``: this broker's permission now (StoreNodeServicer's).
    ``group``: makes this node's broker group membership from the opened store;
    it serves ``Replication``; the caller starts it (:meth:`GroupMember.start`)
    once it knows the address the server is reached at (docs/replication.md).
    """
    try:
        store = await asyncio.to_thread(MessageStore.open, store_config)
    except BaseException:
        if ready is not None:
            ready.cancel()
        raise
    if ready is not None:
        try:
            await ready
        except BaseException:
            await asyncio.to_thread(store.shutdown)
            raise
    loop = asyncio.get_running_loop()
    hold = PullRequestHoldService(
        loop, ThreadPoolExecutor(node.filtered_read_threads, thread_name_prefix="filtered-read")
    )
    store.add_arrival_listener(hold.notify_arrival)
    member = None if group is None else group(store)
    servicer = StoreNodeServicer(node, store, topics, hold, broker_perm, member)
    # A send of one maximal message must reach the store (which answers
    # MESSAGE_ILLEGAL past max_message_size) rather than stop at gRPC's 4 MiB
    # default; a read returns at most one message past the transfer caps, and
    # a GetMessages up to max_queues_per_get_messages such reads.
    per_read = store_config.max_transfer_bytes_on_message_in_memory + store_config.max_message_size
    server = grpc_server(
        node.max_queues_per_get_messages * per_read + 1024 * 1024,
        max_pending_calls=node.max_pending_calls,
    )
    add_servicer(
        server,
        servicer,
        store_node_pb2.DESCRIPTOR.services_by_name["StoreNode"],
        may_answer_bytes=frozenset({"GetMessages", "GetMessagesStream"}),
    )
    if member is not None:
        add_servicer(
            server, member.servicer, replication_pb2.DESCRIPTOR.services_by_name["Replication"]
        )
    health_servicer = add_health_and_reflection(server, STORE_NODE_SERVICE)
    try:
        port = add_port(server, listen, tls)
        await server.start()
    except BaseException:
        await asyncio.to_thread(store.shutdown)
        raise
    await set_serving(health_servicer, STORE_NODE_SERVICE, True)
    _report_failures(store, health_servicer, loop)
    log.info("store-node %s serving on port %d", node.broker_name, port)
    return RunningStoreNode(server, port, store, servicer, health_servicer, member)


def _report_failures(
    store: MessageStore, health_servicer: health.aio.HealthServicer, loop: asyncio.AbstractEventLoop
) -> None:
    """Turn the node NOT_SERVING when the store records a failure.

    The store tells its listeners on the failed service's thread; the health
    servicer lives on ``loop``, so the change is handed over there. Sends need
    nothing of this: the store itself refuses them from then on.
    """
    tasks: set[asyncio.Task[None]] = set()

    def not_serving(failure: StoreFailure) -> None:
        log.error("store-node NOT_SERVING: %s", failure.describe())
        task = loop.create_task(set_serving(health_servicer, STORE_NODE_SERVICE, False))
        tasks.add(task)  # a reference until it is done: the loop keeps only weak ones
        task.add_done_callback(tasks.discard)

    def on_failure(failure: StoreFailure) -> None:
        try:
            loop.call_soon_threadsafe(not_serving, failure)
        except RuntimeError:  # the loop is closed: the node is gone already
            log.warning("store failure after the store-node stopped: %s", failure.describe())

    store.failures.subscribe(on_failure)
