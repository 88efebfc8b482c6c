"""The IndexFile inside the store: the C bulk path, recovery, query_message, expiry."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basalt.common.message import TRANSACTION_ROLLBACK_TYPE
from basalt.common.record import decode_record
from basalt.store import ManualClock, Message, MessageStore
from basalt.store.dispatcher import DispatchRequest
from basalt.store.index_service import IndexService
from tests.support.stores import ConfigFactory, wait_indexed

TOPIC = "Indexed"


def index_bytes(directory: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()]


def requests_of(store: MessageStore) -> list[DispatchRequest]:
    """Every record of the CommitLog as the dispatcher hands it to listeners."""
    out = []
    for mf in store.commitlog.files.files:
        pos = 0
        while pos < mf.wrote_position:
            raw = mf.read(pos, 8)
            size = int.from_bytes(raw[:4], "big")
            if raw[4:8] != b"\xda\xa3\x20\xa7":
                break  # the end-of-file blank
            r = decode_record(mf.read(pos, size))
            from basalt.common.message import encode_properties

            out.append(
                DispatchRequest(
                    r.topic,
                    r.queue_id,
                    r.commit_log_offset,
                    size,
                    0,
                    r.store_timestamp_ms,
                    r.queue_offset,
                    r.sys_flag,
                    encode_properties(r.properties),
                )
            )
            pos += size
    return out


keys_strategy = st.lists(
    st.text(
        alphabet=st.characters(blacklist_characters=" \x01\x02", blacklist_categories=("Cs",)),
        min_size=1,
        max_size=12,
    ),
    max_size=3,
)


@settings(max_examples=25, deadline=None)
@given(
    messages=st.lists(
        st.tuples(keys_strategy, st.booleans(), st.booleans(), st.integers(0, 5000)),
        min_size=1,
        max_size=40,
    )
)
def test_the_c_bulk_path_writes_the_files_the_python_reference_writes(
    tmp_path_factory: pytest.TempPathFactory,
    messages: list[tuple[list[str], bool, bool, int]],
) -> None:
    """Keys (unicode included), UNIQ_KEY or not, rolled-back records, time steps,
    and files small enough to fill mid-record: byte-identical index files."""
    root = tmp_path_factory.mktemp("bulk")
    clock = ManualClock()
    from basalt.store import MessageStoreConfig

    config = MessageStoreConfig(
        store_path_root_dir=root / "store",
        mapped_file_size_commit_log=64 * 1024,
        mapped_file_size_consume_queue=20 * 64,
        max_hash_slot_num=7,
        max_index_num=9,
    )
    with MessageStore.open(config, clock=clock) as store:
        for keys, uniq, rollback, step in messages:
            clock.advance(step)
            props = {} if uniq else {"UNIQ_KEY": ""}
            m = Message(
                TOPIC,
                b"b",
                keys=keys,
                properties=props,
                sys_flag=TRANSACTION_ROLLBACK_TYPE if rollback else 0,
            )
            assert store.put_message(m).ok
        assert store.wait_dispatched()
        requests = requests_of(store)
    bulk = index_bytes(root / "store" / "index")
    reference = IndexService(root / "ref", clock=clock, max_hash_slot_num=7, max_index_num=9)
    reference.load(True, 0)
    # The reference names files by the clock at creation: match the store's names.
    reference.build_index(requests)
    reference.shutdown()
    assert index_bytes(root / "ref" / "index") == bulk


def put_keys(store: MessageStore, clock: ManualClock, count: int) -> list[int]:
    offsets = []
    for i in range(count):
        clock.advance(1000)
        m = Message(
            TOPIC,
            b"%d" % i,
            keys=[f"k{i}", f"shared{i % 3}"],
            properties={"UNIQ_KEY": f"U{i:031d}"},
        )
        r = store.put_message(m)
        assert r.ok
        offsets.append(r.physical_offsets[0])
    assert store.wait_dispatched()
    return offsets


def test_query_message_returns_exactly_the_keyed_records(
    store: MessageStore, clock: ManualClock
) -> None:
    put_keys(store, clock, 30)
    wait_indexed(store)
    one = store.query_message(TOPIC, "k7", 32, 0, clock.now_ms())
    assert [r.body for r in one.decode()] == [b"7"]
    shared = store.query_message(TOPIC, "shared1", 32, 0, clock.now_ms())
    assert [r.body for r in shared.decode()] == [b"%d" % i for i in range(1, 30, 3)]
    assert store.query_message(TOPIC, "nope", 32, 0, clock.now_ms()).message_count == 0
    assert store.query_message("Other", "k7", 32, 0, clock.now_ms()).message_count == 0
    uniq = store.query_message(TOPIC, one.decode()[0].uniq_key or "", 32, 0, clock.now_ms())
    assert [r.body for r in uniq.decode()] == [b"7"]


def test_query_message_by_time_range_and_max_num(store: MessageStore, clock: ManualClock) -> None:
    start = clock.now_ms()
    put_keys(store, clock, 30)
    wait_indexed(store)
    # Message i is stored at start + (i + 1) s; the index keeps whole seconds.
    early = store.query_message(TOPIC, "shared0", 32, start, start + 10_000)
    assert [r.body for r in early.decode()] == [b"0", b"3", b"6", b"9"]
    capped = store.query_message(TOPIC, "shared0", 2, 0, clock.now_ms())
    assert capped.message_count == 2


def test_a_hash_collision_does_not_leak_into_query_message(
    store: MessageStore, clock: ManualClock
) -> None:
    assert store.put_message(Message(TOPIC, b"a", keys=["Aa"])).ok
    assert store.put_message(Message(TOPIC, b"b", keys=["BB"])).ok
    assert store.wait_dispatched()
    wait_indexed(store)
    assert [r.body for r in store.query_message(TOPIC, "Aa", 32, 0, clock.now_ms()).decode()] == [
        b"a"
    ]


def test_the_index_survives_a_clean_restart_and_is_rebuilt_after_a_crash(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config(max_hash_slot_num=64, max_index_num=50)
    with MessageStore.open(config, clock=clock) as store:
        put_keys(store, clock, 60)  # 120+ keys: several index files
        wait_indexed(store)
        assert store.index is not None and len(store.index.files) > 2
    with MessageStore.open(config, clock=clock) as store:
        assert store.query_message(TOPIC, "k55", 32, 0, clock.now_ms()).message_count == 1
    config.abort_path.touch()  # a crash: the files past the checkpoint are destroyed
    with MessageStore.open(config, clock=clock) as store:
        for i in (0, 31, 59):
            got = store.query_message(TOPIC, f"k{i}", 32, 0, clock.now_ms())
            assert [r.body for r in got.decode()] == [b"%d" % i]


def test_index_off_means_no_files_and_empty_queries(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config(message_index_enable=False)
    with MessageStore.open(config, clock=clock) as store:
        put_keys(store, clock, 5)
        assert store.index is None
        assert store.query_message(TOPIC, "k1", 32, 0, clock.now_ms()).message_count == 0
    assert not (config.store_path_root_dir / "index").exists()


def test_expiry_deletes_index_files_wholly_below_the_commitlog_min(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config(
        max_hash_slot_num=64, max_index_num=40, delete_commit_log_files_interval_ms=0
    )
    with MessageStore.open(config, clock=clock) as store:
        for i in itertools.count():
            assert store.put_message(Message(TOPIC, b"x" * 900, keys=[f"k{i}"])).ok
            if len(store.commitlog.files.files) >= 4:
                break
        assert store.wait_dispatched()
        wait_indexed(store)
        assert store.index is not None
        before = len(store.index.files)
        clock.advance(73 * 3_600_000)
        report = store.delete_expired_files()
        assert report.commitlog_files
        assert report.index_files > 0
        assert len(store.index.files) == before - report.index_files
        assert all(f.end_phy_offset >= store.min_physical_offset for f in store.index.files[1:])
        assert store.query_message(TOPIC, "k0", 32, 0, clock.now_ms()).message_count == 0


def test_an_index_file_of_the_wrong_size_is_set_aside_and_rebuilt(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config()
    with MessageStore.open(config, clock=clock) as store:
        put_keys(store, clock, 10)
        wait_indexed(store)
    index_dir = config.store_path_root_dir / "index"
    victim = sorted(index_dir.iterdir())[0]
    with victim.open("r+b") as f:
        f.truncate(1000)  # a torn or foreign file
    with MessageStore.open(config, clock=clock) as store:
        found = store.query_message(TOPIC, "k3", 32, 0, clock.now_ms())
        assert [r.body for r in found.decode()] == [b"3"]
    aside = config.store_path_root_dir / "quarantine" / f"index-{victim.name}"
    assert aside.stat().st_size == 1000


def test_a_crash_that_destroys_the_only_index_file_rebuilds_all_of_it(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """RocketMQ's defaults fill a file only after 20 M keys: one file, being
    written, destroyed by the abnormal load - every key must come back."""
    config = make_config()
    with MessageStore.open(config, clock=clock) as store:
        put_keys(store, clock, 20)
        wait_indexed(store)
        assert store.index is not None and len(store.index.files) == 1
    config.abort_path.touch()
    with MessageStore.open(config, clock=clock) as store:
        for i in (0, 10, 19):
            got = store.query_message(TOPIC, f"k{i}", 32, 0, clock.now_ms())
            assert [r.body for r in got.decode()] == [b"%d" % i]
