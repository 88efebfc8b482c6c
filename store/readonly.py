"""Read-only access to a store root, shared by ``basalt store check`` and ``dump``.

Contract: nothing here takes the root's ``lock``, creates ``abort``, or
writes, truncates or recovers a byte. Data files are opened ``O_RDONLY`` and
read with ``pread`` (:class:`ReadOnlyFile`), never through a mapping: a
mapped read of a hole of a sparse file on a full tmpfs, or of a page past the
end of a file truncated underneath, is a SIGBUS that kills the tool (issue 28);
a ``pread`` there reads zeros or comes back short, and the tool reports it.
So these loaders are safe on a root a running store holds, on a crashed root
before recovery and on a full disk. There is no configuration to read: each
directory's file size is inferred from the files on disk.

Damage is not fatal. A file that does not fit (wrong size, misplaced name,
unreadable) is reported to a :class:`Findings` sink and left out, so a
damaged root can still be inspected; only a path that is not a store root at
all raises :class:`StoreRootError`.

:func:`open_consume_queue` returns an ordinary :class:`ConsumeQueue` whose
files end at the *written end* — the first invalid unit, as ConsumeQueue
recovery finds it — so its readers (``iter_units``, ``read_units``) serve
exactly the written units, filler units included.
"""

from __future__ import annotations

import os
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from basalt.common.record import (
    MESSAGE_MAGIC_CODE,
    SIZE_AND_MAGIC,
    RecordInfo,
    RecordKind,
    check_record,
)
from basalt.store.config import CQ_STORE_UNIT_SIZE, MessageStoreConfig
from basalt.store.consume_queue import ConsumeQueue
from basalt.store.errors import StoreError
from basalt.store.mapped_file import MappedFile, data_extents, parse_file_name, wrong_size
from basalt.store.mapped_file_queue import MappedFileQueue

if TYPE_CHECKING:
    import mmap

#: The most bytes one pread of a tail scan reads.
_CHUNK = 64 * 1024


class StoreRootError(StoreError, FileNotFoundError):
    """The path given is missing, not a directory, or not a store root."""

    def __init__(self, root: Path, reason: str) -> None:
        super().__init__(f"{root}: {reason}")
        self.root = root
        self.reason = reason


class Findings(Protocol):
    """Where the loaders report what they leave out (``problem``) or notice (``note``)."""

    def problem(
        self, code: str, message: str, *, path: Path | None = None, offset: int | None = None
    ) -> None: ...

    def note(self, message: str) -> None: ...


class ReadOnlyFile(MappedFile):
    """A data file opened ``O_RDONLY`` and read with ``pread``: a :class:`MappedFile`
    in interface (positions, ``read``, ``readable_end``, ``dirty_bytes_from``),
    with no mapping, so no read of it can raise a signal.

    A read past the file's end on disk (it was truncated after it was
    opened) returns zeros for the missing bytes, as a hole reads, and
    remembers where the file ended in :attr:`shrunk_to`: the caller reports
    it (:func:`report_shrunk`). ``buffer`` is not available.
    """

    __slots__ = ("shrunk_to",)

    def __init__(self, path: Path, file_size: int) -> None:
        # MappedFile.__init__ is not called: it would map the file.
        self._init_state(path, file_size, read_only=True)
        self.shrunk_to: int | None = None
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            actual = os.fstat(self._fd).st_size
            if actual != file_size:
                raise wrong_size(path, actual, file_size)
        except BaseException:
            os.close(self._fd)
            self._fd = -1
            raise

    def __repr__(self) -> str:
        return f"ReadOnlyFile({self.path.name})"

    @property
    def closed(self) -> bool:
        return self._fd < 0

    @property
    def buffer(self) -> mmap.mmap:
        """Not available: a ReadOnlyFile has no mapping; use :meth:`read`."""
        raise TypeError(f"{self.path.name}: a ReadOnlyFile has no mapping, use read()")

    def read(self, pos: int, size: int) -> bytes:
        """``size`` bytes from ``pos`` (fewer only past ``file_size``); bytes past the
        file's end on disk read as zeros and set :attr:`shrunk_to`."""
        size = min(size, self.file_size - pos)
        if size <= 0:
            return b""
        data = os.pread(self._fd, size, pos)
        while len(data) < size:
            more = os.pread(self._fd, size - len(data), pos + len(data))
            if not more:
                end = pos + len(data)
                self.shrunk_to = end if self.shrunk_to is None else min(self.shrunk_to, end)
                return data + bytes(size - len(data))
            data += more
        return data

    def first_non_zero(self, pos: int) -> int | None:
        """Position of the first non-zero byte at or after ``pos``; None if all are
        zero. Only data extents are read, by ``pread``, a chunk at a time."""
        for begin, end in data_extents(self, pos, self.file_size):
            for at in range(begin, end, _CHUNK):
                chunk = self.read(at, min(_CHUNK, end - at))
                rest = chunk.lstrip(b"\0")
                if rest:
                    return at + len(chunk) - len(rest)
        return None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def destroy(self) -> None:
        raise TypeError(f"{self.path.name}: a ReadOnlyFile is never deleted")


