"""Store benchmark: append, group commit, dispatch and abnormal recovery.

Runs the storage engine in-process (no network) and prints one table:

* **append ASYNC** — one thread appends batches of 1 and of 64 messages with
  ASYNC flush, the dispatcher and flush threads running as in production
  (they share the GIL with the writer): *Message objects* through
  ``put_messages`` (the store encodes), *producer-encoded* through
  ``put_batch`` with records a producer encoded (the store validates, CRCs and
  stamps them). One more row repeats producer-encoded batches of 64 with the
  dispatcher stopped: append alone. A cell warms up on at most 64 MiB and
  stops after ``--duration`` or 768 MiB of CommitLog: on this kind of VM the
  page cache absorbs ~1-1.5 GB of new dirty data at memory speed, then
  throttles writers to the disk's speed, which the *sustained* row (4 GiB)
  shows. The producer-encoded batch-64 rows run 3 times (median shown).
* **page cache** — the machine's ceiling for the same cell: ``pwrite`` of the
  same chunks into a fresh sparse file, no store.
* **append SYNC** — 4 and 32 writer threads each call ``put_messages`` in a
  loop, once with single messages and once with batches of 16
  (``--sync-batches``); a send returns only once its bytes are fsynced,
  concurrent sends share one fsync (group commit). The asyncio rows send from
  4, 32 and 256 coroutines of one event loop: single messages through
  ``put_messages_async``, producer-encoded batches of 16 through
  ``put_batch_async``; sends of one turn of the loop share one append.
* **dispatch** — N records are written with the dispatcher stopped and the
  writer's hand-off dropped, so ``dispatcher.dispatch_available()`` walks the
  CommitLog (the path of recovery and of a lagging dispatcher); it is timed
  until it returns 0, and repeated on fresh ConsumeQueues until
  ``--duration`` is covered.
* **recovery** — ~1 GiB of 1 KiB-body records, a clean shutdown, then
  ``MessageStore.start()`` is timed: a clean restart (reference), with
  ``abort`` created, with ``abort`` created and ``consumequeue/`` removed so
  that every record is re-dispatched, and with ``abort`` right after a roll.
  s/GiB is per GiB of CommitLog.

Every message carries TAGS and a 32-digit UNIQ_KEY property, and goes to one
of 8 queues of one topic (a batch to one queue). Rates are messages (or
ConsumeQueue entries) per second; "body MiB/s" counts payload bytes, "log
MiB/s" CommitLog bytes.

Usage::

    .venv/bin/python benchmarks/store_append.py            # full run, several minutes
    .venv/bin/python benchmarks/store_append.py --quick    # smoke run, seconds
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import functools
import mmap
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from basalt.common.message import new_uniq_key
from basalt.common.record import EncodedMessage
from basalt.store import (
    FlushDiskType,
    Message,
    MessageStore,
    MessageStoreConfig,
    PutMessageResult,
    PutStatus,
)
from basalt.store.batch import EncodedBatch
from basalt.store.recovery import RecoveryReport
from benchmarks.report import (
    Cell,
    Figure,
    Report,
    Table,
    Target,
    add_json_out,
    load_text,
    machine,
    number,
)

KIB = 1024
MIB = 1024 * 1024
GIB = 1024 * MIB
TOPIC = "BenchTopic"
QUEUES = 8
#: Distinct messages cycled through by the writers (each its own UNIQ_KEY).
POOL = 1024

ALL_PATHS = ("async", "sync", "dispatch", "recovery")
#: name -> (recovery kind, description, create ``abort``, remove ``consumequeue/``), run
#: in this order: "rolled" first appends ~1 MiB so that the CommitLog rolls into a new,
#: almost empty last file (the state right after a roll: a long zero tail to check).
RECOVERY_VARIANTS = {
    "normal": ("normal", "clean restart (reference)", False, False),
    "kept": ("abnormal", "abort, consumequeue kept", True, False),
    "removed": ("abnormal", "abort, consumequeue removed", True, True),
    "rolled": ("abnormal", "abort, consumequeue kept, last file just rolled", True, False),
}

#: An ASYNC cell's warm-up stops here: creates the files, warms the code paths.
ASYNC_WARMUP_BYTES = 64 * MIB

# The targets, on a 2-core machine.
TARGET_ASYNC_MSGS_S = 1_000_000  # 1 KiB bodies, ASYNC, batches of 64
TARGET_SYNC_MSGS_S = 50_000  # SYNC flush with group commit
TARGET_DISPATCH_ENTRIES_S = 1_000_000
TARGET_RECOVERY_S_PER_GIB = 1.5


# -- machine ----------------------------------------------------------------------------


def _filesystem(path: Path) -> str:
    """Device and type of the mount holding ``path`` (best effort, Linux)."""
    best = ("", "?", "?")
    with contextlib.suppress(OSError):
        resolved = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            dev, mnt, fstype, *_ = line.split()
            inside = resolved == mnt or resolved.startswith(mnt.rstrip("/") + "/")
            if inside and len(mnt) >= len(best[0]):
                best = (mnt, dev, fstype)
    return f"{best[1]} ({best[2]}) mounted on {best[0] or '?'}"


def prefault_memory(gib: int) -> float:
    """Touch ``gib`` GiB of anonymous memory once, then free it; returns the seconds taken.

    On a freshly booted VM (Firecracker here) the first touch of each guest page
    costs a hypervisor fault: measured ~0.5 GB/s for memory never used since
    boot against 2.5-3.5 GB/s for pages touched before. A long-running store
    only ever sees the latter; without this step the first cells would measure
    the hypervisor's lazy backing of the page cache instead of the store.
    """
    start = time.perf_counter()
    chunk = bytes(MIB)
    with mmap.mmap(-1, gib * GIB) as m:
        for _ in range(gib * 1024):
            m.write(chunk)
    return time.perf_counter() - start


def machine_lines(root: Path) -> list[str]:
    m = machine()
    return [
        f"date:      {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"machine:   nproc={m['cpus']} (usable {m['usable_cpus']}), "
        f"cpu={m['cpu_model']}, mem={m['mem_gib']:.1f} GiB",
        f"os:        {m['os']}",
        f"python:    {m['python']} ({sys.executable})",
        f"store dir: {root} on {_filesystem(root)}",
        f"load avg:  {load_text()} (1/5/15 min) at start",
    ]


# -- results ----------------------------------------------------------------------------


@dataclass(slots=True)
class Row:
    path: str
    config: str
    body_size: int
    rate: float
    unit: str
    count: int
    seconds: float
    body_mib_s: float | None = None
    log_mib_s: float | None = None
    target: Target | None = None
    load1: float = field(default_factory=lambda: os.getloadavg()[0])
    note: str = ""

    @property
    def status(self) -> str:
        if self.target is None:
            return ""
        return "met" if self.target.met(self.rate) else "NOT MET"


def append_row(
    path: str,
    config: str,
    body_size: int,
    count: int,
    seconds: float,
    log_bytes: int,
    *,
    target: Target | None,
    load1: float,
    note: str = "",
) -> Row:
    """A msgs/s row of an append cell, with its payload and CommitLog throughput."""
    return Row(
        path,
        config,
        body_size,
        count / seconds,
        "msgs/s",
        count,
        seconds,
        body_mib_s=count * body_size / seconds / MIB,
        log_mib_s=log_bytes / seconds / MIB,
        target=target,
        load1=load1,
        note=note,
    )


def _size(n: int) -> str:
    for unit, name in ((GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if n >= unit and n % unit == 0:
            return f"{n // unit} {name}"
    return f"{n} B"


def append_table(rows: Sequence[Row]) -> Table:
    """The run's one table, its rows known by path, body and config."""
    table = Table(
        "store",
        ("path", "body", "config", "rate", "unit", "body MiB/s", "log MiB/s", "count", "secs",
         "load1", "target", "status"),
        key=("path", "body", "config"),
    )  # fmt: skip
    for r in rows:

        def mib_s(x: float | None) -> Cell:
            return "" if x is None else Figure(x, "MiB/s")

        table.add(
            r.path,
            _size(r.body_size),
            r.config,
            Figure(r.rate, r.unit),
            r.unit,
            mib_s(r.body_mib_s),
            mib_s(r.log_mib_s),
            Figure(r.count, better=None, fmt=","),
            Figure(r.seconds, "s", better=None, fmt=".2f"),
            Figure(r.load1, better=None, fmt=".2f"),
            "" if r.target is None else str(r.target),
            r.status,
        )
    return table


