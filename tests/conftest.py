"""The fixtures every test may use; each is defined in :mod:`tests.support`."""

from tests.support.etcd import etcd, meta_config, private_etcd
from tests.support.processes import processes
from tests.support.stores import clock, make_config, store
from tests.support.telemetry import spans

__all__ = [
    "clock",
    "etcd",
    "make_config",
    "meta_config",
    "private_etcd",
    "processes",
    "spans",
    "store",
]
