"""A Spark batch source over one store root's CommitLog: a root read into a DataFrame.

``basalt pipeline export`` reads the same way (:func:`export_batches`) but
writes its Parquet in the tasks (:func:`basalt.pipeline.jobs.export`); this
source is for reading a root into Spark.

Spark's Python Data Source API (no pandas, no JVM code): one input partition
per CommitLog file, each read by :func:`basalt.pipeline._store_read.export_batches`
as Arrow batches of the source schema. Registered under
:data:`FORMAT`; the options are strings:

- ``root`` (required): the store root;
- ``broker``: the ``broker`` column (default: the root directory's name);
- ``topic``: only this topic's records;
- ``fromMs`` / ``toMs``: store time in ``[fromMs, toMs)``.

Bad records (CRC, framing) are not rows: :func:`source_class` makes a source
that adds each file's count and first bad record to Spark accumulators the
driver reads after the job.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from basalt.pipeline._store_read import (
    SCHEMA_DDL,
    FileScan,
    FileSpec,
    commitlog_files,
    export_batches,
)

__all__ = ["FORMAT", "source_class"]

#: The format name (the topics' source is ``basalt``; this reads a root on disk).
FORMAT = "basalt-store-root"


class _FilePartition(InputPartition):  # type: ignore[misc]
    def __init__(self, spec: FileSpec) -> None:
        super().__init__(spec)
        self.spec = spec


def source_class(bad_count: Any = None, bad_first: Any = None) -> type[DataSource]:
    """The data source class, adding bad records to these accumulators (when given)."""

    class _Reader(DataSourceReader):  # type: ignore[misc]
        def __init__(self, options: Mapping[str, str]) -> None:  # case-insensitive keys
            if "root" not in options:
                raise ValueError(f"format({FORMAT!r}) needs the option 'root'")
            self.root = Path(options["root"])
            self.files = commitlog_files(self.root)  # a bad root fails here, in the driver
            self.broker = options.get("broker") or self.root.resolve().name
            self.topic = options.get("topic")
            self.from_ms = int(options["fromMs"]) if options.get("fromMs") else None
            self.to_ms = int(options["toMs"]) if options.get("toMs") else None

        def partitions(self) -> list[InputPartition]:
            return [_FilePartition(f) for f in self.files]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            assert isinstance(partition, _FilePartition)  # partitions() makes only these
            scan = FileScan()
            yield from export_batches(
                partition.spec, scan, broker=self.broker, topic=self.topic,
                from_ms=self.from_ms, to_ms=self.to_ms,
            )  # fmt: skip
            if bad_count is not None:
                bad_count.add(scan.bad_records)
            if bad_first is not None and scan.first_bad_offset is not None:
                bad_first.add([(scan.first_bad_offset, scan.first_bad_reason or "")])

    class StoreRootSource(DataSource):  # type: ignore[misc]
        """``spark.read.format("basalt-store-root").option("root", R).load()``."""

        @classmethod
        def name(cls) -> str:
            return FORMAT

        def schema(self) -> str:
            return SCHEMA_DDL

        def reader(self, schema: Any) -> DataSourceReader:
            return _Reader(self.options)

    return StoreRootSource
