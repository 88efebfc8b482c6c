"""The replication stream end to end in one process: real stores on
``tmp_path`` in controller mode, a real grpc.aio server on port 0 per master,
real slaves, and a ``change_sync_state_set`` that records each CAS (and can
hold it) in place of etcd.

(The helpers live here, not in tests.support, while this is the only module
using them: tests.support.replication is where they go when another does.)"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from basalt.services.store_node.ha.config import ReplicaAckMode, ReplicationConfig
from basalt.services.store_node.ha.master import ReplicationMaster
from basalt.services.store_node.ha.servicer import ReplicationServicer
from basalt.services.store_node.ha.slave import ReplicationSlave
from basalt.store import ManualClock, Message, MessageStore
from basalt.v1 import common_pb2 as pb
from basalt.v1 import replication_pb2 as rpb
from basalt.v1 import replication_pb2_grpc as rpb_grpc
from tests.support.aio import async_test
from tests.support.polling import eventually
from tests.support.rpc import refused
from tests.support.stores import small_store_config

BROKER = "broker-a"
TOPIC = "TopicA"


def open_store(root: Path, **overrides: Any) -> MessageStore:
    """A started store at ``root``: small files, controller mode."""
    return MessageStore.open(small_store_config(root, enable_controller_mode=True, **overrides))


def put(store: MessageStore, count: int, size: int = 1000, tag: bytes = b"m") -> int:
    """``count`` messages of ``size`` bytes on queue 0; the store's new max offset."""
    for i in range(count):
        body = tag + str(i).encode().rjust(8, b"0") + b"x" * size
        result = store.put_message(Message(topic=TOPIC, body=body, queue_id=0))
        assert result.ok, result
    return store.max_offset


def commitlog_bytes(store: MessageStore) -> dict[str, bytes]:
    """Each CommitLog file's name -> its bytes."""
    directory = store.config.commitlog_dir
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


@dataclass
class SetChanges:
    """The group state's in-sync set, as the integrator's CAS would keep it:
    each call recorded; held while ``gate`` is clear; answers ``win``."""

    calls: list[frozenset[int]] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    win: bool = True

    def __post_init__(self) -> None:
        self.gate.set()

    async def __call__(self, new_set: frozenset[int]) -> bool:
        self.calls.append(new_set)
        await self.gate.wait()
        return self.win


@dataclass
class Served:
    """A master on a gRPC server."""

    master: ReplicationMaster
    servicer: ReplicationServicer
    address: str
    server: grpc.aio.Server


@contextlib.asynccontextmanager
async def serve(
    store: MessageStore,
    config: ReplicationConfig,
    *,
    epoch: int = 1,
    members: frozenset[int] = frozenset({1}),
    changes: SetChanges | None = None,
    master_id: int = 1,
    **kw: Any,
) -> AsyncIterator[Served]:
    """Start a master of ``store`` and serve it on a port-0 server."""
    master = ReplicationMaster(
        store, config, BROKER, master_id, epoch, members, changes or SetChanges(), **kw
    )
    await master.start()
    servicer = ReplicationServicer(f"{BROKER}/{master_id}")
    servicer.serve_as(master)
    server = grpc.aio.server()
    rpb_grpc.add_ReplicationServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield Served(master, servicer, f"127.0.0.1:{port}", server)
    finally:
        await master.close()
        await server.stop(None)


@contextlib.asynccontextmanager
async def follow(
    store: MessageStore, config: ReplicationConfig, address: str, broker_id: int = 2
) -> AsyncIterator[ReplicationSlave]:
    """Run a slave of ``store`` following ``address`` until the block ends."""
    slave = ReplicationSlave(store, config, BROKER, broker_id, address)
    task = asyncio.ensure_future(slave.run())
    try:
        yield slave
    finally:
        await slave.close()
        await task


def fast(**overrides: Any) -> ReplicationConfig:
    """Short heartbeats and state syncs, small frames (several per file)."""
    values: dict[str, Any] = {
        "ha_heartbeat_interval_ms": 50,
        "ha_offset_sync_interval_ms": 200,
        "ha_transfer_batch_size_bytes": 16 * 1024,
    }
    values.update(overrides)
    return ReplicationConfig(**values)


def epochs_of(store: MessageStore) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in store.epochs.entries()]


async def hello(
    stub: rpb_grpc.ReplicationStub, *, broker_name: str = BROKER, broker_id: int = 2
) -> Any:
    """A raw stream whose hello says an empty log."""
    call = stub.Replicate()
    await call.write(
        rpb.ReplicaRequest(
            hello=rpb.ReplicaHello(broker_name=broker_name, broker_id=broker_id, max_offset=0)
        )
    )
    return call


