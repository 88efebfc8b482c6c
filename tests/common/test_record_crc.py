"""The whole-record checksum (RocketMQ 5's ``enabledAppendPropCRC``): the CRC32
property records end with, its Python reference against the C loops (stamp,
scan, decode_records, encode_batch), and the store writing and verifying it.

Layout under test (RocketMQ's CommitLog.doAppend / MessageDecoder.createCrc32):
the last 20 bytes of PROPERTIES are ``__CRC32#\\x01`` + 10 digits, least
significant first, + ``\\x02``; the digits are CRC32(record[:-20]) & 0x7FFFFFFF.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basalt.common import _records
from basalt.common.message import Message, encode_host
from basalt.common.record import (
    CRC32_RESERVED,
    CRC32_RESERVED_LEN,
    PROPERTY_CRC32,
    EncodedMessage,
    RecordKind,
    body_length_at,
    check_record,
    crc32_property,
    decode_record,
    decode_records,
    decode_records_py,
    encode_batch,
    encode_batch_py,
    has_crc32_property,
    record_crc,
)
from basalt.store import ManualClock, MessageStore
from basalt.store.batch import EncodedBatch
from basalt.store.config import MessageStoreConfig
from basalt.store.consistency import check_store
from basalt.store.mapped_file import file_name
from tests.support.stores import ConfigFactory

HOST = encode_host("127.0.0.1:10911")
PHYS = 1 << 30
MESSAGE = Message(
    "CrcTopic",
    b"the body of a message",
    queue_id=3,
    tags="TagA",
    keys=("k1", "k2"),
    properties={"user": "value", "ü": "ß"},
    flag=7,
    born_timestamp_ms=1_700_000_000_000,
    born_host="10.0.0.1:4321",
)


def stored(message: Message = MESSAGE, *, append_crc: bool = True) -> bytes:
    """One record as the store would write it at PHYS (Python reference)."""
    return EncodedMessage(message, store_host=HOST, append_crc=append_crc).encode(
        41, PHYS, 1_700_000_000_123
    )


def python_verdict(buf: bytes | bytearray) -> tuple[RecordKind, str]:
    info = check_record(buf, 0, len(buf), check_crc=True, expected_offset=PHYS)
    return info.kind, info.reason


def c_verdict(buf: bytes | bytearray) -> tuple[int, str]:
    _, kind, reason, *_ = _records.scan(bytes(buf), 0, len(buf), PHYS, True, -1)
    return kind, reason


# -- the property ------------------------------------------------------------------------


def test_the_property_is_rocketmqs_createcrc32_layout() -> None:
    assert PROPERTY_CRC32 == "__CRC32#"
    assert CRC32_RESERVED_LEN == 20  # CommitLog.CRC32_RESERVED_LEN
    assert CRC32_RESERVED == b"__CRC32#\x010000000000\x02"
    # Digits least significant first, zero-padded at the end.
    assert crc32_property(1234567) == b"__CRC32#\x017654321000\x02"
    assert crc32_property(0x7FFFFFFF) == b"__CRC32#\x017463847412\x02"
    assert crc32_property(0) == CRC32_RESERVED


def test_only_a_last_property_at_a_boundary_counts() -> None:
    assert has_crc32_property(CRC32_RESERVED)
    assert has_crc32_property(b"a\x01b\x02" + CRC32_RESERVED)
    assert not has_crc32_property(b"X" + CRC32_RESERVED)  # a property named X__CRC32#
    assert not has_crc32_property(CRC32_RESERVED + b"a\x01b\x02")  # not last
    assert not has_crc32_property(CRC32_RESERVED[:-1])
    assert not has_crc32_property(b"")


# -- writing -----------------------------------------------------------------------------


def test_a_written_record_carries_the_crc_of_everything_before_the_property() -> None:
    raw = stored()

    assert raw[-CRC32_RESERVED_LEN:] == crc32_property(
        zlib.crc32(raw[:-CRC32_RESERVED_LEN]) & 0x7FFFFFFF
    )
    assert raw[-CRC32_RESERVED_LEN:] == crc32_property(record_crc(raw))
    assert python_verdict(raw) == (RecordKind.MESSAGE, "")
    assert c_verdict(raw) == (_records.KIND_END, "")


def test_compute_crc_false_leaves_the_reserved_property_for_the_store() -> None:
    em = EncodedMessage(MESSAGE, store_host=HOST, compute_crc=False, append_crc=True)
    assert em.encode(0, 0, 0).endswith(CRC32_RESERVED)


def test_the_sdk_reserves_the_property_in_c_and_in_the_reference() -> None:
    messages = [MESSAGE, Message("CrcTopic", b""), Message("CrcTopic", b"x", properties={})]
    uniq = ["U1", "U2", "U3"]
    args = {"queue_id": 3, "store_host": HOST, "born_timestamp_ms": 5}

    data = encode_batch(messages, uniq, **args)

    assert data == encode_batch_py(messages, uniq, **args)
    records = decode_records_py(data, check_crc=False)  # not stamped: the store fills the CRCs
    assert [r.properties.get("UNIQ_KEY") for r in records] == uniq
    pos = 0
    for r in records:
        assert data[pos + r.store_size - CRC32_RESERVED_LEN : pos + r.store_size] == (
            CRC32_RESERVED
        )
        pos += r.store_size


def test_stamp_fills_the_property_exactly_as_the_reference_encodes_it() -> None:
    messages = [MESSAGE, Message("CrcTopic", b"second", queue_id=3, tags="B")]
    data = bytearray(
        encode_batch(messages, ["U1", "U2"], queue_id=3, store_host=HOST, born_timestamp_ms=9)
    )

    _, phys, qoffs, sizes, _ = _records.stamp(
        data, 0, len(data), PHYS, 41, 1_700_000_000_123, HOST, b"CrcTopic", 3, 1 << 20, True
    )

    pos = 0
    for m, uniq, p, q, size in zip(messages, ["U1", "U2"], phys, qoffs, sizes, strict=True):
        sent = Message(
            m.topic,
            m.body,
            queue_id=3,
            tags=m.tags,
            keys=m.keys,
            properties={**m.properties, "UNIQ_KEY": uniq},
            flag=m.flag,
            born_timestamp_ms=m.born_timestamp_ms or 9,
            born_host=m.born_host,
        )
        reference = EncodedMessage(sent, store_host=HOST, append_crc=True).encode(
            q, p, 1_700_000_000_123
        )
        assert bytes(data[pos : pos + size]) == reference
        pos += size
    scan = _records.scan(bytes(data), 0, len(data), PHYS, True, -1)
    assert scan[:3] == (len(data), _records.KIND_END, "") and scan[5] == 2


@pytest.mark.parametrize("body_len", [0, 1, 15, 16, 64, 2047, 2048, 2049, 4096, 70001, 1 << 20])
def test_stamp_fills_the_property_like_zlib_for_every_body_length(body_len: int) -> None:
    """Long bodies take stamp's crc32_combine path (2 KiB and up), short ones a second pass."""
    body = bytes((i * 7 + 3) & 0xFF for i in range(body_len))
    message = Message("CrcTopic", body, queue_id=3, tags="T")
    raw = bytearray(
        EncodedMessage(message, store_host=HOST, compute_crc=False, append_crc=True).encode(0, 0, 0)
    )

    _records.stamp(raw, 0, len(raw), PHYS, 41, 1_700_000_000_123, HOST, b"CrcTopic", 3, 1 << 21)

    assert bytes(raw) == EncodedMessage(message, store_host=HOST, append_crc=True).encode(
        41, PHYS, 1_700_000_000_123
    )
    assert raw[-CRC32_RESERVED_LEN:] == crc32_property(
        zlib.crc32(raw[:-CRC32_RESERVED_LEN]) & 0x7FFFFFFF
    )


