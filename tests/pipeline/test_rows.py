"""Raw records to Arrow in C (``_records.arrow_columns`` via ``_rows.raw_batches``)
against the readable reference, ``record_batch`` of ``decode_records``: the
same rows on every input, or the same CorruptRecordError."""

from __future__ import annotations

import itertools

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from basalt.common import _records
from basalt.common.message import Message, encode_host
from basalt.common.record import CorruptRecordError, DamagedRecord, EncodedMessage, decode_records
from basalt.pipeline._rows import ARROW_SCHEMA, raw_batches, record_batch
from tests.support.strategies import hosts, messages

#: Property blocks as a store may hold them: separators anywhere, names repeated,
#: TAGS / KEYS present or not, and (rarely) bytes that are not UTF-8.
raw_properties = st.lists(
    st.sampled_from(
        [b"\x01", b"\x02", b"TAGS", b"KEYS", b"UNIQ_KEY", b"a", b"\xc3\xa9", b"\xe2\x82", b"\xff"]
    ),
    max_size=24,
).map(b"".join)


def run_of(items: list[tuple[Message, str, bytes | None]]) -> bytes:
    """Stored records back to back: each message with its store host and raw properties."""
    parts, pos = [], 0
    for k, (message, store_host, props) in enumerate(items):
        encoded = EncodedMessage(message, store_host=encode_host(store_host), properties=props)
        parts.append(encoded.encode(1000 + k, pos, 1_700_000_000_000 + k))
        pos += encoded.size
    return b"".join(parts)


def reference(data: bytes) -> pa.Table:
    return pa.Table.from_batches([record_batch("broker-a", decode_records(data))], ARROW_SCHEMA)


def fast(data: bytes, max_rows: int = 8192, max_bytes: int = 1 << 20) -> pa.Table:
    batches = list(raw_batches("broker-a", data, max_rows=max_rows, max_bytes=max_bytes))
    for b in batches:
        b.validate(full=True)
    return pa.Table.from_batches(batches, ARROW_SCHEMA)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(messages(), hosts, st.one_of(st.none(), raw_properties)), min_size=0, max_size=6
    ),
    st.integers(1, 4),
    st.integers(1, 2048),
)
def test_raw_batches_equal_the_reference(
    items: list[tuple[Message, str, bytes | None]], max_rows: int, max_bytes: int
) -> None:
    data = run_of(items)
    assert fast(data, max_rows, max_bytes).equals(reference(data))


def test_ordinary_records_and_batch_limits() -> None:
    message = Message("T", b"body", tags="TagA", keys=["k1", "k2"], properties={"a": "b"})
    plain = Message("T", b"x" * 100)
    data = run_of([(message, "[::1]:10911", None), (plain, "10.0.0.1:10911", None)] * 5)
    got = fast(data, max_rows=3)
    assert got.equals(reference(data))
    row = got.slice(0, 2).to_pylist()
    assert (row[0]["tags"], row[0]["keys"], row[1]["tags"], row[1]["keys"]) == (
        "TagA",
        "k1 k2",
        None,
        None,
    )
    assert len(row[0]["msg_id"]) == 56 and len(row[1]["msg_id"]) == 32
    assert [b.num_rows for b in raw_batches("b", data, max_rows=3)] == [3, 3, 3, 1]
    # stops once the bodies reach max_bytes: 4 + 100 + 4 < 150 <= 4 + 100 + 4 + 100
    assert [b.num_rows for b in raw_batches("b", data, max_bytes=150)] == [4, 4, 2]
    assert list(raw_batches("b", data, 10, 10)) == []


def test_a_damaged_run_fails_as_decode_records_does() -> None:
    data = bytearray(run_of([(Message("T", b"x" * 50), "127.0.0.1:1", None)] * 3))
    data[len(data) // 3 + 4] ^= 0xFF  # the second record's magic code
    for broken in (bytes(data), bytes(data[:-10])):
        with pytest.raises(CorruptRecordError) as want:
            decode_records(broken)
        with pytest.raises(CorruptRecordError) as got:
            fast(broken)
        assert (got.value.offset, got.value.reason) == (want.value.offset, want.value.reason)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(messages(), hosts, st.none()), min_size=1, max_size=5),
    st.integers(1, 3),
    st.data(),
)
def test_a_record_whose_crc_fails_is_left_out_and_reported_as_decode_records_does(
    items: list[tuple[Message, str, bytes | None]], max_rows: int, data: st.DataObject
) -> None:
    raw = bytearray(run_of(items))
    starts = [r.commit_log_offset for r in decode_records(bytes(raw))]  # run_of: phys = position
    k = data.draw(st.integers(0, len(items) - 1), label="record")
    raw[starts[k] + 8] ^= 0x40  # its BODYCRC: framing sound, checksum not
    want: list[DamagedRecord] = []
    expected = decode_records(bytes(raw), damaged=want)
    got: list[DamagedRecord] = []
    batches = list(raw_batches("broker-a", bytes(raw), max_rows=max_rows, damaged=got))
    table = pa.Table.from_batches(batches, ARROW_SCHEMA)
    assert table.equals(pa.Table.from_batches([record_batch("broker-a", expected)], ARROW_SCHEMA))
    assert got == want and [d.position for d in got] == [starts[k]]
    assert 1000 + k not in table.column("queue_offset").to_pylist()