def report_shrunk(files: MappedFileQueue, what: str, findings: Findings) -> None:
    """Report every file of ``files`` that was found shorter than its size while read
    (:attr:`ReadOnlyFile.shrunk_to`): truncated underneath the tool."""
    for mf in files.files:
        if isinstance(mf, ReadOnlyFile) and mf.shrunk_to is not None:
            findings.problem(
                "file-truncated",
                f"{what}: {mf.path.name} ended at byte {mf.shrunk_to} while being read, "
                f"but was {mf.file_size} bytes when opened (truncated underneath; "
                f"the bytes past its end were read as zeros)",
                path=mf.path,
                offset=mf.shrunk_to,
            )


def store_layout(root: Path) -> MessageStoreConfig:
    """The paths of a store root (``commitlog_dir``, ``abort_path``, …).

    Raises StoreRootError when ``root`` is missing, not a directory, or holds
    none of ``commitlog/``, ``consumequeue/`` and ``checkpoint``. Only the
    paths of the returned config are meaningful: its file sizes are defaults,
    not the root's.
    """
    root = Path(root)
    if not root.exists():
        raise StoreRootError(root, "no such store root")
    if not root.is_dir():
        raise StoreRootError(root, "not a directory")
    layout = MessageStoreConfig(store_path_root_dir=root)
    if not any(
        p.exists() for p in (layout.commitlog_dir, layout.consume_queue_dir, layout.checkpoint_path)
    ):
        raise StoreRootError(root, "not a store root (no commitlog/, consumequeue/ or checkpoint)")
    return layout


def open_data_files(
    directory: Path,
    what: str,
    findings: Findings,
    *,
    unit: int = 1,
    mapped: bool = False,
    file_size: int | None = None,
) -> MappedFileQueue:
    """Open a directory's data files read-only into a MappedFileQueue, reporting misfits.

    The files are :class:`ReadOnlyFile` (``pread``, no signal on a hole of a
    full disk or a file truncated underneath); ``mapped=True`` maps them
    instead (``MappedFile``, for zero-copy scans through ``buffer``: the
    pipeline's choice, which gives up that safety).

    The file size is ``file_size`` when the caller knows the store's setting
    (a one-file store's only file cannot be judged otherwise), else the most
    common size on disk; a file of another size, a
    size that is not a multiple of ``unit``, a name that is not a multiple of
    the size, or a gap between names is a problem, and the misfit is left
    out. An empty last file (created by a writer that died before allocating
    it) is only noted. A missing directory gives an empty queue. Every file
    counts as fully written (``wrote_position == file_size``). The caller
    closes the queue.
    """
    if not directory.is_dir():
        return MappedFileQueue(directory, 1, read_only=True)
    named = sorted(
        (start, p)
        for p in directory.iterdir()
        if (start := parse_file_name(p)) is not None and p.is_file()
    )
    sizes = [p.stat().st_size for _, p in named]
    if file_size is None:
        common = Counter(s for s in sizes if s > 0).most_common(1)
        file_size = common[0][0] if common else 0
    files_queue = MappedFileQueue(directory, max(file_size, 1), read_only=True)
    if file_size % unit:
        findings.problem(
            "file-size",
            f"{what} files are {file_size} bytes, not a multiple of {unit}",
            path=directory,
        )
        return files_queue
    opened: list[MappedFile] = []
    for i, ((start, path), size) in enumerate(zip(named, sizes, strict=True)):
        if i and file_size and start != named[i - 1][0] + file_size:
            findings.problem("file-gap", f"{what}: gap before {path.name}", path=path)
        if size == 0 and i == len(named) - 1:
            findings.note(f"{what}: {path.name} is empty (created, never written)")
        elif size != file_size or not size:
            problem = f"{what}: {path.name} is {size} bytes, not {file_size}"
            findings.problem("file-size", problem, path=path)
        else:
            try:
                mf = (
                    MappedFile(path, file_size, read_only=True)
                    if mapped
                    else ReadOnlyFile(path, file_size)
                )
            except OSError as e:  # CorruptFileError included
                findings.problem("file-unreadable", f"{what}: {path.name}: {e}", path=path)
            else:
                mf.wrote_position = mf.flushed_position = file_size
                opened.append(mf)
    files_queue.files = opened
    return files_queue


