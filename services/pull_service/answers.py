"""What the pull-service does to a store-node's pull answer for a client that asks:
decode the records (``decode``) and cap a PullBatch's bytes (``max_bytes``).

Both work on answers already parsed; without either flag PullBatch passes the
store-node's bytes through untouched (the fast path, service.py). Decoding uses
the record codec the SDK and the engine share (:mod:`basalt.common.record`),
never a second decoder; the cap walks records by their TOTALSIZE and
QUEUEOFFSET with the same codec's :data:`~basalt.common.record.PREFIX`.
"""

from __future__ import annotations

from basalt.common.record import PREFIX, CorruptRecordError, DamagedRecord, decode_records
from basalt.services.errors import Refusal
from basalt.services.pull_service.metrics import damaged_records
from basalt.v1 import common_pb2 as pb


def decode_answer(answer: pb.PullResponse, *, call: str, broker: str) -> None:
    """Move ``answer``'s raw records into ``messages``, decoded, in place (a refused
    entry or one without records is left as it is). SYSTEM_ERROR when a record
    does not decode: the store-node sent something that is not a record.

    Each record's checksum is checked: one that fails is left out (damaged,
    never data), logged at ERROR and counted (``basalt.pull.records.damaged``
    for ``call``); ``next_begin_offset`` is the store-node's, past it."""
    data = answer.records.data
    if not data:
        return
    damaged: list[DamagedRecord] = []
    try:
        records = decode_records(data, damaged=damaged)
    except CorruptRecordError as e:
        raise Refusal(
            pb.RESPONSE_CODE_SYSTEM_ERROR, f"a pulled record does not decode: {e}"
        ) from None
    damaged_records(call, broker, damaged)
    answer.messages.extend(
        pb.StoredMessage(
            topic=r.topic,
            queue_id=r.queue_id,
            queue_offset=r.queue_offset,
            commit_log_offset=r.commit_log_offset,
            msg_id=r.msg_id,
            uniq_key=r.uniq_key or "",
            tags=r.tags or "",
            keys=r.keys,
            properties=r.properties,
            body=r.body,
            born_timestamp_ms=r.born_timestamp_ms,
            store_timestamp_ms=r.store_timestamp_ms,
            born_host=r.born_host,
            store_host=r.store_host,
            flag=r.flag,
            sys_flag=r.sys_flag,
            reconsume_times=r.reconsume_times,
            body_crc=r.body_crc,
            store_size_bytes=r.store_size,
        )
        for r in records
    )
    answer.ClearField("records")


def cap_bytes(answers: list[pb.PullResponse], max_bytes: int) -> None:
    """Cut ``answers`` (one PullBatch's, in entry order) in place so that their
    records total at most ``max_bytes`` stored bytes, except that the first
    record is always kept (pull_service.proto, PullBatchRequest.max_bytes).

    An entry cut short keeps the records that fit and resumes
    (``next_begin_offset``) at the first one left out; an entry whose records
    all go resumes at its first. Records skipped by a filter before the first
    one left out need not be scanned again, but the next read does so at no
    cost to correctness, which is what resuming at a record's own offset buys.
    """
    total = 0
    for answer in answers:
        records = answer.records
        data = records.data
        if not data:
            continue
        pos, kept = 0, 0
        while pos < len(data):
            size = PREFIX.unpack_from(data, pos)[0] if pos + PREFIX.size <= len(data) else 0
            if size < PREFIX.size or pos + size > len(data):
                raise Refusal(
                    pb.RESPONSE_CODE_SYSTEM_ERROR,
                    f"a pulled record at byte {pos} of {len(data)} has TOTALSIZE {size}",
                )
            if total > 0 and total + size > max_bytes:
                break
            total += size
            pos += size
            kept += 1
        if pos == len(data):
            continue
        # QUEUEOFFSET is PREFIX's sixth field: the first record left out.
        answer.next_begin_offset = PREFIX.unpack_from(data, pos)[5]
        records.data = data[:pos]
        records.count = kept