def chunked(data: bytes, cuts: list[int], starts: list[int]) -> list[memoryview]:
    """``data`` (records at ``starts``) cut at record boundaries: a cut picks the
    boundary of the record at that index (modulo the records); an empty run too."""
    bounds = sorted({starts[c % len(starts)] for c in cuts} | {0, len(data)}) if starts else [0]
    view = memoryview(data)
    return [view[a:b] for a, b in itertools.pairwise(bounds)] + [view[0:0]]


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(messages(), hosts, st.none()), min_size=1, max_size=6),
    st.lists(st.integers(0, 10), max_size=4),
    st.integers(1, 4),
    st.data(),
)
def test_several_answers_read_in_place_equal_their_join(
    items: list[tuple[Message, str, bytes | None]],
    cuts: list[int],
    max_rows: int,
    data: st.DataObject,
) -> None:
    """A list of answers is read as their concatenation: the same batches (rows,
    limits) as the joined bytes, and a damaged record reported at its position
    in the join."""
    raw = bytearray(run_of(items))
    starts = [r.commit_log_offset for r in decode_records(bytes(raw))]
    if data.draw(st.booleans(), label="damage one"):
        raw[starts[data.draw(st.integers(0, len(starts) - 1), label="record")] + 8] ^= 0x40
    joined = bytes(raw)
    parts = chunked(joined, cuts, starts)
    want: list[DamagedRecord] = []
    got: list[DamagedRecord] = []
    expected = list(raw_batches("broker-a", joined, max_rows=max_rows, damaged=want))
    batches = list(raw_batches("broker-a", parts, max_rows=max_rows, damaged=got))
    assert [b.num_rows for b in batches] == [b.num_rows for b in expected]
    assert all(b.equals(e) for b, e in zip(batches, expected, strict=True))
    assert got == want
    for b in batches:
        b.validate(full=True)


def test_a_record_cut_across_two_answers_is_corrupt() -> None:
    """Each buffer of a list must hold whole records: one cut inside a record is
    a broken frame at that record's position in the concatenation."""
    data = run_of([(Message("T", b"x" * 50), "127.0.0.1:1", None)] * 3)
    second = decode_records(data)[1].commit_log_offset
    parts = [data[: second + 10], data[second + 10 :]]
    with pytest.raises(CorruptRecordError) as got:
        list(raw_batches("broker-a", parts))
    assert got.value.offset == second and "TOTALSIZE" in got.value.reason


def test_a_property_block_that_is_not_utf8_in_a_list_falls_back_to_the_decoder() -> None:
    items = [
        (Message("T", b"a"), "127.0.0.1:1", None),
        (Message("T", b"b"), "127.0.0.1:1", b"k\x01\xff\x02"),
        (Message("T", b"c"), "127.0.0.1:1", None),
    ]
    data = run_of(items)
    parts = chunked(data, [1, 2], [r.commit_log_offset for r in decode_records(data)])
    assert len([p for p in parts if len(p)]) == 3
    got = pa.Table.from_batches(list(raw_batches("broker-a", parts)), ARROW_SCHEMA)
    assert got.equals(reference(data))
    assert got.column("properties").to_pylist()[1] == [("k", "\ufffd")]


def test_outputs_from_an_allocator_hold_the_bytes_the_default_outputs_hold() -> None:
    """raw_batches has arrow_columns fill Arrow pool buffers (``alloc``); without
    one it makes bytes objects: the same contents either way, and an allocator
    that gives too few bytes is refused before anything is written."""
    message = Message("T", b"body", tags="TagA", keys=["k1"], properties={"a": "b"})
    data = run_of([(message, "10.0.0.1:10911", None), (Message("T", b"x"), "[::1]:1", None)])
    args = (data, 0, len(data), 10, 1 << 20, CorruptRecordError, True, [], DamagedRecord)
    as_bytes = _records.arrow_columns(*args)
    pooled = _records.arrow_columns(*args, pa.allocate_buffer)

    def flat(got: tuple[object, ...]) -> list[object]:
        out: list[object] = []
        for part in got:
            out.extend(flat(part) if isinstance(part, tuple) else [part])
        return [bytes(p) if isinstance(p, (bytes, pa.Buffer)) else p for p in out]

    assert isinstance(pooled[3], pa.Buffer) and isinstance(as_bytes[3], bytes)
    assert flat(pooled) == flat(as_bytes)
    with pytest.raises(ValueError, match="gave 0 bytes"):
        _records.arrow_columns(*args, lambda n: bytearray(0))


def test_max_batches_stops_there_and_returns_where_the_next_batch_begins() -> None:
    """The source builds only whole batches and keeps the rest for the next answers:
    the batches made from the returned position on complete the run exactly."""
    data = run_of([(Message("T", b"x" * k), "10.0.0.1:10911", None) for k in range(7)])
    head: list[pa.RecordBatch] = []
    batches = raw_batches("broker-a", data, max_rows=3, max_batches=1)
    while True:
        try:
            head.append(next(batches))
        except StopIteration as stop:
            at = stop.value
            break
    assert [b.num_rows for b in head] == [3]
    assert at == len(run_of([(Message("T", b"x" * k), "10.0.0.1:10911", None) for k in range(3)]))
    tail = list(raw_batches("broker-a", data, at, max_rows=3))
    assert [b.num_rows for b in tail] == [3, 1]
    joined = pa.Table.from_batches([*head, *tail], ARROW_SCHEMA)
    assert joined.equals(reference(data))
