"""Broker groups on real etcd (basalt.services.meta.groups, docs/replication.md
#election-and-fencing): values, bootstrap and campaign races, in-sync set
changes, elections, leases that end, and the master's route."""

from __future__ import annotations

import asyncio
import itertools
import json
import time

import pytest

from basalt.services.cluster.etcd import EtcdProcess
from basalt.services.meta import (
    BrokerGroup,
    BrokerRegistration,
    ElectionRefusedError,
    GroupNotFoundError,
    GroupState,
    MemberRegistration,
    MemberRole,
    MetaChange,
    MetaClient,
    MetaConfig,
    MetaValidationError,
)
from basalt.services.meta.group_model import GroupEntry, election_rank
from tests.support.aio import async_test
from tests.support.polling import eventually

BROKER = "broker-a"
#: etcd's smallest lease: a member whose keepalives stop is gone about this long after.
SHORT_TTL_S = 2


def member(broker_id: int, *, max_offset: int = 0, epoch: int = 0) -> MemberRegistration:
    return MemberRegistration(
        broker_name=BROKER,
        broker_id=broker_id,
        address=f"127.0.0.1:{20000 + broker_id}",
        store_root_id=f"root-{broker_id}",
        max_offset=max_offset,
        epoch=epoch,
    )


def route(broker_id: int, epoch: int) -> BrokerRegistration:
    return BrokerRegistration(
        broker_name=BROKER,
        address=f"127.0.0.1:{20000 + broker_id}",
        store_root_id=f"root-{broker_id}",
        started_at_ms=1_700_000_000_000,
        epoch=epoch,
        broker_id=broker_id,
    )


def ids(*members: int) -> frozenset[int]:
    return frozenset(members)


# -- values (no etcd) ------------------------------------------------------------------


def test_group_values_round_trip_and_are_validated() -> None:
    state = GroupState(master_id=1, epoch=3, sync_state_set=ids(1, 2), version=7)
    assert json.loads(state.to_json()) == {
        "master_id": 1,
        "epoch": 3,
        "sync_state_set": [1, 2],
        "version": 7,
    }
    assert GroupState.from_json(state.to_json(), broker_name=BROKER) == state
    with pytest.raises(MetaValidationError, match="master 3 is not in its in-sync set"):
        GroupState(master_id=3, epoch=1, sync_state_set=ids(1), version=1)
    with pytest.raises(MetaValidationError, match="epoch must be an integer >= 1"):
        GroupState(master_id=1, epoch=0, sync_state_set=ids(1), version=1)
    with pytest.raises(MetaValidationError, match="groups/broker-a/state"):
        GroupState.from_json(b'{"master_id": 1, "epoch": 1, "version": 1}', broker_name=BROKER)

    m = member(2, max_offset=4096)
    assert m.key_suffix() == "groups/broker-a/members/2" and m.role is MemberRole.SLAVE
    assert MemberRegistration.from_json(m.to_json(), broker_name=BROKER, broker_id=2) == m
    with pytest.raises(MetaValidationError, match="the key says 3"):
        MemberRegistration.from_json(m.to_json(), broker_name=BROKER, broker_id=3)
    with pytest.raises(MetaValidationError, match="max_offset must be an integer >= 0"):
        member(1, max_offset=-1)


def test_a_route_keeps_its_old_shape_and_old_routes_load() -> None:
    """A store-node outside any group writes what it always wrote; a master adds
    its epoch and id; a route written before they existed loads with 0."""
    single = BrokerRegistration(
        broker_name=BROKER, address="127.0.0.1:1", store_root_id="r", started_at_ms=1
    )
    assert "epoch" not in json.loads(single.to_json())
    assert "broker_id" not in json.loads(single.to_json())
    old = b'{"address": "127.0.0.1:1", "broker_name": "broker-a", "perm": 6, '
    old += b'"started_at_ms": 1, "store_root_id": "r"}'
    assert BrokerRegistration.from_json(old, broker_name=BROKER) == single
    master = route(2, epoch=5)
    decoded = BrokerRegistration.from_json(master.to_json(), broker_name=BROKER)
    assert (decoded.epoch, decoded.broker_id) == (5, 2)


