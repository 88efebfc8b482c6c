"""A whole Basalt cluster on loopback: ``basalt cluster up | down | status`` and its etcd."""
