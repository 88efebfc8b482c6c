"""The admin verbs' tests run against real etcd, store-nodes and pull-services:
the services' fixtures serve here too."""

from tests.services.conftest import etcd, meta_config, private_etcd

__all__ = ["etcd", "meta_config", "private_etcd"]
