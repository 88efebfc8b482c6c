"""MessageStore behaviour: put statuses and offsets, validation, the root's lock and abort files.

Everything runs on real files under ``tmp_path`` with small CommitLog files
(see :mod:`tests.support.stores`), so batches and single records roll files quickly.
"""

from __future__ import annotations

import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from basalt.common.message import TRANSACTION_PREPARED_TYPE, encode_properties, parse_offset_msg_id
from basalt.common.record import (
    BLANK_MAGIC_CODE,
    CRC32_RESERVED_LEN,
    MAX_PROPERTIES_SIZE,
    MAX_TOPIC_LENGTH,
    EncodedMessage,
    record_size,
)
from basalt.store import (
    ManualClock,
    Message,
    MessageStore,
    MessageStoreConfig,
    PutStatus,
    StoreLockedError,
)
from basalt.store.batch import BatchRun, EncodedBatch
from basalt.store.commitlog import END_FILE_MIN_BLANK_LENGTH
from basalt.store.mapped_file import file_name
from tests.support.processes import REPO_ROOT
from tests.support.stores import SMALL_COMMITLOG_FILE, ConfigFactory
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

STORE_HOST = "127.0.0.1:10911"
#: [int blank length][int BLANK_MAGIC_CODE] closing a CommitLog file.
BLANK_TRAILER = struct.Struct(">iI")

StoreOpener = Callable[..., MessageStore]


@pytest.fixture
def open_store(make_config: ConfigFactory, clock: ManualClock) -> Iterator[StoreOpener]:
    """``open_store(**config_overrides)``: a started store, shut down after the test."""
    opened: list[MessageStore] = []

    def opener(**overrides: Any) -> MessageStore:
        store = MessageStore.open(make_config(**overrides), clock=clock)
        opened.append(store)
        return store

    yield opener
    for store in opened:
        store.shutdown()


def commitlog_file(config: MessageStoreConfig, file_index: int) -> Path:
    return config.commitlog_dir / file_name(file_index * config.mapped_file_size_commit_log)


def body_for_record_size(total_size: int, topic: str) -> bytes:
    """A body that makes a tag-less record exactly ``total_size`` bytes: its one
    property is the CRC32 the store appends (``enabled_append_prop_crc``, on)."""
    return b"z" * (total_size - record_size(0, len(topic.encode()), CRC32_RESERVED_LEN))


# -- successful puts ------------------------------------------------------------------


def test_put_assigns_consecutive_queue_offsets_and_increasing_physical_offsets(
    store: MessageStore,
) -> None:
    routes = [("TopicA", 0), ("TopicA", 1), ("TopicB", 0)]
    next_physical = 0
    for round_no in range(10):
        for topic, queue_id in routes:
            body = f"{topic}-{queue_id}-{round_no}".encode()
            result = store.put_message(Message(topic, body, queue_id=queue_id, tags="T"))

            assert result.status is PutStatus.PUT_OK, result.detail
            assert result.ok
            assert result.queue_offsets == (round_no,)
            (physical,) = result.physical_offsets
            assert physical == next_physical  # records are back to back
            next_physical = physical + result.sizes[0]

            (msg_id,) = result.msg_ids
            assert parse_offset_msg_id(msg_id) == (STORE_HOST, physical)
            record = store.lookup_message_by_offset(physical)
            assert record is not None
            assert record.msg_id == msg_id
            assert (record.topic, record.queue_id, record.queue_offset) == (
                topic,
                queue_id,
                round_no,
            )
            assert record.body == body
            assert record.store_size == result.sizes[0]
            assert record.store_timestamp_ms == result.store_timestamp_ms

    assert store.max_physical_offset == next_physical


