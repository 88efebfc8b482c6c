"""common._records: the C loops agree with zlib and with common.record's Python reference.

crc32 must equal zlib's; scan must stop where a walk of check_record stops, with the
same verdict; stamp must fill exactly the broker's fields and refuse malformed
batches by record; dispatch must turn the CommitLog back into the units stamp
returned. The last tests go through MessageStore.put_batch.
"""

from __future__ import annotations

import mmap
import os
import random
import re
import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from basalt.common import _records
from basalt.common.message import (
    COMPRESSED_FLAG,
    PROPERTY_TAGS,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    Message,
    decode_host,
    decode_properties,
    encode_host,
    is_dispatchable,
)
from basalt.common.record import (
    BLANK_MAGIC_CODE,
    EncodedMessage,
    RecordKind,
    check_record,
    decode_record,
)
from basalt.store import ManualClock, MessageStore, PutStatus
from basalt.store.batch import EncodedBatch
from basalt.store.hashing import tags_code
from tests.support.stores import ConfigFactory

if TYPE_CHECKING:
    from basalt.common._records import DispatchResult

IPV4_HOST = "127.0.0.1:10911"
IPV6_HOST = "[::1]:10911"
H4 = encode_host(IPV4_HOST)
H6 = encode_host(IPV6_HOST)
#: A ConsumeQueue unit: [phyOffset 8][size 4][tagsCode 8], big-endian.
UNIT = struct.Struct(">qiq")
#: check_record's verdicts as the C walk's kinds (MESSAGE: keep walking).
KIND_OF = {
    RecordKind.MESSAGE: _records.KIND_MORE,
    RecordKind.END: _records.KIND_END,
    RecordKind.BLANK: _records.KIND_BLANK,
    RecordKind.CORRUPT: _records.KIND_CORRUPT,
}
TAGS = [None, "", "a", "TagA", "标签", "tag😀", "é|ü", "x" * 40]
BORN_HOSTS = ["10.0.0.1:4321", "[::1]:1234", "[2001:db8::7]:5", "192.168.1.20:54321"]
NON_DISPATCHABLE = (TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE)
SYS_FLAGS = [
    0,
    COMPRESSED_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
]


# -- helpers -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Placed:
    """One encoded record at ``start`` of a buffer."""

    encoded: EncodedMessage
    start: int

    @property
    def end(self) -> int:
        return self.start + self.encoded.size

    @property
    def body_at(self) -> int:
        return self.end - len(self.encoded.tail) - len(self.encoded.body)

    @property
    def topic_at(self) -> int:
        return self.end - len(self.encoded.tail) + 1


def encode_log(
    messages: Sequence[Message], store_hosts: Sequence[bytes], base: int, timestamps: Sequence[int]
) -> tuple[bytearray, list[Placed]]:
    """Records as recovery finds them: each carries ``base + its position`` and a valid CRC."""
    buf = bytearray()
    placed: list[Placed] = []
    for i, (message, host, ts) in enumerate(zip(messages, store_hosts, timestamps, strict=True)):
        encoded = EncodedMessage(message, store_host=host)
        placed.append(Placed(encoded, len(buf)))
        buf += encoded.encode(i, base + len(buf), ts)
    return buf, placed


def python_scan(
    buf: bytes | bytearray, limit: int, base: int, check_crc: bool, newer_than_ms: int
) -> tuple[int, int, str, int, int, int]:
    """scan's result computed record by record with check_record (the reference)."""
    pos, last_ts, first_newer, count = 0, 0, -1, 0
    while True:
        info = check_record(buf, pos, limit, check_crc=check_crc, expected_offset=base + pos)
        if info.kind is not RecordKind.MESSAGE:
            return pos, KIND_OF[info.kind], info.reason, last_ts, first_newer, count
        if info.store_timestamp_ms > newer_than_ms and first_newer < 0:
            first_newer = pos
        last_ts = info.store_timestamp_ms
        pos += info.size
        count += 1


def encode_unstamped(messages: Sequence[Message], store_host: bytes) -> bytearray:
    """A producer's batch: records back to back, broker fields (and BODYCRC) left 0."""
    return bytearray(
        b"".join(
            EncodedMessage(m, store_host=store_host, compute_crc=False).encode(0, 0, 0)
            for m in messages
        )
    )


def stamp(
    buf: bytearray,
    *,
    start: int = 0,
    end: int | None = None,
    base: int = 0,
    queue_offset: int = 0,
    store_ts: int = 1_700_000_000_000,
    store_host: bytes = H4,
    topic: str = "T",
    queue_id: int = 0,
    max_body_size: int = 4 << 20,
) -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], bytes]:
    """_records.stamp with keyword arguments and the common defaults."""
    return _records.stamp(
        buf,
        start,
        len(buf) if end is None else end,
        base,
        queue_offset,
        store_ts,
        store_host,
        topic.encode("utf-8"),
        queue_id,
        max_body_size,
    )


def units_of(raw: bytes) -> list[tuple[int, int, int]]:
    """ConsumeQueue units as (phyOffset, size, tagsCode)."""
    assert len(raw) % UNIT.size == 0
    return list(UNIT.iter_unpack(raw))


@pytest.fixture
def log_file(tmp_path: Path) -> Iterator[int]:
    """A read-write file descriptor on a fresh CommitLog-like file."""
    fd = os.open(tmp_path / "commitlog", os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        yield fd
    finally:
        os.close(fd)


def write_at(fd: int, data: bytes | bytearray, file_pos: int, *, after: bytes = b"") -> None:
    """Replace the file with ``file_pos`` bytes of 0xEE, ``data``, then ``after``."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, b"\xee" * file_pos + bytes(data) + after, 0)


# -- crc32 -------------------------------------------------------------------------------


def test_crc32_matches_zlib_for_every_length_up_to_300_and_every_alignment() -> None:
    """Both CRCs equal zlib's for lengths 0..300, eight start alignments and several seeds."""
    rng = random.Random(20240501)
    data = rng.randbytes(300 + 8)
    view = memoryview(data)
    for length in range(301):
        for align in range(8):
            chunk = view[align : align + length]
            for start in (0, 1, 0xFFFFFFFF, rng.getrandbits(32)):
                expected = zlib.crc32(chunk, start)
                assert _records.crc32(chunk, start) == expected, (length, align, start)
                assert _records.crc32_portable(chunk, start) == expected, (length, align, start)


@pytest.mark.parametrize("length", [4095, 4096, 4097, 70000, 70001, 1 << 20, (1 << 20) + 15])
def test_crc32_matches_zlib_on_large_inputs(length: int) -> None:
    """The carry-less bulk path plus the table tail equal zlib on large buffers."""
    data = random.Random(length).randbytes(length)
    for start in (0, 0x12345678):
        expected = zlib.crc32(data, start)
        assert _records.crc32(data, start) == expected
        assert _records.crc32_portable(data, start) == expected
    assert _records.crc32(data) == zlib.crc32(data)


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(max_size=3000),
    start=st.integers(0, 2**32 - 1),
    prefix=st.integers(0, 15),
)
def test_crc32_matches_zlib_on_random_bytes(data: bytes, start: int, prefix: int) -> None:
    """Random bytes at a random offset inside a larger buffer, random running CRC."""
    view = memoryview(bytes(prefix) + data)[prefix:]
    expected = zlib.crc32(data, start)
    assert _records.crc32(view, start) == expected
    assert _records.crc32_portable(view, start) == expected


