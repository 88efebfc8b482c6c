"""One store-node's life in its broker group: register, follow the group state
from etcd, serve as master or follow as slave, campaign when the master is gone.

:class:`GroupMember` is the store-node's :class:`~basalt.services.store_node.ha.gate.WriteGate`
and the one place its role changes (docs/replication.md):

- it registers ``groups/<broker>/members/<id>`` under a lease of
  ``ha_lease_ttl_s`` and keeps the member's max and confirm offsets in it;
- it creates the group state when there is none (the first member is master);
- every change it sees (the state's CAS, a member's key coming or going) is
  applied by one task, in order: the state names this member master -> it
  becomes master (a :class:`ReplicationMaster` appends the epoch entry, then
  the route ``brokers/<broker>`` is published, then sends are taken); it names
  another live member -> it follows it (a :class:`ReplicationSlave`); the
  master's member key is gone -> an in-sync member campaigns after
  ``ha_election_delay_ms`` times its rank by max offset;
- fencing: a master whose lease has not been renewed for ``ha_lease_ttl_s`` -
  ``ha_fence_margin_ms`` refuses sends before etcd can expire it, so a master
  cut off from etcd stops acknowledging before another can be elected.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from basalt.common.status import not_master_message
from basalt.common.tls import TlsConfig
from basalt.services.errors import Refusal
from basalt.services.meta import MetaClient
from basalt.services.meta.errors import MetaError
from basalt.services.meta.group_model import (
    GroupState,
    MemberRegistration,
    MemberRole,
    campaign_order,
    election_rank,
)
from basalt.services.meta.groups import BrokerGroup, GroupWatch
from basalt.services.meta.lease import Registration
from basalt.services.meta.model import BrokerRegistration, Perm
from basalt.services.store_node.ha.config import ReplicaAckMode, ReplicationConfig
from basalt.services.store_node.ha.master import ReplicationMaster
from basalt.services.store_node.ha.servicer import ReplicationServicer
from basalt.services.store_node.ha.slave import ReplicationSlave
from basalt.store import MessageStore
from basalt.store.put_result import PutMessageResult, PutStatus
from basalt.v1 import common_pb2 as pb

log = logging.getLogger(__name__)

#: How often a member refreshes its registration's offsets (what admin's
#: clusterList and a campaign's ranking read).
MEMBER_REFRESH_S = 0.5


class DuplicateMemberError(RuntimeError):
    """Another live store-node is registered with this node's broker id."""


class Role(enum.Enum):
    #: Before the first state is applied, or while no master is known.
    ELECTING = "ELECTING"
    MASTER = "MASTER"
    SLAVE = "SLAVE"


@dataclass(frozen=True, slots=True)
class MemberAddresses:
    """Where this member is reached: by its peers (``address``) and by clients."""

    address: str
    client_address: str
    store_root_id: str
    started_at_ms: int
    perm: Perm


