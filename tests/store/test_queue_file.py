"""store.queue_file: sparse ConsumeQueue files, pwrite/pread, descriptors from an LRU."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest

from basalt.store import Message, MessageStore, PutStatus, queue_file
from basalt.store.config import CQ_STORE_UNIT_SIZE, MessageStoreConfig
from basalt.store.consume_queue import UNIT, ConsumeQueue
from basalt.store.errors import CorruptFileError
from basalt.store.mapped_file import fd_data_extents, file_name
from basalt.store.queue_file import OpenFiles, QueueFile
from tests.support.polling import eventually_sync
from tests.support.stores import ConfigFactory

#: RocketMQ's default ConsumeQueue file: the files must stay readable at this size.
DEFAULT_SIZE = 300_000 * CQ_STORE_UNIT_SIZE


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def new_file(tmp_path: Path, open_files: OpenFiles, name: str = "q", offset: int = 0) -> QueueFile:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    return QueueFile(folder / file_name(offset), DEFAULT_SIZE, open_files)


def test_a_new_file_is_sparse_at_full_size_and_costs_one_block(tmp_path: Path) -> None:
    qf = new_file(tmp_path, OpenFiles(4))
    qf.append(UNIT.pack(100, 50, 7) * 3)
    st = qf.path.stat()
    assert st.st_size == DEFAULT_SIZE
    assert st.st_blocks * 512 <= 8192
    assert qf.read(0, 3 * CQ_STORE_UNIT_SIZE) == UNIT.pack(100, 50, 7) * 3
    assert qf.read(DEFAULT_SIZE - 20, 100) == bytes(20)  # clipped at the end, a hole
    assert qf.data_end() == 4096  # one page of data, then a hole
    qf.close()


def test_the_lru_closes_the_least_recently_used_idle_file_and_reopens_on_demand(
    tmp_path: Path,
) -> None:
    lru = OpenFiles(2)
    base = open_fds()
    files = [new_file(tmp_path, lru, f"q{i}") for i in range(5)]
    for i, qf in enumerate(files):
        qf.append(UNIT.pack(i, 10, 0))
    assert len(lru) == 2
    assert open_fds() - base == 2
    assert [qf.open_fd >= 0 for qf in files] == [False, False, False, True, True]
    # Reading an evicted file reopens it and evicts the least recently used (q3).
    assert UNIT.unpack(files[0].read(0, 20)) == (0, 10, 0)
    assert [qf.open_fd >= 0 for qf in files] == [True, False, False, False, True]
    assert lru.evictions == lru.opens - 2  # every open past the bound closed one
    assert open_fds() - base == 2
    for qf in files:
        qf.close()
    assert len(lru) == 0
    assert open_fds() == base


def test_caching_reads_answers_from_memory_until_the_file_is_written(tmp_path: Path) -> None:
    lru = OpenFiles(1)
    a, b = new_file(tmp_path, lru, "a"), new_file(tmp_path, lru, "b")
    a.append(UNIT.pack(1, 10, 0) * 2)
    b.append(UNIT.pack(2, 10, 0))
    with lru.caching_reads():
        assert a.read(0, 40) == UNIT.pack(1, 10, 0) * 2  # read once (b evicted a)
        opens = lru.opens
        b.read(0, 20)  # evicts a
        assert a.read(20, 20) == UNIT.pack(1, 10, 0)  # from memory: no reopen
        assert lru.opens == opens + 1
        assert lru.read_cache_bytes == 60
        a.write_at(20, UNIT.pack(9, 10, 0))  # a write drops the cached bytes
        assert a.read(20, 20) == UNIT.pack(9, 10, 0)
        a.append(UNIT.pack(3, 10, 0))
        assert a.read(0, 60) == UNIT.pack(1, 10, 0) + UNIT.pack(9, 10, 0) + UNIT.pack(3, 10, 0)
        assert a.read(40, 40) == UNIT.pack(3, 10, 0) + bytes(20)  # past the cache: the file
        a.zero_tail(20)
        assert a.read(0, 60) == UNIT.pack(1, 10, 0) + bytes(40)
    assert lru.read_cache is None and lru.read_cache_bytes == 0
    a.write_at(0, UNIT.pack(5, 10, 0))
    assert a.read(0, 20) == UNIT.pack(5, 10, 0)  # outside the block, always the file
    a.close()
    b.close()


def test_a_file_in_use_is_never_closed_under_its_user(tmp_path: Path) -> None:
    lru = OpenFiles(1)
    busy = new_file(tmp_path, lru, "busy")
    fd = lru.acquire(busy)  # a read or write in progress on another thread
    try:
        other = new_file(tmp_path, lru, "other")  # over the bound: busy is pinned
        assert busy.open_fd == fd
        assert len(lru) == 2  # exceeded rather than close a descriptor in use
        busy.close()  # deferred to the last release
        assert os.fstat(fd).st_size == DEFAULT_SIZE
        with pytest.raises(ValueError, match="closed"):
            busy.read(0, 20)
    finally:
        lru.release(busy)
    with pytest.raises(OSError):
        os.fstat(fd)
    assert len(lru) == 1
    other.close()


def test_a_failed_pwrite_is_an_oserror_and_moves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    qf = new_file(tmp_path, OpenFiles(4))
    qf.append(UNIT.pack(1, 10, 0))

    def full(fd: int, data: object, pos: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(queue_file.os, "pwrite", full)
    with pytest.raises(OSError) as caught:
        qf.append(UNIT.pack(2, 10, 0))
    assert caught.value.errno == errno.ENOSPC
    assert qf.wrote_position == CQ_STORE_UNIT_SIZE
    monkeypatch.undo()
    qf.append(UNIT.pack(3, 10, 0))
    assert UNIT.unpack(qf.read(20, 20)) == (3, 10, 0)
    qf.close()


def test_a_short_pwrite_with_no_progress_is_enospc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    qf = new_file(tmp_path, OpenFiles(4))
    monkeypatch.setattr(queue_file.os, "pwrite", lambda fd, data, pos: 0)
    with pytest.raises(OSError) as caught:
        qf.append(UNIT.pack(2, 10, 0))
    assert caught.value.errno == errno.ENOSPC
    assert qf.wrote_position == 0
    qf.close()


def test_emfile_opening_a_file_surfaces_as_oserror(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lru = OpenFiles(1)
    first = new_file(tmp_path, lru, "first")
    new_file(tmp_path, lru, "second")  # evicts first
    real_open = os.open

    def no_fds(path: object, flags: int, mode: int = 0o777) -> int:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(queue_file.os, "open", no_fds)
    with pytest.raises(OSError) as caught:
        first.read(0, 20)
    assert caught.value.errno == errno.EMFILE
    monkeypatch.setattr(queue_file.os, "open", real_open)
    assert first.read(0, 20) == bytes(20)


def test_a_file_of_another_size_is_refused(tmp_path: Path) -> None:
    path = tmp_path / file_name(0)
    path.write_bytes(bytes(DEFAULT_SIZE + 20))
    with pytest.raises(CorruptFileError, match="size"):
        QueueFile(path, DEFAULT_SIZE, OpenFiles(1))


def test_data_extents_skip_holes(tmp_path: Path) -> None:
    path = tmp_path / "sparse"
    with path.open("wb") as f:
        f.truncate(1 << 20)
        f.seek(512 * 1024)
        f.write(b"x")
    fd = os.open(path, os.O_RDONLY)
    try:
        extents = fd_data_extents(fd, 0, 1 << 20)
    finally:
        os.close(fd)
    assert sum(end - begin for begin, end in extents) <= 64 * 1024
    assert any(begin <= 512 * 1024 < end for begin, end in extents)


def test_recover_reads_only_up_to_the_first_hole(tmp_path: Path) -> None:
    cq = ConsumeQueue("T", 0, tmp_path, DEFAULT_SIZE, open_files=OpenFiles(2))
    cq.put_entries([(i, 1000 + 100 * i, 100, 0) for i in range(250)])  # crosses a page
    cq.close()
    reopened = ConsumeQueue("T", 0, tmp_path, DEFAULT_SIZE, open_files=OpenFiles(2))
    reopened.load()
    assert reopened.recover() == 0
    assert reopened.max_offset_in_queue == 250
    assert reopened.max_physic_offset == 1000 + 100 * 249 + 100
    assert reopened.get_unit(249) == (1000 + 100 * 249, 100, 0)
    reopened.close()


def test_the_bound_is_a_validated_setting() -> None:
    assert MessageStoreConfig(store_path_root_dir=Path("/x")).max_open_consume_queue_files == 4096
    with pytest.raises(ValueError, match="max_open_consume_queue_files"):
        MessageStoreConfig(store_path_root_dir=Path("/x"), max_open_consume_queue_files=0)


def test_readers_and_a_writer_on_other_threads_through_a_tiny_lru(tmp_path: Path) -> None:
    lru = OpenFiles(3)
    files = [new_file(tmp_path, lru, f"q{i}") for i in range(12)]
    rounds = 300
    errors: list[BaseException] = []
    done = threading.Event()

    def write() -> None:
        try:
            for n in range(rounds):
                for i, qf in enumerate(files):
                    qf.append(UNIT.pack(n, 100 + i, 0))
        except BaseException as e:  # reported by the assertion below
            errors.append(e)
        finally:
            done.set()

    def read() -> None:
        try:
            while not done.is_set():
                for i, qf in enumerate(files):
                    count = qf.wrote_position // CQ_STORE_UNIT_SIZE
                    data = qf.read(0, count * CQ_STORE_UNIT_SIZE)
                    assert [u[:2] for u in UNIT.iter_unpack(data)] == [
                        (n, 100 + i) for n in range(count)
                    ]
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write)] + [threading.Thread(target=read) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(lru) <= 3
    assert all(qf.wrote_position == rounds * CQ_STORE_UNIT_SIZE for qf in files)
    for qf in files:
        qf.close()


def test_enospc_writing_a_unit_refuses_sends_keeps_reads_and_the_restart_indexes_it(
    make_config: ConfigFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config()
    with MessageStore(config) as store:
        assert store.put_message(Message("Full", b"before")).ok
        assert store.wait_dispatched()

        def full(fd: int, data: object, pos: int) -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        # ConsumeQueue writes only (os.pwrite itself is the CommitLog's too).
        monkeypatch.setattr(queue_file, "pwrite_all", full)
        assert store.put_message(Message("Full", b"unindexed")).ok  # in the CommitLog
        eventually_sync(lambda: store.failure is not None, what="the dispatcher failure")
        refused = store.put_message(Message("Full", b"refused"))
        assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert "ENOSPC" in refused.detail or "No space" in refused.detail, refused.detail
        got = store.get_message("G", "Full", 0, 0, 8)
        assert [m.body for m in got.decode()] == [b"before"]
        monkeypatch.undo()
    with MessageStore(config) as store:
        got = store.get_message("G", "Full", 0, 0, 8)
        assert [m.body for m in got.decode()] == [b"before", b"unindexed"]
