"""Delay levels (store.schedule): parking in SCHEDULE_TOPIC_XXXX, the due time as
tagsCode (C and Python), delivery when due and not before, delayOffset.json,
restarts (clean and kill -9).

Most tests stop the service's thread and drive ``deliver_due`` by hand with a
ManualClock, so what is delivered when is deterministic.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from basalt.common import _records
from basalt.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_UNIQ_KEY,
    SCHEDULE_TOPIC,
    Message,
    encode_host,
)
from basalt.common.record import encode_batch, record_properties
from basalt.store import ManualClock, MessageStore
from basalt.store.batch import EncodedBatch
from basalt.store.config import parse_delay_levels
from basalt.store.consume_queue import UNIT
from basalt.store.errors import StoreConfigError
from basalt.store.put_result import PutStatus
from basalt.store.schedule import (
    consume_queue_tags_code,
    decode_delay_offsets,
    delay_offset_path,
)
from tests.support.polling import eventually_sync
from tests.support.stores import ConfigFactory, small_store_config
from tests.support.system_topics import dispatched, real

LEVELS = "1s 5s 10s"


def open_store(make_config: ConfigFactory, clock: ManualClock, **overrides: object) -> MessageStore:
    """A started store with LEVELS whose schedule thread is stopped (driven by hand)."""
    store = MessageStore.open(make_config(message_delay_level=LEVELS, **overrides), clock=clock)
    store.schedule.shutdown()
    return store


def test_message_delay_level_is_parsed_and_validated(tmp_path: Path) -> None:
    assert parse_delay_levels("1s 2m 3h 1d") == (1000, 120_000, 10_800_000, 86_400_000)
    assert small_store_config(tmp_path).delay_levels_ms[-1] == 7_200_000  # RocketMQ's 2h
    assert len(small_store_config(tmp_path).delay_levels_ms) == 18
    for bad in ("", "1x", "0s", "s", "1.5s", "-1s", " ".join(["1s"] * 65)):
        with pytest.raises(StoreConfigError, match="message_delay_level"):
            small_store_config(tmp_path, message_delay_level=bad)


def test_a_delayed_put_is_parked_with_its_due_time_as_tags_code(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        result = store.put_message(
            Message("Orders", b"body", queue_id=2, tags="TagA", keys=("k1",), delay_time_level=2)
        )
        assert result.status is PutStatus.PUT_OK
        parked = real(store, SCHEDULE_TOPIC, 1)
        assert len(parked) == 1 and store.get_max_offset_in_queue("Orders", 2) == 0
        props = parked[0].properties
        assert props[PROPERTY_REAL_TOPIC] == "Orders"
        assert props[PROPERTY_REAL_QUEUE_ID] == "2"
        assert props[PROPERTY_DELAY_TIME_LEVEL] == "2"
        assert props["TAGS"] == "TagA" and props["KEYS"] == "k1"
        cq = store.consume_queues.get(SCHEDULE_TOPIC, 1)
        assert cq is not None
        _, _, code = UNIT.unpack(cq.read_units(0, 1))
        assert code == result.store_timestamp_ms + 5000
    finally:
        store.shutdown()


def test_levels_past_the_last_clamp_and_zero_is_no_delay(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        assert store.put_message(Message("T", b"late", delay_time_level=99)).ok
        assert store.put_message(Message("T", b"now", properties={"DELAY": "0"})).ok
        assert store.put_message(Message("T", b"prop", properties={"DELAY": "1"})).ok
        last = real(store, SCHEDULE_TOPIC, 2)
        assert [r.body for r in last] == [b"late"]
        assert last[0].properties[PROPERTY_DELAY_TIME_LEVEL] == "3"
        assert [r.body for r in real(store, "T", 0)] == [b"now"]
        assert [r.body for r in real(store, SCHEDULE_TOPIC, 0)] == [b"prop"]
    finally:
        store.shutdown()


def test_a_delay_that_is_not_an_integer_is_refused_and_nothing_stored(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        before = store.max_physical_offset
        result = store.put_message(Message("T", b"x", properties={"DELAY": "soon"}))
        assert result.status is PutStatus.MESSAGE_ILLEGAL
        assert "soon" in result.detail
        assert store.max_physical_offset == before
    finally:
        store.shutdown()


def test_each_level_is_delivered_at_its_time_not_before(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    try:
        sent = {}
        for level in (1, 2, 3):
            m = Message(
                "Orders",
                b"level %d" % level,
                queue_id=1,
                tags=f"L{level}",
                keys=(f"key{level}", "shared"),
                properties={PROPERTY_UNIQ_KEY: f"UNIQ{level}"},
                delay_time_level=level,
                born_timestamp_ms=1234 + level,
                born_host="10.0.0.7:4242",
            )
            assert store.put_message(m).ok
            sent[level] = m
        dispatched(store)
        delivered: list[Message] = []
        for step_ms, due_levels in (
            (999, []),
            (1, [1]),
            (3999, [1]),
            (1, [1, 2]),
            (5000, [1, 2, 3]),
        ):
            clock.advance(step_ms)
            store.schedule.deliver_due()
            delivered = real(store, "Orders", 1)
            assert [r.body for r in delivered] == [b"level %d" % lv for lv in due_levels]
        assert store.schedule.delivered == 3
        for level, record in zip((1, 2, 3), delivered, strict=True):
            assert record.tags == f"L{level}"
            assert record.keys == [f"key{level}", "shared"]
            assert record.uniq_key == f"UNIQ{level}"  # the consumer sees the producer's id
            assert record.born_timestamp_ms == sent[level].born_timestamp_ms
            assert record.born_host == "10.0.0.7:4242"
            assert record.queue_id == 1
            for name in (PROPERTY_DELAY_TIME_LEVEL, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID):
                assert name not in record.properties
        assert store.schedule.offsets == {1: 1, 2: 1, 3: 1}
        # Delivered once: looking again changes nothing.
        store.schedule.deliver_due()
        assert len(real(store, "Orders", 1)) == 3
    finally:
        store.shutdown()


def test_the_offsets_survive_a_clean_restart(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = open_store(make_config, clock)
    for level in (1, 1, 3):
        assert store.put_message(Message("T", b"l%d" % level, delay_time_level=level)).ok
    dispatched(store)
    clock.advance(1000)
    store.schedule.deliver_due()
    assert store.shutdown()
    path = delay_offset_path(store.config.store_path_root_dir)
    assert json.loads(path.read_text()) == {"offsetTable": {"1": 2, "3": 0}}

    store = open_store(make_config, clock)
    try:
        assert store.schedule.offsets == {1: 2, 3: 0}
        store.schedule.deliver_due()
        assert [r.body for r in real(store, "T", 0)] == [b"l1", b"l1"]
        clock.advance(9000)
        store.schedule.deliver_due()
        assert [r.body for r in real(store, "T", 0)] == [b"l1", b"l1", b"l3"]
    finally:
        store.shutdown()


def test_rocketmq_delay_offset_files_with_bare_keys_are_read() -> None:
    assert decode_delay_offsets(b'{"offsetTable":{1:23,2:0,18:4}}') == {1: 23, 2: 0, 18: 4}
    with pytest.raises(ValueError):
        decode_delay_offsets(b'{"offsetTable":{"1":-1}}')


def test_the_service_thread_delivers_on_its_own(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = MessageStore.open(make_config(message_delay_level=LEVELS), clock=clock)
    try:
        assert store.put_message(Message("T", b"x", delay_time_level=1)).ok
        dispatched(store)
        clock.advance(1000)
        eventually_sync(lambda: len(real(store, "T", 0)) == 1, what="the delivery")
    finally:
        assert store.shutdown()
    assert decode_delay_offsets(delay_offset_path(store.config.store_path_root_dir).read_bytes())


def test_a_disabled_service_delivers_nothing_until_enabled(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    store = MessageStore.open(make_config(message_delay_level=LEVELS), clock=clock)
    try:
        store.set_schedule_enabled(False)
        assert store.put_message(Message("T", b"x", delay_time_level=1)).ok
        clock.advance(1000)
        dispatched(store)
        assert store.schedule.deliver_due() is None
        assert real(store, "T", 0) == []
        store.set_schedule_enabled(True)
        eventually_sync(lambda: len(real(store, "T", 0)) == 1, what="the delivery")
    finally:
        store.shutdown()


# -- the tagsCode rule: C == Python ----------------------------------------------------

ODD_DELAYS = ["1", "2", "3", "4", "99", "0", "-1", "abc", "", "0003", "1234567890", " 1", "+1"]


def test_the_schedule_tags_code_rule_is_the_same_in_c_and_python(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """stamp (the put), dispatch (a walk of the log) and tags_code_at (the check) all
    give consume_queue_tags_code's answer, for odd DELAY values too."""
    store = MessageStore.open(make_config(message_delay_level=LEVELS), clock=clock)
    delays = store.config.delay_levels_ms
    try:
        messages = [
            Message(
                SCHEDULE_TOPIC,
                b"m%d" % i,
                tags=("TagA" if i % 2 else "标签"),
                properties={"DELAY": d},
            )
            for i, d in enumerate(ODD_DELAYS)
        ] + [Message(SCHEDULE_TOPIC, b"no delay", tags="T")]
        records = encode_batch(
            messages,
            [f"U{i}" for i in range(len(messages))],
            queue_id=0,
            store_host=encode_host("127.0.0.1:10911"),
            born_timestamp_ms=1,
        )
        # A user topic with the same properties keeps the TAGS hash.
        other = encode_batch(
            [Message("Plain", b"p", tags="TagA", properties={"DELAY": "1"})],
            ["P"],
            queue_id=0,
            store_host=encode_host("127.0.0.1:10911"),
            born_timestamp_ms=1,
        )
        assert store.put_batch(EncodedBatch.of_records(SCHEDULE_TOPIC, 0, records)).ok
        clock.advance(7)
        assert store.put_batch(EncodedBatch.of_records("Plain", 0, other)).ok
        dispatched(store)
        expected = []
        at_codes = []
        mf = store.commitlog.files.find_by_offset(0)
        assert mf is not None
        for topic in (SCHEDULE_TOPIC, "Plain"):
            cq = store.consume_queues.get(topic, 0)
            assert cq is not None
            for _, phy, size, code in cq.iter_units(0):
                raw = mf.read(phy, size)
                rec = store.commitlog.get_record(phy, size)
                assert rec is not None
                props = record_properties(raw)
                want = consume_queue_tags_code(rec.topic, props, rec.store_timestamp_ms, delays)
                expected.append(want)
                assert code == want, (rec.properties, code, want)  # stamp's units
                at_codes.append(_records.tags_code_at(raw, 0, delays))
        assert at_codes == expected
        # Without delays every record keeps its TAGS hash (and some differ).
        plain = [
            _records.tags_code_at(mf.read(p, s), 0)
            for _, p, s, _ in store.consume_queues.get(SCHEDULE_TOPIC, 0).iter_units(0)
        ]  # type: ignore[union-attr]
        assert plain != expected[: len(plain)]
        # The dispatcher's walk of the CommitLog.
        walk = _records.dispatch(
            mf.fd, 0, mf.wrote_position, 0, bytearray(1 << 16), False, {}, delays
        )
        codes = [code for _, _, _, _, units in walk[5] for _, _, code in UNIT.iter_unpack(units)]
        assert codes == expected
        due = [
            c
            for c, d in zip(expected, ODD_DELAYS, strict=False)
            if d not in ("1", "2", "3", "4", "99", "0003")
        ]
        assert len(due) == 7  # the others keep their TAGS hash
    finally:
        store.shutdown()