def open_consume_queue(
    layout: MessageStoreConfig, topic: str, queue_id: int, findings: Findings
) -> ConsumeQueue | None:
    """The ConsumeQueue of (topic, queue_id), read-only, ending at its written end.

    None when the queue has no directory. ``min_offset_in_queue`` is the first
    file's first unit (filler units included) and ``max_offset_in_queue`` one
    past the last written unit; files wholly past the written end are left
    out. Data after the written end (a hole, not a torn tail) is reported as
    ``cq-hole``. The caller closes the queue.
    """
    directory = layout.consume_queue_dir / topic / str(queue_id)
    if not directory.is_dir():
        return None
    what = f"consumequeue {topic}/{queue_id}"
    files = open_data_files(directory, what, findings, unit=CQ_STORE_UNIT_SIZE)
    cq = ConsumeQueue(
        topic, queue_id, layout.consume_queue_dir, files.mapped_file_size, read_only=True
    )
    cq.files = files
    end = _written_end(cq, what, findings)
    files.set_written_to(end)
    kept = [mf for mf in files.files if mf.file_from_offset <= end]  # a prefix: files are sorted
    for mf in files.files[len(kept) :]:
        mf.close()
    files.files = kept
    cq.min_logic_offset = files.min_offset
    return cq


def _written_end(cq: ConsumeQueue, what: str, findings: Findings) -> int:
    """Byte offset of the first invalid unit (or of a gap between files).

    Non-zero bytes after it are a hole, reported once. The last file is read
    a second time before calling its tail a hole: the dispatcher of a running
    store may be appending to it.
    """
    files = cq.files.files
    end: int | None = None
    for i, mf in enumerate(files):
        if end is None and i and mf.file_from_offset != files[i - 1].file_end_offset:
            end = files[i - 1].file_end_offset  # the gap was reported when opening
        last = i == len(files) - 1
        for attempt in (0, 1):
            # The ConsumeQueue's own recovery scan: phy >= 0 and size > 0 per unit.
            pos = cq.written_end(mf) if end is None else 0
            dirty_at = _first_non_zero(mf, pos)
            if dirty_at is None or not last or attempt:
                break
        if end is None and pos < mf.file_size:
            end = mf.file_from_offset + pos
        if dirty_at is not None and end is not None:  # dirty bytes imply pos < file_size
            index = (mf.file_from_offset + dirty_at) // CQ_STORE_UNIT_SIZE
            findings.problem(
                "cq-hole",
                f"{what}: units at queue offset {index} and later follow the end of the "
                f"written units at queue offset {end // CQ_STORE_UNIT_SIZE}",
                path=mf.path,
                offset=index,
            )
            break
    if end is None:
        end = files[-1].file_end_offset if files else 0
    return end


def _first_non_zero(mf: MappedFile, pos: int) -> int | None:
    """Position of the first non-zero byte at or after ``pos``; None if all are zero."""
    if isinstance(mf, ReadOnlyFile):
        return mf.first_non_zero(pos)
    dirty = mf.dirty_bytes_from(pos)  # extents only, by pread: the last non-zero byte
    if not dirty:
        return None
    data = mf.read(pos, dirty)
    return pos + len(data) - len(data.lstrip(b"\0"))


def check_at(mf: MappedFile, pos: int, *, check_crc: bool = True) -> RecordInfo:
    """:func:`check_record` at ``pos`` of ``mf``, expecting PHYSICALOFFSET to be its place.

    Reads with ``mf.read`` (``pread`` for a :class:`ReadOnlyFile`) the record's
    first 8 bytes, then, for a message whose TOTALSIZE fits, the record: no
    further than the data extent holding ``pos`` (a hole reads as the end of
    the data), so a hole of a sparse file on a full tmpfs is never faulted and
    ``store check`` reports, never dies.
    """
    limit = mf.readable_end(pos) - pos
    head = mf.read(pos, min(SIZE_AND_MAGIC.size, limit))
    if len(head) == SIZE_AND_MAGIC.size:
        size, magic = SIZE_AND_MAGIC.unpack(head)
        if magic == MESSAGE_MAGIC_CODE and SIZE_AND_MAGIC.size < size <= limit:
            head = mf.read(pos, size)
    if len(head) < min(SIZE_AND_MAGIC.size, limit):
        return RecordInfo(RecordKind.CORRUPT, reason=f"the file ends at {pos + len(head)}")
    return check_record(
        head, 0, limit, check_crc=check_crc, expected_offset=mf.file_from_offset + pos
    )


def iso_ms(ms: int) -> str:
    """A millisecond timestamp as ISO 8601 UTC (``…T22:13:20.007Z``); "invalid" if out of range."""
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"
    except (OverflowError, OSError, ValueError):
        return "invalid"
