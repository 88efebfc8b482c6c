"""A service process's telemetry flags: ``--metrics-port`` serves Prometheus text
(the process metrics among it), ``--log-format json`` makes every line one
JSON object; and a CLI command is one traced root span."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.support.polling import eventually_sync
from tests.support.processes import REPO_ROOT, ServiceProcess
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S


def metrics_url(log: Path) -> str | None:
    """The endpoint the process logged (``metrics on URL``), None before it did."""
    for line in log.read_text().splitlines():
        found = re.search(r"metrics on (http://\S+)", json.loads(line)["message"])
        if found:
            return found.group(1)
    return None


def test_a_store_node_on_metrics_port_0_serves_its_process_metrics_and_logs_json(
    tmp_path: Path, processes: list[ServiceProcess]
) -> None:
    log = tmp_path / "broker-t.log"
    node = ServiceProcess(
        log,
        "basalt.services.store_node.main",
        "--name", "broker-t",
        "--data-dir", str(tmp_path / "broker-t"),
        "--metrics-port", "0",
        "--log-format", "json",
    )  # fmt: skip
    processes.append(node)
    node.wait_serving()
    eventually_sync(lambda: metrics_url(log) is not None, what="the metrics endpoint logged")
    url = metrics_url(log)
    assert url is not None and re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url)
    with urllib.request.urlopen(url, timeout=5) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    for name in (
        "process_cpu_time_seconds_total",
        "process_memory_usage_bytes",
        "process_open_file_descriptor_count",
    ):
        assert re.search(rf"^{name}\{{.*\}} \S+$", text, re.MULTILINE), name
    assert 'service_name="basalt-store-node"' in text
    assert 'service_instance_id="broker-t"' in text
    assert node.stop() == 0
    lines = log.read_text().splitlines()
    assert lines and all(json.loads(line)["logger"] for line in lines)


def test_a_cli_command_is_one_root_span_named_after_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_TRACES_EXPORTER"] = "console"  # spans as JSON on stderr
    done = subprocess.run(
        [sys.executable, "-m", "basalt.admin", "store", "check", str(tmp_path / "none")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    assert '"name": "basalt store check"' in done.stderr, done.stderr
    assert '"service.name": "basalt-cli"' in done.stderr
    assert '"parent_id": null' in done.stderr
