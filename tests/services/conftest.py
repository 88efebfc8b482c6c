"""Fixtures for the services tests: real etcd processes on free loopback ports.

``etcd`` is one etcd shared by the whole session (tests isolate themselves by
cluster name, so every test gets its own ``/basalt/<cluster>/`` prefix);
``private_etcd`` is a fresh one per test, for tests that stop or kill it.
Async test bodies run under :func:`async_test` (no pytest-asyncio).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from basalt.services.cluster.etcd import EtcdProcess
from basalt.services.meta import MetaConfig

#: No async test may run longer than this (pytest-timeout is the outer net).
ASYNC_TEST_TIMEOUT_S = 45.0


def async_test(
    fn: Callable[..., Coroutine[Any, Any, None]],
) -> Callable[..., None]:
    """Run an ``async def`` test on a fresh event loop; fixtures pass through."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(asyncio.wait_for(fn(*args, **kwargs), ASYNC_TEST_TIMEOUT_S))

    return wrapper


def start_etcd(root: Path) -> EtcdProcess:
    # No fsync: the tests check behaviour, not durability, and CI disks are slow.
    proc = EtcdProcess(root / "data", unsafe_no_fsync=True)
    proc.start()
    return proc


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


def unique_cluster() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def meta_config(etcd: EtcdProcess) -> MetaConfig:
    """A config on the shared etcd with a cluster name of its own."""
    return MetaConfig(endpoints=(etcd.endpoint,), cluster=unique_cluster(), op_timeout_s=2.0)
