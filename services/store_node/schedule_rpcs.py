"""RecallMessage and GetScheduleStatus: the store-node's timer RPCs (docs/timers.md).

SCAFFOLD (issue 30 in progress): the helper that owns this module replaces
these bodies; nothing here is shipped as done.

A mixin of :class:`basalt.services.store_node.service.StoreNodeServicer`.
"""

from __future__ import annotations

from typing import Any

import grpc

from basalt.v1 import store_node_pb2 as sn


class ScheduleRpcs:
    """See the module docstring."""

    async def RecallMessage(
        self, request: sn.RecallMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.RecallMessageResponse:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "RecallMessage: issue 30 in progress")

    async def GetScheduleStatus(
        self, request: sn.GetScheduleStatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> sn.GetScheduleStatusResponse:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, "GetScheduleStatus: issue 30 in progress"
        )