# -- kill -9 -------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from basalt.common.message import Message, PROPERTY_UNIQ_KEY
    from basalt.store import MessageStore
    from tests.support.stores import small_store_config
    root, count = Path(sys.argv[1]), int(sys.argv[2])
    store = MessageStore.open(small_store_config(
        root, message_delay_level="1s 2s", flush_delay_offset_interval_ms=300))
    if count:
        for i in range(count):
            m = Message("Real", b"%d" % i, queue_id=i % 2, delay_time_level=1 + i % 2,
                        properties={PROPERTY_UNIQ_KEY: "U%d" % i})
            assert store.put_message(m).ok
    print("sent", flush=True)
    while True:
        time.sleep(0.05)
        print("delivered", store.schedule.delivered, flush=True)
    """
)


def test_a_kill_9_loses_no_scheduled_message(tmp_path: Path) -> None:
    root = tmp_path / "store"
    count = 300
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(root), str(count)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "sent"
        # Kill while deliveries are under way: some delivered, not all.
        for line in child.stdout:
            delivered = int(line.split()[1])
            if delivered >= count // 3:
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert (root / "abort").exists()
    store = MessageStore.open(small_store_config(root, message_delay_level="1s 2s"))
    try:

        def all_delivered() -> bool:
            dispatched(store)
            return {r.uniq_key for q in (0, 1) for _, r in store.iter_queue("Real", q)} == {
                f"U{i}" for i in range(count)
            }

        eventually_sync(all_delivered, timeout_s=30, what="every message delivered")
        copies = Counter(r.uniq_key for q in (0, 1) for _, r in store.iter_queue("Real", q))
        duplicates = sum(n - 1 for n in copies.values())
        print(f"kill -9: {count} delivered, {duplicates} duplicates")
        for q in (0, 1):
            for _, r in store.iter_queue("Real", q):
                assert r.uniq_key is not None and int(r.body) % 2 == q
    finally:
        store.shutdown()
