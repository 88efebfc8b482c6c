"""Transactional messages: RocketMQ's half messages, op marks and check-back.

The store's part of RocketMQ's two-phase protocol (TransactionalMessageServiceImpl,
TransactionalMessageBridge, EndTransactionProcessor's store work), as a
library: no network. The store-node (services/store_node/transaction_rpcs.py)
decides who is asked and answers the RPCs. The records' shapes are in
store.transaction_records (re-exported here). docs/transactions.md is the reference.

* **Half.** :func:`half_message`: a transactional send (TRAN_MSG=true, PGROUP)
  is stored in :data:`TRANS_HALF_TOPIC` queue 0 with REAL_TOPIC / REAL_QID
  added and no transaction bits in SYSFLAG (RocketMQ's parseHalfMessageInner: a
  plain record of the system topic, so its ConsumeQueue indexes it). The
  topic has no topic config anywhere: no consumer can read it.
* **End.** :meth:`TransactionalMessageService.plan_end` checks an
  EndTransaction against the half (it must be a half, of that transaction id,
  of that producer group) and returns what to put, as ONE batch: for a commit
  the real message (:func:`committed_message`: back to REAL_TOPIC / REAL_QID,
  SYSFLAG COMMIT, PREPARED_TX_OFFSET = the half's CommitLog offset, the
  producer's body, TAGS, KEYS, UNIQ_KEY, born time and host kept) followed by
  the op mark; for a rollback the op mark alone. The op mark
  (:func:`op_mark`, RocketMQ's layout: tag ``d``, body the half's queue
  offset) is in :data:`TRANS_OP_HALF_TOPIC` queue 0. One batch is one append:
  a kill -9 leaves both records or neither (see "Crash" below).
  :meth:`~TransactionalMessageService.finish_end` records the outcome.
* **Check-back.** :meth:`~TransactionalMessageService.check_round` walks the
  half queue from its progress: a half whose transaction is resolved is
  passed; a half younger than ``transaction_timeout_ms`` (from its born time)
  ends the round (the later ones are younger); an older one is put again to
  the half queue with TRANSACTION_CHECK_TIMES + 1 and the copy is handed to
  ``ask`` (RocketMQ's putBackHalfMsgQueue then resolveHalfMsg): the re-put is
  what lets the progress move durably; the copy is the one the next round
  finds. One already checked ``transaction_check_max`` times goes to
  :data:`TRANS_CHECK_MAX_TIME_TOPIC` with a rollback op mark (RocketMQ's
  resolveDiscardMsg; RocketMQ writes no mark, so its halves there could still
  be committed by a late answer: Basalt's cannot). A group nobody listens to
  is not asked: its half is re-put with the same count, so the round moves on
  and the next round asks again.
* **Progress** is the consumer offset of group :data:`TRANS_CHECK_GROUP` on
  the half queue and on the op queue (RocketMQ's), in consumerOffset.json.

Resolutions are known by transaction id (UNIQ_KEY), not by offset: a half
and its re-put copies are one transaction, so an answer about any of them
resolves all, and a second answer is told what the first did (RocketMQ
commits a second time). The table lives in memory from the op queue's
progress onward (:meth:`~TransactionalMessageService.load` reads the marks
again at start) and forgets a transaction once the half progress has passed
every copy of it that could exist.

Crash: the commit's real message and its op mark are one append, so a kill
-9 leaves both or neither: neither is an unresolved half that check-back
resolves; both is done. A power loss under ASYNC flush can keep the first
page of the two and not the second; for halves stored before the store
started, a commit first looks for the transaction's committed record by its
UNIQ_KEY in the index and, found, writes only the mark (at most once while
the index is on; without it, at least once). Progress files lag: after a
crash the walk starts earlier and finds the same halves resolved (their
marks are read again) or asks again about unresolved ones: a check more,
never a message.

Concurrency: thread-safe. ``plan_end``/``finish_end`` run on the store-node's
loop, ``check_round`` in a worker thread; a transaction being ended is
skipped by the round (it waits for the next), and a second end while the
first is in flight is refused (:attr:`EndRefusal.BUSY`).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from basalt.common.message import (
    PROPERTY_PRODUCER_GROUP,
    TRANS_CHECK_GROUP,
    TRANS_CHECK_MAX_TIME_TOPIC,
    TRANS_HALF_TOPIC,
    TRANS_OP_HALF_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    Message,
    MessageRecord,
    transaction_type,
)
from basalt.common.record import decode_records
from basalt.store.commitlog import CommitLog
from basalt.store.errors import StoreError
from basalt.store.get_message import QueryMessageResult
from basalt.store.parking import real_destination
from basalt.store.put_result import PutMessageResult, PutStatus
from basalt.store.transaction_records import (
    HALF_QUEUE_ID,
    OP_QUEUE_ID,
    BadHalf,
    Resolution,
    check_max_message,
    check_times,
    committed_message,
    half_message,
    is_transactional,
    op_mark,
    parse_op_mark,
    rechecked_half,
    transaction_key,
)

log = logging.getLogger(__name__)

#: Puts retried next round rather than given up on.
_WRITTEN = frozenset(
    {PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT, PutStatus.FLUSH_SLAVE_TIMEOUT}
)


class EndRefusal(enum.Enum):
    """Why an EndTransaction was refused (nothing is stored)."""

    NO_SUCH_HALF = "no half message at that offset"
    WRONG_TRANSACTION = "the transaction id is not the half's"
    WRONG_GROUP = "the producer group is not the half's"
    CONFLICT = "the transaction was already resolved otherwise"
    BUSY = "an end of this transaction is in flight"


class EndRefused(StoreError):
    """An EndTransaction the store does not carry out (``why``), nothing stored."""

    def __init__(self, why: EndRefusal, detail: str) -> None:
        super().__init__(detail)
        self.why = why


@dataclass(frozen=True, slots=True)
class EndPlan:
    """What an EndTransaction puts (one batch), for :meth:`TransactionalMessageService.finish_end`.
    ``messages`` empty: nothing to put, ``done`` says what was done before."""

    key: str
    resolution: Resolution
    messages: tuple[Message, ...] = ()
    done: Resolution | None = None
    #: The committed record's result when the commit was made by this store run.
    done_result: PutMessageResult | None = None
    #: Where a commit goes (REAL_TOPIC, REAL_QID).
    destination: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class HalfCheck:
    """One check-back to hand to a producer group (the re-put copy)."""

    group: str
    transaction_id: str
    #: The copy's CommitLog offset and its raw record.
    physical_offset: int
    record: bytes
    check_times: int


@dataclass(slots=True)
class _Done:
    resolution: Resolution
    #: The half queue's end when it was resolved: no copy of it lies beyond, so
    #: once the progress passes this the entry may be forgotten.
    horizon: int
    result: PutMessageResult | None = None


@dataclass(slots=True)
class CheckReport:
    """What one :meth:`TransactionalMessageService.check_round` did."""

    passed: int = 0
    checked: int = 0
    unheard: int = 0
    check_max: int = 0


class _Store(Protocol):
    """What the service needs of its MessageStore (public API only)."""

    def put_internal(self, messages: Sequence[Message]) -> PutMessageResult: ...
    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int: ...
    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int: ...
    def get_message_by_queue_offset(
        self, topic: str, queue_id: int, queue_offset: int
    ) -> MessageRecord | None: ...
    def lookup_message_by_offset(self, physical_offset: int) -> MessageRecord | None: ...
    def query_offset(self, group: str, topic: str, queue_id: int) -> int: ...
    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> object: ...
    def query_message(
        self, topic: str, key: str, max_num: int, begin_timestamp_ms: int, end_timestamp_ms: int
    ) -> QueryMessageResult: ...

    @property
    def commitlog(self) -> CommitLog: ...


class TransactionalMessageService:
    """The half queue's bookkeeping over one store (see the module's doc)."""

    def __init__(
        self, store: _Store, *, now_ms: Callable[[], int], started_ms: int | None = None
    ) -> None:
        """``started_ms``: when the store started (default: now); halves stored
        before may have a commit whose op mark a crash lost."""
        self.store = store
        self.now_ms = now_ms
        self._lock = threading.Lock()
        self._done: dict[str, _Done] = {}
        #: (op queue offset, horizon) of the marks read or written, in op order.
        self._marks: deque[tuple[int, int]] = deque()
        self._ending: set[str] = set()
        #: One past the last copy the walk put to the half queue: a horizon counts
        #: it even before the dispatcher has (see _horizon).
        self._half_appended = 0
        #: Halves stored before this (the store's start, or this member becoming
        #: master) may have a commit without its mark.
        self._loaded_at_ms = now_ms() if started_ms is None else started_ms
        self.loaded = False

    # -- progress -----------------------------------------------------------------------

    def half_progress(self) -> int:
        """The next half queue offset the check walks from."""
        return self._progress(TRANS_HALF_TOPIC, HALF_QUEUE_ID)

    def _progress(self, topic: str, queue_id: int) -> int:
        offset = self.store.query_offset(TRANS_CHECK_GROUP, topic, queue_id)
        return max(offset, self.store.get_min_offset_in_queue(topic, queue_id), 0)

    def pending(self) -> int:
        """Half records past the progress (resolved ones included until passed)."""
        return max(
            0, self.store.get_max_offset_in_queue(TRANS_HALF_TOPIC, 0) - self.half_progress()
        )

    def load(self, *, since_ms: int | None = None) -> int:
        """Read the op marks from the op progress to the end (at start, or when this
        store becomes its group's master: ``since_ms`` then says when, see
        ``started_ms``); returns how many were read."""
        op_from = self._progress(TRANS_OP_HALF_TOPIC, OP_QUEUE_ID)
        op_end = self.store.get_max_offset_in_queue(TRANS_OP_HALF_TOPIC, OP_QUEUE_ID)
        horizon = self.store.get_max_offset_in_queue(TRANS_HALF_TOPIC, HALF_QUEUE_ID)
        done: dict[str, _Done] = {}
        marks: deque[tuple[int, int]] = deque()
        for op in range(op_from, op_end):
            record = self.store.get_message_by_queue_offset(TRANS_OP_HALF_TOPIC, OP_QUEUE_ID, op)
            if record is None:
                continue
            offsets, how = parse_op_mark(record)
            for q in offsets:
                half = self.store.get_message_by_queue_offset(TRANS_HALF_TOPIC, HALF_QUEUE_ID, q)
                if half is not None:
                    done[transaction_key(half)] = _Done(how, horizon)
            marks.append((op, horizon))
        with self._lock:
            self._done, self._marks = done, marks
            if since_ms is not None:
                self._loaded_at_ms = since_ms
            self.loaded = True
        return op_end - op_from

    # -- ending a transaction -----------------------------------------------------------

    def plan_end(
        self, physical_offset: int, transaction_id: str, group: str, resolution: Resolution
    ) -> EndPlan:
        """Check an EndTransaction of the half at ``physical_offset`` and say what to
        put (see :class:`EndPlan`); the caller puts ``messages`` as one batch and
        calls :meth:`finish_end` with the result, whatever it is. Raises
        :class:`EndRefused`. ``resolution`` is COMMIT or ROLLBACK."""
        half = self.store.lookup_message_by_offset(physical_offset)
        if half is None or half.topic != TRANS_HALF_TOPIC:
            raise EndRefused(
                EndRefusal.NO_SUCH_HALF, f"no half message at commitlog offset {physical_offset}"
            )
        if half.uniq_key != transaction_id:
            raise EndRefused(
                EndRefusal.WRONG_TRANSACTION,
                f"transaction id {transaction_id!r} is not the half's ({half.uniq_key!r})",
            )
        if half.properties.get(PROPERTY_PRODUCER_GROUP) != group:
            raise EndRefused(
                EndRefusal.WRONG_GROUP,
                f"producer group {group!r} is not the half's "
                f"({half.properties.get(PROPERTY_PRODUCER_GROUP)!r})",
            )
        try:
            destination = real_destination(half)
        except ValueError as e:
            raise EndRefused(EndRefusal.NO_SUCH_HALF, f"not a half message: {e}") from None
        key = transaction_key(half)
        with self._lock:
            done = self._done.get(key)
            if done is None and key in self._ending:
                raise EndRefused(EndRefusal.BUSY, f"transaction {key} is being ended: ask again")
            if done is None:
                self._ending.add(key)
        if done is not None:
            return _repeat(key, resolution, done, destination)
        try:
            return self._plan(half, key, resolution, destination)
        except BaseException:
            with self._lock:
                self._ending.discard(key)
            raise

    def _plan(
        self, half: MessageRecord, key: str, resolution: Resolution, where: tuple[str, int]
    ) -> EndPlan:
        if half.queue_offset < self.half_progress() and not self._pending_copy(key):
            # Every copy of it is behind the progress and it is not resolved in the
            # table: it was resolved long ago (and forgotten). Nothing to do.
            with self._lock:
                self._ending.discard(key)
            return EndPlan(key, resolution, done=Resolution.RESOLVED, destination=where)
        mark = op_mark(half.queue_offset, resolution)
        if resolution is not Resolution.COMMIT:
            return EndPlan(key, resolution, (mark,), destination=where)
        if half.store_timestamp_ms < self._loaded_at_ms and self._committed_before(half):
            # A commit whose mark a crash lost: write the mark only (at most once).
            return EndPlan(key, resolution, (mark,), done=Resolution.COMMIT, destination=where)
        return EndPlan(key, resolution, (committed_message(half), mark), destination=where)

    def finish_end(self, plan: EndPlan, result: PutMessageResult | None) -> None:
        """Record what :meth:`plan_end`'s batch did (``result`` None: nothing was put,
        or the put was abandoned). A refused put leaves the half unresolved."""
        with self._lock:
            self._ending.discard(plan.key)
            if not plan.messages or result is None or result.status not in _WRITTEN:
                return
            horizon = self._horizon()
            committed = result if len(plan.messages) == 2 else None
            self._done[plan.key] = _Done(plan.resolution, horizon, committed)
            self._marks.append((result.queue_offsets[-1], horizon))

    def _horizon(self) -> int:
        """Past every half copy stored so far (called under ``_lock``): the half
        queue's dispatched end, or the walk's last copy if not dispatched yet."""
        end = self.store.get_max_offset_in_queue(TRANS_HALF_TOPIC, HALF_QUEUE_ID)
        return max(end, self._half_appended)

    def _pending_copy(self, key: str) -> bool:
        """Whether a copy of transaction ``key`` lies at or past the progress."""
        end = self.store.get_max_offset_in_queue(TRANS_HALF_TOPIC, HALF_QUEUE_ID)
        for q in range(self.half_progress(), end):
            record = self.store.get_message_by_queue_offset(TRANS_HALF_TOPIC, HALF_QUEUE_ID, q)
            if record is not None and transaction_key(record) == key:
                return True
        return False

    def _committed_before(self, half: MessageRecord) -> bool:
        """Whether the index holds a committed record of ``half``'s transaction."""
        topic, _ = real_destination(half)
        found = self.store.query_message(
            topic, transaction_key(half), 32, half.born_timestamp_ms - 1000, self.now_ms()
        )
        return any(
            transaction_type(r.sys_flag) == TRANSACTION_COMMIT_TYPE and r.uniq_key == half.uniq_key
            for r in (decode_records(found.records, check_crc=False) if found.records else [])
        )

    # -- check-back ---------------------------------------------------------------------

    def check_round(
        self,
        *,
        timeout_ms: int,
        check_max: int,
        listening: Callable[[str], bool],
        ask: Callable[[HalfCheck], None],
        halted: Callable[[], bool] = lambda: False,
    ) -> CheckReport:
        """One walk of the half queue (see the module's doc). ``listening(group)``:
        whether a member of the producer group can be asked now; ``ask(check)``
        hands one check-back out, once its copy is stored (it must not block).
        Stops early when ``halted()`` turns true or a put is refused (the next
        round goes on from there)."""
        report = CheckReport()
        started = self.now_ms()
        end = self.store.get_max_offset_in_queue(TRANS_HALF_TOPIC, HALF_QUEUE_ID)
        q = self.half_progress()
        while q < end and not halted():
            half = self.store.get_message_by_queue_offset(TRANS_HALF_TOPIC, HALF_QUEUE_ID, q)
            if half is not None and not self._visit(
                half, started, (timeout_ms, check_max), listening, ask, report
            ):
                break
            q += 1
            self._advance(q)
        self._forget()
        return report

    def _visit(
        self,
        half: MessageRecord,
        started: int,
        limits: tuple[int, int],
        listening: Callable[[str], bool],
        ask: Callable[[HalfCheck], None],
        report: CheckReport,
    ) -> bool:
        """Handle one half; False ends the round with the progress at it.
        ``limits``: (transaction_timeout_ms, transaction_check_max)."""
        timeout_ms, check_max = limits
        key = transaction_key(half)
        with self._lock:
            if key in self._done:
                report.passed += 1
                return True
            if key in self._ending:
                return False  # an EndTransaction is putting it: look again next round
        # Age from the producer's born time (a copy keeps it); a born time in the
        # future (the producer's clock ahead) counts from when it was stored.
        age = started - min(half.born_timestamp_ms, half.store_timestamp_ms)
        if half.store_timestamp_ms >= started or age < timeout_ms:
            return False  # young (and every later one is younger)
        times = check_times(half)
        if times >= check_max:
            mark = op_mark(half.queue_offset, Resolution.CHECK_MAX)
            result = self.store.put_internal([check_max_message(half), mark])
            if result.status not in _WRITTEN:
                log.warning(
                    "moving half %s to %s: %s", key, TRANS_CHECK_MAX_TIME_TOPIC, result.detail
                )
                return False
            log.error(
                "transaction %s of group %s checked %d times: moved to %s and rolled back",
                key,
                half.properties.get(PROPERTY_PRODUCER_GROUP),
                times,
                TRANS_CHECK_MAX_TIME_TOPIC,
            )
            with self._lock:
                horizon = self._horizon()
                self._done[key] = _Done(Resolution.CHECK_MAX, horizon)
                self._marks.append((result.queue_offsets[-1], horizon))
            report.check_max += 1
            return True
        group = half.properties.get(PROPERTY_PRODUCER_GROUP, "")
        asked = listening(group)
        copy = rechecked_half(half, times + 1 if asked else times)
        result = self.store.put_internal([copy])
        if result.status not in _WRITTEN:
            log.warning("re-putting half %s for its check: %s", key, result.detail)
            return False
        with self._lock:
            self._half_appended = max(self._half_appended, result.queue_offsets[0] + 1)
            done = self._done.get(key)
            if done is not None:
                # Ended while the copy was being put: the copy is its, too.
                done.horizon = max(done.horizon, self._half_appended)
        if not asked:
            report.unheard += 1
            return True
        phy = result.physical_offsets[0]
        raw = self.store.commitlog.read(phy, result.sizes[0])
        ask(HalfCheck(group, half.uniq_key or key, phy, bytes(raw or b""), times + 1))
        report.checked += 1
        return True

    def _advance(self, offset: int) -> None:
        """Move the half progress (its consumer offset) to ``offset``."""
        self.store.commit_offset(TRANS_CHECK_GROUP, TRANS_HALF_TOPIC, HALF_QUEUE_ID, offset)

    def _forget(self) -> None:
        """After a round: drop the resolutions no half copy at or past the progress
        can need, and move the op progress past their marks. The half progress
        moved first, so a snapshot of consumerOffset.json taken between holds an
        older op progress (marks read again), never an older half progress with
        a newer op progress (marks lost for halves walked again)."""
        progress = self.half_progress()
        with self._lock:
            for key in [k for k, d in self._done.items() if d.horizon <= progress]:
                del self._done[key]
            passed = [op for op, horizon in self._marks if horizon <= progress]
            if not passed:
                return
            self._marks = deque(m for m in self._marks if m[1] > progress)
            # Marks may be recorded out of op order (ends finish as their puts do):
            # the progress stops at the first mark still needed.
            op = min(m[0] for m in self._marks) if self._marks else max(passed) + 1
        if op > self._progress(TRANS_OP_HALF_TOPIC, OP_QUEUE_ID):
            self.store.commit_offset(TRANS_CHECK_GROUP, TRANS_OP_HALF_TOPIC, OP_QUEUE_ID, op)

    def resolved(self, transaction_id: str) -> Resolution | None:
        """What was done with a transaction, as far as the table remembers."""
        with self._lock:
            done = self._done.get(transaction_id)
        return None if done is None else done.resolution


def _repeat(key: str, resolution: Resolution, done: _Done, destination: tuple[str, int]) -> EndPlan:
    """The answer to an end of a transaction already resolved: the same resolution
    (or an unknown one) is answered as done, nothing put; the other one is refused."""
    if done.resolution in (resolution, Resolution.RESOLVED):
        return EndPlan(
            key,
            resolution,
            done=done.resolution,
            done_result=done.result,
            destination=destination,
        )
    raise EndRefused(
        EndRefusal.CONFLICT,
        f"transaction {key} was already resolved: {done.resolution.value}, not {resolution.value}",
    )


__all__ = [
    "HALF_QUEUE_ID",
    "OP_QUEUE_ID",
    "BadHalf",
    "CheckReport",
    "EndPlan",
    "EndRefusal",
    "EndRefused",
    "HalfCheck",
    "Resolution",
    "TransactionalMessageService",
    "check_max_message",
    "check_times",
    "committed_message",
    "half_message",
    "is_transactional",
    "op_mark",
    "parse_op_mark",
    "rechecked_half",
    "transaction_key",
]
