"""Shared fixtures: small store configurations on ``tmp_path``."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from basalt.store import ManualClock, MessageStore, MessageStoreConfig

#: Small files so tests roll files and fill queues quickly.
SMALL_COMMITLOG_FILE = 64 * 1024
SMALL_CQ_FILE = 20 * 64
#: Small IndexFiles (RocketMQ's default file is 420 MB, reserved up front).
SMALL_INDEX = {"max_hash_slot_num": 512, "max_index_num": 2048}

ConfigFactory = Callable[..., MessageStoreConfig]


@pytest.fixture
def make_config(tmp_path: Path) -> ConfigFactory:
    """``make_config(**overrides)``: a config rooted at ``tmp_path / "store"`` with small files."""

    def factory(**overrides: Any) -> MessageStoreConfig:
        values: dict[str, Any] = {
            "store_path_root_dir": tmp_path / "store",
            "mapped_file_size_commit_log": SMALL_COMMITLOG_FILE,
            "mapped_file_size_consume_queue": SMALL_CQ_FILE,
            "flush_interval_commit_log_ms": 50,
            "flush_interval_consume_queue_ms": 50,
            **SMALL_INDEX,
            # The real disk must never trigger expiry or refuse sends in tests:
            # expiry tests set these and inject the disk use they need.
            "disk_max_used_space_ratio": 100,
            "disk_space_clean_forcibly_ratio": 100,
            "disk_space_warning_level_ratio": 100,
        }
        values.update(overrides)
        return MessageStoreConfig(**values)

    return factory


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(make_config: ConfigFactory, clock: ManualClock) -> Iterator[MessageStore]:
    """A started store with small files and a manual clock; shut down after the test."""
    s = MessageStore.open(make_config(), clock=clock)
    try:
        yield s
    finally:
        s.shutdown()


def run_threads(target: Callable[[int], None], count: int, *, timeout_s: float = 120) -> None:
    """Run ``target(i)`` on ``count`` threads at once; fail if one hangs or raises."""
    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as e:
            errors.append(e)

    workers = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=timeout_s)
    assert not any(w.is_alive() for w in workers)
    assert not errors, errors


def wait_indexed(store: MessageStore, timeout_s: float = 10.0) -> None:
    """Wait until the IndexFile has caught up with the CommitLog (it follows the
    dispatcher, on its thread, every 10 ms)."""
    assert store.wait_dispatched()
    index = store.index
    deadline = time.monotonic() + timeout_s
    while index is not None and index.reput_offset < store.max_physical_offset:
        assert time.monotonic() < deadline, "the index did not catch up"
        time.sleep(0.005)
