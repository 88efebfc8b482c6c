"""Pipeline benchmark: rows/s of ``basalt pipeline export``, and of a batch read.

Usage::

    python benchmarks/pipeline.py [--messages 1000000] [--body 1024] [--master local[2]]
                                  [--root DIR] [--no-batch-read]

Export: writes a store root with the engine directly (``MessageStore`` puts in
batches of 256 over 8 queues, 128 MiB CommitLog files so the export has one
task per file to spread over the cores), then times ``jobs.export`` of the
whole root to Parquet (snappy, written by pyarrow in the tasks) and, apart,
the same read as a Python data source into Spark's ``noop`` sink (the
reading and Spark's intake of the rows). Targets: export >= 300,000 rows/s.

Batch read (only when ``basalt.pipeline.source`` is installed; it is the
``format("basalt")`` source): ``basalt cluster up``, the same messages sent
with ``basalt produce --batch 256``, then ``spark.read.format("basalt")`` of
the topic into the ``noop`` sink (executors read the store-nodes directly),
timed on a second read (the first warms the source's path).
Target: >= 500,000 rows/s.

Streaming: ``spark.readStream.format("basalt")`` of the same topic from the
earliest offsets into the ``noop`` sink, micro-batches of at most
``STREAM_MAX_OFFSETS`` offsets (``maxOffsetsPerTrigger``), timed from the
query's start until every message has passed (no target).

Prints a table: what, rows, seconds, rows/s, target (and writes it as JSON,
``--json-out``: benchmarks/report.py).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from basalt.pipeline import jobs
from basalt.pipeline._root_source import FORMAT, source_class
from basalt.store import Message, MessageStore, MessageStoreConfig

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import Figure, Report, Table, add_json_out, count

QUEUES = 8
BATCH = 256
#: maxOffsetsPerTrigger of the streaming read: ~10 micro-batches of the default 1,000,000.
STREAM_MAX_OFFSETS = 100_000


def write_root(root: Path, messages: int, body: int) -> float:
    """A store root of ``messages`` bodies of ``body`` bytes; returns the seconds it took."""
    config = MessageStoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=128 << 20,
        disk_max_used_space_ratio=100,
        disk_space_clean_forcibly_ratio=100,
        disk_space_warning_level_ratio=100,
    )
    payload = b"x" * body
    started = time.perf_counter()
    store = MessageStore.open(config)
    try:
        for at in range(0, messages, BATCH):
            n = min(BATCH, messages - at)
            queue = (at // BATCH) % QUEUES
            store.put_messages([Message("Bench", payload, queue_id=queue) for _ in range(n)])
    finally:
        store.shutdown()
    return time.perf_counter() - started


def _basalt(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "basalt.admin", *argv], capture_output=True, text=True, check=False
    )
    if done.returncode:
        raise RuntimeError(f"basalt {' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def cluster_reads(spark: object, work: Path, messages: int, body: int) -> tuple[float, float, int]:
    """Seconds of a ``format("basalt")`` batch read of ``messages`` sent to a local
    cluster, then seconds and micro-batches of a streaming read of them all."""
    from basalt.pipeline import register

    register(spark)
    data = work / "cluster"
    _basalt("cluster", "up", "--data-dir", str(data), "--store-files", "production")
    try:
        rows = json.loads(_basalt("cluster", "status", "--data-dir", str(data), "--json"))
        pull = next(r["address"] for r in rows if r["role"] == "pull-service")
        _basalt("produce", "-t", "Bench", "-n", str(messages), "--size", str(body),
                "--batch", str(BATCH), "--endpoints", pull)  # fmt: skip
        # the first read warms the workers' and the JVM's path of this source; the second is timed
        for _ in range(2):
            started = time.perf_counter()
            df = spark.read.format("basalt").options(endpoint=pull, topic="Bench").load()  # type: ignore[attr-defined]
            df.write.format("noop").mode("overwrite").save()
            batch_seconds = time.perf_counter() - started
        stream_seconds, batches = stream_read(spark, work, pull, messages)
        return batch_seconds, stream_seconds, batches
    finally:
        _basalt("cluster", "down", "--data-dir", str(data))


def stream_read(spark: object, work: Path, pull: str, messages: int) -> tuple[float, int]:
    """Seconds until a ``readStream.format("basalt")`` query from the earliest offsets
    has passed ``messages`` rows to the ``noop`` sink (micro-batches of at most
    STREAM_MAX_OFFSETS), and how many micro-batches that took."""
    stream = (
        spark.readStream.format("basalt")  # type: ignore[attr-defined]
        .options(endpoint=pull, topic="Bench", startingOffsets="earliest")
        .option("maxOffsetsPerTrigger", str(STREAM_MAX_OFFSETS))
        .load()
    )
    started = time.perf_counter()
    query = (
        stream.writeStream.format("noop")
        .option("checkpointLocation", str(work / "stream-checkpoint"))
        .start()
    )
    try:
        while True:
            progress = query.recentProgress
            if sum(p["numInputRows"] for p in progress) >= messages:
                return time.perf_counter() - started, len(progress)
            if query.exception() is not None:
                raise RuntimeError(f"streaming read failed: {query.exception()}")
            time.sleep(0.05)
    finally:
        query.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="rows/s of the pipeline's export and read")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body", type=int, default=1024, help="body bytes")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--root", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--no-batch-read", action="store_true")
    add_json_out(parser)
    args = parser.parse_args(argv)
    report = Report.start(__file__, args, argv)
    work = Path(tempfile.mkdtemp(prefix="basalt-pipeline-", dir=args.root))
    table = Table("rows", ("what", "rows", "seconds", "rows/s", "target", "micro-batches"))

    def add(what: str, rows: int, seconds: float, target: str = "", batches: int = 0) -> None:
        table.add(
            what,
            count(rows),
            Figure(seconds, "s", better=None, fmt=".2f"),
            Figure(rows / seconds, "rows/s", fmt=",.0f"),
            target,
            count(batches) if batches else "",
        )

    try:
        root = work / "broker-a"
        seconds = write_root(root, args.messages, args.body)
        add("write root (MessageStore)", args.messages, seconds)
        spark = jobs.start_session(args.master, app="basalt-bench")
        spark.sparkContext.setLogLevel("ERROR")
        # JVM and workers warm, for the export and for a Python data source read
        jobs.export(spark, root, str(work / "warm.parquet"), to_ms=0)
        spark.dataSource.register(source_class())
        warm = spark.read.format(FORMAT).option("root", str(root)).option("toMs", "0").load()
        warm.write.format("noop").mode("overwrite").save()
        started = time.perf_counter()
        reader = spark.read.format(FORMAT).option("root", str(root)).load()
        reader.write.format("noop").mode("overwrite").save()
        add("read root (noop sink)", args.messages, time.perf_counter() - started)
        started = time.perf_counter()
        result = jobs.export(spark, root, str(work / "export.parquet"))
        seconds = time.perf_counter() - started
        assert result.rows == args.messages and result.ok, result.summary()
        add("export -> Parquet", result.rows, seconds, ">= 300,000")
        if args.no_batch_read:
            pass
        elif importlib.util.find_spec("basalt.pipeline.source") is None:
            print("batch read: skipped (basalt.pipeline.source is not installed)")
        else:
            batch_s, stream_s, batches = cluster_reads(spark, work, args.messages, args.body)
            add('read format("basalt") (noop)', args.messages, batch_s, ">= 500,000")
            add('readStream format("basalt")', args.messages, stream_s, batches=batches)
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.emit(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