# -- catching up ------------------------------------------------------------------------


@async_test
async def test_an_empty_slave_catches_up_over_file_rolls_byte_identical(tmp_path: Path) -> None:
    config = fast()
    master_store = open_store(tmp_path / "m")
    slave_store = open_store(tmp_path / "s")
    try:
        put(master_store, 150)  # ~150 KB: three 64 KiB files
        async with (
            serve(master_store, config) as served,
            follow(slave_store, config, served.address) as slave,
        ):
            await eventually(lambda: slave_store.max_offset == master_store.max_offset)
            top = put(master_store, 60)  # and while connected, another roll
            served.master.notify_appended()
            await eventually(lambda: slave_store.max_offset == top)
            assert slave.connected and slave.master_epoch == 1
        assert len(commitlog_bytes(master_store)) >= 4
        assert commitlog_bytes(slave_store) == commitlog_bytes(master_store)
        assert epochs_of(slave_store) == epochs_of(master_store) == [(1, 0)]
    finally:
        slave_store.shutdown()
        master_store.shutdown()


@async_test
async def test_a_new_member_syncs_from_the_masters_first_file_after_expiry(tmp_path: Path) -> None:
    # The master's first files are deleted by expiry: a member that joins later
    # (a new disk) starts at the master's first offset, a file boundary, and
    # holds the master's remaining files byte-identical from there.
    config = fast()
    master_store = open_store(tmp_path / "m", file_reserved_time_hours=0)
    slave_store = open_store(tmp_path / "s")
    try:
        put(master_store, 250)  # ~250 KB: four 64 KiB files and a fifth begun
        async with serve(master_store, config) as served:
            # Alone in its in-sync set, the master confirms (and dispatches) all of
            # it: expiry deletes only what is dispatched.
            served.master.notify_appended()
            await eventually(lambda: master_store.confirm_offset == master_store.max_offset)
            # (and the index behind the dispatcher: a round deletes once both are past).
            await eventually(lambda: bool(master_store.delete_expired_files().commitlog_files))
            first = master_store.commitlog.min_offset
            assert first > 0 and first % master_store.config.mapped_file_size_commit_log == 0
            async with follow(slave_store, config, served.address):
                await eventually(lambda: slave_store.max_offset == master_store.max_offset)
                top = put(master_store, 20)
                served.master.notify_appended()
                await eventually(lambda: slave_store.max_offset == top)
        assert slave_store.commitlog.min_offset == first
        assert commitlog_bytes(slave_store) == commitlog_bytes(master_store)
    finally:
        slave_store.shutdown()
        master_store.shutdown()


@async_test
async def test_a_divergent_tail_is_cut_to_the_consistent_point(tmp_path: Path) -> None:
    config = fast()
    a = open_store(tmp_path / "a")
    b = open_store(tmp_path / "b")
    try:
        put(a, 40, tag=b"shared")
        async with (
            serve(a, config, epoch=1) as served,
            follow(b, config, served.address),
        ):  # a leads epoch 1, b follows
            await eventually(lambda: b.max_offset == a.max_offset)
        shared = a.max_offset
        put(a, 30, tag=b"lost")  # a's tail no one else has
        assert a.max_offset > shared
        # b is elected for epoch 2 and writes its own records from `shared`
        async with serve(b, config, epoch=2, master_id=2, members=frozenset({2})) as served:
            top = put(b, 20, tag=b"epoch2")
            served.master.notify_appended()
            async with follow(a, config, served.address, broker_id=1) as slave:
                await eventually(lambda: a.max_offset == top)
                assert slave.connected
        assert epochs_of(b) == [(1, 0), (2, shared)]
        assert epochs_of(a) == epochs_of(b)
        assert commitlog_bytes(a) == commitlog_bytes(b)
    finally:
        a.shutdown()
        b.shutdown()


# -- frames -----------------------------------------------------------------------------


