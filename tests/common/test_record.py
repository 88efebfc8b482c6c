"""common.record: the CommitLog record layout, byte for byte, and corruption detection."""

from __future__ import annotations

import ipaddress
import struct
import zlib

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from basalt.common.message import (
    BORNHOST_V6_FLAG,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    Message,
    encode_host,
    encode_properties,
    offset_msg_id,
)
from basalt.common.record import (
    BLANK_MAGIC_CODE,
    MESSAGE_MAGIC_CODE,
    CorruptRecordError,
    EncodedMessage,
    RecordKind,
    body_crc,
    check_record,
    decode_record,
    record_size,
)
from tests.support.strategies import (
    INT64,
    MAX_PROPERTIES_SIZE,
    hosts,
    messages,
    properties_of_size,
)


def cal_msg_length(sys_flag: int, body_length: int, topic_length: int, props_length: int) -> int:
    """RocketMQ 4.x ``CommitLog.calMsgLength``, transcribed field by field."""
    bornhost_length = 8 if (sys_flag & BORNHOST_V6_FLAG) == 0 else 20
    storehost_length = 8 if (sys_flag & STOREHOSTADDRESS_V6_FLAG) == 0 else 20
    return (
        4  # TOTALSIZE
        + 4  # MAGICCODE
        + 4  # BODYCRC
        + 4  # QUEUEID
        + 4  # FLAG
        + 8  # QUEUEOFFSET
        + 8  # PHYSICALOFFSET
        + 4  # SYSFLAG
        + 8  # BORNTIMESTAMP
        + bornhost_length  # BORNHOST
        + 8  # STORETIMESTAMP
        + storehost_length  # STOREHOSTADDRESS
        + 4  # RECONSUMETIMES
        + 8  # Prepared Transaction Offset
        + 4
        + max(body_length, 0)  # BODY
        + 1
        + topic_length  # TOPIC
        + 2
        + max(props_length, 0)  # propertiesLength
    )


# -- round trips -------------------------------------------------------------------------


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    message=messages(),
    store_host=hosts,
    queue_offset=INT64,
    physical_offset=INT64,
    store_ts=INT64,
)
@example(
    message=Message(topic="", body=b""),
    store_host="127.0.0.1:10911",
    queue_offset=0,
    physical_offset=0,
    store_ts=0,
)
@example(
    message=Message(
        topic="t" * 127, body=b"", properties=properties_of_size(MAX_PROPERTIES_SIZE, "😀")
    ),
    store_host="[::1]:10911",
    queue_offset=2**63 - 1,
    physical_offset=2**63 - 1,
    store_ts=2**63 - 1,
)
def test_encode_then_decode_round_trips_every_field(
    message: Message, store_host: str, queue_offset: int, physical_offset: int, store_ts: int
) -> None:
    encoded = EncodedMessage(message, store_host=encode_host(store_host))
    raw = encoded.encode(queue_offset, physical_offset, store_ts)

    record = decode_record(raw)

    expected_sys_flag = message.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
    if message.born_host.startswith("["):
        expected_sys_flag |= BORNHOST_V6_FLAG
    if store_host.startswith("["):
        expected_sys_flag |= STOREHOSTADDRESS_V6_FLAG
    assert record.sys_flag == encoded.sys_flag == expected_sys_flag
    assert record.topic == message.topic
    assert record.body == message.body
    assert record.queue_id == message.queue_id
    assert record.flag == message.flag
    assert record.queue_offset == queue_offset
    assert record.commit_log_offset == physical_offset
    assert record.born_timestamp_ms == message.born_timestamp_ms
    assert record.born_host == message.born_host
    assert record.store_timestamp_ms == store_ts
    assert record.store_host == store_host
    assert record.reconsume_times == message.reconsume_times
    assert record.prepared_transaction_offset == message.prepared_transaction_offset
    assert record.properties == message.all_properties()
    assert record.body_crc == zlib.crc32(message.body) & 0x7FFFFFFF == body_crc(message.body)
    assert record.msg_id == offset_msg_id(encode_host(store_host), physical_offset)

    topic_len = len(message.topic.encode("utf-8"))
    props_len = len(encode_properties(message.all_properties()))
    assert props_len <= MAX_PROPERTIES_SIZE
    (total_size,) = struct.unpack_from(">i", raw, 0)
    assert total_size == len(raw) == record.store_size == encoded.size
    assert total_size == record_size(len(message.body), topic_len, props_len, expected_sys_flag)
    assert total_size == cal_msg_length(expected_sys_flag, len(message.body), topic_len, props_len)

    info = check_record(raw, 0, len(raw), check_crc=True, expected_offset=physical_offset)
    assert info.kind is RecordKind.MESSAGE
    assert (info.size, info.topic, info.queue_id) == (len(raw), message.topic, message.queue_id)
    assert (info.queue_offset, info.physical_offset) == (queue_offset, physical_offset)
    assert (info.sys_flag, info.store_timestamp_ms) == (expected_sys_flag, store_ts)
    assert info.properties == encode_properties(message.all_properties())


