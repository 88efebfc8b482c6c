"""Sends from one event loop that arrive together are appended together.

A store-node serves many producers from one asyncio loop. Each send on its
own would pay for a stamp call, a ``pwrite`` and, under SYNC flush, a
group-commit request and a wake-up. :class:`SendCoalescer` queues the sends
made during one turn of the loop and, in a callback scheduled for the next
turn, appends them as one batch (one ``pwrite``; records of the same queue
stamped by one call) and waits for one fsync; each send then gets its own
result: its own offsets, in the order it was queued.

A send is queued with a future to await (:meth:`SendCoalescer.submit`) or
with a callback the drain calls itself (:meth:`SendCoalescer.submit_then`):
a caller answering from that callback saves the loop turn that resuming an
awaiting coroutine costs - on an idle node, most of a lone send's time is
such turns.

A caller that queues no other send in its turn says so (``alone``): when
nothing else is ready to run in that turn either, the drain would group it
with nothing (what arrives meanwhile is read in later turns, after the drain
ran), so the send is written at once and the drain's turn - an ``epoll`` and
a pass of the loop - is saved. A busy loop keeps the next-turn drain, and the
grouping with it.

Semantics are those of separate sends: a refused send (bad topic, queue id,
size, a malformed producer batch) is answered alone and does not affect the
others; records of one send stay consecutive; a failed write or fsync fails
every send of the group, which is what happens to sends that share a write.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from basalt.store.batch import BatchRun, EncodedBatch
from basalt.store.put_result import PutMessageResult, PutStatus

#: A group is cut at this many bytes so that it always fits a CommitLog file.
MAX_GROUP_BYTES = 4 * 1024 * 1024

Append = Callable[[EncodedBatch], tuple[PutMessageResult, int | None]]
#: Called once with a send's result, on the loop's thread.
Settle = Callable[[PutMessageResult], None]
FlushWait = Callable[[int], "asyncio.Future[None]"]
Refusal = Callable[[EncodedBatch], PutMessageResult | None]
FlushFailure = Callable[[PutMessageResult, str], PutMessageResult]


class SendCoalescer:
    """Groups the sends of one event loop; used only from that loop's thread.

    ``refuse`` checks each send as it is queued; ``append`` writes a group of
    checked sends (which stays within ``max_group_bytes`` unless it is one send).
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        refuse: Refusal,
        append: Append,
        flush_wait: FlushWait,
        flush_failed: FlushFailure,
        flush_timeout_s: float,
        max_group_bytes: int = MAX_GROUP_BYTES,
    ) -> None:
        self._loop = loop
        self._refuse = refuse
        self._append = append
        self._flush_wait = flush_wait
        self._flush_failed = flush_failed
        self._flush_timeout_s = flush_timeout_s
        self._max_group_bytes = max_group_bytes
        self._pending: list[tuple[EncodedBatch, Settle]] = []

    def submit(self, batch: EncodedBatch) -> asyncio.Future[PutMessageResult]:
        """Queue a send; its future resolves once it is written (and fsynced under SYNC)."""
        fut: asyncio.Future[PutMessageResult] = self._loop.create_future()
        self.submit_then(batch, functools.partial(_resolve, fut))
        return fut

    def submit_then(
        self, batch: EncodedBatch, on_done: Settle, *, alone: bool = False, sole: bool = False
    ) -> None:
        """Queue a send; ``on_done`` gets its result once it is written (and fsynced
        under SYNC), called by the drain itself - or before this returns, when the
        send is refused. ``on_done`` must not raise: the sends grouped with this
        one are settled after it.

        ``alone``: the caller queues no other send before its turn ends. Then, if
        no send is queued and the loop has nothing else ready in this turn, the
        send is written before this returns (``on_done`` may be called before
        it returns, with the result; under SYNC, once the fsync is done).
        ``sole``: nor does any other caller send now (the one stream of sends to
        this store). It stands in for the loop's ready queue where that cannot
        be read (uvloop's): with no other sender, no other send can join the
        turn's group."""
        refused = self._refuse(batch)
        if refused is not None:
            on_done(refused)
            return
        if not self._pending:
            if alone and _alone_in_turn(self._loop, sole):
                self._write([(batch, on_done)])
                return
            self._loop.call_soon(self._drain)
        self._pending.append((batch, on_done))

    def _drain(self) -> None:
        pending, self._pending = self._pending, []
        group: list[tuple[EncodedBatch, Settle]] = []
        size = 0
        for item in pending:
            if group and size + len(item[0]) > self._max_group_bytes:
                self._write(group)
                group, size = [], 0
            group.append(item)
            size += len(item[0])
        if group:
            self._write(group)

    def _write(self, group: list[tuple[EncodedBatch, Settle]]) -> None:
        result, flush_to = self._append(_concat([batch for batch, _ in group]))
        if result.status is PutStatus.MESSAGE_ILLEGAL and len(group) > 1:
            # A malformed producer batch refuses the whole write (nothing is written):
            # send each alone so that only the bad one is refused.
            for item in group:
                self._write([item])
            return
        results = _split(result, group)
        if flush_to is None:
            for (_, settle), own in zip(group, results, strict=True):
                settle(own)
            return
        waiting = self._flush_wait(flush_to)
        timer = self._loop.call_later(self._flush_timeout_s, waiting.cancel)

        def flushed(done: asyncio.Future[None]) -> None:
            timer.cancel()
            if done.cancelled():
                why = "fsync did not finish in time"
            elif done.exception() is not None:
                why = f"fsync failed: {done.exception()}"
            else:
                why = ""
            for (_, settle), own in zip(group, results, strict=True):
                settle(own if not why else self._flush_failed(own, why))

        waiting.add_done_callback(flushed)