def test_put_round_trips_tags_keys_properties_and_header_fields(
    store: MessageStore, clock: ManualClock
) -> None:
    message = Message(
        "RoundTrip",
        "ünïcode body".encode(),
        queue_id=3,
        tags="TagA",
        keys=["order-1", "order-2"],
        properties={"UNIQ_KEY": "ABCDEF", "colour": "blue"},
        flag=7,
        born_timestamp_ms=1234,
        born_host="10.1.2.3:5555",
        reconsume_times=2,
    )
    result = store.put_message(message)
    assert result.ok, result.detail

    record = store.lookup_message_by_offset(result.physical_offsets[0])
    assert record is not None
    assert record.tags == "TagA"
    assert record.keys == ["order-1", "order-2"]
    assert record.uniq_key == "ABCDEF"
    assert record.properties["colour"] == "blue"
    assert (record.flag, record.born_timestamp_ms, record.born_host) == (7, 1234, "10.1.2.3:5555")
    assert record.reconsume_times == 2
    assert record.store_timestamp_ms == clock.now_ms()
    assert record.store_host == STORE_HOST


def test_unset_born_timestamp_is_filled_with_the_store_clock(
    store: MessageStore, clock: ManualClock
) -> None:
    result = store.put_message(Message("Born", b"x"))
    record = store.lookup_message_by_offset(result.physical_offsets[0])
    assert record is not None
    assert record.born_timestamp_ms == clock.now_ms()


def test_put_messages_writes_a_batch_as_consecutive_records(store: MessageStore) -> None:
    store.put_message(Message("Batch", b"first"))
    batch = [Message("Batch", f"m{i}".encode(), tags=f"t{i}") for i in range(5)]

    result = store.put_messages(batch)

    assert result.status is PutStatus.PUT_OK, result.detail
    assert result.queue_offsets == (1, 2, 3, 4, 5)
    assert len(result.physical_offsets) == len(result.sizes) == len(result.msg_ids) == 5
    for i in range(4):
        assert result.physical_offsets[i + 1] == result.physical_offsets[i] + result.sizes[i]
    assert store.max_physical_offset == result.physical_offsets[-1] + result.sizes[-1]
    for i, physical in enumerate(result.physical_offsets):
        record = store.lookup_message_by_offset(physical)
        assert record is not None
        assert (record.body, record.tags) == (f"m{i}".encode(), f"t{i}")
        assert record.store_timestamp_ms == result.store_timestamp_ms

    assert store.put_message(Message("Batch", b"after")).queue_offsets == (6,)


def test_batch_not_fitting_a_file_end_leaves_a_blank_and_goes_whole_to_the_next_file(
    store: MessageStore,
) -> None:
    """RocketMQ's END_OF_FILE for a batch: the whole batch moves, never half of it."""
    body = b"b" * 3000
    tags_property = len(encode_properties({"TAGS": "c0"})) + CRC32_RESERVED_LEN
    record = record_size(len(body), len("Cross"), tags_property)
    # Fill the first file until at most one more record fits in it.
    while SMALL_COMMITLOG_FILE - store.max_physical_offset - END_FILE_MIN_BLANK_LENGTH >= (
        2 * record
    ):
        assert store.put_message(Message("Cross", body, tags="f0")).ok
    end_before = store.max_physical_offset
    next_queue_offset = store.commitlog.topic_queue_table["Cross", 0]
    assert (SMALL_COMMITLOG_FILE - end_before - END_FILE_MIN_BLANK_LENGTH) // record == 1

    result = store.put_messages([Message("Cross", body, tags=f"c{i}") for i in range(4)])

    assert result.ok, result.detail
    assert result.queue_offsets == tuple(range(next_queue_offset, next_queue_offset + 4))
    assert result.sizes == (record,) * 4
    assert list(result.physical_offsets) == [SMALL_COMMITLOG_FILE + i * record for i in range(4)]

    blank_at = end_before
    first_file = commitlog_file(store.config, 0).read_bytes()
    assert BLANK_TRAILER.unpack_from(first_file, blank_at) == (
        SMALL_COMMITLOG_FILE - blank_at,
        BLANK_MAGIC_CODE,
    )

    assert store.wait_dispatched()
    for queue_offset, physical in zip(result.queue_offsets, result.physical_offsets, strict=True):
        stored = store.get_message_by_queue_offset("Cross", 0, queue_offset)
        assert stored is not None
        assert (stored.commit_log_offset, stored.queue_offset) == (physical, queue_offset)


