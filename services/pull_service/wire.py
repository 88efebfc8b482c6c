"""A PullBatchResponse serialized with its records copied once.

Built as protobuf objects, a GetMessages answer copies each queue's records
three times before gRPC sees them: into ``Records``, into the batch's
repeated field, and out again by ``SerializeToString``. At a megabyte or more
per answer those copies were a third of a store-node's work per pull.
:func:`pull_batch_wire` serializes each entry's small fields with protobuf
and writes the ``records`` field around the records bytes by hand, so one
``b"".join`` copies them into the answer. The field numbers come from the
descriptors; a test checks that the bytes parse to the message protobuf
would have built.

The wire format (protobuf's encoding guide): a length-delimited field is its
tag ``(number << 3) | 2``, the length as a varint, then the bytes; a varint
field is its tag ``(number << 3) | 0`` then the value. Fields may come in any
order, so an entry's records after its other fields parse the same.
"""

from __future__ import annotations

from collections.abc import Sequence

from google.protobuf.descriptor import Descriptor

from basalt.v1 import common_pb2 as pb

_LENGTH_DELIMITED = 2
_VARINT = 0


def _tag(message: Descriptor, field: str, wire_type: int) -> bytes:
    return varint(message.fields_by_name[field].number << 3 | wire_type)


def varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_RESULTS = _tag(pb.PullBatchResponse.DESCRIPTOR, "results", _LENGTH_DELIMITED)
_RECORDS = _tag(pb.PullResponse.DESCRIPTOR, "records", _LENGTH_DELIMITED)
_DATA = _tag(pb.Records.DESCRIPTOR, "data", _LENGTH_DELIMITED)
_COUNT = _tag(pb.Records.DESCRIPTOR, "count", _VARINT)


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
