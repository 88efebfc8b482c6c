"""Background flushing: RocketMQ's FlushRealTimeService, GroupCommitService and
FlushConsumeQueueService.

Each service owns one thread; ``fdatasync`` releases the GIL, so a flush never
stalls the writer or an event loop. The checkpoint is advanced only *after*
the bytes it vouches for are durable, never before.

Failure: an fsync error is fatal, as it is to PostgreSQL since "fsyncgate" -
after a failed fsync the kernel may have dropped the dirty pages, so a later
fsync that succeeds proves nothing. The periodic services let it escape
:meth:`ServiceThread.run` (recorded in the store's FailureChannel, the
service stops); group commit records it, fails the waiting senders, and
fails every later request with the same error without trying again.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

from basalt.store.checkpoint import StoreCheckpoint
from basalt.store.commitlog import CommitLog
from basalt.store.consume_queue_table import ConsumeQueueTable
from basalt.store.queue_manifest import QueueManifest
from basalt.store.service_thread import ServiceThread

log = logging.getLogger(__name__)

OS_PAGE_SIZE = 4096


def flush_commitlog(commitlog: CommitLog, checkpoint: StoreCheckpoint) -> int:
    """fsync the CommitLog, then vouch for it in the checkpoint; returns the flushed offset.

    Only the in-memory checkpoint is advanced: the file itself is written by the
    ConsumeQueue flush (and at shutdown), as RocketMQ does, so a SYNC send
    pays for one fsync, not two.
    """
    last = commitlog.files.last_file
    store_ts = last.store_timestamp_ms if last is not None else 0
    started = time.perf_counter()
    flushed = commitlog.files.flush()
    elapsed_s = time.perf_counter() - started
    for listener in commitlog.flush_listeners:
        listener(elapsed_s)
    if store_ts > 0:
        checkpoint.physic_msg_timestamp = store_ts
    return flushed


class FlushCommitLogService(ServiceThread):
    """ASYNC flush: fsync every ``flush_interval_commit_log_ms`` when enough is dirty."""

    name = "flush-commitlog"

    def __init__(
        self,
        commitlog: CommitLog,
        checkpoint: StoreCheckpoint,
        *,
        interval_ms: int,
        least_pages: int,
        thorough_interval_ms: int,
    ) -> None:
        super().__init__()
        self.commitlog = commitlog
        self.checkpoint = checkpoint
        self.interval_ms = interval_ms
        self.least_bytes = least_pages * OS_PAGE_SIZE
        self.thorough_interval_ms = thorough_interval_ms

    def run(self) -> None:
        last_thorough = time.monotonic()
        while not self._stopping:
            self._wakeup.wait(self.interval_ms / 1000)
            self._wakeup.clear()
            now = time.monotonic()
            thorough = (now - last_thorough) * 1000 >= self.thorough_interval_ms
            if thorough or self.commitlog.files.unflushed_bytes() >= self.least_bytes:
                flush_commitlog(self.commitlog, self.checkpoint)
                if thorough:
                    last_thorough = now
        flush_commitlog(self.commitlog, self.checkpoint)


#: Who waits for a flush: a thread (concurrent Future) or a coroutine (its loop and Future).
_Waiter = Future[None] | tuple[asyncio.AbstractEventLoop, "asyncio.Future[None]"]


#: A coroutine's flush Future and what to settle it with (None: success).
_Settlement = tuple["asyncio.Future[None]", BaseException | None]


def _settle_on_loop(items: list[_Settlement]) -> None:
    for fut, error in items:
        if fut.done():  # the sender gave up waiting (timeout, cancellation)
            continue
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)


class GroupCommitService(ServiceThread):
    """SYNC flush with group commit.

    Senders call :meth:`request` (threads) or :meth:`request_async` (coroutines)
    with the offset their bytes end at; the thread fsyncs once for every
    request that piled up meanwhile and completes each whose offset is now
    durable. Coroutines of one event loop are woken with a single
    ``call_soon_threadsafe`` per fsync, not one per sender.
    """

    name = "group-commit"

    def __init__(self, commitlog: CommitLog, checkpoint: StoreCheckpoint) -> None:
        super().__init__()
        self.commitlog = commitlog
        self.checkpoint = checkpoint
        self._lock = threading.Lock()
        self._requests: list[tuple[int, _Waiter]] = []
        #: The fsync error that failed a commit: every later commit fails with it.
        self._failed: OSError | None = None

    def request(self, end_offset: int) -> Future[None]:
        """A Future that completes once everything below ``end_offset`` is fsynced."""
        fut: Future[None] = Future()
        self._enqueue(end_offset, fut)
        return fut

    def request_async(self, end_offset: int) -> asyncio.Future[None]:
        """Like :meth:`request`, as a Future of the running event loop."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._enqueue(end_offset, (loop, fut))
        return fut

    def _enqueue(self, end_offset: int, waiter: _Waiter) -> None:
        with self._lock:
            stopping = self._stopping
            if not stopping:
                self._requests.append((end_offset, waiter))
        if stopping:
            # The thread is gone or going: flush for this sender right here.
            self._commit([(end_offset, waiter)])
        else:
            self._wakeup.set()

    def shutdown(self) -> None:
        with self._lock:
            self._stopping = True
        super().shutdown()

    def run(self) -> None:
        while True:
            self._wakeup.wait(0.01)
            self._wakeup.clear()
            with self._lock:
                batch, self._requests = self._requests, []
                stopping = self._stopping
            if batch or stopping:
                self._commit(batch)
            if stopping:
                with self._lock:
                    batch, self._requests = self._requests, []
                self._commit(batch)
                return

    def _commit(self, batch: list[tuple[int, _Waiter]]) -> None:
        flushed = -1
        failure: BaseException | None = self._failed
        if failure is None:
            try:
                flushed = flush_commitlog(self.commitlog, self.checkpoint)
            except OSError as e:
                failure = self._failed = e
                self.fail(e)
        per_loop: dict[
            asyncio.AbstractEventLoop, list[tuple[asyncio.Future[None], BaseException | None]]
        ] = {}
        for end, waiter in batch:
            error = failure
            if error is None and end > flushed:  # truncated under us: impossible while running
                error = RuntimeError(f"offset {end} not flushed (at {flushed})")
            if isinstance(waiter, Future):
                if error is None:
                    waiter.set_result(None)
                else:
                    waiter.set_exception(error)
            else:
                per_loop.setdefault(waiter[0], []).append((waiter[1], error))
        for loop, items in per_loop.items():
            try:
                loop.call_soon_threadsafe(_settle_on_loop, items)
            except RuntimeError:
                log.warning("event loop closed before its %d flush waiters were woken", len(items))