class GroupMember:
    """A store-node as a member of its broker group; :meth:`start`, then
    :meth:`close` (or :meth:`hand_over` first, on SIGTERM)."""

    def __init__(
        self,
        store: MessageStore,
        config: ReplicationConfig,
        *,
        broker_name: str,
        meta: MetaClient,
        tls: TlsConfig | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.broker_name = broker_name
        self.broker_id = config.broker_id
        self.addresses = MemberAddresses("", "", "", 0, Perm.RW)  # set by start()
        self.group = BrokerGroup(meta, broker_name, config.broker_id)
        self._watch: GroupWatch = self.group.watch()
        self._tls = tls
        #: ``Replication.Replicate``, to register on the node's server: served by
        #: this member's ReplicationMaster while it is master.
        self.servicer = ReplicationServicer(f"{broker_name}/{config.broker_id}")
        self.role = Role.ELECTING
        #: The state last applied, and the epoch this member serves or follows.
        self.state: GroupState | None = None
        self.master: ReplicationMaster | None = None
        self.slave: ReplicationSlave | None = None
        self._slave_task: asyncio.Task[None] | None = None
        self._following: tuple[int, int, str] | None = None
        self._registration: Registration | None = None
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: A confirm-offset move for the store's own puts is scheduled on the loop.
        self._own_put_pending = False

    # -- lifecycle --------------------------------------------------------------------

    async def start(self, addresses: MemberAddresses) -> None:
        """Register (reached at ``addresses``), create the group state if there is
        none, and start following it. Raises :class:`DuplicateMemberError` when
        another live store-node holds this broker id (a copy-pasted config)."""
        self.addresses = addresses
        self._loop = asyncio.get_running_loop()
        # The store's own puts (delay levels, timers, transaction checks) are
        # nobody's send: without this, what they deliver would wait for the next
        # heartbeat or client send to be confirmed, and consumers to see it.
        self.store.add_internal_put_listener(self._store_put)
        await self._check_unique()
        self._registration = await self.group.register(
            self._member(), ttl_s=self.config.ha_lease_ttl_s
        )
        await self.group.bootstrap()
        # Listed after the bootstrap: the first view holds the state (and this
        # member's key), so the role is settled before the node says it serves;
        # a watch listed before it would see the state only with a later event,
        # and the first sends would be refused NOT_MASTER meanwhile.
        self._watch.subscribe(lambda _change: self._changed.set())
        await self._watch.start()
        await self._apply()
        self._task = asyncio.create_task(self._follow(), name=f"group {self.broker_name}")

    async def _check_unique(self) -> None:
        """Wait (one lease TTL and a second) for a member key of this broker id
        registered from another address or store root to go; raise if it stays.
        The same address and root is this node's previous run, whose lease has
        not ended yet: its key is taken over."""
        me = (self.addresses.address, self.addresses.store_root_id)
        deadline = time.monotonic() + self.config.ha_lease_ttl_s + 1
        while True:
            other = (await self.group.members()).get(self.broker_id)
            if other is None or (other.address, other.store_root_id) == me:
                return
            if time.monotonic() >= deadline:
                raise DuplicateMemberError(
                    f"broker id {self.broker_id} of {self.broker_name} is held by a live "
                    f"store-node at {other.address} (store root {other.store_root_id}): "
                    f"each member of a group needs its own --broker-id"
                )
            await asyncio.sleep(0.2)

    async def close(self) -> None:
        """Stop following; the registration is revoked (the member key goes at once)."""
        self._closed = True
        self.role = Role.ELECTING
        self.store.remove_internal_put_listener(self._store_put)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._stop_master()
        await self._stop_slave()
        await self._watch.close()
        with contextlib.suppress(Exception):
            await self.group.close()  # revokes the member key (and the route)

    async def hand_over(self, timeout_s: float) -> bool:
        """On a clean stop of the master: move mastership to the in-sync slave
        with the highest ack and wait until the state names it. False when
        there is none to take it (the group then elects after the lease ends)."""
        if self.role is not Role.MASTER or self.master is None or self.state is None:
            return False
        acks = self.master.slave_offsets()
        candidates = [
            (offset, member)
            for member, offset in acks.items()
            if member in self.state.sync_state_set and member != self.broker_id
        ]
        if not candidates:
            return False
        target = max(candidates)[1]
        self.role = Role.ELECTING  # no send is taken from here on
        master = self.master
        deadline = time.monotonic() + timeout_s
        # Caught up first: under ASYNC, what was acknowledged but not yet sent
        # would otherwise be the old master's alone.
        while (
            master.slave_offsets().get(target, -1) < self.store.max_offset
            and time.monotonic() < deadline
        ):
            master.notify_appended()
            await asyncio.sleep(0.01)
        try:
            await self.group.elect(target, unclean=False)
        except Exception as e:
            log.warning("handover of %s to %d failed: %s", self.broker_name, target, e)
            return False
        while time.monotonic() < deadline:
            state, _ = await self.group.state()
            if state is not None and state.master_id == target:
                log.info("%s handed over to broker id %d", self.broker_name, target)
                return True
            await asyncio.sleep(0.05)
        return False

    # -- following the group state ------------------------------------------------------

    async def _follow(self) -> None:
        etcd_away = False
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(MEMBER_REFRESH_S):
                    await self._changed.wait()
            self._changed.clear()
            try:
                await self._apply()
                self._report()
                etcd_away = False
            except asyncio.CancelledError:
                raise
            except MetaError as e:
                # etcd away: the watch serves the last view; the next change or tick retries.
                if not etcd_away:
                    log.warning("%s: cannot reach etcd for the group: %s", self.broker_name, e)
                etcd_away = True
            except Exception:
                log.exception("%s: applying the group state failed", self.broker_name)

    async def _apply(self) -> None:
        """Act on the group as the watch shows it: etcd is read only to campaign."""
        state = self._watch.state
        if state is None:
            return
        if state.master_id == self.broker_id:
            serving = self.role is Role.MASTER and self.state is not None
            if serving and self.state is not None and self.state.epoch == state.epoch:
                self.state = state  # the in-sync set may have changed
                return
            if (
                self.store.epochs.last_epoch() == 0
                and state.version > 1
                and self._successor(state) is not None
            ):
                # Named master by a group that has lived (version > 1) while this
                # store has never led or followed an epoch: its root was replaced
                # or lost (a new disk). Leading would make the slaves cut what
                # only they still hold; hand the group to one of them. With no
                # live in-sync member to take it (an operator's unclean
                # electMaster of an empty member), it leads: that was the choice.
                await self._resign(state)
                return
            await self._become_master(state)
            return
        self.state = state
        members = self._watch.members
        master = members.get(state.master_id)
        if master is None:
            await self._stop_master()
            self.role = Role.ELECTING
            _, revision = await self.group.state()
            await self._campaign(state, revision, members)
            return
        if self.role is not Role.SLAVE or self._following != (
            state.master_id,
            state.epoch,
            master.address,
        ):
            await self._become_slave(state, master)

    def _successor(self, state: GroupState) -> MemberRegistration | None:
        """The live in-sync member (but this one) furthest ahead, or None."""
        ranked = sorted(
            (
                m
                for i, m in self._watch.members.items()
                if i in state.sync_state_set and i != self.broker_id
            ),
            key=campaign_order,
        )
        return ranked[0] if ranked else None

    async def _resign(self, state: GroupState) -> None:
        """Move mastership to :meth:`_successor` (this member takes no send meanwhile)."""
        self.role = Role.ELECTING
        self.state = state
        successor = self._successor(state)
        if successor is None:
            return
        log.error(
            "%s: broker id %d is named master of epoch %d but its store has no epoch "
            "(a new or replaced disk); handing the group to broker id %d",
            self.broker_name,
            self.broker_id,
            state.epoch,
            successor.broker_id,
        )
        await self.group.elect(successor.broker_id, unclean=False)

    async def _campaign(
        self, state: GroupState, revision: int, members: dict[int, MemberRegistration]
    ) -> None:
        """Try to become master of a group whose master's lease ended."""
        rank = election_rank(state, members, self.broker_id)
        in_sync = rank is not None
        if rank is None:
            if not self.config.enable_elect_unclean_master:
                return  # a lagging member never campaigns (KIP-966's lesson)
            if any(i in state.sync_state_set and i != state.master_id for i in members):
                return  # a live in-sync member is the clean choice: leave it to them
            rank = 0
        if rank:
            await asyncio.sleep(rank * self.config.ha_election_delay_ms / 1000)
            _, current_revision = await self.group.state()
            if current_revision != revision:
                self._changed.set()  # someone else won (or the master came back)
                return
        won = await self.group.campaign(
            expected_revision=revision, old_master_id=state.master_id, unclean=not in_sync
        )
        if won is not None:
            log.warning(
                "%s: broker id %d elected master, epoch %d%s",
                self.broker_name,
                self.broker_id,
                won.epoch,
                "" if in_sync else " (UNCLEAN: it was not in the in-sync set)",
            )
        self._changed.set()

    async def _become_master(self, state: GroupState) -> None:
        await self._stop_slave()
        await self._stop_master()
        group = self.group

        async def change_sync_state_set(new_set: frozenset[int]) -> bool:
            changed = await group.change_sync_state_set(
                master_id=self.broker_id, epoch=state.epoch, new_set=new_set
            )
            return changed is not None

        master = ReplicationMaster(
            self.store,
            self.config,
            broker_name=self.broker_name,
            master_id=self.broker_id,
            epoch=state.epoch,
            sync_state_set=state.sync_state_set,
            change_sync_state_set=change_sync_state_set,
        )
        await master.start()
        self.master = master
        self.servicer.serve_as(master)
        assert self._registration is not None
        a = self.addresses
        await self.group.publish_route(
            BrokerRegistration(
                broker_name=self.broker_name,
                address=a.address,
                client_address="" if a.client_address == a.address else a.client_address,
                store_root_id=a.store_root_id,
                started_at_ms=a.started_at_ms,
                perm=a.perm,
                epoch=state.epoch,
                broker_id=self.broker_id,
            ),
            self._registration,
        )
        self.state = state
        self.role = Role.MASTER
        self.store.set_schedule_enabled(True)  # only a master delivers delayed messages
        log.info(
            "%s: broker id %d is master, epoch %d", self.broker_name, self.broker_id, state.epoch
        )

    async def _become_slave(self, state: GroupState, master: MemberRegistration) -> None:
        self.role = Role.SLAVE  # first: a deposed master takes no more sends
        self.store.set_schedule_enabled(False)  # its re-puts would fork the log
        await self._stop_master()
        await self._stop_slave()
        self.servicer.serve_as(None, f"{state.master_id} at {master.address}")
        slave = ReplicationSlave(
            self.store,
            self.config,
            self.broker_name,
            self.broker_id,
            master.address,
            tls=self._tls,
        )
        self.slave = slave
        self._slave_task = asyncio.create_task(slave.run(), name=f"slave of {master.address}")
        self._following = (state.master_id, state.epoch, master.address)
        log.info(
            "%s: broker id %d follows broker id %d at %s, epoch %d",
            self.broker_name,
            self.broker_id,
            state.master_id,
            master.address,
            state.epoch,
        )

    async def _stop_master(self) -> None:
        master, self.master = self.master, None
        if master is not None:
            self.servicer.serve_as(None)
            await master.close()

    async def _stop_slave(self) -> None:
        slave, task = self.slave, self._slave_task
        self.slave = self._slave_task = None
        self._following = None
        if slave is not None:
            await slave.close()
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def _member(self) -> MemberRegistration:
        a = self.addresses
        return MemberRegistration(
            broker_name=self.broker_name,
            broker_id=self.broker_id,
            address=a.address,
            client_address=a.client_address,
            store_root_id=a.store_root_id,
            max_offset=self.store.max_offset,
            confirm_offset=self.store.confirm_offset,
            epoch=self.store.epochs.last_epoch(),
            role=MemberRole.MASTER if self.role is Role.MASTER else MemberRole.SLAVE,
        )

    def _report(self) -> None:
        """Put this member's offsets, epoch and role in its registration (the
        group puts the newest at most every few hundred ms)."""
        if self.group.registration is not None:
            self.group.report(
                max_offset=self.store.max_offset,
                confirm_offset=self.store.confirm_offset,
                epoch=self.store.epochs.last_epoch(),
                role=MemberRole.MASTER if self.role is Role.MASTER else MemberRole.SLAVE,
            )

    # -- WriteGate ----------------------------------------------------------------------

    def check_master(self) -> None:
        if self.role is Role.MASTER:
            return
        state = self.state
        master = None if state is None else self._watch.member(state.master_id)
        raise Refusal(
            pb.RESPONSE_CODE_NOT_MASTER,
            not_master_message(
                self.broker_name,
                None if master is None else master.broker_id,
                None if master is None else master.client_address or master.address,
            ),
        )

    def check_writable(self) -> None:
        self.check_master()
        registration = self._registration
        if registration is not None and self._can_be_deposed():
            renewed = registration.last_renewed_monotonic
            unrenewed_s = time.monotonic() - (0.0 if renewed is None else renewed)
            limit_s = self.config.ha_lease_ttl_s - self.config.ha_fence_margin_ms / 1000
            if unrenewed_s > limit_s:
                raise Refusal(
                    pb.RESPONSE_CODE_SERVICE_NOT_AVAILABLE,
                    f"{self.broker_name}'s master has not renewed its etcd lease for "
                    f"{unrenewed_s:.1f} s: it takes no send until it does (another member "
                    f"may be elected)",
                )
        master = self.master
        if master is not None:
            reason = master.refusal()
            if reason is not None:
                raise Refusal(pb.RESPONSE_CODE_IN_SYNC_REPLICAS_NOT_ENOUGH, reason)

    def _can_be_deposed(self) -> bool:
        """Whether another member could win a campaign once this master's lease
        ends: one in its in-sync set, or anyone with unclean election on. A master
        alone in its set keeps acknowledging while etcd is away (no clean
        election can replace it; etcd itself down expires no lease), as a group
        of one always did."""
        master = self.master
        # The master's own book: a set it has just grown counts at once.
        others = master is not None and len(master.sync_state_set) > 1
        return others or self.config.enable_elect_unclean_master

    def _store_put(self) -> None:
        """The store appended a put of its own (MessageStore.put_internal): on its
        service's thread, ask the loop to treat it as a send's put - move the
        confirm offset (only as far as the in-sync set has it: under SYNC that
        is once the slaves ack, which the woken streams bring) and wake the
        slaves' streams. One notification waits at a time: a burst of puts is
        covered by the one that runs after them."""
        loop = self._loop
        if self._own_put_pending or loop is None or self._closed:
            return
        self._own_put_pending = True
        try:
            loop.call_soon_threadsafe(self._notify_store_put)
        except RuntimeError:  # the loop is closed: nothing left to notify
            self._own_put_pending = False

    def _notify_store_put(self) -> None:
        # Cleared first: a put appended from here on schedules another call, and
        # one appended before is covered by the offsets read below.
        self._own_put_pending = False
        master = self.master
        if master is not None:
            master.notify_appended()

    def confirm_then(
        self, result: PutMessageResult, settle: Callable[[PutMessageResult], None]
    ) -> None:
        master = self.master
        if master is not None and result.status is PutStatus.PUT_OK:
            master.notify_appended()  # wakes the slaves' streams now
        if (
            result.status is not PutStatus.PUT_OK
            or master is None
            or self.config.replica_ack_mode is ReplicaAckMode.ASYNC
            or (
                # Alone in its in-sync set (a group of one): the store's own answer
                # is the set's - no task, no wait.
                len(master.sync_state_set) == 1 and master.pending_sync_state_set is None
            )
        ):
            settle(result)
            return
        end = result.physical_offsets[-1] + result.sizes[-1]
        timeout_s = self.store.config.sync_flush_timeout_ms / 1000
        waiting = asyncio.ensure_future(master.wait_acked(end, timeout_s))

        def done(task: asyncio.Future[bool]) -> None:
            acked = not task.cancelled() and task.exception() is None and task.result()
            settle(
                result
                if acked
                else result._replace(
                    status=PutStatus.FLUSH_SLAVE_TIMEOUT,
                    detail="the in-sync replicas did not confirm it in time",
                )
            )

        waiting.add_done_callback(done)