def test_record_exactly_filling_a_file_goes_to_the_next_file(store: MessageStore) -> None:
    largest = SMALL_COMMITLOG_FILE - END_FILE_MIN_BLANK_LENGTH
    assert store.put_message(Message("Big", b"small")).ok

    too_big = store.put_message(Message("Big", body_for_record_size(largest + 1, "Big")))
    assert too_big.status is PutStatus.MESSAGE_ILLEGAL
    assert str(SMALL_COMMITLOG_FILE) in too_big.detail

    result = store.put_message(Message("Big", body_for_record_size(largest, "Big")))
    assert result.ok, result.detail
    assert result.physical_offsets == (SMALL_COMMITLOG_FILE,)
    assert result.sizes == (largest,)
    # The file it fills keeps room for exactly the 8-byte blank: the next record rolls again.
    after = store.put_message(Message("Big", b"after"))
    assert after.physical_offsets == (2 * SMALL_COMMITLOG_FILE,)
    second_file = commitlog_file(store.config, 1).read_bytes()
    assert BLANK_TRAILER.unpack_from(second_file, largest) == (
        END_FILE_MIN_BLANK_LENGTH,
        BLANK_MAGIC_CODE,
    )
    assert after.queue_offsets == (2,)


def test_topic_of_127_allowed_characters_is_accepted(store: MessageStore) -> None:
    topic = ("%|aZ09_-" * 16)[:MAX_TOPIC_LENGTH]
    assert len(topic) == 127

    result = store.put_message(Message(topic, b"long topic", queue_id=2))

    assert result.ok, result.detail
    assert store.wait_dispatched()
    record = store.get_message_by_queue_offset(topic, 2, 0)
    assert record is not None
    assert record.topic == topic


def test_body_of_exactly_max_message_size_is_accepted(open_store: StoreOpener) -> None:
    store = open_store(max_message_size=1024)
    assert store.put_message(Message("Limit", b"x" * 1024)).ok


def test_properties_of_exactly_32767_bytes_are_accepted(open_store: StoreOpener) -> None:
    # Without the CRC32 property, which takes 20 of PROPLEN's bytes (the next test).
    store = open_store(enabled_append_prop_crc=False)
    properties = {"k": "v" * (MAX_PROPERTIES_SIZE - 3)}
    assert len(encode_properties(properties)) == MAX_PROPERTIES_SIZE

    result = store.put_message(Message("Props", b"", properties=properties))

    assert result.ok, result.detail
    record = store.lookup_message_by_offset(result.physical_offsets[0])
    assert record is not None
    assert record.properties == properties


def test_the_crc32_property_counts_against_the_properties_limit(store: MessageStore) -> None:
    """As in RocketMQ's doAppend: PROPLEN holds the user's properties and the CRC32's."""
    fits = {"k": "v" * (MAX_PROPERTIES_SIZE - CRC32_RESERVED_LEN - 3)}
    too_long = {"k": "v" * (MAX_PROPERTIES_SIZE - CRC32_RESERVED_LEN - 2)}

    result = store.put_message(Message("Props", b"", properties=fits))
    refused = store.put_message(Message("Props", b"", properties=too_long))

    assert result.ok, result.detail
    record = store.lookup_message_by_offset(result.physical_offsets[0])
    assert record is not None
    assert record.properties == fits
    assert refused.status is PutStatus.PROPERTIES_SIZE_EXCEEDED


# -- refusals ---------------------------------------------------------------------------


def _good(i: int = 0) -> Message:
    return Message("Good", f"good-{i}".encode())


