"""common.local_cluster: the state file ``basalt cluster up`` writes and the tools read,
and how a CLI command finds an address and the credentials it signs with."""

from __future__ import annotations

from pathlib import Path

import pytest

from basalt.common.auth import CREDENTIALS_ENV, Credentials
from basalt.common.local_cluster import (
    CLUSTER_FILE,
    LOCAL_CREDENTIALS,
    ClusterNotFoundError,
    ProcessInfo,
    discover,
    discover_credentials,
    find_data_dir,
    load_processes,
    local_address,
    write_processes,
)

PROCESSES = [
    ProcessInfo("etcd", "etcd", 101, "127.0.0.1:2379", "logs/etcd.log"),
    ProcessInfo(
        "store-node", "broker-a", 102, "127.0.0.1:40001", "logs/broker-a.log", "127.0.0.1:40101"
    ),
    ProcessInfo("store-node", "broker-b", 103, "127.0.0.1:40002", "logs/broker-b.log"),
    ProcessInfo("pull-service", "pull-service-1", 104, "127.0.0.1:40003", "logs/ps.log"),
]


def test_the_state_file_round_trips(tmp_path: Path) -> None:
    write_processes(tmp_path / CLUSTER_FILE, PROCESSES)
    assert load_processes(tmp_path / CLUSTER_FILE) == PROCESSES


def test_local_address_is_the_first_process_of_a_role(tmp_path: Path) -> None:
    write_processes(tmp_path / CLUSTER_FILE, PROCESSES)
    assert local_address("store-node", tmp_path) == "127.0.0.1:40001"
    assert local_address("pull-service", tmp_path) == "127.0.0.1:40003"
    assert local_address("admin", tmp_path) is None


def test_no_cluster_or_an_unreadable_file_is_no_address(tmp_path: Path) -> None:
    assert local_address("etcd", tmp_path) is None
    for content in ("not json", '[{"role": "etcd"}]', "[1, 2]"):
        (tmp_path / CLUSTER_FILE).write_text(content)
        assert local_address("etcd", tmp_path) is None


def test_a_file_written_before_metrics_endpoints_reads_back_without_one(tmp_path: Path) -> None:
    state = tmp_path / CLUSTER_FILE
    state.write_text(
        '[{"role": "store-node", "name": "broker-a", "pid": 102,'
        ' "address": "127.0.0.1:40001", "log": "logs/broker-a.log"}]'
    )
    (old,) = load_processes(state)
    assert old.metrics is None and old.metrics_url is None
    assert PROCESSES[1].metrics_url == "http://127.0.0.1:40101/metrics"


def test_discover_takes_the_flag_then_the_environment_then_basalt_upward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / ".basalt").mkdir()
    write_processes(tmp_path / ".basalt" / CLUSTER_FILE, PROCESSES)
    deep = tmp_path / "src" / "app"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    monkeypatch.delenv("BASALT_ETCD", raising=False)
    assert find_data_dir() == (tmp_path / ".basalt").resolve()
    assert discover("etcd", flag="--etcd", given=None, env="BASALT_ETCD") == "127.0.0.1:2379"
    monkeypatch.setenv("BASALT_ETCD", "10.0.0.1:2379,10.0.0.2:2379")
    assert discover("etcd", flag="--etcd", given=None, env="BASALT_ETCD") == (
        "10.0.0.1:2379,10.0.0.2:2379"
    )
    assert discover("etcd", flag="--etcd", given="h:1", env="BASALT_ETCD") == "h:1"


def test_discover_finding_nothing_names_the_flag_the_variable_and_basalt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BASALT_ENDPOINTS", raising=False)
    with pytest.raises(ClusterNotFoundError) as caught:
        discover("pull-service", flag="--endpoints", given=None, env="BASALT_ENDPOINTS")
    message = str(caught.value)
    assert "--endpoints" in message and "BASALT_ENDPOINTS" in message and ".basalt" in message
    # A .basalt of a stopped cluster (no cluster.json) is named as such.
    (tmp_path / ".basalt").mkdir()
    with pytest.raises(ClusterNotFoundError, match="has no running pull-service"):
        discover("pull-service", flag="--endpoints", given=None, env="BASALT_ENDPOINTS")


def test_discover_credentials_takes_the_flag_then_the_environment_then_basalt_upward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    deep = tmp_path / "src" / "app"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    monkeypatch.delenv(CREDENTIALS_ENV, raising=False)
    assert discover_credentials(None) is None  # nothing anywhere: calls go unsigned
    (tmp_path / ".basalt").mkdir()
    assert discover_credentials(None) is None  # a cluster without auth
    admin = Credentials("admin", "admin-secret")
    admin.to_file(tmp_path / ".basalt" / LOCAL_CREDENTIALS)
    assert discover_credentials(None) == admin
    alice = Credentials("alice", "alice-secret")
    alice.to_file(tmp_path / "alice.json")
    monkeypatch.setenv(CREDENTIALS_ENV, str(tmp_path / "alice.json"))
    assert discover_credentials(None) == alice
    bob = Credentials("bob", "bob-secret")
    bob.to_file(tmp_path / "bob.json")
    assert discover_credentials(str(tmp_path / "bob.json")) == bob
    with pytest.raises(OSError):
        discover_credentials(str(tmp_path / "missing.json"))
