"""The master's side of the replication stream (docs/replication.md, "The
stream"): one :class:`ReplicationMaster` per master term, serving every
slave's ``Replication.Replicate`` stream, keeping the in-sync set and the
confirm offset, and answering the send path's "is it on the in-sync set".

RocketMQ's AutoSwitchHAService and AutoSwitchHAConnection, on grpc.aio: one
coroutine per slave writes frames, heartbeats and state; one task per slave
reads its acks; one maintenance task moves the confirm offset and the in-sync
set. The store is read on the event loop for a slave at the tail (the bytes
were just written: in the page cache) and in a worker thread for a slave
catching up (cold pages); the epoch entry of the term is fsynced in a thread.

Concurrency: every method runs on the event loop the master was started on;
:meth:`ReplicationMaster.notify_appended` too (the send path calls it after
each put, and the group member after the store's own puts - delay levels,
timers, transaction checks - both on the loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from basalt.services.store_node.ha.config import ReplicaAckMode, ReplicationConfig
from basalt.services.store_node.ha.refusals import bad_stream, not_master
from basalt.services.store_node.ha.sync_set import Clock, MonotonicClock, SyncSetBook
from basalt.services.store_node.ha.wire import entries_to_pb
from basalt.store import MessageStore
from basalt.store.config import FlushDiskType
from basalt.v1 import replication_pb2 as rpb

log = logging.getLogger(__name__)

#: A CAS of the group state's in-sync set (the integrator's, through etcd):
#: True when it committed, False when it lost (another writer, a newer epoch).
ChangeSyncStateSet = Callable[[frozenset[int]], Awaitable[bool]]

#: A slave further behind than this many batches reads in a worker thread.
_COLD_BATCHES = 1


class _Stream:
    """One slave's stream: who, where its frames are, and its wake-up."""

    def __init__(self, broker_id: int) -> None:
        self.broker_id = broker_id
        self.wake = asyncio.Event()
        #: Set when a newer stream of the same slave replaced this one.
        self.superseded = False