def test_stamp_leaves_records_without_the_property_as_they_were() -> None:
    raw = bytearray(EncodedMessage(MESSAGE, store_host=HOST, compute_crc=False).encode(0, 0, 0))

    _records.stamp(raw, 0, len(raw), PHYS, 41, 1_700_000_000_123, HOST, b"CrcTopic", 3, 1 << 20)

    assert bytes(raw) == stored(append_crc=False)
    assert not has_crc32_property(decode_record_props(bytes(raw)))


def decode_record_props(raw: bytes) -> bytes:
    info = check_record(raw, 0, len(raw), check_crc=False)
    return info.properties


# -- reading -----------------------------------------------------------------------------


def test_decoders_do_not_show_the_property_to_the_application() -> None:
    raw = stored()

    expected = {**MESSAGE.all_properties()}
    assert decode_record(raw).properties == expected
    assert decode_records(raw)[0].properties == expected
    assert decode_records_py(raw)[0].properties == expected
    # check_record reports the raw block, the property included.
    assert decode_record_props(raw).endswith(raw[-CRC32_RESERVED_LEN:])


def test_a_users_property_of_that_name_not_last_is_an_ordinary_property() -> None:
    message = Message("CrcTopic", b"b", properties={PROPERTY_CRC32: "mine", "z": "1"})

    raw = stored(message)

    assert decode_record(raw).properties == {PROPERTY_CRC32: "mine", "z": "1"}
    assert decode_records(raw)[0].properties == {PROPERTY_CRC32: "mine", "z": "1"}
    assert python_verdict(raw) == (RecordKind.MESSAGE, "")