def test_crc32_accepts_bytearray_memoryview_and_mmap() -> None:
    """Every buffer-protocol type the store passes gives zlib's answer."""
    data = random.Random(7).randbytes(70001)
    expected = zlib.crc32(data, 99)
    with mmap.mmap(-1, len(data)) as mapped:
        mapped[:] = data
        inputs: list[bytes | bytearray | memoryview | mmap.mmap] = [
            data,
            bytearray(data),
            memoryview(data),
            memoryview(bytearray(data)),
            mapped,
        ]
        for buf in inputs:
            assert _records.crc32(buf, 99) == expected, type(buf)
            assert _records.crc32_portable(buf, 99) == expected, type(buf)


@pytest.mark.parametrize(
    "len_b", [0, 1, 7, 64, 255, 256, 1024, 4097, 65535, 65536, 1 << 20, (1 << 24) + 3]
)
def test_crc32_combine_is_the_crc_of_the_concatenation(len_b: int) -> None:
    """stamp's whole-record CRC combines the head's CRC with the body's: held to zlib."""
    rng = random.Random(len_b)
    for len_a in (0, 1, 90, 1000):
        a, b = rng.randbytes(len_a), rng.randbytes(len_b)
        assert _records.crc32_combine(zlib.crc32(a), zlib.crc32(b), len_b) == zlib.crc32(a + b)


def test_crc32_chains_like_zlib() -> None:
    """crc32(b, crc32(a)) is the CRC of a + b, across the 64-byte bulk boundary too."""
    data = random.Random(3).randbytes(1000)
    for cut in (0, 1, 63, 64, 65, 500, 999, 1000):
        running = _records.crc32(data[:cut])
        assert _records.crc32(data[cut:], running) == zlib.crc32(data)
        running = _records.crc32_portable(data[:cut])
        assert _records.crc32_portable(data[cut:], running) == zlib.crc32(data)


# -- scan --------------------------------------------------------------------------------


def sample_log(base: int = 1 << 30) -> tuple[bytearray, list[Placed], list[int]]:
    """Five records (IPv4 and IPv6 hosts, prepared and plain) followed by zeroes."""
    messages = [
        Message(topic="TopicA", body=b"first", tags="a"),
        Message(topic="TopicA", body=b"", born_host="[::1]:1234"),
        Message(topic="主题", body=b"x" * 300, tags="标签", sys_flag=TRANSACTION_PREPARED_TYPE),
        Message(topic="TopicB", body=b"fourth", keys=["k1", "k2"]),
        Message(topic="TopicB", body=b"fifth", born_host="[2001:db8::1]:9", tags="tag😀"),
    ]
    hosts = [H4, H6, H4, H6, H6]
    timestamps = [1000, 1005, 1005, 1010, 1020]
    buf, placed = encode_log(messages, hosts, base, timestamps)
    return buf + bytes(256), placed, timestamps


def test_tags_code_at_matches_the_python_hash_of_each_records_tags() -> None:
    """The C tagsCode recovery checks units against, held to store.hashing."""
    buf, placed, _ = sample_log()
    for p in placed:
        tags = decode_properties(p.encoded.properties).get(PROPERTY_TAGS)
        assert _records.tags_code_at(buf, p.start) == tags_code(tags)
    assert _records.tags_code_at(buf, placed[-1].end) is None  # zeroes: no record
    assert _records.tags_code_at(buf, placed[0].start + 1) is None
    assert _records.tags_code_at(buf, len(buf)) is None


def test_scan_walks_clean_records_to_the_zeroes() -> None:
    """A clean log ends at the zeroes: END, every record counted, the last store time."""
    base = 1 << 30
    buf, placed, _ = sample_log(base)
    result = _records.scan(buf, 0, len(buf), base, True, 1004)
    assert result == (placed[-1].end, _records.KIND_END, "", 1020, placed[1].start, 5)
    assert result == python_scan(buf, len(buf), base, True, 1004)


@pytest.mark.parametrize(
    ("newer_than_ms", "first_newer_record"),
    [(-1, 0), (999, 0), (1000, 1), (1005, 3), (1019, 4), (1020, None), (2**63 - 1, None)],
)
def test_scan_reports_the_first_record_newer_than_the_threshold(
    newer_than_ms: int, first_newer_record: int | None
) -> None:
    """first_newer_pos is the first record whose store time is strictly newer, else -1."""
    base = 4096
    buf, placed, _ = sample_log(base)
    _, kind, _, _, first_newer, count = _records.scan(buf, 0, len(buf), base, True, newer_than_ms)
    assert (kind, count) == (_records.KIND_END, 5)
    expected = -1 if first_newer_record is None else placed[first_newer_record].start
    assert first_newer == expected


def test_scan_from_a_middle_position_and_on_every_buffer_type() -> None:
    """pos sits at base + pos; bytes, bytearray, memoryview and mmap give one answer."""
    base = 1 << 20
    buf, placed, _ = sample_log(base)
    expected = (placed[-1].end, _records.KIND_END, "", 1020, placed[3].start, 3)
    with mmap.mmap(-1, len(buf)) as mapped:
        mapped[:] = bytes(buf)
        inputs: list[bytes | bytearray | memoryview | mmap.mmap] = [
            bytes(buf),
            buf,
            memoryview(buf),
            mapped,
        ]
        for data in inputs:
            assert _records.scan(data, placed[2].start, len(buf), base, True, 1005) == expected


def test_scan_of_an_empty_or_tiny_region_is_end() -> None:
    """Fewer than 8 readable bytes: nothing more to read (no record, no verdict)."""
    buf, _, _ = sample_log(0)
    assert _records.scan(buf, 0, 0, 0, True, 0) == (0, _records.KIND_END, "", 0, -1, 0)
    assert _records.scan(buf, 0, 7, 0, True, 0) == (0, _records.KIND_END, "", 0, -1, 0)
    assert _records.scan(b"", 0, 0, 0, True, 0) == (0, _records.KIND_END, "", 0, -1, 0)


def corrupt(buf: bytearray, placed: list[Placed], how: str, k: int, rng: random.Random) -> None:
    """Damage record ``k`` of ``buf`` in place in the named way."""
    rec = placed[k]
    if how == "flip":
        buf[rng.randrange(rec.start, rec.end)] ^= rng.randrange(1, 256)
    elif how == "zero16":
        at = rng.randrange(rec.start, rec.end)
        buf[at : at + 16] = bytes(len(buf[at : at + 16]))
    elif how == "truncate":
        cut = rng.randrange(rec.start + 1, rec.end)
        buf[cut:] = bytes(len(buf) - cut)
    elif how == "physical_offset":
        (phys,) = struct.unpack_from(">q", buf, rec.start + 28)
        struct.pack_into(">q", buf, rec.start + 28, phys + rng.choice([-1, 1, 1 << 30]))
    elif how == "bad_magic":
        struct.pack_into(">I", buf, rec.start + 4, rng.getrandbits(32) | 1)
    elif how == "blank":
        struct.pack_into(">iI", buf, rec.start, rng.randrange(8, 1 << 20), BLANK_MAGIC_CODE)
    elif how == "bad_topic":
        n = len(rec.encoded.topic.encode("utf-8"))
        if n:
            invalid = rng.choice([b"\xff", b"\xc0", b"\xed\xa0\x80", b"\xf4\x90", b"\x80"])
            buf[rec.topic_at : rec.topic_at + n] = (invalid * n)[:n]
    elif how == "body":
        if rec.encoded.body:
            buf[rng.randrange(rec.body_at, rec.body_at + len(rec.encoded.body))] ^= 0x5A
    elif how == "totalsize":
        struct.pack_into(">i", buf, rec.start, rng.choice([0, 90, rec.encoded.size + 1, -1]))
    else:
        raise AssertionError(how)