class ReplicationMaster:
    """The master of ``broker_name`` in ``epoch``: serves its slaves' streams.

    Lifecycle: construct, ``await start()`` (appends the term's epoch entry),
    point the ``Replication`` servicer at it, then per send ``refusal()``
    before the put, ``notify_appended()`` after it, ``await wait_acked()``
    under SYNC; ``await close()`` when the term ends (deposed, fenced,
    handover, shutdown).
    """

    def __init__(
        self,
        store: MessageStore,
        config: ReplicationConfig,
        broker_name: str,
        master_id: int,
        epoch: int,
        sync_state_set: frozenset[int],
        change_sync_state_set: ChangeSyncStateSet,
        *,
        clock: Clock | None = None,
    ) -> None:
        if epoch < 1:
            raise ValueError(f"epoch must be >= 1, got {epoch}")
        self.store = store
        self.config = config
        self.broker_name = broker_name
        self.master_id = master_id
        self.epoch = epoch
        self._change = change_sync_state_set
        self._clock = clock or MonotonicClock()
        self._book = SyncSetBook(master_id, sync_state_set, self._clock)
        self._streams: dict[int, _Stream] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = False
        self._closed = False
        self._sync_flush = store.config.flush_disk_type is FlushDiskType.SYNC_FLUSH

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Open the term: append ``(epoch, max offset)`` to the epoch file
        (fsynced, in a thread; skipped when the file already ends with this
        epoch, a restart within the term), start from the store's confirm
        offset, and start the maintenance task. The store must be at a record
        boundary (it is after recovery). Raises ValueError when the epoch file
        already holds a newer epoch (this master is stale)."""
        epochs = self.store.epochs
        last = epochs.last_epoch()
        if last > self.epoch:
            raise ValueError(
                f"{self.broker_name}: cannot lead epoch {self.epoch}, the epoch file "
                f"already holds epoch {last}"
            )
        if last < self.epoch:
            # An empty epoch file (a store that ran alone before) makes the
            # whole log the first term's: a slave then copies it from the start.
            first = self.store.max_offset if epochs.entries() else self.store.min_physical_offset
            await asyncio.to_thread(epochs.append, self.epoch, first)
        self._book.start_confirm(self.store.confirm_offset)
        self._started = True
        self._update_confirm()
        self._spawn(self._maintain(), "maintenance")
        log.info(
            "%s: master %d leads epoch %d from offset %d, in-sync set %s",
            self.broker_name,
            self.master_id,
            self.epoch,
            self.store.max_offset,
            sorted(self._book.sync_state_set),
        )

    async def close(self) -> None:
        """End the term: every stream ends refused NOT_MASTER, every waiting
        send answers False. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._book.release_all()
        for stream in self._streams.values():
            stream.wake.set()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _spawn(self, coro: Awaitable[Any], what: str) -> asyncio.Task[Any]:
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        task.set_name(f"replication-master-{self.broker_name}-{what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- the send path ------------------------------------------------------------------

    @property
    def sync_state_set(self) -> frozenset[int]:
        """The in-sync set as last committed."""
        return self._book.sync_state_set

    @property
    def pending_sync_state_set(self) -> frozenset[int] | None:
        """The set a CAS in flight would commit; None when none is."""
        return self._book.pending

    @property
    def confirm_offset(self) -> int:
        """What every counted member has; the store's dispatcher stops here."""
        return self._book.confirm_offset

    def refusal(self) -> str | None:
        """Why a send must be refused before it is written
        (IN_SYNC_REPLICAS_NOT_ENOUGH), or None when it may go ahead."""
        members = self._book.sync_state_set
        if len(members) < self.config.min_in_sync_replicas:
            return (
                f"{self.broker_name}: the in-sync set {sorted(members)} has "
                f"{len(members)} member(s), min_in_sync_replicas is "
                f"{self.config.min_in_sync_replicas}"
            )
        return None

    def notify_appended(self) -> None:
        """A put succeeded: wake the streams (no poll delay) and move the
        confirm offset (a set of the master alone confirms at once)."""
        self._update_confirm()
        self._wake_all()

    async def wait_acked(self, end_offset: int, timeout_s: float) -> bool:
        """SYNC: True once every member of the in-sync set (of both sets while a
        change is pending) has acked ``end_offset`` (the end of the send's
        records); False after ``timeout_s`` (answer FLUSH_SLAVE_TIMEOUT) or
        when the master closes. ASYNC: True at once."""
        if self.config.replica_ack_mode is ReplicaAckMode.ASYNC:
            return True
        if self._closed:
            return False
        return await self._book.wait_acked(end_offset, timeout_s)

    def slave_offsets(self) -> dict[int, int]:
        """Each slave that connected this term -> its acked offset (-1: none yet)."""
        return self._book.offsets()

    # -- the confirm offset and the in-sync set -------------------------------------------

    def _own_offset(self) -> int:
        return self.store.flushed_offset if self._sync_flush else self.store.max_offset

    def _update_confirm(self) -> None:
        if not self._started or self._closed:
            return
        before = self._book.confirm_offset
        after = self._book.compute_confirm(self._own_offset())
        if after != before:
            self.store.set_confirm_offset(after)
            self._wake_all()  # idle streams tell their slaves at once

    def _wake_all(self) -> None:
        for stream in self._streams.values():
            stream.wake.set()

    async def _maintain(self) -> None:
        interval_s = self.config.ha_heartbeat_interval_ms / 1000
        while True:
            self._update_confirm()
            self._maybe_change_set()
            await asyncio.sleep(interval_s)

    def _maybe_change_set(self) -> None:
        """Shrink the lagging members out and grow the caught-up slaves in: one
        CAS at a time; both sets count while it is in flight."""
        if self._closed or self._book.pending is not None:
            return
        current = self._book.sync_state_set
        lagging = self._book.lagging(
            self._clock.now_ms(),
            self.config.ha_max_time_slave_not_catchup_ms,
            self.store.max_offset,
        )
        wanted = (current - lagging) | (self._book.ready_to_join() & self._streams.keys())
        if wanted == current:
            return
        self._book.begin_change(wanted)
        log.info(
            "%s: in-sync set %s -> %s (lagging %s)",
            self.broker_name,
            sorted(current),
            sorted(wanted),
            sorted(lagging),
        )
        self._spawn(self._commit_change(wanted), "sync-state-set")

    async def _commit_change(self, wanted: frozenset[int]) -> None:
        committed = False
        try:
            committed = await self._change(wanted)
        except Exception:
            log.exception("%s: changing the in-sync set to %s failed", self.broker_name, wanted)
        finally:
            self._book.end_change(committed)
        if not committed:
            log.warning(
                "%s: the in-sync set stays %s (the change to %s lost its CAS)",
                self.broker_name,
                sorted(self._book.sync_state_set),
                sorted(wanted),
            )
        self._update_confirm()

    # -- one slave's stream -------------------------------------------------------------

    async def serve(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Serve one slave's stream on ``context`` (``context.read()`` and
        ``context.write()``) until it ends. Raises ReplicationRefused for what
        replication.proto's table refuses; returns when the slave hangs up or
        a newer stream of the same slave replaces this one."""
        if not self._started or self._closed:
            raise not_master(f"{self.broker_name}: member {self.master_id} is not the master")
        hello = await self._read(context, "hello")
        if not hello.HasField("hello"):
            raise bad_stream("the first message of a replication stream must be a hello")
        self._check_hello(hello.hello)
        broker_id = hello.hello.broker_id
        await context.write(
            rpb.ReplicaResponse(
                handshake=rpb.ReplicaHandshake(
                    master_id=self.master_id,
                    epoch=self.epoch,
                    max_offset=self.store.max_offset,
                    epochs=entries_to_pb(self.store.epochs.entries()),
                    min_offset=self.store.min_physical_offset,
                )
            )
        )
        first = await self._read(context, "the first ack")
        if not first.HasField("ack"):
            raise bad_stream("a replication stream's second message must be an ack")
        start = first.ack.offset
        self._check_start(broker_id, start)
        old = self._streams.get(broker_id)
        if old is not None:
            old.superseded = True
            old.wake.set()
        stream = self._streams[broker_id] = _Stream(broker_id)
        self._book.reconnected(broker_id)
        self._book.acked(broker_id, start, self.store.max_offset)
        self._update_confirm()
        log.info("%s: slave %d streams from offset %d", self.broker_name, broker_id, start)
        reader = self._spawn(self._read_acks(context, stream), f"acks-{broker_id}")
        try:
            await self._send(context, stream, start, reader)
        finally:
            reader.cancel()
            if self._streams.get(broker_id) is stream:
                del self._streams[broker_id]

    @staticmethod
    async def _read(context: grpc.aio.ServicerContext[Any, Any], what: str) -> rpb.ReplicaRequest:
        request = await context.read()
        if request is grpc.aio.EOF:
            raise bad_stream(f"the slave closed its stream before {what}")
        assert isinstance(request, rpb.ReplicaRequest)
        return request

    def _check_hello(self, hello: rpb.ReplicaHello) -> None:
        if hello.broker_name != self.broker_name:
            raise bad_stream(
                f"this is {self.broker_name}'s master; the slave belongs to {hello.broker_name!r}"
            )
        if hello.broker_id == self.master_id:
            raise bad_stream(f"broker id {hello.broker_id} is the master's own")
        seen = max((e.epoch for e in hello.epochs), default=0)
        if seen > self.epoch:
            raise not_master(
                f"{self.broker_name}: member {self.master_id} leads epoch {self.epoch}, "
                f"but slave {hello.broker_id} has seen epoch {seen}: this master is deposed"
            )

    def _check_start(self, broker_id: int, start: int) -> None:
        top = self.store.max_offset
        if start > top:
            raise bad_stream(
                f"slave {broker_id} would start at offset {start}, past the master's "
                f"max offset {top}: it did not truncate to its consistent point"
            )
        bottom = self.store.min_physical_offset
        if start < bottom:
            raise bad_stream(
                f"slave {broker_id} would start at offset {start}, but the master's "
                f"CommitLog begins at {bottom} (its older files expired): give the "
                f"slave a copy of a member's store root"
            )

    async def _read_acks(
        self, context: grpc.aio.ServicerContext[Any, Any], stream: _Stream
    ) -> None:
        """Record each ack of ``stream``; a bad ack ends the stream (the sender
        sees this task's error)."""
        while True:
            request = await context.read()
            if request is grpc.aio.EOF:
                return
            assert isinstance(request, rpb.ReplicaRequest)
            if stream.superseded or self._closed:
                return
            if not request.HasField("ack"):
                raise bad_stream("after the hello, a slave sends only acks")
            offset = request.ack.offset
            top = self.store.max_offset
            if offset > top:
                raise bad_stream(f"slave {stream.broker_id} acked {offset}, past {top}")
            try:
                self._book.acked(stream.broker_id, offset, top)
            except ValueError as error:
                raise bad_stream(str(error)) from None
            self._update_confirm()
            self._maybe_change_set()

    async def _send(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        stream: _Stream,
        offset: int,
        reader: asyncio.Task[None],
    ) -> None:
        """Frames from ``offset`` while there is something to send; heartbeats
        and state on their intervals (the loop's clock: the injected one
        measures catch-up only); ends when the reader does or the term."""
        loop = asyncio.get_running_loop()
        heartbeat_ms = self.config.ha_heartbeat_interval_ms
        state_ms = self.config.ha_offset_sync_interval_ms
        now = loop.time() * 1000
        next_state = now  # a (re)joining slave gets the offsets at once
        next_heartbeat = now + heartbeat_ms
        told_confirm = -2
        while True:
            if reader.done():
                reader.result()  # a bad ack: raise its refusal
                return  # the slave hung up
            if self._closed:
                raise not_master(f"{self.broker_name}: member {self.master_id} ended its term")
            if stream.superseded:
                return
            stream.wake.clear()
            now = loop.time() * 1000
            if now >= next_state:
                state = await asyncio.to_thread(self.store.replica_state)
                await context.write(
                    rpb.ReplicaResponse(state=rpb.ReplicaState(replica_state=state))
                )
                next_state = now + state_ms
                continue
            top = self.store.max_offset
            if offset < top:
                frame = await self._frame(offset, top)
                await context.write(rpb.ReplicaResponse(frame=frame))
                self._book.sent(stream.broker_id, top)
                offset += len(frame.data)
                told_confirm = frame.confirm_offset
                next_heartbeat = loop.time() * 1000 + heartbeat_ms
                continue
            confirm = self._book.confirm_offset
            if confirm != told_confirm or now >= next_heartbeat:
                await context.write(
                    rpb.ReplicaResponse(
                        heartbeat=rpb.ReplicaHeartbeat(
                            confirm_offset=confirm, master_max_offset=top, epoch=self.epoch
                        )
                    )
                )
                told_confirm = confirm
                next_heartbeat = now + heartbeat_ms
                continue
            wait_ms = max(1.0, min(next_heartbeat, next_state) - now)
            waking = asyncio.ensure_future(stream.wake.wait())
            try:
                await asyncio.wait(
                    {waking, reader}, timeout=wait_ms / 1000, return_when="FIRST_COMPLETED"
                )
            finally:
                waking.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await waking

    async def _frame(self, offset: int, top: int) -> rpb.ReplicaFrame:
        """The frame at ``offset``: bytes of the epoch holding ``offset``, up to
        that epoch's end (the next one's start), one CommitLog file and
        ha_transfer_batch_size_bytes."""
        entries = self.store.epochs.entries()
        holder = None
        for entry in entries:
            if entry.start_offset <= offset and (entry.end_offset < 0 or offset < entry.end_offset):
                holder = entry
        if holder is None:
            raise bad_stream(f"offset {offset} is in none of the master's epochs {entries}")
        end = top if holder.end_offset < 0 else min(holder.end_offset, top)
        batch = self.config.ha_transfer_batch_size_bytes
        if end - offset > batch * _COLD_BATCHES:
            data = await asyncio.to_thread(self.store.read_for_transfer, offset, batch, end)
        else:
            data = self.store.read_for_transfer(offset, batch, end)
        if not data:
            raise RuntimeError(f"the CommitLog gave no bytes at {offset} (up to {end})")
        return rpb.ReplicaFrame(
            offset=offset,
            epoch=holder.epoch,
            epoch_start_offset=holder.start_offset,
            confirm_offset=self._book.confirm_offset,
            data=data,
        )