def test_records_without_the_property_still_load_and_check() -> None:
    raw = stored(append_crc=False)

    assert python_verdict(raw) == (RecordKind.MESSAGE, "")
    assert c_verdict(raw) == (_records.KIND_END, "")
    assert decode_records(raw)[0].properties == MESSAGE.all_properties()


def field_offsets(raw: bytes) -> dict[str, int]:
    """A byte inside each field of an IPv4 record, to flip."""
    body_len_at = body_length_at(0, 0)
    body_len = int.from_bytes(raw[body_len_at : body_len_at + 4], "big")
    topic_at = body_len_at + 4 + body_len + 1
    props_at = topic_at + len(MESSAGE.topic) + 2
    return {
        "QUEUEID": 15,
        "FLAG": 19,
        "QUEUEOFFSET": 27,
        "SYSFLAG": 39,  # bit 0: COMPRESSED, the layout unchanged
        "BORNTIMESTAMP": 47,
        "BORNHOST": 50,
        "STORETIMESTAMP": 63,
        "STOREHOSTADDRESS": 66,
        "RECONSUMETIMES": 75,
        "PREPARED_TX_OFFSET": 83,
        "BODYCRC": 11,
        "BODY": body_len_at + 4,
        "TOPIC": topic_at,
        "PROPERTIES": props_at + 1,
        "CRC32 digit": len(raw) - 5,
    }


@pytest.mark.parametrize("field", list(field_offsets(stored())))
def test_a_flipped_bit_in_any_field_is_detected_by_check_record_and_scan(field: str) -> None:
    raw = bytearray(stored())
    at = field_offsets(bytes(raw))[field]
    raw[at] ^= 0x01

    kind, reason = python_verdict(raw)

    assert kind is RecordKind.CORRUPT
    # BODYCRC still tells a damaged body from damage elsewhere.
    in_body = field in ("BODY", "BODYCRC")
    assert reason == ("body CRC mismatch" if in_body else "record CRC mismatch")
    assert c_verdict(raw) == (_records.KIND_CORRUPT, reason)


@pytest.mark.parametrize("field", ["TOPIC", "PROPERTIES", "STORETIMESTAMP", "QUEUEOFFSET"])
def test_without_the_property_the_same_flip_goes_unnoticed(field: str) -> None:
    """Why the property exists: BODYCRC covers only the body."""
    raw = bytearray(stored(append_crc=False))
    raw[field_offsets(stored())[field]] ^= 0x01

    assert python_verdict(raw) == (RecordKind.MESSAGE, "")