def damaged_log(
    messages: list[Message],
    v6_store: list[bool],
    base: int,
    padding: int,
    damage: list[tuple[str, int]],
    seed: int,
) -> bytearray:
    """``messages`` stored 10 ms apart from 1000, then ``padding`` zeroes; then damaged."""
    hosts = [H6 if v6 else H4 for v6 in v6_store[: len(messages)]]
    timestamps = [1000 + 10 * i for i in range(len(messages))]
    buf, placed = encode_log(messages, hosts, base, timestamps)
    buf += bytes(padding)
    rng = random.Random(seed)
    for how, k in damage:
        corrupt(buf, placed, how, k % len(placed), rng)
    return buf


CORRUPTIONS = [
    "flip",
    "zero16",
    "truncate",
    "physical_offset",
    "bad_magic",
    "blank",
    "bad_topic",
    "body",
    "totalsize",
]

scan_messages = st.builds(
    Message,
    topic=st.sampled_from(["T", "TopicA", "主题", "é", "", "x" * 127]),
    body=st.binary(max_size=200),
    tags=st.sampled_from(TAGS),
    sys_flag=st.sampled_from(SYS_FLAGS),
    born_host=st.sampled_from(BORN_HOSTS),
)


@settings(max_examples=300, deadline=None)
@given(
    messages=st.lists(scan_messages, min_size=1, max_size=5),
    v6_store=st.lists(st.booleans(), min_size=5, max_size=5),
    base=st.integers(0, 2**40),
    padding=st.integers(0, 64),
    damage=st.lists(st.tuples(st.sampled_from(CORRUPTIONS), st.integers(0, 4)), max_size=2),
    seed=st.integers(0, 2**32),
    short_limit=st.none() | st.integers(0, 2000),
    newer_than_ms=st.integers(995, 1060),
)
def test_scan_agrees_with_check_record_on_damaged_logs(
    messages: list[Message],
    v6_store: list[bool],
    base: int,
    padding: int,
    damage: list[tuple[str, int]],
    seed: int,
    short_limit: int | None,
    newer_than_ms: int,
) -> None:
    """Whatever the damage, the C walk stops where check_record does, with its verdict."""
    buf = damaged_log(messages, v6_store, base, padding, damage, seed)
    limit = len(buf) if short_limit is None else min(short_limit, len(buf))
    for check_crc in (True, False):
        expected = python_scan(buf, limit, base, check_crc, newer_than_ms)
        assert _records.scan(buf, 0, limit, base, check_crc, newer_than_ms) == expected


@pytest.mark.parametrize(
    ("how", "kind", "reason"),
    [
        ("physical_offset", _records.KIND_CORRUPT, "PHYSICALOFFSET"),
        ("bad_magic", _records.KIND_CORRUPT, "bad magic code"),
        ("blank", _records.KIND_BLANK, ""),
        ("bad_topic", _records.KIND_CORRUPT, "topic is not UTF-8"),
        ("body", _records.KIND_CORRUPT, "body CRC mismatch"),
        ("totalsize", _records.KIND_CORRUPT, "TOTALSIZE"),
    ],
)
def test_scan_stops_at_the_damaged_record(how: str, kind: int, reason: str) -> None:
    """Each kind of damage to record 3 stops the walk exactly there, with its reason."""
    base = 8192
    buf, placed, _ = sample_log(base)
    corrupt(buf, placed, how, 3, random.Random(how))
    pos, got_kind, got_reason, last_ts, _, count = _records.scan(buf, 0, len(buf), base, True, 0)
    assert (pos, got_kind, last_ts, count) == (placed[3].start, kind, 1005, 3)
    assert reason in got_reason
    assert bool(got_reason) == bool(reason)
    assert python_scan(buf, len(buf), base, True, 0) == (
        pos,
        got_kind,
        got_reason,
        last_ts,
        0,
        count,
    )


def test_scan_checks_the_body_crc_only_when_asked() -> None:
    """A changed body byte is CORRUPT with check_crc, and passes without it."""
    base = 0
    buf, placed, _ = sample_log(base)
    buf[placed[2].body_at + 17] ^= 0xFF
    with_crc = _records.scan(buf, 0, len(buf), base, True, 0)
    without = _records.scan(buf, 0, len(buf), base, False, 0)
    assert with_crc[:3] == (placed[2].start, _records.KIND_CORRUPT, "body CRC mismatch")
    assert without == (placed[-1].end, _records.KIND_END, "", 1020, 0, 5)
    assert with_crc == python_scan(buf, len(buf), base, True, 0)
    assert without == python_scan(buf, len(buf), base, False, 0)


def test_scan_stops_at_a_record_past_the_limit() -> None:
    """A record reaching past ``limit`` is CORRUPT (TOTALSIZE out of range)."""
    base = 0
    buf, placed, _ = sample_log(base)
    limit = placed[4].end - 1
    result = _records.scan(buf, 0, limit, base, True, 0)
    reason = f"TOTALSIZE {placed[4].encoded.size} out of range"
    assert result[:3] == (placed[4].start, _records.KIND_CORRUPT, reason)
    assert result == python_scan(buf, limit, base, True, 0)


def test_scan_checks_topic_utf8_like_python_on_every_two_byte_topic() -> None:
    """All 65536 two-byte topics: C's strict UTF-8 check equals Python's decoder."""
    encoded = EncodedMessage(Message(topic="ab", body=b"b"), store_host=H4)
    buf = bytearray(encoded.encode(0, 0, 1))
    at = Placed(encoded, 0).topic_at
    disagreements = []
    for first in range(256):
        for second in range(256):
            buf[at] = first
            buf[at + 1] = second
            c_kind = _records.scan(buf, 0, len(buf), 0, True, 0)[1]
            try:
                bytes((first, second)).decode("utf-8")
                valid = True
            except UnicodeDecodeError:
                valid = False
            if (c_kind == _records.KIND_END) != valid:
                disagreements.append(bytes((first, second)))
    assert disagreements == []


@settings(max_examples=300, deadline=None)
@given(
    topic=st.binary(min_size=1, max_size=6)
    | st.lists(
        st.sampled_from([0x41, 0x7F, 0x80, 0xBF, 0xC2, 0xDF, 0xE0, 0xED, 0xEF, 0xF0, 0xF4, 0xF5]),
        min_size=1,
        max_size=6,
    ).map(bytes)
)
@example(topic=b"\xed\xa0\x80")  # a surrogate
@example(topic=b"\xe0\x80\x80")  # an overlong
@example(topic=b"\xf4\x90\x80\x80")  # above U+10FFFF
@example(topic="😀".encode())
def test_scan_topic_utf8_verdict_equals_pythons_decoder(topic: bytes) -> None:
    """Topic bytes near every UTF-8 boundary: valid exactly when Python decodes them."""
    encoded = EncodedMessage(Message(topic="x" * len(topic), body=b"b"), store_host=H4)
    buf = bytearray(encoded.encode(0, 0, 1))
    at = Placed(encoded, 0).topic_at
    buf[at : at + len(topic)] = topic
    result = _records.scan(buf, 0, len(buf), 0, True, 0)
    assert result == python_scan(buf, len(buf), 0, True, 0)
    try:
        topic.decode("utf-8")
        assert result[1] == _records.KIND_END
    except UnicodeDecodeError:
        assert result[:3] == (0, _records.KIND_CORRUPT, "topic is not UTF-8")


# -- stamp -------------------------------------------------------------------------------


stamp_messages = st.builds(
    Message,
    body=st.binary(max_size=300),
    tags=st.sampled_from(TAGS),
    keys=st.sampled_from([(), ("k1",), ("k1", "k2")]),
    properties=st.sampled_from([{}, {"XTAGS": "decoy"}, {"UNIQ_KEY": "ABC", "P": "值"}]),
    sys_flag=st.sampled_from(SYS_FLAGS),
    born_host=st.sampled_from(BORN_HOSTS),
    born_timestamp_ms=st.integers(0, 2**41),
    flag=st.integers(-(2**31), 2**31 - 1),
)