def test_election_rank_puts_the_newest_epoch_and_furthest_offset_first() -> None:
    state = GroupState(master_id=0, epoch=4, sync_state_set=ids(0, 1, 2, 3), version=9)
    members = {
        1: member(1, max_offset=100, epoch=4),
        2: member(2, max_offset=300, epoch=3),
        3: member(3, max_offset=200, epoch=4),
        4: member(4, max_offset=999, epoch=4),  # live, not in sync
    }
    assert [election_rank(state, members, i) for i in (1, 2, 3, 4, 0)] == [1, 2, 0, None, None]


# -- on etcd ---------------------------------------------------------------------------


@async_test
async def test_concurrent_bootstraps_create_one_state(meta_config: MetaConfig) -> None:
    async with MetaClient(meta_config) as meta:
        groups = [BrokerGroup(meta, BROKER, i) for i in range(8)]
        assert await groups[0].state() == (None, 0)
        states = await asyncio.gather(*(g.bootstrap() for g in groups))
        assert len(set(states)) == 1
        (state,) = set(states)
        assert state.epoch == 1 and state.version == 1
        assert state.sync_state_set == {state.master_id} and state.master_id in range(8)
        stored, revision = await groups[5].state()
        assert stored == state and revision > 0


async def _group_of(meta: MetaClient, n: int, *, ttl_s: int = 3) -> list[BrokerGroup]:
    """Members 0..n-1 registered, 0 master, every member in the in-sync set."""
    groups = [BrokerGroup(meta, BROKER, i) for i in range(n)]
    for g in groups:
        await g.register(member(g.broker_id), ttl_s)
    state = await groups[0].bootstrap()
    assert state.master_id == 0
    grown = await groups[0].change_sync_state_set(master_id=0, epoch=1, new_set=ids(*range(n)))
    assert grown is not None and grown.sync_state_set == ids(*range(n)) and grown.version == 2
    return groups


@async_test
async def test_one_of_five_concurrent_campaigners_wins(meta_config: MetaConfig) -> None:
    async with MetaClient(meta_config) as meta:
        master, *slaves = await _group_of(meta, 6)
        before, revision = await master.state()
        assert before is not None

        # While the master's member key lives, nobody can take over.
        assert (
            await slaves[0].campaign(expected_revision=revision, old_master_id=0, unclean=False)
            is None
        )
        with pytest.raises(ElectionRefusedError, match="it is the master"):
            await master.campaign(expected_revision=revision, old_master_id=0, unclean=False)

        await master.close()  # revoked: the member key goes at once
        results = await asyncio.gather(
            *(
                s.campaign(expected_revision=revision, old_master_id=0, unclean=False)
                for s in slaves
            )
        )
        winners = [r for r in results if r is not None]
        assert len(winners) == 1
        (won,) = winners
        assert won.epoch == before.epoch + 1 and won.version == before.version + 1
        assert won.sync_state_set == {won.master_id} and won.master_id in range(1, 6)
        assert (await slaves[0].state())[0] == won
        # The losers' revision is stale now: another try changes nothing.
        assert (
            await slaves[0].campaign(expected_revision=revision, old_master_id=0, unclean=False)
            is None
        )


@async_test
async def test_a_member_outside_the_in_sync_set_campaigns_only_unclean(
    meta_config: MetaConfig,
) -> None:
    async with MetaClient(meta_config) as meta:
        master = BrokerGroup(meta, BROKER, 0)
        outsider = BrokerGroup(meta, BROKER, 7)
        await master.register(member(0), 3)
        await outsider.register(member(7), 3)
        await master.bootstrap()
        await master.close()
        _, revision = await outsider.state()
        with pytest.raises(ElectionRefusedError, match=r"not in the in-sync set \[0\]"):
            await outsider.campaign(expected_revision=revision, old_master_id=0, unclean=False)
        won = await outsider.campaign(expected_revision=revision, old_master_id=0, unclean=True)
        assert won == GroupState(master_id=7, epoch=2, sync_state_set=ids(7), version=2)


