"""Prometheus, the real one (Debian's ``prometheus`` package, which
``scripts/test.sh`` installs), scraping a ``basalt cluster up`` cluster; and
the Prometheus text format and PromQL, read as far as the tests need.

:func:`scrape_config` turns ``basalt cluster status --json``'s rows into a
``prometheus.yml`` (docs/observability.md shows the same);
:func:`prometheus` runs the server on a free loopback port for a block and
:meth:`Prometheus.query` asks its HTTP API (``/api/v1/query``).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from basalt.services.cluster.etcd import free_port
from tests.support.polling import eventually_sync
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S


def scrape_config(
    rows: Iterable[Mapping[str, Any]],
    interval_s: float = 1.0,
    *,
    tls: Mapping[str, str] | None = None,
) -> str:
    """A ``prometheus.yml`` scraping every process of ``rows`` (``cluster status
    --json``) that has a metrics endpoint: one job per role, the process's name
    as the ``instance`` label; over https with ``tls`` as each job's
    ``tls_config`` (``ca_file``, ``cert_file``, ``key_file``) when given. JSON
    is YAML, so it is written as JSON."""
    jobs: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("metrics"):
            url = urllib.parse.urlsplit(row["metrics"])
            jobs.setdefault(row["role"], []).append(
                {"targets": [url.netloc], "labels": {"instance": row["name"]}}
            )
    return json.dumps(
        {
            "global": {"scrape_interval": f"{interval_s:g}s"},
            "scrape_configs": [
                {"job_name": role, "metrics_path": "/metrics", "static_configs": targets}
                | ({} if tls is None else {"scheme": "https", "tls_config": dict(tls)})
                for role, targets in jobs.items()
            ],
        },
        indent=2,
    )


class Prometheus:
    """A running ``prometheus`` on ``127.0.0.1:port``."""

    def __init__(self, port: int) -> None:
        self.port = port

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """The instant vector ``promql`` evaluates to now: (labels, value) per
        series. Raises AssertionError when the API answers an error."""
        with urllib.request.urlopen(
            f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}", timeout=5
        ) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return [(r["metric"], float(r["value"][1])) for r in body["data"]["result"]]

    def value(self, promql: str) -> float | None:
        """The value of a one-series answer; None when it has no series."""
        result = self.query(promql)
        assert len(result) <= 1, result
        return result[0][1] if result else None

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False


@contextlib.contextmanager
def prometheus(config: str, root: Path) -> Iterator[Prometheus]:
    """``prometheus`` with ``config`` (prometheus.yml's text), its data and log
    under ``root``, once it says it is ready; stopped (SIGTERM, then waited
    for) at the block's end."""
    binary = shutil.which("prometheus")
    assert binary is not None, "prometheus is not installed (scripts/test.sh installs it)"
    root.mkdir(parents=True, exist_ok=True)
    (root / "prometheus.yml").write_text(config)
    server = Prometheus(free_port())
    with (root / "prometheus.log").open("wb") as log:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={root / 'prometheus.yml'}",
                f"--storage.tsdb.path={root / 'data'}",
                f"--web.listen-address=127.0.0.1:{server.port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:

        def ready() -> bool:
            assert proc.poll() is None, (root / "prometheus.log").read_text()
            return server.ready()

        eventually_sync(ready, timeout_s=60, what="prometheus ready")
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(SUBPROCESS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- the text format and PromQL ------------------------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{|\s)")


def exposed_names(text: str) -> set[str]:
    """The name of every sample in Prometheus text (``_bucket``, ``_sum``,
    ``_count``, ``_total`` as exposed), comments left out."""
    return {m.group(1) for line in text.splitlines() if (m := _SAMPLE.match(line))}


#: PromQL words that look like names: keywords, and what aggregations group by.
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless"}
    | {"offset", "bool", "inf", "nan"}
)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^}]*\}")
_GROUPINGS = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_RANGES = re.compile(r"\[[^\]]*\]")
_VARIABLES = re.compile(r"\$\{?\w+\}?")
_NAME = re.compile(r"(?<![\w.])([a-zA-Z_:][a-zA-Z0-9_:]*)\b(?!\s*\()")


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads: what is left once strings,
    label matchers, ``by (...)``-style groupings, range and subquery brackets,
    Grafana's ``$variables``, function calls and keywords are taken out."""
    for pattern in (_STRINGS, _MATCHERS, _GROUPINGS, _RANGES, _VARIABLES):
        expr = pattern.sub(" ", expr)
    return {n for n in _NAME.findall(expr) if n.lower() not in _KEYWORDS}


def histogram_base(name: str) -> str:
    """A histogram series' metric name: ``x_bucket``, ``x_sum``, ``x_count`` -> ``x``."""
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            return name.removesuffix(suffix)
    return name
