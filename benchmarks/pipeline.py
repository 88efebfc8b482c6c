"""Pipeline benchmark: rows/s of ``basalt pipeline export``, and of the source's
reads against Spark's own intake, the ceiling, measured in the same run.

Usage::

    python benchmarks/pipeline.py [--messages 1000000] [--body 1024] [--master local[2]]
                                  [--root DIR] [--rounds 3] [--no-batch-read] [--reads-only]

Export: writes a store root with the engine directly (``MessageStore`` puts in
batches of 256 over 8 queues, 128 MiB CommitLog files so the export has one
task per file to spread over the cores), then times ``jobs.export`` of the
whole root to Parquet (snappy, written by pyarrow in the tasks) and, apart,
the same read as a Python data source into Spark's ``noop`` sink (the
reading and Spark's intake of the rows). Targets: export >= 300,000 rows/s.
``--reads-only`` leaves these rows out.

Reads (only when ``basalt.pipeline.source`` is installed; it is the
``format("basalt")`` source): ``basalt cluster up``, the same messages sent
with ``basalt produce --batch 256``, then ``spark.read.format("basalt")`` of
the topic into the ``noop`` sink (executors read the store-nodes directly),
and the ceiling: ``format("basalt-ceiling")`` (:func:`ceiling_source_class`),
a Python data source with the same schema and the same input partitions,
yielding a ready-made Arrow batch (one the basalt source read) and reading
nothing, into the same sink: what Spark's own intake allows. One warm-up read
of each, then ``--rounds`` timed reads of each, alternating. Streaming: the
same with ``readStream`` from the earliest offsets, micro-batches of at most
``STREAM_MAX_OFFSETS`` offsets (``maxOffsetsPerTrigger``; the ceiling's stream
plans the same micro-batches), timed from the query's start until every
message has passed. Each row is the median round. Targets (issue 31 §3),
basalt's rows/s over the ceiling's: >= 0.60 batch, >= 0.50 streaming.

Tables (and JSON, ``--json-out``: benchmarks/report.py): ``rows`` (what,
rows, seconds, rows/s, target), ``ceiling`` (each read's rows/s beside the
ceiling's, and the ratio), ``spark cpu`` (the CPU of Spark's JVM and Python
workers per 1,000,000 rows of each read and the ceiling's, and their ratio:
the cost on the executors' cores alone, where the store-nodes do not share
them as they do on one machine), ``cpu`` (CPU seconds per 1,000,000 rows of the
median round, by process: Spark's JVM, its Python workers, the cluster's
store-nodes, this driver, everything else on the machine).
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
#: The ceiling's format name (:func:`ceiling_source_class`).
CEILING = "basalt-ceiling"


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


# -- Spark's own intake: the ceiling ------------------------------------------------


def ceiling_source_class() -> type[Any]:
    """``format("basalt-ceiling")``: Spark's own intake of the basalt source's rows.

    The same schema and the same plan as ``format("basalt")`` over the same
    queues (option ``queues``: JSON ``[[topic, broker, queue_id, start, end],
    ...]``; the input partitions are :func:`basalt.pipeline.source._plan`'s,
    and a stream's micro-batches are capped by the same ``_cap``), but each
    partition yields a ready-made RecordBatch (option ``sample``: an Arrow IPC
    file holding one batch the basalt source read from the cluster), sliced to
    the partition's row count, and reads nothing. What is left is what Spark
    costs: the Arrow stream from the Python worker to the JVM, the JVM's copy
    into rows, the ``noop`` sink, the planning and, streaming, the
    micro-batches' checkpoints. Defined in a function so that Spark pickles
    the classes by value (the workers need not import ``benchmarks``)."""
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from basalt.pipeline._cluster import QueueRef
    from basalt.pipeline._rows import SCHEMA_DDL
    from basalt.pipeline.source import (
        BasaltPartition,
        BasaltQueues,
        _cap,
        _flatten,
        _offsets_json,
        _plan,
    )

    def rows_of(partition: Any) -> int:
        parts = partition.parts if isinstance(partition, BasaltQueues) else (partition,)
        assert all(isinstance(p, BasaltPartition) for p in parts)
        return sum(max(0, p.end - p.start) for p in parts)

    def yield_rows(sample_path: str, rows: int) -> Iterator[pa.RecordBatch]:
        with pa.memory_map(sample_path) as source:
            sample = pa.ipc.open_file(source).get_batch(0)
        while rows > 0:
            n = min(rows, sample.num_rows)
            yield sample if n == sample.num_rows else sample.slice(0, n)
            rows -= n

    def queues(options: Any) -> list[tuple[str, str, int, int, int]]:
        return [tuple(q) for q in json.loads(options["queues"])]

    class CeilingReader(DataSourceReader):
        def __init__(self, options: Any) -> None:
            self.sample = options["sample"]
            self.plan = _plan(queues(options), None)

        def partitions(self) -> list[Any]:
            return list(self.plan)

        def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
            yield from yield_rows(self.sample, rows_of(partition))

    class CeilingStreamReader(DataSourceStreamReader):
        def __init__(self, options: Any) -> None:
            self.sample = options["sample"]
            self.queues = queues(options)
            self.max_rows = int(options.get("maxOffsetsPerTrigger", "0")) or None

        def initialOffset(self) -> dict[str, Any]:
            return dict(_offsets_json({QueueRef(t, b, q, ""): s for t, b, q, s, _ in self.queues}))

        def getDefaultReadLimit(self) -> Any:
            return ReadAllAvailable() if self.max_rows is None else ReadMaxRows(self.max_rows)

        def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
            end = {QueueRef(t, b, q, ""): e for t, b, q, _, e in self.queues}
            if isinstance(limit, ReadMaxRows):
                end = _cap(_flatten(start), end, limit.max_rows)
            return dict(_offsets_json(end))

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[Any]:
            begin = _flatten(start)
            ranges = [
                (topic, broker, queue_id, begin.get((topic, broker, queue_id), 0), offset)
                for (topic, broker, queue_id), offset in sorted(_flatten(end).items())
            ]
            return list(_plan(ranges, None))

        def read(self, partition: Any) -> Iterator[pa.RecordBatch]:
            yield from yield_rows(self.sample, rows_of(partition))

        def commit(self, end: dict[str, Any]) -> None:
            pass

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return CEILING

        def schema(self) -> str:
            return SCHEMA_DDL

        def reader(self, schema: Any) -> DataSourceReader:
            return CeilingReader(self.options)

        def streamReader(self, schema: Any) -> DataSourceStreamReader:
            return CeilingStreamReader(self.options)

    return CeilingSource


def ceiling_options(pull: str, topic: str, sample: Path) -> dict[str, str]:
    """The ``basalt-ceiling`` options for ``topic``'s queues as they are now (each
    queue's stored range, what a batch read from the earliest offsets plans),
    with ``sample`` written: the first batch the basalt source reads of it."""
    import pyarrow as pa

    from basalt.pipeline import _cluster
    from basalt.pipeline.source import BasaltPartition, SourceOptions, _read

    queues = [
        (q.topic, q.broker, q.queue_id, *_cluster.min_max(q))
        for q in _cluster.queues_of(pull, [topic])
    ]
    first = next(q for q in queues if q[4] > q[3])
    options = SourceOptions.parse({"endpoint": pull, "topic": topic})
    batch = next(iter(_read(options, BasaltPartition(*first))))
    with pa.OSFile(str(sample), "wb") as out, pa.ipc.new_file(out, batch.schema) as writer:
        writer.write_batch(batch)
    return {"sample": str(sample), "queues": json.dumps(queues)}


# -- CPU by process -------------------------------------------------------------------

_CLK_TCK = os.sysconf("SC_CLK_TCK")
#: The roles CPU is split into, in the table's order.
ROLES = ("JVM", "Python workers", "store-nodes", "driver", "other")


#: The benchmark cluster's store-node pids (other clusters on the machine are "other").
STORE_NODES: set[int] = set()


def _role(pid: int) -> str:
    """What ``pid`` is to this run: Spark's JVM (this process's child), its Python
    workers (the JVM's ``pyspark.daemon`` and what it forks), the benchmark
    cluster's store-nodes, this driver, or other."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return "other"
    if pid == os.getpid():
        return "driver"
    if pid in STORE_NODES:
        return "store-nodes"
    if parent == os.getpid() and argv[0].endswith(b"java"):
        return "JVM"
    if b"pyspark.daemon" in argv and _role(parent) in ("JVM", "Python workers"):
        return "Python workers"
    return "other"


def cpu_by_role() -> dict[int, tuple[str, float]]:
    """Each live process's role (:func:`_role`) and CPU seconds (utime + stime)
    so far, by pid."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            raw = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        pid = int(entry.name)
        out[pid] = (_role(pid), (int(fields[11]) + int(fields[12])) / _CLK_TCK)
    return out


def cpu_spent(before: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds per role since ``before`` (a process that started since counts
    whole; one that ended since is lost: Spark keeps its Python workers)."""
    spent = dict.fromkeys(ROLES, 0.0)
    for pid, (role, secs) in cpu_by_role().items():
        spent[role] += secs - before.get(pid, (role, 0.0))[1]
    return spent


@dataclass
class Timed:
    """One timed read: seconds and CPU seconds per role."""

    seconds: float
    cpu: dict[str, float]
    value: object = None  # what the run returned


def timed(run: Callable[[], object]) -> Timed:
    before = cpu_by_role()
    started = time.perf_counter()
    value = run()
    seconds = time.perf_counter() - started
    return Timed(seconds, cpu_spent(before), value)


def spark_cpu(run: Timed) -> float:
    """CPU seconds of Spark's own processes in ``run``: its JVM and Python workers
    (what the executors' cores pay where the store-nodes run on other hosts)."""
    return run.cpu["JVM"] + run.cpu["Python workers"]


def median_run(runs: Sequence[Timed]) -> Timed:
    """The run of median seconds."""
    return sorted(runs, key=lambda t: t.seconds)[len(runs) // 2]


# -- the cluster reads ------------------------------------------------------------------


@dataclass
class ClusterReads:
    """Rounds of each read, the basalt source and the ceiling alternating."""

    batch: list[Timed]
    batch_ceiling: list[Timed]
    stream: list[Timed]
    stream_ceiling: list[Timed]
    micro_batches: int


def batch_read(spark: Any, fmt: str, options: Mapping[str, str]) -> None:
    df = spark.read.format(fmt).options(**options).load()
    df.write.format("noop").mode("overwrite").save()


def cluster_reads(spark: Any, work: Path, messages: int, body: int, rounds: int) -> ClusterReads:
    """``rounds`` timed batch reads of ``messages`` sent to a local cluster by
    ``format("basalt")`` and by the ceiling (alternating, after one warm-up read
    of each), then ``rounds`` streaming reads of each."""
    from basalt.pipeline import register

    register(spark)
    spark.dataSource.register(ceiling_source_class())
    data = work / "cluster"
    _basalt("cluster", "up", "--data-dir", str(data), "--store-files", "production")
    try:
        rows = json.loads(_basalt("cluster", "status", "--data-dir", str(data), "--json"))
        pull = next(r["address"] for r in rows if r["role"] == "pull-service")
        STORE_NODES.update(r["pid"] for r in rows if r["role"] == "store-node")
        _basalt("produce", "-t", "Bench", "-n", str(messages), "--size", str(body),
                "--batch", str(BATCH), "--endpoints", pull)  # fmt: skip
        basalt = {"endpoint": pull, "topic": "Bench"}
        ceiling = ceiling_options(pull, "Bench", work / "sample.arrow")
        out = ClusterReads([], [], [], [], 0)
        # the first read of each warms the workers' and the JVM's path of that source
        batch_read(spark, "basalt", basalt)
        batch_read(spark, CEILING, ceiling)
        for fmt, options in ((CEILING, ceiling), ("basalt", basalt)):
            stream_read(spark, fmt, options, work / f"checkpoint-{fmt}-warm", messages)
        for _ in range(rounds):
            out.batch_ceiling.append(timed(lambda: batch_read(spark, CEILING, ceiling)))
            out.batch.append(timed(lambda: batch_read(spark, "basalt", basalt)))
        for n in range(rounds):
            for fmt, options, runs in (
                (CEILING, ceiling, out.stream_ceiling),
                ("basalt", basalt, out.stream),
            ):
                read = functools.partial(
                    stream_read, spark, fmt, options, work / f"checkpoint-{fmt}-{n}", messages
                )
                runs.append(timed(read))
                out.micro_batches = int(runs[-1].value)  # type: ignore[call-overload]
        return out
    finally:
        _basalt("cluster", "down", "--data-dir", str(data))


def stream_read(
    spark: Any, fmt: str, options: Mapping[str, str], checkpoint: Path, messages: int
) -> int:
    """Run a ``readStream.format(fmt)`` query from the earliest offsets until it has
    passed ``messages`` rows to the ``noop`` sink (micro-batches of at most
    STREAM_MAX_OFFSETS); returns how many micro-batches that took."""
    stream = (
        spark.readStream.format(fmt)
        .options(**options)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(STREAM_MAX_OFFSETS))
        .load()
    )
    query = stream.writeStream.format("noop").option("checkpointLocation", str(checkpoint)).start()
    try:
        while True:
            progress = query.recentProgress
            if sum(p["numInputRows"] for p in progress) >= messages:
                return len(progress)
            if query.exception() is not None:
                raise RuntimeError(f"streaming read of {fmt} failed: {query.exception()}")
            time.sleep(0.05)
    finally:
        query.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="rows/s of the pipeline's export and read")
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--body", type=int, default=1024, help="body bytes")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--root", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--rounds", type=int, default=3, help="timed reads of each source")
    parser.add_argument("--no-batch-read", action="store_true", help="no cluster reads")
    parser.add_argument("--reads-only", action="store_true", help="no store root, no export")
    add_json_out(parser)
    args = parser.parse_args(argv)
    report = Report.start(__file__, args, argv)
    work = Path(tempfile.mkdtemp(prefix="basalt-pipeline-", dir=args.root))
    table = Table("rows", ("what", "rows", "seconds", "rows/s", "target", "micro-batches"))
    ratios = Table("ceiling", ("read", "basalt rows/s", "ceiling rows/s", "ratio", "target"))
    cpu = Table("cpu", ("read", *ROLES, "total"))
    spark_side = Table(
        "spark cpu", ("read", "basalt JVM + workers", "ceiling JVM + workers", "ratio")
    )

    def add(what: str, rows: int, seconds: float, target: str = "", batches: int = 0) -> None:
        table.add(
            what,
            count(rows),
            Figure(seconds, "s", better=None, fmt=".2f"),
            Figure(rows / seconds, "rows/s", fmt=",.0f"),
            target,
            count(batches) if batches else "",
        )

    def add_cpu(what: str, run: Timed) -> None:
        per_m = 1_000_000 / args.messages
        cpu.add(
            what,
            *(Figure(run.cpu[r] * per_m, "s/1M rows", fmt=".2f") for r in ROLES),
            Figure(sum(run.cpu.values()) * per_m, "s/1M rows", fmt=".2f"),
        )

    try:
        spark = jobs.start_session(args.master, app="basalt-bench")
        spark.sparkContext.setLogLevel("ERROR")
        if not args.reads_only:
            store_root_rows(spark, work, args, add)
        if args.no_batch_read:
            pass
        elif importlib.util.find_spec("basalt.pipeline.source") is None:
            print("batch read: skipped (basalt.pipeline.source is not installed)")
        else:
            reads = cluster_reads(spark, work, args.messages, args.body, args.rounds)
            n = args.messages
            for what, runs, target, batches in (
                ("ceiling: ready-made Arrow batches (noop)", reads.batch_ceiling, "", 0),
                ('read format("basalt") (noop)', reads.batch, "", 0),
                ("ceiling: readStream of ready-made batches", reads.stream_ceiling, "", 0),
                ('readStream format("basalt")', reads.stream, "", reads.micro_batches),
            ):
                add(what, n, median_run(runs).seconds, target, batches)
            for what, mine, theirs, target in (
                ("batch", reads.batch, reads.batch_ceiling, ">= 0.60"),
                ("streaming", reads.stream, reads.stream_ceiling, ">= 0.50"),
            ):
                ours_s, ceiling_s = median_run(mine).seconds, median_run(theirs).seconds
                ratios.add(
                    what,
                    Figure(n / ours_s, "rows/s", fmt=",.0f"),
                    Figure(n / ceiling_s, "rows/s", fmt=",.0f"),
                    Figure(ceiling_s / ours_s, "ratio", better="higher", fmt=".2f"),
                    target,
                )
                report.note(
                    f"{what}: per round, basalt/ceiling "
                    + ", ".join(
                        f"{c.seconds / b.seconds:.2f}" for b, c in zip(mine, theirs, strict=True)
                    )
                )
            for what, mine, theirs in (
                ("batch", reads.batch, reads.batch_ceiling),
                ("streaming", reads.stream, reads.stream_ceiling),
            ):
                ours_cpu, ceiling_cpu = (spark_cpu(median_run(r)) * 1e6 / n for r in (mine, theirs))
                spark_side.add(
                    what,
                    Figure(ours_cpu, "s/1M rows", fmt=".2f"),
                    Figure(ceiling_cpu, "s/1M rows", fmt=".2f"),
                    Figure(ceiling_cpu / ours_cpu, "ratio", better="higher", fmt=".2f"),
                )
            add_cpu("ceiling batch", median_run(reads.batch_ceiling))
            add_cpu('format("basalt") batch', median_run(reads.batch))
            add_cpu("ceiling streaming", median_run(reads.stream_ceiling))
            add_cpu('format("basalt") streaming', median_run(reads.stream))
        spark.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report.emit(table)
    if ratios.rows:
        report.emit(ratios)
        report.emit(spark_side)
        report.emit(cpu)
    return 0


def store_root_rows(
    spark: Any, work: Path, args: argparse.Namespace, add: Callable[[str, int, float, str], None]
) -> None:
    """The store-root rows: the root written, read into ``noop``, exported."""
    root = work / "broker-a"
    seconds = write_root(root, args.messages, args.body)
    add("write root (MessageStore)", args.messages, seconds, "")
    # JVM and workers warm, for the export and for a Python data source read
    jobs.export(spark, root, str(work / "warm.parquet"), to_ms=0)
    spark.dataSource.register(source_class())
    warm = spark.read.format(FORMAT).option("root", str(root)).option("toMs", "0").load()
    warm.write.format("noop").mode("overwrite").save()
    started = time.perf_counter()
    reader = spark.read.format(FORMAT).option("root", str(root)).load()
    reader.write.format("noop").mode("overwrite").save()
    add("read root (noop sink)", args.messages, time.perf_counter() - started, "")
    started = time.perf_counter()
    result = jobs.export(spark, root, str(work / "export.parquet"))
    seconds = time.perf_counter() - started
    assert result.rows == args.messages and result.ok, result.summary()
    add("export -> Parquet", result.rows, seconds, ">= 300,000")


if __name__ == "__main__":
    raise SystemExit(main())
