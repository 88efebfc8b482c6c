"""A Basalt producer and consumer written as a client in any language would write
it: the generated basalt.v1 stubs and grpc, nothing of Basalt's SDK
(basalt.client) or of what the SDK and the services share (basalt.common).

    python client.py ADMIN_ADDRESS PULL_SERVICE_ADDRESS TOPIC GROUP

Creates TOPIC (Admin.UpdateTopic), finds its store-nodes (PullService.QueryRoute),
sends 6 messages to queue 0 of the first (StoreNode.SendMessage), then consumes
them through the pull-service alone: QueryOffset, PullBatch with decoded
messages and a byte cap, CommitOffset under the reset epoch; then has admin
reset the group and shows that a commit under the old epoch is refused. Prints
one JSON object of what it saw; exits non-zero on any failed step. The Node.js
client next door (../basalt-v1-node/client.js) does the same.
"""

from __future__ import annotations

import json
import sys
import time

import grpc

from basalt.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    common_pb2,
    pull_service_pb2,
    pull_service_pb2_grpc,
    store_node_pb2,
    store_node_pb2_grpc,
)

#: A byte cap between two and three of this client's records (~440 stored
#: bytes each: a 300-byte body, the header, topic and properties): every
#: PullBatch answers at most two (the cap counts stored record sizes).
MAX_BYTES = 1000


def main(admin_address: str, pull_address: str, topic: str, group: str) -> dict[str, object]:
    admin = admin_pb2_grpc.AdminStub(grpc.insecure_channel(admin_address))
    pull = pull_service_pb2_grpc.PullServiceStub(grpc.insecure_channel(pull_address))
    admin.UpdateTopic(
        admin_pb2.UpdateTopicRequest(
            config=common_pb2.TopicConfig(
                topic=topic, read_queue_nums=2, write_queue_nums=2, perm=common_pb2.PERM_READ_WRITE
            )
        ),
        timeout=10,
    )
    route = None
    deadline = time.monotonic() + 10
    while route is None:  # the pull-service learns of the topic from etcd, soon after
        try:
            route = pull.QueryRoute(pull_service_pb2.QueryRouteRequest(topic=topic), timeout=5)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.NOT_FOUND or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    broker = route.route.broker_datas[0]
    store = store_node_pb2_grpc.StoreNodeStub(grpc.insecure_channel(broker.address))
    sent = []
    for i in range(6):
        result = store.SendMessage(
            store_node_pb2.SendMessageRequest(
                message=common_pb2.Message(
                    topic=topic,
                    body=b"%d" % i * 300,
                    tags="even" if i % 2 == 0 else "odd",
                    keys=[f"key-{i}"],
                    properties={"n": str(i)},
                ),
                queue_id=0,
            ),
            timeout=10,
        ).result
        sent.append(result.offset_msg_ids[0])

    queues = [
        common_pb2.MessageQueue(topic=topic, broker_name=broker.broker_name, queue_id=q)
        for q in range(2)
    ]
    positions = {}
    for q in queues:
        got = pull.QueryOffset(pull_service_pb2.QueryOffsetRequest(group=group, queue=q))
        # No commit yet (-1): start at the queue's first offset.
        positions[q.queue_id] = [got.min_offset if got.offset < 0 else got.offset, got.reset_epoch]
    received, batches = [], []
    while True:
        answer = pull.PullBatch(
            pull_service_pb2.PullBatchRequest(
                group=group,
                pulls=[
                    pull_service_pb2.PullRequest(
                        queue=q, offset=positions[q.queue_id][0], max_nums=32
                    )
                    for q in queues
                ],
                decode=True,
                max_bytes=MAX_BYTES,
            ),
            timeout=10,
        )
        count = sum(len(r.messages) for r in answer.results)
        if count == 0:
            break
        batches.append(count)
        for q, result in zip(queues, answer.results, strict=True):
            for m in result.messages:
                received.append(
                    {
                        "msg_id": m.msg_id,
                        "queue_offset": m.queue_offset,
                        "tags": m.tags,
                        "keys": list(m.keys),
                        "n": m.properties["n"],
                        "body_len": len(m.body),
                    }
                )
            offset, epoch = positions[q.queue_id]
            if result.next_begin_offset != offset:
                commit = pull.CommitOffset(
                    pull_service_pb2.CommitOffsetRequest(
                        group=group, queue=q, offset=result.next_begin_offset, reset_epoch=epoch
                    )
                ).commit
                assert commit.code == common_pb2.RESPONSE_CODE_SUCCESS, commit
                positions[q.queue_id][0] = result.next_begin_offset
    committed = pull.QueryOffset(pull_service_pb2.QueryOffsetRequest(group=group, queue=queues[0]))

    # Admin resets the group to the start: the epoch moves on, and this client's
    # commit under the epoch it learned before is refused, nothing stored.
    admin.ResetOffsetByTime(
        admin_pb2.ResetOffsetByTimeRequest(group=group, topic=topic, timestamp_ms=0, force=True)
    )
    stale = pull.CommitOffset(
        pull_service_pb2.CommitOffsetRequest(
            group=group, queue=queues[0], offset=6, reset_epoch=positions[0][1]
        )
    ).commit
    after = pull.QueryOffset(pull_service_pb2.QueryOffsetRequest(group=group, queue=queues[0]))

    # The proof of the title: nothing of the SDK or of basalt.common was loaded.
    loaded = sorted(
        m
        for m in sys.modules
        if m.startswith(("basalt.client", "basalt.common", "basalt.services"))
    )
    return {
        "sent": sent,
        "received": received,
        "batches": batches,
        "committed": committed.offset,
        "stale_code": common_pb2.ResponseCode.Name(stale.code),
        "offset_after_reset": after.offset,
        "epoch_after_reset": after.reset_epoch,
        "epoch_before_reset": positions[0][1],
        "loaded": loaded,
    }


if __name__ == "__main__":
    print(json.dumps(main(*sys.argv[1:5])))
