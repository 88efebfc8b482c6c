"""Basalt's gRPC services: thin adapters from RPCs and etcd to :mod:`basalt.store`."""
