"""The engine's reads of stored records, and the end-of-file blank.

The record layout (its byte table, the codec, the validation rules) is
:mod:`basalt.common.record`, shared with the SDK. What is here only the
engine needs: a CommitLog file's end-of-file blank, and reads of one field of
a record the store wrote, in place, without decoding the rest::

    blank:  [int TOTALSIZE: the free bytes][int MAGICCODE 0xCBD43194]

A file whose free tail cannot hold the next record plus an 8-byte blank ends
with that blank; the record goes to the next file.
"""

from __future__ import annotations

import struct

from basalt.common.message import BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG
from basalt.common.record import PREFIX, SIZE_AND_MAGIC, Buffer, host_length

#: The end-of-file blank: TOTALSIZE (the bytes it fills) + BLANK_MAGIC_CODE.
BLANK = SIZE_AND_MAGIC
#: A file keeps room for the end-of-file blank: TOTALSIZE(4) + MAGICCODE(4).
END_FILE_MIN_BLANK_LENGTH = BLANK.size

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_SHORT = struct.Struct(">h")
#: SYSFLAG's position: PREFIX ends with SYSFLAG (4) and BORNTIMESTAMP (8).
_SYSFLAG_AT = PREFIX.size - 12


def store_timestamp_at(buf: Buffer, pos: int = 0) -> int:
    """STORETIMESTAMP of the stored record at ``pos`` (RocketMQ's pickupStoreTimestamp)."""
    (sys_flag,) = _INT.unpack_from(buf, pos + _SYSFLAG_AT)
    (ts,) = _LONG.unpack_from(buf, pos + PREFIX.size + host_length(sys_flag, BORNHOST_V6_FLAG))
    return int(ts)


def body_length_at(pos: int, sys_flag: int) -> int:
    """Where BODYLEN of the record at ``pos`` is: past the fixed prefix and the
    hosts, whose lengths depend on ``sys_flag`` (the record's SYSFLAG)."""
    return (
        pos
        + PREFIX.size
        + host_length(sys_flag, BORNHOST_V6_FLAG)
        + 8  # STORETIMESTAMP
        + host_length(sys_flag, STOREHOSTADDRESS_V6_FLAG)
        + 12  # RECONSUMETIMES, PREPARED_TX_OFFSET
    )


def record_properties(buf: Buffer, pos: int = 0) -> bytes:
    """The raw properties block (``name\x01value\x02…``) of the record at ``pos``.

    Reads only the lengths on the way there; the record must be one that was
    stored (the pull path reads only records a ConsumeQueue points at).
    """
    (sys_flag,) = _INT.unpack_from(buf, pos + _SYSFLAG_AT)
    p = body_length_at(pos, sys_flag)
    (body_len,) = _INT.unpack_from(buf, p)
    p += 4 + body_len
    p += 1 + buf[p]  # TOPICLEN + TOPIC
    (props_len,) = _SHORT.unpack_from(buf, p)
    return bytes(buf[p + 2 : p + 2 + props_len])
