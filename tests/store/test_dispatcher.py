"""The dispatcher (ReputMessageService): visibility, idempotence, transactions, listeners.

Most tests stop the dispatcher thread right after the store starts and drive
``dispatch_available`` by hand, so what is dispatched when is deterministic.
The store's shutdown drains whatever is left.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest

from basalt.common.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from basalt.store import ManualClock, Message, MessageStore
from basalt.store.commitlog import HANDOFF_MAX_APPENDS
from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.consume_queue import UNIT
from basalt.store.dispatcher import DispatchRequest
from basalt.store.hashing import tags_code
from basalt.store.mapped_file import MappedFile
from basalt.store.mapped_file_queue import MappedFileQueue
from tests.support.stores import SMALL_COMMITLOG_FILE, SMALL_CQ_FILE, ConfigFactory


def pause_dispatcher(store: MessageStore) -> None:
    """Stop the dispatcher thread; dispatching then happens only when a test asks."""
    store.dispatcher.shutdown(drain=False)


def dispatch_all(store: MessageStore) -> int:
    """Run the dispatcher to the CommitLog's end by hand; returns how many steps it took."""
    steps = 0
    while store.dispatcher.dispatch_available():
        steps += 1
    assert store.dispatcher.stalled_reason is None
    assert store.dispatcher.reput_from_offset == store.max_physical_offset
    return steps