@async_test
async def test_a_deposed_master_cannot_change_the_in_sync_set(meta_config: MetaConfig) -> None:
    async with MetaClient(meta_config) as meta:
        old, new, _ = await _group_of(meta, 3)
        elected = await old.elect(1, unclean=False)
        assert (elected.master_id, elected.epoch, elected.sync_state_set) == (1, 2, ids(1))

        # The old master, still believing in epoch 1, tries to shrink the set to itself.
        assert await old.change_sync_state_set(master_id=0, epoch=1, new_set=ids(0)) is None
        assert (await old.state())[0] == elected
        with pytest.raises(MetaValidationError, match="must keep master 1"):
            await new.change_sync_state_set(master_id=1, epoch=2, new_set=ids(2))
        grown = await new.change_sync_state_set(master_id=1, epoch=2, new_set=ids(1, 2))
        assert grown is not None and grown.sync_state_set == ids(1, 2) and grown.epoch == 2
        # The same set again writes nothing.
        assert await new.change_sync_state_set(master_id=1, epoch=2, new_set=ids(1, 2)) == grown
        assert (await new.state())[0] == grown

        # A master whose lease ended changes nothing either, though the state names it.
        await new.close()
        assert await new.change_sync_state_set(master_id=1, epoch=2, new_set=ids(1)) is None
        assert (await old.state())[0] == grown


@async_test
async def test_the_epoch_only_grows_over_many_elections(meta_config: MetaConfig) -> None:
    async with MetaClient(meta_config) as meta:
        groups = await _group_of(meta, 3)
        state, _ = await groups[0].state()
        assert state is not None
        seen = [state]
        for step in range(12):
            target = (state.master_id + 1) % 3
            master = groups[state.master_id]
            grown = await master.change_sync_state_set(
                master_id=state.master_id, epoch=state.epoch, new_set=ids(0, 1, 2)
            )
            assert grown is not None
            state = await groups[target].elect(target, unclean=False)
            seen.append(state)
            assert state.master_id == target, step
        assert [s.epoch for s in seen] == list(range(seen[0].epoch, seen[0].epoch + 13))
        assert all(b.version > a.version for a, b in itertools.pairwise(seen))


@async_test
async def test_elect_master_rules(meta_config: MetaConfig) -> None:
    async with MetaClient(meta_config) as meta:
        admin = BrokerGroup(meta, BROKER, 0)
        with pytest.raises(GroupNotFoundError, match="broker-a"):
            await admin.elect(1, unclean=False)
        master, lagging = BrokerGroup(meta, BROKER, 0), BrokerGroup(meta, BROKER, 1)
        await master.register(member(0), 3)
        await lagging.register(member(1), 3)
        state = await master.bootstrap()

        assert await admin.elect(0, unclean=False) == state  # already master: unchanged
        with pytest.raises(ElectionRefusedError, match="not in the in-sync set"):
            await admin.elect(1, unclean=False)
        with pytest.raises(ElectionRefusedError, match="not registered"):
            await admin.elect(5, unclean=True)
        assert (await admin.state())[0] == state
        elected = await admin.elect(1, unclean=True)
        assert elected == GroupState(master_id=1, epoch=2, sync_state_set=ids(1), version=2)
        assert (await admin.state())[0] == elected


@async_test
async def test_an_ended_lease_fires_the_watch(meta_config: MetaConfig) -> None:
    async with MetaClient(meta_config) as meta:
        master, slave = BrokerGroup(meta, BROKER, 0), BrokerGroup(meta, BROKER, 1)
        registration = await master.register(member(0), SHORT_TTL_S)
        await slave.register(member(1), 3)
        await master.bootstrap()
        assert await master.change_sync_state_set(master_id=0, epoch=1, new_set=ids(0, 1))
        renewed = registration.last_renewed_monotonic
        assert renewed is not None and renewed <= time.monotonic()
        await eventually(lambda: (registration.last_renewed_monotonic or 0) > renewed)

        watch = slave.watch()
        changes: list[MetaChange[GroupEntry]] = []
        watch.subscribe(changes.append)
        await watch.start()
        assert watch.state is not None and watch.state.master_id == 0
        assert sorted(watch.members) == [0, 1]

        # The master stops renewing (a crash): its key expires, the watch tells.
        await master.close(revoke=False)
        assert await watch.wait_until(lambda w: w.member(0) is None, timeout_s=20)
        assert any(c.name == "members/0" and c.new is None for c in changes)
        assert sorted(watch.members) == [1]

        # The slave's campaign shows in the watch too.
        _state, revision = await slave.state()
        won = await slave.campaign(expected_revision=revision, old_master_id=0, unclean=False)
        assert won is not None
        assert await watch.wait_until(lambda w: w.state == won, timeout_s=20)
        await watch.close()