@settings(max_examples=150, deadline=None)
@given(
    bodies=st.lists(stamp_messages, min_size=1, max_size=8),
    topic=st.sampled_from(["T", "TopicA", "主题-1"]),
    queue_id=st.integers(0, 2**31 - 1),
    store_host=st.sampled_from([IPV4_HOST, IPV6_HOST, "10.1.2.3:99", "[2001:db8::1]:7"]),
    prefix=st.integers(0, 40),
    base=st.integers(0, 2**50),
    queue_offset=st.integers(0, 2**40),
    store_ts=st.integers(0, 2**42),
)
def test_stamp_fills_exactly_the_broker_fields(
    bodies: list[Message],
    topic: str,
    queue_id: int,
    store_host: str,
    prefix: int,
    base: int,
    queue_offset: int,
    store_ts: int,
) -> None:
    """Each stamped record equals the one encoded with its offsets; units match decoding."""
    messages = [
        Message(
            topic=topic,
            body=m.body,
            queue_id=queue_id,
            tags=m.tags,
            keys=m.keys,
            properties=m.properties,
            flag=m.flag,
            sys_flag=m.sys_flag,
            born_timestamp_ms=m.born_timestamp_ms,
            born_host=m.born_host,
        )
        for m in bodies
    ]
    host = encode_host(store_host)
    records = encode_unstamped(messages, host)
    head, tail = b"\xaa" * prefix, b"\xbb" * 9
    buf = bytearray(head + records + tail)
    max_body = max(len(m.body) for m in messages)

    next_q, phys, qoffs, sizes, units = stamp(
        buf,
        start=prefix,
        end=prefix + len(records),
        base=base,
        queue_offset=queue_offset,
        store_ts=store_ts,
        store_host=host,
        topic=topic,
        queue_id=queue_id,
        max_body_size=max_body,
    )

    assert buf[:prefix] == head and buf[prefix + len(records) :] == tail
    pos, q = prefix, queue_offset
    expected_units = b""
    for i, m in enumerate(messages):
        encoded = EncodedMessage(m, store_host=host)
        dispatchable = is_dispatchable(m.sys_flag)
        expected_q = q if dispatchable else 0
        raw = bytes(buf[pos : pos + encoded.size])
        assert raw == encoded.encode(expected_q, base + pos - prefix, store_ts), i
        record = decode_record(buf, pos)
        assert record.queue_offset == expected_q
        assert record.commit_log_offset == base + pos - prefix == phys[i]
        assert record.store_timestamp_ms == store_ts
        assert record.store_host == decode_host(host)
        assert record.body_crc == zlib.crc32(m.body) & 0x7FFFFFFF
        assert (qoffs[i], sizes[i]) == (expected_q, encoded.size)
        if dispatchable:
            expected_units += UNIT.pack(base + pos - prefix, encoded.size, tags_code(m.tags))
            q += 1
        pos += encoded.size
    assert pos == prefix + len(records)
    assert next_q == q
    assert units == expected_units
    assert len(phys) == len(qoffs) == len(sizes) == len(messages)


@pytest.mark.parametrize("tags", ["a", "TagA", "标签", "tag😀", "é", "", None, "a" * 200])
@pytest.mark.parametrize("extra", [{}, {"XTAGS": "decoy"}, {"A": "TAGS"}])
def test_stamp_units_carry_javas_hash_of_the_tags(tags: str | None, extra: dict[str, str]) -> None:
    """tagsCode is String.hashCode of TAGS (UTF-16 for non-ASCII), 0 without a tag."""
    message = Message(topic="T", body=b"b", tags=tags, properties=extra)
    buf = encode_unstamped([message], H4)
    _, _, _, sizes, units = stamp(buf, base=777)
    assert units_of(units) == [(777, sizes[0], tags_code(tags))]


def test_stamp_skips_prepared_and_rolled_back_records_in_the_queue() -> None:
    """Prepared/rollback records get queue offset 0 and no unit; the others stay consecutive."""
    flags = [
        0,
        TRANSACTION_PREPARED_TYPE,
        TRANSACTION_COMMIT_TYPE,
        TRANSACTION_ROLLBACK_TYPE,
        TRANSACTION_PREPARED_TYPE | COMPRESSED_FLAG,
        COMPRESSED_FLAG,
    ]
    messages = [Message(topic="T", body=b"b%d" % i, sys_flag=f) for i, f in enumerate(flags)]
    buf = encode_unstamped(messages, H4)
    next_q, phys, qoffs, sizes, units = stamp(buf, base=100, queue_offset=41)
    assert next_q == 44
    assert qoffs == (41, 0, 42, 0, 0, 43)
    assert [decode_record(buf, p - 100).queue_offset for p in phys] == list(qoffs)
    assert [u[0] for u in units_of(units)] == [phys[0], phys[2], phys[5]]
    assert [u[1] for u in units_of(units)] == [sizes[0], sizes[2], sizes[5]]


def test_stamp_of_an_empty_range_assigns_nothing() -> None:
    """An empty range returns the queue offset unchanged and no records."""
    assert stamp(bytearray(b"\xff" * 10), start=4, end=4, queue_offset=9) == (9, (), (), (), b"")


def test_stamp_releases_the_gil_path_for_large_batches_with_the_same_result() -> None:
    """A batch over 1 MiB (stamped with the GIL released) gets the same fields and units."""
    rng = random.Random(11)
    messages = [
        Message(topic="Big", body=rng.randbytes(70_000), tags=["a", "标签", None][i % 3])
        for i in range(17)
    ]
    buf = encode_unstamped(messages, H6)
    assert len(buf) >= 1 << 20
    next_q, phys, qoffs, _, units = stamp(buf, base=1 << 33, store_host=H6, topic="Big")
    assert next_q == 17 and qoffs == tuple(range(17))
    for i, m in enumerate(messages):
        record = decode_record(buf, phys[i] - (1 << 33))
        assert record.body_crc == zlib.crc32(m.body) & 0x7FFFFFFF
        assert record.store_host == IPV6_HOST
        assert units_of(units)[i] == (phys[i], record.store_size, tags_code(m.tags))


def test_stamp_accepts_a_body_of_exactly_max_body_size() -> None:
    """max_body_size is inclusive: a body of that size passes, one byte more is refused."""
    buf = encode_unstamped([Message(topic="T", body=b"z" * 100)], H4)
    assert stamp(bytearray(buf), max_body_size=100)[0] == 1
    with pytest.raises(ValueError, match="body of 100 bytes exceeds max_message_size 99"):
        stamp(bytearray(buf), max_body_size=99)


# -- malformed batches (stamp and put_batch) ---------------------------------------------

BATCH_TOPIC = "NativeTopic"
BATCH_QUEUE = 1
MAX_BODY = 256


@dataclass(frozen=True, slots=True)
class Malformed:
    """A producer batch whose record ``index`` (at ``byte``) must be refused for ``reason``."""

    name: str
    raw: bytes
    reason: str
    index: int
    byte: int
    store_host: str = IPV4_HOST


def good_records(count: int, host: bytes) -> bytes:
    return bytes(
        encode_unstamped(
            [
                Message(topic=BATCH_TOPIC, body=b"ok-%d" % i, queue_id=BATCH_QUEUE, tags="t")
                for i in range(count)
            ],
            host,
        )
    )


