"""ConsumerSendMsgBack: consumer retries and dead letters (docs/retry.md).

SCAFFOLD (issue 30 in progress): the helper that owns this module replaces
these bodies; nothing here is shipped as done.

A mixin of :class:`basalt.services.store_node.service.StoreNodeServicer`.
"""

from __future__ import annotations

from typing import Any

import grpc

from basalt.v1 import store_node_pb2 as sn


class RetryRpcs:
    """See the module docstring."""

    async def ConsumerSendMsgBack(
        self, request: sn.ConsumerSendMsgBackRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.ConsumerSendMsgBackResponse:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "ConsumerSendMsgBack: issue 30 in progress"
        )
