"""A batch of records as a producer encodes it (RocketMQ's MessageBatch).

The producer encodes every message in the CommitLog's own record layout
(:mod:`basalt.store.record`), back to back, with the fields only the broker knows
left for it: BODYCRC, QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP and
STOREHOSTADDRESS. The store never decodes such a batch into objects: it
validates every record and stamps those fields in place
(:func:`basalt.store._records.stamp`), then writes the whole buffer with one
``pwrite``. The CRC is always computed by the store, never taken from the
producer, so a wrong one can never reach the log and fail a later recovery.

A batch is split into *runs*: consecutive records of one (topic, queue id).
A batch from the wire (the store-node's ``SendBatch``) is one run, as in
RocketMQ, where a batch goes to one queue of one topic.

A producer builds that run with :func:`encode_batch`: the C encoder of
``basalt.store._records``, with :func:`encode_batch_py` (the same bytes, from
:class:`~store.record.EncodedMessage`) as its reference and fallback.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from basalt.store import _records
from basalt.store.message import PROPERTY_UNIQ_KEY, Message
from basalt.store.record import EncodedMessage, _host_parts


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


def encode_batch(
    messages: Sequence[Message],
    uniq_keys: Sequence[str],
    *,
    queue_id: int,
    store_host: bytes,
    born_timestamp_ms: int,
) -> bytes:
    """A producer's batch for one queue: each message as a record of
    :mod:`basalt.store.record`'s layout, back to back, ready for the store to stamp.

    Each message is encoded as sent: in queue ``queue_id``, with the UNIQ_KEY
    property set to its entry of ``uniq_keys`` (in place when the message has
    one, else after its own properties; then TAGS and KEYS as
    :meth:`Message.all_properties` adds them), born at ``born_timestamp_ms``
    unless it has a born timestamp, and the STOREHOSTADDRESS ``store_host``
    (:func:`basalt.store.message.encode_host`'s bytes). BODYCRC, QUEUEOFFSET,
    PHYSICALOFFSET and STORETIMESTAMP are 0: the store fills them.

    Returns exactly :func:`encode_batch_py`'s bytes and raises what it raises:
    the C encoder takes the common case (exact ``Message`` objects, str
    properties, bytes bodies) and hands anything else to it.
    """
    data = _records.encode_batch(
        messages, uniq_keys, queue_id, store_host, born_timestamp_ms, Message, _host_parts
    )
    if data is None:
        return encode_batch_py(
            messages,
            uniq_keys,
            queue_id=queue_id,
            store_host=store_host,
            born_timestamp_ms=born_timestamp_ms,
        )
    return data


def encode_batch_py(
    messages: Sequence[Message],
    uniq_keys: Sequence[str],
    *,
    queue_id: int,
    store_host: bytes,
    born_timestamp_ms: int,
) -> bytes:
    """The readable reference of :func:`encode_batch` (~10 us a message): each
    message as sent, through :class:`EncodedMessage`."""
    encoded = [
        EncodedMessage(
            dataclasses.replace(
                m,
                queue_id=queue_id,
                properties={**m.properties, PROPERTY_UNIQ_KEY: uniq},
                born_timestamp_ms=m.born_timestamp_ms or born_timestamp_ms,
            ),
            store_host=store_host,
            compute_crc=False,
        )
        for m, uniq in zip(messages, uniq_keys, strict=True)
    ]
    return bytes(EncodedBatch.of_messages(encoded).data)