def malformed_batches() -> list[Malformed]:
    """Two valid records, then a bad one (or bad bytes), for each refusal reason."""
    good = good_records(2, H4)
    good6 = good_records(2, H6)
    n = len(good)

    def one(host: bytes = H4, **kw: object) -> bytes:
        values: dict[str, object] = {
            "topic": BATCH_TOPIC,
            "body": b"bad",
            "queue_id": BATCH_QUEUE,
            "tags": "t",
        }
        values.update(kw)
        return bytes(encode_unstamped([Message(**values)], host))  # type: ignore[arg-type]

    def with_bytes(record: bytes, utf8: bytes, replacement: bytes) -> bytes:
        # Properties and topics are str, so bad UTF-8 is patched into the bytes.
        assert record.count(utf8) == 1 and len(replacement) == len(utf8)
        return record.replace(utf8, replacement)

    last = one()
    encoded = EncodedMessage(
        Message(topic=BATCH_TOPIC, body=b"bad", queue_id=BATCH_QUEUE, tags="t"), store_host=H4
    )
    bad_bodylen = bytearray(last)
    bodylen_at = Placed(encoded, 0).body_at - 4
    assert struct.unpack_from(">i", bad_bodylen, bodylen_at) == (3,)
    struct.pack_into(">i", bad_bodylen, bodylen_at, 10_000)
    return [
        Malformed(
            "wrong topic",
            good + one(topic="OtherTopic"),
            "record topic differs from the batch's",
            2,
            n,
        ),
        Malformed(
            "wrong queue id",
            good + one(queue_id=2),
            f"record queue id 2 differs from the batch's {BATCH_QUEUE}",
            2,
            n,
        ),
        Malformed(
            "body too large",
            good + one(body=b"B" * (MAX_BODY + 1)),
            f"body of {MAX_BODY + 1} bytes exceeds max_message_size {MAX_BODY}",
            2,
            n,
        ),
        Malformed(
            "truncated last record",
            good + last[:-5],
            f"TOTALSIZE {len(last)} out of range",
            2,
            n,
        ),
        Malformed("garbage", good + b"garbage!garbage!", "bad magic code 0x61676521", 2, n),
        Malformed("short garbage", good + b"gar", "not a message record", 2, n),
        Malformed(
            "blank inside a batch",
            good + struct.pack(">iI", 8, BLANK_MAGIC_CODE),
            "not a message record (magic 0xCBD43194)",
            2,
            n,
        ),
        Malformed(
            "inconsistent BODYLEN",
            good + bytes(bad_bodylen),
            "BODYLEN 10000 inconsistent",
            2,
            n,
        ),
        Malformed(
            "IPv6 record for an IPv4 store",
            good + one(H6),
            "store host is IPv4 but the record's SYSFLAG says IPv6",
            2,
            n,
        ),
        Malformed(
            "IPv4 record for an IPv6 store",
            good6 + one(H4),
            "store host is IPv6 but the record's SYSFLAG says IPv4",
            2,
            len(good6),
            store_host=IPV6_HOST,
        ),
        Malformed(
            "property value not UTF-8",
            good + with_bytes(one(properties={"k": "é"}), "é".encode(), b"\xff\xfe"),
            "properties are not UTF-8",
            2,
            n,
        ),
        Malformed(
            "surrogate in a property name",  # what Python's strict decoder refuses
            good + with_bytes(one(properties={"€": "v"}), "€".encode(), b"\xed\xa0\x80"),
            "properties are not UTF-8",
            2,
            n,
        ),
        Malformed(
            "overlong NUL in the tags",
            good + with_bytes(one(tags="tá"), "á".encode(), b"\xc0\x80"),
            "properties are not UTF-8",
            2,
            n,
        ),
        Malformed(
            # Refused as a topic other than the batch's (a str, so valid UTF-8).
            "topic not UTF-8",
            good + with_bytes(one(), BATCH_TOPIC.encode(), b"\xffativeTopic"),
            "record topic differs from the batch's",
            2,
            n,
        ),
        Malformed(
            "first record bad",
            one(queue_id=5) + good,
            f"record queue id 5 differs from the batch's {BATCH_QUEUE}",
            0,
            0,
        ),
    ]


MALFORMED = malformed_batches()


@pytest.mark.parametrize("case", MALFORMED, ids=[c.name for c in MALFORMED])
def test_stamp_refuses_a_malformed_batch_naming_the_record_and_reason(case: Malformed) -> None:
    """ValueError names the first bad record's index, its byte and why."""
    prefix = 13
    buf = bytearray(b"\x01" * prefix + case.raw)
    expected = f"record {case.index} (byte {case.byte} of the batch): "
    with pytest.raises(ValueError, match="^" + re.escape(expected)) as excinfo:
        stamp(
            buf,
            start=prefix,
            base=4096,
            store_host=encode_host(case.store_host),
            topic=BATCH_TOPIC,
            queue_id=BATCH_QUEUE,
            max_body_size=MAX_BODY,
        )
    assert case.reason in str(excinfo.value)
    # The reason alone, for a caller that words it otherwise (a lone record's refusal).
    assert str(excinfo.value) == expected + excinfo.value.reason  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("start", "end", "host"),
    [
        (-1, None, H4),
        (0, 10_000, H4),
        (50, 40, H4),
        (0, None, H4[:7]),
        (0, None, H4 + b"\x00"),
        (0, None, b""),
        (0, None, H6[:19]),
    ],
)
def test_stamp_refuses_bad_bounds_and_store_hosts(start: int, end: int | None, host: bytes) -> None:
    """Bounds outside the buffer, reversed bounds and a host not of 8 or 20 bytes."""
    buf = encode_unstamped([Message(topic="T", body=b"x")], H4)
    before = bytes(buf)
    with pytest.raises(ValueError, match="bad batch bounds or store host"):
        stamp(buf, start=start, end=len(buf) if end is None else end, store_host=host)
    assert buf == before


# -- dispatch ----------------------------------------------------------------------------


@dataclass(slots=True)
class Stamped:
    """A CommitLog stretch built from stamped batches, with what stamp returned."""

    data: bytearray = field(default_factory=bytearray)
    #: (topic, queue_id, queue_offset) -> the unit stamp returned for that record.
    units: dict[tuple[str, int, int], bytes] = field(default_factory=dict)
    #: phys -> (size, sys_flag, raw properties, store_ts) of every record.
    records: dict[int, tuple[int, int, bytes, int]] = field(default_factory=dict)
    #: (topic, queue_id) -> the next queue offset.
    next_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    count: int = 0
    last_ts: int = 0

    def add(
        self,
        messages: Sequence[Message],
        base: int,
        store_ts: int,
        host: bytes = H4,
        queue_offset: int | None = None,
    ) -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], bytes]:
        """Stamp a batch of one (topic, queue id) onto the end, as CommitLog.append does."""
        topic, queue_id = messages[0].topic, messages[0].queue_id
        key = (topic, queue_id)
        first = self.next_offsets.get(key, 0) if queue_offset is None else queue_offset
        batch = encode_unstamped(messages, host)
        start = len(self.data)
        result = stamp(
            batch,
            base=base + start,
            queue_offset=first,
            store_ts=store_ts,
            store_host=host,
            topic=topic,
            queue_id=queue_id,
        )
        next_q, phys, qoffs, sizes, units = result
        self.data += batch
        self.next_offsets[key] = next_q
        unit_list = [units[i : i + UNIT.size] for i in range(0, len(units), UNIT.size)]
        dispatchable = [i for i, m in enumerate(messages) if is_dispatchable(m.sys_flag)]
        assert len(unit_list) == len(dispatchable)
        for i, unit in zip(dispatchable, unit_list, strict=True):
            self.units[topic, queue_id, qoffs[i]] = unit
        for i, m in enumerate(messages):
            encoded = EncodedMessage(m, store_host=host)
            self.records[phys[i]] = (sizes[i], encoded.sys_flag, encoded.properties, store_ts)
        self.count += len(messages)
        self.last_ts = store_ts
        return result


