"""The CommitLog record: RocketMQ 4.x's layout, byte for byte (all big-endian),
and its codec.

The one definition of the layout, for both sides: the store writes and
validates records with it (:mod:`basalt.store.commitlog`, recovery), a pull
returns stored records as they are, and the SDK decodes them
(:func:`decode_records`) and encodes a producer's batch in the same layout
(:func:`encode_batch`). The per-record loops run in C
(:mod:`basalt.common._records`); the Python functions here are their readable
references, and tests hold the two to each other.

::

    offset  size     field
    ------  -------  ------------------------------------------------------
    0       4        TOTALSIZE            whole record, this field included
    4       4        MAGICCODE            0xDAA320A7
    8       4        BODYCRC              CRC32(body) & 0x7FFFFFFF
    12      4        QUEUEID
    16      4        FLAG
    20      8        QUEUEOFFSET          index in the ConsumeQueue
    28      8        PHYSICALOFFSET       offset of this record in the CommitLog
    36      4        SYSFLAG              see basalt.common.message
    40      8        BORNTIMESTAMP
    48      8 | 20   BORNHOST             ip(4|16) + port(4); 20 when SYSFLAG & 0x10
    ..      8        STORETIMESTAMP
    ..      8 | 20   STOREHOSTADDRESS     20 when SYSFLAG & 0x20
    ..      4        RECONSUMETIMES
    ..      8        PREPARED_TX_OFFSET
    ..      4 + n    BODYLEN + BODY
    ..      1 + n    TOPICLEN + TOPIC     UTF-8, at most 127 bytes
    ..      2 + n    PROPLEN + PROPERTIES name\\x01value\\x02…, at most 32767 bytes

Records Basalt writes end with RocketMQ 5's whole-record checksum
(``enabledAppendPropCRC``): the last 20 bytes of PROPERTIES are the property
``__CRC32#\\x01`` + 10 decimal digits + ``\\x02``, the digits the CRC32 (cleared
to a non-negative Java int) of every byte of the record before the property,
least significant digit first (``MessageDecoder.createCrc32``). It covers what
BODYCRC does not: the header (with the offsets and store time the store
assigns), the topic and the other properties. A record without it
(RocketMQ's by default, older Basalt's) is checked by BODYCRC alone.

A CommitLog file may end with a blank, ``[int free bytes][int 0xCBD43194]``
(:mod:`basalt.store.commitlog`), which :func:`check_record` tells from a record.

Besides the codec, reads of one field of a stored record in place, without
decoding the rest (:func:`store_timestamp_at`, :func:`record_properties`,
:func:`body_length_at`), and :func:`split_records`, which cuts a run of
stored records (a pull's answer) into views: the engine's hot paths, and the
admin tools reading what a store-node answered, use the same ones.
"""

from __future__ import annotations

import dataclasses
import functools
import mmap
import re
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from enum import Enum

from basalt.common import _records
from basalt.common.message import (
    BORNHOST_V6_FLAG,
    PROPERTY_UNIQ_KEY,
    STOREHOSTADDRESS_V6_FLAG,
    Message,
    MessageRecord,
    decode_host,
    decode_properties,
    encode_host,
    encode_properties,
    property_value,
)
from basalt.common.message import (
    PROPERTY_CRC32 as PROPERTY_CRC32,  # its name's home; read from here too
)

#: Anything ``struct.unpack_from`` and ``memoryview`` accept: bytes, mmap, bytearray.
Buffer = bytes | bytearray | memoryview | mmap.mmap

MESSAGE_MAGIC_CODE = 0xDAA320A7
BLANK_MAGIC_CODE = 0xCBD43194
#: Topic names are stored behind a 1-byte signed length.
MAX_TOPIC_LENGTH = 127
#: The characters of a topic name (RocketMQ's TopicValidator): the store's
#: admission and the metadata's name rules both check it.
TOPIC_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")
#: Properties are stored behind a 2-byte signed length.
MAX_PROPERTIES_SIZE = 32767

#: Why a record whose PROPERTIES end in a zero byte is corrupt. Every property
#: ends with ``\x02`` (RocketMQ's ``messageProperties2String``), so a zero there
#: is a lost page write that cleared the record's tail: with it went the
#: whole-record CRC32 property, which would otherwise have caught it (BODYCRC
#: does not cover the properties).
ZEROED_PROPERTIES = "PROPERTIES end in a zero byte (a lost write cleared the record's tail)"

