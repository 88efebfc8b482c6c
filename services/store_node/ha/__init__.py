"""Replication within a broker group: the master's stream to its slaves, the
in-sync set, election and fencing through etcd (docs/replication.md)."""
