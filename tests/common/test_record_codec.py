"""The SDK's codec in C (common._records) against its Python references.

decode_records must return what decode_records_py (check_record, then
decode_record) returns on every input, valid or not: the same records field for
field, or the same CorruptRecordError (position and reason). encode_batch must
return encode_batch_py's bytes (EncodedMessage's), and hand what it cannot
vouch for to it. slotted must build what the dataclass's __init__ builds.
"""

from __future__ import annotations

import dataclasses
import gc
import mmap
import re
import struct

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from basalt.client.producer import _SEND_RESULT_FIELDS, SendResult
from basalt.common import _records
from basalt.common.message import (
    BORNHOST_V6_FLAG,
    Message,
    MessageRecord,
    decode_host,
    decode_properties,
    encode_host,
    new_uniq_key,
    new_uniq_keys,
)
from basalt.common.record import (
    BLANK_MAGIC_CODE,
    CorruptRecordError,
    EncodedMessage,
    _host_parts,
    batch_has_property,
    decode_record,
    decode_records,
    decode_records_py,
    encode_batch,
    encode_batch_py,
)
from tests.support.strategies import INT32, INT64, hosts, messages, property_text, utf8_at_most

STORE_HOST = encode_host("127.0.0.1:10911")


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


# -- encode_batch -----------------------------------------------------------------------

any_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=20)
batch_properties = st.dictionaries(
    st.one_of(st.sampled_from(["UNIQ_KEY", "TAGS", "KEYS"]), property_text.filter(bool)),
    any_text,
    max_size=6,
)


@st.composite
def batch_messages(draw: st.DrawFn) -> Message:
    """Messages as applications build them: what the C encoder takes itself."""
    return Message(
        topic=draw(utf8_at_most(127)),
        body=draw(st.binary(max_size=300)),
        queue_id=draw(INT32),
        tags=draw(st.one_of(st.none(), any_text)),
        keys=draw(st.one_of(st.lists(any_text, max_size=3), st.lists(any_text).map(tuple))),
        properties=draw(batch_properties),
        flag=draw(INT32),
        sys_flag=draw(INT32),
        born_timestamp_ms=draw(st.one_of(st.just(0), INT64)),
        born_host=draw(hosts),
        reconsume_times=draw(INT32),
        prepared_transaction_offset=draw(INT64),
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(batch_messages(), any_text), max_size=6), hosts, INT32, INT64)
@example(
    [(Message("T", b"b", tags="A", keys=["k"], properties={"x": "1", "TAGS": "old"}), "u")],
    "[::1]:10911",
    3,
    1,
)
def test_encode_batch_equals_the_python_reference(
    batch_and_keys: list[tuple[Message, str]], store_host: str, queue_id: int, born_ts: int
) -> None:
    batch = [m for m, _ in batch_and_keys]
    uniq_keys = [u for _, u in batch_and_keys]
    args = (batch, uniq_keys, queue_id, encode_host(store_host), born_ts, Message, _host_parts)
    fast = _records.encode_batch(*args)
    assert fast is not None, "the C encoder handed a common batch to Python"
    want = encode_batch_py(
        batch,
        uniq_keys,
        queue_id=queue_id,
        store_host=encode_host(store_host),
        born_timestamp_ms=born_ts,
    )
    assert fast == want


def test_batch_has_property_finds_a_property_of_any_record_and_only_a_whole_name() -> None:
    batch = [
        Message("T", b"one", properties={"XDELAY": "3"}),
        Message("T", b"two", properties={"DELAY": "3"}),
    ]
    raw = encode_batch(batch, ["u1", "u2"], queue_id=0, store_host=STORE_HOST, born_timestamp_ms=1)
    assert batch_has_property(raw, "DELAY")  # the second record's
    assert batch_has_property(raw, "TIMER_DELAY_SEC", "XDELAY")  # one of the names
    first = encode_batch(batch[:1], ["u1"], queue_id=0, store_host=STORE_HOST, born_timestamp_ms=1)
    assert not batch_has_property(first, "DELAY")  # XDELAY is not DELAY
    assert not batch_has_property(raw, "TRAN_MSG")
    # Malformed (a record cut short): no answer but False, never an exception.
    assert not batch_has_property(raw[: len(raw) - 3], "DELAY")


def test_an_encoded_batch_decodes_to_what_was_sent() -> None:
    batch = [
        Message("T", b"one", tags="A", keys=["k"], properties={"p": "v"}),
        Message(
            "T", b"two", born_host="[::1]:5", born_timestamp_ms=42, properties={"UNIQ_KEY": "x"}
        ),
    ]
    raw = encode_batch(batch, ["u1", "x"], queue_id=2, store_host=STORE_HOST, born_timestamp_ms=7)
    records = decode_records(raw, check_crc=False)  # not stamped: the store fills the CRCs
    assert [r.properties for r in records] == [
        {"p": "v", "UNIQ_KEY": "u1", "TAGS": "A", "KEYS": "k"},
        {"UNIQ_KEY": "x"},
    ]
    assert [(r.queue_id, r.born_timestamp_ms, r.born_host) for r in records] == [
        (2, 7, "127.0.0.1:0"),
        (2, 42, "[::1]:5"),
    ]
    assert records[1].sys_flag & BORNHOST_V6_FLAG


