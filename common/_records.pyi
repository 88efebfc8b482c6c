"""Type stub for the C extension common/_records.c (see its header comment)."""

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from basalt.common.message import Message
from basalt.common.record import Buffer

_R = TypeVar("_R")

#: What dispatch() returns: (pos, kind, reason, consumed, last_store_ts, runs, records, need).
DispatchResult = tuple[
    int,
    int,
    str,
    int,
    int,
    list[tuple[str, int, int, int, bytes]],
    list[tuple[str, int, int, int, int, int, int, int, int, int]] | None,
    int,
]

KIND_MORE: int
KIND_END: int
KIND_BLANK: int
KIND_CORRUPT: int
GATHER_DONE: int
GATHER_FULL: int
GATHER_ELSEWHERE: int
GATHER_CONFIRM: int
INDEX_DONE: int
INDEX_FULL: int
INDEX_BLANK: int
INDEX_CORRUPT: int

#: MessageRecord's field names, in the order decode_records fills them.
RECORD_FIELDS: tuple[str, ...]

#: IndexFile header fields: begin ts, end ts, begin phy, end phy, hash slot count, index count.
IndexState = tuple[int, int, int, int, int, int]
#: scan's answer: (pos, kind, reason, last store timestamp, first newer pos, count).
ScanTuple = tuple[int, int, str, int, int, int]

def crc32(data: Buffer, start: int = 0, /) -> int: ...
def crc32_portable(data: Buffer, start: int = 0, /) -> int: ...
def crc32_combine(crc1: int, crc2: int, len2: int, /) -> int: ...
def tags_code_at(buf: Buffer, pos: int, delays: tuple[int, ...] | None = None, /) -> int | None: ...
def scan(
    buf: Buffer, pos: int, limit: int, base_offset: int, check_crc: bool, newer_than_ms: int, /
) -> ScanTuple: ...
def dispatch(
    fd: int,
    file_pos: int,
    avail: int,
    base_offset: int,
    window: bytearray,
    want_records: bool,
    topic_cache: dict[bytes, str],
    delays: tuple[int, ...] | None = None,
    /,
) -> DispatchResult: ...
def stamp(
    buf: bytearray,
    start: int,
    end: int,
    base_phys: int,
    queue_offset: int,
    store_ts: int,
    store_host: bytes,
    topic: bytes,
    queue_id: int,
    max_body_size: int,
    refuse_transactional: bool = False,
    delays: tuple[int, ...] | None = None,
    /,
) -> tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...], bytes]: ...
def gather(
    units: Buffer,
    i: int,
    n: int,
    log: Buffer,
    log_base: int,
    log_end: int,
    count: int,
    total: int,
    max_nums: int,
    in_memory_from: int,
    mem_bytes: int,
    mem_count: int,
    disk_bytes: int,
    disk_count: int,
    codes: tuple[int, ...] | None,
    confirm: bool,
    out: list[bytes],
    /,
) -> tuple[int, int, int, int]: ...
def index_put(
    log: Buffer,
    pos: int,
    limit: int,
    base_phys: int,
    index_mm: Buffer,
    hash_slot_num: int,
    index_num: int,
    state: IndexState,
    skip_keys: int,
    /,
) -> tuple[int, int, IndexState, int, str]: ...
def index_check(
    index_mm: Buffer,
    hash_slot_num: int,
    index_num: int,
    index_count: int,
    begin_phy: int,
    end_phy: int,
    /,
) -> str: ...
def decode_records(
    data: Buffer,
    record_type: type[_R],
    decode_host: Callable[[bytes], str],
    error_type: Callable[[int, str], BaseException],
    check_crc: bool = False,
    damaged: list[Any] | None = None,
    damaged_type: Callable[[int, str, int, int, int, str], Any] | None = None,
    /,
) -> list[_R]: ...
def encode_batch(
    messages: Sequence[Message],
    uniq_keys: Sequence[str],
    queue_id: int,
    store_host: bytes,
    born_timestamp_ms: int,
    message_type: type[Message],
    host_parts: Callable[[str], tuple[bytes, int]],
    /,
) -> bytes | None: ...
def slotted(
    cls: type[_R], fields: tuple[str, ...], columns: tuple[Sequence[object], ...], /
) -> list[_R]: ...

#: One variable-width Arrow column: int32 offsets, data, validity bitmap, null count.
#: An output buffer of arrow_columns: bytes, or what its ``alloc`` returned.
ArrowBuffer = Any
ArrowColumn = tuple[ArrowBuffer, ArrowBuffer, ArrowBuffer, int]

def arrow_columns(
    data: Buffer | list[Buffer] | tuple[Buffer, ...],  # several: read as their concatenation
    pos: int,
    end: int,
    max_rows: int,
    max_bytes: int,
    error_type: Callable[[int, str], BaseException],
    check_crc: bool = False,
    damaged: list[Any] | None = None,
    damaged_type: Callable[[int, str, int, int, int, str], Any] | None = None,
    alloc: Callable[[int], Any] | None = None,  # a writable buffer of at least n bytes
    /,
) -> tuple[
    int,
    int,
    bool,
    ArrowBuffer,
    ArrowBuffer,
    ArrowBuffer,
    ArrowBuffer,
    ArrowBuffer,
    ArrowBuffer,
    ArrowColumn,
    ArrowColumn,
    ArrowColumn,
    ArrowColumn,
    ArrowColumn,
    ArrowColumn,
    ArrowColumn,
]: ...
