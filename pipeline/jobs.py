"""``basalt pipeline <job>``: Spark jobs over store roots on local disk, and a lag report.

::

    basalt pipeline export --root R --out P [--topic T] [--from-time T] [--to-time T]
    basalt pipeline verify --root R
    basalt pipeline rebuild-index --root R --out R2
    basalt pipeline lag-report -g G [-g G ...] [--etcd E] [--topic T] [--out DIR]

The store-root jobs read a root (copied off a node, a mounted volume) through
the engine's read-only loaders and codec, one Spark task per CommitLog file
(:mod:`basalt.pipeline._store_read`); nothing in the root is written.

- :func:`export`: CommitLog -> Parquet in the source schema, CRC checked; bad
  records are counted and reported (exit 1), never silently dropped.
- :func:`verify`: the parallel ``basalt store check``: per CommitLog file,
  records, bad records (CRC or framing) and each record against its
  ConsumeQueue unit; per ConsumeQueue, each unit against the CommitLog (a unit
  past its end or at a non-record); report DataFrames and a summary line.
- :func:`rebuild_index`: ConsumeQueue files and IndexFiles rebuilt from the
  CommitLog into another root, byte-identical to the store's
  (:mod:`basalt.pipeline._index`).
- :func:`lag_report`: consumerProgress for groups as a table, appended to a
  CSV (one snapshot per run: a time series over runs).

Exit statuses as the other groups: 0 fine, 1 something is wrong (bad
records, inconsistency, an admin error), 2 a bad path or argument.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import functools
import logging
import os
import shutil
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import astuple, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from basalt.pipeline._index import (
    check_queue_units,
    consume_queues,
    rebuild_index_files,
    source_index,
)
from basalt.pipeline._rows import ARROW_SCHEMA
from basalt.pipeline._store_read import (
    FileScan,
    FileSpec,
    commitlog_files,
    export_batches,
    queue_runs,
    verify_file,
)
from basalt.store.config import CQ_STORE_UNIT_SIZE, MessageStoreConfig
from basalt.store.consume_queue import BLANK_UNIT
from basalt.store.readonly import StoreRootError, store_layout

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "ExportResult",
    "LagRow",
    "RebuildResult",
    "VerifyResult",
    "add_commands",
    "export",
    "lag_report",
    "parse_time",
    "rebuild_index",
    "start_session",
    "verify",
]

EXIT_OK = 0
EXIT_PROBLEM = 1
EXIT_USAGE = 2

#: The report columns of :func:`verify`, one row per CommitLog file.
VERIFY_DDL = (
    "file string, start_offset long, end_offset long, records long, bad_records long, "
    "first_bad_offset long, first_bad_reason string, cq_units_checked long, "
    "cq_mismatches long, first_cq_mismatch long, undispatched long"
)
#: The unit report of :func:`verify`, one row per ConsumeQueue (:class:`QueueUnits`).
UNITS_DDL = (
    "topic string, queue_id int, units_checked long, bad_units long, "
    "first_bad_unit long, first_bad_reason string"
)


def start_session(master: str = "local[2]", app: str = "basalt-pipeline") -> SparkSession:
    """A SparkSession whose Python workers run this interpreter (``PYSPARK_PYTHON``)."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )


