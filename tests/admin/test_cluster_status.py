"""``basalt cluster up`` gives every service a metrics endpoint; ``cluster status
--json`` lists every process's endpoints for scripts, and ``cluster status``
shows them under a header. Real processes."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from tests.support.processes import run_basalt_sync

pytestmark = pytest.mark.slow


def test_up_assigns_metrics_ports_that_answer_and_status_json_lists_every_endpoint(
    tmp_path: Path,
) -> None:
    data = tmp_path / "cluster"
    started = run_basalt_sync(
        "cluster", "up", "--data-dir", str(data), "--store-nodes", "1", "--replicas", "2"
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        status = run_basalt_sync("cluster", "status", "--data-dir", str(data), "--json")
        assert status.returncode == 0, status.stdout + status.stderr
        rows = json.loads(status.stdout)
        assert [r["role"] for r in rows] == [
            "etcd", "store-node", "store-node", "pull-service", "admin",
        ]  # fmt: skip
        assert all(r["alive"] and r["health"] == "SERVING" for r in rows)
        # Each member of broker-a with its group, id and role in the group.
        members = [r for r in rows if r["role"] == "store-node"]
        assert [(r["name"], r["group"], r["broker_id"]) for r in members] == [
            ("broker-a-0", "broker-a", 0),
            ("broker-a-1", "broker-a", 1),
        ]
        assert sorted(r["group_role"] for r in members) == ["MASTER", "SLAVE"]
        assert [r["registered"] for r in rows] == [None, True, True, True, None]
        etcd, *services = rows
        assert etcd["metrics"] is None
        for r in services:
            assert r["metrics"] in started.stdout  # printed beside its address by `up`
            with urllib.request.urlopen(r["metrics"], timeout=5) as answer:
                text = answer.read().decode()
            assert "process_cpu_time_seconds_total" in text, r["name"]
            assert f'service_instance_id="{r["name"]}"' in text or r["role"] == "admin"
        text_status = run_basalt_sync("cluster", "status", "--data-dir", str(data))
        assert all(r["metrics"] in text_status.stdout for r in services)
        # A header line, then a line per process, each value under its column:
        # the RocketMQ 5 endpoint --json lists for the pull-service among them.
        header, *lines = text_status.stdout.splitlines()
        assert header.split() == [
            "ROLE", "NAME", "ADDRESS", "ROCKETMQ", "5", "PID", "PROCESS", "HEALTH", "ETCD",
            "METRICS",
        ]  # fmt: skip
        assert len(lines) == len(rows)
        for line, r in zip(lines, rows, strict=True):
            at = {c: line[header.index(c) :].split()[0] for c in ("NAME", "ROCKETMQ 5", "ETCD")}
            assert at["NAME"] == r["name"]
            assert at["ROCKETMQ 5"] == (r["rocketmq_v2"] or "-")
            assert at["ETCD"] == (
                r["group_role"]
                if r["role"] == "store-node"
                else {None: "-", True: "registered"}[r["registered"]]
            )
        (pull,) = [r for r in rows if r["role"] == "pull-service"]
        assert pull["rocketmq_v2"] and pull["rocketmq_v2"] in started.stdout
    finally:
        stopped = run_basalt_sync("cluster", "down", "--data-dir", str(data))
    assert stopped.returncode == 0, stopped.stdout
    gone = run_basalt_sync("cluster", "status", "--data-dir", str(data), "--json")
    assert (gone.returncode, json.loads(gone.stdout)) == (1, [])
