"""Protobuf's wire format, for the messages Basalt serializes by hand.

Two hot paths write a message's bytes themselves rather than build protobuf
objects around a large bytes field and copy it twice: the producer's
``SendStreamRequest`` (:mod:`basalt.client.producer`) and the store-node's
``PullBatchResponse`` (:mod:`basalt.services.store_node.wire`). Both frame
the fields with these functions; tests hold their bytes to protobuf's own.

The encoding (protobuf's encoding guide)::

    varint field            tag(number << 3 | 0)  value as a varint
    length-delimited field  tag(number << 3 | 2)  length as a varint  bytes

A varint is base 128, least significant group first, the high bit set on
every byte but the last; an int32 below 0 is its 64-bit two's complement.
proto3 leaves out a scalar at its default (0, "") but writes a set oneof
member whatever its value. A repeated message field is one such field per
element, and fields may come in any order, so a message's bytes can be built
piece by piece. Field numbers come from the descriptors, never typed by hand.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor

#: Wire type of int32, int64, uint64, bool and enum fields.
VARINT = 0
#: Wire type of string, bytes and message fields (and packed repeated ones).
LENGTH_DELIMITED = 2


def varint(value: int) -> bytes:
    """Protobuf's base-128 varint of a non-negative int."""
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def tag(message: Descriptor, field: str, wire_type: int) -> bytes:
    """The encoded tag of ``message``'s field named ``field``: its number from the
    descriptor, shifted, with ``wire_type`` (:data:`VARINT` or :data:`LENGTH_DELIMITED`)."""
    return varint(message.fields_by_name[field].number << 3 | wire_type)