@async_test
async def test_frames_never_span_two_epochs(tmp_path: Path) -> None:
    config = fast(ha_transfer_batch_size_bytes=5000)
    store = open_store(tmp_path / "m")
    try:
        put(store, 23)
        async with serve(store, config, epoch=1):
            pass
        boundary = store.max_offset
        async with serve(store, config, epoch=2) as served:
            top = put(store, 23)
            stub = rpb_grpc.ReplicationStub(grpc.aio.insecure_channel(served.address))
            call = await hello(stub)
            handshake = (await call.read()).handshake
            assert (handshake.epoch, handshake.max_offset) == (2, top)
            assert [(e.epoch, e.start_offset, e.end_offset) for e in handshake.epochs] == [
                (1, 0, boundary),
                (2, boundary, -1),
            ]
            await call.write(rpb.ReplicaRequest(ack=rpb.ReplicaAck(offset=0)))
            frames: list[rpb.ReplicaFrame] = []
            at = 0
            while at < top:
                message = await call.read()
                if message.HasField("frame"):
                    assert message.frame.offset == at
                    frames.append(message.frame)
                    at += len(message.frame.data)
            call.cancel()
        for frame in frames:
            end = frame.offset + len(frame.data)
            assert len(frame.data) <= 5000
            if frame.epoch == 1:
                assert end <= boundary and frame.epoch_start_offset == 0
            else:
                assert frame.epoch == 2 and frame.offset >= boundary
                assert frame.epoch_start_offset == boundary
        assert {f.epoch for f in frames} == {1, 2}
        assert any(f.offset + len(f.data) == boundary for f in frames)
    finally:
        store.shutdown()


@async_test
async def test_a_slave_refuses_a_frame_of_an_older_epoch(tmp_path: Path) -> None:
    config = fast()
    master_store = open_store(tmp_path / "m")
    slave_store = open_store(tmp_path / "s")
    try:
        put(master_store, 5)
        async with (
            serve(master_store, config, epoch=2) as served,
            follow(slave_store, config, served.address) as slave,
        ):
            await eventually(lambda: slave_store.max_offset == master_store.max_offset)
            # the slave learns of epoch 3 (a newer master's term) ...
            slave_store.epochs.append(3, slave_store.max_offset)
            held = slave_store.max_offset
            put(master_store, 5)  # ... so the deposed master's next frame is refused
            served.master.notify_appended()
            await eventually(
                lambda: "older than" in str(slave.last_error) or "epoch 2" in str(slave.last_error)
            )
            assert slave_store.max_offset == held
            assert "epoch 3" in str(slave.last_error)
    finally:
        slave_store.shutdown()
        master_store.shutdown()


# -- acks, the confirm offset and the in-sync set ---------------------------------------


@async_test
async def test_sync_wait_acked_returns_only_after_the_slave_acked(tmp_path: Path) -> None:
    config = fast()
    master_store = open_store(tmp_path / "m")
    slave_store = open_store(tmp_path / "s")
    try:
        async with serve(master_store, config, members=frozenset({1, 2})) as served:
            master = served.master
            end = put(master_store, 3)
            master.notify_appended()
            assert not await master.wait_acked(end, 0.2)  # no slave yet
            async with follow(slave_store, config, served.address):
                assert await master.wait_acked(end, 20)
                assert slave_store.max_offset >= end
                assert master.slave_offsets()[2] >= end
                end2 = put(master_store, 1)
                master.notify_appended()
                assert await master.wait_acked(end2, 20)
                assert slave_store.max_offset >= end2
    finally:
        slave_store.shutdown()
        master_store.shutdown()


@async_test
async def test_async_mode_and_the_minimum(tmp_path: Path) -> None:
    store = open_store(tmp_path / "m")
    try:
        config = fast(replica_ack_mode=ReplicaAckMode.ASYNC, min_in_sync_replicas=2)
        async with serve(store, config, members=frozenset({1, 2})) as served:
            assert await served.master.wait_acked(put(store, 1), 0.01)
            assert served.master.refusal() is None
        async with serve(store, config, epoch=2) as served:
            assert "min_in_sync_replicas is 2" in (served.master.refusal() or "")
    finally:
        store.shutdown()


def visible(store: MessageStore) -> int:
    return store.get_message("g", TOPIC, 0, 0, 32).message_count


@async_test
async def test_the_master_dispatches_only_what_the_slave_acked(tmp_path: Path) -> None:
    config = fast()
    master_store = open_store(tmp_path / "m")
    slave_store = open_store(tmp_path / "s")
    try:
        async with serve(master_store, config, members=frozenset({1, 2})) as served:
            end = put(master_store, 3)
            served.master.notify_appended()
            await asyncio.sleep(0.3)  # the dispatcher had every chance
            assert master_store.confirm_offset < end
            assert visible(master_store) == 0
            async with follow(slave_store, config, served.address):
                await eventually(lambda: visible(master_store) == 3)
                assert served.master.slave_offsets()[2] >= end
                await eventually(lambda: visible(slave_store) == 3)  # the heartbeat's confirm
    finally:
        slave_store.shutdown()
        master_store.shutdown()


