"""20,000 queues on one MessageStore: fds, RSS and disk stay bounded; a restart keeps them all.

The ConsumeQueue files have RocketMQ's default size (6,000,000 bytes): what
this checks is that such a file costs one block of disk and no memory while
its queue holds one message, and that the store's descriptors are bounded by
``max_open_consume_queue_files``, not by its queues.
"""

from __future__ import annotations

from pathlib import Path

from basalt.store import Message, MessageStore, MessageStoreConfig
from basalt.store.config import CQ_STORE_UNIT_SIZE, DEFAULT_CQ_UNITS_PER_FILE
from basalt.store.get_message import GetStatus
from tests.support.resources import open_fds, rss_bytes
from tests.support.stores import small_store_config

QUEUES = 20_000
QUEUES_PER_TOPIC = 4
MAX_OPEN = 256
#: Descriptors besides the ConsumeQueues' that the store may open (CommitLog, index,
#: lock and checkpoint files, dir fsyncs).
FD_SLACK = 32
PER_QUEUE_BUDGET = 64 * 1024


def queue(i: int) -> tuple[str, int]:
    return f"T{i // QUEUES_PER_TOPIC}", i % QUEUES_PER_TOPIC


def config(root: Path) -> MessageStoreConfig:
    return small_store_config(
        root,
        mapped_file_size_consume_queue=DEFAULT_CQ_UNITS_PER_FILE * CQ_STORE_UNIT_SIZE,
        mapped_file_size_commit_log=16 << 20,
        max_open_consume_queue_files=MAX_OPEN,
    )


def test_twenty_thousand_queues_cost_kilobytes_and_bounded_fds(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = MessageStore.open(config(root))
    try:
        fds_before, rss_before = open_fds(), rss_bytes()
        for start in range(0, QUEUES, 500):
            batch = [
                Message(topic=topic, body=b"m%d" % i, queue_id=qid)
                for i in range(start, start + 500)
                for topic, qid in [queue(i)]
            ]
            assert store.put_messages(batch).ok
        assert store.wait_dispatched()
        assert open_fds() - fds_before <= MAX_OPEN + FD_SLACK
        grown = rss_bytes() - rss_before
        assert grown / QUEUES <= PER_QUEUE_BUDGET, f"{grown / QUEUES:.0f} bytes of RSS per queue"
        for i in range(0, QUEUES, 97):
            topic, qid = queue(i)
            result = store.get_message("g", topic, qid, 0, 4)
            assert result.status is GetStatus.FOUND and result.message_count == 1
        assert store.consume_queues.open_files.evictions > 0
    finally:
        store.shutdown()

    files = list((root / "consumequeue").glob("*/*/*"))
    assert len(files) == QUEUES
    for path in files[::53]:
        st = path.stat()
        assert st.st_size == DEFAULT_CQ_UNITS_PER_FILE * CQ_STORE_UNIT_SIZE
        assert st.st_blocks * 512 <= PER_QUEUE_BUDGET

    fds_before = open_fds()
    store = MessageStore.open(config(root))
    try:
        assert open_fds() - fds_before <= MAX_OPEN + FD_SLACK
        assert len(store.consume_queues) == QUEUES
        # Recovery's passes read each small queue once (OpenFiles.caching_reads): one
        # open per queue although the LRU holds far fewer (it was two per queue).
        assert store.consume_queues.open_files.opens == QUEUES
        assert store.consume_queues.open_files.read_cache is None  # only while recovering
        for i in range(QUEUES):
            topic, qid = queue(i)
            assert store.get_max_offset_in_queue(topic, qid) == 1, (topic, qid)
        for i in range(1, QUEUES, 89):
            topic, qid = queue(i)
            result = store.get_message("g", topic, qid, 0, 4)
            assert result.status is GetStatus.FOUND and result.message_count == 1
        assert open_fds() - fds_before <= MAX_OPEN + FD_SLACK
    finally:
        store.shutdown()
