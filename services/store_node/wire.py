"""A PullBatchResponse serialized with its records copied once.

Built as protobuf objects, a GetMessages answer copies each queue's records
three times before gRPC sees them: into ``Records``, into the batch's
repeated field, and out again by ``SerializeToString``. At a megabyte or more
per answer those copies were a third of a store-node's work per pull.
:func:`pull_batch_wire` serializes each entry's small fields with protobuf
and writes the ``records`` field around the records bytes by hand, so one
``b"".join`` copies them into the answer. The field numbers come from the
descriptors; a test checks that the bytes parse to the message protobuf
would have built. The framing is :mod:`basalt.common.protowire`'s (fields may
come in any order, so an entry's records after its other fields parse the
same).
"""

from __future__ import annotations

from collections.abc import Sequence

from basalt.common.protowire import LENGTH_DELIMITED, VARINT, tag, varint
from basalt.v1 import common_pb2 as pb

_RESULTS = tag(pb.PullBatchResponse.DESCRIPTOR, "results", LENGTH_DELIMITED)
_RECORDS = tag(pb.PullResponse.DESCRIPTOR, "records", LENGTH_DELIMITED)
_DATA = tag(pb.Records.DESCRIPTOR, "data", LENGTH_DELIMITED)
_COUNT = tag(pb.Records.DESCRIPTOR, "count", VARINT)


def pull_batch_wire(entries: Sequence[tuple[pb.PullResponse, bytes | None, int]]) -> bytes:
    """The serialized PullBatchResponse whose i-th result is ``entries[i][0]``
    with ``records`` = Records(data=entries[i][1], count=entries[i][2]), or
    with ``records`` unset when ``entries[i][1]`` is None (a refused entry).
    The heads must not have ``records`` set themselves."""
    parts: list[bytes] = []
    for head, data, count in entries:
        head_bytes = head.SerializeToString()
        if data is None:
            parts += (_RESULTS, varint(len(head_bytes)), head_bytes)
            continue
        records: list[bytes] = []
        if data:
            records += (_DATA, varint(len(data)), data)
        if count:
            records += (_COUNT, varint(count))
        records_len = sum(map(len, records))
        records_prefix = _RECORDS + varint(records_len)
        entry_len = len(head_bytes) + len(records_prefix) + records_len
        parts += (_RESULTS, varint(entry_len), head_bytes, records_prefix, *records)
    return b"".join(parts)