class FlushConsumeQueueService(ServiceThread):
    """fsync the ConsumeQueues every ``flush_interval_consume_queue_ms``, then write
    the queue manifest when it is due (see :mod:`basalt.store.queue_manifest`)."""

    name = "flush-consumequeue"

    def __init__(
        self,
        consume_queues: ConsumeQueueTable,
        checkpoint: StoreCheckpoint,
        last_dispatched_timestamp: Callable[[], int],
        *,
        interval_ms: int,
        flush_index: Callable[[], int] | None = None,
        manifest: QueueManifest | None = None,
        now_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
    ) -> None:
        super().__init__()
        self.consume_queues = consume_queues
        self.checkpoint = checkpoint
        self.last_dispatched_timestamp = last_dispatched_timestamp
        self.interval_ms = interval_ms
        #: The IndexService's flush: returns the checkpoint's new indexMsgTimestamp.
        self.flush_index = flush_index
        self.manifest = manifest
        self.now_ms = now_ms

    def flush_now(self, *, final: bool = False) -> None:
        """Flush the queues (and the index) and write the checkpoint; then the
        manifest, when due or (``final``: a stop's last flush) whenever it changed.
        Raises OSError from a flush; a failed manifest write is logged only (the
        old manifest stays, a lower bound of every queue's offsets, and the next
        round tries again)."""
        # Capture first: only what was dispatched before the fsync is vouched for.
        logics_ts = self.last_dispatched_timestamp()
        now = self.now_ms()
        manifest = self.manifest
        maxima = None
        if manifest is not None and (final or manifest.due(now)):
            maxima = self.consume_queues.max_offsets()
        self.consume_queues.flush()
        if logics_ts > 0:
            self.checkpoint.logics_msg_timestamp = logics_ts
        if self.flush_index is not None:
            index_ts = self.flush_index()
            if index_ts > 0:
                self.checkpoint.index_msg_timestamp = index_ts
        self.checkpoint.flush()
        if manifest is not None and maxima is not None:
            try:
                manifest.write_if_due(maxima, now, final=final)
            except OSError as e:
                log.log(
                    logging.ERROR if final else logging.WARNING,
                    "queue manifest %s not written: %s (the previous one stays)",
                    manifest.path, e,
                )  # fmt: skip

    def run(self) -> None:
        while not self._stopping:
            self._wakeup.wait(self.interval_ms / 1000)
            self._wakeup.clear()
            self.flush_now()
