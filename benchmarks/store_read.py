"""Store read benchmark: the pull path, offset by time, key queries.

Runs the storage engine in-process (no network) and prints one table:

* **get_message** — sequential pulls of a queue of 1 KiB records in batches of
  32 (``max_msg_nums``; RocketMQ's in-memory cap is 32 too), from offset 0 to
  the end: unfiltered, with a TAG filter matching 10 % of the records, and
  with an SQL92 filter matching 10 %. Rates are messages returned per second
  and, for the filtered rows, ConsumeQueue entries scanned per second (a
  filtered pull moves past the entries it skipped).
* **offset by time** — ``get_offset_in_queue_by_time`` on a queue of
  10,000,000 entries (small records, so the CommitLog stays ~1.5 GiB), at
  random times across the queue's span: latency per call.
* **query by key** — ``query_message`` for random keys among the 1 KiB
  records (every record has a KEYS entry and a UNIQ_KEY): latency per call.

Every record is written through ``put_batch`` with producer-encoded batches of
64, then the store is left to dispatch and index before anything is timed.

Usage::

    .venv/bin/python benchmarks/store_read.py            # full run, ~1-2 min
    .venv/bin/python benchmarks/store_read.py --quick    # smoke run, seconds
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from basalt.common.record import EncodedMessage
from basalt.store import ManualClock, Message, MessageStore, MessageStoreConfig
from basalt.store.batch import EncodedBatch
from basalt.store.message_filter import MessageFilter, build_filter
from benchmarks.report import Figure, Report, Target, add_json_out, rows_table

# Row and format_table lived here: a script not yet moved to benchmarks.report
# (benchmarks/transactions.py) imports them from this module.
from benchmarks.report import Row as Row
from benchmarks.report import format_table as format_table
from benchmarks.store_append import bench_root

TOPIC = "ReadBench"
BATCH = 64
PULL = 32
TARGET_UNFILTERED = 2_000_000
TARGET_TAG_SCAN = 500_000
TARGET_BY_TIME_US = 100.0


def _progress(msg: str) -> None:
    print(f"  .. {msg}", file=sys.stderr, flush=True)


def fill(
    store: MessageStore,
    count: int,
    make: Callable[[int], Message],
    clock: ManualClock | None = None,
) -> None:
    """Append ``count`` messages in producer-encoded batches of 64, then wait for
    the dispatcher (and the index) to catch up."""
    host = store.commitlog.store_host
    for start in range(0, count, BATCH):
        if clock is not None:
            clock.advance(1)
        encoded = [
            EncodedMessage(make(i), store_host=host, compute_crc=False)
            for i in range(start, min(start + BATCH, count))
        ]
        result = store.put_batch(EncodedBatch.of_messages(encoded))
        if not result.ok:
            raise RuntimeError(f"put failed: {result.status} {result.detail}")
    if not store.wait_dispatched(timeout_s=600):
        raise RuntimeError("dispatcher did not catch up")
    index = store.index
    while index is not None and index.reput_offset < store.max_physical_offset:
        if index.build_error is not None:
            raise RuntimeError(f"the index stopped: {index.build_error}")
        time.sleep(0.01)


def pull_all(store: MessageStore, message_filter: MessageFilter | None) -> tuple[int, int, float]:
    """Pull queue 0 from 0 to its end: (messages returned, entries scanned, seconds)."""
    end = store.get_max_offset_in_queue(TOPIC, 0)
    get = store.get_message
    offset = returned = 0
    started = time.perf_counter()
    while offset < end:
        result = get("bench", TOPIC, 0, offset, PULL, message_filter)
        returned += result.message_count
        offset = result.next_begin_offset
    return returned, end, time.perf_counter() - started


def latency_row(
    path: str, config: str, samples_ns: list[int], target_us: float | None = None
) -> Row:
    us = sorted(s / 1000 for s in samples_ns)
    p99 = us[min(len(us) - 1, int(len(us) * 0.99))]
    return Row(
        path,
        config,
        statistics.median(us),
        "us p50",
        len(us),
        sum(us) / 1e6,
        Target(target_us, higher_is_better=False) if target_us is not None else None,
        [Figure(p99, "us", "p99", fmt=".1f"), Figure(us[-1], "us", "max", fmt=".1f")],
    )


def bench_pulls_and_keys(root: Path, messages: int, key_queries: int) -> list[Row]:
    body = bytes(random.Random(1).randbytes(1024))

    def make(i: int) -> Message:
        return Message(
            TOPIC,
            body,
            queue_id=0,
            tags="TagHit" if i % 10 == 0 else "TagMiss",
            keys=[f"order-{i}"],
            properties={"a": str(i % 10), "UNIQ_KEY": f"{i:032X}"},
        )

    config = MessageStoreConfig(store_path_root_dir=root / "pulls")
    rows: list[Row] = []
    with MessageStore.open(config) as store:
        _progress(f"writing {messages:,} 1 KiB records")
        fill(store, messages, make)
        cells: list[tuple[str, MessageFilter | None, Target | None]] = [
            ("no filter", None, Target(TARGET_UNFILTERED)),
            ("TAG 'TagHit' (10 %)", build_filter("TAG", "TagHit"), None),
            ("SQL92 'a = 0' (10 %)", build_filter("SQL92", "a = 0"), None),
        ]
        for name, flt, target in cells:
            _progress(f"get_message {name}")
            pull_all(store, flt)  # warm: page cache and mappings
            got, scanned, secs = pull_all(store, flt)
            rows.append(
                Row(
                    "get_message",
                    f"1 KiB, batches of {PULL}, {name}",
                    got / secs,
                    "msgs/s",
                    got,
                    secs,
                    target,
                )
            )
            if flt is not None:
                rows.append(
                    Row(
                        "get_message",
                        f"1 KiB, batches of {PULL}, {name}: entries scanned",
                        scanned / secs,
                        "entries/s",
                        scanned,
                        secs,
                        Target(TARGET_TAG_SCAN) if name.startswith("TAG") else None,
                    )
                )
        _progress("query_message")
        rng = random.Random(7)
        samples = []
        for _ in range(key_queries):
            i = rng.randrange(messages)
            t = time.perf_counter_ns()
            result = store.query_message(TOPIC, f"order-{i}", 32, 0, 2**62)
            samples.append(time.perf_counter_ns() - t)
            if result.message_count != 1:
                raise RuntimeError(f"key order-{i}: {result.message_count} records")
        rows.append(latency_row("query by key", f"{messages:,} keyed records", samples))
    shutil.rmtree(root / "pulls", ignore_errors=True)
    return rows


def bench_by_time(root: Path, entries: int, lookups: int) -> Row:
    clock = ManualClock()
    config = MessageStoreConfig(store_path_root_dir=root / "by-time", message_index_enable=False)

    def make(i: int) -> Message:
        return Message(TOPIC, b"%016d" % i, queue_id=0)

    with MessageStore.open(config, clock=clock) as store:
        _progress(f"writing {entries:,} small records")
        first = clock.now_ms() + 1
        fill(store, entries, make, clock)
        last = clock.now_ms()
        assert store.get_max_offset_in_queue(TOPIC, 0) == entries
        _progress("offset by time")
        rng = random.Random(3)
        by_time = store.get_offset_in_queue_by_time
        for _ in range(100):
            by_time(TOPIC, 0, rng.randint(first, last))  # warm
        samples = []
        for _ in range(lookups):
            ts = rng.randint(first - 1000, last + 1000)
            t = time.perf_counter_ns()
            offset = by_time(TOPIC, 0, ts)
            samples.append(time.perf_counter_ns() - t)
            if not 0 <= offset < entries:
                raise RuntimeError(f"offset {offset} for {ts}")
        # Spot check: a batch's time maps to that batch's first entry.
        probe = (entries // BATCH // 2) * BATCH
        assert by_time(TOPIC, 0, first + probe // BATCH) == probe
    shutil.rmtree(root / "by-time", ignore_errors=True)
    return latency_row(
        "offset by time", f"queue of {entries:,} entries", samples, TARGET_BY_TIME_US
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="small counts: a smoke run in seconds")
    p.add_argument("--messages", type=int, default=500_000, help="1 KiB records to pull")
    p.add_argument("--entries", type=int, default=10_000_000, help="entries of the by-time queue")
    p.add_argument("--lookups", type=int, default=5000, help="offset-by-time calls timed")
    p.add_argument("--key-queries", type=int, default=2000, help="query_message calls timed")
    p.add_argument("--root", type=Path, help="store directory (default: a temp dir, removed)")
    add_json_out(p)
    args = p.parse_args(argv)
    if args.quick:
        args.messages, args.entries, args.lookups, args.key_queries = 20_000, 100_000, 500, 200
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    report = Report.start(__file__, args, argv)
    with bench_root(args.root, "store_read.py", argv) as root:
        started = time.perf_counter()
        rows = bench_pulls_and_keys(root, args.messages, args.key_queries)
        rows.append(bench_by_time(root, args.entries, args.lookups))
        print()
        report.emit(rows_table("reads", rows))
        print()
        report.note(f"total {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