def test_header_plus_body_plus_tail_is_the_whole_record() -> None:
    encoded = EncodedMessage(
        Message(topic="T", body=b"payload", tags="a"), store_host=encode_host("10.0.0.1:10911")
    )
    raw = encoded.encode(5, 1234, 99)
    assert encoded.header(5, 1234, 99) + encoded.body + encoded.tail == raw
    assert encoded.body_crc == zlib.crc32(b"payload") & 0x7FFFFFFF


def test_record_decodes_at_a_position_inside_a_larger_buffer() -> None:
    first = EncodedMessage(Message(topic="A", body=b"1"), store_host=encode_host("1.1.1.1:1"))
    second = EncodedMessage(Message(topic="B", body=b"22"), store_host=encode_host("1.1.1.1:1"))
    buf = bytearray(first.encode(0, 0, 1) + second.encode(0, first.size, 2) + bytes(64))

    record = decode_record(buf, first.size)

    assert (record.topic, record.body, record.commit_log_offset) == ("B", b"22", first.size)


def test_explicit_properties_bytes_and_born_timestamp_override_the_message() -> None:
    message = Message(topic="T", body=b"x", tags="ignored", born_timestamp_ms=1)
    props = encode_properties({"UNIQ_KEY": "ABC"})
    encoded = EncodedMessage(
        message, store_host=encode_host("1.2.3.4:5"), properties=props, born_timestamp_ms=77
    )
    record = decode_record(encoded.encode(0, 0, 0))
    assert record.properties == {"UNIQ_KEY": "ABC"}
    assert record.born_timestamp_ms == 77


def test_record_size_matches_rocketmq_cal_msg_length_for_every_host_combination() -> None:
    for sys_flag in (0, BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG, 0x30, 0x0C):
        for body_len, topic_len, props_len in ((0, 0, 0), (1, 127, 32767), (4 << 20, 5, 9)):
            assert record_size(body_len, topic_len, props_len, sys_flag) == cal_msg_length(
                sys_flag, body_len, topic_len, props_len
            )
    assert record_size(0, 0, 0) == 91  # the smallest possible IPv4 record


# -- golden vectors ----------------------------------------------------------------------


