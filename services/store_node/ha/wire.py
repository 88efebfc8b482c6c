"""Epoch entries between the store's :class:`~basalt.store.epoch_file.EpochEntry`
and replication.proto's ``EpochEntry``: the hello and the handshake carry a
member's whole epoch file."""

from __future__ import annotations

from collections.abc import Iterable

from basalt.store.epoch_file import EpochEntry
from basalt.v1 import replication_pb2 as rpb


def entries_to_pb(entries: Iterable[EpochEntry]) -> list[rpb.EpochEntry]:
    """The store's entries, oldest first, as the wire carries them."""
    return [
        rpb.EpochEntry(epoch=e.epoch, start_offset=e.start_offset, end_offset=e.end_offset)
        for e in entries
    ]


def entries_from_pb(entries: Iterable[rpb.EpochEntry]) -> list[EpochEntry]:
    """The wire's entries as the store's, for ``find_consistent_point``."""
    return [EpochEntry(e.epoch, e.start_offset, e.end_offset) for e in entries]
