"""A batch of records as the store appends it (RocketMQ's MessageBatch).

A producer encodes every message in the CommitLog's own record layout, back
to back (:func:`basalt.common.record.encode_batch`), with the fields only the
broker knows left for it: BODYCRC, QUEUEOFFSET, PHYSICALOFFSET,
STORETIMESTAMP and STOREHOSTADDRESS. The store never decodes such a batch into
objects: it validates every record and stamps those fields in place
(:func:`basalt.common._records.stamp`), then writes the whole buffer with one
``pwrite``. The CRC is always computed by the store, never taken from the
producer, so a wrong one can never reach the log and fail a later recovery.
A record whose topic is not the batch's or whose properties are not valid
UTF-8 is refused too (MESSAGE_ILLEGAL naming the record): a producer's
strings are UTF-8, and bytes that are not would be stored and then read back
changed (readers decode properties with ``errors="replace"``).

A batch is split into *runs*: consecutive records of one (topic, queue id).
A batch from the wire (the store-node's ``SendBatch``) is one run, as in
RocketMQ, where a batch goes to one queue of one topic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from basalt.common.record import EncodedMessage


@dataclass(frozen=True, slots=True)
class BatchRun:
    """Records ``data[start:end]`` all belong to ``topic`` / ``queue_id``."""

    topic: str
    queue_id: int
    start: int
    end: int


class EncodedBatch:
    """Encoded records and their runs. Owned by one send: the store stamps it in place."""

    __slots__ = ("data", "from_producer", "runs")

    def __init__(
        self, data: bytearray, runs: Sequence[BatchRun], *, from_producer: bool = False
    ) -> None:
        self.data = data
        self.runs = runs
        #: Bytes from a producer (a SendBatch): as in RocketMQ, a transactional
        #: message in such a batch is refused.
        self.from_producer = from_producer

    def __len__(self) -> int:
        return len(self.data)

    @classmethod
    def of_records(cls, topic: str, queue_id: int, records: bytes | bytearray) -> EncodedBatch:
        """A batch received as bytes (untrusted: the store validates every record)."""
        return cls(
            bytearray(records), (BatchRun(topic, queue_id, 0, len(records)),), from_producer=True
        )

    @classmethod
    def of_messages(cls, encoded: Sequence[EncodedMessage]) -> EncodedBatch:
        """Concatenate encoded messages, one run per stretch of the same (topic, queue id)."""
        parts: list[bytes] = []
        runs: list[BatchRun] = []
        topic: str | None = None
        queue_id = start = pos = 0
        for em in encoded:
            if em.topic != topic or em.queue_id != queue_id:
                if topic is not None:
                    runs.append(BatchRun(topic, queue_id, start, pos))
                topic, queue_id, start = em.topic, em.queue_id, pos
            parts += (em.header(0, 0, 0), em.body, em.tail)
            pos += em.size
        if topic is not None:
            runs.append(BatchRun(topic, queue_id, start, pos))
        return cls(bytearray(b"".join(parts)), runs)
