"""What the store-node's servicer asks its broker group before and after a send.

The servicer knows nothing of etcd or the replication stream: it holds a
:class:`WriteGate` (a :class:`~basalt.services.store_node.ha.role.GroupMember`
for a member of a broker group; none for a store-node without etcd) and asks it
two things (docs/replication.md):

- before a send, pop or ack, :meth:`WriteGate.check_master` /
  :meth:`WriteGate.check_writable` raise the refusal that applies (NOT_MASTER
  naming the master; SERVICE_NOT_AVAILABLE for a master whose lease is not
  renewed; IN_SYNC_REPLICAS_NOT_ENOUGH);
- after the store has appended a send, :meth:`WriteGate.confirm_then` hands the
  result on once the in-sync set has it (SYNC), at once (ASYNC, or a group of
  one), or as FLUSH_SLAVE_TIMEOUT when the set does not ack in time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from basalt.store.put_result import PutMessageResult


class WriteGate(Protocol):
    def check_master(self) -> None:
        """Raise NOT_MASTER (a Refusal) unless this member is the group's master."""

    def check_writable(self) -> None:
        """:meth:`check_master`, then the refusals of a master that may not
        acknowledge now (lease not renewed; in-sync set too small)."""

    def confirm_then(
        self, result: PutMessageResult, settle: Callable[[PutMessageResult], None]
    ) -> None:
        """Call ``settle`` (on the loop; it must not raise) with ``result`` once the
        send's bytes are where the ack mode requires, or with its status
        FLUSH_SLAVE_TIMEOUT when they are not in time. A refused ``result`` is
        settled at once."""