@async_test
async def test_reported_offsets_reach_etcd(meta_config: MetaConfig) -> None:
    async with MetaClient(meta_config) as meta:
        group = BrokerGroup(meta, BROKER, 3, report_interval_s=0.05)
        with pytest.raises(RuntimeError, match="not registered"):
            group.report(max_offset=1)
        await group.register(member(3), 3)
        for offset in range(0, 10_000, 100):
            group.report(max_offset=offset, confirm_offset=offset // 2)
        group.report(epoch=2, role=MemberRole.MASTER)

        async def reported() -> bool:
            got = (await group.members()).get(3)
            return got is not None and (got.max_offset, got.confirm_offset, got.epoch) == (
                9_900,
                4_950,
                2,
            )

        await eventually(reported)
        assert (await group.members())[3].role is MemberRole.MASTER
        await group.close()
        assert await group.members() == {}


@async_test
async def test_the_route_lives_under_the_masters_lease(
    meta_config: MetaConfig, etcd: EtcdProcess
) -> None:
    async with MetaClient(meta_config) as meta:
        master, slave = BrokerGroup(meta, BROKER, 0), BrokerGroup(meta, BROKER, 1)
        lease = await master.register(member(0), SHORT_TTL_S)
        slave_lease = await slave.register(member(1), 3)
        await master.bootstrap()
        assert await master.change_sync_state_set(master_id=0, epoch=1, new_set=ids(0, 1))

        with pytest.raises(MetaValidationError, match="cannot publish the route"):
            await master.publish_route(route(1, epoch=1), lease)
        assert not await master.publish_route(route(0, epoch=2), lease)  # not its epoch
        assert not await slave.publish_route(route(1, epoch=1), slave_lease)  # not master
        assert await meta.list_brokers() == {}
        assert await master.publish_route(route(0, epoch=1), lease)
        assert await meta.list_brokers() == {BROKER: route(0, epoch=1)}

        # The lease vanishes behind the master's back (cut off from etcd longer
        # than its TTL): the registration takes a new lease and the route comes back.
        old = lease.lease_id
        assert old is not None
        etcd.etcdctl("lease", "revoke", f"{old:x}")
        assert await meta.list_brokers() == {}

        async def back() -> bool:
            return lease.lease_id not in (None, old) and BROKER in await meta.list_brokers()

        await eventually(back)
        assert (await meta.list_groups())[BROKER][0].master_id == 0

        # The master dies: the route goes with its lease.
        await master.close(revoke=False)

        async def gone() -> bool:
            return BROKER not in await meta.list_brokers()

        await eventually(gone)

        # A new master publishes its own; the old one cannot withdraw it.
        _, revision = await slave.state()
        won = await slave.campaign(expected_revision=revision, old_master_id=0, unclean=False)
        assert won is not None
        assert await slave.publish_route(route(1, epoch=won.epoch), slave_lease)
        assert not await master.withdraw_route(lease)
        assert (await meta.list_brokers())[BROKER].epoch == 2
        assert await slave.withdraw_route(slave_lease)
        assert await meta.list_brokers() == {}


@async_test
async def test_list_groups(meta_config: MetaConfig) -> None:
    async with MetaClient(meta_config) as meta:
        assert await meta.list_groups() == {}
        groups = await _group_of(meta, 2)
        other = BrokerGroup(meta, "broker-b", 4)
        await other.register(
            MemberRegistration(
                broker_name="broker-b", broker_id=4, address="127.0.0.1:1", store_root_id="r"
            ),
            3,
        )
        listed = await meta.list_groups()
        assert list(listed) == [BROKER]  # broker-b has members but no state yet
        state, members = listed[BROKER]
        assert state.master_id == 0 and sorted(members) == [0, 1]
        assert members[1] == member(1)
        await other.bootstrap()
        assert sorted(await meta.list_groups()) == [BROKER, "broker-b"]
        assert (await meta.get_group(BROKER)) == (state, members)
        await groups[1].close()
        assert sorted((await meta.list_groups())[BROKER][1]) == [0]
