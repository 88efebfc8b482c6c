"""The ``Replication`` service a store-node registers on its gRPC server: a thin
door to the node's current :class:`ReplicationMaster` (replication.proto).

The integrator points it at the master of the current term
(:meth:`ReplicationServicer.serve_as`) when the node becomes master, and at
None (with who the master is, when known) when it stops being one. Without a
master, every stream is refused NOT_MASTER (FAILED_PRECONDITION), the message
naming the known master so the slave's operator can tell.
"""

from __future__ import annotations

from typing import Any

import grpc

from basalt.services.rpc import rpc_method
from basalt.services.store_node.ha.master import ReplicationMaster
from basalt.services.store_node.ha.refusals import not_master
from basalt.v1 import replication_pb2_grpc as rpb_grpc


class ReplicationServicer(rpb_grpc.ReplicationServicer):
    """``Replication.Replicate``, served by the current master; see the module
    docstring. ``node`` names this store-node in refusals (e.g. "broker-a/2")."""

    def __init__(self, node: str) -> None:
        self.node = node
        self._master: ReplicationMaster | None = None
        self._known_master: str | None = None

    @property
    def master(self) -> ReplicationMaster | None:
        return self._master

    def serve_as(self, master: ReplicationMaster | None, known_master: str | None = None) -> None:
        """Serve streams with ``master`` from now on (None: refuse them, naming
        ``known_master``, e.g. "2 at 10.0.0.7:9876", when given). Streams open
        on a previous master end when that master closes."""
        self._master = master
        self._known_master = None if master is not None else known_master

    @rpc_method
    async def Replicate(  # type: ignore[override]  # gRPC method name
        self, request_iterator: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        """One slave's stream, on ``context.read()``/``context.write()``."""
        master = self._master
        if master is None:
            known = f"; the master is {self._known_master}" if self._known_master else ""
            raise not_master(f"store-node {self.node} is not the master{known}")
        await master.serve(context)
