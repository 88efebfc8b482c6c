"""Send coalescing: the async sends of one event loop turn share one append.

Sends made during one turn of an asyncio loop are appended as one batch and,
under SYNC flush, acknowledged after one fsync (:mod:`basalt.store.coalesce`); each
send still gets its own result. These tests check that every send's result
describes exactly its own records (read back by physical and by queue
offset), that a refused send is answered alone, and that a group larger than
a CommitLog file is split without losing anything.

The number of appends is observed with ``commitlog.on_append``, the hook the
dispatcher itself is woken by.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
import threading
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence

import pytest
import uvloop

from basalt.common.record import BLANK_MAGIC_CODE, EncodedMessage
from basalt.store import (
    FlushDiskType,
    ManualClock,
    Message,
    MessageStore,
    PutMessageResult,
    PutStatus,
)
from basalt.store.batch import EncodedBatch
from basalt.store.checkpoint import CHECKPOINT_FILE_SIZE
from basalt.store.config import MessageStoreConfig
from tests.support.stores import SMALL_COMMITLOG_FILE, ConfigFactory, run_threads

BLANK = struct.Struct(">iI")  # an end-of-file blank: its size, then BLANK_MAGIC_CODE

Send = tuple[list[Message], PutMessageResult]


# -- helpers ----------------------------------------------------------------------------


def count_appends(store: MessageStore) -> Callable[[], int]:
    """Start counting CommitLog appends; returns a reader of the count so far."""
    appends = [0]

    def on_append() -> None:
        appends[0] += 1

    store.commitlog.on_append(on_append)
    return lambda: appends[0]


def encode(store: MessageStore, messages: Sequence[Message]) -> bytes:
    """Records as a producer encodes them (the benchmark's SendBatch payload)."""
    host = store.commitlog.store_host
    batch = EncodedBatch.of_messages([EncodedMessage(m, store_host=host) for m in messages])
    return bytes(batch.data)


def raw_batch(store: MessageStore, messages: Sequence[Message]) -> EncodedBatch:
    """A producer-encoded batch of one (topic, queue id), as received from the wire."""
    return EncodedBatch.of_records(messages[0].topic, messages[0].queue_id, encode(store, messages))


def gather(*sends: Awaitable[PutMessageResult]) -> list[PutMessageResult]:
    """Run ``sends`` concurrently on a fresh event loop: they are made in one turn."""

    async def main() -> list[PutMessageResult]:
        return list(await asyncio.gather(*sends))

    return asyncio.run(main())


def end_of(result: PutMessageResult) -> int:
    return result.physical_offsets[-1] + result.sizes[-1]


def expect_own(store: MessageStore, messages: Sequence[Message], result: PutMessageResult) -> None:
    """``result`` is PUT_OK and describes exactly ``messages``: consecutive records,
    each readable by its physical offset and through its ConsumeQueue."""
    assert result.status is PutStatus.PUT_OK, result.detail
    n = len(messages)
    assert len(result.physical_offsets) == len(result.queue_offsets) == len(result.sizes) == n
    phys, qoffs, sizes = result.physical_offsets, result.queue_offsets, result.sizes
    for i in range(n - 1):
        assert phys[i + 1] == phys[i] + sizes[i], "records of one send are not consecutive"
    for m, p, q, size in zip(messages, phys, qoffs, sizes, strict=True):
        record = store.lookup_message_by_offset(p)
        assert record is not None, p
        assert (record.topic, record.queue_id, record.body) == (m.topic, m.queue_id, m.body)
        assert (record.commit_log_offset, record.queue_offset, record.store_size) == (p, q, size)
        by_queue = store.get_message_by_queue_offset(m.topic, m.queue_id, q)
        assert by_queue is not None, (m.topic, m.queue_id, q)
        assert (by_queue.commit_log_offset, by_queue.body) == (p, m.body)


def expect_dense_queues(store: MessageStore, sends: Sequence[Send]) -> None:
    """Queue offsets of every (topic, queue) are 0..n-1: no gap, no duplicate."""
    per_queue: dict[tuple[str, int], list[int]] = defaultdict(list)
    for messages, result in sends:
        for m, q in zip(messages, result.queue_offsets, strict=True):
            per_queue[m.topic, m.queue_id].append(q)
    for (topic, queue_id), offsets in per_queue.items():
        assert sorted(offsets) == list(range(len(offsets))), (topic, queue_id)
        assert store.get_max_offset_in_queue(topic, queue_id) == len(offsets)


def expect_all_own(store: MessageStore, sends: Sequence[Send]) -> None:
    """Once dispatched: every send is its own records, queues dense, no record shared."""
    assert store.wait_dispatched()
    for messages, result in sends:
        expect_own(store, messages, result)
    expect_dense_queues(store, sends)
    physical = [p for _, r in sends for p in r.physical_offsets]
    assert len(set(physical)) == len(physical)


def mixed_sends(tag: str) -> list[list[Message]]:
    """50 single-message sends over two topics and four queues, and four multi-message
    sends: one queue, two queues, two topics, and one that comes back to a queue."""
    sends = [
        [Message(f"Co{tag}{i % 2}", f"{tag}-single-{i}".encode() * (1 + i % 7), i % 4)]
        for i in range(50)
    ]
    sends.insert(10, [Message(f"Co{tag}0", f"{tag}-m1-{j}".encode(), 1) for j in range(5)])
    sends.insert(
        25, [Message(f"Co{tag}1", f"{tag}-m2-{j}".encode(), j % 2, tags="t") for j in range(6)]
    )
    sends.insert(
        40, [Message(f"Co{tag}{j % 2}", f"{tag}-m3-{j}".encode(), 3, keys=["k"]) for j in range(4)]
    )
    sends.append(
        [Message(f"Co{tag}0", f"{tag}-m4-{j}".encode(), q) for j, q in enumerate((2, 0, 2))]
    )
    return sends


def read_checkpoint(config: MessageStoreConfig) -> int:
    """The physicMsgTimestamp of the checkpoint file on disk."""
    data = config.checkpoint_path.read_bytes()
    assert len(data) == CHECKPOINT_FILE_SIZE
    return int(struct.unpack_from(">q", data)[0])


# -- results of a group -----------------------------------------------------------------


@pytest.mark.parametrize("flush", list(FlushDiskType))
def test_each_send_of_a_group_gets_its_own_records(
    make_config: ConfigFactory, clock: ManualClock, flush: FlushDiskType
) -> None:
    """54 concurrent sends: one append, and every result is that send's records alone."""
    with MessageStore(make_config(flush_disk_type=flush), clock=clock) as store:
        appends = count_appends(store)
        batches = mixed_sends("G")

        results = gather(*(store.put_messages_async(b) for b in batches))

        assert appends() == 1, "sends of one loop turn were not appended together"
        assert all(r.status is PutStatus.PUT_OK for r in results), [r.detail for r in results]
        # Appended in the order sent: the group is one stretch of the log.
        assert [r.physical_offsets[0] for r in results] == sorted(
            r.physical_offsets[0] for r in results
        )
        assert store.max_physical_offset == sum(sum(r.sizes) for r in results)
        if flush is FlushDiskType.SYNC_FLUSH:
            assert store.commitlog.files.flushed_where >= max(end_of(r) for r in results)
        expect_all_own(store, list(zip(batches, results, strict=True)))


@pytest.mark.parametrize("flush", list(FlushDiskType))
def test_sends_answered_by_callback_share_the_group_of_awaited_ones(
    make_config: ConfigFactory, clock: ManualClock, flush: FlushDiskType
) -> None:
    """put_batch_then: a refusal is answered before it returns; a queued send in the
    same append as the awaited ones, answered by the drain (after fsync under SYNC)."""
    with MessageStore(make_config(flush_disk_type=flush), clock=clock) as store:
        appends = count_appends(store)

        async def scenario() -> tuple[PutMessageResult, list[PutMessageResult]]:
            settled: list[PutMessageResult] = []
            store.put_batch_then(EncodedBatch(bytearray(), []), settled.append)
            assert [r.status for r in settled] == [PutStatus.MESSAGE_ILLEGAL]
            awaited = asyncio.ensure_future(store.put_messages_async([Message("Cb", b"a", 1)]))
            await asyncio.sleep(0)  # the awaited send is queued first
            batch = store.encode_messages([Message("Cb", b"b", 1), Message("Cb", b"c", 1)])
            assert isinstance(batch, EncodedBatch)
            store.put_batch_then(batch, settled.append)
            assert len(settled) == 1, "answered before it was written"
            return await awaited, settled

        first, settled = asyncio.run(scenario())

        assert appends() == 1
        assert settled[1].status is PutStatus.PUT_OK, settled[1].detail
        assert settled[1].queue_offsets == (first.queue_offsets[0] + 1, first.queue_offsets[0] + 2)
        if flush is FlushDiskType.SYNC_FLUSH:
            assert store.commitlog.files.flushed_where >= end_of(settled[1])
        expect_all_own(
            store,
            [
                ([Message("Cb", b"a", 1)], first),
                ([Message("Cb", b"b", 1), Message("Cb", b"c", 1)], settled[1]),
            ],
        )


@pytest.mark.parametrize("flush", list(FlushDiskType))
def test_a_lone_send_on_an_idle_loop_is_written_before_it_returns(
    make_config: ConfigFactory, clock: ManualClock, flush: FlushDiskType
) -> None:
    """put_batch_then(alone=True) with nothing else ready on the loop: appended
    before it returns (ASYNC: answered too; SYNC: answered once fsynced), and
    the next lone send is its own append after it."""
    with MessageStore(make_config(flush_disk_type=flush), clock=clock) as store:
        appends = count_appends(store)

        async def scenario() -> list[PutMessageResult]:
            settled: list[PutMessageResult] = []
            for body in (b"a", b"b"):
                # Idle: what the last append left on the loop (the dispatcher applies a
                # run that creates a ConsumeQueue file in a later turn) has run.
                await asyncio.sleep(0.01)
                batch = store.encode_messages([Message("Lone", body, 0)])
                assert isinstance(batch, EncodedBatch)
                before = appends()
                store.put_batch_then(batch, settled.append, alone=True)
                assert appends() == before + 1, "not written before it returned"
                if flush is FlushDiskType.ASYNC_FLUSH:
                    assert len(settled) == before + 1, "not answered before it returned"
                else:
                    assert len(settled) == before, "answered before its fsync"
                    while len(settled) == before:
                        await asyncio.sleep(0.001)
                    assert store.commitlog.files.flushed_where >= end_of(settled[-1])
            return settled

        settled = asyncio.run(scenario())

        assert [r.queue_offsets for r in settled] == [(0,), (1,)]
        expect_all_own(
            store,
            [([Message("Lone", b"a", 0)], settled[0]), ([Message("Lone", b"b", 0)], settled[1])],
        )


def test_a_lone_send_on_a_busy_loop_keeps_the_turns_group(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """put_batch_then(alone=True) while another callback is ready in the turn, or
    another send is queued: left to the drain, and grouped with the sends that
    callback makes (one append for all)."""
    with MessageStore(make_config(), clock=clock) as store:
        appends = count_appends(store)

        def batch_of(body: bytes) -> EncodedBatch:
            batch = store.encode_messages([Message("Busy", body, 0)])
            assert isinstance(batch, EncodedBatch)
            return batch

        async def scenario() -> list[PutMessageResult]:
            settled: list[PutMessageResult] = []
            loop = asyncio.get_running_loop()
            # Another handle ready in this turn: a send it makes joins the group.
            loop.call_soon(lambda: store.put_batch_then(batch_of(b"c"), settled.append))
            store.put_batch_then(batch_of(b"a"), settled.append, alone=True)
            # A send already queued: a lone one joins it, whatever the loop.
            store.put_batch_then(batch_of(b"b"), settled.append, alone=True)
            assert not settled and appends() == 0, "written before the turn's drain"
            while len(settled) < 3:
                await asyncio.sleep(0)
            return settled

        settled = asyncio.run(scenario())

        assert appends() == 1
        assert [r.queue_offsets for r in settled] == [(0,), (1,), (2,)]
        expect_all_own(
            store,
            [
                ([Message("Busy", b, 0)], r)
                for b, r in zip((b"a", b"b", b"c"), settled, strict=True)
            ],
        )


@pytest.mark.parametrize("sole", [True, False])
def test_a_lone_send_on_a_loop_that_hides_its_queue_is_written_at_once_when_sole(
    make_config: ConfigFactory, clock: ManualClock, sole: bool
) -> None:
    """On uvloop, whose ready queue cannot be read: a lone send (alone=True) is
    written before put_batch_then returns when its caller is the sole sender
    (sole=True), and left to the turn's drain otherwise."""
    with MessageStore(make_config(), clock=clock) as store:
        appends = count_appends(store)

        async def scenario() -> tuple[int, list[PutMessageResult]]:
            settled: list[PutMessageResult] = []
            await asyncio.sleep(0.01)  # idle (see the lone send's test above)
            batch = store.encode_messages([Message("Uv", b"a", 0)])
            assert isinstance(batch, EncodedBatch)
            store.put_batch_then(batch, settled.append, alone=True, sole=sole)
            at_once = appends()
            while not settled:
                await asyncio.sleep(0)
            return at_once, settled

        at_once, settled = uvloop.run(scenario())

        assert at_once == (1 if sole else 0)
        assert appends() == 1
        expect_all_own(store, [([Message("Uv", b"a", 0)], settled[0])])


def test_consecutive_groups_continue_the_queues(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """Groups of later turns (and a plain put in between) take the next queue offsets."""
    with MessageStore(make_config(), clock=clock) as store:
        appends = count_appends(store)
        sends: list[Send] = []
        for turn in range(3):
            batches = [[Message("CoTurns", f"{turn}-{i}".encode(), i % 3)] for i in range(12)]
            results = gather(*(store.put_messages_async(b) for b in batches))
            sends += zip(batches, results, strict=True)
            between = [Message("CoTurns", f"sync-{turn}".encode(), turn)]
            sends.append((between, store.put_messages(between)))

        assert appends() == 6
        expect_all_own(store, sends)
        for queue_id in range(3):
            expected: list[bytes] = []
            for turn in range(3):
                expected += [f"{turn}-{i}".encode() for i in range(queue_id, 12, 3)]
                if turn == queue_id:
                    expected.append(f"sync-{turn}".encode())
            assert [r.body for _, r in store.iter_queue("CoTurns", queue_id)] == expected


def test_event_loops_on_several_threads_share_the_store(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """One loop per thread, each coalescing its own sends, under SYNC group commit."""
    config = make_config(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    with MessageStore(config, clock=clock) as store:
        threads, rounds, per_round = 4, 5, 10
        start = threading.Barrier(threads)
        outcomes: dict[int, list[Send]] = {}

        def sender(queue_id: int) -> None:
            start.wait()
            mine = outcomes.setdefault(queue_id, [])
            for r in range(rounds):
                batches = [
                    [Message("CoThreads", f"{queue_id}:{r}:{i}".encode(), queue_id)]
                    for i in range(per_round)
                ]
                results = gather(*(store.put_messages_async(b) for b in batches))
                for result in results:
                    assert store.commitlog.files.flushed_where >= end_of(result)
                mine += zip(batches, results, strict=True)

        run_threads(sender, threads, timeout_s=60)

        expect_all_own(store, [s for sends in outcomes.values() for s in sends])
        for queue_id in range(threads):
            bodies = [r.body for _, r in store.iter_queue("CoThreads", queue_id)]
            assert bodies == [
                f"{queue_id}:{r}:{i}".encode() for r in range(rounds) for i in range(per_round)
            ]


# -- refused sends ----------------------------------------------------------------------


def test_a_refused_send_is_answered_alone(make_config: ConfigFactory, clock: ManualClock) -> None:
    """Bad topic, queue id or size: that send is MESSAGE_ILLEGAL, the rest of the turn is not."""
    with MessageStore(make_config(max_message_size=1024), clock=clock) as store:
        good = [[Message("CoRefuse", f"good-{i}".encode(), i % 2)] for i in range(8)]
        good.append([Message("CoRefuse", f"good-multi-{j}".encode(), 1) for j in range(3)])
        good_raw = [Message("CoRefuse", f"good-raw-{j}".encode(), 0) for j in range(3)]
        too_big_for_a_file = [
            Message("CoRefuse", b"f" * 1000, 0) for _ in range(SMALL_COMMITLOG_FILE // 1000)
        ]
        bad: list[tuple[Awaitable[PutMessageResult], str]] = [
            (store.put_messages_async([Message("bad topic", b"x")]), "topic 'bad topic'"),
            (store.put_messages_async([Message("CoRefuse", b"x", -1)]), "queue id -1 is out"),
            (
                store.put_messages_async([Message("CoRefuse", b"x", 0x8000_0000)]),
                "queue id 2147483648 is out",
            ),
            (
                store.put_messages_async([Message("CoRefuse", b"o" * 1025)]),
                "body of 1025 bytes exceeds max_message_size 1024",
            ),
            (
                # One bad message refuses its whole send, never part of it.
                store.put_messages_async(
                    [Message("CoRefuse", b"ok", 1), Message("CoRefuse", b"x", -2)]
                ),
                "queue id -2 is out",
            ),
            (store.put_messages_async([]), "empty batch"),
            (
                store.put_batch_async(
                    EncodedBatch.of_records("bad topic", 0, encode(store, [Message("CoRefuse")]))
                ),
                "topic 'bad topic'",
            ),
            (
                store.put_batch_async(
                    EncodedBatch.of_records("CoRefuse", -1, encode(store, [Message("CoRefuse")]))
                ),
                "queue id -1 is out",
            ),
            (
                store.put_batch_async(raw_batch(store, too_big_for_a_file)),
                "does not fit a commitlog file",
            ),
        ]
        appends = count_appends(store)
        sends: list[Awaitable[PutMessageResult]] = []
        for i, batch in enumerate(good):
            sends.append(store.put_messages_async(batch))
            if i < len(bad):
                sends.append(bad[i][0])
        sends.append(store.put_batch_async(raw_batch(store, good_raw)))

        results = gather(*sends)

        assert appends() == 1
        refused = [r for r in results if r.status is not PutStatus.PUT_OK]
        assert [r.status for r in refused] == [PutStatus.MESSAGE_ILLEGAL] * len(bad)
        for result, (_, why) in zip(refused, bad, strict=True):
            assert why in result.detail
            assert result.physical_offsets == result.queue_offsets == result.sizes == ()
        accepted = [r for r in results if r.status is PutStatus.PUT_OK]
        good.append(good_raw)
        assert store.max_physical_offset == sum(sum(r.sizes) for r in accepted)
        expect_all_own(store, list(zip(good, accepted, strict=True)))


# -- producer-encoded batches -----------------------------------------------------------


@pytest.mark.parametrize("flush", list(FlushDiskType))
def test_producer_encoded_batches_in_one_group(
    make_config: ConfigFactory, clock: ManualClock, flush: FlushDiskType
) -> None:
    """Concurrent SendBatch payloads (and plain sends between them) get their own offsets."""
    with MessageStore(make_config(flush_disk_type=flush), clock=clock) as store:
        batches = [
            [
                Message(f"CoRaw{b % 2}", f"raw-{b}-{j}".encode() * (1 + j), b % 3, tags=f"t{b}")
                for j in range(1 + b % 5)
            ]
            for b in range(12)
        ]
        singles = [[Message("CoRaw0", f"single-{i}".encode(), i % 3)] for i in range(6)]
        appends = count_appends(store)

        results = gather(
            *(store.put_batch_async(raw_batch(store, b)) for b in batches),
            *(store.put_messages_async(s) for s in singles),
        )

        assert appends() == 1
        if flush is FlushDiskType.SYNC_FLUSH:
            assert store.commitlog.files.flushed_where >= max(end_of(r) for r in results)
        expect_all_own(store, list(zip(batches + singles, results, strict=True)))


#: A malformed producer batch, and what its refusal must say: the record named is
#: counted in the sender's own batch, not in the group it was appended with.
MALFORMED: dict[str, tuple[Callable[[MessageStore], EncodedBatch], str]] = {
    "truncated": (
        lambda store: EncodedBatch.of_records(
            "CoMal", 0, encode(store, [Message("CoMal", b"m" * 100, 0) for _ in range(3)])[:-7]
        ),
        "record 2 (byte ",
    ),
    "garbage": (
        lambda store: EncodedBatch.of_records("CoMal", 0, b"\x00\x00\x00\x40" * 64),
        "record 0 (byte 0 of the batch)",
    ),
    "foreign-topic": (
        lambda store: EncodedBatch.of_records(
            "CoMal", 0, encode(store, [Message("CoMal", b"m", 0), Message("CoOther", b"m", 0)])
        ),
        "record 1 (byte ",
    ),
    "foreign-queue": (
        lambda store: EncodedBatch.of_records(
            "CoMal", 0, encode(store, [Message("CoMal", b"m", 0), Message("CoMal", b"m", 1)])
        ),
        "record 1 (byte ",
    ),
    "body-too-large": (
        lambda store: raw_batch(
            store, [Message("CoMal", b"m", 0), Message("CoMal", b"b" * 2048, 0)]
        ),
        "record 1 (byte ",
    ),
}


@pytest.mark.parametrize("flush", list(FlushDiskType))
@pytest.mark.parametrize("kind", list(MALFORMED))
def test_a_malformed_producer_batch_fails_only_its_own_send(
    make_config: ConfigFactory, clock: ManualClock, kind: str, flush: FlushDiskType
) -> None:
    """The records of a raw batch are validated only on append, i.e. after the group
    is concatenated: a bad one must still be refused alone, writing nothing."""
    config = make_config(flush_disk_type=flush, max_message_size=1024)
    with MessageStore(config, clock=clock) as store:
        before = [[Message("CoMal", f"before-{i}".encode(), i % 2)] for i in range(5)]
        after = [[Message("CoMal", f"after-{i}".encode(), 0) for i in range(3)]]
        after_raw = [Message("CoMal", f"after-raw-{i}".encode(), 1) for i in range(2)]

        results = gather(
            *(store.put_messages_async(b) for b in before),
            store.put_batch_async(MALFORMED[kind][0](store)),
            *(store.put_messages_async(b) for b in after),
            store.put_batch_async(raw_batch(store, after_raw)),
        )

        bad = results[len(before)]
        assert bad.status is PutStatus.MESSAGE_ILLEGAL
        assert "malformed batch" in bad.detail
        assert MALFORMED[kind][1] in bad.detail, bad.detail
        assert bad.physical_offsets == ()
        good = before + after + [after_raw]
        accepted = results[: len(before)] + results[len(before) + 1 :]
        assert [r.status for r in accepted] == [PutStatus.PUT_OK] * len(good), [
            r.detail for r in accepted
        ]
        # Nothing of the bad batch was written, and it took no queue offset.
        assert store.max_physical_offset == sum(sum(r.sizes) for r in accepted)
        expect_all_own(store, list(zip(good, accepted, strict=True)))


# -- durability -------------------------------------------------------------------------


def test_sync_group_is_flushed_before_it_is_acknowledged_and_survives_restart(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config(flush_disk_type=FlushDiskType.SYNC_FLUSH)
    batches = mixed_sends("D")
    raw = [Message("CoDRaw", f"raw-{j}".encode(), 2) for j in range(4)]
    with MessageStore(config, clock=clock) as store:
        clock.advance(1000)
        results = gather(
            *(store.put_messages_async(b) for b in batches),
            store.put_batch_async(raw_batch(store, raw)),
        )
        assert all(r.status is PutStatus.PUT_OK for r in results), [r.detail for r in results]
        end = max(end_of(r) for r in results)
        assert end == store.max_physical_offset
        # Acknowledged only once fsynced, and the checkpoint vouches for the group.
        assert store.commitlog.files.flushed_where >= end
        last_file = store.commitlog.files.find_by_offset(end - 1)
        assert last_file is not None
        assert last_file.file_from_offset + last_file.flushed_position >= end
        stamped = {r.store_timestamp_ms for r in results}
        assert stamped == {clock.now_ms()}
        assert store.checkpoint.physic_msg_timestamp == clock.now_ms()

    assert read_checkpoint(config) == clock.now_ms()
    reopened = MessageStore.open(config, clock=clock)
    try:
        report = reopened.recovery_report
        assert report is not None
        assert not report.abnormal
        assert reopened.max_physical_offset == end
        expect_all_own(reopened, list(zip([*batches, raw], results, strict=True)))
    finally:
        reopened.shutdown()


# -- groups larger than a file ----------------------------------------------------------


@pytest.mark.parametrize("flush", list(FlushDiskType))
def test_a_group_larger_than_a_file_is_split_and_rolls_behind_blanks(
    make_config: ConfigFactory, clock: ManualClock, flush: FlushDiskType
) -> None:
    """~330 KiB sent in one turn to 64 KiB files: several appends, none across a file,
    each file closed by a blank where the next part did not fit."""
    with MessageStore(make_config(flush_disk_type=flush), clock=clock) as store:
        # A head start so the first part does not fit the first file's tail either.
        first = [Message("CoBig", b"head", 0)]
        head = store.put_messages(first)
        appends = count_appends(store)
        batches = [
            [Message("CoBig", f"{i:03d}".encode() * 1000, 0) for _ in range(1 + (i % 5 == 4))]
            for i in range(90)
        ]

        results = gather(*(store.put_messages_async(b) for b in batches))

        size = SMALL_COMMITLOG_FILE
        assert all(r.status is PutStatus.PUT_OK for r in results), [r.detail for r in results]
        files = len(store.commitlog.files.files)
        assert files >= 5
        # Split into parts of about a file each, not sent one by one.
        assert 1 < appends() <= files
        sends = [(first, head), *zip(batches, results, strict=True)]
        expect_all_own(store, sends)
        bodies = [r.body for _, r in store.iter_queue("CoBig", 0)]
        assert bodies == [m.body for batch, _ in sends for m in batch]

        records = sorted(
            (p, s) for _, r in sends for p, s in zip(r.physical_offsets, r.sizes, strict=True)
        )
        assert records[0][0] == 0
        blanks = 0
        for p, s in records:
            assert p // size == (p + s - 1) // size, f"record at {p} crosses a file"
        for (p, s), (next_p, _) in itertools.pairwise(records):
            if next_p == p + s:
                continue
            # A gap only where a file ends: the rest of the file is one blank.
            assert next_p % size == 0 and next_p - (p + s) < size, (p, s, next_p)
            raw = store.commitlog.read(p + s, BLANK.size)
            assert raw is not None
            assert BLANK.unpack(raw) == (next_p - (p + s), BLANK_MAGIC_CODE)
            blanks += 1
        assert blanks == len(store.commitlog.files.files) - 1
        if flush is FlushDiskType.SYNC_FLUSH:
            assert store.commitlog.files.flushed_where >= store.max_physical_offset


# -- after shutdown ---------------------------------------------------------------------


@pytest.mark.parametrize("flush", list(FlushDiskType))
def test_sends_after_shutdown_are_service_not_available(
    make_config: ConfigFactory, clock: ManualClock, flush: FlushDiskType
) -> None:
    store = MessageStore.open(make_config(flush_disk_type=flush), clock=clock)
    ok = store.put_message(Message("CoShut", b"before"))
    assert ok.ok
    store.shutdown()

    results = gather(
        store.put_messages_async([Message("CoShut", b"late")]),
        store.put_batch_async(raw_batch(store, [Message("CoShut", b"late-raw")])),
        store.put_messages_async([Message("CoShut", b"late", 1) for _ in range(3)]),
    )

    assert [r.status for r in results] == [PutStatus.SERVICE_NOT_AVAILABLE] * 3
    assert all(r.physical_offsets == () for r in results)


@pytest.mark.parametrize("flush", list(FlushDiskType))
def test_sends_queued_when_the_store_shuts_down_are_refused(
    make_config: ConfigFactory, clock: ManualClock, flush: FlushDiskType
) -> None:
    """Sends made, then a shutdown in the same turn before the group is appended:
    nothing is written and every send is SERVICE_NOT_AVAILABLE."""
    config = make_config(flush_disk_type=flush)
    store = MessageStore.open(config, clock=clock)

    async def main() -> list[PutMessageResult]:
        sends = asyncio.gather(
            *(store.put_messages_async([Message("CoQueued", f"{i}".encode())]) for i in range(5)),
            store.put_batch_async(raw_batch(store, [Message("CoQueued", b"raw")])),
        )
        await asyncio.sleep(0)  # the sends are made; their group is appended next turn
        assert store.max_physical_offset == 0
        store.shutdown()
        return list(await sends)

    results = asyncio.run(main())

    assert [r.status for r in results] == [PutStatus.SERVICE_NOT_AVAILABLE] * 6
    reopened = MessageStore.open(config, clock=clock)
    try:
        assert reopened.max_physical_offset == 0
        assert reopened.get_max_offset_in_queue("CoQueued", 0) == 0
    finally:
        reopened.shutdown()