REFUSALS: list[tuple[str, dict[str, Any], list[Message], PutStatus, str]] = [
    (
        "body larger than max_message_size",
        {"max_message_size": 1024},
        [Message("Good", b"x" * 1025)],
        PutStatus.MESSAGE_ILLEGAL,
        "max_message_size",
    ),
    (
        "properties over 32767 bytes",
        {},
        [Message("Good", b"", properties={"k": "v" * (MAX_PROPERTIES_SIZE - 2)})],
        PutStatus.PROPERTIES_SIZE_EXCEEDED,
        "32767",
    ),
    (
        "topic of 128 characters",
        {},
        [Message("t" * (MAX_TOPIC_LENGTH + 1), b"x")],
        PutStatus.MESSAGE_ILLEGAL,
        "topic",
    ),
    ("topic with a space", {}, [Message("a b", b"x")], PutStatus.MESSAGE_ILLEGAL, "topic"),
    ("topic with a slash", {}, [Message("a/b", b"x")], PutStatus.MESSAGE_ILLEGAL, "topic"),
    (
        "topic with a trailing newline",
        {},
        [Message("ab\n", b"x")],
        PutStatus.MESSAGE_ILLEGAL,
        "topic",
    ),
    ("empty topic", {}, [Message("", b"x")], PutStatus.MESSAGE_ILLEGAL, "topic"),
    ("non-ASCII topic", {}, [Message("tópico", b"x")], PutStatus.MESSAGE_ILLEGAL, "topic"),
    (
        "negative queue id",
        {},
        [Message("Good", b"x", queue_id=-1)],
        PutStatus.MESSAGE_ILLEGAL,
        "queue id",
    ),
    ("empty batch", {}, [], PutStatus.MESSAGE_ILLEGAL, "empty"),
    (
        "record larger than a commitlog file",
        {},
        [Message("Good", b"x" * (SMALL_COMMITLOG_FILE + 1))],
        PutStatus.MESSAGE_ILLEGAL,
        "commitlog file",
    ),
    (
        "unparseable born host",
        {},
        [Message("Good", b"x", born_host="not-a-host:1")],
        PutStatus.MESSAGE_ILLEGAL,
        "born host",
    ),
    (
        "one bad message in a batch of good ones",
        {},
        [_good(1), _good(2), Message("bad topic", b"x"), _good(3)],
        PutStatus.MESSAGE_ILLEGAL,
        "topic",
    ),
]


@pytest.mark.parametrize(
    ("overrides", "messages", "status", "detail_mentions"),
    [case[1:] for case in REFUSALS],
    ids=[case[0] for case in REFUSALS],
)
def test_refused_put_writes_nothing(
    open_store: StoreOpener,
    overrides: dict[str, Any],
    messages: list[Message],
    status: PutStatus,
    detail_mentions: str,
) -> None:
    store = open_store(**overrides)
    first = store.put_message(_good())
    assert first.ok
    end_before = store.max_physical_offset
    disk_before = commitlog_file(store.config, 0).read_bytes()

    result = store.put_messages(messages)

    assert result.status is status
    assert not result.ok
    assert detail_mentions in result.detail
    assert result.physical_offsets == result.queue_offsets == result.sizes == ()
    assert store.max_physical_offset == end_before
    assert commitlog_file(store.config, 0).read_bytes() == disk_before
    # No queue offset was consumed either.
    assert store.put_message(_good()).queue_offsets == (1,)