def consume_queue_bytes(store: MessageStore) -> dict[Path, bytes]:
    """Every ConsumeQueue file's content, by path relative to ``consumequeue/``."""
    directory = store.config.consume_queue_dir
    return {p.relative_to(directory): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_a_message_is_invisible_until_dispatched(store: MessageStore) -> None:
    pause_dispatcher(store)

    result = store.put_message(Message("Hidden", b"payload", queue_id=1, tags="t"))

    assert result.ok
    assert store.get_max_offset_in_queue("Hidden", 1) == 0
    assert store.get_message_by_queue_offset("Hidden", 1, 0) is None
    assert list(store.iter_queue("Hidden", 1)) == []
    assert store.dispatch_behind_bytes == result.sizes[0]
    # The CommitLog has it all the same.
    assert store.lookup_message_by_offset(result.physical_offsets[0]) is not None

    assert store.dispatcher.dispatch_available() == 1

    assert store.get_max_offset_in_queue("Hidden", 1) == 1
    assert store.dispatch_behind_bytes == 0
    record = store.get_message_by_queue_offset("Hidden", 1, 0)
    assert record is not None
    assert (record.body, record.commit_log_offset) == (b"payload", result.physical_offsets[0])


def test_running_dispatcher_makes_sends_visible(store: MessageStore) -> None:
    results = [store.put_message(Message("Live", f"{i}".encode())) for i in range(50)]

    assert store.wait_dispatched(timeout_s=30)

    assert store.get_max_offset_in_queue("Live", 0) == 50
    readable = [(offset, r.commit_log_offset) for offset, r in store.iter_queue("Live", 0)]
    assert readable == [(i, r.physical_offsets[0]) for i, r in enumerate(results)]


def _write_mixed(store: MessageStore, count: int) -> None:
    """Records for three queues, spanning several CommitLog and ConsumeQueue files."""
    body = b"m" * 900
    for i in range(count):
        topic, queue_id = [("Dup", 0), ("Dup", 1), ("Other", 0)][i % 3]
        assert store.put_message(Message(topic, body, queue_id=queue_id, tags=f"t{i % 5}")).ok


@pytest.mark.parametrize("rewind_to", ["commitlog min", "middle record"])
def test_duplicate_dispatch_is_harmless(store: MessageStore, rewind_to: str) -> None:
    pause_dispatcher(store)
    _write_mixed(store, 300)
    assert store.max_physical_offset > 3 * SMALL_COMMITLOG_FILE
    dispatch_all(store)
    before = consume_queue_bytes(store)
    assert len(before) > 3  # the queues rolled ConsumeQueue files too
    written = store.dispatcher.entries_written
    assert written == 300
    maxima = {key: store.get_max_offset_in_queue(*key) for key in [("Dup", 0), ("Dup", 1)]}

    if rewind_to == "commitlog min":
        store.dispatcher.reput_from_offset = store.min_physical_offset
    else:
        middle = store.get_message_by_queue_offset("Dup", 1, 40)
        assert middle is not None
        store.dispatcher.reput_from_offset = middle.commit_log_offset
    dispatch_all(store)

    assert store.dispatcher.entries_written == written
    assert consume_queue_bytes(store) == before
    assert {key: store.get_max_offset_in_queue(*key) for key in maxima} == maxima
    # A new message still lands at the next queue offset.
    result = store.put_message(Message("Dup", b"new", queue_id=0))
    dispatch_all(store)
    assert store.get_max_offset_in_queue("Dup", 0) == maxima["Dup", 0] + 1
    assert result.queue_offsets == (maxima["Dup", 0],)


def test_prepared_and_rolled_back_records_are_never_in_a_consume_queue(
    store: MessageStore,
) -> None:
    pause_dispatcher(store)
    flags = [
        0,
        TRANSACTION_PREPARED_TYPE,
        TRANSACTION_COMMIT_TYPE,
        TRANSACTION_ROLLBACK_TYPE,
        TRANSACTION_PREPARED_TYPE,
        0,
    ]
    results = [
        store.put_message(Message("Tx", f"flag-{flag}-{i}".encode(), sys_flag=flag))
        for i, flag in enumerate(flags)
    ]
    assert all(r.ok for r in results)
    # Prepared and rolled-back records take no queue offset.
    assert [r.queue_offsets[0] for r in results] == [0, 0, 1, 0, 0, 2]

    dispatch_all(store)

    assert store.get_max_offset_in_queue("Tx", 0) == 3
    indexed = [r.commit_log_offset for _, r in store.iter_queue("Tx", 0)]
    dispatchable = [0, 2, 5]
    assert indexed == [results[i].physical_offsets[0] for i in dispatchable]
    everywhere = {phy for queue in store.consume_queues for _, phy, _, _ in queue.iter_units()}
    never_indexed = {results[i].physical_offsets[0] for i in (1, 3, 4)}
    assert not everywhere & never_indexed
    # The prepared record is still in the CommitLog, readable by physical offset.
    prepared = store.lookup_message_by_offset(results[1].physical_offsets[0])
    assert prepared is not None
    assert prepared.sys_flag & 0xC == TRANSACTION_PREPARED_TYPE

    assert store.put_message(Message("Tx", b"next")).queue_offsets == (3,)


def test_tags_code_in_the_consume_queue_is_the_java_hash_of_the_tag(store: MessageStore) -> None:
    pause_dispatcher(store)
    tags: list[str | None] = ["hello", "TagA", "ünïcødé", "emoji-\N{ROCKET}", None, ""]
    for tag in tags:
        assert store.put_message(Message("Tags", b"x", tags=tag)).ok
    dispatch_all(store)

    queue = store.get_consume_queue("Tags", 0)
    assert queue is not None
    codes = [code for _, _, _, code in queue.iter_units()]
    assert codes == [tags_code(tag) for tag in tags]
    assert codes[0] == 99162322  # "hello".hashCode() in Java
    assert codes[-2:] == [0, 0]


def test_tags_code_ignores_properties_whose_name_merely_ends_in_tags(
    store: MessageStore,
) -> None:
    pause_dispatcher(store)
    messages = [
        Message("Tags", b"x", properties={"XTAGS": "decoy"}, tags="real"),
        Message("Tags", b"x", properties={"XTAGS": "decoy"}),
        Message("Tags", b"x", properties={"a": "TAGS\x01inside-a-value"}, tags="t"),
    ]
    assert store.put_messages(messages).ok
    dispatch_all(store)

    queue = store.get_consume_queue("Tags", 0)
    assert queue is not None
    codes = [code for _, _, _, code in queue.iter_units()]
    assert codes == [tags_code("real"), 0, tags_code("t")]


def test_consume_queue_units_point_at_their_records(store: MessageStore) -> None:
    pause_dispatcher(store)
    _write_mixed(store, 200)
    dispatch_all(store)

    queue_file = store.config.consume_queue_dir / "Dup" / "1" / f"{0:020d}"
    units = list(UNIT.iter_unpack(queue_file.read_bytes()))
    assert len(units) == SMALL_CQ_FILE // CQ_STORE_UNIT_SIZE
    for queue_offset, (physical, size, code) in enumerate(units):
        record = store.lookup_message_by_offset(physical)
        assert record is not None
        assert (record.topic, record.queue_id, record.queue_offset) == ("Dup", 1, queue_offset)
        assert (record.store_size, code) == (size, tags_code(record.tags))


class RecordingListener:
    """A dispatch listener that keeps every request it is given."""

    def __init__(self) -> None:
        self.requests: list[DispatchRequest] = []
        self.calls = 0

    def on_dispatch(self, requests: Sequence[DispatchRequest]) -> None:
        self.calls += 1
        self.requests.extend(requests)


def test_listeners_receive_dispatch_requests_in_commitlog_order(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    listener = RecordingListener()
    store = MessageStore.open(make_config(), clock=clock, listeners=[listener])
    try:
        pause_dispatcher(store)
        sent = []
        for i in range(120):
            clock.advance(1)
            message = Message(
                f"L{i % 2}",
                b"y" * 1500,
                queue_id=i % 3,
                tags=f"tag{i % 4}",
                keys=[f"key-{i}", f"alt-{i}"],
                properties={"UNIQ_KEY": f"UNIQ{i:04d}"},
                sys_flag=TRANSACTION_PREPARED_TYPE if i % 10 == 9 else 0,
            )
            sent.append((message, store.put_message(message)))
        dispatch_all(store)
    finally:
        store.shutdown()

    assert listener.calls >= 2  # several batches: the records span CommitLog files
    expected = [(m, r) for m, r in sent if m.sys_flag == 0]
    assert len(listener.requests) == len(expected)
    offsets = [req.commit_log_offset for req in listener.requests]
    assert offsets == sorted(offsets)
    for request, (message, result) in zip(listener.requests, expected, strict=True):
        assert request.commit_log_offset == result.physical_offsets[0]
        assert request.msg_size == result.sizes[0]
        assert request.consume_queue_offset == result.queue_offsets[0]
        assert (request.topic, request.queue_id) == (message.topic, message.queue_id)
        assert request.keys == list(message.keys)
        assert request.uniq_key == message.properties["UNIQ_KEY"]
        assert request.tags_code == tags_code(message.tags)
        assert request.store_timestamp_ms == result.store_timestamp_ms
        assert request.sys_flag == 0


def test_dispatch_rolls_to_the_next_file_across_blanks(store: MessageStore) -> None:
    pause_dispatcher(store)
    results = [store.put_message(Message("Roll", b"r" * 7000, tags="r")) for _ in range(40)]
    physical = [r.physical_offsets[0] for r in results]
    files_used = {p // SMALL_COMMITLOG_FILE for p in physical}
    assert len(files_used) >= 4

    dispatch_all(store)

    assert store.get_max_offset_in_queue("Roll", 0) == 40
    indexed = [(offset, r.commit_log_offset) for offset, r in store.iter_queue("Roll", 0)]
    assert indexed == list(enumerate(physical))
    # Every file after the first starts with a record: the blank sent the dispatcher there.
    for index in sorted(files_used)[1:]:
        assert index * SMALL_COMMITLOG_FILE in physical


def test_units_taken_from_the_writers_hand_off_equal_units_rebuilt_from_the_commitlog(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """The dispatcher's two sources - what the writer stamped, and a walk of the
    CommitLog - must build byte-identical ConsumeQueues: rolls, non-ASCII tags,
    no tags, a prepared transaction and batches over several queues included."""
    config = make_config()
    with MessageStore.open(config, clock=clock) as store:
        for i in range(120):
            tags = ("TagA", "标签", "emoji😀", None)[i % 4]
            batch = [
                Message("HandOff", f"{i}-{j}".encode() * 30, queue_id=i % 3, tags=tags)
                for j in range(1 + i % 5)
            ]
            assert store.put_messages(batch).ok
            if i % 17 == 0:
                prepared = Message(
                    "HandOff", b"prepared", queue_id=0, sys_flag=TRANSACTION_PREPARED_TYPE
                )
                assert store.put_message(prepared).ok
        assert store.wait_dispatched()
        assert store.commitlog.files.files[0].file_end_offset < store.max_physical_offset
        assert store.dispatcher.records_from_handoff > 0
        handed_off = consume_queue_bytes(store)
    config.abort_path.touch()  # a restart that must rebuild every unit from the CommitLog
    for path in config.consume_queue_dir.rglob("*"):
        if path.is_file():
            path.unlink()
    with MessageStore.open(config, clock=clock) as store:
        assert store.recovery_report is not None
        assert store.recovery_report.consume_queue_entries_rebuilt > 0
        rebuilt = consume_queue_bytes(store)
    assert rebuilt == handed_off


def test_a_record_larger_than_the_read_window_is_dispatched_from_the_commitlog(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """The walk reads ``reput_batch_size_bytes`` at a time; a bigger record grows the window."""
    with MessageStore.open(make_config(reput_batch_size_bytes=4096), clock=clock) as store:
        pause_dispatcher(store)
        small = store.put_message(Message("Window", b"s" * 100, tags="a"))
        big = store.put_message(Message("Window", b"B" * 20_000, tags="b"))
        after = store.put_message(Message("Window", b"t" * 100, tags="c"))
        store.commitlog.handoff.clear()  # no hand-off: the dispatcher must read the records
        dispatch_all(store)
        assert store.dispatcher.records_from_handoff == 0
        for result, body in ((small, b"s" * 100), (big, b"B" * 20_000), (after, b"t" * 100)):
            record = store.get_message_by_queue_offset("Window", 0, result.queue_offsets[0])
            assert record is not None
            assert record.body == body
        units = list(store.get_consume_queue("Window", 0).iter_units())  # type: ignore[union-attr]
        assert [u[3] for u in units] == [tags_code("a"), tags_code("b"), tags_code("c")]


def test_an_overflowed_hand_off_is_completed_from_the_commitlog(store: MessageStore) -> None:
    """Past HANDOFF_MAX_APPENDS undispatched appends the oldest hand-offs are dropped:
    the dispatcher walks the CommitLog for those and takes the hand-off again after."""
    pause_dispatcher(store)
    sent = HANDOFF_MAX_APPENDS + 300
    for i in range(sent):
        assert store.put_message(Message("Overflow", b"%d" % i, queue_id=i % 2, tags="t")).ok
    assert len(store.commitlog.handoff) == HANDOFF_MAX_APPENDS
    dispatch_all(store)
    assert 0 < store.dispatcher.records_from_handoff < sent
    bodies = [record.body for q in (0, 1) for _, record in store.iter_queue("Overflow", q)]
    assert sorted(bodies) == sorted(b"%d" % i for i in range(sent))
    assert store.get_max_offset_in_queue("Overflow", 0) == (sent + 1) // 2


def test_an_idle_caught_up_dispatcher_lets_the_writer_dispatch_its_own_append(
    store: MessageStore,
) -> None:
    """Steady state: the writer applies its own hand-off, so a send is readable as
    soon as put returns, without waiting for the dispatcher thread's next round."""
    assert store.wait_dispatched()
    for i in range(20):
        result = store.put_message(Message("Inline", b"%d" % i, queue_id=2, tags="t"))
        assert store.get_max_offset_in_queue("Inline", 2) == i + 1
        record = store.get_message_by_queue_offset("Inline", 2, result.queue_offsets[0])
        assert record is not None and record.body == b"%d" % i
    assert store.dispatcher.records_from_handoff >= 20


def test_a_stopped_dispatcher_is_not_bypassed_by_writers(store: MessageStore) -> None:
    pause_dispatcher(store)
    for i in range(5):
        assert store.put_message(Message("Stopped", b"%d" % i)).ok
    assert store.get_max_offset_in_queue("Stopped", 0) == 0
    dispatch_all(store)
    assert store.get_max_offset_in_queue("Stopped", 0) == 5


def test_concurrent_writers_dispatching_their_own_appends_build_the_rebuilt_queues(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """Writer threads race each other and the dispatcher thread for the dispatch
    lock (rolls included): the ConsumeQueues must still equal a rebuild from the
    CommitLog, every queue offset exactly once."""
    config = make_config()
    per_thread = 150

    def write(slot: int) -> None:
        for i in range(per_thread):
            batch = [
                Message("Race", b"%d-%d-%d" % (slot, i, j) * 40, queue_id=(slot + i) % 3, tags="r")
                for j in range(1 + i % 3)
            ]
            assert store.put_messages(batch).ok

    with MessageStore.open(config, clock=clock) as store:
        threads = [threading.Thread(target=write, args=(slot,)) for slot in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert store.wait_dispatched()
        assert store.commitlog.files.files[0].file_end_offset < store.max_physical_offset
        live = consume_queue_bytes(store)
        bodies = sorted(r.body for q in range(3) for _, r in store.iter_queue("Race", q))
    assert bodies == sorted(
        b"%d-%d-%d" % (slot, i, j) * 40
        for slot in range(4)
        for i in range(per_thread)
        for j in range(1 + i % 3)
    )
    config.abort_path.touch()
    for path in config.consume_queue_dir.rglob("*"):
        if path.is_file():
            path.unlink()
    with MessageStore.open(config, clock=clock) as store:
        rebuilt = consume_queue_bytes(store)
    assert rebuilt == live


def test_arrival_listeners_hear_every_queue_that_grew_once_it_is_readable(
    store: MessageStore,
) -> None:
    """Long polling's hook: on the writer's inline path and on the thread's walk."""
    heard: list[tuple[str, int, int, int]] = []

    def arrived(topic: str, queue_id: int, max_offset: int) -> None:
        # The new units must already be readable when the listener runs.
        heard.append((topic, queue_id, max_offset, store.get_max_offset_in_queue(topic, queue_id)))

    store.add_arrival_listener(arrived)
    assert store.wait_dispatched()
    assert store.put_messages([Message("Arrive", b"a", queue_id=1)] * 3).ok
    assert store.put_message(Message("Arrive", b"b", queue_id=2)).ok
    assert store.wait_dispatched()
    pause_dispatcher(store)
    assert store.put_message(Message("Arrive", b"c", queue_id=1)).ok
    store.commitlog.handoff.clear()  # the walk path
    dispatch_all(store)
    assert heard == [("Arrive", 1, 3, 3), ("Arrive", 2, 1, 1), ("Arrive", 1, 4, 4)]


def test_a_send_on_an_event_loop_is_answered_before_its_queues_file_is_made(
    store: MessageStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new queue's first unit (and one that starts the queue's next file) makes
    a file: a mkdir and an open. A writer on an event loop answers first and
    makes the file on the loop after the answers it settled; every unit lands.
    A writer with no loop applies its units at once (read-your-writes)."""
    per_file = SMALL_CQ_FILE // CQ_STORE_UNIT_SIZE
    answered: list[int] = []
    made: list[tuple[str, int]] = []  # (thread, sends answered by then)
    create = MappedFileQueue._create

    def recording(self: MappedFileQueue, offset: int, *, first: bool) -> MappedFile:
        if self.directory.is_relative_to(store.config.consume_queue_dir):
            made.append((threading.current_thread().name, len(answered)))
        return create(self, offset, first=first)

    monkeypatch.setattr(MappedFileQueue, "_create", recording)

    async def scenario() -> None:
        assert store.wait_dispatched()
        # The first file, then the last send starts the queue's second file.
        for i in range(per_file + 1):
            assert (await store.put_messages_async([Message("Fresh", b"%d" % i, queue_id=1)])).ok
            answered.append(i)
            await asyncio.sleep(0)

    asyncio.run(scenario())
    assert store.wait_dispatched()
    assert len(made) == 2
    loop_thread = threading.current_thread().name
    for index, (thread, sends) in enumerate(made):
        # Made on the loop (the writer's thread) only once the send that needed it
        # was answered; the dispatcher's own thread may take one over (no order then).
        if thread == loop_thread:
            assert sends == (1 if index == 0 else per_file + 1)
    bodies = [record.body for _, record in store.iter_queue("Fresh", 1)]
    assert bodies == [b"%d" % i for i in range(per_file + 1)]
    assert store.put_message(Message("FreshSync", b"s", queue_id=0)).ok
    assert store.get_max_offset_in_queue("FreshSync", 0) == 1