def dispatch_once(
    fd: int,
    file_pos: int,
    avail: int,
    base: int,
    window: bytearray,
    want_records: bool = True,
    cache: dict[bytes, str] | None = None,
) -> DispatchResult:
    """One _records.dispatch call (a fresh topic cache unless one is given)."""
    return _records.dispatch(
        fd, file_pos, avail, base, window, want_records, {} if cache is None else cache
    )


def test_dispatch_returns_the_units_stamp_returned(log_file: int) -> None:
    """One batch: one run equal to stamp's units; records point at each properties block."""
    base, file_pos = 1 << 30, 512
    log = Stamped()
    messages = [
        Message(topic="T", body=b"b%d" % i, queue_id=3, tags=t)
        for i, t in enumerate(["a", "标签", None, "tag😀"])
    ]
    next_q, phys, _, sizes, units = log.add(messages, base, 1234, queue_offset=10)
    write_at(log_file, log.data, file_pos, after=b"\xff" * 64)
    window = bytearray(1 << 16)
    pos, kind, reason, consumed, last_ts, runs, records, need = dispatch_once(
        log_file, file_pos, len(log.data), base, window
    )
    assert (pos, kind, reason, consumed, last_ts) == (len(log.data), _records.KIND_END, "", 4, 1234)
    assert runs == [("T", 3, 10, 4, units)]
    assert next_q == 14
    assert records is not None and len(records) == 4
    for i, (topic, qid, p, size, tags, ts, qoff, flag, ps, pe) in enumerate(records):
        assert (topic, qid, p, size, ts, qoff, flag) == ("T", 3, phys[i], sizes[i], 1234, 10 + i, 0)
        assert tags == tags_code(messages[i].tags)
        assert window[ps:pe] == log.records[p][2]
        assert pe == p - base + sizes[i]
    assert need == 0


def test_dispatch_groups_interleaved_queues_into_runs(log_file: int) -> None:
    """Runs follow each run's first record; a queue continued later extends its run."""
    base = 0
    log = Stamped()
    a = [Message(topic="A", body=b"a", queue_id=0, tags="x") for _ in range(3)]
    b = [Message(topic="B", body=b"b", queue_id=0) for _ in range(2)]
    a1 = [Message(topic="A", body=b"a1", queue_id=1)]
    log.add(a, base, 1)
    log.add(b, base, 2, queue_offset=100)
    log.add(a, base, 3)
    log.add(a1, base, 4, host=H6)
    log.add(a[:1], base, 5, queue_offset=50)  # a gap: a new run for A/0
    write_at(log_file, log.data, 0)
    _, kind, _, consumed, last_ts, runs, records, _ = dispatch_once(
        log_file, 0, len(log.data), base, bytearray(1 << 16), want_records=False
    )
    assert (kind, consumed, last_ts, records) == (_records.KIND_END, 10, 5, None)
    assert [(t, q, first, n) for t, q, first, n, _ in runs] == [
        ("A", 0, 0, 6),
        ("B", 0, 100, 2),
        ("A", 1, 0, 1),
        ("A", 0, 50, 1),
    ]
    for topic, qid, first, n, units in runs:
        for i in range(n):
            assert units[20 * i : 20 * i + 20] == log.units[topic, qid, first + i]


def test_dispatch_window_smaller_than_a_record_asks_for_its_size(log_file: int) -> None:
    """KIND_MORE with nothing consumed and ``need`` = the record's TOTALSIZE."""
    log = Stamped()
    log.add([Message(topic="T", body=b"x" * 500)], 0, 1)
    log.add([Message(topic="T", body=b"y")], 0, 2)
    write_at(log_file, log.data, 0)
    first_size = log.records[0][0]
    for window_size in (8, 100, first_size - 1):
        result = dispatch_once(log_file, 0, len(log.data), 0, bytearray(window_size))
        pos, kind, _, consumed, _, runs, records, need = result
        assert (pos, kind, consumed, runs, records, need) == (
            0,
            _records.KIND_MORE,
            0,
            [],
            [],
            first_size,
        )
    # A window of exactly that size takes the record and stops at the next one.
    result = dispatch_once(log_file, 0, len(log.data), 0, bytearray(first_size))
    assert result[:4] == (first_size, _records.KIND_MORE, "", 1)
    assert [r[:4] for r in result[5]] == [("T", 0, 0, 1)]
    # Less than a TOTALSIZE + MAGICCODE: ask for 8 bytes.
    tiny = dispatch_once(log_file, 0, len(log.data), 0, bytearray(5))
    assert (tiny[0], tiny[1], tiny[3], tiny[7]) == (0, _records.KIND_MORE, 0, 8)


def test_dispatch_stops_at_an_end_of_file_blank(log_file: int) -> None:
    """A blank after the records: KIND_BLANK at the blank, the records before dispatched."""
    log = Stamped()
    log.add([Message(topic="T", body=b"x", tags="a")] * 3, 1 << 20, 9)
    blank = struct.pack(">iI", 4096 - len(log.data), BLANK_MAGIC_CODE)
    write_at(log_file, log.data + blank, 0)
    avail = 4096
    os.ftruncate(log_file, avail)
    pos, kind, reason, consumed, last_ts, runs, _, _ = dispatch_once(
        log_file, 0, avail, 1 << 20, bytearray(1 << 14)
    )
    assert (pos, kind, reason, consumed, last_ts) == (len(log.data), _records.KIND_BLANK, "", 3, 9)
    assert [r[:4] for r in runs] == [("T", 0, 0, 3)]


def test_dispatch_reports_zeroes_below_the_written_end_as_corrupt(log_file: int) -> None:
    """Below ``avail`` every byte belongs to a record: 8+ zero bytes are KIND_CORRUPT."""
    log = Stamped()
    log.add([Message(topic="T", body=b"x")] * 2, 0, 7)
    write_at(log_file, log.data + bytes(64), 0)
    pos, kind, reason, consumed, _, runs, _, _ = dispatch_once(
        log_file, 0, len(log.data) + 64, 0, bytearray(4096)
    )
    assert (pos, kind, consumed) == (len(log.data), _records.KIND_CORRUPT, 2)
    assert reason == "no record below the written end"
    assert [r[:4] for r in runs] == [("T", 0, 0, 2)]


def test_dispatch_reports_a_short_non_record_tail_below_the_written_end_as_corrupt(
    log_file: int,
) -> None:
    """1-7 bytes below ``avail`` that the window fully holds can never become a record.

    They must be KIND_CORRUPT like 8+ zero bytes; KIND_MORE ("call again from pos")
    makes the dispatcher call again forever with the same answer.
    """
    log = Stamped()
    log.add([Message(topic="T", body=b"x")] * 2, 0, 7)
    write_at(log_file, log.data + bytes(4), 0)
    window = bytearray(4096)
    pos, kind, _, consumed, _, _, _, need = dispatch_once(log_file, 0, len(log.data) + 4, 0, window)
    assert (pos, consumed) == (len(log.data), 2)
    assert kind == _records.KIND_CORRUPT, (
        f"4 zero bytes below the written end, all inside a {len(window)}-byte window: "
        f"expected KIND_CORRUPT ({_records.KIND_CORRUPT}), got kind {kind} "
        f"(KIND_MORE={_records.KIND_MORE}) with need={need}"
    )


def test_dispatch_consumes_prepared_records_without_units(log_file: int) -> None:
    """Prepared and rolled-back records are consumed (and timed) but produce no unit."""
    log = Stamped()
    flags = [TRANSACTION_PREPARED_TYPE, 0, TRANSACTION_ROLLBACK_TYPE, TRANSACTION_COMMIT_TYPE]
    for i, f in enumerate(flags):
        log.add([Message(topic="T", body=b"m", sys_flag=f)], 0, 10 + i)
    log.add([Message(topic="T", body=b"p", sys_flag=TRANSACTION_PREPARED_TYPE)], 0, 20)
    write_at(log_file, log.data, 0)
    pos, kind, _, consumed, last_ts, runs, records, _ = dispatch_once(
        log_file, 0, len(log.data), 0, bytearray(4096)
    )
    assert (pos, kind, consumed, last_ts) == (len(log.data), _records.KIND_END, 5, 20)
    assert runs == [("T", 0, 0, 2, log.units["T", 0, 0] + log.units["T", 0, 1])]
    assert records is not None
    assert [(r[6], r[7]) for r in records] == [(0, 0), (1, TRANSACTION_COMMIT_TYPE)]


