"""Checksums checked on read (Kafka's ``check.crcs``): decode_records and its
reference leave a record whose checksum fails out of their answer and report
it as a DamagedRecord; the C decoder and the Python reference agree on every
input, damaged or not.

A flipped byte anywhere a checksum covers (everything before the CRC32
property's separator, and its digits) is detected: the record never comes back as data,
and every other record does.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from basalt.common.message import Message, encode_host
from basalt.common.record import (
    CRC32_RESERVED_LEN,
    MIN_RECORD_SIZE,
    CorruptRecordError,
    DamagedRecord,
    EncodedMessage,
    decode_records,
    decode_records_py,
)
from tests.support.strategies import property_text, utf8_at_most

HOST = encode_host("127.0.0.1:10911")


def stored_run(messages: list[Message], *, append_crc: bool = True) -> tuple[bytes, list[int]]:
    """``messages`` as a store writes them (CRCs filled), back to back; and where each starts."""
    parts, starts, pos = [], [], 5000
    for k, message in enumerate(messages):
        encoded = EncodedMessage(message, store_host=HOST, append_crc=append_crc)
        starts.append(pos - 5000)
        parts.append(encoded.encode(100 + k, pos, 1_700_000_000_000 + k))
        pos += encoded.size
    return b"".join(parts), starts


def checked(decode: object, data: bytes | bytearray) -> tuple[object, ...]:
    """A decoder's answer with damaged records collected: (records, damaged), or its error."""
    assert callable(decode)
    damaged: list[DamagedRecord] = []
    try:
        return decode(data, damaged=damaged), damaged
    except CorruptRecordError as e:
        return ("corrupt", e.offset, e.reason)


stored_messages = st.lists(
    st.builds(
        Message,
        topic=utf8_at_most(40).filter(bool),
        body=st.binary(max_size=300),
        tags=st.one_of(st.none(), property_text.filter(bool)),
        properties=st.dictionaries(property_text.filter(bool), property_text, max_size=3),
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=400, deadline=None)
@given(stored_messages, st.booleans(), st.data())
def test_a_flipped_byte_is_detected(
    messages: list[Message], append_crc: bool, data: st.DataObject
) -> None:
    raw, starts = stored_run(messages, append_crc=append_crc)
    sound = decode_records(raw)
    assert sound == decode_records_py(raw) and len(sound) == len(messages)
    at = data.draw(st.integers(0, len(raw) - 1), label="at")
    damaged_raw = bytearray(raw)
    damaged_raw[at] ^= data.draw(st.integers(1, 255), label="xor")

    got = checked(decode_records, damaged_raw)
    assert got == checked(decode_records_py, damaged_raw)  # C and Python agree

    k = max(i for i, s in enumerate(starts) if s <= at)
    size = sound[k].store_size
    inside = at - starts[k]
    header = MIN_RECORD_SIZE - 3  # IPv4 hosts: the bytes before BODY
    if append_crc:
        # The CRC32 property: every byte before it and its digits. Its name and
        # separators (the \x02 before it too) only say it is there: changed,
        # the record reads as one without it, checked by BODYCRC alone.
        covered = inside < size - CRC32_RESERVED_LEN - 1 or size - 11 <= inside < size - 1
    else:  # BODYCRC alone: the body and BODYCRC itself
        covered = 8 <= inside < 12 or header <= inside < header + len(sound[k].body)
    if got[0] == "corrupt":
        return  # the framing broke: nothing of the answer is delivered
    records, damaged = got
    if covered:
        # Never as data: record k is reported at its position, every other one delivered.
        assert [d.position for d in damaged] == [starts[k]]
        assert records == sound[:k] + sound[k + 1 :]
    elif not damaged:
        assert records[k].body == sound[k].body  # what a checksum covers came back sound


def test_a_damaged_body_is_reported_with_its_offsets_and_the_rest_delivered() -> None:
    messages = [Message("TopicA", f"body-{i}".encode() * 10, tags="t") for i in range(3)]
    raw, starts = stored_run(messages)
    broken = bytearray(raw)
    broken[raw.index(b"body-1")] ^= 0x20
    for decode in (decode_records, decode_records_py):
        damaged: list[DamagedRecord] = []
        records = decode(broken, damaged=damaged)
        assert [r.body for r in records] == [m.body for m in (messages[0], messages[2])]
        assert damaged == [
            DamagedRecord(starts[1], "TopicA", 0, 101, 5000 + starts[1], "body CRC mismatch")
        ]
        assert "offset 101" in damaged[0].describe()
        # Without a list to report into, a damaged record is an error, never data.
        with pytest.raises(CorruptRecordError, match="body CRC mismatch") as e:
            decode(broken)
        assert e.value.offset == starts[1]
        # check_crc=False: the old, unchecked read.
        assert len(decode(broken, check_crc=False)) == 3


def test_a_record_without_the_crc32_property_is_checked_by_its_body_crc() -> None:
    raw, _ = stored_run([Message("T", b"payload")], append_crc=False)
    broken = bytearray(raw)
    broken[raw.index(b"payload")] ^= 1
    for decode in (decode_records, decode_records_py):
        damaged: list[DamagedRecord] = []
        assert decode(broken, damaged=damaged) == []
        assert [d.reason for d in damaged] == ["body CRC mismatch"]


def test_a_damaged_topic_is_damaged_not_a_broken_answer() -> None:
    """A flipped topic byte that is not UTF-8 fails the checksum first (check_record's order)."""
    raw, _ = stored_run([Message("TopicA", b"x"), Message("TopicB", b"y")])
    broken = bytearray(raw)
    broken[raw.index(b"TopicA")] = 0xFF
    for decode in (decode_records, decode_records_py):
        damaged: list[DamagedRecord] = []
        assert [r.body for r in decode(broken, damaged=damaged)] == [b"y"]
        assert [(d.topic, d.reason) for d in damaged] == [("\ufffdopicA", "record CRC mismatch")]


@pytest.mark.parametrize("zeroed", [1, CRC32_RESERVED_LEN // 2, CRC32_RESERVED_LEN, 40])
def test_a_record_whose_tail_a_lost_write_zeroed_is_damaged(zeroed: int) -> None:
    """A lost page write that clears a record's tail takes its CRC32 property
    with it, and BODYCRC does not cover the properties: the zero byte that ends
    PROPERTIES (every property ends with \\x02) gives it away, in the decoders
    and in recovery's scan alike."""
    from basalt.common import _records
    from basalt.common.record import ZEROED_PROPERTIES, RecordKind, check_record

    message = Message("TopicA", b"payload", keys=("k-1",), properties={"p": "v" * 30})
    raw, starts = stored_run([message, Message("TopicA", b"next")])
    first = starts[1]  # where the first record ends
    broken = bytearray(raw)
    broken[first - zeroed : first] = bytes(zeroed)
    for decode in (decode_records, decode_records_py):
        damaged: list[DamagedRecord] = []
        assert [r.body for r in decode(broken, damaged=damaged)] == [b"next"]
        assert [d.reason for d in damaged] == [ZEROED_PROPERTIES]
    info = check_record(broken, 0, len(broken), check_crc=True, expected_offset=5000)
    assert (info.kind, info.reason) == (RecordKind.CORRUPT, ZEROED_PROPERTIES)
    pos, kind, reason, *_ = _records.scan(broken, 0, len(broken), 5000, True, 0)
    assert (pos, kind, reason) == (0, _records.KIND_CORRUPT, ZEROED_PROPERTIES)