def test_golden_ipv4_record_matches_a_hand_built_rocketmq_record() -> None:
    body = b"Hello RocketMQ"
    topic = b"TopicTest"
    props = b"UNIQ_KEY\x017F0000010001\x02TAGS\x01TagA\x02KEYS\x01k1 k2\x02"
    born_ts, store_ts = 1_700_000_000_123, 1_700_000_000_456
    sys_flag = TRANSACTION_COMMIT_TYPE
    # Fields in the documented order, big-endian.
    after_size = (
        struct.pack(">I", 0xDAA320A7)  # MAGICCODE
        + struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF)  # BODYCRC
        + struct.pack(">i", 3)  # QUEUEID
        + struct.pack(">i", 7)  # FLAG
        + struct.pack(">q", 42)  # QUEUEOFFSET
        + struct.pack(">q", 1 << 30)  # PHYSICALOFFSET
        + struct.pack(">i", sys_flag)  # SYSFLAG
        + struct.pack(">q", born_ts)  # BORNTIMESTAMP
        + bytes([192, 168, 1, 20]) + struct.pack(">i", 54321)  # BORNHOST
        + struct.pack(">q", store_ts)  # STORETIMESTAMP
        + bytes([10, 0, 0, 7]) + struct.pack(">i", 10911)  # STOREHOSTADDRESS
        + struct.pack(">i", 2)  # RECONSUMETIMES
        + struct.pack(">q", 0)  # PREPARED_TX_OFFSET
        + struct.pack(">i", len(body)) + body  # BODYLEN + BODY
        + struct.pack(">b", len(topic)) + topic  # TOPICLEN + TOPIC
        + struct.pack(">h", len(props)) + props  # PROPLEN + PROPERTIES
    )  # fmt: skip
    golden = struct.pack(">i", 4 + len(after_size)) + after_size

    message = Message(
        topic="TopicTest",
        body=body,
        queue_id=3,
        tags="TagA",
        keys=["k1", "k2"],
        properties={"UNIQ_KEY": "7F0000010001"},
        flag=7,
        sys_flag=sys_flag,
        born_timestamp_ms=born_ts,
        born_host="192.168.1.20:54321",
        reconsume_times=2,
    )
    encoded = EncodedMessage(message, store_host=encode_host("10.0.0.7:10911"))

    assert encoded.encode(42, 1 << 30, store_ts) == golden
    assert len(golden) == cal_msg_length(sys_flag, len(body), len(topic), len(props))


def test_golden_ipv6_record_sets_both_v6_sysflag_bits_and_20_byte_hosts() -> None:
    body = b""
    topic = b"T6"
    born_ip = ipaddress.IPv6Address("2001:db8::1").packed
    store_ip = ipaddress.IPv6Address("::1").packed
    after_size = (
        struct.pack(">I", MESSAGE_MAGIC_CODE)  # MAGICCODE
        + struct.pack(">i", zlib.crc32(body) & 0x7FFFFFFF)  # BODYCRC (0 for b"")
        + struct.pack(">iiqq", 0, 0, 0, 64)  # QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET
        + struct.pack(">i", 0x30)  # SYSFLAG: BORNHOST_V6 | STOREHOSTADDRESS_V6
        + struct.pack(">q", 5)  # BORNTIMESTAMP
        + born_ip + struct.pack(">i", 1)  # BORNHOST: 16 + 4
        + struct.pack(">q", 6)  # STORETIMESTAMP
        + store_ip + struct.pack(">i", 2)  # STOREHOSTADDRESS: 16 + 4
        + struct.pack(">iq", 0, 0)  # RECONSUMETIMES PREPARED_TX_OFFSET
        + struct.pack(">i", 0)  # BODYLEN
        + struct.pack(">b", len(topic)) + topic  # TOPICLEN + TOPIC
        + struct.pack(">h", 0)  # PROPLEN
    )  # fmt: skip
    golden = struct.pack(">i", 4 + len(after_size)) + after_size

    message = Message(topic="T6", born_host="[2001:db8::1]:1", born_timestamp_ms=5)
    encoded = EncodedMessage(message, store_host=encode_host("[::1]:2"))

    assert encoded.encode(0, 64, 6) == golden
    assert len(golden) == cal_msg_length(0x30, 0, 2, 0) == 117
    assert decode_record(golden).sys_flag == 0x30


# -- decode_record errors ----------------------------------------------------------------


def _sample_record(physical_offset: int = 0) -> bytes:
    message = Message(topic="TopicA", body=b"body-bytes", tags="T", keys=["k"])
    return EncodedMessage(message, store_host=encode_host("127.0.0.1:10911")).encode(
        0, physical_offset, 1
    )


def test_decode_record_rejects_a_bad_magic_code() -> None:
    raw = bytearray(_sample_record())
    raw[4:8] = struct.pack(">I", 0x12345678)
    with pytest.raises(CorruptRecordError, match="magic"):
        decode_record(raw)


@pytest.mark.parametrize(
    ("where", "marker", "into"),
    [
        ("header", b"", 10),
        ("born host", b"", 60),
        ("body", b"body-bytes", 3),
        ("topic", b"TopicA", 2),
        ("properties", b"TAGS\x01", 6),
        ("last byte", None, -1),
    ],
)
def test_decode_record_rejects_a_truncated_record(
    where: str, marker: bytes | None, into: int
) -> None:
    raw = _sample_record()
    cut = len(raw) + into if marker is None else raw.index(marker) + into
    with pytest.raises(CorruptRecordError) as excinfo:
        decode_record(raw[:cut])
    assert excinfo.value.offset == 0, where