def test_dispatch_refuses_a_record_at_the_wrong_physical_offset(log_file: int) -> None:
    """A record whose PHYSICALOFFSET is not base + position is KIND_CORRUPT."""
    log = Stamped()
    log.add([Message(topic="T", body=b"x")] * 3, 4096, 1)
    write_at(log_file, log.data, 0)
    pos, kind, reason, consumed, _, _, _, _ = dispatch_once(
        log_file, 0, len(log.data), 4097, bytearray(4096)
    )
    assert (pos, kind, consumed) == (0, _records.KIND_CORRUPT, 0)
    assert reason == "PHYSICALOFFSET 4096 but the record sits at 4097"


def test_dispatch_refuses_a_record_with_a_non_utf8_topic(log_file: int) -> None:
    """Topic bytes that are not UTF-8 stop the walk at that record."""
    log = Stamped()
    log.add([Message(topic="T", body=b"x")], 0, 1)
    log.add([Message(topic="UV", body=b"y")], 0, 1)
    size = log.records[0][0]
    at = size + Placed(EncodedMessage(Message(topic="UV", body=b"y"), store_host=H4), 0).topic_at
    log.data[at : at + 2] = b"\xc0\x80"
    write_at(log_file, log.data, 0)
    pos, kind, reason, consumed, _, _, _, _ = dispatch_once(
        log_file, 0, len(log.data), 0, bytearray(4096)
    )
    assert (pos, kind, reason, consumed) == (size, _records.KIND_CORRUPT, "topic is not UTF-8", 1)


def test_a_stored_record_with_non_utf8_properties_still_reads_and_recovers(
    log_file: int,
) -> None:
    """Only stamp refuses properties that are not UTF-8: a log written before it
    did (or by RocketMQ) may hold such records, and check_record, scan and
    dispatch agree to keep them rather than truncate the log there."""
    log = Stamped()
    log.add([Message(topic="T", body=b"x", properties={"k": "é"})] * 2, 0, 1)
    bad = bytes(log.data).replace("é".encode(), b"\xff\xfe")
    log.data[:] = bad
    assert check_record(log.data, 0, len(log.data), check_crc=True).kind is RecordKind.MESSAGE
    result = _records.scan(log.data, 0, len(log.data), 0, True, -1)
    assert result == python_scan(log.data, len(log.data), 0, True, -1)
    assert (result[0], result[1], result[5]) == (len(log.data), _records.KIND_END, 2)
    write_at(log_file, log.data, 0)
    pos, kind, _, consumed, _, _, _, _ = dispatch_once(
        log_file, 0, len(log.data), 0, bytearray(4096)
    )
    assert (pos, kind, consumed) == (len(log.data), _records.KIND_END, 2)
    assert decode_record(log.data).properties["k"] == "\ufffd\ufffd"


def test_dispatch_fills_the_topic_cache(log_file: int) -> None:
    """Topic names are decoded once into the shared cache, keyed by their UTF-8 bytes."""
    log = Stamped()
    log.add([Message(topic="主题", body=b"x")], 0, 1)
    log.add([Message(topic="T", body=b"y")], 0, 1)
    write_at(log_file, log.data, 0)
    cache: dict[bytes, str] = {}
    result = dispatch_once(log_file, 0, len(log.data), 0, bytearray(4096), cache=cache)
    assert cache == {"主题".encode(): "主题", b"T": "T"}
    assert [r[0] for r in result[5]] == ["主题", "T"]
    assert result[5][0][0] is cache["主题".encode()]


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    messages=st.lists(scan_messages, min_size=1, max_size=5),
    v6_store=st.lists(st.booleans(), min_size=5, max_size=5),
    base=st.integers(0, 2**40),
    file_pos=st.integers(0, 100),
    padding=st.just(0) | st.integers(8, 64),
    damage=st.lists(st.tuples(st.sampled_from(CORRUPTIONS), st.integers(0, 4)), max_size=2),
    seed=st.integers(0, 2**32),
)
# Found by CI: the zeroed bytes cleared the prepared record's SYSFLAG, and dispatch
# rightly indexed five records where the undamaged log had four to dispatch.
@example(
    messages=[
        Message(topic="T", sys_flag=flag, born_host="10.0.0.1:4321") for flag in (0, 0, 4, 0, 0)
    ],
    v6_store=[False] * 5,
    base=0,
    file_pos=0,
    padding=0,
    damage=[("zero16", 2)],
    seed=60,
)
def test_dispatch_agrees_with_check_record_on_damaged_logs(
    log_file: int,
    messages: list[Message],
    v6_store: list[bool],
    base: int,
    file_pos: int,
    padding: int,
    damage: list[tuple[str, int]],
    seed: int,
) -> None:
    """With the whole log in the window, dispatch stops where check_record (no CRC) does.

    Below the written end there is no END: where check_record sees zeroes, dispatch
    reports KIND_CORRUPT, a tail of 1-7 bytes included.
    """
    buf = damaged_log(messages, v6_store, base, padding, damage, seed)
    pos, kind, reason, last_ts, _, count = python_scan(buf, len(buf), base, False, 0)
    if kind == _records.KIND_END and pos < len(buf):
        kind, reason = _records.KIND_CORRUPT, "no record below the written end"
    write_at(log_file, buf, file_pos, after=b"\xff" * 16)

    result = dispatch_once(log_file, file_pos, len(buf), base, bytearray(len(buf) + 8))

    assert result[:5] == (pos, kind, reason, count, last_ts)
    # Counted on the damaged log: damage the scan cannot see (no CRC) may have
    # rewritten a SYSFLAG, making a prepared record dispatchable or the reverse.
    dispatched = _dispatchable_before(buf, pos)
    assert sum(run[3] for run in result[5]) == len(result[6] or []) <= dispatched
    if kind == _records.KIND_END:
        assert len(result[6] or []) == dispatched


def _dispatchable_before(buf: bytearray, end: int) -> int:
    """How many records of ``buf`` below ``end`` carry a dispatchable SYSFLAG (at
    byte 36 of a record, see basalt.common.record)."""
    pos = count = 0
    while pos < end:
        info = check_record(buf, pos, end, check_crc=False)
        if info.kind is not RecordKind.MESSAGE:
            break
        (sys_flag,) = struct.unpack_from(">i", buf, pos + 36)
        count += is_dispatchable(sys_flag)
        pos += info.size
    return count