# -- helpers ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Settings:
    root: Path
    sizes: tuple[int, ...]
    paths: tuple[str, ...]
    warmup_s: float
    duration_s: float
    async_batches: tuple[int, ...]
    async_no_dispatch: bool
    sync_writers: tuple[int, ...]
    sync_batches: tuple[int, ...]
    sync_async_tasks: tuple[int, ...]
    dispatch_records: int
    dispatch_max_bytes: int
    recovery_bytes: int
    recovery_file_size: int
    recovery_variants: tuple[str, ...]
    cold_cache: bool
    #: CommitLog bytes an ASYNC cell stops at (if its duration has not ended first).
    async_volume_bytes: int
    #: CommitLog bytes of the sustained ASYNC row (0: no such row).
    sustained_bytes: int
    #: GiB of memory touched right before each measured ASYNC cell (see prefault_memory).
    prefault_gib: int
    #: Runs of the ASYNC batch-64 producer-encoded and page-cache cells (median shown).
    repeat: int


def make_messages(body_size: int, count: int = POOL, batch: int = 1) -> list[Message]:
    """``count`` messages; each run of ``batch`` goes to one queue, as a RocketMQ batch does."""
    body = os.urandom(body_size)
    return [
        Message(
            TOPIC,
            body,
            queue_id=(i // batch) % QUEUES,
            tags="TagA",
            properties={"UNIQ_KEY": new_uniq_key()},
            born_host="10.0.0.7:51234",
        )
        for i in range(count)
    ]


def make_batches(messages: Sequence[Message], batch: int) -> list[list[Message]]:
    return [list(messages[i : i + batch]) for i in range(0, len(messages) - batch + 1, batch)]


def store_config(root: Path, **overrides: Any) -> MessageStoreConfig:
    """Production defaults (1 GiB CommitLog files, ASYNC flush) unless overridden."""
    return dataclasses.replace(MessageStoreConfig(store_path_root_dir=root), **overrides)


@contextlib.contextmanager
def fresh_store(root: Path, name: str, **overrides: Any) -> Iterator[MessageStore]:
    """A started store in a new directory under ``root``, removed afterwards."""
    path = root / name
    shutil.rmtree(path, ignore_errors=True)
    store = MessageStore.open(store_config(path, **overrides))
    try:
        yield store
    finally:
        store.shutdown()
        shutil.rmtree(path, ignore_errors=True)


def _check(status: PutStatus) -> None:
    if status is not PutStatus.PUT_OK:
        raise RuntimeError(f"put failed: {status}")


def warm_up(
    step: Callable[[], int], seconds: float, done_when: Callable[[], bool] = lambda: False
) -> None:
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline and not done_when():
        step()


def timed_loop(
    step: Callable[[], int], duration_s: float, done_when: Callable[[], bool] = lambda: False
) -> tuple[int, float]:
    """Call ``step`` (returns messages done) for ``duration_s`` or until ``done_when()``:
    (messages, seconds)."""
    clock = time.perf_counter
    done = 0
    start = clock()
    end = start + duration_s
    while True:
        done += step()
        now = clock()
        if now >= end or done_when():
            return done, now - start


def _progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


# -- append: ASYNC ----------------------------------------------------------------------


def encode_batches(store: MessageStore, batches: Sequence[Sequence[Message]]) -> list[bytes]:
    """What producers send: each batch's records encoded in the CommitLog layout."""
    host = store.commitlog.store_host
    return [
        bytes(
            EncodedBatch.of_messages(
                # Reserving the CRC32 property, as the SDK's encode_batch does.
                [EncodedMessage(m, store_host=host, append_crc=True) for m in b]
            ).data
        )
        for b in batches
    ]


def bench_async(
    s: Settings,
    body_size: int,
    batch: int,
    *,
    dispatching: bool = True,
    encoded: bool = False,
    sustained_bytes: int | None = None,
    message_index: bool = True,
) -> Row:
    """One thread appending with ASYNC flush, for ``duration_s`` or until
    ``async_volume_bytes`` of CommitLog are written (whichever comes first), or
    until ``sustained_bytes`` are written."""
    batches = make_batches(make_messages(body_size, batch=batch), batch)
    with fresh_store(
        s.root, f"async-{body_size}-{batch}", message_index_enable=message_index
    ) as store:
        if not dispatching:
            # Append alone: the dispatcher no longer competes for the GIL (shutdown
            # then dispatches the backlog, outside the measurement).
            store.dispatcher.shutdown(drain=False)
        sends: list[Callable[[], PutMessageResult]]
        if encoded:
            # Producer-encoded: each send gets its own copy of the bytes, as a
            # SendBatch request does (the store stamps a batch in place).
            def send_encoded(queue_id: int, records: bytes) -> Callable[[], PutMessageResult]:
                return lambda: store.put_batch(EncodedBatch.of_records(TOPIC, queue_id, records))

            sends = [
                send_encoded(b[0].queue_id, r)
                for b, r in zip(batches, encode_batches(store, batches), strict=True)
            ]
        else:
            sends = [functools.partial(store.put_messages, b) for b in batches]
        index = 0

        def step() -> int:
            nonlocal index
            # Several sends per step keep the harness's own cost out of the figure.
            for _ in range(max(1, 64 // batch)):
                _check(sends[index]().status)
                index = (index + 1) % len(sends)
            return max(1, 64 // batch) * batch

        # Warm up for at most ASYNC_WARMUP_BYTES: every byte written before the
        # measurement is dirty page cache that brings the throttle (see the module
        # docstring) closer.
        warm_up(step, s.warmup_s, lambda: store.max_physical_offset >= ASYNC_WARMUP_BYTES)
        if s.prefault_gib:
            prefault_memory(s.prefault_gib)
        log_before = store.max_physical_offset
        volume = s.async_volume_bytes if sustained_bytes is None else sustained_bytes
        count, seconds = timed_loop(
            step,
            s.duration_s if sustained_bytes is None else 3600.0,
            lambda: store.max_physical_offset - log_before >= volume,
        )
        log_bytes = store.max_physical_offset - log_before
        load1 = os.getloadavg()[0]
    target = (
        Target(TARGET_ASYNC_MSGS_S)
        if body_size == 1 * KIB
        and batch == 64
        and encoded
        and sustained_bytes is None
        and dispatching
        and message_index
        else None
    )
    return append_row(
        "append ASYNC",
        f"1 thread, batch {batch}"
        + (", producer-encoded" if encoded else ", Message objects")
        + ("" if dispatching else ", dispatcher stopped")
        + ("" if message_index else ", IndexFile off")
        + ("" if sustained_bytes is None else f", sustained {_size(sustained_bytes)}"),
        body_size,
        count,
        seconds,
        log_bytes,
        target=target,
        load1=load1,
    )


def bench_page_cache(s: Settings, body_size: int, batch: int) -> Row:
    """The machine's own ceiling: ``pwrite`` of the same chunks into a fresh sparse
    file of the same size, no store, under the same conditions as the ASYNC cells."""
    chunk = os.urandom(record_bytes(body_size) * batch)
    path = s.root / "page-cache-ceiling"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, max(s.async_volume_bytes, 64 * MIB) + 64 * MIB)
        pos = 0
        deadline = time.perf_counter() + s.warmup_s
        while time.perf_counter() < deadline and pos < 64 * MIB:
            os.pwrite(fd, chunk, pos)
            pos += len(chunk)
        if s.prefault_gib:
            prefault_memory(s.prefault_gib)
        start_pos, start = pos, time.perf_counter()
        while pos - start_pos < s.async_volume_bytes:
            os.pwrite(fd, chunk, pos)
            pos += len(chunk)
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink(missing_ok=True)
    count = (pos - start_pos) // len(chunk) * batch
    return append_row(
        "page cache",
        f"raw pwrite of {_size(len(chunk))} chunks, no store (this machine's ceiling)",
        body_size,
        count,
        seconds,
        pos - start_pos,
        target=None,
        load1=os.getloadavg()[0],
    )


def record_bytes(body_size: int) -> int:
    """CommitLog bytes of one benchmark message (TAGS + UNIQ_KEY, IPv4 hosts)."""
    m = make_messages(body_size, count=1)[0]
    return EncodedMessage(m, store_host=b"\x7f\x00\x00\x01\x00\x00\x2a\x9f").size


def repeated(s: Settings, cell: Callable[[], Row]) -> Row:
    """Run a cell ``s.repeat`` times: the median row, the spread in its note.

    The page cache of this kind of VM makes single ASYNC cells vary by 2-3x
    (see BENCHMARKS.md), so the rows that carry the ASYNC target are repeated.
    """
    rows = sorted((cell() for _ in range(max(1, s.repeat))), key=lambda r: r.rate)
    median = rows[len(rows) // 2]
    if len(rows) > 1:
        spread = ", ".join(number(r.rate) for r in rows)
        median.note = f"median of {len(rows)} runs: {spread} {median.unit}"
    return median


# -- append: SYNC -----------------------------------------------------------------------


def bench_sync(s: Settings, body_size: int, writers: int, batch: int) -> Row:
    messages = make_messages(body_size)
    batches = make_batches(messages, batch)
    counts = [0] * writers
    failures = [0] * writers
    stop = threading.Event()
    with fresh_store(
        s.root, f"sync-{body_size}-{writers}-{batch}", flush_disk_type=FlushDiskType.SYNC_FLUSH
    ) as store:
        put = store.put_messages

        def writer(slot: int) -> None:
            i = slot
            while not stop.is_set():
                result = put(batches[i % len(batches)])
                if result.status is PutStatus.PUT_OK:
                    counts[slot] += batch
                else:
                    failures[slot] += 1
                i += writers

        threads = [
            threading.Thread(target=writer, args=(n,), name=f"writer-{n}", daemon=True)
            for n in range(writers)
        ]
        for t in threads:
            t.start()
        try:
            time.sleep(s.warmup_s)
            c0, l0, t0 = sum(counts), store.max_physical_offset, time.perf_counter()
            time.sleep(s.duration_s)
            c1, l1, t1 = sum(counts), store.max_physical_offset, time.perf_counter()
        finally:
            stop.set()
            for t in threads:
                t.join()
        load1 = os.getloadavg()[0]
    count, seconds = c1 - c0, t1 - t0
    what = "single msgs" if batch == 1 else f"batches of {batch}"
    return append_row(
        "append SYNC",
        f"{writers} threads, {what}",
        body_size,
        count,
        seconds,
        l1 - l0,
        target=Target(TARGET_SYNC_MSGS_S) if body_size == 1 * KIB else None,
        load1=load1,
        note=f"{sum(failures)} sends not PUT_OK" if sum(failures) else "",
    )


def bench_sync_asyncio(s: Settings, body_size: int, tasks: int, batch: int = 1) -> Row:
    """SYNC flush from ``tasks`` coroutines on one event loop, the way a server calls
    the store: single messages through ``put_messages_async``, or producer-encoded
    batches through ``put_batch_async`` (what a SendBatch request carries)."""
    batches = make_batches(make_messages(body_size, batch=batch), batch)
    with fresh_store(
        s.root, f"sync-asyncio-{body_size}-{tasks}", flush_disk_type=FlushDiskType.SYNC_FLUSH
    ) as store:
        send: Callable[[int], Awaitable[PutMessageResult]]
        if batch == 1:

            def send(i: int) -> Awaitable[PutMessageResult]:
                return store.put_messages_async(batches[i % len(batches)])

        else:
            encoded = [
                (b[0].queue_id, r)
                for b, r in zip(batches, encode_batches(store, batches), strict=True)
            ]

            def send(i: int) -> Awaitable[PutMessageResult]:
                queue_id, records = encoded[i % len(encoded)]
                return store.put_batch_async(EncodedBatch.of_records(TOPIC, queue_id, records))

        async def measure() -> tuple[int, int, float, int]:
            counts = [0] * tasks
            failures = [0]
            stopping = False

            async def sender(slot: int) -> None:
                i = slot
                while not stopping:
                    result = await send(i)
                    if result.status is PutStatus.PUT_OK:
                        counts[slot] += batch
                    else:
                        failures[0] += 1
                    i += tasks

            running = [asyncio.create_task(sender(n)) for n in range(tasks)]
            try:
                await asyncio.sleep(s.warmup_s)
                c0, l0, t0 = sum(counts), store.max_physical_offset, time.perf_counter()
                await asyncio.sleep(s.duration_s)
                c1, l1, t1 = sum(counts), store.max_physical_offset, time.perf_counter()
            finally:
                stopping = True
                await asyncio.gather(*running)
            return c1 - c0, l1 - l0, t1 - t0, failures[0]

        count, log_bytes, seconds, failed = asyncio.run(measure())
        load1 = os.getloadavg()[0]
    what = "single msgs" if batch == 1 else f"producer-encoded batches of {batch}"
    return append_row(
        "append SYNC",
        f"asyncio: {tasks} tasks on 1 loop, {what}",
        body_size,
        count,
        seconds,
        log_bytes,
        target=Target(TARGET_SYNC_MSGS_S) if body_size == 1 * KIB else None,
        load1=load1,
        note=f"{failed} sends not PUT_OK" if failed else "",
    )


# -- dispatch ---------------------------------------------------------------------------


def fill(store: MessageStore, messages: Sequence[Message], *, records: int, max_bytes: int) -> int:
    """Append batches of 64 until ``records`` records or ``max_bytes`` of CommitLog."""
    batches = make_batches(messages, 64)
    written = 0
    i = 0
    put = store.put_messages
    while written < records and store.max_physical_offset < max_bytes:
        _check(put(batches[i]).status)
        i = (i + 1) % len(batches)
        written += 64
    return written


def bench_dispatch(s: Settings, body_size: int) -> Row:
    """Dispatch a prepared CommitLog; repeat (fresh ConsumeQueues) until ``duration_s``."""
    messages = make_messages(body_size)
    # No periodic ConsumeQueue flush: the queues are destroyed between rounds.
    with fresh_store(
        s.root, f"dispatch-{body_size}", flush_interval_consume_queue_ms=3_600_000
    ) as store:
        dispatcher = store.dispatcher
        dispatcher.shutdown(drain=False)
        written = fill(store, messages, records=s.dispatch_records, max_bytes=s.dispatch_max_bytes)
        store.commitlog.handoff.clear()  # time the walk of the CommitLog, not the hand-off
        log_bytes = store.max_physical_offset - store.min_physical_offset
        dispatch = dispatcher.dispatch_available
        entries = rounds = 0
        seconds = 0.0
        while rounds == 0 or seconds < s.duration_s:
            if rounds:
                store.consume_queues.destroy()
                dispatcher.reput_from_offset = store.min_physical_offset
            before = dispatcher.entries_written
            start = time.perf_counter()
            while dispatch():
                pass
            seconds += time.perf_counter() - start
            done = dispatcher.entries_written - before
            if done != written or dispatcher.stalled_reason is not None:
                raise RuntimeError(
                    f"dispatched {done} of {written} records ({dispatcher.stalled_reason})"
                )
            entries += done
            rounds += 1
        load1 = os.getloadavg()[0]
    return Row(
        "dispatch",
        f"{written:,} records a round",
        body_size,
        entries / seconds,
        "entries/s",
        entries,
        seconds,
        body_mib_s=entries * body_size / seconds / MIB,
        log_mib_s=log_bytes * rounds / seconds / MIB,
        target=Target(TARGET_DISPATCH_ENTRIES_S) if body_size == 1 * KIB else None,
        load1=load1,
        note=f"{rounds} round{'s' if rounds > 1 else ''}",
    )


# -- recovery ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RecoveryRun:
    row: Row
    report: RecoveryReport
    start_s: float
    log_bytes: int


def _drop_page_cache(directory: Path) -> None:
    """Ask the kernel to evict (clean) pages of every file under ``directory``."""
    for path in directory.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _timed_start(
    config: MessageStoreConfig, *, abort: bool, remove_cq: bool, cold: bool
) -> tuple[RecoveryReport, float, int]:
    """Prepare the root as asked, then time ``MessageStore.start()`` (which recovers)."""
    if abort:
        config.abort_path.touch()
    if remove_cq:
        shutil.rmtree(config.consume_queue_dir, ignore_errors=True)
    if cold:
        _drop_page_cache(config.store_path_root_dir)
    store = MessageStore(config)
    start = time.perf_counter()
    report = store.start()
    seconds = time.perf_counter() - start
    log_bytes = store.max_physical_offset - store.min_physical_offset
    store.shutdown()
    if config.abort_path.exists():
        raise RuntimeError("the store left 'abort' behind after a clean shutdown")
    return report, seconds, log_bytes


def bench_recovery(s: Settings) -> list[RecoveryRun]:
    config = store_config(s.root / "recovery", mapped_file_size_commit_log=s.recovery_file_size)
    shutil.rmtree(config.store_path_root_dir, ignore_errors=True)
    body_size = 1 * KIB
    messages = make_messages(body_size)
    store = MessageStore.open(config)
    try:
        written = fill(store, messages, records=1 << 62, max_bytes=s.recovery_bytes)
    finally:
        store.shutdown()
    _progress(f"recovery: wrote {written:,} records; timing restarts")
    runs: list[RecoveryRun] = []
    try:
        for variant in s.recovery_variants:
            kind, what, abort, remove_cq = RECOVERY_VARIANTS[variant]
            if variant == "rolled":
                store = MessageStore.open(config)
                try:
                    roll_at = store.max_physical_offset + s.recovery_file_size
                    roll_at -= roll_at % s.recovery_file_size
                    written += fill(store, messages, records=1 << 62, max_bytes=roll_at + MIB)
                finally:
                    store.shutdown()
            report, seconds, log_bytes = _timed_start(
                config, abort=abort, remove_cq=remove_cq, cold=s.cold_cache
            )
            # Per GiB of CommitLog held by the store (the scan may start at a later
            # file; re-dispatch may start earlier): the "per GiB of CommitLog".
            per_gib = seconds / (log_bytes / GIB) if log_bytes else 0.0
            runs.append(
                RecoveryRun(
                    Row(
                        f"recovery {kind}",
                        f"{what}, {_size(s.recovery_file_size)} files"
                        + (", cold cache" if s.cold_cache else ""),
                        body_size,
                        per_gib,
                        "s/GiB",
                        written,
                        seconds,
                        log_mib_s=log_bytes / seconds / MIB,
                        target=Target(TARGET_RECOVERY_S_PER_GIB, higher_is_better=False)
                        if abort
                        else None,
                    ),
                    report,
                    seconds,
                    log_bytes,
                )
            )
    finally:
        shutil.rmtree(config.store_path_root_dir, ignore_errors=True)
    return runs


# -- main -------------------------------------------------------------------------------


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _path_list(text: str) -> tuple[str, ...]:
    paths = tuple(x for x in text.split(",") if x)
    unknown = set(paths) - set(ALL_PATHS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown paths {sorted(unknown)}; pick from {ALL_PATHS}")
    return paths


def _variant_list(text: str) -> tuple[str, ...]:
    names = {x for x in text.split(",") if x}
    unknown = names - set(RECOVERY_VARIANTS)
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown variants {sorted(unknown)}; pick from {tuple(RECOVERY_VARIANTS)}"
        )
    return tuple(v for v in RECOVERY_VARIANTS if v in names)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run in seconds")
    p.add_argument(
        "--prefault-gib",
        type=int,
        help="GiB of memory touched right before each ASYNC cell (default 0)",
    )
    p.add_argument(
        "--async-mib",
        type=int,
        help="CommitLog MiB after which an ASYNC cell stops (default 768)",
    )
    p.add_argument(
        "--repeat",
        type=int,
        help="runs of the ASYNC producer-encoded and page-cache cells, median shown (default 3)",
    )
    p.add_argument(
        "--sustained-mib",
        type=int,
        help="CommitLog MiB of the sustained ASYNC row (default 4096, 0 skips it)",
    )
    p.add_argument("--root", type=Path, help="store directory (default: a temp dir, removed)")
    p.add_argument("--sizes", type=_int_list, help="body sizes in bytes (default 128,1024,16384)")
    p.add_argument(
        "--paths", type=_path_list, default=ALL_PATHS, help=f"subset of {','.join(ALL_PATHS)}"
    )
    p.add_argument("--duration", type=float, help="seconds measured per cell (default 2)")
    p.add_argument("--warmup", type=float, help="seconds of warm-up per cell (default 0.5)")
    p.add_argument("--async-batches", type=_int_list, default=(1, 64), help="default 1,64")
    p.add_argument(
        "--no-async-undispatched",
        action="store_true",
        help="skip the ASYNC batch-64 row with the dispatcher stopped",
    )
    p.add_argument("--sync-writers", type=_int_list, default=(4, 32), help="default 4,32")
    p.add_argument(
        "--sync-batches",
        type=_int_list,
        default=(1, 16),
        help="messages per SYNC send, one set of rows each (default 1,16)",
    )
    p.add_argument(
        "--sync-async-tasks",
        type=_int_list,
        default=(4, 32, 256),
        help="coroutines sending single messages via put_messages_async (default 4,32,256)",
    )
    p.add_argument(
        "--dispatch-records", type=int, help="records per dispatch cell (default 1,000,000)"
    )
    p.add_argument(
        "--dispatch-max-mib", type=int, help="cap on CommitLog MiB per dispatch cell (default 2048)"
    )
    p.add_argument("--recovery-mib", type=int, help="CommitLog MiB to recover (default ~1024)")
    p.add_argument(
        "--recovery-file-mib", type=int, help="CommitLog file size for recovery (default 1024)"
    )
    p.add_argument(
        "--recovery-variants",
        type=_variant_list,
        default=tuple(RECOVERY_VARIANTS),
        help=f"subset of {','.join(RECOVERY_VARIANTS)} (default all)",
    )
    p.add_argument(
        "--cold-cache",
        action="store_true",
        help="evict the store's files from the page cache before each recovery start",
    )
    add_json_out(p)
    return p.parse_args(argv)


def settings_from(args: argparse.Namespace, root: Path) -> Settings:
    quick = bool(args.quick)
    file_size = (args.recovery_file_mib or (64 if quick else 1024)) * MIB
    if args.recovery_mib is not None:
        recovery_bytes = args.recovery_mib * MIB
    elif quick:
        recovery_bytes = 32 * MIB
    else:
        # ~1 GiB; with 1 GiB files stay inside the first one.
        recovery_bytes = file_size - 4 * MIB if file_size >= GIB else GIB
    return Settings(
        root=root,
        sizes=args.sizes or (128, 1 * KIB, 16 * KIB),
        paths=args.paths,
        warmup_s=args.warmup if args.warmup is not None else 0.05 if quick else 0.5,
        duration_s=args.duration if args.duration is not None else 0.25 if quick else 2.0,
        async_batches=args.async_batches,
        async_no_dispatch=not args.no_async_undispatched,
        sync_writers=args.sync_writers,
        sync_batches=args.sync_batches,
        sync_async_tasks=args.sync_async_tasks,
        dispatch_records=args.dispatch_records or (20_000 if quick else 1_000_000),
        dispatch_max_bytes=(args.dispatch_max_mib or (64 if quick else 2048)) * MIB,
        recovery_bytes=recovery_bytes,
        recovery_file_size=file_size,
        recovery_variants=args.recovery_variants,
        cold_cache=bool(args.cold_cache),
        async_volume_bytes=(args.async_mib or (64 if quick else 768)) * MIB,
        sustained_bytes=(
            args.sustained_mib if args.sustained_mib is not None else 0 if quick else 4096
        )
        * MIB,
        prefault_gib=args.prefault_gib or 0,
        repeat=args.repeat if args.repeat is not None else 1 if quick else 3,
    )


def run(s: Settings) -> tuple[list[Row], list[RecoveryRun]]:
    rows: list[Row] = []
    for size in s.sizes:
        if "async" in s.paths:
            for batch in s.async_batches:
                _progress(f"append ASYNC {_size(size)} batch {batch}")
                rows.append(bench_async(s, size, batch))
                rows.append(
                    repeated(s, functools.partial(bench_async, s, size, batch, encoded=True))
                )
            _progress(f"append ASYNC {_size(size)} batch 64, IndexFile off")
            rows.append(
                repeated(
                    s,
                    functools.partial(bench_async, s, size, 64, encoded=True, message_index=False),
                )
            )
            if s.async_no_dispatch:
                _progress(f"append ASYNC {_size(size)} batch 64, dispatcher stopped")
                rows.append(
                    repeated(
                        s,
                        functools.partial(
                            bench_async, s, size, 64, dispatching=False, encoded=True
                        ),
                    )
                )
            _progress(f"page cache ceiling {_size(size)}")
            rows.append(repeated(s, functools.partial(bench_page_cache, s, size, 64)))
            if s.sustained_bytes:
                _progress(f"append ASYNC {_size(size)} batch 64, sustained")
                rows.append(
                    bench_async(s, size, 64, encoded=True, sustained_bytes=s.sustained_bytes)
                )
        if "sync" in s.paths:
            for batch in s.sync_batches:
                for writers in s.sync_writers:
                    _progress(f"append SYNC {_size(size)} {writers} writers x {batch}")
                    rows.append(bench_sync(s, size, writers, batch))
            for tasks in s.sync_async_tasks:
                _progress(f"append SYNC {_size(size)} asyncio {tasks} tasks")
                rows.append(bench_sync_asyncio(s, size, tasks))
            for batch in s.sync_batches:
                if batch > 1:
                    for tasks in s.sync_writers:
                        _progress(f"append SYNC {_size(size)} asyncio {tasks} tasks x {batch}")
                        rows.append(bench_sync_asyncio(s, size, tasks, batch))
        if "dispatch" in s.paths:
            _progress(f"dispatch {_size(size)}")
            rows.append(bench_dispatch(s, size))
    recoveries: list[RecoveryRun] = []
    if "recovery" in s.paths:
        _progress(f"recovery: writing {s.recovery_bytes / MIB:,.0f} MiB")
        recoveries = bench_recovery(s)
        rows.extend(r.row for r in recoveries)
    return rows, recoveries


@contextlib.contextmanager
def bench_root(root: Path | None, script: str, argv: Sequence[str]) -> Iterator[Path]:
    """The store directory of a run (a temp dir, removed after, unless given), with
    the machine and command printed first."""
    owned = root is None
    path = Path(tempfile.mkdtemp(prefix="basalt-bench-")) if root is None else Path(root)
    path.mkdir(parents=True, exist_ok=True)
    try:
        print("\n".join(machine_lines(path)))
        print(f"command:   .venv/bin/python benchmarks/{script} {' '.join(argv)}".rstrip())
        yield path
    finally:
        if owned:
            shutil.rmtree(path, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    report = Report.start(__file__, args, argv)
    with bench_root(args.root, "store_append.py", argv) as root:
        s = settings_from(args, root)
        print(
            f"settings:  warmup {s.warmup_s:g} s + {s.duration_s:g} s per append cell (ASYNC: "
            f"warm-up at most {_size(ASYNC_WARMUP_BYTES)}, cell at most "
            f"{_size(s.async_volume_bytes)} of CommitLog; {s.prefault_gib} GiB of memory touched "
            f"before each); {TOPIC} x {QUEUES} queues, TAGS + UNIQ_KEY on every message"
        )
        started = time.perf_counter()
        rows, recoveries = run(s)
        print()
        report.emit(append_table(rows))
        for r in rows:
            if r.note:
                report.note(f"note: {r.path} {_size(r.body_size)} {r.config}: {r.note}")
        for rec in recoveries:
            report.note(
                f"{rec.row.config}: start() {rec.start_s:.2f} s for "
                f"{rec.log_bytes / GIB:.3f} GiB of CommitLog; {rec.report.summary()}"
            )
        elapsed = time.perf_counter() - started
        print()
        report.note(f"load avg:  {load_text()} (1/5/15 min) at end; total {elapsed:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