def mixed_log() -> bytes:
    """Records with and without the property, back to back from PHYS."""
    buf = bytearray()
    for i in range(6):
        m = Message("CrcTopic", bytes([i]) * (i * 40), tags=f"t{i}", properties={"i": str(i)})
        em = EncodedMessage(m, store_host=HOST, append_crc=i % 3 != 0)
        buf += em.encode(i, PHYS + len(buf), 1_700_000_000_000 + i)
    return bytes(buf)


def python_walk(buf: bytes | bytearray) -> tuple[int, str]:
    """Where and why a walk of check_record stops (the reference of scan)."""
    pos = 0
    while True:
        info = check_record(buf, pos, len(buf), check_crc=True, expected_offset=PHYS + pos)
        if info.kind is not RecordKind.MESSAGE:
            return pos, info.reason
        pos += info.size


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_scan_agrees_with_check_record_on_flipped_bits(data: st.DataObject) -> None:
    buf = bytearray(mixed_log())
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(buf) - 1))
        buf[at] ^= 1 << data.draw(st.integers(0, 7))

    pos, _, reason, *_ = _records.scan(bytes(buf), 0, len(buf), PHYS, True, -1)

    assert (pos, reason) == python_walk(buf)


def test_digits_that_are_not_digits_are_corrupt_in_both() -> None:
    raw = bytearray(stored())
    raw[-3] = ord("x")

    assert python_verdict(raw) == (RecordKind.CORRUPT, "CRC32 property is not 10 digits")
    assert c_verdict(raw) == (_records.KIND_CORRUPT, "CRC32 property is not 10 digits")


# -- the store ---------------------------------------------------------------------------


def first_commitlog(config: MessageStoreConfig) -> Path:
    return config.commitlog_dir / file_name(0)


def records_of(store: MessageStore, count: int) -> list[bytes]:
    """The first ``count`` records of the CommitLog, as written."""
    out = []
    pos = 0
    data = first_commitlog(store.config).read_bytes()
    for _ in range(count):
        size = int.from_bytes(data[pos : pos + 4], "big")
        out.append(data[pos : pos + size])
        pos += size
    return out


SendFn = Callable[[MessageStore], None]


def send_single(store: MessageStore) -> None:
    assert store.put_message(MESSAGE).ok


def send_producer_batch(store: MessageStore) -> None:
    data = encode_batch([MESSAGE], ["U1"], queue_id=3, store_host=HOST, born_timestamp_ms=1)
    assert store.put_batch(EncodedBatch.of_records("CrcTopic", 3, data)).ok


@pytest.mark.parametrize("send", [send_single, send_producer_batch])
def test_the_store_writes_a_correct_crc(
    make_config: ConfigFactory, clock: ManualClock, send: SendFn
) -> None:
    store = MessageStore.open(make_config(), clock=clock)
    try:
        send(store)
        (raw,) = records_of(store, 1)
    finally:
        store.shutdown()

    assert has_crc32_property(raw[-CRC32_RESERVED_LEN:])
    assert raw[-CRC32_RESERVED_LEN:] == crc32_property(record_crc(raw))
    assert check_store(make_config().store_path_root_dir).ok


def test_config_off_writes_none(make_config: ConfigFactory, clock: ManualClock) -> None:
    store = MessageStore.open(make_config(enabled_append_prop_crc=False), clock=clock)
    try:
        send_single(store)
        (raw,) = records_of(store, 1)
        record = store.lookup_message_by_offset(0)
    finally:
        store.shutdown()

    assert PROPERTY_CRC32.encode() not in raw
    assert record is not None and record.properties == MESSAGE.all_properties()


def test_store_check_reports_a_flipped_topic_byte(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    config = make_config()
    store = MessageStore.open(config, clock=clock)
    try:
        for _ in range(3):
            send_single(store)
    finally:
        store.shutdown()
    path = first_commitlog(config)
    data = bytearray(path.read_bytes())
    second = int.from_bytes(data[0:4], "big")
    data[second + field_offsets(stored())["TOPIC"]] ^= 0x01
    path.write_bytes(bytes(data))

    report = check_store(config.store_path_root_dir)

    assert not report.ok
    assert any(
        p.offset == second and "record CRC mismatch" in p.message for p in report.problems
    ), report.summary()
