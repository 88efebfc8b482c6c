"""store.index_service: RocketMQ's IndexService over small index files."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from basalt.common.message import (
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    encode_properties,
)
from basalt.store.clock import ManualClock
from basalt.store.dispatcher import DispatchListener, DispatchRequest
from basalt.store.errors import StoreClosedError, StoreConfigError
from basalt.store.index_file import IndexFile, index_file_name, index_file_size
from basalt.store.index_service import IndexService, QueryOffsetResult

T0 = 1_700_000_000_000
TOPIC = "TopicTest"
EVERYTHING = (0, 2**62)
SLOTS = 11

MakeService = Callable[..., IndexService]


def request(
    phy: int,
    ts: int,
    keys: Sequence[str] = (),
    uniq_key: str | None = None,
    *,
    topic: str = TOPIC,
    sys_flag: int = 0,
) -> DispatchRequest:
    props: dict[str, str] = {}
    if keys:
        props["KEYS"] = " ".join(keys)
    if uniq_key is not None:
        props["UNIQ_KEY"] = uniq_key
    return DispatchRequest(topic, 0, phy, 100, 0, ts, 0, sys_flag, encode_properties(props))


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def make_service(tmp_path: Path, clock: ManualClock) -> Iterator[MakeService]:
    """``make_service(**kw)``: a loaded service on ``tmp_path`` with small files."""
    made: list[IndexService] = []

    def make(
        *, last_exit_ok: bool = True, index_msg_timestamp_ms: int = 0, **kw: int
    ) -> IndexService:
        kw.setdefault("max_hash_slot_num", SLOTS)
        kw.setdefault("max_index_num", 64)
        s = IndexService(tmp_path, clock=clock, **kw)
        s.load(last_exit_ok, index_msg_timestamp_ms)
        made.append(s)
        return s

    yield make
    for s in made:
        s.shutdown()


def offsets(service: IndexService, key: str, max_num: int = 64) -> list[int]:
    return service.query_offset(TOPIC, key, max_num, *EVERYTHING).phy_offsets


# -- building ----------------------------------------------------------------------------


def test_service_is_a_dispatch_listener(make_service: MakeService) -> None:
    listener: DispatchListener = make_service()
    listener.on_dispatch([request(0, T0, ["a"])])


def test_uniq_key_and_each_key_are_indexed_as_topic_hash_key(
    make_service: MakeService, tmp_path: Path, clock: ManualClock
) -> None:
    s = make_service()
    s.on_dispatch(
        [
            request(100, T0, ["order-1", "user-7"], uniq_key="U1"),
            request(200, T0 + 1000, ["order-2", "", "user-7"], uniq_key="U2"),
            request(300, T0 + 2000, ["user-7"], topic="Other"),
        ]
    )
    assert offsets(s, "U1") == [100]
    assert offsets(s, "order-2") == [200]
    assert offsets(s, "user-7") == [200, 100]  # topic "Other" is a different key
    assert s.query_offset("Other", "user-7", 64, *EVERYTHING).phy_offsets == [300]
    assert offsets(s, "nothing") == []
    (f,) = s.files
    assert f.index_count == 1 + 7
    assert f.path == tmp_path / "index" / index_file_name(clock.now_ms())


def test_rolled_back_records_are_skipped_and_prepared_ones_indexed_as_rocketmq_4(
    make_service: MakeService,
) -> None:
    s = make_service()
    s.build_index(
        [
            request(100, T0, ["rb"], sys_flag=TRANSACTION_ROLLBACK_TYPE),
            request(200, T0, ["prep"], sys_flag=TRANSACTION_PREPARED_TYPE),
            request(300, T0, ["commit"], sys_flag=TRANSACTION_COMMIT_TYPE),
        ]
    )
    assert offsets(s, "rb") == []
    assert offsets(s, "prep") == [200]  # IndexService.buildIndex returns only on ROLLBACK
    assert offsets(s, "commit") == [300]


def test_re_dispatch_below_the_end_offset_is_skipped(make_service: MakeService) -> None:
    s = make_service()
    batch = [request(100 * i, T0 + i, ["k"], uniq_key=f"U{i}") for i in range(1, 5)]
    s.on_dispatch(batch)
    count = s.files[-1].index_count
    s.on_dispatch(batch[:3])
    assert s.files[-1].index_count == count
    # RocketMQ skips with "<": the record at endPhyOffset is indexed once more.
    s.on_dispatch(batch)
    assert s.files[-1].index_count == count + 2
    assert offsets(s, "k") == [400, 400, 300, 200, 100]


def test_a_full_file_rolls_to_a_new_one_that_starts_at_its_end(
    make_service: MakeService, clock: ManualClock
) -> None:
    s = make_service(max_index_num=4)  # 3 entries per file
    s.on_dispatch([request(100 * i, T0 + 1000 * i, ["k"]) for i in range(1, 8)])
    first, second, third = s.files
    assert [f.index_count for f in s.files] == [4, 4, 2]
    assert first.is_write_full and not third.is_write_full
    assert (second.begin_phy_offset, second.end_phy_offset) == (400, 600)
    # Created in the same clock millisecond: names still distinct and ordered.
    names = [f.file_name for f in s.files]
    assert names[0] == index_file_name(clock.now_ms())
    assert names == sorted(names) and len(set(names)) == 3
    assert offsets(s, "k") == [700, 600, 500, 400, 300, 200, 100]
    result = s.query_offset(TOPIC, "k", 64, *EVERYTHING)
    assert (result.index_last_update_timestamp, result.index_last_update_phyoffset) == (
        T0 + 7000,
        700,
    )
    # The full files are flushed by the next flush(), which names the checkpoint time.
    assert s.flush() == second.end_timestamp_ms == T0 + 6000


def test_a_record_with_more_keys_than_room_spills_into_the_next_file(
    make_service: MakeService,
) -> None:
    s = make_service(max_index_num=3)  # 2 entries per file
    s.on_dispatch([request(100, T0, ["a", "b", "c", "d", "e"])])
    assert len(s.files) == 3
    for key in "abcde":
        assert offsets(s, key) == [100]


# -- querying -----------------------------------------------------------------------------


def test_query_walks_files_newest_first_and_stops_at_max_num(make_service: MakeService) -> None:
    s = make_service(max_index_num=4, max_msgs_num_batch=5)
    s.on_dispatch([request(100 * i, T0 + 1000 * i, ["k"]) for i in range(1, 10)])
    assert len(s.files) == 3
    assert offsets(s, "k", max_num=2) == [900, 800]
    assert offsets(s, "k", max_num=4) == [900, 800, 700, 600]
    assert offsets(s, "k", max_num=1000) == [900, 800, 700, 600, 500]  # maxMsgsNumBatch


def test_query_filters_by_time_and_stops_at_a_file_that_begins_before_the_range(
    make_service: MakeService,
) -> None:
    s = make_service(max_index_num=4)
    s.on_dispatch([request(100 * i, T0 + 10_000 * i, ["k"]) for i in range(1, 10)])
    assert s.query_offset(TOPIC, "k", 64, T0 + 30_000, T0 + 50_000).phy_offsets == [500, 400, 300]
    assert s.query_offset(TOPIC, "k", 64, T0 + 85_000, 2**62).phy_offsets == [900]
    assert s.query_offset(TOPIC, "k", 64, 0, T0).phy_offsets == []


def test_keys_with_the_same_java_hash_both_come_back(make_service: MakeService) -> None:
    s = make_service(max_hash_slot_num=1_000_003)
    s.on_dispatch([request(100, T0, ["Aa"]), request(200, T0, ["BB"])])
    # "TopicTest#Aa" and "TopicTest#BB" share a hash: the caller re-checks the record's keys.
    assert offsets(s, "Aa") == offsets(s, "BB") == [200, 100]


def test_query_of_an_empty_service(make_service: MakeService) -> None:
    assert make_service().query_offset(TOPIC, "k", 10, *EVERYTHING) == QueryOffsetResult([], 0, 0)


# -- load, flush, checkpoint -----------------------------------------------------------------


def test_load_after_a_clean_shutdown_keeps_everything(
    make_service: MakeService, tmp_path: Path
) -> None:
    s = make_service(max_index_num=4)
    s.on_dispatch([request(100 * i, T0 + 1000 * i, ["k"]) for i in range(1, 6)])
    s.shutdown()
    assert s.index_msg_timestamp_ms == T0 + 3000  # the full file's end
    t = make_service(max_index_num=4, last_exit_ok=True, index_msg_timestamp_ms=0)
    assert offsets(t, "k") == [500, 400, 300, 200, 100]
    t.on_dispatch([request(600, T0 + 6000, ["k"])])
    assert offsets(t, "k")[0] == 600
    assert len(list((tmp_path / "index").iterdir())) == 2


def test_load_after_an_abnormal_exit_destroys_files_past_the_checkpoint(
    make_service: MakeService, tmp_path: Path
) -> None:
    s = make_service(max_index_num=5)  # 4 entries per file: two records of two keys
    records = [request(100 * i, T0 + 1000 * i, ["k", f"k{i}"]) for i in range(1, 6)]
    s.on_dispatch(records)
    checkpoint = s.flush()
    assert checkpoint == s.files[1].end_timestamp_ms == T0 + 4000
    kept = [f.file_name for f in s.files[:2]]
    lost = s.files[2].file_name
    for f in s.files:  # a crash: nothing more is flushed
        f.close()

    t = make_service(max_index_num=5, last_exit_ok=False, index_msg_timestamp_ms=checkpoint)
    assert [f.file_name for f in t.files] == kept
    assert not (tmp_path / "index" / lost).exists()
    assert offsets(t, "k") == [400, 300, 200, 100]
    assert offsets(t, "k5") == []
    # Recovery re-dispatches: what the kept files hold is skipped, except the record at
    # their endPhyOffset (RocketMQ's "<"), whose keys come back once more.
    t.on_dispatch(records)
    assert offsets(t, "k") == [500, 400, 400, 300, 200, 100]
    assert offsets(t, "k4") == [400, 400]
    assert offsets(t, "k5") == [500]


def test_a_file_ending_at_the_checkpoint_time_survives_an_abnormal_exit(
    make_service: MakeService,
) -> None:
    s = make_service(max_index_num=4)
    s.on_dispatch([request(100, T0, ["a", "b", "c", "d"])])  # fills a file, spills one key
    checkpoint = s.flush()
    assert checkpoint == T0
    for f in s.files:
        f.close()
    t = make_service(max_index_num=4, last_exit_ok=False, index_msg_timestamp_ms=checkpoint)
    assert len(t.files) == 2  # endTimestamp == checkpoint is not "later"
    assert offsets(t, "d") == [100]


def test_load_removes_unfinished_creations_and_quarantines_a_wrong_size(
    make_service: MakeService, tmp_path: Path, clock: ManualClock
) -> None:
    index = tmp_path / "index"
    index.mkdir()
    name = index_file_name(T0)
    (index / (name + ".tmp")).write_bytes(b"")
    (index / "README").write_text("not an index file")
    s = IndexService(tmp_path, clock=clock, max_hash_slot_num=SLOTS, max_index_num=8)
    result = s.load(True, 0)
    assert result.removed_tmp == (name + ".tmp",)
    assert result.loaded == result.destroyed == ()
    IndexFile.create(index / name, SLOTS, 8).close()
    os.truncate(index / name, index_file_size(SLOTS, 8) - 20)
    # Derived data: a wrong size is a reason to rebuild, not to refuse to start.
    s = IndexService(tmp_path, clock=clock, max_hash_slot_num=SLOTS, max_index_num=8)
    assert s.load(True, 0).loaded == ()
    (dropped,) = s.dropped
    assert dropped.name == name and "size" in dropped.reason
    assert Path(dropped.quarantine) == tmp_path / "quarantine" / f"index-{name}"
    assert Path(dropped.quarantine).exists() and not (index / name).exists()


def test_flush_keeps_the_checkpoint_time_it_was_loaded_with(make_service: MakeService) -> None:
    s = make_service(index_msg_timestamp_ms=T0 - 5)
    s.on_dispatch([request(100, T0, ["k"])])
    assert s.flush() == T0 - 5  # no file filled: nothing new is durable for the checkpoint


# -- expiry and lifecycle ---------------------------------------------------------------------


def test_delete_expired_file_removes_old_files_but_never_the_last(
    make_service: MakeService,
) -> None:
    s = make_service(max_index_num=3)  # 2 entries per file
    s.on_dispatch([request(100 * i, T0 + i, ["k"]) for i in range(1, 8)])
    assert [f.end_phy_offset for f in s.files] == [200, 400, 600, 700]
    paths = [f.path for f in s.files]
    assert s.delete_expired_file(200) == 0  # endPhyOffset must be below the minimum
    assert s.delete_expired_file(201) == 1
    assert not paths[0].exists()
    assert offsets(s, "k") == [700, 600, 500, 400, 300]
    assert s.delete_expired_file(10**9) == 2
    assert [f.path for f in s.files] == paths[3:]
    assert offsets(s, "k") == [700]


def test_destroy_removes_every_file_and_a_closed_service_refuses_dispatch(
    make_service: MakeService, tmp_path: Path
) -> None:
    s = make_service(max_index_num=3)
    s.on_dispatch([request(100 * i, T0, ["k"]) for i in range(5)])
    s.destroy()
    assert list((tmp_path / "index").iterdir()) == []
    assert offsets(s, "k") == []
    with pytest.raises(StoreClosedError):
        s.on_dispatch([request(1000, T0, ["k"])])


@pytest.mark.parametrize(
    "kw",
    [
        {"max_hash_slot_num": 0},
        {"max_index_num": 1},
        {"max_msgs_num_batch": 0},
        {"max_hash_slot_num": 5_000_000, "max_index_num": 200_000_000},
    ],
)
def test_sizes_rocketmq_cannot_hold_are_refused(
    kw: dict[str, int], tmp_path: Path, clock: ManualClock
) -> None:
    with pytest.raises(StoreConfigError):
        IndexService(tmp_path, clock=clock, **kw)


# -- concurrency ------------------------------------------------------------------------------


def test_queries_while_building_see_consistent_results(make_service: MakeService) -> None:
    s = make_service(max_hash_slot_num=7, max_index_num=50, max_msgs_num_batch=10_000)
    keys = [f"k{i}" for i in range(5)]
    total = 3000
    errors: list[BaseException] = []
    done = threading.Event()

    def query() -> None:
        try:
            while not done.is_set():
                for key in keys:
                    # Build phy i for key k{i % 5}: every result is that key's, newest first.
                    got = s.query_offset(TOPIC, key, 10_000, *EVERYTHING).phy_offsets
                    assert all(p % 5 == int(key[1:]) for p in got)
                    assert got == sorted(got, reverse=True)
                    assert len(set(got)) == len(got)
        except BaseException as e:  # reported below
            errors.append(e)

    def expire() -> None:
        try:
            while not done.is_set():
                s.delete_expired_file(0)  # touches the list lock, deletes nothing
                s.flush()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=query) for _ in range(2)]
    threads.append(threading.Thread(target=expire))
    for t in threads:
        t.start()
    try:
        for start in range(0, total, 50):
            s.on_dispatch(
                [request(i, T0 + i, [keys[i % 5]]) for i in range(max(start, 1), start + 50)]
            )
    finally:
        done.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert len(s.files) > 50
    assert offsets(s, "k3", max_num=10_000) == list(range(total - 2, 0, -5))