def test_decode_record_rejects_a_totalsize_that_disagrees_with_the_fields() -> None:
    raw = bytearray(_sample_record())
    raw[0:4] = struct.pack(">i", len(raw) + 4)
    with pytest.raises(CorruptRecordError, match="TOTALSIZE"):
        decode_record(raw + bytes(4))


# -- check_record: blank, end, and a flipped byte ---------------------------------------


def test_check_record_recognises_an_end_of_file_blank() -> None:
    buf = bytes(100) + struct.pack(">iI", 412, BLANK_MAGIC_CODE) + bytes(404)
    info = check_record(buf, 100, len(buf), check_crc=True)
    assert info.kind is RecordKind.BLANK
    assert info.size == 412


def test_check_record_reports_end_on_zeroes_and_past_the_limit() -> None:
    buf = _sample_record() + bytes(32)
    assert check_record(buf, len(buf) - 32, len(buf), check_crc=True).kind is RecordKind.END
    # Fewer than 8 readable bytes left: nothing more can be read.
    assert check_record(buf, 0, 7, check_crc=True).kind is RecordKind.END
    assert check_record(buf, len(buf) - 4, len(buf), check_crc=True).kind is RecordKind.END


def test_check_record_rejects_a_record_running_past_the_limit() -> None:
    raw = _sample_record()
    info = check_record(raw, 0, len(raw) - 1, check_crc=True)
    assert info.kind is RecordKind.CORRUPT


def test_check_record_rejects_a_record_at_the_wrong_physical_offset() -> None:
    raw = _sample_record(physical_offset=4096)
    assert check_record(raw, 0, len(raw), check_crc=True, expected_offset=4096).kind is (
        RecordKind.MESSAGE
    )
    info = check_record(raw, 0, len(raw), check_crc=True, expected_offset=0)
    assert info.kind is RecordKind.CORRUPT
    assert "PHYSICALOFFSET" in info.reason


def test_check_record_checks_the_body_crc_only_when_asked() -> None:
    raw = bytearray(_sample_record())
    body_at = raw.index(b"body-bytes")
    raw[body_at] ^= 0xFF
    assert check_record(raw, 0, len(raw), check_crc=False).kind is RecordKind.MESSAGE
    info = check_record(raw, 0, len(raw), check_crc=True)
    assert info.kind is RecordKind.CORRUPT
    assert "CRC" in info.reason


def record_regions(raw: bytes, sys_flag: int) -> dict[str, range]:
    """Byte ranges of every field of an encoded record, named as in RocketMQ."""
    born = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    store = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    widths = [
        ("TOTALSIZE", 4),
        ("MAGICCODE", 4),
        ("BODYCRC", 4),
        ("QUEUEID", 4),
        ("FLAG", 4),
        ("QUEUEOFFSET", 8),
        ("PHYSICALOFFSET", 8),
        ("SYSFLAG", 4),
        ("BORNTIMESTAMP", 8),
        ("BORNHOST", born),
        ("STORETIMESTAMP", 8),
        ("STOREHOSTADDRESS", store),
        ("RECONSUMETIMES", 4),
        ("PREPARED_TX_OFFSET", 8),
        ("BODYLEN", 4),
    ]
    regions: dict[str, range] = {}
    pos = 0
    for name, width in widths:
        regions[name] = range(pos, pos + width)
        pos += width
    (body_len,) = struct.unpack_from(">i", raw, regions["BODYLEN"].start)
    regions["BODY"] = range(pos, pos + body_len)
    pos += body_len
    regions["TOPICLEN"] = range(pos, pos + 1)
    topic_len = raw[pos]
    regions["TOPIC"] = range(pos + 1, pos + 1 + topic_len)
    pos += 1 + topic_len
    regions["PROPLEN"] = range(pos, pos + 2)
    regions["PROPERTIES"] = range(pos + 2, len(raw))
    assert sum(len(r) for r in regions.values()) == len(raw)
    return regions


