"""The data pipeline on Spark: ``basalt.pipeline``.

Basalt's topics as a Spark source and sink through PySpark 4's Python Data
Source API (``spark.read.format("basalt")``, ``readStream``, ``write``,
``writeStream``), and jobs over store roots on disk (``basalt pipeline
<job>``). Needs the ``spark`` extra: ``pip install 'basalt[spark]'``
(PySpark and pyarrow; a local Java 17 runs ``local[N]``). docs/pipeline.md
says how to use it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the ``basalt`` format with ``spark`` (a SparkSession), for
    ``spark.read.format("basalt")`` and ``spark.readStream.format("basalt")``.

    Imports PySpark only when called, so ``import basalt.pipeline`` works
    without the ``spark`` extra."""
    from basalt.pipeline.source import BasaltDataSource

    spark.dataSource.register(BasaltDataSource)