def test_put_before_start_and_after_shutdown_is_service_not_available(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = MessageStore(make_config(), clock=clock)
    assert store.put_message(_good()).status is PutStatus.SERVICE_NOT_AVAILABLE

    store.start()
    assert store.put_message(_good()).ok
    end = store.max_physical_offset
    store.shutdown()

    result = store.put_messages([_good(1), _good(2)])
    assert result.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert result.detail
    reopened = MessageStore.open(make_config(), clock=clock)
    try:
        assert reopened.max_physical_offset == end
    finally:
        reopened.shutdown()


# -- lock and abort files ----------------------------------------------------------------

_OPEN_IN_CHILD = textwrap.dedent(
    """
    import sys
    from basalt.store import MessageStore, MessageStoreConfig, StoreLockedError

    config = MessageStoreConfig(
        store_path_root_dir=sys.argv[1],
        mapped_file_size_commit_log=int(sys.argv[2]),
        mapped_file_size_consume_queue=int(sys.argv[3]),
        max_hash_slot_num=512,
        max_index_num=2048,
    )
    try:
        store = MessageStore.open(config)
    except StoreLockedError as e:
        print(e)
        sys.exit(3)
    store.shutdown()
    print("opened")
    """
)


def _open_in_child(config: MessageStoreConfig) -> subprocess.CompletedProcess[str]:
    """Open (and shut down) a store on ``config``'s root from another process."""
    args = [
        str(config.store_path_root_dir),
        str(config.mapped_file_size_commit_log),
        str(config.mapped_file_size_consume_queue),
    ]
    return subprocess.run(
        [sys.executable, "-c", _OPEN_IN_CHILD, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )


def test_second_store_on_the_same_root_is_refused_until_shutdown(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config()
    first = MessageStore.open(config, clock=clock)
    try:
        with pytest.raises(StoreLockedError) as refused:
            MessageStore.open(config, clock=clock)
        assert refused.value.root == config.store_path_root_dir
        assert str(config.store_path_root_dir) in str(refused.value)
        assert "locked" in str(refused.value)

        child = _open_in_child(config)
        assert child.returncode == 3, child.stderr
        assert "locked" in child.stdout
        assert str(config.store_path_root_dir) in child.stdout

        # The refused attempts did not disturb the running store.
        assert first.put_message(_good()).ok
    finally:
        first.shutdown()

    child = _open_in_child(config)
    assert child.returncode == 0, child.stdout + child.stderr
    assert "opened" in child.stdout
    second = MessageStore.open(config, clock=clock)
    try:
        assert second.put_message(_good()).queue_offsets == (1,)
    finally:
        second.shutdown()


def test_abort_file_exists_while_running_and_is_removed_on_clean_shutdown(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config()
    with MessageStore(config, clock=clock) as store:
        assert store.running
        assert config.abort_path.exists()
        assert store.recovery_report is not None
        assert not store.recovery_report.abnormal
        store.put_message(_good())
    assert store.put_message(_good()).status is PutStatus.SERVICE_NOT_AVAILABLE
    assert not config.abort_path.exists()

    reopened = MessageStore.open(config, clock=clock)
    try:
        assert reopened.recovery_report is not None
        assert not reopened.recovery_report.abnormal
        assert config.abort_path.exists()
    finally:
        reopened.shutdown()
    assert not config.abort_path.exists()


@pytest.mark.parametrize(
    ("runs", "why"),
    [
        ([(0, 50)], "cover 50 of its"),
        ([(10, 100)], "back to back"),
        ([(0, 40), (50, 100)], "back to back"),
        ([(0, 60), (40, 100)], "back to back"),
        ([(0, 0), (0, 100)], "back to back"),
    ],
)
def test_a_batch_whose_runs_do_not_tile_its_bytes_is_refused_and_writes_nothing(
    store: MessageStore, runs: list[tuple[int, int]], why: str
) -> None:
    """Bytes outside every run would reach the log unvalidated: such a batch is refused."""
    before = store.max_physical_offset
    batch = EncodedBatch(bytearray(100), [BatchRun("Tiles", 0, a, b) for a, b in runs])

    result = store.put_batch(batch)

    assert result.status is PutStatus.MESSAGE_ILLEGAL
    assert why in result.detail
    assert store.max_physical_offset == before
    assert store.put_message(Message("Tiles", b"still serving")).ok


def test_a_producer_batch_holding_a_transactional_message_is_refused(store: MessageStore) -> None:
    """As in RocketMQ, a transactional message cannot be batched by a producer."""
    host = store.commitlog.store_host
    messages = [
        Message("TxBatch", b"plain"),
        Message("TxBatch", b"half", sys_flag=TRANSACTION_PREPARED_TYPE),
    ]
    raw = EncodedBatch.of_messages([EncodedMessage(m, store_host=host) for m in messages]).data
    before = store.max_physical_offset

    result = store.put_batch(EncodedBatch.of_records("TxBatch", 0, raw))

    assert result.status is PutStatus.MESSAGE_ILLEGAL
    assert "record 1" in result.detail and "transactional" in result.detail
    assert store.max_physical_offset == before
    # Sent as messages, a prepared record is stored (and kept out of its queue).
    assert store.put_messages(messages).ok
