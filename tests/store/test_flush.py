"""Flushing: SYNC group commit, ASYNC periodic flush, and the checkpoint timestamps.

fsync itself cannot be observed without mocks, so these tests check the
store's own account of it: ``commitlog.files.flushed_where`` (advanced only
after ``fdatasync`` returns) and the checkpoint file on disk.
"""

from __future__ import annotations

import asyncio
import struct
import threading

import pytest

from basalt.store import (
    FlushDiskType,
    ManualClock,
    Message,
    MessageStore,
    PutMessageResult,
    PutStatus,
)
from basalt.store.checkpoint import CHECKPOINT_FILE_SIZE
from basalt.store.config import MessageStoreConfig
from tests.support.polling import eventually_sync
from tests.support.stores import SMALL_COMMITLOG_FILE, ConfigFactory, run_threads

CHECKPOINT = struct.Struct(">qqq")  # physicMsgTimestamp, logicsMsgTimestamp, indexMsgTimestamp


def read_checkpoint(config: MessageStoreConfig) -> tuple[int, int, int]:
    data = config.checkpoint_path.read_bytes()
    assert len(data) == CHECKPOINT_FILE_SIZE
    physic, logics, index = CHECKPOINT.unpack_from(data)
    return physic, logics, index


def end_of(result: PutMessageResult) -> int:
    """One past the last byte a successful put wrote."""
    return result.physical_offsets[-1] + result.sizes[-1]


def flushed_where(store: MessageStore) -> int:
    return store.commitlog.files.flushed_where


# -- SYNC -------------------------------------------------------------------------------


def test_sync_put_returns_only_after_its_bytes_are_flushed(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    with MessageStore(make_config(flush_disk_type=FlushDiskType.SYNC_FLUSH), clock=clock) as store:
        for i in range(40):
            clock.advance(10)
            body = b"s" * 5000
            if i % 4 == 3:
                result = store.put_messages([Message("Sync", body) for _ in range(3)])
            else:
                result = store.put_message(Message("Sync", body))

            assert result.status is PutStatus.PUT_OK, result.detail
            end = end_of(result)
            assert flushed_where(store) >= end
            last_file = store.commitlog.files.find_by_offset(result.physical_offsets[-1])
            assert last_file is not None
            assert last_file.file_from_offset + last_file.flushed_position >= end
            # The checkpoint vouches for the flushed record before the send is acknowledged
            # (in memory: the file follows with the next ConsumeQueue flush).
            assert store.checkpoint.physic_msg_timestamp == result.store_timestamp_ms
        assert store.max_physical_offset > 2 * SMALL_COMMITLOG_FILE


def test_sync_group_commit_serves_concurrent_senders(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    with MessageStore(make_config(flush_disk_type=FlushDiskType.SYNC_FLUSH), clock=clock) as store:
        threads, sends = 8, 40
        start = threading.Barrier(threads)
        outcomes: dict[int, list[tuple[PutMessageResult, int]]] = {}

        def sender(queue_id: int) -> None:
            start.wait()
            mine = outcomes.setdefault(queue_id, [])
            for i in range(sends):
                result = store.put_message(Message("Group", f"{queue_id}:{i}".encode(), queue_id))
                mine.append((result, flushed_where(store)))

        run_threads(sender, threads)

        physical = set()
        for results in outcomes.values():
            assert all(r.status is PutStatus.PUT_OK for r, _ in results), results
            assert [r.queue_offsets[0] for r, _ in results] == list(range(sends))
            for result, flushed_on_return in results:
                assert flushed_on_return >= end_of(result)
                physical.add(result.physical_offsets[0])
        assert len(physical) == threads * sends
        assert store.wait_dispatched(timeout_s=30)
        for queue_id in range(threads):
            bodies = [r.body for _, r in store.iter_queue("Group", queue_id)]
            assert bodies == [f"{queue_id}:{i}".encode() for i in range(sends)]


@pytest.mark.parametrize("flush", list(FlushDiskType))
def test_put_messages_async_under_asyncio(
    make_config: ConfigFactory, clock: ManualClock, flush: FlushDiskType
) -> None:
    with MessageStore(make_config(flush_disk_type=flush), clock=clock) as store:

        async def send_all() -> list[PutMessageResult]:
            singles = [
                store.put_messages_async([Message("Aio", f"{i}".encode())]) for i in range(40)
            ]
            batch = store.put_messages_async([Message("Aio", b"batch") for _ in range(5)])
            return await asyncio.gather(*singles, batch)

        results = asyncio.run(send_all())

        assert all(r.status is PutStatus.PUT_OK for r in results), [r.detail for r in results]
        queue_offsets = sorted(o for r in results for o in r.queue_offsets)
        assert queue_offsets == list(range(45))
        if flush is FlushDiskType.SYNC_FLUSH:
            assert flushed_where(store) >= max(end_of(r) for r in results)
        assert store.wait_dispatched()
        assert store.get_max_offset_in_queue("Aio", 0) == 45


def test_refused_async_put_reports_its_status(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    with MessageStore(make_config(flush_disk_type=FlushDiskType.SYNC_FLUSH), clock=clock) as store:
        result = asyncio.run(store.put_messages_async([Message("bad topic", b"x")]))
        assert result.status is PutStatus.MESSAGE_ILLEGAL
        assert store.max_physical_offset == 0


# -- ASYNC ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("least_pages", "batch"),
    [(0, 1), (4, 17)],  # 3 batches of 17 stay in one file
    ids=["every-interval", "enough-dirty-pages"],
)
def test_async_flush_eventually_flushes_and_stamps_the_checkpoint(
    make_config: ConfigFactory, clock: ManualClock, least_pages: int, batch: int
) -> None:
    with MessageStore(make_config(flush_commit_log_least_pages=least_pages), clock=clock) as store:
        result = None
        for _ in range(3):
            clock.advance(1000)
            result = store.put_messages([Message("Async", b"a" * 1000) for _ in range(batch)])
            assert result.ok
        assert result is not None
        end = store.max_physical_offset
        assert end == end_of(result)

        eventually_sync(lambda: flushed_where(store) >= end)
        eventually_sync(lambda: read_checkpoint(store.config)[0] == result.store_timestamp_ms)


def test_consume_queue_flush_stamps_the_logics_timestamp(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    with MessageStore(make_config(), clock=clock) as store:
        last = None
        for _ in range(5):
            clock.advance(1000)
            last = store.put_message(Message("Logics", b"l", tags="t"))
        assert last is not None

        eventually_sync(lambda: read_checkpoint(store.config)[1] == last.store_timestamp_ms)
        assert store.get_max_offset_in_queue("Logics", 0) == 5


def test_shutdown_flushes_what_the_interval_has_not(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config(
        flush_interval_commit_log_ms=600_000,
        flush_interval_consume_queue_ms=600_000,
        flush_commit_log_least_pages=1_000_000,
        flush_commit_log_thorough_interval_ms=600_000,
    )
    with MessageStore(config, clock=clock) as store:
        clock.advance(5000)
        result = store.put_messages([Message("Late", b"z" * 500, tags="z") for _ in range(10)])
        assert result.ok
        assert flushed_where(store) < end_of(result)

    physic, logics, _ = read_checkpoint(config)
    assert physic == logics == result.store_timestamp_ms
    reopened = MessageStore.open(config, clock=clock)
    try:
        report = reopened.recovery_report
        assert report is not None
        assert not report.abnormal
        assert report.consume_queue_entries_rebuilt == 0
        assert reopened.get_max_offset_in_queue("Late", 0) == 10
    finally:
        reopened.shutdown()
