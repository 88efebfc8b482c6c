"""Recovery's side of the ConsumeQueues: check every queue against the recovered
CommitLog and the queue manifest, cut the damaged ones for re-dispatch, and keep
the offsets of records that are gone taken.

Called by :func:`basalt.store.recovery.recover` only, in this order:

1. :func:`check_against_manifest` - a queue the manifest
   (:mod:`basalt.store.queue_manifest`) lists that has no directory, or that
   ends before the offset listed, is damaged: a missing one is created (in
   memory; its first unit makes its file) so re-dispatch can rebuild it;
2. :func:`repair_consume_queues` - every queue is validated against the
   CommitLog and each damaged one cut at its first bad unit; the CommitLog
   offset each needs re-dispatching from is returned. A queue with nothing
   left (a missing directory) is re-dispatched from the CommitLog's first
   record: a walk of the whole log, paid only when a queue was lost;
3. (re-dispatch, by the dispatcher)
4. :func:`keep_lost_slots` - a lost record whose header still names it, and
   that was its queue's last, keeps its offset (a blank unit);
5. :func:`keep_known_offsets` - a queue that still ends before the offset the
   manifest lists (the CommitLog no longer holds those records: a deleted
   CommitLog file, expiry) is extended with blank units up to it, or, with no
   unit left, starts there (min = max = the offset listed). No queue offset
   the manifest vouched for is ever issued again.

Concurrency: recovery's thread only, before the dispatcher and writers start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from basalt.store.commitlog import CommitLog
from basalt.store.consume_queue import BLANK_UNIT_SIZE, ConsumeQueue
from basalt.store.consume_queue_table import ConsumeQueueTable
from basalt.store.resync import DamagedSpan

log = logging.getLogger(__name__)

#: ConsumeQueue units pointing into this much of the CommitLog's end are all
#: validated at start; units further back are sampled (see ConsumeQueue.validate).
VALIDATE_FULL_BYTES = 64 << 20
#: A lost record's queue offset is kept taken only this close to its queue's end: a
#: header damaged enough to name a far-off offset is not trusted with padding.
MAX_LOST_SLOTS_PADDED = 64


@dataclass(frozen=True, slots=True)
class QueueRebuild:
    """One damaged ConsumeQueue, and how recovery rebuilt it from the CommitLog."""

    topic: str
    queue_id: int
    #: What was wrong, in the order found.
    reasons: tuple[str, ...]
    #: Units dropped: damaged, after the damage, or pointing past the CommitLog's end.
    units_dropped: int
    #: Queue offsets below this were kept as they were.
    kept_to: int
    #: One past the last queue offset after re-dispatch: what the CommitLog holds.
    max_offset: int
    #: The CommitLog offset this queue needed re-dispatching from.
    redispatch_from: int


@dataclass(frozen=True, slots=True)
class KeptOffsets:
    """A queue whose offsets the manifest vouched for but the CommitLog no longer
    holds: they stay taken (blank units), so none is issued again."""

    topic: str
    queue_id: int
    #: One past the last offset the CommitLog gave the queue (0: it held none).
    from_offset: int
    #: The queue's max offset now: the manifest's (the next send gets it).
    to_offset: int
    #: Whether the queue had no readable unit left: its min is its max.
    emptied: bool


def check_against_manifest(
    consume_queues: ConsumeQueueTable,
    known: Mapping[tuple[str, int], int],
    damage: dict[ConsumeQueue, list[str]],
) -> int:
    """Mark the queues the manifest shows damaged; returns how many directories were
    missing.

    A queue ``known`` lists (topic, queue id → max offset) that was not loaded
    lost its directory: it is created, empty and without a file, with a reason
    in ``damage``. One that loaded but ends before the listed offset lost units
    at its end (a deleted last file, zeroed units): a reason too. Both are then
    re-dispatched by :func:`repair_consume_queues`. No system call
    (:meth:`ConsumeQueueTable.not_reaching`).
    """
    missing, short = consume_queues.not_reaching(known)
    for topic, queue_id in missing:
        cq = consume_queues.find_or_create(topic, queue_id)
        listed = known[topic, queue_id]
        damage[cq] = [f"its directory is missing (the manifest lists max offset {listed})"]
    for cq in short:
        damage.setdefault(cq, []).append(
            f"it ends at queue offset {cq.max_offset_in_queue} but the manifest lists "
            f"max offset {known[cq.topic, cq.queue_id]}"
        )
    return len(missing)


def repair_consume_queues(
    consume_queues: ConsumeQueueTable,
    commitlog: CommitLog,
    damage: dict[ConsumeQueue, list[str]],
    dropped_by: dict[ConsumeQueue, int],
) -> dict[ConsumeQueue, tuple[int, int]]:
    """Validate every queue against the recovered CommitLog and cut each damaged
    one at its first bad unit; returns, per queue to rebuild, (queue offsets
    kept, CommitLog offset to re-dispatch from). Adds to ``damage`` and
    ``dropped_by``."""
    full_from = commitlog.files.max_offset - VALIDATE_FULL_BYTES
    rebuild: dict[ConsumeQueue, tuple[int, int]] = {}
    for cq in consume_queues:
        reasons = damage.setdefault(cq, [])
        bad = cq.validate(commitlog.files, full_from)
        if bad is not None:
            offset, why = bad
            reasons.append(f"queue offset {offset}: {why}")
            dropped_by[cq] = dropped_by.get(cq, 0) + cq.truncate_to(offset)
        # Here, while validate() has the queue's file open (an LRU bounds open
        # files, and a second pass over 40,000 queues would reopen every one):
        # ConsumeQueue.recover() put the min at the queue's first real unit, and
        # only if that unit is gone (blanked, expired) is the queue read for the next.
        first = cq.get_unit(cq.min_offset_in_queue)
        if first is None or first[1] == BLANK_UNIT_SIZE or first[0] < commitlog.min_offset:
            cq.correct_min_offset(commitlog.min_offset)
        end_file = cq.files.last_file
        at_file_end = end_file is not None and end_file.is_full
        if reasons or at_file_end:
            # A queue ending exactly at a file's end may have lost its next file:
            # re-dispatching from its own end rebuilds nothing if it did not.
            phy = cq.max_physic_offset
            rebuild[cq] = (cq.max_offset_in_queue, phy if phy >= 0 else commitlog.min_offset)
    return rebuild


def keep_lost_slots(consume_queues: ConsumeQueueTable, spans: list[DamagedSpan]) -> None:
    """A lost record whose header still names its queue, and that was its queue's
    last (nothing after it took the next offset), keeps its offset taken: the
    queue gets a blank unit for it, so the offset is never issued again."""
    for span in spans:
        if span.topic is None or span.queue_id is None or span.queue_offset is None:
            continue
        cq = consume_queues.get(span.topic, span.queue_id)
        if cq is None and span.queue_offset == 0:
            cq = consume_queues.find_or_create(span.topic, span.queue_id)
        if cq is None:
            continue
        end = cq.max_offset_in_queue
        if end <= span.queue_offset < end + MAX_LOST_SLOTS_PADDED:
            cq.pad_to(span.queue_offset + 1)
            log.error(
                "consumequeue %s/%d: queue offset %d was the lost record's; kept taken",
                span.topic, span.queue_id, span.queue_offset,
            )  # fmt: skip


def keep_known_offsets(
    consume_queues: Iterable[ConsumeQueue], known: Mapping[tuple[str, int], int]
) -> tuple[KeptOffsets, ...]:
    """Extend every queue of ``consume_queues`` that ends before the max offset
    ``known`` lists for it up to that offset (:meth:`ConsumeQueue.keep_offsets_to`);
    each is logged at ERROR (its records are lost) and returned, by topic and
    queue id.

    Run after re-dispatch: what the CommitLog still holds is back in the queue
    by then, so only offsets whose records are gone are kept this way.
    Recovery passes the damaged queues only: a queue that loaded at or past its
    listed offset and was not found damaged is never cut. Costs the blank
    units written: at most what the queue held before.
    """
    kept: list[KeptOffsets] = []
    for cq in sorted(consume_queues, key=lambda q: (q.topic, q.queue_id)):
        max_offset = known.get((cq.topic, cq.queue_id), 0)
        have = cq.max_offset_in_queue
        if have >= max_offset:
            continue
        emptied = cq.keep_offsets_to(max_offset)
        kept.append(KeptOffsets(cq.topic, cq.queue_id, have, max_offset, emptied))
        log.error(
            "consumequeue %s/%d: the commitlog holds its records only up to queue offset %d, "
            "the manifest lists %d: offsets %d..%d are lost and stay taken (the next send "
            "gets %d%s)",
            cq.topic, cq.queue_id, have, max_offset, have, max_offset - 1, max_offset,
            "; nothing is left to read" if emptied else "",
        )  # fmt: skip
    return tuple(kept)


def rebuilt_queues(
    rebuild: dict[ConsumeQueue, tuple[int, int]],
    damage: dict[ConsumeQueue, list[str]],
    dropped_by: dict[ConsumeQueue, int],
) -> tuple[QueueRebuild, ...]:
    """The report's entries for the queues that were damaged or got units back, logged."""
    out: list[QueueRebuild] = []
    for cq, (kept_to, phy) in rebuild.items():
        reasons = damage.get(cq, [])
        dropped = dropped_by.get(cq, 0)
        max_offset = cq.max_offset_in_queue
        if not reasons and not dropped and max_offset == kept_to:
            continue  # ended at a file's end, and nothing was missing after it
        if not reasons:
            reasons = ["ended at a file's end: a later file was missing"]
        entry = QueueRebuild(
            cq.topic, cq.queue_id, tuple(reasons), dropped, kept_to, max_offset, phy
        )
        log.warning(
            "consumequeue %s/%d rebuilt from the commitlog: %s; kept offsets below %d, "
            "dropped %d units, re-dispatched from commitlog offset %d, now ends at %d",
            cq.topic, cq.queue_id, "; ".join(reasons), kept_to, dropped, phy, max_offset,
        )  # fmt: skip
        out.append(entry)
    return tuple(out)