#: The property up to its digits: name + NAME_VALUE_SEPARATOR.
CRC32_PREFIX = PROPERTY_CRC32.encode() + b"\x01"
#: RocketMQ's ``CommitLog.CRC32_RESERVED_LEN``: name, separator, 10 digits, separator.
CRC32_RESERVED_LEN = len(CRC32_PREFIX) + 10 + 1
#: The property as an encoder reserves it; the store writes the digits (stamp).
CRC32_RESERVED = CRC32_PREFIX + b"0" * 10 + b"\x02"


class CorruptRecordError(ValueError):
    """Bytes at a position do not decode as a record: a CommitLog the store
    cannot trust, or a pull answer the SDK cannot read.

    ``offset`` is where the bad record starts: a CommitLog offset when the store
    raises it, a position in the decoded bytes when the codec does.
    """

    def __init__(self, offset: int, reason: str) -> None:
        super().__init__(f"commitlog offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason


#: The fields every record starts with, up to BORNTIMESTAMP.
PREFIX = struct.Struct(
    ">"
    "i"  # TOTALSIZE
    "I"  # MAGICCODE
    "i"  # BODYCRC
    "i"  # QUEUEID
    "i"  # FLAG
    "q"  # QUEUEOFFSET
    "q"  # PHYSICALOFFSET
    "i"  # SYSFLAG
    "q"  # BORNTIMESTAMP
)
#: TOTALSIZE + MAGICCODE: enough to tell a record, a blank and empty space apart.
SIZE_AND_MAGIC = struct.Struct(">iI")
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_SHORT = struct.Struct(">h")


def _header_struct(born_v6: bool, store_v6: bool) -> struct.Struct:
    born = "16si" if born_v6 else "4si"  # BORNHOST: ip + port
    store = "16si" if store_v6 else "4si"  # STOREHOSTADDRESS: ip + port
    return struct.Struct(
        PREFIX.format
        + born
        + "q"  # STORETIMESTAMP
        + store
        + "i"  # RECONSUMETIMES
        + "q"  # PREPARED_TX_OFFSET
        + "i"  # BODYLEN
    )


#: Header structs indexed by (BORNHOST_V6, STOREHOSTADDRESS_V6).
HEADERS = {(b, s): _header_struct(b, s) for b in (False, True) for s in (False, True)}


def host_length(sys_flag: int, v6_flag: int) -> int:
    """Bytes of a host field: 20 (IPv6) when ``v6_flag`` is set in ``sys_flag``, else 8."""
    return 20 if sys_flag & v6_flag else 8


def record_size(body_len: int, topic_len: int, props_len: int, sys_flag: int = 0) -> int:
    """RocketMQ's ``calMsgLength``: the TOTALSIZE of a record with these parts."""
    return (
        PREFIX.size
        + host_length(sys_flag, BORNHOST_V6_FLAG)
        + 8
        + host_length(sys_flag, STOREHOSTADDRESS_V6_FLAG)
        + 4
        + 8
        + 4
        + body_len
        + 1
        + topic_len
        + 2
        + props_len
    )


#: The smallest possible record: no body, topic or properties.
MIN_RECORD_SIZE = record_size(0, 0, 0)


def body_crc(body: bytes) -> int:
    """BODYCRC: the CRC32 of the body, cleared to a non-negative Java int."""
    return zlib.crc32(body) & 0x7FFFFFFF


def crc32_property(crc: int) -> bytes:
    """The CRC32 property carrying ``crc`` (0 <= crc < 2**31), as RocketMQ's
    ``MessageDecoder.createCrc32`` writes it: 10 digits, least significant first."""
    digits = bytearray(10)
    for i in range(10):
        digits[i] = 0x30 + crc % 10
        crc //= 10
    return CRC32_PREFIX + bytes(digits) + b"\x02"


def has_crc32_property(props: Buffer) -> bool:
    """Whether a properties block ends with the CRC32 property (digits unchecked).

    Only the last property counts, as only the last one is the store's: the name
    must start the block or follow a ``\\x02``, so ``X__CRC32#`` never matches.
    """
    n = len(props)
    if n < CRC32_RESERVED_LEN or props[n - 1] != 2:
        return False
    start = n - CRC32_RESERVED_LEN
    if bytes(props[start : start + len(CRC32_PREFIX)]) != CRC32_PREFIX:
        return False
    return start == 0 or props[start - 1] == 2


def record_crc(record: Buffer) -> int:
    """The whole-record checksum of a record that carries the CRC32 property:
    CRC32 of every byte before the property, cleared to a non-negative Java int."""
    return zlib.crc32(memoryview(record)[: len(record) - CRC32_RESERVED_LEN]) & 0x7FFFFFFF


def fill_record_crc(record: bytearray | memoryview) -> None:
    """Write the digits of the CRC32 property ``record`` ends with (what stamp does in C)."""
    end = len(record)
    record[end - CRC32_RESERVED_LEN : end] = crc32_property(record_crc(record))


def _stored_crc(digits: bytes) -> int | None:
    """The CRC the property's 10 digits state (least significant first), or None
    if they are not all ASCII digits."""
    if not digits.isdigit():  # bytes.isdigit: ASCII 0-9 only
        return None
    return int(digits[::-1])


def properties_without_crc(raw: bytes) -> bytes:
    """A record's properties block as a reader decodes it: without the store's CRC32
    property (a checksum of the record, not something the producer sent)."""
    return raw[:-CRC32_RESERVED_LEN] if has_crc32_property(raw) else raw


# -- stored records, read in place ---------------------------------------------------

#: SYSFLAG's position in a record: PREFIX ends with SYSFLAG (4) and BORNTIMESTAMP (8).
_SYSFLAG_AT = PREFIX.size - 12


def split_records(records: Buffer) -> Iterator[memoryview]:
    """Each stored record of a back-to-back run (each starts with its TOTALSIZE),
    as a view of ``records``: a pull's or a query's answer, a read of the
    CommitLog. Trusts each TOTALSIZE (:func:`decode_records` checks them)."""
    view = memoryview(records)
    pos = 0
    while pos < len(view):
        (size, _) = SIZE_AND_MAGIC.unpack_from(view, pos)
        yield view[pos : pos + size]
        pos += size


def store_timestamp_at(buf: Buffer, pos: int = 0) -> int:
    """STORETIMESTAMP of the stored record at ``pos`` (RocketMQ's
    pickupStoreTimestamp), read without decoding the rest."""
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


def batch_has_property(records: bytes, *names: str) -> bool:
    """Whether a record of a producer's batch (records back to back, as
    :func:`encode_batch` writes them) carries one of the properties ``names``.

    A quick ``in`` test on the raw bytes first: most batches carry none, and
    then no record is walked. False for a malformed batch (the store's stamp
    refuses it with the reason), never an exception."""
    needles = [name.encode() for name in names]
    if not any(n + b"\x01" in records for n in needles):
        return False
    pos = 0
    try:
        while pos < len(records):
            size = int.from_bytes(records[pos : pos + 4], "big", signed=True)
            if size < MIN_RECORD_SIZE or pos + size > len(records):
                return False
            props = record_properties(records, pos)
            if any(property_value(props, n) is not None for n in needles):
                return True
            pos += size
    except (ValueError, IndexError, struct.error):
        return False
    return False


class EncodedMessage:
    """A message with everything but its offsets and store time encoded.

    Built by the sending thread (outside the put lock); the writer then calls
    :meth:`header` with the queue offset, physical offset and store timestamp
    it assigns, and writes ``header + body + tail``.
    """

    __slots__ = (
        "_args",
        "_fill_crc",
        "body",
        "properties",
        "queue_id",
        "size",
        "struct",
        "sys_flag",
        "tail",
        "topic",
    )

    def __init__(
        self,
        message: Message,
        *,
        store_host: bytes,
        properties: bytes | None = None,
        born_timestamp_ms: int | None = None,
        compute_crc: bool = True,
        append_crc: bool = False,
    ) -> None:
        """``compute_crc=False`` leaves BODYCRC (and the CRC32 property's digits)
        0 for the store to fill in (:func:`basalt.common._records.stamp`
        computes them for every record it appends). ``append_crc`` ends the
        properties with the CRC32 property (the store config's
        ``enabled_append_prop_crc``); :meth:`encode` fills its digits when
        ``compute_crc``, :meth:`header` never does (it cannot: the checksum
        covers the header it returns). Off by default: whether records carry
        it is the writer's policy (the store's config, the SDK's encode_batch)."""
        props = encode_properties(message.all_properties()) if properties is None else properties
        if append_crc:
            # RocketMQ's needAppendLastPropertySeparator: the reserved property
            # must follow a separator, or it would read as part of a value.
            if props and props[-1] != 2:
                props += b"\x02"
            props += CRC32_RESERVED
        topic_bytes = message.topic.encode("utf-8")
        born_ip, born_port = _host_parts(message.born_host)
        store_ip, store_port = _split_host(store_host)
        sys_flag = message.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
        if len(born_ip) == 16:
            sys_flag |= BORNHOST_V6_FLAG
        if len(store_ip) == 16:
            sys_flag |= STOREHOSTADDRESS_V6_FLAG
        body = message.body
        tail = bytes((len(topic_bytes) & 0xFF,)) + topic_bytes + _SHORT.pack(len(props)) + props
        header = HEADERS[len(born_ip) == 16, len(store_ip) == 16]
        size = header.size + len(body) + len(tail)
        self.topic = message.topic
        self.queue_id = message.queue_id
        self._fill_crc = append_crc and compute_crc
        self.sys_flag = sys_flag
        self.body = body
        self.properties = props
        self.tail = tail
        self.struct = header
        self.size = size
        # Header fields in order; slots 5, 6 and 11 are filled in by header().
        self._args: list[int | bytes] = [
            size,
            MESSAGE_MAGIC_CODE,
            zlib.crc32(body) & 0x7FFFFFFF if compute_crc else 0,
            message.queue_id,
            message.flag,
            0,  # QUEUEOFFSET
            0,  # PHYSICALOFFSET
            sys_flag,
            message.born_timestamp_ms if born_timestamp_ms is None else born_timestamp_ms,
            born_ip,
            born_port,
            0,  # STORETIMESTAMP
            store_ip,
            store_port,
            message.reconsume_times,
            message.prepared_transaction_offset,
            len(body),
        ]

    @property
    def body_crc(self) -> int:
        crc = self._args[2]
        assert isinstance(crc, int)
        return crc

    def header(self, queue_offset: int, physical_offset: int, store_timestamp_ms: int) -> bytes:
        """The record bytes before the body, with the writer's assignments filled in."""
        args = self._args
        args[5] = queue_offset
        args[6] = physical_offset
        args[11] = store_timestamp_ms
        return self.struct.pack(*args)

    def encode(self, queue_offset: int, physical_offset: int, store_timestamp_ms: int) -> bytes:
        """The whole record as bytes; with ``compute_crc`` and ``append_crc`` its
        CRC32 property is filled, as the store's stamp would."""
        record = b"".join(
            (self.header(queue_offset, physical_offset, store_timestamp_ms), self.body, self.tail)
        )
        if not self._fill_crc:
            return record
        filled = bytearray(record)
        fill_record_crc(filled)
        return bytes(filled)


_HOST_CACHE: dict[str, tuple[bytes, int]] = {}


@functools.lru_cache(maxsize=64)
def _split_host(raw: bytes) -> tuple[bytes, int]:
    """RocketMQ host bytes to (ip bytes, port)."""
    return raw[:-4], _INT.unpack_from(raw, len(raw) - 4)[0]


def _host_parts(address: str) -> tuple[bytes, int]:
    """``"ip:port"`` to (ip bytes, port), cached: a producer sends from few addresses."""
    parts = _HOST_CACHE.get(address)
    if parts is None:
        parts = _split_host(encode_host(address))
        if len(_HOST_CACHE) < 4096:
            _HOST_CACHE[address] = parts
    return parts


def decode_record(buf: Buffer, pos: int = 0) -> MessageRecord:
    """Decode the record at ``pos`` of ``buf``; raises CorruptRecordError if it is not one.

    Does not check the CRC: see :func:`check_record`.
    """
    view = memoryview(buf)
    try:
        size, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts = (
            PREFIX.unpack_from(view, pos)
        )
        if magic != MESSAGE_MAGIC_CODE:
            raise CorruptRecordError(pos, f"bad magic code 0x{magic:08X}")
        if size < MIN_RECORD_SIZE or pos + size > len(view):
            raise CorruptRecordError(
                pos, f"TOTALSIZE {size} but {len(view) - pos} bytes are available"
            )
        view = view[: pos + size]  # no field may reach past TOTALSIZE
        p = pos + PREFIX.size
        bh = host_length(sys_flag, BORNHOST_V6_FLAG)
        born_host = decode_host(bytes(view[p : p + bh]))
        p += bh
        (store_ts,) = _LONG.unpack_from(view, p)
        p += 8
        sh = host_length(sys_flag, STOREHOSTADDRESS_V6_FLAG)
        store_host = decode_host(bytes(view[p : p + sh]))
        p += sh
        (reconsume,) = _INT.unpack_from(view, p)
        (prepared,) = _LONG.unpack_from(view, p + 4)
        (body_len,) = _INT.unpack_from(view, p + 12)
        p += 16
        body = bytes(view[p : p + body_len])
        p += body_len
        topic_len = view[p]
        topic = bytes(view[p + 1 : p + 1 + topic_len]).decode("utf-8")
        p += 1 + topic_len
        (props_len,) = _SHORT.unpack_from(view, p)
        p += 2
        raw_props = bytes(view[p : p + props_len])
        props = decode_properties(properties_without_crc(raw_props))
        p += props_len
    except (struct.error, IndexError, ValueError) as e:
        if isinstance(e, CorruptRecordError):
            raise
        raise CorruptRecordError(pos, f"truncated or malformed record: {e}") from e
    if p - pos != size or len(body) != body_len or len(raw_props) != props_len:
        raise CorruptRecordError(pos, f"TOTALSIZE {size} but fields span {p - pos} bytes")
    return MessageRecord(
        store_size=size,
        body_crc=crc,
        queue_id=queue_id,
        flag=flag,
        queue_offset=queue_offset,
        commit_log_offset=phys,
        sys_flag=sys_flag,
        born_timestamp_ms=born_ts,
        born_host=born_host,
        store_timestamp_ms=store_ts,
        store_host=store_host,
        reconsume_times=reconsume,
        prepared_transaction_offset=prepared,
        body=body,
        topic=topic,
        properties=props,
    )


@dataclass(frozen=True, slots=True)
class DamagedRecord:
    """A record a reader left out because its checksum fails (check.crcs):
    its framing is sound, so the records after it are read, but its bytes are
    not what was written. Never delivered as data; each reader reports it
    (logged at ERROR, counted) and moves past it.

    ``position`` is where it starts in the decoded bytes; the other fields are
    as stored, and the damage may be in them ("record CRC mismatch": the
    header, topic or properties changed; "body CRC mismatch": the body did).
    """

    position: int
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    reason: str

    def describe(self) -> str:
        """One line for a log: which record, where, and why."""
        return (
            f"damaged record skipped: topic {self.topic!r} queue {self.queue_id} "
            f"offset {self.queue_offset} (commitlog offset {self.commit_log_offset}): "
            f"{self.reason}"
        )


def decode_records(
    data: Buffer, *, check_crc: bool = True, damaged: list[DamagedRecord] | None = None
) -> list[MessageRecord]:
    """Every record of ``data``, stored records back to back (what a pull
    returns), decoded: the consumer's per-record work, in one C call.

    ``check_crc`` (Kafka's ``check.crcs``, on by default) checks each record's
    checksum as :func:`check_record` does: a record that fails it is appended to
    ``damaged`` as a :class:`DamagedRecord` and left out of the result, or,
    with no ``damaged`` list, raises CorruptRecordError.

    Returns exactly what :func:`decode_records_py` returns, and raises what it
    raises: CorruptRecordError at the first record (its position in ``data``)
    that fails :func:`check_record`'s rules, or a tail too short to be one.
    Tests hold the two to each other.
    """
    return _records.decode_records(
        data, MessageRecord, decode_host, CorruptRecordError, check_crc, damaged, DamagedRecord
    )


def decode_records_py(
    data: Buffer, *, check_crc: bool = True, damaged: list[DamagedRecord] | None = None
) -> list[MessageRecord]:
    """The readable reference of :func:`decode_records`: each record validated by
    :func:`check_record` (its checksum too, with ``check_crc``), then decoded
    by :func:`decode_record`."""
    out = []
    pos = 0
    end = len(data)
    while pos < end:
        info = check_record(data, pos, end, check_crc=check_crc)
        if info.kind is RecordKind.MESSAGE:
            out.append(decode_record(data, pos))
            pos += info.size
        elif info.kind is RecordKind.CORRUPT and info.reason in CRC_REASONS:
            if damaged is None:
                raise CorruptRecordError(pos, info.reason)
            damaged.append(_damaged_at(data, pos, info.reason))
            pos += SIZE_AND_MAGIC.unpack_from(data, pos)[0]
        else:
            raise CorruptRecordError(pos, _not_a_message(data, pos, end, info))
    return out


#: check_record's reasons for a record whose framing is sound but whose checksum fails.
CRC_REASONS = frozenset(
    (
        "body CRC mismatch",
        "record CRC mismatch",
        "CRC32 property is not 10 digits",
        ZEROED_PROPERTIES,
    )
)


def _damaged_at(data: Buffer, pos: int, reason: str) -> DamagedRecord:
    """The :class:`DamagedRecord` of the framed record at ``pos`` (its fields as stored)."""
    _, _, _, queue_id, _, queue_offset, phys, sys_flag, _ = PREFIX.unpack_from(data, pos)
    p = body_length_at(pos, sys_flag)
    p += 4 + _INT.unpack_from(data, p)[0]  # BODYLEN + BODY
    topic = bytes(data[p + 1 : p + 1 + data[p]]).decode("utf-8", "replace")
    return DamagedRecord(pos, topic, queue_id, queue_offset, phys, reason)


def _not_a_message(data: Buffer, pos: int, end: int, info: RecordInfo) -> str:
    """Why the bytes at ``pos`` are not a record, in a run that holds only records."""
    if end - pos < SIZE_AND_MAGIC.size:
        return f"{end - pos} bytes left, too few for a record"
    if info.kind is RecordKind.CORRUPT:
        return info.reason
    # A blank or zeroes: fine at the end of a CommitLog file, not in a run of records.
    (_, magic) = SIZE_AND_MAGIC.unpack_from(data, pos)
    return f"bad magic code 0x{magic:08X}"


class RecordKind(Enum):
    MESSAGE = "message"
    BLANK = "blank"  # end-of-file filler: continue in the next file
    END = "end"  # zeroes: nothing was ever written here
    CORRUPT = "corrupt"


@dataclass(frozen=True, slots=True)
class RecordInfo:
    """What :func:`check_record` found at one position.

    For MESSAGE the routing fields are filled (``properties`` is the raw
    block, a CRC32 property included); for BLANK ``size`` is the blank's
    length; for CORRUPT ``reason`` says why.
    """

    kind: RecordKind
    size: int = 0
    reason: str = ""
    queue_id: int = 0
    queue_offset: int = 0
    physical_offset: int = 0
    sys_flag: int = 0
    store_timestamp_ms: int = 0
    topic: str = ""
    properties: bytes = b""


def check_record(
    buf: Buffer, pos: int, limit: int, *, check_crc: bool, expected_offset: int | None = None
) -> RecordInfo:
    """Validate the record at ``pos`` of ``buf`` without trusting any of it.

    ``limit`` is the end of the readable region; ``expected_offset`` the
    physical offset the record must carry (recovery knows where it is). Never
    raises on bad bytes: corruption is a CORRUPT result naming the reason.
    """
    if pos + SIZE_AND_MAGIC.size > limit:
        return RecordInfo(RecordKind.END)
    size, magic = SIZE_AND_MAGIC.unpack_from(buf, pos)
    if magic == BLANK_MAGIC_CODE:
        return RecordInfo(RecordKind.BLANK, size=size)
    if magic != MESSAGE_MAGIC_CODE:
        if size == 0 and magic == 0:
            return RecordInfo(RecordKind.END)
        return RecordInfo(RecordKind.CORRUPT, reason=f"bad magic code 0x{magic:08X}")
    if size < MIN_RECORD_SIZE or pos + size > limit:
        return RecordInfo(RecordKind.CORRUPT, reason=f"TOTALSIZE {size} out of range")
    view = memoryview(buf)[pos : pos + size]
    _, _, crc, queue_id, _, queue_offset, phys, sys_flag, _ = PREFIX.unpack_from(view, 0)
    p = PREFIX.size + host_length(sys_flag, BORNHOST_V6_FLAG)
    (store_ts,) = _LONG.unpack_from(view, p)
    p += 8 + host_length(sys_flag, STOREHOSTADDRESS_V6_FLAG) + 12
    if p + 4 > size:
        return RecordInfo(RecordKind.CORRUPT, reason="header longer than TOTALSIZE")
    (body_len,) = _INT.unpack_from(view, p)
    p += 4
    if body_len < 0 or p + body_len + 3 > size:
        return RecordInfo(RecordKind.CORRUPT, reason=f"BODYLEN {body_len} inconsistent")
    body_start = p
    p += body_len
    topic_len = view[p]
    if topic_len > MAX_TOPIC_LENGTH or p + 1 + topic_len + 2 > size:
        return RecordInfo(RecordKind.CORRUPT, reason=f"TOPICLEN {topic_len} inconsistent")
    topic_raw = bytes(view[p + 1 : p + 1 + topic_len])
    p += 1 + topic_len
    (props_len,) = _SHORT.unpack_from(view, p)
    p += 2
    if props_len < 0 or p + props_len != size:
        return RecordInfo(
            RecordKind.CORRUPT, reason=f"TOTALSIZE {size} but fields span {p + props_len} bytes"
        )
    if expected_offset is not None and phys != expected_offset:
        return RecordInfo(
            RecordKind.CORRUPT,
            reason=f"PHYSICALOFFSET {phys} but the record sits at {expected_offset}",
        )
    if check_crc:
        reason = _crc_mismatch(view, body_start, body_len, crc, view[p : p + props_len])
        if reason:
            return RecordInfo(RecordKind.CORRUPT, reason=reason)
    try:
        topic = topic_raw.decode("utf-8")
    except UnicodeDecodeError:
        return RecordInfo(RecordKind.CORRUPT, reason="topic is not UTF-8")
    return RecordInfo(
        RecordKind.MESSAGE,
        size=size,
        queue_id=queue_id,
        queue_offset=queue_offset,
        physical_offset=phys,
        sys_flag=sys_flag,
        store_timestamp_ms=store_ts,
        topic=topic,
        properties=bytes(view[p : p + props_len]),
    )


def _crc_mismatch(
    record: memoryview, body_start: int, body_len: int, crc: int, props: memoryview
) -> str:
    """Why ``record`` fails its checksum, or "" if it passes.

    A record carrying the CRC32 property is checked by it: it covers BODYCRC's
    bytes and the body too, so one pass over a sound record keeps recovery as
    fast as with BODYCRC alone; a mismatch then checks BODYCRC to say where the
    damage is ("body CRC mismatch" when the body or BODYCRC changed, else
    "record CRC mismatch"). A record without it (RocketMQ's, older Basalt's)
    is checked by BODYCRC alone, after :data:`ZEROED_PROPERTIES`' test: a
    record whose tail a lost write cleared has lost its CRC32 property too.
    """
    if len(props) and props[-1] == 0:
        return ZEROED_PROPERTIES
    if has_crc32_property(props):
        end = len(record)
        stored = _stored_crc(bytes(record[end - 11 : end - 1]))
        if stored is None:
            return "CRC32 property is not 10 digits"
        if record_crc(record) == stored:
            return ""
    elif zlib.crc32(record[body_start : body_start + body_len]) & 0x7FFFFFFF == crc:
        return ""
    if zlib.crc32(record[body_start : body_start + body_len]) & 0x7FFFFFFF != crc:
        return "body CRC mismatch"
    return "record CRC mismatch"


# -- a producer's batch -------------------------------------------------------------------


def encode_batch(
    messages: Sequence[Message],
    uniq_keys: Sequence[str],
    *,
    queue_id: int,
    store_host: bytes,
    born_timestamp_ms: int,
) -> bytes:
    """A producer's batch for one queue (RocketMQ's MessageBatch): each message
    as a record of this layout, back to back, ready for the store to stamp
    (see :mod:`basalt.store.batch`).

    Each message is encoded as sent: in queue ``queue_id``, with the UNIQ_KEY
    property set to its entry of ``uniq_keys`` (in place when the message has
    one, else after its own properties; then TAGS and KEYS as
    :meth:`Message.all_properties` adds them), born at ``born_timestamp_ms``
    unless it has a born timestamp, and the STOREHOSTADDRESS ``store_host``
    (:func:`basalt.common.message.encode_host`'s bytes). BODYCRC, QUEUEOFFSET,
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
    return b"".join(
        EncodedMessage(
            dataclasses.replace(
                m,
                queue_id=queue_id,
                properties={**m.properties, PROPERTY_UNIQ_KEY: uniq},
                born_timestamp_ms=m.born_timestamp_ms or born_timestamp_ms,
            ),
            store_host=store_host,
            compute_crc=False,
            append_crc=True,
        ).encode(0, 0, 0)
        for m, uniq in zip(messages, uniq_keys, strict=True)
    )
