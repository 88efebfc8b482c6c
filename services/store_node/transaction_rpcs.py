"""EndTransaction and WatchTransactionChecks: transactional messages (docs/transactions.md).

SCAFFOLD (issue 30 in progress): the helper that owns this module replaces
these bodies; nothing here is shipped as done.

A mixin of :class:`basalt.services.store_node.service.StoreNodeServicer`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from basalt.v1 import store_node_pb2 as sn


class TransactionRpcs:
    """See the module docstring."""

    async def EndTransaction(
        self, request: sn.EndTransactionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.EndTransactionResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "EndTransaction: issue 30 in progress")

    async def WatchTransactionChecks(  # type: ignore[override]
        self, request: sn.WatchTransactionChecksRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[sn.TransactionCheck]:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "WatchTransactionChecks: issue 30 in progress"
        )
        yield sn.TransactionCheck()  # type: ignore[unreachable]
