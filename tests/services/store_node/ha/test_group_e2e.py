"""A broker group of three real store-node processes on the shared etcd
(docs/replication.md): failover after kill -9 of the master, a rejoining
member's log byte-identical to the master's, NOT_MASTER naming the master, the
SDK producer across a failover, and the in-sync set's minimum.

Each test has its own cluster name; timings are small (tests.support.groups.ha_flags)
and nothing here asserts how long anything took.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from basalt.client import Message, Producer
from basalt.client.errors import ClientError, NotEnoughReplicasError
from basalt.common.status import master_address_of
from basalt.services.cluster.etcd import EtcdProcess
from basalt.v1 import common_pb2 as pb
from tests.support.aio import async_test
from tests.support.etcd import unique_cluster
from tests.support.groups import (
    QUEUES,
    TOPIC,
    Member,
    ReplicaGroup,
    Sent,
    commitlog_bytes,
    ha_flags,
    missing,
    sigcont_on_exit,
)
from tests.support.polling import eventually
from tests.support.processes import ServiceProcess

pytestmark = pytest.mark.slow

#: A failover (lease 2 s, then a campaign) and a rejoin take seconds; this
#: bounds a hang on a loaded machine.
WAIT_S = 60.0


#: Pads a body so a test's sends roll the members' 64 KiB CommitLog files.
PAD = b"." * 600


async def send_all(group: ReplicaGroup, master: int, bodies: list[bytes]) -> list[Sent]:
    """Each body to ``master`` in turn (queues alternating): the answers."""
    return [await group.send(master, b, i % QUEUES) for i, b in enumerate(bodies)]


@async_test(timeout_s=240)
async def test_failover_keeps_every_acknowledged_send_and_the_old_master_rejoins_identical(
    tmp_path: Path, etcd: EtcdProcess
) -> None:
    async with ReplicaGroup(
        tmp_path, etcd.endpoint, unique_cluster(), flags=ha_flags(min_in_sync=2)
    ) as group:
        await eventually(lambda: group.in_sync({0, 1, 2}), timeout_s=WAIT_S, what="all in sync")
        first = await group.state()
        old = first.master_id
        slaves = [group.members[i] for i in group.members if i != old]

        acked = await send_all(group, old, [b"before-%d" % i + PAD for i in range(200)])
        assert all(s.ok for s in acked), {s.status for s in acked}

        # A tail only the master has: the slaves are stopped while it writes,
        # then it dies (the sends are never confirmed).
        with sigcont_on_exit(slaves):
            for s in slaves:
                s.pause()
            pending = [
                asyncio.ensure_future(group.send(old, b"tail-%d" % i, i % QUEUES, timeout_s=2))
                for i in range(5)
            ]
            await asyncio.sleep(0.3)
            group.members[old].kill()
            for s in slaves:
                s.resume()
        tail = await asyncio.gather(*pending)
        assert not any(s.ok for s in tail)  # never confirmed by the set

        await eventually(
            lambda: group.master_ready(above_epoch=first.epoch, not_id=old),
            timeout_s=WAIT_S,
            what="a new master",
        )
        second = await group.state()
        assert second.epoch > first.epoch and second.master_id != old
        new = second.master_id
        read = await group.read_all(new)
        assert missing(acked, read) == []

        # The other live member rejoins the set; sends are acknowledged again.
        live = {i for i in group.members if i != old}
        await eventually(lambda: group.in_sync(live), timeout_s=WAIT_S, what="two in sync")
        after = await send_all(group, new, [b"after-%d" % i + PAD for i in range(100)])
        assert all(s.ok for s in after), {(s.status, s.code, s.message) for s in after}

        # The old master comes back as a slave of the new epoch: it cuts a tail
        # the group never had and ends byte-identical to the master.
        await group.restart(old)
        await eventually(lambda: group.in_sync({0, 1, 2}), timeout_s=WAIT_S, what="rejoined")
        state = await group.state()
        assert state.master_id == new and state.epoch == second.epoch
        _, members = await group.view()
        assert members[old].role == "SLAVE"

        def identical() -> bool:
            logs = [commitlog_bytes(m.commitlog()) for m in group.members.values()]
            return logs[0] == logs[1] == logs[2]

        await eventually(identical, timeout_s=WAIT_S, what="byte-identical CommitLogs")
        read = await group.read_all(new)
        assert missing(acked + after, read) == []
        # No tail message is read at an offset an acknowledged one holds.
        bodies = list(read.values())
        assert len(bodies) == len(set(bodies))

        # A clean stop of the master hands the group to a caught-up slave before
        # the process exits: the state names another member at the next epoch
        # by then (no lease had to end), and nothing acknowledged is missing.
        stopped = await asyncio.to_thread(group.members[new].terminate)
        assert stopped == 0, group.members[new].log_tail()
        handed = await group.state()
        assert handed.master_id != new and handed.epoch == second.epoch + 1
        await eventually(
            lambda: group.master_ready(above_epoch=second.epoch, not_id=new),
            timeout_s=WAIT_S,
            what="the handed-over master takes sends",
        )
        read = await group.read_all(handed.master_id)
        assert missing(acked + after, read) == []


@async_test(timeout_s=240)
async def test_not_master_names_the_master_and_the_sdk_producer_rides_a_failover(
    tmp_path: Path, etcd: EtcdProcess, processes: list[ServiceProcess]
) -> None:
    cluster = unique_cluster()
    async with ReplicaGroup(
        tmp_path, etcd.endpoint, cluster, flags=ha_flags(min_in_sync=2)
    ) as group:
        pull = ServiceProcess(
            tmp_path / "ps.log",
            "basalt.services.pull_service.main",
            "--id", "ps-1", "--etcd", etcd.endpoint, "--cluster", cluster, "--lease-ttl-s", "2",
        )  # fmt: skip
        processes.append(pull)
        await asyncio.to_thread(pull.wait_serving)
        await eventually(lambda: group.in_sync({0, 1, 2}), timeout_s=WAIT_S, what="all in sync")
        first = await group.state()
        old = first.master_id
        slave = next(i for i in group.members if i != old)

        refusal = await group.send(slave, b"to a slave")
        assert refusal.status == 0 and refusal.code == pb.RESPONSE_CODE_NOT_MASTER
        assert master_address_of(refusal.message) == group.members[old].address

        # A second store-node given a live member's broker id (a copy-pasted
        # config) refuses to start, naming the holder; the member keeps its key.
        (tmp_path / "dup").mkdir()
        duplicate = Member(tmp_path / "dup", slave, etcd.endpoint, cluster, ha_flags())
        duplicate.start()
        assert duplicate.proc is not None
        assert await asyncio.to_thread(duplicate.proc.wait, 60) != 0
        assert "needs its own --broker-id" in duplicate.log.read_text()
        assert (await group.view())[1][slave].address == group.members[slave].address

        acked: dict[str, bytes] = {}
        failures = 0
        counter = itertools.count()
        stop = asyncio.Event()

        async with Producer(pull.address, group="P") as producer:

            async def produce() -> None:
                nonlocal failures
                while not stop.is_set():
                    body = b"sdk-%d" % next(counter)
                    try:
                        r = await producer.send(Message(topic=TOPIC, body=body))
                    except ClientError:
                        failures += 1  # the failover window: the send is retried as a new one
                        await asyncio.sleep(0.05)
                        continue
                    if r.ok:
                        acked[r.msg_id] = body

            task = asyncio.ensure_future(produce())
            await eventually(lambda: len(acked) >= 50, timeout_s=WAIT_S, what="sends before")
            group.members[old].kill()
            await eventually(
                lambda: group.master_ready(above_epoch=first.epoch, not_id=old),
                timeout_s=WAIT_S,
                what="a new master",
            )
            before_new = len(acked)
            await eventually(
                lambda: len(acked) >= before_new + 50, timeout_s=WAIT_S, what="sends after"
            )
            stop.set()
            await task

        new = (await group.state()).master_id
        read = set((await group.read_all(new)).values())
        lost = [body for body in acked.values() if body not in read]
        assert lost == []


@async_test(timeout_s=240)
async def test_below_min_in_sync_replicas_sends_are_refused_until_a_slave_rejoins(
    tmp_path: Path, etcd: EtcdProcess, processes: list[ServiceProcess]
) -> None:
    cluster = unique_cluster()
    async with ReplicaGroup(
        tmp_path, etcd.endpoint, cluster, flags=ha_flags(min_in_sync=2, not_catchup_ms=3000)
    ) as group:
        await eventually(lambda: group.in_sync({0, 1, 2}), timeout_s=WAIT_S, what="all in sync")
        master = (await group.state()).master_id
        slaves = [i for i in group.members if i != master]
        assert (await group.send(master, b"all there")).ok

        for i in slaves:
            group.members[i].kill()
        # Before the set shrinks: written on the master, not confirmed in time.
        late = await group.send(master, b"unconfirmed")
        assert late.status == pb.SEND_STATUS_FLUSH_SLAVE_TIMEOUT, late

        await eventually(lambda: group.in_sync({master}), timeout_s=WAIT_S, what="set shrunk")
        refused = await group.send(master, b"refused")
        assert refused.status == 0 and refused.code == pb.RESPONSE_CODE_IN_SYNC_REPLICAS_NOT_ENOUGH

        # The SDK says the same (it retries elsewhere; there is no elsewhere).
        pull = ServiceProcess(
            tmp_path / "ps.log",
            "basalt.services.pull_service.main",
            "--id", "ps-1", "--etcd", etcd.endpoint, "--cluster", cluster, "--lease-ttl-s", "2",
        )  # fmt: skip
        processes.append(pull)
        await asyncio.to_thread(pull.wait_serving)
        async with Producer(pull.address, group="P") as producer:
            with pytest.raises(NotEnoughReplicasError):
                await producer.send(Message(topic=TOPIC, body=b"sdk refused"))

        await group.restart(slaves[0])
        await eventually(
            lambda: group.in_sync({master, slaves[0]}), timeout_s=WAIT_S, what="rejoined"
        )
        ok = await group.send(master, b"after the rejoin")
        assert ok.ok, ok
        read = set((await group.read_all(master)).values())
        assert {b"all there", b"after the rejoin"} <= read
        assert b"refused" not in read and b"sdk refused" not in read
