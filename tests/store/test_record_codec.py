"""The SDK's record decoder in C (store._records) against its Python reference.

decode_records must return what decode_records_py (check_record, then
decode_record) returns on every input, valid or not: the same records field for
field, or the same CorruptRecordError (position and reason).
"""

from __future__ import annotations

import dataclasses
import gc
import mmap
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from store import _records
from store.errors import CorruptRecordError
from store.message import (
    Message,
    MessageRecord,
    decode_host,
    decode_properties,
    encode_host,
)
from store.record import (
    BLANK_MAGIC_CODE,
    EncodedMessage,
    decode_records,
    decode_records_py,
)
from tests.store.test_record import hosts, messages


def outcome(decode: object, data: bytes | bytearray | memoryview) -> object:
    """What a decoder made of ``data``: its records, or its error's offset and reason."""
    assert callable(decode)
    try:
        return decode(data)
    except CorruptRecordError as e:
        return ("corrupt", e.offset, e.reason)


def run_of(items: list[tuple[Message, str, bytes | None]], start: int = 0) -> bytes:
    """Stored records back to back: each message with its store host and raw properties."""
    parts = []
    pos = start
    for k, (message, store_host, props) in enumerate(items):
        encoded = EncodedMessage(message, store_host=encode_host(store_host), properties=props)
        parts.append(encoded.encode(1000 + k, pos, 1_700_000_000_000 + k))
        pos += encoded.size
    return b"".join(parts)


# -- decode_records ---------------------------------------------------------------------


def test_record_fields_are_message_records_in_order() -> None:
    assert tuple(f.name for f in dataclasses.fields(MessageRecord)) == _records.RECORD_FIELDS


#: Property blocks as a store may hold them: separators anywhere, invalid UTF-8,
#: a multi-byte character cut by a separator, names repeated.
raw_properties = st.lists(
    st.sampled_from(
        [b"\x01", b"\x02", b"TAGS", b"UNIQ_KEY", b"a", b"\xc3\xa9", b"\xe2\x82", b"\xff", b"\xf0"]
    ),
    max_size=24,
).map(b"".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(messages(), hosts, st.one_of(st.none(), raw_properties)), min_size=0, max_size=5
    )
)
def test_decode_records_equals_the_python_reference(
    items: list[tuple[Message, str, bytes | None]],
) -> None:
    data = run_of(items)
    got = decode_records(data)
    assert got == decode_records_py(data)
    assert len(got) == len(items)
    for record, (_, _, props) in zip(got, items, strict=True):
        if props is not None:
            assert record.properties == decode_properties(props)


def test_decode_records_builds_ordinary_records() -> None:
    message = Message("T", b"body", tags="TagA", keys=["k1", "k2"], properties={"a": "b"})
    data = run_of([(message, "[::1]:10911", None), (message, "10.0.0.1:10911", None)])
    c_records, py_records = decode_records(data), decode_records_py(data)
    assert c_records == py_records
    first = c_records[0]
    assert type(first) is MessageRecord
    assert (first.tags, first.keys, first.store_host) == ("TagA", ["k1", "k2"], "[::1]:10911")
    assert repr(first) == repr(py_records[0])
    assert not gc.is_tracked(first)  # no cycle can run through it: see record_object
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.topic = "other"  # type: ignore[misc]


def test_decode_records_takes_any_buffer() -> None:
    data = run_of([(Message("T", b"x" * 100, tags="A"), "127.0.0.1:1", None)] * 3)
    want = decode_records_py(data)
    with mmap.mmap(-1, len(data)) as mm:
        mm[:] = data
        assert decode_records(mm) == want
    assert decode_records(bytearray(data)) == want
    assert decode_records(memoryview(data)) == want
    assert decode_records(b"") == decode_records_py(b"") == []


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(messages(), hosts, st.none()), min_size=1, max_size=3),
    st.data(),
)
def test_a_damaged_run_decodes_or_fails_alike(
    items: list[tuple[Message, str, bytes | None]], data: st.DataObject
) -> None:
    raw = bytearray(run_of(items))
    if data.draw(st.booleans(), label="truncate"):
        raw = raw[: data.draw(st.integers(0, len(raw) - 1), label="cut")]
    else:
        at = data.draw(st.integers(0, len(raw) - 1), label="at")
        raw[at] = data.draw(st.integers(0, 255), label="byte")
    assert outcome(decode_records, raw) == outcome(decode_records_py, raw)


def _one_record(topic: str = "TopicA") -> bytes:
    return run_of([(Message(topic, b"body", tags="T"), "127.0.0.1:10911", None)])


@pytest.mark.parametrize(
    ("tail", "offset_in_tail", "reason"),
    [
        (b"\x00\x00\x00", 0, "3 bytes left, too few for a record"),
        (bytes(100), 0, "bad magic code 0x00000000"),
        (struct.pack(">iI", 100, BLANK_MAGIC_CODE) + bytes(92), 0, "bad magic code 0xCBD43194"),
        (struct.pack(">iI", 5000, 0xDAA320A7), 0, "TOTALSIZE 5000 out of range"),
    ],
)
def test_what_is_not_a_record_after_a_good_one_is_named_at_its_position(
    tail: bytes, offset_in_tail: int, reason: str
) -> None:
    good = _one_record()
    for decode in (decode_records, decode_records_py):
        with pytest.raises(CorruptRecordError) as excinfo:
            decode(good + tail)
        assert (excinfo.value.offset, excinfo.value.reason) == (len(good) + offset_in_tail, reason)


def test_a_topic_that_is_not_utf8_or_too_long_is_corrupt() -> None:
    bad_utf8 = bytearray(_one_record("TopicA"))
    bad_utf8[bad_utf8.index(b"TopicA")] = 0xFF
    long_topic = _one_record("t" * 200)  # TOPICLEN is one byte, RocketMQ's topics <= 127
    for raw, reason in ((bad_utf8, "topic is not UTF-8"), (long_topic, "TOPICLEN 200")):
        for decode in (decode_records, decode_records_py):
            with pytest.raises(CorruptRecordError, match=reason):
                decode(raw)


def test_decode_records_asks_decode_host_once_per_host() -> None:
    seen: list[bytes] = []

    def counting(raw: bytes) -> str:
        seen.append(raw)
        return decode_host(raw)

    data = run_of([(Message("T", b"", born_host="10.0.0.2:7"), "127.0.0.1:1", None)] * 50)
    records = _records.decode_records(data, MessageRecord, counting, CorruptRecordError)
    assert records == decode_records_py(data)
    assert sorted(seen) == sorted([encode_host("10.0.0.2:7"), encode_host("127.0.0.1:1")])


def test_decode_records_refuses_a_class_without_the_slots() -> None:
    @dataclasses.dataclass
    class NoSlots:
        store_size: int

    with pytest.raises(TypeError, match="slot"):
        _records.decode_records(_one_record(), NoSlots, decode_host, CorruptRecordError)