#: Fields whose corruption check_record (like RocketMQ's checkMessageAndReturnSize) must catch:
#: the size/magic/length framing, the body through its CRC, and the physical offset.
MUST_DETECT = {
    "TOTALSIZE",
    "MAGICCODE",
    "BODYCRC",
    "PHYSICALOFFSET",
    "BODYLEN",
    "BODY",
    "TOPICLEN",
    "PROPLEN",
}
#: Fields check_record does not (and cannot) validate: a flip there still decodes.
UNCHECKED = {
    "QUEUEID",
    "FLAG",
    "QUEUEOFFSET",
    "BORNTIMESTAMP",
    "BORNHOST",
    "STORETIMESTAMP",
    "STOREHOSTADDRESS",
    "RECONSUMETIMES",
    "PREPARED_TX_OFFSET",
    "PROPERTIES",
}
#: A flip here may or may not be caught: SYSFLAG's host bits move every later field,
#: the topic may stop being UTF-8.
EITHER = {"SYSFLAG", "TOPIC"}

# Topics of legal topic characters (all >= 0x25) and short printable properties: with
# these, a changed TOPICLEN can never land on two bytes that happen to form a
# consistent PROPLEN (such a coincidence would be undetectable by RocketMQ too).
flip_topics = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-%|",
    min_size=1,
    max_size=127,
)
printable = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=20)
flip_properties = st.dictionaries(printable.filter(bool), printable, max_size=8).filter(
    lambda p: len(encode_properties(p)) <= 255
)


@settings(max_examples=200, deadline=None)
@given(
    topic=flip_topics,
    body=st.binary(max_size=512),
    properties=flip_properties,
    born_host=hosts,
    store_host=hosts,
    physical_offset=st.integers(0, 2**40),
    data=st.data(),
)
def test_a_flipped_byte_is_detected_unless_it_hit_an_unchecked_field(
    topic: str,
    body: bytes,
    properties: dict[str, str],
    born_host: str,
    store_host: str,
    physical_offset: int,
    data: st.DataObject,
) -> None:
    message = Message(topic=topic, body=body, properties=properties, born_host=born_host)
    encoded = EncodedMessage(message, store_host=encode_host(store_host))
    raw = encoded.encode(17, physical_offset, 1_700_000_000_000)
    regions = record_regions(raw, encoded.sys_flag)
    # Pick the field first so that every field, not just the body, gets flipped often.
    field = data.draw(st.sampled_from([n for n, r in regions.items() if len(r)]), label="field")
    index = data.draw(st.sampled_from(regions[field]), label="index")
    mask = data.draw(st.integers(1, 255), label="xor mask")

    # The record followed by zeroes, as inside a CommitLog file.
    buf = bytearray(raw + bytes(64))
    buf[index] ^= mask
    info = check_record(buf, 0, len(buf), check_crc=True, expected_offset=physical_offset)

    if field in MUST_DETECT:
        assert info.kind is RecordKind.CORRUPT, (field, info)
    elif field in UNCHECKED:
        assert info.kind is RecordKind.MESSAGE, (field, info)
        assert info.size == len(raw)
        assert info.physical_offset == physical_offset
    else:
        assert field in EITHER
        assert info.kind in (RecordKind.CORRUPT, RecordKind.MESSAGE), (field, info)
        if info.kind is RecordKind.MESSAGE:
            assert info.size == len(raw)


@settings(max_examples=100, deadline=None)
@given(junk=st.binary(min_size=8, max_size=300), limit_slack=st.integers(0, 64))
def test_check_record_never_raises_on_arbitrary_bytes(junk: bytes, limit_slack: int) -> None:
    buf = junk + bytes(limit_slack)
    info = check_record(buf, 0, len(buf), check_crc=True, expected_offset=0)
    assert info.kind in RecordKind
    # Bytes carrying the message magic must decode cleanly or be reported corrupt.
    buf2 = bytearray(buf)
    buf2[4:8] = struct.pack(">I", MESSAGE_MAGIC_CODE)
    info2 = check_record(buf2, 0, len(buf2), check_crc=True)
    assert info2.kind in (RecordKind.MESSAGE, RecordKind.CORRUPT)
