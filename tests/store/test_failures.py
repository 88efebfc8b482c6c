"""A background service that fails is the store's state, not a log line.

Each test injects the error a bad disk or an exhausted process gives (EIO
from fsync, EMFILE opening a file) into one service of a running store and
checks what issue 14 asks: the failure is recorded (which service, the
error), the next send is refused SERVICE_NOT_AVAILABLE naming it, reads of
what is stored keep working, and a restart recovers as after a crash.
"""

from __future__ import annotations

import asyncio
import errno
from typing import NoReturn

import pytest

from basalt.store import FlushDiskType, Message, MessageStore, PutStatus
from basalt.store.failures import FailureChannel, StoreFailure
from tests.support.polling import eventually_sync
from tests.support.stores import ConfigFactory

TOPIC = "Failing"


def raises(code: int) -> NoReturn:
    raise OSError(code, errno.errorcode[code])


def eio(*_: object) -> NoReturn:
    raises(errno.EIO)


def emfile(*_: object) -> NoReturn:
    raises(errno.EMFILE)


def assert_refused_naming(store: MessageStore, service: str, error: str) -> None:
    """Sends by every path are refused SERVICE_NOT_AVAILABLE, naming the service and error."""
    results = [
        store.put_message(Message(TOPIC, b"after")),
        asyncio.run(store.put_messages_async([Message(TOPIC, b"after")])),
    ]
    for result in results:
        assert result.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert service in result.detail and error in result.detail, result.detail
        assert not result.physical_offsets


def assert_reads_work(store: MessageStore, bodies: list[bytes]) -> None:
    assert store.get_max_offset_in_queue(TOPIC, 0) == len(bodies)
    got = store.get_message("G", TOPIC, 0, 0, 32)
    assert [m.body for m in got.decode()] == bodies


def test_an_fsync_error_in_the_async_flush_refuses_sends_and_keeps_reads(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(flush_commit_log_least_pages=0, flush_interval_commit_log_ms=10)
    with MessageStore(config) as store:
        assert store.healthy and store.failure is None
        assert store.put_message(Message(TOPIC, b"before")).ok
        store.dispatcher.wait_until_dispatched()
        monkeypatch.setattr(store.commitlog.files, "flush", eio)
        eventually_sync(lambda: store.failure is not None, what="the flush failure recorded")
        failure = store.failure
        assert failure is not None
        assert failure.service == "flush-commitlog"
        assert isinstance(failure.error, OSError) and failure.error.errno == errno.EIO
        assert not store.healthy
        assert_refused_naming(store, "flush-commitlog", "EIO")
        assert_reads_work(store, [b"before"])
    # The failed flush vouched for nothing more: the restart recovers as after a crash.
    assert config.abort_path.exists()
    with MessageStore(config) as store:
        assert store.healthy
        assert_reads_work(store, [b"before"])


def test_an_fsync_error_in_group_commit_fails_the_waiting_send_then_refuses(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    with MessageStore(config) as store:
        assert store.put_message(Message(TOPIC, b"before")).ok
        store.dispatcher.wait_until_dispatched()
        monkeypatch.setattr(store.commitlog.files, "flush", eio)
        waited = store.put_message(Message(TOPIC, b"unflushed"))
        # Written but never made durable: the sender is told, not acknowledged.
        assert waited.status is PutStatus.FLUSH_DISK_TIMEOUT
        assert "fsync failed" in waited.detail
        failure = store.failure
        assert failure is not None and failure.service == "group-commit"
        assert_refused_naming(store, "group-commit", "EIO")
        monkeypatch.undo()  # the disk is back: a retried fsync still must not count
        assert store.put_message(Message(TOPIC, b"later")).status is PutStatus.SERVICE_NOT_AVAILABLE
        store.dispatcher.wait_until_dispatched()
        assert_reads_work(store, [b"before", b"unflushed"])


def test_emfile_in_the_dispatcher_thread_refuses_sends_and_keeps_reads(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    with MessageStore(make_config()) as store:
        assert store.put_message(Message(TOPIC, b"before")).ok
        assert store.dispatcher.wait_until_dispatched()
        # What the thread calls on every pass.
        monkeypatch.setattr(store.dispatcher, "dispatch_available", emfile)
        store.dispatcher.wakeup()
        eventually_sync(lambda: store.failure is not None, what="the dispatcher failure recorded")
        failure = store.failure
        assert failure is not None and failure.service == "reput-message-service"
        assert isinstance(failure.error, OSError) and failure.error.errno == errno.EMFILE
        assert store.dispatcher.stalled_reason is not None
        assert_refused_naming(store, "reput-message-service", "EMFILE")
        assert_reads_work(store, [b"before"])


def test_emfile_opening_a_consume_queue_stops_dispatch_on_the_writers_path_too(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config()
    with MessageStore(config) as store:
        assert store.put_message(Message(TOPIC, b"before")).ok
        assert store.dispatcher.wait_until_dispatched()
        # A new queue needs a new file; the writer may dispatch its own append.
        monkeypatch.setattr(store.consume_queues, "find_or_create", emfile)
        written = store.put_message(Message("Fresh", b"never dispatched"))
        assert written.ok  # it is in the CommitLog: the restart dispatches it
        eventually_sync(lambda: store.failure is not None, what="the dispatcher failure recorded")
        assert not store.dispatcher.wait_until_dispatched(timeout_s=0.1)
        assert_refused_naming(store, "reput-message-service", "EMFILE")
        assert_reads_work(store, [b"before"])
        monkeypatch.undo()
    with MessageStore(config) as store:
        assert store.healthy
        assert store.get_max_offset_in_queue("Fresh", 0) == 1
        assert_reads_work(store, [b"before"])


def test_the_channel_keeps_each_services_first_failure_and_tells_listeners() -> None:
    channel = FailureChannel(lambda: 7)
    told: list[StoreFailure] = []
    channel.subscribe(told.append)
    first = channel.record("flush-commitlog", OSError(errno.EIO, "EIO"))
    assert channel.record("flush-commitlog", OSError(errno.ENOSPC, "later")) is first
    second = channel.record("reput-message-service", OSError(errno.EMFILE, "EMFILE"))
    assert channel.first is first and first.at_ms == 7
    assert channel.failures == [first, second]
    assert told == [first, second]
    assert first.describe() == "flush-commitlog failed: OSError: [Errno 5] EIO"
    late: list[StoreFailure] = []
    channel.subscribe(late.append)  # subscribing after a failure hears of it at once
    assert late == [first]
