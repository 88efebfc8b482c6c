"""Real etcd processes on free loopback ports, and cluster names to share them by.

``etcd`` is one etcd shared by the whole session (tests isolate themselves by
cluster name, so every test gets its own ``/basalt/<cluster>/`` prefix);
``private_etcd`` is a fresh one per test, for tests that stop, freeze or kill
it; ``meta_config`` is a MetaClient config on the shared one with a cluster of
its own. The fixtures are registered by ``tests/conftest.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from basalt.services.cluster.etcd import EtcdProcess
from basalt.services.meta import MetaConfig


def start_etcd(root: Path) -> EtcdProcess:
    """An etcd on free ports with its data under ``root``, started."""
    # No fsync: the tests check behaviour, not durability, and CI disks are slow.
    proc = EtcdProcess(root / "data", unsafe_no_fsync=True)
    proc.start()
    return proc


def unique_cluster() -> str:
    """A cluster name no other test uses: its keys are its own on a shared etcd."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdProcess]:
    proc = start_etcd(tmp_path_factory.mktemp("etcd"))
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def private_etcd(tmp_path: Path) -> Iterator[EtcdProcess]:
    proc = start_etcd(tmp_path / "etcd")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def meta_config(etcd: EtcdProcess) -> MetaConfig:
    """A config on the shared etcd with a cluster name of its own."""
    return MetaConfig(endpoints=(etcd.endpoint,), cluster=unique_cluster(), op_timeout_s=2.0)
