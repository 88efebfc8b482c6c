"""Stores for tests: small configurations on ``tmp_path``, the store fixtures, a
store filled with a bit of everything, and waits on a store's background threads.

The fixtures (``make_config``, ``clock``, ``store``) are registered by
``tests/conftest.py``; everything else is imported from here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from basalt.common.message import TRANSACTION_COMMIT_TYPE, TRANSACTION_PREPARED_TYPE
from basalt.store import ManualClock, Message, MessageStore, MessageStoreConfig
from tests.support.polling import eventually_sync

#: Small files so tests roll files and fill queues quickly.
SMALL_COMMITLOG_FILE = 64 * 1024
SMALL_CQ_FILE = 20 * 64
#: Small IndexFiles (RocketMQ's default file is 420 MB, reserved up front).
SMALL_INDEX = {"max_hash_slot_num": 512, "max_index_num": 2048}
#: The real disk must never trigger expiry or refuse sends in tests: expiry
#: tests set these themselves and inject the disk use they need.
DISK_NEVER_FULL = {
    "disk_max_used_space_ratio": 100,
    "disk_space_clean_forcibly_ratio": 100,
    "disk_space_warning_level_ratio": 100,
}

ConfigFactory = Callable[..., MessageStoreConfig]


def small_store_config(root: Path, **overrides: Any) -> MessageStoreConfig:
    """A config rooted at ``root`` with small files and 50 ms flushes; ``overrides`` win."""
    values: dict[str, Any] = {
        "store_path_root_dir": root,
        "mapped_file_size_commit_log": SMALL_COMMITLOG_FILE,
        "mapped_file_size_consume_queue": SMALL_CQ_FILE,
        "flush_interval_commit_log_ms": 50,
        "flush_interval_consume_queue_ms": 50,
        **SMALL_INDEX,
        **DISK_NEVER_FULL,
    }
    values.update(overrides)
    return MessageStoreConfig(**values)


def node_store_config(root: Path) -> MessageStoreConfig:
    """The store under an in-process store-node: 256 KiB CommitLog files, 256-unit
    ConsumeQueue files, small IndexFiles, default flush intervals."""
    return MessageStoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=256 * 1024,
        mapped_file_size_consume_queue=20 * 256,
        **DISK_NEVER_FULL,  # type: ignore[arg-type]
        **SMALL_INDEX,  # type: ignore[arg-type]
    )


# -- fixtures (registered by tests/conftest.py) ------------------------------------------


@pytest.fixture
def make_config(tmp_path: Path) -> ConfigFactory:
    """``make_config(**overrides)``: :func:`small_store_config` rooted at ``tmp_path / "store"``."""

    def factory(**overrides: Any) -> MessageStoreConfig:
        return small_store_config(tmp_path / "store", **overrides)

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


# -- a store with a bit of everything ----------------------------------------------------

FILL_TOPICS = ("TopicA", "TopicB", "%RETRY%group")
FILL_QUEUES = 3
FILL_TAGS = ("TagA", "TagB", None, "标签")


@dataclass(frozen=True)
class Sent:
    """One acknowledged message and where the store put it."""

    topic: str
    queue_id: int
    tags: str | None
    body: bytes
    physical_offset: int
    size: int
    queue_offset: int
    dispatchable: bool = True


def fill_store(store: MessageStore, clock: ManualClock, rounds: int = 30) -> list[Sent]:
    """Write FILL_TOPICS × FILL_QUEUES with tags, keys, empty/binary/large bodies
    and batches, ``rounds`` times.

    Also one prepared (never dispatched) and one committed transactional record.
    Returns every message in CommitLog order, after the dispatcher caught up.
    """
    sent: list[Sent] = []

    def put(messages: list[Message]) -> None:
        result = store.put_messages(messages)
        assert result.ok, result
        for m, phys, size, qoff in zip(
            messages, result.physical_offsets, result.sizes, result.queue_offsets, strict=True
        ):
            dispatchable = m.sys_flag != TRANSACTION_PREPARED_TYPE
            sent.append(Sent(m.topic, m.queue_id, m.tags, m.body, phys, size, qoff, dispatchable))

    n = 0
    for r in range(rounds):
        for topic in FILL_TOPICS:
            batch = []
            for q in range(FILL_QUEUES):
                n += 1
                body = bytes([n % 256]) * (n * 37 % 1200) if n % 5 else f"text {n}".encode()
                batch.append(
                    Message(
                        topic=topic,
                        body=b"" if n % 11 == 0 else body,
                        queue_id=q,
                        tags=FILL_TAGS[n % len(FILL_TAGS)],
                        keys=[f"key-{n}", "shared"],
                        properties={"round": str(r)},
                    )
                )
            clock.advance(7)
            put(batch if r % 2 else batch[:1])
            if r % 2 == 0:
                for m in batch[1:]:
                    put([m])
    put([Message(topic="TopicA", body=b"half", queue_id=0, sys_flag=TRANSACTION_PREPARED_TYPE)])
    put([Message(topic="TopicA", body=b"done", queue_id=1, sys_flag=TRANSACTION_COMMIT_TYPE)])
    assert store.wait_dispatched()
    return sent


# -- waiting on the store's threads ------------------------------------------------------


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
    dispatcher, on its thread, every 10 ms). Blocks: from async code, run it in
    a thread (``asyncio.to_thread``), off the loop that serves the store."""
    assert store.wait_dispatched()
    index = store.index
    if index is not None:
        eventually_sync(
            lambda: index.reput_offset >= store.max_physical_offset,
            timeout_s=timeout_s,
            interval_s=0.005,
            what="the index catching up with the CommitLog",
        )
