"""MessageStore: the storage engine's front door (RocketMQ's DefaultMessageStore).

Owns one store root::

    <root>/commitlog/            CommitLog files            (store.commitlog)
    <root>/consumequeue/T/Q/     ConsumeQueue files         (store.consume_queue)
    <root>/index/                IndexFiles                 (store.index_file)
    <root>/config/               consumerOffset.json        (store.consumer_offsets)
                                 delayOffset.json           (store.schedule)
                                 timercheck                 (store.timer)
    <root>/timerlog/, timerwheel TimerLog files, the wheel  (store.timer)
                                 consumeQueueManifest.json  (store.queue_manifest)
    <root>/pop/journal           pop-and-ack consumer state (store.pop)
    <root>/checkpoint            flush timestamps, confirm offset (store.checkpoint)
    <root>/epochFileCheckpoint   replication epochs         (store.epoch_file)
    <root>/truncate              present while a cut is under way (store.truncation)
    <root>/abort                 present while running; left behind by a crash
    <root>/lock                  flock'ed while a store has the root open

Lifecycle: ``MessageStore(config).start()`` locks the root, loads and recovers
(returning a RecoveryReport), creates ``abort`` and starts the dispatcher and
flush threads. ``shutdown()`` refuses new writes, flushes, lets the dispatcher
catch up and removes ``abort``.

Failure: a background service that fails for good (an fsync error, a
dispatcher that cannot open a file) is recorded in :attr:`MessageStore.failures`
(see store.failures); from then on ``put_*`` are refused SERVICE_NOT_AVAILABLE
with the reason, ``healthy`` is False, and reads keep working.

Concurrency: every public method is thread-safe. ``put_*`` serialize on the
CommitLog's put lock; a SYNC-flush send waits for the group-commit thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import TimeoutError as FutureTimeoutError
from dataclasses import replace
from types import TracebackType

from basalt.common.message import Message
from basalt.store.admission import Admission
from basalt.store.batch import EncodedBatch
from basalt.store.checkpoint import StoreCheckpoint
from basalt.store.clock import Clock, SystemClock
from basalt.store.coalesce import MAX_GROUP_BYTES, SendCoalescer
from basalt.store.commitlog import CommitLog
from basalt.store.config import FlushDiskType, MessageStoreConfig
from basalt.store.consume_queue_table import ConsumeQueueTable
from basalt.store.consumer_offsets import (
    CommitResult,
    ConsumerOffsetManager,
    OffsetPersistService,
    consumer_offset_path,
)
from basalt.store.dispatcher import DispatchListener, ReputMessageService
from basalt.store.epoch_file import EpochFile
from basalt.store.errors import StoreClosedError
from basalt.store.expiry import ExpiryReport, ExpiryService
from basalt.store.failures import FailureChannel, StoreFailure
from basalt.store.files import RootLock, create_abort_file, remove_abort_file
from basalt.store.flush import (
    FlushCommitLogService,
    FlushConsumeQueueService,
    GroupCommitService,
    flush_commitlog,
)
from basalt.store.get_message import (
    TransferLimits,
)
from basalt.store.index_service import IndexRebuild, IndexService
from basalt.store.pop import PopLoadReport, PopStore
from basalt.store.put_result import PutMessageResult, PutStatus
from basalt.store.put_result import refused as _refused
from basalt.store.queue_manifest import QueueManifest, manifest_path
from basalt.store.recovery import CommitLogPrescan, RecoveryReport, recover
from basalt.store.replica_log import ReplicaLog
from basalt.store.schedule import ScheduleMessageService, delay_offset_path
from basalt.store.store_reads import StoreReads
from basalt.store.timer import api as timer_api
from basalt.store.timer.service import TimerMessageService
from basalt.store.truncation import cut_commitlog, read_marker, remove_marker

log = logging.getLogger(__name__)


class MessageStore(StoreReads, ReplicaLog):
    """One store root: CommitLog, ConsumeQueues, checkpoint, recovery, flush."""

    def __init__(
        self,
        config: MessageStoreConfig,
        *,
        clock: Clock | None = None,
        listeners: Sequence[DispatchListener] = (),
    ) -> None:
        self.config = config
        self.clock: Clock = clock or SystemClock()
        #: Every background service's fatal failure: one makes the store refuse sends.
        self.failures = FailureChannel(self.clock.now_ms)
        self.commitlog = CommitLog(config)
        self.consume_queues = ConsumeQueueTable(
            config.consume_queue_dir,
            config.mapped_file_size_consume_queue,
            max_open_files=config.max_open_consume_queue_files,
        )
        self.dispatcher = ReputMessageService(
            self.commitlog, self.consume_queues, batch_size_bytes=config.reput_batch_size_bytes
        )
        self.dispatcher.listeners.extend(listeners)
        self.commitlog.on_append(self.dispatcher.on_append)
        self._lock = RootLock(config.store_path_root_dir)
        self._epochs: EpochFile | None = None
        self._confirm_lock = threading.Lock()
        #: Every queue's max offset, kept so a start detects lost queues (see
        #: store.queue_manifest); written by the ConsumeQueue flusher.
        self.queue_manifest = QueueManifest(manifest_path(config.store_path_root_dir))
        self._checkpoint: StoreCheckpoint | None = None
        self._group_commit: GroupCommitService | None = None
        self._flush_commitlog: FlushCommitLogService | None = None
        self._flush_cq: FlushConsumeQueueService | None = None
        self._running = False
        self.recovery_report: RecoveryReport | None = None
        #: Expired file deletion (see store.expiry); runs while the store does.
        self.expiry: ExpiryService | None = None
        #: The consumer offsets of every group (RocketMQ's ConsumerOffsetManager).
        self.consumer_offsets = ConsumerOffsetManager(
            consumer_offset_path(config.store_path_root_dir), clock=self.clock, space_reserve=True
        )
        self._offset_persister: OffsetPersistService | None = None
        #: Delivers parked delayed messages when due (see store.schedule).
        self.schedule = ScheduleMessageService(
            self,
            config.delay_levels_ms,
            delay_offset_path(config.store_path_root_dir),
            now_ms=self.clock.now_ms,
            persist_interval_ms=config.flush_delay_offset_interval_ms,
        )
        #: Files timer messages in the wheel and delivers them when due (store.timer).
        self.timer = TimerMessageService(self, config, now_ms=self.clock.now_ms)
        #: Pop-and-ack consumer state (RocketMQ 5's POP), journaled under <root>/pop.
        self.pop = PopStore(
            config.store_path_root_dir / "pop",
            self,
            self.consumer_offsets,
            fsync_interval_ms=0
            if config.flush_disk_type is FlushDiskType.SYNC_FLUSH
            else config.flush_interval_commit_log_ms,
            quarantine_dir=config.quarantine_dir,
        )
        #: What the last start replayed of the pop journal.
        self.pop_load_report: PopLoadReport | None = None
        #: What the last shutdown() returned (False before one).
        self.shut_down_cleanly = False
        #: The IndexFiles (None with message_index_enable off): built behind the
        #: dispatcher, on its thread, for query_message.
        self.index: IndexService | None = self._new_index() if config.message_index_enable else None
        #: What the last start quarantined of the index and indexed again (None
        #: before a start, or with the index off).
        self.index_rebuild: IndexRebuild | None = None
        #: The background services a started store runs, by the name their failure is
        #: recorded under in :attr:`failures` (empty before :meth:`start`).
        self.service_names: tuple[str, ...] = ()
        self._admission = Admission(config, self.commitlog.store_host, self.clock)
        self._transfer_limits = TransferLimits.of(config)
        #: One per event loop that sends (see put_batch_async).
        #: Called after each put_internal (the store's own services' puts).
        self._internal_put_listeners: list[Callable[[], None]] = []
        self._coalescers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SendCoalescer] = (
            weakref.WeakKeyDictionary()
        )
        #: The last loop that sent and its coalescer: a WeakKeyDictionary lookup makes a
        #: weak reference each time (~25 % of a lone send's queueing, measured).
        self._last_coalescer: (
            tuple[weakref.ref[asyncio.AbstractEventLoop], SendCoalescer] | None
        ) = None

    # -- lifecycle --------------------------------------------------------------------

    @classmethod
    def open(
        cls,
        config: MessageStoreConfig,
        *,
        clock: Clock | None = None,
        listeners: Sequence[DispatchListener] = (),
    ) -> MessageStore:
        """Construct and :meth:`start` a store."""
        store = cls(config, clock=clock, listeners=listeners)
        store.start()
        return store

    def start(self) -> RecoveryReport:
        """Lock the root, recover, and start the background services.

        Raises StoreLockedError when another store holds the root, and
        CorruptFileError when a data file cannot be mapped.
        """
        cfg = self.config
        cfg.store_path_root_dir.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            abnormal = cfg.abort_path.exists()
            self._checkpoint = checkpoint = StoreCheckpoint(cfg.checkpoint_path)
            self._epochs = EpochFile(cfg.epoch_file_path)
            if cfg.enable_controller_mode:
                # Recovery dispatches no further than what was confirmed before.
                self.dispatcher.confirm_offset = checkpoint.confirm_phy_offset
            self.commitlog.files.load()
            cut = read_marker(cfg.truncate_marker_path)
            if cut is not None:
                # A truncation was under way when the store stopped: finish the cut
                # before recovery can see the tail (store.truncation).
                log.warning("finishing the truncation of the commitlog at %d", cut)
                cut_commitlog(self.commitlog, cut)
            prescan = CommitLogPrescan(
                self.commitlog.files.files,
                checkpoint,
                abnormal=abnormal,
                check_crc=cfg.check_crc_on_recover,
            )
            try:
                # One thread reads and writes the queues until recovery ends: their
                # several passes read each small queue's file once (caching_reads).
                with self.consume_queues.open_files.caching_reads():
                    # After a cut the manifest may list offsets past it: not kept.
                    manifest = self.queue_manifest.load() if cut is None else None
                    self.consume_queues.load()
                    if self.index is not None:
                        self._load_index(not abnormal, checkpoint.index_msg_timestamp)
                        if cut is not None:
                            self.index.truncate_from(cut)
                    report = recover(
                        self.commitlog,
                        self.consume_queues,
                        checkpoint,
                        self.dispatcher,
                        abnormal=abnormal,
                        check_crc=cfg.check_crc_on_recover,
                        prescan=prescan,
                        manifest=manifest,
                        cut_at=cut,
                    )
            finally:
                prescan.wait()  # it reads the mappings _close_files would unmap
            if cfg.enable_controller_mode:
                # Never past the recovered end; never below what the queues already
                # hold (a store that turned controller mode on keeps its queues).
                confirmed = min(checkpoint.confirm_phy_offset, self.commitlog.max_offset)
                self._force_confirm_offset(max(confirmed, self.dispatcher.reput_from_offset))
            if cut is not None:
                self._after_cut(cut)
                remove_marker(cfg.truncate_marker_path)
            if self.index is not None:
                self._catch_up_index(report)
            # load() logs what it had to fall back on; the report carries it too.
            report = replace(report, consumer_offsets=self.consumer_offsets.load())
            # After the offsets: a queue the journal does not know starts at its
            # committed offset.
            self.pop_load_report = self.pop.load()
            self.schedule.load()
            self.timer.load()  # after recovery: it reads the timer topic's queue
            create_abort_file(cfg.abort_path)
        except BaseException:
            self._close_files()
            self._lock.release()
            raise
        self.recovery_report = report
        flush: GroupCommitService | FlushCommitLogService
        if cfg.flush_disk_type is FlushDiskType.SYNC_FLUSH:
            flush = self._group_commit = GroupCommitService(self.commitlog, checkpoint)
        else:
            flush = self._flush_commitlog = FlushCommitLogService(
                self.commitlog,
                checkpoint,
                interval_ms=cfg.flush_interval_commit_log_ms,
                least_pages=cfg.flush_commit_log_least_pages,
                thorough_interval_ms=cfg.flush_commit_log_thorough_interval_ms,
            )
        self._flush_cq = FlushConsumeQueueService(
            self.consume_queues,
            checkpoint,
            lambda: self.dispatcher.last_store_timestamp_ms,
            interval_ms=cfg.flush_interval_consume_queue_ms,
            flush_index=self.index.flush if self.index is not None else None,
            manifest=self.queue_manifest,
            now_ms=self.clock.now_ms,
        )
        self.expiry = ExpiryService(
            cfg,
            self.commitlog,
            self.consume_queues,
            self.clock,
            dispatched_to=self._dispatched_to,
            index=self.index,
        )
        self._offset_persister = OffsetPersistService(
            self.consumer_offsets,
            flush_consumer_offset_interval_ms=cfg.flush_consumer_offset_interval_ms,
        )
        # Wired only now: a failure during recovery is start()'s exception, not a
        # running store's state.
        self.dispatcher.failures = self.failures
        if self.index is not None:
            self.index.failures = self.failures
        # A controller-mode store delivers nothing until it is told it is the
        # master (set_schedule_enabled): a slave's deliveries would fork its log.
        self.schedule.enabled = self.timer.enabled = not cfg.enable_controller_mode
        services = (flush, self._flush_cq, self.expiry, self._offset_persister, self.schedule)
        for service in (*services, self.timer):
            service.failures = self.failures
            service.start()
        self.dispatcher.start()
        self.service_names = (
            self.dispatcher.name,
            flush.name,
            self._flush_cq.name,
            self.expiry.name,
            self._offset_persister.name,
            self.schedule.name,
            self.timer.name,
        ) + (("index-service",) if self.index is not None else ())
        self._running = True
        return report

    def shutdown(self) -> bool:
        """Stop: no new writes, everything flushed and dispatched, ``abort`` removed;
        returns whether the stop was clean.

        It is not clean, and ``abort`` stays so the next start runs abnormal
        recovery (logged at ERROR), when the dispatcher cannot catch up (a
        corrupt record), a flush or the last save of the consumer offsets
        failed (a full disk), or a service had failed before. A store-node
        exits non-zero then. A second call returns the first one's answer.
        """
        if not self._running:
            return self.shut_down_cleanly
        self._running = False
        try:
            self.schedule.shutdown()  # stops delivering, writes delayOffset.json
        except OSError as e:
            # Not lost, only delivered again after the restart: still not a clean stop.
            self.failures.record(self.schedule.name, e)
        try:
            self.timer.shutdown()  # stops delivering, writes config/timercheck
        except OSError as e:
            self.failures.record(self.timer.name, e)
        if self.expiry is not None:
            self.expiry.shutdown()
        self.commitlog.close_for_writes()
        for service in (self._group_commit, self._flush_commitlog):
            if service is not None:
                service.shutdown()
        self.dispatcher.shutdown(drain=True)  # the index catches up too
        assert self._checkpoint is not None
        if self._flush_cq is not None:
            self._flush_cq.shutdown()
        try:
            self._flush_for_shutdown(self._checkpoint)
        except OSError as e:
            self.failures.record("shutdown-flush", e)
        if self._offset_persister is not None:
            try:
                self._offset_persister.shutdown()  # writes the offsets one last time
            except OSError as e:
                # Commits answered OK would be lost: not a clean stop.
                self.failures.record(OffsetPersistService.name, e)
        try:
            self.pop.close()
        except OSError as e:
            self.failures.record("pop-journal", e)
        clean = self.dispatcher.stalled_reason is None and self.dispatcher.behind_bytes == 0
        self._close_files()
        failure = self.failures.first
        if failure is not None:
            # Nothing after the failure was vouched for: the next start must
            # recover as after a crash, from the last checkpoint written.
            log.error("shutdown after %s: leaving 'abort' for recovery", failure.describe())
        elif clean:
            remove_abort_file(self.config.abort_path)
        else:
            log.error("shutdown with the dispatcher behind: leaving 'abort' for recovery")
        self.shut_down_cleanly = failure is None and clean
        self._lock.release()
        return self.shut_down_cleanly

    def _flush_for_shutdown(self, checkpoint: StoreCheckpoint) -> None:
        """The last flushes of a stop: ConsumeQueues, index, then the CommitLog - but
        never the CommitLog again once its flush failed (a retried fsync that
        succeeds proves nothing), so the checkpoint vouches for nothing after it."""
        if self._flush_cq is not None:
            self._flush_cq.flush_now(final=True)
        if self.index is not None:
            self.index.shutdown()  # flushes every file: a clean exit keeps them all
            checkpoint.index_msg_timestamp = self.index.index_msg_timestamp_ms
            checkpoint.flush()
        flush_failed = {FlushCommitLogService.name, GroupCommitService.name}
        if not any(f.service in flush_failed for f in self.failures.failures):
            flush_commitlog(self.commitlog, checkpoint)

    def _load_index(self, last_exit_ok: bool, index_msg_timestamp_ms: int) -> None:
        """Load the IndexFiles. Damaged ones (the wrong size, a name that is no
        index file's) go to ``<root>/quarantine/``: the index is derived data,
        never a reason to refuse to start; :meth:`_catch_up_index` checks the
        rest once the CommitLog is recovered and rebuilds what is missing."""
        assert self.index is not None
        self.index.load(last_exit_ok, index_msg_timestamp_ms)

    def _new_index(self) -> IndexService:
        cfg = self.config
        return IndexService(
            cfg.store_path_root_dir,
            clock=self.clock,
            max_hash_slot_num=cfg.max_hash_slot_num,
            max_index_num=cfg.max_index_num,
            max_msgs_num_batch=cfg.max_msgs_num_batch,
        )

    def _dispatched_to(self) -> int:
        """Where everything built from the CommitLog has caught up: expiry may not
        delete a file past it."""
        reput = self.dispatcher.reput_from_offset
        return reput if self.index is None else min(reput, self.index.reput_offset)

    def _catch_up_index(self, report: RecoveryReport) -> None:
        """Check the index against the recovered CommitLog, then index what recovery
        re-dispatched and anything the index lost beyond.

        :meth:`IndexService.check` quarantines the first damaged file and all
        after it. The index resumes where the kept files end (a crash destroyed
        the file being written, so that may be well before the re-dispatch
        point: unlike RocketMQ, those records are indexed again rather than
        lost), or where re-dispatch started if that is earlier. Records already
        indexed are skipped by offset. :attr:`index_rebuild` says what happened.
        """
        assert self.index is not None
        dropped = self.index.check(self.commitlog)
        files = self.index.files
        if not files:
            # No index file (a first start, a crash destroyed the only one, which
            # with 20 M entries per file is the usual case, or all were damaged).
            start = self.commitlog.min_offset
        else:
            start = min(report.redispatch_from_offset, files[-1].end_phy_offset)
        start = max(start, self.commitlog.min_offset)
        self.index.reput_offset = start
        end = self.dispatcher.reput_from_offset
        self.index.build_from_commitlog(self.commitlog, end)
        self.index_rebuild = IndexRebuild(dropped, start, end)
        if dropped:
            log.warning(
                "index rebuilt from commitlog offset %d to %d after quarantining %s",
                start,
                end,
                [d.name for d in dropped],
            )
        self.dispatcher.followers.append(self.index)

    def _close_files(self) -> None:
        self.timer.close()
        if self.index is not None:
            self.index.close()
        if self._checkpoint is not None:
            self._checkpoint.close()
        self.commitlog.close()
        self.consume_queues.close()
        self.pop.close()

    @property
    def running(self) -> bool:
        return self._running

    @property
    def failure(self) -> StoreFailure | None:
        """The first background service failure (None while none failed)."""
        return self.failures.first

    @property
    def healthy(self) -> bool:
        """Running, and no background service has failed: sends can be taken."""
        return self._running and self.failures.first is None

    @property
    def checkpoint(self) -> StoreCheckpoint:
        """The checkpoint as it stands in memory (the file is written periodically)."""
        if self._checkpoint is None:
            raise StoreClosedError("the store has not been started")
        return self._checkpoint

    def __enter__(self) -> MessageStore:
        if not self._running:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.shutdown()

    # -- writes -----------------------------------------------------------------------

    def _append(
        self, batch: EncodedBatch | PutMessageResult
    ) -> tuple[PutMessageResult, int | None]:
        """Validate and append; returns the result and, under SYNC flush, the offset
        the caller must see fsynced before acknowledging (None otherwise).
        Refused batches write nothing."""
        unavailable = self._not_writable()
        if unavailable is not None:
            return unavailable, None
        if isinstance(batch, PutMessageResult):
            return batch, None
        refused = self._admission.check(batch)
        if refused is not None:
            return refused, None
        return self._append_checked(batch)

    def _append_checked(self, batch: EncodedBatch) -> tuple[PutMessageResult, int | None]:
        """:meth:`_append` for a batch that passed :meth:`Admission.check` (the coalescer
        checks each send as it is queued, and its groups keep what was checked)."""
        try:
            appended = self.commitlog.append(batch, self.clock)
        except ValueError as e:
            return _refused(PutStatus.MESSAGE_ILLEGAL, _malformed(batch, e)), None
        except StoreClosedError as e:
            return _refused(PutStatus.SERVICE_NOT_AVAILABLE, str(e)), None
        except OSError as e:
            log.exception("append failed")
            return _refused(PutStatus.CREATE_MAPPED_FILE_FAILED, f"cannot write: {e}"), None
        result = PutMessageResult(
            PutStatus.PUT_OK,
            physical_offsets=appended.physical_offsets,
            queue_offsets=appended.queue_offsets,
            sizes=appended.sizes,
            store_timestamp_ms=appended.store_timestamp_ms,
            store_host=self.commitlog.store_host,
        )
        return result, appended.end_offset if self._group_commit is not None else None

    def _flush_timeout(self, result: PutMessageResult, why: str) -> PutMessageResult:
        return result._replace(status=PutStatus.FLUSH_DISK_TIMEOUT, detail=why)

    def put_batch(self, batch: EncodedBatch) -> PutMessageResult:
        """Append a producer-encoded batch (see :mod:`basalt.store.batch`); under SYNC flush,
        wait for fsync. The batch is stamped in place: do not reuse it.

        Blocks the calling thread under SYNC flush: from an event loop use
        :meth:`put_batch_async`.
        """
        return self._await_flush(*self._append(batch))

    def put_messages(self, messages: Sequence[Message]) -> PutMessageResult:
        """Encode and append messages as consecutive records (see :meth:`put_batch`)."""
        return self._await_flush(*self._append(self._admission.encode(messages)))

    def put_message(self, message: Message) -> PutMessageResult:
        return self.put_messages([message])

    def put_internal(self, messages: Sequence[Message]) -> PutMessageResult:
        """:meth:`put_messages` for the store's own services (delay levels, timers,
        recall markers, transaction checks): once the records are appended (and
        fsynced under SYNC flush), every listener added with
        :meth:`add_internal_put_listener` is called, on this thread. A client's
        send is acknowledged by the service layer, which then moves what waits
        for it (a group's confirm offset); these puts have no caller there."""
        result = self.put_messages(messages)
        if result.status in (PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT):
            for listener in tuple(self._internal_put_listeners):
                try:
                    listener()
                except Exception:
                    log.exception("an internal put listener failed")
        return result

    def add_internal_put_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after each :meth:`put_internal` that appended: on the
        putting service's thread, so it must be quick and thread-safe (e.g.
        ``loop.call_soon_threadsafe``). A store-node's group member moves its
        confirm offset with it (docs/replication.md)."""
        self._internal_put_listeners.append(listener)

    def remove_internal_put_listener(self, listener: Callable[[], None]) -> None:
        """Undo :meth:`add_internal_put_listener` (nothing when it is not added)."""
        if listener in self._internal_put_listeners:
            self._internal_put_listeners.remove(listener)

    def set_schedule_enabled(self, enabled: bool) -> None:
        """Start (True) or stop delivering parked delayed and timer messages: a
        controller-mode store-node turns it on as master and off as slave
        (store.schedule, store.timer)."""
        self.schedule.enabled = self.timer.enabled = enabled
        self.schedule.wakeup()
        self.timer.wakeup()

    # -- timers (store.timer, docs/timers.md) -------------------------------------------

    def recall_timer(self, topic: str, deliver_ms: int, uniq_key: str) -> bool:
        """Cancel a pending timer message (RocketMQ 5.3's recall); False when it
        is not pending (delivered, or unknown while the index is on). Raises
        RecallFailed when the store cannot write the delete marker. Blocks
        (index look-up, a put): from an event loop use a thread."""
        return timer_api.recall(self.timer, self.index, topic, deliver_ms, uniq_key)

    def timer_status(
        self, topic: str | None = None, max_next_due: int = 0
    ) -> timer_api.TimerStatus:
        """Pending timers per topic with their next due times, and the scan
        position (store.timer.api.TimerStatus). Blocks: reads the wheel."""
        return timer_api.status(self.timer, topic, max_next_due)

    def timer_progress(self) -> bytes:
        """The timer's scan position and enqueue offset, for a slave to adopt."""
        return timer_api.progress(self.timer)

    def adopt_timer_progress(self, data: bytes) -> None:
        """A slave takes its master's :meth:`timer_progress` (store.timer.api.adopt).
        Raises ValueError for bytes that are not timer progress."""
        timer_api.adopt(self.timer, data)

    def _await_flush(self, result: PutMessageResult, flush_to: int | None) -> PutMessageResult:
        if flush_to is not None and self._group_commit is not None:
            try:
                self._group_commit.request(flush_to).result(
                    self.config.sync_flush_timeout_ms / 1000
                )
            except FutureTimeoutError:
                return self._flush_timeout(result, "fsync did not finish in time")
            except Exception as e:
                return self._flush_timeout(result, f"fsync failed: {e}")
        return result

    async def put_batch_async(self, batch: EncodedBatch) -> PutMessageResult:
        """:meth:`put_batch` for an event loop: the fsync wait never blocks the loop.

        Sends made during the same turn of the loop share one append and one
        fsync (see :mod:`basalt.store.coalesce`); each gets its own result.
        """
        return await self._coalescer().submit(batch)

    async def put_messages_async(self, messages: Sequence[Message]) -> PutMessageResult:
        """:meth:`put_messages` for an event loop (see :meth:`put_batch_async`)."""
        encoded = self._admission.encode(messages)
        if isinstance(encoded, PutMessageResult):
            return encoded
        return await self._coalescer().submit(encoded)

    def encode_messages(self, messages: Sequence[Message]) -> EncodedBatch | PutMessageResult:
        """Messages as one batch of records to append, or why they are refused."""
        return self._admission.encode(messages)

    def put_batch_then(
        self,
        batch: EncodedBatch,
        on_done: Callable[[PutMessageResult], None],
        *,
        alone: bool = False,
        sole: bool = False,
    ) -> None:
        """:meth:`put_batch_async` for a caller on the event loop that answers from a
        callback: ``on_done`` gets the result on the loop, from the write's own
        callback (one loop turn sooner than an awaiting coroutine resumes), or
        at once when the batch is refused. It must not raise. ``alone``: the
        caller queues no other send in this loop turn, and the batch may be
        written before this returns; ``sole``: no other caller sends now
        (:meth:`SendCoalescer.submit_then`)."""
        self._coalescer().submit_then(batch, on_done, alone=alone, sole=sole)

    def _coalescer(self) -> SendCoalescer:
        loop = asyncio.get_running_loop()
        last = self._last_coalescer
        if last is not None and last[0]() is loop:
            return last[1]
        coalescer = self._coalescers.get(loop)
        if coalescer is None:
            coalescer = self._coalescers[loop] = SendCoalescer(
                loop,
                refuse=self._refusal,
                append=self._append_checked,
                flush_wait=self._flush_wait_async,
                flush_failed=self._flush_timeout,
                flush_timeout_s=self.config.sync_flush_timeout_ms / 1000,
                # A group must fit one CommitLog file, as any batch must.
                max_group_bytes=min(MAX_GROUP_BYTES, self._admission.max_batch_bytes),
            )
        self._last_coalescer = (weakref.ref(loop), coalescer)
        return coalescer

    def _refusal(self, batch: EncodedBatch) -> PutMessageResult | None:
        return self._not_writable() or self._admission.check(batch)

    def _not_writable(self) -> PutMessageResult | None:
        """Why no send can be taken now (RocketMQ's "message store is not writeable")."""
        if not self._running:
            return _refused(PutStatus.SERVICE_NOT_AVAILABLE, "the store is not running")
        failure = self.failures.first
        if failure is not None:
            return _refused(
                PutStatus.SERVICE_NOT_AVAILABLE,
                f"{failure.describe()}; sends are refused until the store is restarted",
            )
        if self.expiry is not None and self.expiry.disk_full:
            return _refused(
                PutStatus.SERVICE_NOT_AVAILABLE,
                f"disk usage is over disk_space_warning_level_ratio "
                f"({self.config.disk_space_warning_level_ratio}%): sends are refused "
                f"until expired files are deleted",
            )
        return None

    def _flush_wait_async(self, end_offset: int) -> asyncio.Future[None]:
        assert self._group_commit is not None  # _append asks for a wait only under SYNC
        return self._group_commit.request_async(end_offset)

    # -- consumer offsets ---------------------------------------------------------------

    def commit_offset(
        self, group: str, topic: str, queue_id: int, offset: int, *, reset_epoch: int | None = None
    ) -> CommitResult:
        """Store a group's consume offset for a queue. A commit carrying a reset epoch
        older than the group's current one (a consumer that has not seen a reset
        yet) is refused with STALE_RESET_EPOCH and changes nothing."""
        return self.consumer_offsets.commit_offset(
            group, topic, queue_id, offset, reset_epoch=reset_epoch
        )

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset for a queue; -1 when it has none."""
        return self.consumer_offsets.query_offset(group, topic, queue_id)

    def reset_offset_by_time(
        self, group: str, topic: str, queue_ids: Iterable[int], timestamp_ms: int, *, force: bool
    ) -> tuple[dict[int, int], int]:
        """The broker half of RocketMQ's resetOffsetByTime (Broker2Client.resetOffset).

        Per queue: the offset by time (``timestamp_ms`` -1 means the max offset);
        without ``force`` a committed offset already earlier is kept. The new
        table is stored, the reset epoch bumped and the file written before
        this returns. Returns (queue id -> offset, new epoch).
        """
        table: dict[int, int] = {}
        for queue_id in queue_ids:
            if timestamp_ms == -1:
                by_time = self.get_max_offset_in_queue(topic, queue_id)
            else:
                by_time = max(0, self.get_offset_in_queue_by_time(topic, queue_id, timestamp_ms))
            current = self.query_offset(group, topic, queue_id)
            table[queue_id] = by_time if force or current < 0 or by_time < current else current
        # Pop groups: in-flight messages are dropped and cursors restart at the new
        # offsets, in one step with the reset so no pop commits an older offset between.
        epoch = self.pop.reset(
            group, topic, lambda: self.consumer_offsets.reset_offsets(group, topic, table)
        )
        # A reset must survive a crash right after it is acknowledged.
        self.consumer_offsets.persist()
        return table, epoch

    def delete_expired_files(self) -> ExpiryReport:
        """Delete expired files now, whatever the hour (mqadmin's
        deleteExpiredCommitLog); later runs of the service keep going for a while."""
        if self.expiry is None or not self._running:
            raise StoreClosedError("the store is not running")
        self.expiry.delete_manually(wake=False)  # this call runs the first round
        return self.expiry.run_once()

    def add_arrival_listener(self, listener: Callable[[str, int, int], None]) -> None:
        """Call ``listener(topic, queue_id, max_offset)`` whenever a queue grows, once
        its new units are readable (long polling). It runs on whichever thread
        dispatched - the dispatcher's or a writer's - so it must be quick and
        thread-safe (e.g. ``loop.call_soon_threadsafe``)."""
        self.dispatcher.arrival_listeners.append(listener)


def _malformed(batch: EncodedBatch, error: ValueError) -> str:
    """MESSAGE_ILLEGAL's detail for records the stamp refused: "malformed batch:
    record N (byte B of the batch): <why>" (``_records.stamp``'s words). A
    producer's batch of one record is one message - the SDK sends a lone message
    so - and is refused as a message is: "<why>" alone, the stamp's ``reason``
    (e.g. "body of N bytes exceeds max_message_size M", as :class:`Admission`
    words it)."""
    reason = getattr(error, "reason", None)
    data = batch.data
    one_record = len(data) >= 4 and int.from_bytes(data[:4], "big") == len(data)
    if reason is not None and batch.from_producer and one_record:
        return str(reason)
    return f"malformed batch: {error}"
