"""``PullMessage``: RocketMQ 5's offset-based pull through the v2 front (a
mixin of the servicer).

One ``GetMessage`` on the store-node of the queue the request names (its
broker and queue id; in a store-node's front, its own in-process), at the
request's offset, at most ``batch_size`` (<= 32) messages, the filter applied
on the store-node, held up to the long-polling time within the client's
deadline; no pop state and no commit (``UpdateOffset`` commits).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from basalt.common.record import CorruptRecordError, DamagedRecord, decode_records
from basalt.rocketmq.v2 import definition_pb2 as v2
from basalt.rocketmq.v2 import service_pb2 as sv
from basalt.services.errors import Refusal, pull_outcome
from basalt.services.pull_service.metrics import damaged_records
from basalt.services.rocketmq_v2.consume import MAX_BATCH, poll_ms_of, subscription_of
from basalt.services.rocketmq_v2.conversions import V2Error, group_name, ok_status, to_v2_message
from basalt.services.rocketmq_v2.store_calls import StoreCalls
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn


class PullRpcs(StoreCalls):
    """PullMessage (module docstring)."""

    async def PullMessage(
        self, request: sv.PullMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[sv.PullMessageResponse]:
        """RocketMQ 5's offset-based pull: one GetMessage on the store-node of the
        queue the request names (long polling within the client's deadline), no
        pop state and no commit (UpdateOffset commits). Answers, as RocketMQ 5's
        proxy does: a status (OK with messages, MESSAGE_NOT_FOUND when nothing
        new or nothing matched, ILLEGAL_OFFSET when the offset is outside the
        queue), the messages, then the next offset to pull from."""
        try:
            read, topic = await self._pull(request, context)
            code, _ = pull_outcome(read.status, request.offset)
            damaged: list[DamagedRecord] = []
            records = decode_records(read.records.data, damaged=damaged)
            damaged_records("PullMessage", request.message_queue.broker.name, damaged)
        except V2Error as e:
            yield sv.PullMessageResponse(status=e.status())
            return
        except Refusal as e:
            yield sv.PullMessageResponse(
                status=V2Error(v2.INTERNAL_SERVER_ERROR, e.message).status()
            )
            return
        except CorruptRecordError as e:
            yield sv.PullMessageResponse(
                status=V2Error(
                    v2.INTERNAL_SERVER_ERROR, f"stored record does not decode: {e}"
                ).status()
            )
            return
        if code == pb.RESPONSE_CODE_SUCCESS:
            yield sv.PullMessageResponse(status=ok_status())
            for record in records:
                yield sv.PullMessageResponse(
                    message=to_v2_message(
                        record,
                        namespace=topic.resource_namespace,
                        queue_id=request.message_queue.id,
                        delivery_attempt=1,
                        receipt_handle="",
                        invisible_ms=0,
                    )
                )
        elif code == pb.RESPONSE_CODE_PULL_OFFSET_MOVED:
            yield sv.PullMessageResponse(
                status=V2Error(
                    v2.ILLEGAL_OFFSET,
                    f"offset {request.offset} is outside the queue "
                    f"[{read.min_offset}, {read.max_offset}]",
                ).status()
            )
        else:
            status = v2.Status(code=v2.MESSAGE_NOT_FOUND, message="no new message")
            yield sv.PullMessageResponse(status=status)
        yield sv.PullMessageResponse(next_offset=read.next_begin_offset)

    async def _pull(
        self, request: sv.PullMessageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[sn.GetMessageResponse, v2.Resource]:
        """The checked request's GetMessage answer and the topic it named;
        V2Error for a refusal."""
        group = group_name(request.group)
        if request.offset < 0:
            raise V2Error(v2.ILLEGAL_OFFSET, f"offset {request.offset} < 0")
        if request.batch_size < 1:
            raise V2Error(v2.BAD_REQUEST, f"batch_size {request.batch_size} < 1")
        poll_ms = poll_ms_of(request, context)
        subscription = subscription_of(request.filter_expression)
        read: sn.GetMessageResponse = await self._on_store_node(
            request.message_queue,
            "GetMessage",
            lambda t, q: sn.GetMessageRequest(
                group=group,
                topic=t,
                queue_id=q,
                offset=request.offset,
                max_msg_nums=min(request.batch_size, MAX_BATCH),
                subscription=subscription,
                suspend_timeout_ms=poll_ms,
            ),
            context,
            poll_ms / 1000,
        )
        return read, request.message_queue.topic
