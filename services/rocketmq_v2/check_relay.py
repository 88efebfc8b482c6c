"""Transaction check-backs for the official clients: store-node checks relayed
to producers' Telemetry streams as ``RecoverOrphanedTransactionCommand``.

A half message nobody committed or rolled back (the producer died between
its half send and its ``EndTransaction``) is checked back by its store-node
with its producer group: ``StoreNode.WatchTransactionChecks`` streams each
:class:`TransactionCheck` to one listener of the group (docs/transactions.md).
The v2 protocol has no producer group; RocketMQ 5's proxy registers every
publishing client under each topic of its ``Settings.publishing`` and stamps
the topic as the half's group (``PGROUP``, :mod:`.conversions`), so a check
of group G goes to a client publishing to topic G. The front does the same:

* A Telemetry stream whose Settings publish to topics **joins** each topic's
  group (:meth:`CheckRelay.join`) until the stream ends.
* While a group has a client here, the relay keeps one
  ``WatchTransactionChecks`` stream open per store-node of the topic (its
  registered master: the broker name's current address), shared by all the
  group's clients on this front. A stream that fails is opened again (100 ms
  doubling to 2 s); a topic's store-nodes changing, or a store-node's
  address (a new master), opens and closes streams to match
  (:meth:`CheckRelay.reconcile`, run on every etcd change of topics and
  brokers). The group's last client leaving closes them.
* Each check goes to one of the group's clients here, round robin, as a
  ``RecoverOrphanedTransactionCommand``: the half message converted as a
  delivery is (:func:`.conversions.checked_half`: its real topic, type
  TRANSACTION) and a transaction id naming the store-node and the half's
  offset message id (:class:`.handles.TransactionId`). The client's checker
  answers with ``EndTransaction`` (source SOURCE_SERVER_CHECK), which the
  front routes by that id like any other.

A check with no client to take it (the last one left meanwhile) is dropped:
the store-node checks the half again at its next check interval, and a half
never resolved stays invisible (never half-visible). The watches are gRPC
streams wherever the front runs, to its own store-node too (checks are rare;
the stream is what the store-node gives each check to one watcher by).
Concurrency: one event loop, the host process's.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from basalt.common.record import CorruptRecordError, decode_record
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.services.rocketmq_v2.conversions import checked_half
from basalt.services.rocketmq_v2.handles import TransactionId
from basalt.v1 import store_node_pb2 as sn

if TYPE_CHECKING:
    from basalt.services.rocketmq_v2.host import FrontHost

log = logging.getLogger(__name__)

#: First pause before a failed watch is opened again; doubles up to the max.
_FIRST_BACKOFF_S = 0.1
_MAX_BACKOFF_S = 2.0


@dataclass(slots=True)
class _Client:
    """One Telemetry stream's membership: where its commands go, and the
    namespace its Settings named (the relayed message's topic resource)."""

    send: Callable[[sv.TelemetryCommand], None]
    namespace: str


class CheckRelay:
    """The relay of the module docstring over the front's host (its etcd view
    and channels; ``host.listener_id`` names this front to the store-nodes, in
    their logs and metrics). :meth:`close` when the front stops."""

    def __init__(self, host: FrontHost) -> None:
        self.host = host
        self.listener_id = host.listener_id
        self._clients: dict[str, dict[int, _Client]] = {}
        self._ids = itertools.count(1)
        self._turn = itertools.count()
        #: (group, broker name, address) -> the task keeping its watch open.
        self._watches: dict[tuple[str, str, str], asyncio.Task[None]] = {}
        self._closed = False
        self._unsubscribe = [
            host.topics.subscribe(lambda _change: self.reconcile()),
            host.broker_watch.subscribe(lambda _change: self.reconcile()),
        ]

    def join(
        self, groups: Iterable[str], namespace: str, send: Callable[[sv.TelemetryCommand], None]
    ) -> Callable[[], None]:
        """Make a client (``send`` writes to its Telemetry stream, must not
        block) one of each group's; answers the function that takes it out of
        them all (call it once, when its stream ends or its Settings change)."""
        key = next(self._ids)
        joined = sorted(set(groups))
        for group in joined:
            self._clients.setdefault(group, {})[key] = _Client(send, namespace)
        self.reconcile()

        def leave() -> None:
            for group in joined:
                members = self._clients.get(group)
                if members is not None:
                    members.pop(key, None)
                    if not members:
                        del self._clients[group]
            self.reconcile()

        return leave

    def groups(self) -> dict[str, int]:
        """Each group with clients here, and how many (for tests and logs)."""
        return {g: len(m) for g, m in self._clients.items()}

    def watching(self) -> set[tuple[str, str, str]]:
        """The open watches: (group, broker name, address) each."""
        return set(self._watches)

    def reconcile(self) -> None:
        """Open the watches the groups here need and close the others (the
        module docstring); idempotent, cheap when nothing changed."""
        if self._closed:
            return
        wanted: set[tuple[str, str, str]] = set()
        for group in self._clients:
            config = self.host.topics.get(group)
            if config is None:
                continue
            for name in config.brokers:
                broker = self.host.brokers.get(name)
                if broker is not None:
                    wanted.add((group, name, broker.address))
        for key in set(self._watches) - wanted:
            self._watches.pop(key).cancel()
        for key in wanted - set(self._watches):
            self._watches[key] = asyncio.get_running_loop().create_task(self._watch(*key))

    async def close(self) -> None:
        """Close every watch and stop following etcd."""
        self._closed = True
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        watches, self._watches = list(self._watches.values()), {}
        for task in watches:
            task.cancel()
        for task in watches:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, group: str, broker: str, address: str) -> None:
        """Keep ``group``'s watch on ``broker`` at ``address`` open, relaying
        its checks, until cancelled."""
        backoff = _FIRST_BACKOFF_S
        request = sn.WatchTransactionChecksRequest(producer_group=group, client_id=self.listener_id)
        last = ""
        while True:
            call = self.host.channels.store_node(address).WatchTransactionChecks(request)
            try:
                async for check in call:
                    backoff, last = _FIRST_BACKOFF_S, ""
                    self._relay(group, broker, check)
                why = "ended"
            except grpc.aio.AioRpcError as e:
                why = f"{e.code().name}: {e.details() or ''}".rstrip(": ")
            finally:
                call.cancel()
            # Once per cause: a store-node down for long retries every 2 s.
            level = logging.INFO if why != last else logging.DEBUG
            log.log(
                level, "transaction checks of group %r from store-node %r at %s %s; "
                "watching again in %.1f s", group, broker, address, why, backoff,
            )  # fmt: skip
            last = why
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, _MAX_BACKOFF_S)

    def _relay(self, group: str, broker: str, check: sn.TransactionCheck) -> None:
        members = list(self._clients.get(group, {}).values())
        if not members:
            log.info(
                "transaction check of %s (group %r) dropped: no producer of the group is "
                "connected here; the store-node checks it again later",
                check.offset_msg_id, group,
            )  # fmt: skip
            return
        client = members[next(self._turn) % len(members)]
        try:
            message = checked_half(decode_record(check.record), client.namespace)
        except (CorruptRecordError, ValueError) as e:
            log.error(
                "transaction check of %s from store-node %r does not decode: %s",
                check.offset_msg_id, broker, e,
            )  # fmt: skip
            return
        transaction_id = TransactionId(broker, message.topic.name, check.offset_msg_id).encode()
        client.send(
            sv.TelemetryCommand(
                recover_orphaned_transaction_command=sv.RecoverOrphanedTransactionCommand(
                    message=message, transaction_id=transaction_id
                )
            )
        )


def publishing_groups(settings: v2.Settings) -> tuple[set[str], str] | None:
    """The groups a client's ``Settings`` joins (its publishing topics) and
    their namespace; None for a client that publishes nothing (a consumer)."""
    if not settings.HasField("publishing"):
        return None
    topics = [t for t in settings.publishing.topics if t.name]
    namespace = topics[0].resource_namespace if topics else ""
    return {t.name for t in topics}, namespace