class Subclassed(Message):
    pass


@pytest.mark.parametrize(
    "message",
    [
        Message("T", b"b", properties={"n": 1}),  # type: ignore[dict-item]
        Message("T", bytearray(b"b")),  # type: ignore[arg-type]
        Message("T", b"b", keys="ab"),
        Message("T", b"b", flag=2**31),
        Message("T", b"b", properties={"P": "v" * 40_000}),
        Message("T", b"b", properties={"P": "\ud800"}),
        Message("t" * 300, b"b"),
        Subclassed("T", b"b"),
    ],
    ids=[
        "int property",
        "bytearray body",
        "str keys",
        "flag out of range",
        "properties too long",
        "surrogate",
        "topic too long",
        "subclass",
    ],
)
def test_what_the_c_encoder_declines_the_reference_encodes_or_refuses(message: Message) -> None:
    args = ([message], ["u"], 1, STORE_HOST, 5, Message, _host_parts)
    fast = _records.encode_batch(*args)
    kwargs = {"queue_id": 1, "store_host": STORE_HOST, "born_timestamp_ms": 5}
    try:
        want: object = encode_batch_py([message], ["u"], **kwargs)  # type: ignore[arg-type]
    except Exception as e:
        want = type(e)
    try:
        got: object = encode_batch([message], ["u"], **kwargs)  # type: ignore[arg-type]
    except Exception as e:
        got = type(e)
    assert got == want
    if fast is not None:  # a long topic: the reference keeps TOPICLEN's low byte too
        assert fast == want


def test_encode_batch_wants_one_uniq_key_per_message() -> None:
    with pytest.raises(ValueError):
        encode_batch(
            [Message("T")] * 2, ["u"], queue_id=0, store_host=STORE_HOST, born_timestamp_ms=1
        )


def test_an_encoded_batch_is_what_the_store_accepts() -> None:
    batch = [Message("T", b"%d" % k, tags="A") for k in range(3)]
    raw = bytearray(
        encode_batch(
            batch, new_uniq_keys(3), queue_id=1, store_host=STORE_HOST, born_timestamp_ms=9
        )
    )
    _, phys, qoffs, _, _ = _records.stamp(
        raw, 0, len(raw), 500, 10, 123, STORE_HOST, b"T", 1, 1 << 20, True
    )
    assert qoffs == (10, 11, 12)
    assert [decode_record(raw, p - 500).body for p in phys] == [b"0", b"1", b"2"]


# -- uniq keys and slotted --------------------------------------------------------------


def test_new_uniq_keys_are_shaped_as_new_uniq_key_and_unique() -> None:
    one = new_uniq_key()
    keys = new_uniq_keys(70_000)  # past the 16-bit counter's wrap within one second
    assert all(re.fullmatch(r"[0-9A-F]{32}", k) for k in keys)
    assert all(k[:12] == one[:12] for k in keys)  # ip, pid, random
    assert len(set(keys[:65536])) == 65536
    assert new_uniq_keys(0) == []


def test_send_result_fields_are_its_dataclass_fields() -> None:
    assert tuple(f.name for f in dataclasses.fields(SendResult)) == _SEND_RESULT_FIELDS


def test_slotted_builds_what_init_builds() -> None:
    values = [(0, f"id{k}", f"off{k}", "T", "broker-a", 3, 100 + k, f"h{k}") for k in range(4)]
    columns = tuple(list(column) for column in zip(*values, strict=True))
    built = _records.slotted(SendResult, _SEND_RESULT_FIELDS, columns)
    assert built == [SendResult(*v) for v in values]
    assert all(type(r) is SendResult for r in built)
    assert _records.slotted(SendResult, _SEND_RESULT_FIELDS, ((),) * len(values[0])) == []


def test_slotted_refuses_what_it_cannot_fill() -> None:
    with pytest.raises(ValueError, match="has 1 values, not 2"):
        _records.slotted(SendResult, ("status", "msg_id"), ([0, 0], ["x"]))
    with pytest.raises(ValueError, match="twice"):
        _records.slotted(SendResult, ("status", "status"), ([0], [0]))
    with pytest.raises(TypeError, match="slot"):
        _records.slotted(SendResult, ("ok",), ([0],))
    with pytest.raises(ValueError, match="one column per field"):
        _records.slotted(SendResult, ("status",), ())