dispatch_batches = st.lists(
    st.tuples(
        st.sampled_from([("A", 0), ("A", 1), ("B", 0), ("主题", 7)]),
        st.lists(
            st.builds(
                lambda body, tags, flag, born: (body, tags, flag, born),
                st.binary(max_size=400),
                st.sampled_from(TAGS),
                st.sampled_from(SYS_FLAGS),
                st.sampled_from(BORN_HOSTS),
            ),
            min_size=1,
            max_size=4,
        ),
        st.booleans(),
    ),
    min_size=1,
    max_size=6,
)


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    batches=dispatch_batches,
    base=st.integers(0, 2**40),
    file_pos=st.integers(0, 300),
    window_size=st.integers(1, 3000),
    blank=st.booleans(),
)
def test_dispatch_in_windows_rebuilds_every_unit_stamp_returned(
    log_file: int,
    batches: list[tuple[tuple[str, int], list[tuple[bytes, str | None, int, str]], bool]],
    base: int,
    file_pos: int,
    window_size: int,
    blank: bool,
) -> None:
    """Walking the log window by window (growing it on ``need``) yields stamp's units."""
    log = Stamped()
    for ts, ((topic, queue_id), parts, v6) in enumerate(batches):
        messages = [
            Message(
                topic=topic, body=body, queue_id=queue_id, tags=tags, sys_flag=flag, born_host=b
            )
            for body, tags, flag, b in parts
        ]
        log.add(messages, base, 1000 + ts, host=H6 if v6 else H4)
    tail = struct.pack(">iI", 64, BLANK_MAGIC_CODE) + bytes(56) if blank else b""
    write_at(log_file, log.data + tail, file_pos, after=b"\xff" * 32)
    avail = len(log.data) + len(tail)

    window = bytearray(window_size)
    cache: dict[bytes, str] = {}
    done, consumed_total, calls = 0, 0, 0
    units: dict[tuple[str, int, int], bytes] = {}
    while True:
        calls += 1
        assert calls < 1000
        pos, kind, reason, consumed, _, runs, records, need = _records.dispatch(
            log_file, file_pos + done, avail - done, base + done, window, True, cache
        )
        assert reason == ""
        for topic, queue_id, first, count, raw in runs:
            assert len(raw) == 20 * count
            for i in range(count):
                key = (topic, queue_id, first + i)
                assert key not in units
                units[key] = raw[20 * i : 20 * i + 20]
        assert records is not None
        for _topic, _qid, phys, size, _tags, ts, _qoff, flag, ps, pe in records:
            expected_size, expected_flag, props, expected_ts = log.records[phys]
            assert (size, flag, ts) == (expected_size, expected_flag, expected_ts)
            assert window[ps:pe] == props
        consumed_total += consumed
        done += pos
        if kind != _records.KIND_MORE:
            break
        if consumed == 0:
            assert pos == 0
            assert need > len(window)
            assert need == (log.records[base + done][0] if len(window) >= 8 else 8)
            window = bytearray(need)
    if blank:
        assert (kind, done) == (_records.KIND_BLANK, len(log.data))
    else:
        assert (kind, done) == (_records.KIND_END, len(log.data))
    assert consumed_total == log.count
    assert units == log.units


# -- through MessageStore.put_batch ------------------------------------------------------


def open_store(make_config: ConfigFactory, clock: ManualClock, store_host: str) -> MessageStore:
    return MessageStore.open(
        make_config(max_message_size=MAX_BODY, store_host=store_host), clock=clock
    )


@pytest.mark.parametrize("case", MALFORMED, ids=[c.name for c in MALFORMED])
def test_put_batch_refuses_a_malformed_batch_and_keeps_serving(
    make_config: ConfigFactory, clock: ManualClock, case: Malformed
) -> None:
    """MESSAGE_ILLEGAL naming the reason, nothing written, and the next batch is served."""
    host = encode_host(case.store_host)
    store = open_store(make_config, clock, case.store_host)
    try:
        first = store.put_batch(
            EncodedBatch.of_records(BATCH_TOPIC, BATCH_QUEUE, good_records(2, host))
        )
        assert first.status is PutStatus.PUT_OK
        before = store.max_physical_offset

        refused = store.put_batch(EncodedBatch.of_records(BATCH_TOPIC, BATCH_QUEUE, case.raw))

        assert refused.status is PutStatus.MESSAGE_ILLEGAL
        assert case.reason in refused.detail
        assert f"record {case.index} (byte {case.byte} of the batch)" in refused.detail
        assert store.max_physical_offset == before

        clock.advance(5)
        after = store.put_batch(
            EncodedBatch.of_records(BATCH_TOPIC, BATCH_QUEUE, good_records(3, host))
        )
        assert after.status is PutStatus.PUT_OK
        assert after.queue_offsets == (2, 3, 4)
        assert after.physical_offsets[0] == before
        assert store.wait_dispatched()
        assert store.get_max_offset_in_queue(BATCH_TOPIC, BATCH_QUEUE) == 5
        for i, queue_offset in enumerate(after.queue_offsets):
            record = store.get_message_by_queue_offset(BATCH_TOPIC, BATCH_QUEUE, queue_offset)
            assert record is not None
            assert record.body == b"ok-%d" % i
            assert record.commit_log_offset == after.physical_offsets[i]
            assert record.store_host == decode_host(host)
            assert record.store_timestamp_ms == clock.now_ms()
            assert record.body_crc == zlib.crc32(record.body) & 0x7FFFFFFF
            assert bool(record.sys_flag & STOREHOSTADDRESS_V6_FLAG) == (len(host) == 20)
    finally:
        store.shutdown()


def test_a_producer_batch_of_one_record_is_refused_as_a_message_is(
    make_config: ConfigFactory, clock: ManualClock
) -> None:
    """The SDK sends a lone message as a batch of one record: refused, it reads as
    the wire message's refusal (Admission's words), not as a malformed batch;
    a longer batch still names the record."""
    host = encode_host(IPV4_HOST)
    too_big = Message(topic=BATCH_TOPIC, body=bytes(MAX_BODY + 1), queue_id=BATCH_QUEUE)
    lone = bytes(encode_unstamped([too_big], host))
    store = open_store(make_config, clock, IPV4_HOST)
    try:
        alone = store.put_batch(EncodedBatch.of_records(BATCH_TOPIC, BATCH_QUEUE, lone))
        batch = store.put_batch(
            EncodedBatch.of_records(BATCH_TOPIC, BATCH_QUEUE, good_records(1, host) + lone)
        )
        as_message = store.put_messages([too_big])
    finally:
        store.shutdown()
    expected = f"body of {MAX_BODY + 1} bytes exceeds max_message_size {MAX_BODY}"
    assert (alone.status, alone.detail) == (PutStatus.MESSAGE_ILLEGAL, expected)
    assert (as_message.status, as_message.detail) == (PutStatus.MESSAGE_ILLEGAL, expected)
    assert batch.status is PutStatus.MESSAGE_ILLEGAL
    assert batch.detail.startswith("malformed batch: record 1 (byte ") and expected in batch.detail


def test_put_batch_overwrites_every_client_supplied_broker_field(store: MessageStore) -> None:
    """A producer's BODYCRC, offsets, store time and store host never reach the log."""
    lying_host = encode_host("10.9.9.9:1")
    messages = [
        Message(topic="Lies", body=b"body-%d" % i, queue_id=0, tags="标签") for i in range(3)
    ]
    raw = bytearray()
    for m in messages:
        lie = bytearray(EncodedMessage(m, store_host=lying_host).encode(999, 123_456, 42))
        struct.pack_into(">i", lie, 8, 0x1234567)  # a wrong BODYCRC
        raw += lie
    result = store.put_batch(EncodedBatch.of_records("Lies", 0, raw))
    assert result.status is PutStatus.PUT_OK
    assert store.wait_dispatched()
    for i, m in enumerate(messages):
        record = store.get_message_by_queue_offset("Lies", 0, i)
        assert record is not None
        assert record.queue_offset == i
        assert record.commit_log_offset == result.physical_offsets[i]
        assert record.body_crc == zlib.crc32(m.body) & 0x7FFFFFFF
        assert record.store_host == IPV4_HOST
        assert record.store_timestamp_ms == store.clock.now_ms()
        assert record.tags == "标签"
    cq = store.get_consume_queue("Lies", 0)
    assert cq is not None
    for i in range(3):
        unit = cq.get_unit(i)
        assert unit is not None
        assert unit[0] == result.physical_offsets[i]
        assert unit[2] == tags_code("标签")
