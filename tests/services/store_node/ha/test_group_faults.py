"""A broker group of three real store-node processes under harder faults
(docs/replication.md#election-and-fencing): a master frozen past its lease
(a zombie), a lagging member left alone (no clean election; electMaster
--unclean), consumer offsets and pop state across a failover, and a restart
with records above the confirm offset.

Each test has its own cluster name on the shared etcd; nothing asserts a timing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from basalt.common.status import master_address_of
from basalt.services.cluster.etcd import EtcdProcess
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn
from tests.support.aio import async_test
from tests.support.etcd import unique_cluster
from tests.support.groups import (
    GROUP,
    QUEUES,
    TOPIC,
    ReplicaGroup,
    Sent,
    commitlog_bytes,
    ha_flags,
    sigcont_on_exit,
)
from tests.support.polling import eventually
from tests.support.processes import run_basalt

pytestmark = pytest.mark.slow

WAIT_S = 60.0


@async_test(timeout_s=240)
async def test_a_frozen_master_acknowledges_nothing_after_its_lease_and_becomes_a_slave(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    async with ReplicaGroup(
        tmp_path, etcd.endpoint, unique_cluster(), flags=ha_flags(min_in_sync=2)
    ) as group:
        await eventually(lambda: group.in_sync({0, 1, 2}), timeout_s=WAIT_S, what="all in sync")
        first = await group.state()
        old = first.master_id
        assert (await group.send(old, b"before")).ok
        zombie = group.members[old]
        with sigcont_on_exit([zombie]):
            zombie.pause()
            await eventually(
                lambda: group.master_ready(above_epoch=first.epoch, not_id=old),
                timeout_s=WAIT_S,
                what="a master elected while the old one is frozen",
            )
            second = await group.state()
            zombie.resume()
            # Probe the zombie as it wakes: a send every 20 ms for ~2 s.
            probes: list[asyncio.Future[Sent]] = []
            for i in range(100):
                probes.append(asyncio.ensure_future(group.send(old, b"zombie-%d" % i)))
                await asyncio.sleep(0.02)
            answers = await asyncio.gather(*probes)
        acknowledged = [a for a in answers if a.ok]
        assert acknowledged == []
        # It follows the new master: NOT_MASTER naming it, SLAVE in its registration.
        new_address = group.members[second.master_id].address

        async def follows() -> bool:
            refusal = await group.send(old, b"to the old master")
            _, members = await group.view()
            return (
                refusal.code == pb.RESPONSE_CODE_NOT_MASTER
                and master_address_of(refusal.message) == new_address
                and old in members
                and members[old].role == "SLAVE"
            )

        await eventually(follows, timeout_s=WAIT_S, what="the old master follows")
        await eventually(lambda: group.in_sync({0, 1, 2}), timeout_s=WAIT_S, what="rejoined")
        read = set((await group.read_all(second.master_id)).values())
        assert b"before" in read
        assert not any(body.startswith(b"zombie-") for body in read)


@async_test(timeout_s=240)
async def test_a_lagging_member_alone_never_campaigns_and_electmaster_unclean_makes_it_master(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    cluster = unique_cluster()
    async with ReplicaGroup(
        tmp_path, etcd.endpoint, cluster, flags=ha_flags(min_in_sync=1)
    ) as group:
        await eventually(lambda: group.in_sync({0, 1, 2}), timeout_s=WAIT_S, what="all in sync")
        master = (await group.state()).master_id
        lagging, other = (i for i in group.members if i != master)
        # It has followed epoch 1 (a store that never did is taken for a new
        # disk: named master, it resigns), then it dies and falls behind.
        for i in range(20):
            assert (await group.send(master, b"all have it %d" % i)).ok
        group.members[lagging].kill()

        # The master keeps writing; the dead member falls out of the set.
        async def shrunk() -> bool:
            await group.send(master, b"while it lags")
            return await group.in_sync({master, other})

        await eventually(shrunk, timeout_s=WAIT_S, what="the lagging member out of the set")
        group.members[master].kill()
        group.members[other].kill()
        await group.restart(lagging)
        state = await group.state()

        async def alone() -> bool:
            _, members = await group.view()
            return set(members) == {lagging}

        await eventually(alone, timeout_s=WAIT_S, what="the dead members' keys gone")
        # Many of its election rounds (it is woken every 0.5 s and by every change).
        await asyncio.sleep(2.0)
        assert await group.state() == state
        refusal = await group.send(lagging, b"no master")
        assert refusal.code == pb.RESPONSE_CODE_NOT_MASTER

        argv = ("admin", "electMaster", "-b", GROUP, "-n", str(lagging))
        where = ("--etcd", etcd.endpoint, "--cluster", cluster)
        code, out, err = await run_basalt(*argv, *where)
        assert code != 0 and await group.state() == state, out + err
        code, out, err = await run_basalt(*argv, "--unclean", *where)
        assert code == 0, out + err
        assert "unclean election" in out + err and "may be lost" in out + err
        after = await group.state()
        assert after.master_id == lagging and after.epoch == state.epoch + 1
        await eventually(
            lambda: group.master_ready(above_epoch=state.epoch),
            timeout_s=WAIT_S,
            what="the unclean master takes sends",
        )
        assert (await group.send(lagging, b"after the unclean election")).ok


async def committed(group: ReplicaGroup, member: int) -> list[int]:
    return [
        (
            await group.stub(member).QueryConsumerOffset(
                sn.QueryConsumerOffsetRequest(group="C", topic=TOPIC, queue_id=q), timeout=5
            )
        ).offset
        for q in range(QUEUES)
    ]


async def pop(group: ReplicaGroup, member: int, invisible_ms: int) -> list[sn.PoppedMessage]:
    r = await group.stub(member).PopMessages(
        sn.PopMessagesRequest(
            group="PG",
            topic=TOPIC,
            queue_ids=list(range(QUEUES)),
            max_messages=32,
            invisible_duration_ms=invisible_ms,
        ),
        timeout=10,
    )
    return list(r.messages)


@async_test(timeout_s=240)
async def test_consumer_offsets_and_pop_state_survive_a_failover(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    interval_ms = 500
    async with ReplicaGroup(
        tmp_path,
        etcd.endpoint,
        unique_cluster(),
        flags=ha_flags(min_in_sync=2, offset_sync_ms=interval_ms),
    ) as group:
        await eventually(lambda: group.in_sync({0, 1, 2}), timeout_s=WAIT_S, what="all in sync")
        first = await group.state()
        old = first.master_id
        for i in range(20):
            assert (await group.send(old, b"pop-%d" % i, i % QUEUES)).ok
        offsets = [7, 4]
        for q, offset in enumerate(offsets):
            await group.stub(old).UpdateConsumerOffset(
                sn.UpdateConsumerOffsetRequest(group="C", topic=TOPIC, queue_id=q, offset=offset),
                timeout=5,
            )
        delivered: dict[tuple[int, int], str] = {}

        async def popped_all() -> bool:
            for m in await pop(group, old, invisible_ms=4000):
                delivered[(m.queue_id, m.queue_offset)] = m.receipt_handle
            return len(delivered) == 20

        await eventually(popped_all, timeout_s=WAIT_S, what="every message popped")
        acked = {key for i, key in enumerate(sorted(delivered)) if i % 2 == 0}
        r = await group.stub(old).AckMessages(
            sn.AckMessagesRequest(
                group="PG", topic=TOPIC, receipt_handles=[delivered[k] for k in sorted(acked)]
            ),
            timeout=5,
        )
        assert all(a.status == sn.POP_ACK_STATUS_OK for a in r.results), r
        unacked = set(delivered) - acked
        slaves = [i for i in group.members if i != old]
        for s in slaves:
            await eventually(
                lambda s=s: _equal(group, s, offsets),
                timeout_s=WAIT_S,
                what=f"offsets on slave {s}",
            )
        # Two sync intervals: the pop state's acks are on the slaves too.
        await asyncio.sleep(2 * interval_ms / 1000 + 0.2)

        group.members[old].kill()
        await eventually(
            lambda: group.master_ready(above_epoch=first.epoch, not_id=old),
            timeout_s=WAIT_S,
            what="a new master",
        )
        new = (await group.state()).master_id
        assert await committed(group, new) == offsets

        redelivered: set[tuple[int, int]] = set()

        async def unacked_back() -> bool:
            for m in await pop(group, new, invisible_ms=60_000):
                redelivered.add((m.queue_id, m.queue_offset))
            return unacked <= redelivered

        await eventually(unacked_back, timeout_s=WAIT_S, what="the unacked ones redelivered")
        assert redelivered & acked == set()


async def _equal(group: ReplicaGroup, member: int, offsets: list[int]) -> bool:
    return await committed(group, member) == offsets


@async_test(timeout_s=240)
async def test_a_restart_with_records_above_the_confirm_offset_reissues_no_queue_offset(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    async with ReplicaGroup(
        tmp_path,
        etcd.endpoint,
        unique_cluster(),
        flags=ha_flags(min_in_sync=2, not_catchup_ms=5000, sync_flush_timeout_ms=500),
    ) as group:
        await eventually(lambda: group.in_sync({0, 1, 2}), timeout_s=WAIT_S, what="all in sync")
        master = (await group.state()).master_id
        sent: list[Sent] = []
        for i in range(30):
            sent.append(await group.send(master, b"confirmed-%d" % i, i % QUEUES))
        assert all(s.ok for s in sent)
        slaves = [i for i in group.members if i != master]
        for i in slaves:
            group.members[i].kill()
        above = await asyncio.gather(
            *(group.send(master, b"above-%d" % i, i % QUEUES) for i in range(10))
        )
        assert {s.status for s in above} == {pb.SEND_STATUS_FLUSH_SLAVE_TIMEOUT}, above
        sent += above
        group.members[master].kill()

        # The master first (it is still named master), then its slaves.
        await group.restart(master)
        for i in slaves:
            await group.restart(i)
        await eventually(lambda: group.in_sync({0, 1, 2}), timeout_s=WAIT_S, what="all back")
        assert (await group.state()).master_id == master
        for i in range(20):
            s = await group.send(master, b"after-%d" % i, i % QUEUES)
            assert s.ok, s
            sent.append(s)

        holder: dict[tuple[int, int], bytes] = {}
        for s in sent:
            key = (s.queue_id, s.queue_offset)
            assert holder.setdefault(key, s.body) == s.body, f"{key} given twice"
        read = await group.read_all(master)
        assert {k: v for k, v in read.items() if k in holder} == holder
        for q in range(QUEUES):
            offsets = sorted(o for (qq, o) in read if qq == q)
            assert offsets == list(range(len(offsets)))

        def identical() -> bool:
            logs = [commitlog_bytes(m.commitlog()) for m in group.members.values()]
            return logs[0] == logs[1] == logs[2]

        await eventually(identical, timeout_s=WAIT_S, what="byte-identical CommitLogs")
