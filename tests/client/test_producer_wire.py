"""The producer's hand-built SendStreamRequest bytes against protobuf's own."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from basalt.client.producer import send_stream_batch, send_stream_message
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn

opaques = st.integers(min_value=0, max_value=2**64 - 1)
queue_ids = st.integers(min_value=-(2**31), max_value=2**31 - 1)
batches = st.tuples(opaques, st.text(max_size=300), queue_ids, st.binary(max_size=3000))


def batch_item(opaque: int, topic: str, queue_id: int, records: bytes) -> sn.SendStreamItem:
    return sn.SendStreamItem(
        opaque=opaque, batch=sn.SendBatchRequest(topic=topic, queue_id=queue_id, records=records)
    )


@given(opaques, st.text(max_size=300), queue_ids, st.binary(max_size=3000))
def test_a_batch_item_is_protobufs_bytes(
    opaque: int, topic: str, queue_id: int, records: bytes
) -> None:
    parts = send_stream_batch(opaque, topic, queue_id, records)
    assert parts[-1] is records  # framed around, never copied
    expected = sn.SendStreamRequest(items=[batch_item(opaque, topic, queue_id, records)])
    assert b"".join(parts) == expected.SerializeToString()


@given(st.lists(batches, max_size=5))
def test_items_back_to_back_are_one_request(items: list[tuple[int, str, int, bytes]]) -> None:
    # What _Stream writes: the queued items' pieces joined.
    wire = b"".join(b"".join(send_stream_batch(*item)) for item in items)
    expected = sn.SendStreamRequest(items=[batch_item(*item) for item in items])
    assert wire == expected.SerializeToString()
    assert sn.SendStreamRequest.FromString(wire) == expected


@given(opaques, queue_ids, st.binary(max_size=3000), st.text(max_size=50))
def test_a_message_item_is_protobufs_bytes(
    opaque: int, queue_id: int, body: bytes, tags: str
) -> None:
    request = sn.SendMessageRequest(
        message=pb.Message(topic="T", tags=tags, body=body, properties={"UNIQ_KEY": "K"}),
        queue_id=queue_id,
    )
    expected = sn.SendStreamRequest(items=[sn.SendStreamItem(opaque=opaque, message=request)])
    assert b"".join(send_stream_message(opaque, request)) == expected.SerializeToString()