@async_test
async def test_shrink_after_not_catching_up_and_grow_back(tmp_path: Path) -> None:
    config = fast(ha_max_time_slave_not_catchup_ms=1000)
    clock = ManualClock()
    changes = SetChanges()
    master_store = open_store(tmp_path / "m")
    slave_store = open_store(tmp_path / "s")
    try:
        async with serve(
            master_store, config, members=frozenset({1, 2}), changes=changes, clock=clock
        ) as served:
            master = served.master
            async with follow(slave_store, config, served.address):
                await eventually(lambda: master.slave_offsets().get(2) == master_store.max_offset)
            # the slave is gone; a send it never gets, then time passes
            changes.gate.clear()
            end = put(master_store, 1)
            master.notify_appended()
            clock.advance(1500)
            await eventually(lambda: changes.calls == [frozenset({1})])
            assert master.pending_sync_state_set == {1}
            assert not await master.wait_acked(end, 0.1)  # 2 still counts while pending
            changes.gate.set()
            await eventually(lambda: master.sync_state_set == {1})
            assert await master.wait_acked(end, 1)
            # back: it catches up and joins; while that change is pending, it counts
            changes.gate.clear()
            async with follow(slave_store, config, served.address):
                await eventually(lambda: changes.calls[-1:] == [frozenset({1, 2})])
                assert master.sync_state_set == {1}
            end2 = put(master_store, 1)  # the slave is gone again
            master.notify_appended()
            assert not await master.wait_acked(end2, 0.1)
            changes.gate.set()
            await eventually(lambda: master.sync_state_set == {1, 2})
    finally:
        slave_store.shutdown()
        master_store.shutdown()


@async_test
async def test_a_lost_cas_keeps_the_old_set(tmp_path: Path) -> None:
    config = fast(ha_max_time_slave_not_catchup_ms=1000)
    clock = ManualClock()
    changes = SetChanges(win=False)
    store = open_store(tmp_path / "m")
    try:
        async with serve(
            store, config, members=frozenset({1, 2}), changes=changes, clock=clock
        ) as served:
            clock.advance(1500)
            await eventually(lambda: len(changes.calls) >= 1)
            await eventually(lambda: served.master.pending_sync_state_set is None)
            assert served.master.sync_state_set == {1, 2}
    finally:
        store.shutdown()


@async_test
async def test_replica_state_reaches_the_slave(tmp_path: Path) -> None:
    config = fast()
    master_store = open_store(tmp_path / "m")
    slave_store = open_store(tmp_path / "s")
    try:
        put(master_store, 5)
        async with (
            serve(master_store, config) as served,
            follow(slave_store, config, served.address),
        ):
            await eventually(lambda: slave_store.max_offset == master_store.max_offset)
            assert master_store.commit_offset("g", TOPIC, 0, 4).ok
            await eventually(lambda: slave_store.query_offset("g", TOPIC, 0) == 4)
    finally:
        slave_store.shutdown()
        master_store.shutdown()


# -- refusals ---------------------------------------------------------------------------


@async_test
async def test_refusals(tmp_path: Path) -> None:
    store = open_store(tmp_path / "m")
    try:
        async with serve(store, fast(), epoch=2) as served:
            stub = rpb_grpc.ReplicationStub(grpc.aio.insecure_channel(served.address))
            call = await hello(stub, broker_name="broker-b")
            status, code, message = await refused(call.read())
            assert (status, code) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                pb.RESPONSE_CODE_INVALID_PARAMETER,
            )
            assert "broker-b" in message
            call = stub.Replicate()
            await call.write(
                rpb.ReplicaRequest(
                    hello=rpb.ReplicaHello(
                        broker_name=BROKER,
                        broker_id=2,
                        epochs=[rpb.EpochEntry(epoch=3, start_offset=0, end_offset=-1)],
                    )
                )
            )
            status, code, message = await refused(call.read())
            assert (status, code) == (
                grpc.StatusCode.FAILED_PRECONDITION,
                pb.RESPONSE_CODE_NOT_MASTER,
            )
            assert "deposed" in message
            served.servicer.serve_as(None, "3 at 10.0.0.7:9876")
            # Refused as the call starts, before any hello is read: a write may
            # already find the call ended, so only the read is awaited.
            call = stub.Replicate()
            status, code, message = await refused(call.read())
            assert code == pb.RESPONSE_CODE_NOT_MASTER and "10.0.0.7:9876" in message
    finally:
        store.shutdown()