def parse_time(text: str) -> int:
    """Epoch milliseconds from ``text``: an integer (ms) or ISO 8601 (UTC if no zone).

    Raises ValueError naming the text otherwise.
    """
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"not a time (ISO 8601 or epoch ms): {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _time_arg(text: str) -> int:
    """:func:`parse_time` for argparse: its message, not "invalid value"."""
    try:
        return parse_time(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _files_rdd(spark: SparkSession, files: list[FileSpec]) -> Any:
    """One partition per CommitLog file: one task reads one file."""
    return spark.sparkContext.parallelize(files, max(1, len(files)))


# -- export --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ExportResult:
    """What an export wrote: rows, files read, and the bad records it met."""

    rows: int
    files: int
    bad_records: int
    #: (CommitLog offset, reason) of the first bad record of each file that had one.
    bad: list[tuple[int, str]]

    @property
    def ok(self) -> bool:
        return self.bad_records == 0

    def summary(self) -> str:
        line = f"exported {self.rows} records from {self.files} CommitLog files"
        if self.bad_records:
            line += f"; {self.bad_records} bad records (not exported), first at " + ", ".join(
                f"{offset} ({reason})" for offset, reason in self.bad
            )
        return line


def export(
    spark: SparkSession,
    root: Path,
    out: str,
    *,
    topic: str | None = None,
    from_ms: int | None = None,
    to_ms: int | None = None,
    broker: str | None = None,
    mode: str = "errorifexists",
) -> ExportResult:
    """Write the CommitLog records of ``root`` to Parquet at ``out`` (source schema).

    One Spark task per CommitLog file (an RDD over the file list) reads its
    file as Arrow batches (:func:`export_batches`) and writes them with
    pyarrow's Parquet writer into a staging directory under ``out``
    (:func:`_export_file`); rows never pass through the JVM. Only when every
    task has succeeded does the driver commit: the part files are renamed into
    ``out`` and ``_SUCCESS`` written. A failed job removes its staging
    directory (and ``out`` when it made it), so it leaves no half output.

    ``broker`` defaults to the root directory's name. Rows are filtered by
    ``topic`` and store time ``[from_ms, to_ms)`` in the tasks. Bad records
    are not written: they are counted and the first of each file reported.
    ``mode`` is ``errorifexists`` (FileExistsError when ``out`` exists) or
    ``overwrite`` (``out``'s old content is removed at the commit). Raises
    StoreRootError for a bad root.
    """
    if mode not in ("errorifexists", "overwrite"):
        raise ValueError(f"export mode {mode!r} is not 'errorifexists' or 'overwrite'")
    files = commitlog_files(root)
    target = Path(out)
    made = not target.exists()
    if not made and mode == "errorifexists":
        raise FileExistsError(f"{out} exists")
    staging = target / f"{_STAGING_PREFIX}{uuid.uuid4().hex}"
    staging.mkdir(parents=True)
    task = functools.partial(
        _export_file,
        str(staging),
        broker or root.resolve().name,
        topic,
        from_ms,
        to_ms,
    )
    try:
        counts = _files_rdd(spark, files).mapPartitionsWithIndex(task).collect()
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if made:
            shutil.rmtree(target, ignore_errors=True)
        raise
    _commit(target, staging)
    bad = sorted((offset, reason) for _, _, offset, reason in counts if offset is not None)
    for offset, why in bad:  # never exported: a damaged record is no row
        log.error("export of %s: bad record at commitlog offset %d skipped: %s", root, offset, why)
    return ExportResult(sum(c[0] for c in counts), len(files), sum(c[1] for c in counts), bad)


#: The export's staging directories under ``out`` (Spark's committer names its own ``_temporary``).
_STAGING_PREFIX = "_staging-"
#: Body bytes gathered before a row group is written: Spark writes 128 MiB row
#: groups; pyarrow would write one per 8192-row batch (8 MiB of 1 KiB bodies),
#: which readers pay for in per-group overhead.
_ROW_GROUP_BYTES = 64 << 20


def _export_file(
    staging: str,
    broker: str,
    topic: str | None,
    from_ms: int | None,
    to_ms: int | None,
    index: int,
    specs: Iterable[FileSpec],
) -> Iterator[tuple[int, int, int | None, str | None]]:
    """Write the records of each file of ``specs`` (one, by :func:`_files_rdd`) to
    ``staging/part-<index>.parquet``; yields (rows written, bad records, first
    bad offset, its reason) per file.

    The part is written under a temporary name and renamed, so a retried task
    replaces its own part whole and a task killed midway leaves no part that
    looks finished. Every task writes a part, rows or not, so that an export
    of nothing still reads back with its schema. Compression is snappy:
    Spark's default, so the output is what ``df.write.parquet`` made before,
    and cheap enough to write at the CommitLog's read speed (zstd or gzip
    would save space on real bodies at several times the CPU)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    part = Path(staging) / f"part-{index:05d}.snappy.parquet"
    partial = part.with_name(f".{part.name}.{os.getpid()}.tmp")
    for spec in specs:
        scan = FileScan()
        rows = 0
        with pq.ParquetWriter(partial, ARROW_SCHEMA, compression="snappy") as writer:
            pending: list[pa.RecordBatch] = []
            size = 0
            batches = export_batches(
                spec, scan, broker=broker, topic=topic, from_ms=from_ms, to_ms=to_ms
            )
            for batch in batches:
                pending.append(batch)
                size += batch.nbytes
                rows += batch.num_rows
                if size >= _ROW_GROUP_BYTES:
                    writer.write_table(pa.Table.from_batches(pending), row_group_size=1 << 30)
                    pending, size = [], 0
            if pending:
                writer.write_table(pa.Table.from_batches(pending), row_group_size=1 << 30)
        os.replace(partial, part)
        yield rows, scan.bad_records, scan.first_bad_offset, scan.first_bad_reason


def _commit(target: Path, staging: Path) -> None:
    """Every task succeeded: ``out``'s old content (overwrite) goes, the parts
    move in from ``staging``, and ``_SUCCESS`` says the output is whole."""
    for old in target.iterdir():
        if old != staging:
            if old.is_dir():
                shutil.rmtree(old)
            else:
                old.unlink()
    for part in sorted(staging.iterdir()):
        if part.name.startswith("part-"):
            part.rename(target / part.name)
    shutil.rmtree(staging)
    (target / "_SUCCESS").touch()


# -- verify --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VerifyResult:
    """The per-file report (a DataFrame, :data:`VERIFY_DDL`), the per-queue unit
    report (:data:`UNITS_DDL`) and their totals."""

    report: DataFrame
    files: int
    records: int
    bad_records: int
    cq_mismatches: int
    undispatched: int
    #: Undispatched records are a problem only on a cleanly shut down root (no ``abort``).
    running: bool
    units_report: DataFrame
    #: ConsumeQueue units that do not describe a record (past the CommitLog's end,
    #: at a non-record, or at another record): the queue -> CommitLog direction.
    bad_units: int

    @property
    def ok(self) -> bool:
        return (
            self.bad_records == 0
            and self.cq_mismatches == 0
            and self.bad_units == 0
            and (self.running or self.undispatched == 0)
        )

    def summary(self) -> str:
        state = "consistent" if self.ok else "INCONSISTENT"
        return (
            f"{state}: {self.files} CommitLog files, {self.records} records, "
            f"{self.bad_records} bad records, {self.cq_mismatches} ConsumeQueue mismatches, "
            f"{self.bad_units} bad ConsumeQueue units, {self.undispatched} undispatched"
            + (" (abort present: the dispatcher catches up)" if self.running else "")
        )


def _verify_row(spec: FileSpec) -> tuple[Any, ...]:
    scan = verify_file(spec)
    x = scan.extra
    return (
        Path(spec.path).name,
        spec.start,
        scan.end_offset,
        scan.records,
        scan.bad_records,
        scan.first_bad_offset,
        scan.first_bad_reason,
        x["cq_units_checked"],
        x["cq_mismatches"],
        x["first_cq_mismatch"] if x["first_cq_mismatch"] >= 0 else None,
        x["undispatched"],
    )


def verify(spark: SparkSession, root: Path) -> VerifyResult:
    """Verify every CommitLog file of ``root`` in parallel (:func:`verify_file`), then
    every ConsumeQueue's units against the CommitLog, queues spread over tasks
    (:func:`basalt.pipeline._index.check_queue_units`, ``basalt store check``'s rule).

    Raises StoreRootError for a bad root.
    """
    layout = store_layout(root)
    files = commitlog_files(root)
    rows = _files_rdd(spark, files).map(_verify_row).collect()
    report = spark.createDataFrame(rows, VERIFY_DDL)
    queues = consume_queues(root)
    slices = max(1, min(len(queues), spark.sparkContext.defaultParallelism * 4))
    root_text = str(root)
    units = (
        spark.sparkContext.parallelize(queues, slices)
        .mapPartitions(lambda part: (astuple(q) for q in check_queue_units(root_text, part)))
        .collect()
    )
    return VerifyResult(
        report,
        len(files),
        sum(r[3] for r in rows),
        sum(r[4] for r in rows),
        sum(r[8] for r in rows),
        sum(r[10] for r in rows),
        layout.abort_path.exists(),
        spark.createDataFrame(units, UNITS_DDL),
        sum(u[3] for u in units),
    )


# -- rebuild-index -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RebuildResult:
    """What :func:`rebuild_index` wrote: ConsumeQueues, then IndexFiles."""

    queues: int
    units: int
    files: int
    index_files: int = 0
    index_entries: int = 0
    #: Why indexing stopped before the CommitLog's end (a record that does not parse).
    index_error: str | None = None

    @property
    def ok(self) -> bool:
        return self.index_error is None

    def summary(self) -> str:
        line = (
            f"rebuilt {self.queues} ConsumeQueues: {self.units} units in {self.files} files; "
            f"{self.index_files} IndexFiles: {self.index_entries} entries"
        )
        return line + (f"; indexing stopped at {self.index_error}" if self.index_error else "")


def _write_queue(
    out_dir: str, file_size: int, key: tuple[str, int], runs: Iterable[tuple[int, bytes]]
) -> tuple[int, int]:
    """Write one queue's files as the dispatcher does; returns (units, files).

    The dispatcher's layout: unit i at byte ``i * 20``; files of ``file_size``
    bytes named by their first byte offset (20 digits), zero-filled past the
    last unit; a queue whose first unit is not at offset 0 starts in the file
    holding it, blank units before it (ConsumeQueue._put_one); a gap between
    offsets is blank units (``pad_to``). A second unit for an offset already
    written is skipped, as the dispatcher's idempotent put skips it.
    """
    topic, queue_id = key
    ordered = sorted(runs)
    first = ordered[0][0] * CQ_STORE_UNIT_SIZE
    base = first - first % file_size
    data = bytearray(BLANK_UNIT * ((first - base) // CQ_STORE_UNIT_SIZE))
    for offset, units in ordered:
        pos = offset * CQ_STORE_UNIT_SIZE - base
        if pos < len(data):  # overlaps what is written: keep the first
            units = units[len(data) - pos :]
            pos = len(data)
        data += BLANK_UNIT * ((pos - len(data)) // CQ_STORE_UNIT_SIZE)
        data += units
    directory = Path(out_dir) / topic / str(queue_id)
    directory.mkdir(parents=True, exist_ok=True)
    count = 0
    for at in range(0, len(data), file_size):
        chunk = bytes(data[at : at + file_size])
        (directory / f"{base + at:020d}").write_bytes(chunk + bytes(file_size - len(chunk)))
        count += 1
    return (len(data) - (first - base)) // CQ_STORE_UNIT_SIZE, count


def _cq_file_size(root: Path) -> int:
    """The ConsumeQueue file size of ``root``: the most common size on disk, else the default."""
    sizes: dict[int, int] = {}
    cq_dir = store_layout(root).consume_queue_dir
    if cq_dir.is_dir():
        for f in cq_dir.glob("*/*/*"):
            size = f.stat().st_size
            if size and size % CQ_STORE_UNIT_SIZE == 0:
                sizes[size] = sizes.get(size, 0) + 1
    if sizes:
        return max(sizes, key=lambda s: sizes[s])
    return MessageStoreConfig(store_path_root_dir=root).mapped_file_size_consume_queue


def rebuild_index(
    spark: SparkSession,
    root: Path,
    out: Path,
    *,
    cq_file_size: int | None = None,
    max_hash_slot_num: int | None = None,
    max_index_num: int | None = None,
) -> RebuildResult:
    """Rebuild the ConsumeQueues of ``root`` under ``out/consumequeue`` and its
    IndexFiles under ``out/index``, from its CommitLog, in one Spark job.

    One task per CommitLog file finds its records' units
    (:func:`basalt.pipeline._store_read.queue_runs`); a shuffle by queue hands
    each queue's runs to one task, which writes its files (:func:`_write_queue`).
    Beside them one task writes the IndexFiles in CommitLog order with the
    engine's IndexService (:func:`basalt.pipeline._index.rebuild_index_files`:
    why one task, and how files are named). ``cq_file_size`` defaults to the
    root's own ConsumeQueue file size; the IndexFile geometry
    (``max_hash_slot_num``, ``max_index_num``) to what fits the size of the
    root's IndexFiles, else the store's defaults
    (:func:`basalt.pipeline._index.source_index`). Raises ValueError when
    ``out`` is ``root``, already has a consumequeue/ or index/ (the source is
    never written), or no geometry fits the root's IndexFiles; StoreRootError
    for a bad root.
    """
    files = commitlog_files(root)
    out = Path(out)
    if out.resolve() == Path(root).resolve():
        raise ValueError(f"{out}: --out must not be the source root (it is read-only)")
    layout = MessageStoreConfig(store_path_root_dir=out)
    target = layout.consume_queue_dir
    for directory in (target, layout.index_dir):
        if directory.exists() and any(directory.iterdir()):
            raise ValueError(f"{directory} exists and is not empty")
    slots, entries, names = source_index(root, max_hash_slot_num, max_index_num)
    size = cq_file_size or _cq_file_size(root)
    out_dir, root_text, out_text = str(target), str(root), str(out)
    queues = (
        _files_rdd(spark, files)
        .flatMap(queue_runs)
        .groupByKey()
        .map(lambda kv: ("queue", _write_queue(out_dir, size, kv[0], kv[1])))
    )
    index = spark.sparkContext.parallelize([out_text], 1).map(
        lambda o: ("index", astuple(rebuild_index_files(root_text, o, slots, entries, names)))
    )
    written = queues.union(index).collect()
    cq = [w for kind, w in written if kind == "queue"]
    ((index_files, index_entries, _, index_error),) = [w for kind, w in written if kind == "index"]
    return RebuildResult(
        len(cq),
        sum(u for u, _ in cq),
        sum(f for _, f in cq),
        index_files,
        index_entries,
        index_error,
    )


# -- lag-report ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LagRow:
    at_ms: int
    group: str
    topic: str
    broker: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    lag: int


LAG_HEADER = [
    "at_ms",
    "group",
    "topic",
    "broker",
    "queue_id",
    "broker_offset",
    "consumer_offset",
    "lag",
]


def lag_report(etcd: str, groups: list[str], topic: str | None = None) -> list[LagRow]:
    """consumerProgress (:func:`basalt.admin.ops.consumer_progress`) of each group, now.

    Raises AdminError (an unknown group or topic, a store-node that did not
    answer) or MetaError (etcd).
    """
    from basalt.admin import ops
    from basalt.services.meta import MetaClient, MetaConfig, parse_endpoints

    async def run() -> list[LagRow]:
        config = MetaConfig(endpoints=parse_endpoints(etcd), op_timeout_s=3.0)
        rows: list[LagRow] = []
        now = int(time.time() * 1000)
        async with MetaClient(config) as meta:
            for group in groups:
                rows += [
                    LagRow(now, group, r.topic, r.broker_name, r.queue_id, r.broker_offset,
                           r.consumer_offset, r.lag)
                    for r in await ops.consumer_progress(meta, group, topic)
                ]  # fmt: skip
        return rows

    return asyncio.run(run())


def append_csv(path: Path, rows: list[LagRow]) -> None:
    """Append rows to ``path`` (the header first when the file is new)."""
    new = not path.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(LAG_HEADER)
        writer.writerows(astuple(r) for r in rows)


def lag_series(csv_path: Path) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """The lag history in a ``lag.csv`` (:func:`append_csv`): per ``(group, topic)``,
    ``(at_ms, lag summed over its queues)`` for each snapshot, oldest first."""
    sums: dict[tuple[str, str], dict[int, int]] = {}
    with csv_path.open(newline="") as f:
        for row in csv.DictReader(f):
            at = sums.setdefault((row["group"], row["topic"]), {})
            at[int(row["at_ms"])] = at.get(int(row["at_ms"]), 0) + int(row["lag"])
    return {key: sorted(points.items()) for key, points in sorted(sums.items())}


def write_chart(csv_path: Path, png_path: Path) -> dict[tuple[str, str], list[tuple[int, int]]]:
    """Draw the lag history of ``csv_path`` (:func:`lag_series`) as a PNG: one line
    per group and topic, lag against seconds since the first snapshot (its UTC
    time in the axis label). Returns the series drawn."""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display here or on a server
    import matplotlib.pyplot as plt

    series = lag_series(csv_path)
    first = min((at for points in series.values() for at, _ in points), default=0)
    start = datetime.fromtimestamp(first / 1000, tz=UTC).isoformat(timespec="seconds")
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    try:
        for (group, topic), points in series.items():
            seconds = [(at - first) / 1000 for at, _ in points]
            axes.plot(seconds, [lag for _, lag in points], marker="o", label=f"{group} / {topic}")
        axes.set_title("consumer lag (messages), summed over each topic's queues")
        axes.set_xlabel(f"seconds since {start}")
        axes.set_ylabel("lag")
        axes.set_ylim(bottom=0)
        axes.grid(True, alpha=0.3)
        if series:
            axes.legend(loc="upper left", fontsize="small")
        figure.savefig(png_path, format="png")
    finally:
        plt.close(figure)
    return series


# -- the command group ---------------------------------------------------------------------


def add_commands(parser: argparse.ArgumentParser) -> None:
    """Add the jobs under ``parser`` (the ``basalt pipeline`` group)."""
    parser.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    sub = parser.add_subparsers(dest="command", metavar="JOB", required=True)
    ex = sub.add_parser("export", help="CommitLog -> Parquet (source schema)")
    ex.add_argument("--root", type=Path, required=True, help="the store root")
    ex.add_argument("--out", required=True, help="the Parquet output path")
    ex.add_argument("--topic", help="only this topic")
    ex.add_argument("--from-time", type=_time_arg, help="store time >= (ISO 8601 or ms)")
    ex.add_argument("--to-time", type=_time_arg, help="store time < (ISO 8601 or ms)")
    ex.add_argument("--broker", help="the broker column (default: the root's name)")
    ex.set_defaults(handler=_run_export)
    ve = sub.add_parser("verify", help="CRC and ConsumeQueue consistency per CommitLog file")
    ve.add_argument("--root", type=Path, required=True, help="the store root")
    ve.set_defaults(handler=_run_verify)
    rb = sub.add_parser(
        "rebuild-index", help="rebuild ConsumeQueues and IndexFiles from the CommitLog"
    )
    rb.add_argument("--root", type=Path, required=True, help="the store root (read-only)")
    rb.add_argument(
        "--out", type=Path, required=True, help="where consumequeue/ and index/ are written"
    )
    rb.add_argument(
        "--max-hash-slot-num",
        type=int,
        help="the store's IndexFile hash slots (default: from the root's IndexFiles' size)",
    )
    rb.add_argument(
        "--max-index-num",
        type=int,
        help="the store's IndexFile entries (default: from the root's IndexFiles' size)",
    )
    rb.set_defaults(handler=_run_rebuild)
    lag = sub.add_parser("lag-report", help="consumer lag per group, topic and queue")
    lag.add_argument("-g", "--group", action="append", required=True, help="a consumer group")
    lag.add_argument(
        "--endpoint",
        "--etcd",
        dest="etcd",
        help="etcd host:port (default: env BASALT_ETCD, else the nearest local cluster)",
    )
    lag.add_argument("-t", "--topic", help="only this topic")
    lag.add_argument(
        "--out",
        type=Path,
        help="append the rows to DIR/lag.csv and draw its whole history as DIR/lag.png",
    )
    lag.set_defaults(handler=_run_lag)


def _session(args: argparse.Namespace) -> SparkSession:
    return start_session(args.master)


def _run_export(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        commitlog_files(args.root)  # a bad root fails before Spark starts
        if Path(args.out).exists():
            err.write(f"basalt pipeline export: error: {args.out} exists\n")
            return EXIT_USAGE
        result = export(
            _session(args), args.root, args.out, topic=args.topic,
            from_ms=args.from_time, to_ms=args.to_time, broker=args.broker,
        )  # fmt: skip
    except StoreRootError as e:
        err.write(f"basalt pipeline export: error: {e}\n")
        return EXIT_USAGE
    out.write(result.summary() + "\n")
    return EXIT_OK if result.ok else EXIT_PROBLEM


def _run_verify(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        store_layout(args.root)
        result = verify(_session(args), args.root)
    except StoreRootError as e:
        err.write(f"basalt pipeline verify: error: {e}\n")
        return EXIT_USAGE
    for row in result.report.collect():
        out.write(" ".join(f"{k}={v}" for k, v in row.asDict().items()) + "\n")
    for row in result.units_report.where("bad_units > 0").collect():
        out.write(" ".join(f"{k}={v}" for k, v in row.asDict().items()) + "\n")
    out.write(result.summary() + "\n")
    return EXIT_OK if result.ok else EXIT_PROBLEM


def _run_rebuild(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    try:
        store_layout(args.root)
        result = rebuild_index(
            _session(args), args.root, args.out,
            max_hash_slot_num=args.max_hash_slot_num, max_index_num=args.max_index_num,
        )  # fmt: skip
    except (StoreRootError, ValueError) as e:
        err.write(f"basalt pipeline rebuild-index: error: {e}\n")
        return EXIT_USAGE
    out.write(result.summary() + "\n")
    return EXIT_OK if result.ok else EXIT_PROBLEM


def _run_lag(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from basalt.admin.errors import AdminError
    from basalt.admin.verbs import format_table
    from basalt.common.local_cluster import ClusterNotFoundError, discover
    from basalt.services.meta import MetaError

    try:
        etcd = discover("etcd", flag="--endpoint", given=args.etcd, env="BASALT_ETCD")
        rows = lag_report(etcd, args.group, args.topic)
    except ClusterNotFoundError as e:
        err.write(f"basalt pipeline lag-report: {e}\n")
        return EXIT_USAGE
    except (AdminError, MetaError) as e:
        err.write(f"basalt pipeline lag-report: {e}\n")
        return EXIT_PROBLEM
    table = [
        [r.group, r.topic, r.broker, r.queue_id, r.broker_offset, r.consumer_offset, r.lag]
        for r in rows
    ]
    out.write(format_table(LAG_HEADER[1:], table))
    if args.out is not None:
        append_csv(args.out / "lag.csv", rows)
        write_chart(args.out / "lag.csv", args.out / "lag.png")
        out.write(
            f"appended {len(rows)} rows to {args.out / 'lag.csv'}; "
            f"the chart of every snapshot so far: {args.out / 'lag.png'}\n"
        )
    return EXIT_OK
