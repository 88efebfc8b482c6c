"""All ConsumeQueues of a store root, keyed by (topic, queue id)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path

from basalt.store.config import CQ_STORE_UNIT_SIZE
from basalt.store.consume_queue import ConsumeQueue
from basalt.store.files import syncfs, syncfs_available
from basalt.store.queue_file import DEFAULT_MAX_OPEN_FILES, OpenFiles

#: From this many queues with unflushed units on, a flush is one ``syncfs`` of the
#: filesystem rather than an fdatasync per queue file (see ConsumeQueueTable.flush).
SYNCFS_MIN_DIRTY_QUEUES = 64


def _sub_dirs(path: Path) -> list[str]:
    """Names of the folders in ``path``, sorted."""
    with os.scandir(path) as entries:
        return sorted(e.name for e in entries if e.is_dir())


class ConsumeQueueTable:
    """Finds, creates, loads and destroys the ConsumeQueues under ``consumequeue/``.

    Creation is guarded by a lock so a reader and the dispatcher asking for the
    same new queue get the same object; it is O(1): a dict entry here, a
    sparse file (open + ftruncate) at the queue's first unit. Every queue's
    files borrow descriptors from one :class:`OpenFiles` of
    ``max_open_files``, so the store's fds do not grow with its queues.
    """

    def __init__(
        self,
        directory: Path,
        mapped_file_size: int,
        *,
        read_only: bool = False,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
    ) -> None:
        self.directory = directory
        self.mapped_file_size = mapped_file_size
        self.read_only = read_only
        self.open_files = OpenFiles(max_open_files)
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._lock = threading.Lock()

    def load(self) -> None:
        """Map every ``<topic>/<queueId>/`` folder found on disk.

        One thread: listing and stat-ing release the GIL for each system call,
        and threads contending for it at that rate loaded 40,000 queues 2.3
        times slower with two threads than with one (the GIL's hand-offs).
        """
        if not self.directory.is_dir():
            return
        # scandir: the entry type comes with the name, no stat per folder (40,000
        # queues are 50,000 folders). No file is opened here (see QueueFile).
        for topic in _sub_dirs(self.directory):
            for queue in _sub_dirs(self.directory / topic):
                if queue.isdigit():
                    cq = self._new(topic, int(queue))
                    cq.load()
                    self._queues[cq.topic, cq.queue_id] = cq

    def _new(self, topic: str, queue_id: int) -> ConsumeQueue:
        return ConsumeQueue(
            topic,
            queue_id,
            self.directory,
            self.mapped_file_size,
            read_only=self.read_only,
            open_files=self.open_files,
        )

    def get(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get((topic, queue_id))

    def find_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            with self._lock:
                cq = self._queues.get((topic, queue_id))
                if cq is None:
                    cq = self._new(topic, queue_id)
                    self._queues[topic, queue_id] = cq
        return cq

    def __iter__(self) -> Iterator[ConsumeQueue]:
        return iter(list(self._queues.values()))

    def __len__(self) -> int:
        return len(self._queues)

    def max_offsets(self) -> list[tuple[tuple[str, int], int]]:
        """Every queue's (topic, queue id) and max offset, from memory (no system call)."""
        return [((cq.topic, cq.queue_id), cq.max_offset_in_queue) for cq in self]

    def not_reaching(
        self, maxima: Mapping[tuple[str, int], int]
    ) -> tuple[list[tuple[str, int]], list[ConsumeQueue]]:
        """The (topic, queue id) keys of ``maxima`` with no queue here, and the
        queues here that end before the max offset ``maxima`` gives them.

        A dictionary lookup and two attribute reads per entry, no system call:
        recovery runs it over every queue of the manifest at each start (~0.3 µs
        an entry).
        """
        queues = self._queues
        unit = CQ_STORE_UNIT_SIZE
        missing: list[tuple[str, int]] = []
        short: list[ConsumeQueue] = []
        for key, max_offset in maxima.items():
            cq = queues.get(key)
            if cq is None:
                missing.append(key)
                continue
            files = cq.files.files
            end = files[-1].file_from_offset + files[-1].wrote_position if files else 0
            if end // unit < max_offset:
                short.append(cq)
        return missing, short

    def max_physic_offset(self) -> int:
        """The highest record end any queue indexes; -1 when none does."""
        return max((cq.max_physic_offset for cq in self), default=-1)

    def flush(self) -> None:
        """Make every queue's written units durable.

        Few dirty queues: an fdatasync each. Many (a produce round robin over
        thousands of queues dirties thousands of small sparse files a second, and
        each fdatasync of a block newly allocated in a hole forces its own journal
        commit): one ``syncfs`` of the filesystem instead, the same guarantee for
        all of them at the cost of one writeback. Each queue's end is read before
        the sync, as a per-file flush reads it before its fsync.
        """
        queues = list(self)
        if len(queues) < SYNCFS_MIN_DIRTY_QUEUES or not syncfs_available():
            for cq in queues:
                cq.flush()
            return
        marked = [(cq, m) for cq in queues if (m := cq.files.flush_marks()) is not None]
        if len(marked) < SYNCFS_MIN_DIRTY_QUEUES:
            for cq, _ in marked:
                cq.flush()
            return
        syncfs(self.directory)
        for cq, marks in marked:
            cq.files.mark_synced(marks)

    def close(self) -> None:
        for cq in self:
            cq.close()

    def destroy(self) -> int:
        """Delete every queue's files; returns how many queues there were."""
        with self._lock:
            queues = list(self._queues.values())
            self._queues.clear()
        for cq in queues:
            cq.destroy()
        return len(queues)