def _alone_in_turn(loop: asyncio.AbstractEventLoop, sole: bool) -> bool:
    """Whether no other send can join this turn's group: ``loop`` has no handle
    left to run in this turn (and none queued for the next), as asyncio's own
    loops show in ``_ready``; on another loop class (uvloop keeps its queue in
    C), ``sole``, the caller's word that nobody else sends now."""
    ready = getattr(loop, "_ready", None)
    return sole if ready is None else len(ready) == 0


def _resolve(fut: asyncio.Future[PutMessageResult], result: PutMessageResult) -> None:
    if not fut.done():  # its awaiter may have been cancelled
        fut.set_result(result)


def _concat(batches: list[EncodedBatch]) -> EncodedBatch:
    """One batch of all records, in order; adjacent runs of one queue merge."""
    if len(batches) == 1:
        return batches[0]
    runs: list[BatchRun] = []
    offset = 0
    for batch in batches:
        for run in batch.runs:
            last = runs[-1] if runs else None
            if (
                last is not None
                and last.end == offset + run.start
                and (last.topic, last.queue_id) == (run.topic, run.queue_id)
            ):
                runs[-1] = BatchRun(last.topic, last.queue_id, last.start, offset + run.end)
            else:
                runs.append(BatchRun(run.topic, run.queue_id, offset + run.start, offset + run.end))
        offset += len(batch.data)
    return EncodedBatch(
        bytearray(b"".join(batch.data for batch in batches)),
        runs,
        from_producer=any(batch.from_producer for batch in batches),
    )


def _split(
    result: PutMessageResult,
    group: list[tuple[EncodedBatch, Settle]],
) -> list[PutMessageResult]:
    """Each send's share of the group's result: its own records' offsets."""
    if len(group) == 1 or not result.physical_offsets:
        return [result] * len(group)
    shares: list[PutMessageResult] = []
    first = 0
    for batch, _ in group:
        # Records of a send are consecutive; count them by the group's sizes.
        end, count = first, 0
        while end < len(result.sizes) and count < len(batch.data):
            count += result.sizes[end]
            end += 1
        shares.append(
            type(result)(
                result.status,
                result.detail,
                result.physical_offsets[first:end],
                result.queue_offsets[first:end],
                result.sizes[first:end],
                result.store_timestamp_ms,
                result.store_host,
            )
        )
        first = end
    return shares
