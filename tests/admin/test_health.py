"""``basalt health ADDRESS``: a grpc.health.v1 Check against a real store-node process."""

from __future__ import annotations

import signal
from pathlib import Path

from tests.support.processes import ServiceProcess, run_basalt_sync, store_node_process


def test_health_of_a_store_node_process_serving_then_gone(
    tmp_path: Path, processes: list[ServiceProcess]
) -> None:
    node = store_node_process(tmp_path)
    processes.append(node)
    node.wait_serving()

    serving = run_basalt_sync("health", node.address)
    assert (serving.returncode, serving.stdout) == (0, "SERVING\n"), serving.stderr

    # A service name the server does not know: its answer, not a crash, and exit 1.
    unknown = run_basalt_sync("health", node.address, "--service", "no.such.Service")
    assert unknown.returncode == 1
    assert unknown.stdout.startswith("UNREACHABLE: NOT_FOUND"), unknown.stdout

    assert node.stop(signal.SIGTERM) == 0
    gone = run_basalt_sync("health", node.address, "--timeout-s", "0.5")
    assert gone.returncode == 1
    assert gone.stdout.startswith("UNREACHABLE: "), gone.stdout


def test_health_rejects_a_non_positive_timeout() -> None:
    bad = run_basalt_sync("health", "127.0.0.1:1", "--timeout-s", "0")
    assert bad.returncode == 2
    assert "must be > 0" in bad.stderr
