"""Protobuf's wire format, for the messages Basalt serializes by hand.

Two hot paths write a message's bytes themselves rather than build protobuf
objects around a large bytes field and copy it twice: the producer's
``SendStreamRequest`` (:mod:`basalt.client.producer`) and the store-node's
``PullBatchResponse`` (:mod:`basalt.services.store_node.wire`). Both frame
the fields with :func:`varint` and :func:`tag`; tests hold their bytes to
protobuf's own. One reads them back the same way: Spark's source reads a
``PullBatchResponse`` with :func:`fields`, each record block a view of the
answer (:mod:`basalt.pipeline._cluster`), where protobuf's parse would copy
it twice.

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

from collections.abc import Iterator

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


class WireFormatError(ValueError):
    """A field of a wire type :func:`fields` does not read (``wire_type``)."""

    def __init__(self, wire_type: int) -> None:
        super().__init__(f"wire type {wire_type}: not readable")
        self.wire_type = wire_type


def read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    """The varint at ``buf[pos]`` and the position past it (:func:`varint` read
    back). Raises IndexError when ``buf`` ends inside it."""
    value = shift = 0
    while True:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def fields(buf: memoryview) -> Iterator[tuple[int, int | memoryview]]:
    """(field number, value) of each field of the serialized message ``buf``, in
    the order written: an int for a :data:`VARINT` field (read back as a signed
    64-bit int, so an int32 or int64 below 0 is negative again), a view of
    ``buf`` for a :data:`LENGTH_DELIMITED` one (no copy; a nested message is
    read by calling this again). Raises :class:`WireFormatError` on another
    wire type (fixed32/64: none of Basalt's hand-read messages has one)."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = read_varint(buf, pos)
        if key & 7 == VARINT:
            value, pos = read_varint(buf, pos)
            yield key >> 3, value - (1 << 64) if value >> 63 else value
        elif key & 7 == LENGTH_DELIMITED:
            size, pos = read_varint(buf, pos)
            yield key >> 3, buf[pos : pos + size]
            pos += size
        else:
            raise WireFormatError(key & 7)
