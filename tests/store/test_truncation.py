"""Durable truncation (RocketMQ #10666): the cut survives kill -9 at any point."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from basalt.store import ManualClock, Message, MessageStore
from basalt.store.consistency import check_store
from basalt.store.errors import CorruptFileError
from basalt.store.replica_log import ReplicaOffsetError
from basalt.store.truncation import write_marker
from tests.support.processes import REPO_ROOT
from tests.support.stores import ConfigFactory
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    from basalt.store import Message, MessageStore, MessageStoreConfig

    config = MessageStoreConfig(
        store_path_root_dir=sys.argv[1],
        mapped_file_size_commit_log=16 * 1024,
        mapped_file_size_consume_queue=20 * 64,
        max_hash_slot_num=512,
        max_index_num=2048,
        disk_max_used_space_ratio=100,
        disk_space_clean_forcibly_ratio=100,
        disk_space_warning_level_ratio=100,
    )
    store = MessageStore.open(config)
    store.epochs.append(1, 0)
    phys = []
    for _ in range(6):
        batch = [Message("T", b"t" * 500, queue_id=0, keys=["k"])] * 10
        phys += store.put_messages(batch).physical_offsets
    cut = phys[25]
    store.epochs.append(2, phys[40])
    assert store.wait_dispatched()
    store.truncate_to(cut)
    print(json.dumps({"cut": cut}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def _check_cut(store: MessageStore, cut: int) -> None:
    assert store.max_offset == cut
    assert store.get_max_offset_in_queue("T", 0) == 25
    assert [e.epoch for e in store.epochs.entries()] == [1]
    after = store.put_message(Message("T", b"new", queue_id=0))
    assert after.queue_offsets == (25,) and after.physical_offsets == (cut,)
    assert store.wait_dispatched()
    records = store.get_message("g", "T", 0, 20, 64).decode()
    assert [r.queue_offset for r in records] == [20, 21, 22, 23, 24, 25]
    assert records[-1].body == b"new"


def test_truncate_survives_kill_9(tmp_path: Path, make_config: ConfigFactory) -> None:
    root = tmp_path / "store"
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(root)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    assert child.returncode == -9, child.stderr
    cut = json.loads(child.stdout)["cut"]
    assert not (root / "truncate").exists()
    store = MessageStore.open(make_config(mapped_file_size_commit_log=16 * 1024))
    try:
        _check_cut(store, cut)
    finally:
        assert store.shutdown()


def test_a_marker_left_by_a_crash_is_finished_at_start(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config(mapped_file_size_commit_log=16 * 1024)
    store = MessageStore.open(config, clock=clock)
    store.epochs.append(1, 0)
    phys: list[int] = []
    for _ in range(6):
        phys += store.put_messages([Message("T", b"t" * 500, queue_id=0)] * 10).physical_offsets
    store.epochs.append(2, phys[40])
    assert store.wait_dispatched()
    assert store.shutdown()
    cut = phys[25]
    # A crash after the marker was written, before anything was cut.
    write_marker(config.truncate_marker_path, cut)
    store = MessageStore.open(config, clock=clock)
    try:
        assert not config.truncate_marker_path.exists()
        _check_cut(store, cut)
    finally:
        assert store.shutdown()


def test_truncate_refuses_a_non_boundary(store: MessageStore) -> None:
    result = store.put_messages([Message("T", b"x" * 100, queue_id=0)] * 3)
    with pytest.raises(ReplicaOffsetError):
        store.truncate_to(result.physical_offsets[1] + 1)
    with pytest.raises(ReplicaOffsetError):
        store.truncate_to(store.max_offset + 1)
    assert store.max_offset == result.physical_offsets[2] + result.sizes[2]
    store.truncate_to(result.physical_offsets[1])
    assert store.wait_dispatched()
    assert store.get_max_offset_in_queue("T", 0) == 1
    assert store.put_message(Message("T", b"y", queue_id=0)).queue_offsets == (1,)


def test_a_damaged_marker_is_an_error(make_config: ConfigFactory) -> None:
    config = make_config()
    MessageStore.open(config).shutdown()
    config.truncate_marker_path.write_bytes(b"garbage")
    with pytest.raises(CorruptFileError, match="truncate"):
        MessageStore.open(config)


def test_store_check_reports_a_leftover_marker_and_a_damaged_epoch_file(
    make_config: ConfigFactory,
) -> None:
    config = make_config()
    store = MessageStore.open(config)
    store.put_message(Message("T", b"x", queue_id=0))
    store.epochs.append(1, 0)
    assert store.shutdown()
    root = config.store_path_root_dir
    assert check_store(root).ok
    write_marker(config.truncate_marker_path, 0)
    codes = [p.code for p in check_store(root).problems]
    assert codes == ["truncate-marker"]
    config.truncate_marker_path.write_bytes(b"junk")
    assert [p.code for p in check_store(root).problems] == ["truncate-marker"]
    config.truncate_marker_path.unlink()
    data = bytearray(config.epoch_file_path.read_bytes())
    data[-1] ^= 1
    config.epoch_file_path.write_bytes(bytes(data))
    assert [p.code for p in check_store(root).problems] == ["epoch-file"]
    with pytest.raises(CorruptFileError, match="epochFileCheckpoint"):
        MessageStore.open(config)
