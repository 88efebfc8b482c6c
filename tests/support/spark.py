"""One local Spark session for a test module: ``local[2]``, no UI, loopback only.

PySpark starts a JVM (a local Java 17) and Python workers; the workers must
run this venv's interpreter (``PYSPARK_PYTHON``), which has Basalt and
pyarrow. Starting a session costs seconds: a module shares one, and
:func:`spark_session` stops it at the module's end.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def start_spark(warehouse: Path, *, app: str = "basalt-tests") -> Any:
    """A new local SparkSession (``local[2]``, 2 shuffle partitions, UI off,
    bound to 127.0.0.1) whose Python workers run this interpreter."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    return (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.warehouse.dir", str(warehouse))
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )


@pytest.fixture(scope="module")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A local SparkSession for the module (see :func:`start_spark`)."""
    session = start_spark(tmp_path_factory.mktemp("spark-warehouse"))
    try:
        yield session
    finally:
        session.stop()
