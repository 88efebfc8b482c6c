"""etcd as the controller of a replicated broker group (docs/replication.md#election-and-fencing).

A broker name is a group of store-nodes, each with a ``broker_id``. Its keys,
under ``/basalt/<cluster>/groups/<broker>/``:

- ``state``: :class:`GroupState` (master, epoch, in-sync set, version),
  durable, changed only by the compare-and-swaps of this module, each one etcd
  transaction (RocketMQ's controller, with etcd in the controller's place);
- ``members/<id>``: :class:`MemberRegistration`, under the member's own lease
  (``ha_lease_ttl_s``): its absence is what lets the others campaign.

and the master publishes ``brokers/<broker>`` (its route, with its epoch)
under its member lease, so the route goes with the master.

The rules, each enforced by the transaction's compares (not by reading first):

- **bootstrap**: the state is created only if absent; its creator is master,
  epoch 1, in-sync set = {itself};
- **campaign**: the state's mod revision is the one the campaigner read, the
  old master's member key is absent and the campaigner's own is present; the
  winner is master, epoch + 1, in-sync set = {itself}. Exactly one of any
  number of concurrent campaigners wins. A member outside the in-sync set
  refuses to campaign unless unclean (checked on the state read at that
  revision, which the compare pins);
- **in-sync set change**: compares the state's mod revision as read, whose
  master and epoch are the caller's, and the master's member key present: a
  deposed or lease-less master changes nothing;
- **electMaster** (admin, handover): the target's member key is present and,
  unless unclean, the target is in the in-sync set; master = target, epoch +
  1, in-sync set = {target}: RocketMQ's ReplicasInfoManager.electMaster
  (ElectMasterEvent) also restarts the set from the new master alone, which
  the slaves rejoin as they catch up. Electing the current master changes
  nothing (RocketMQ's CONTROLLER_MASTER_STILL_EXIST).

A transaction whose answer was lost (an endpoint failed mid-call, the retry on
the next one finds its own write) is recognized: after a failed compare the
state is read again, and a stored value equal to the one written counts as won.

Concurrency: a :class:`BrokerGroup` and its watches belong to the event loop of
its MetaClient.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from basalt.services.meta.client import MetaClient
from basalt.services.meta.errors import (
    ElectionRefusedError,
    GroupNotFoundError,
    MetaConflictError,
    MetaError,
    MetaUnavailableError,
    MetaValidationError,
)
from basalt.services.meta.fields import check_broker_id, check_name
from basalt.services.meta.group_model import (
    GroupEntry,
    GroupState,
    MemberRegistration,
    MemberRole,
    election_rank,
)
from basalt.services.meta.lease import Registration
from basalt.services.meta.model import BrokerRegistration
from basalt.services.meta.session import Compare, Delete, Put
from basalt.services.meta.watch import MetaChange, MetaWatcher

log = logging.getLogger(__name__)

#: Least time between two puts of a member's reported offsets (:meth:`BrokerGroup.report`).
REPORT_INTERVAL_S = 0.25
#: Longest pause between two compare-and-swap attempts (jittered, doubling from 1 ms).
_CAS_BACKOFF_MAX_S = 0.05

__all__ = [
    "REPORT_INTERVAL_S",
    "BrokerGroup",
    "GroupWatch",
    "election_rank",
]


class GroupWatch:
    """A live, read-only view of one group's keys (state and members), from a
    :class:`MetaWatcher`: reads never raise nor wait; :meth:`subscribe` and
    :meth:`wait_changed` tell of every change at once, e.g. the master's member
    key vanishing when its lease ends (expiry or revoke). Start it with
    :meth:`start`; it is closed with :meth:`close` or with its MetaClient."""

    def __init__(self, watcher: MetaWatcher[GroupEntry]) -> None:
        self._watcher = watcher

    @property
    def state(self) -> GroupState | None:
        state = self._watcher.get("state")
        return state if isinstance(state, GroupState) else None

    @property
    def members(self) -> dict[int, MemberRegistration]:
        """The live members by id."""
        return {
            v.broker_id: v
            for v in self._watcher.snapshot().values()
            if isinstance(v, MemberRegistration)
        }

    def member(self, broker_id: int) -> MemberRegistration | None:
        member = self._watcher.get(f"members/{broker_id}")
        return member if isinstance(member, MemberRegistration) else None

    @property
    def synced(self) -> bool:
        return self._watcher.synced

    @property
    def available(self) -> bool:
        """The watch is live (False while etcd is unreachable: the view may be stale)."""
        return self._watcher.available

    def subscribe(self, callback: Callable[[MetaChange[GroupEntry]], None]) -> Callable[[], None]:
        """Call ``callback`` (synchronous, on the loop) for every change: ``name``
        is ``state`` or ``members/<id>``; ``new`` None for a deletion. Returns
        the unsubscribe function."""
        return self._watcher.subscribe(callback)

    async def wait_changed(self, timeout_s: float | None = None) -> bool:
        """Wait for the next change; False if ``timeout_s`` passed first."""
        return await self._watcher.wait_changed(timeout_s)

    async def wait_until(self, predicate: Callable[[GroupWatch], bool], timeout_s: float) -> bool:
        """Wait until ``predicate(self)`` holds; False if not within ``timeout_s``."""

        def holds(_: Mapping[str, GroupEntry]) -> bool:
            return predicate(self)

        return await self._watcher.wait_until(holds, timeout_s)

    async def start(self, *, wait: bool = True) -> None:
        """Start watching; with ``wait`` return once listed (MetaUnavailableError if not)."""
        await self._watcher.start(wait=wait)

    async def close(self) -> None:
        await self._watcher.close()


class BrokerGroup:
    """One member's handle on its group (one per store-node process), or an
    admin's (``elect``, ``state``, ``watch`` need no membership)."""

    def __init__(
        self,
        meta: MetaClient,
        broker_name: str,
        broker_id: int,
        *,
        report_interval_s: float = REPORT_INTERVAL_S,
    ) -> None:
        self.meta = meta
        self.broker_name = check_name(broker_name, "broker name")
        self.broker_id = check_broker_id(broker_id)
        if report_interval_s <= 0:
            raise ValueError(f"report_interval_s must be positive, not {report_interval_s}")
        self._report_interval_s = report_interval_s
        self._session = meta.session
        self.state_key = meta.keys.group_state(broker_name)
        self.route_key = meta.keys.broker(broker_name)
        self._member: Registration | None = None
        self._pending: MemberRegistration | None = None
        self._report_wake = asyncio.Event()
        self._reporter: asyncio.Task[None] | None = None
        self._route_hook: Callable[[], None] | None = None

    def member_key(self, broker_id: int) -> str:
        return self.meta.keys.group_member(self.broker_name, broker_id)

    # -- reads ----------------------------------------------------------------------

    async def state(self) -> tuple[GroupState | None, int]:
        """The state read now and its mod revision ((None, 0) when absent):
        what :meth:`campaign` takes as ``expected_revision``."""
        kv = await self._session.get(self.state_key)
        if kv is None:
            return None, 0
        return GroupState.from_json(kv.value, broker_name=self.broker_name), kv.mod_revision

    async def members(self) -> dict[int, MemberRegistration]:
        """The live members read now, by id."""
        return (await self.meta.get_group(self.broker_name))[1]

    def watch(self) -> GroupWatch:
        """A new, not yet started, :class:`GroupWatch` of this group."""
        return GroupWatch(self.meta.group_cache(self.broker_name))

    async def _stored(self, value: GroupState) -> bool:
        """Whether the state now is exactly ``value`` (a write whose answer was lost)."""
        kv = await self._session.get(self.state_key)
        return kv is not None and kv.value == value.to_json()

    async def _read(self) -> tuple[GroupState, int]:
        state, revision = await self.state()
        if state is None:
            raise GroupNotFoundError(self.broker_name)
        return state, revision

    # -- membership -------------------------------------------------------------------

    async def bootstrap(self) -> GroupState:
        """Create the state if absent (master = this member, epoch 1, in-sync set
        = {this member}, version 1) in one create-if-absent transaction; return
        the state stored, whoever created it."""
        first = GroupState(
            master_id=self.broker_id,
            epoch=1,
            sync_state_set=frozenset({self.broker_id}),
            version=1,
        )
        if await self._session.create(self.state_key, first.to_json()):
            log.info(
                "%s: group state created, %d is master (epoch 1)", self.broker_name, self.broker_id
            )
        state, _ = await self._read()
        return state

    async def register(self, member: MemberRegistration, ttl_s: int) -> Registration:
        """Put ``groups/<broker>/members/<id>`` under a lease of its own with
        ``ttl_s`` (``ha_lease_ttl_s``), kept alive every ``ttl_s / 3``; start the
        reporter of :meth:`report`. Raises MetaValidationError for another
        member's value, RuntimeError when already registered."""
        if (member.broker_name, member.broker_id) != (self.broker_name, self.broker_id):
            raise MetaValidationError(
                f"group {self.broker_name}/{self.broker_id} cannot register "
                f"member {member.broker_name}/{member.broker_id}"
            )
        if self._member is not None:
            raise RuntimeError(f"member {self.broker_name}/{self.broker_id} already registered")
        self._member = await self.meta.register(member, ttl_s=ttl_s)
        self._reporter = asyncio.get_running_loop().create_task(
            self._report_loop(), name=f"basalt-member-report:{self.broker_name}/{self.broker_id}"
        )
        return self._member

    @property
    def registration(self) -> Registration | None:
        """The member's registration (None before :meth:`register`)."""
        return self._member

    def _current(self) -> MemberRegistration:
        if self._member is None:
            raise RuntimeError(f"member {self.broker_name}/{self.broker_id} is not registered")
        if self._pending is not None:
            return self._pending
        value = self._member.value
        assert isinstance(value, MemberRegistration)
        return value

    def report(
        self,
        *,
        max_offset: int | None = None,
        confirm_offset: int | None = None,
        epoch: int | None = None,
        role: MemberRole | None = None,
    ) -> None:
        """Change the member's registered figures; cheap enough for every write
        or ack: the newest value is put at most every ``report_interval_s``
        (one put; an etcd outage keeps it for the registration to put later).
        Raises RuntimeError before :meth:`register`, MetaValidationError for a
        bad value."""
        current = self._current()
        changes: dict[str, Any] = {
            k: v
            for k, v in (
                ("max_offset", max_offset),
                ("confirm_offset", confirm_offset),
                ("epoch", epoch),
                ("role", role),
            )
            if v is not None
        }
        updated = replace(current, **changes)
        if updated != current:
            self._pending = updated
            self._report_wake.set()

    async def flush(self) -> None:
        """Put the newest reported value now (e.g. a role change others wait
        for); MetaUnavailableError when etcd is away (the value is kept)."""
        value, self._pending = self._pending, None
        if value is not None and self._member is not None:
            await self._member.update(value)

    async def _report_loop(self) -> None:
        # Ends at close() even if a library's wait_for (Python 3.11) swallowed
        # the cancellation while a put was answered: the task is unset first.
        while self._reporter is not None:
            await self._report_wake.wait()
            self._report_wake.clear()
            try:
                await self.flush()
            except MetaUnavailableError:
                pass  # the registration keeps the value and puts it once etcd is back
            except RuntimeError:
                return  # the registration was closed
            except MetaError as e:
                log.warning("%s/%d: report failed: %s", self.broker_name, self.broker_id, e)
            await asyncio.sleep(self._report_interval_s)

    async def close(self, *, revoke: bool = True) -> None:
        """Stop reporting and close the member's registration (``revoke``: the
        member key, and the route if this member published it, go now;
        otherwise one TTL later). Idempotent."""
        if self._route_hook is not None:
            self._route_hook()
            self._route_hook = None
        reporter, self._reporter = self._reporter, None
        if reporter is not None:
            reporter.cancel()
            self._report_wake.set()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
        if self._member is not None:
            await self._member.close(revoke=revoke)

    # -- compare-and-swaps ------------------------------------------------------------

    async def campaign(
        self, *, expected_revision: int, old_master_id: int, unclean: bool
    ) -> GroupState | None:
        """Try to become master after ``old_master_id``'s lease ended: one etcd
        transaction comparing the state's mod revision with ``expected_revision``
        (from :meth:`state`), the old master's member key absent and this
        member's present; it puts master = self, epoch + 1, in-sync set =
        {self}, version + 1. Returns the new state, or None when it lost (the
        state moved on, the old master is back, this member is not registered,
        or ``old_master_id`` is not the master of that state).

        Raises ElectionRefusedError when this member is not in the in-sync set
        of the state at ``expected_revision`` and ``unclean`` is off (it may
        lack acknowledged records), or is that state's master;
        GroupNotFoundError when there is no state."""
        state, revision = await self._read()
        if revision != expected_revision or state.master_id != old_master_id:
            return None
        if old_master_id == self.broker_id:
            raise ElectionRefusedError(self.broker_name, self.broker_id, "it is the master")
        if self.broker_id not in state.sync_state_set and not unclean:
            raise ElectionRefusedError(
                self.broker_name,
                self.broker_id,
                f"it is not in the in-sync set {sorted(state.sync_state_set)} "
                "(enable_elect_unclean_master lets it campaign, losing what it lacks)",
            )
        won = GroupState(
            master_id=self.broker_id,
            epoch=state.epoch + 1,
            sync_state_set=frozenset({self.broker_id}),
            version=state.version + 1,
        )
        if await self._session.transaction(
            [
                Compare.mod_is(self.state_key, expected_revision),
                Compare.absent(self.member_key(old_master_id)),
                Compare.present(self.member_key(self.broker_id)),
            ],
            [Put(self.state_key, won.to_json())],
        ) or await self._stored(won):
            log.info(
                "%s: %d won the campaign, epoch %d", self.broker_name, self.broker_id, won.epoch
            )
            return won
        return None

    async def change_sync_state_set(
        self, *, master_id: int, epoch: int, new_set: frozenset[int]
    ) -> GroupState | None:
        """The master's change of the in-sync set: compare-and-swap on the
        state's mod revision as read, done only while that state's master and
        epoch are ``master_id`` and ``epoch`` and the master's member key is
        present. Returns the state now stored (unchanged when ``new_set`` is
        already the set), None when the caller is no longer master (deposed, or
        its lease ended). MetaValidationError when ``new_set`` lacks the master;
        MetaConflictError after ``max_cas_attempts`` lost races."""
        new_set = frozenset(new_set)
        if master_id not in new_set:
            raise MetaValidationError(
                f"{self.broker_name}: the in-sync set {sorted(new_set)} "
                f"must keep master {master_id}"
            )
        failed_at = -1
        for attempt in range(self.meta.config.max_cas_attempts):
            state, revision = await self._read()
            if state.master_id != master_id or state.epoch != epoch:
                return None
            if revision == failed_at:
                return None  # the state did not move: the master's member key is gone
            if state.sync_state_set == new_set:
                return state
            changed = replace(state, sync_state_set=new_set, version=state.version + 1)
            if await self._session.transaction(
                [
                    Compare.mod_is(self.state_key, revision),
                    Compare.present(self.member_key(master_id)),
                ],
                [Put(self.state_key, changed.to_json())],
            ) or await self._stored(changed):
                log.info("%s: in-sync set %s (epoch %d)", self.broker_name, sorted(new_set), epoch)
                return changed
            failed_at = revision
            await _backoff(attempt)
        raise MetaConflictError(self.state_key, self.meta.config.max_cas_attempts)

    async def elect(self, target_id: int, *, unclean: bool) -> GroupState:
        """Admin's electMaster (and a master's handover): make ``target_id``
        master, epoch + 1, in-sync set = {target_id} (RocketMQ's
        ElectMasterEvent), by compare-and-swap on the state, the target's
        member key present. The current master: nothing changes, its state is
        returned. Raises ElectionRefusedError when the target is not registered
        (down), or not in the in-sync set and ``unclean`` is off;
        GroupNotFoundError without a state; MetaConflictError after
        ``max_cas_attempts`` lost races."""
        check_broker_id(target_id)
        for attempt in range(self.meta.config.max_cas_attempts):
            state, revision = await self._read()
            if target_id == state.master_id:
                return state
            if await self._session.get(self.member_key(target_id)) is None:
                raise ElectionRefusedError(
                    self.broker_name,
                    target_id,
                    "it is not registered (not running, or its lease ended)",
                )
            if target_id not in state.sync_state_set and not unclean:
                raise ElectionRefusedError(
                    self.broker_name,
                    target_id,
                    f"it is not in the in-sync set {sorted(state.sync_state_set)}, so it may "
                    "lack acknowledged records; an unclean election makes it master anyway",
                )
            elected = GroupState(
                master_id=target_id,
                epoch=state.epoch + 1,
                sync_state_set=frozenset({target_id}),
                version=state.version + 1,
            )
            if await self._session.transaction(
                [
                    Compare.mod_is(self.state_key, revision),
                    Compare.present(self.member_key(target_id)),
                ],
                [Put(self.state_key, elected.to_json())],
            ) or await self._stored(elected):
                log.info(
                    "%s: %d elected master (epoch %d%s)",
                    self.broker_name,
                    target_id,
                    elected.epoch,
                    ", unclean" if target_id not in state.sync_state_set else "",
                )
                return elected
            await _backoff(attempt)
        raise MetaConflictError(self.state_key, self.meta.config.max_cas_attempts)

    # -- the master's route -------------------------------------------------------------

    async def publish_route(self, registration: BrokerRegistration, lease: Registration) -> bool:
        """Put ``brokers/<broker>`` = ``registration`` under ``lease`` (this
        member's registration), only while the state names this member master
        at ``registration.epoch`` and the member key is held by that lease: the
        route vanishes with the master's lease. Put again after each new lease
        the registration grants (while still master). False when not master at
        that epoch (nothing written). MetaValidationError for another broker's
        route or a registration that is not this member's."""
        if (registration.broker_name, registration.broker_id) != (self.broker_name, self.broker_id):
            raise MetaValidationError(
                f"{self.broker_name}/{self.broker_id} cannot publish the route of "
                f"{registration.broker_name}/{registration.broker_id}"
            )
        if lease.key != self.member_key(self.broker_id):
            raise MetaValidationError(
                f"{lease.key} is not the member key of {self.broker_name}/{self.broker_id}"
            )
        for attempt in range(self.meta.config.max_cas_attempts):
            lease_id = lease.lease_id
            state, revision = await self.state()
            if (
                lease_id is None
                or state is None
                or state.master_id != self.broker_id
                or state.epoch != registration.epoch
            ):
                return False
            if await self._session.transaction(
                [
                    Compare.mod_is(self.state_key, revision),
                    Compare.leased_by(self.member_key(self.broker_id), lease_id),
                ],
                [Put(self.route_key, registration.to_json(), lease=lease_id)],
            ):
                self._keep_route(registration, lease)
                return True
            await _backoff(attempt)
        return False

    def _keep_route(self, registration: BrokerRegistration, lease: Registration) -> None:
        if self._route_hook is not None:
            self._route_hook()

        async def republish(_: int) -> None:
            if not await self.publish_route(registration, lease):
                self.forget_route()

        self._route_hook = lease.on_granted(republish)

    def forget_route(self) -> None:
        """Stop putting the route again on a new lease (the key stays until
        :meth:`withdraw_route` or the lease's end)."""
        if self._route_hook is not None:
            self._route_hook()
            self._route_hook = None

    async def withdraw_route(self, lease: Registration) -> bool:
        """Delete ``brokers/<broker>`` if ``lease`` holds it (a master stepping
        down); False when another lease (a newer master's) or none does."""
        self.forget_route()
        lease_id = lease.lease_id
        if lease_id is None:
            return False
        return await self._session.transaction(
            [Compare.leased_by(self.route_key, lease_id)], [Delete(self.route_key)]
        )


async def _backoff(attempt: int) -> None:
    """A jittered pause after a lost compare-and-swap, so racing writers stop colliding."""
    await asyncio.sleep(random.uniform(0, min(_CAS_BACKOFF_MAX_S, 0.001 * 2**attempt)))
