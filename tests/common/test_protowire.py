"""common.protowire: the hand-written framing is protobuf's own encoding."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from basalt.common.protowire import LENGTH_DELIMITED, VARINT, tag, varint
from basalt.v1 import common_pb2 as pb
from basalt.v1 import store_node_pb2 as sn


def test_varint_matches_protobuf() -> None:
    for n in (1, 127, 128, 300, 16383, 16384, 2**31 - 1):
        assert pb.Records(count=n).SerializeToString() == b"\x10" + varint(n)
    assert varint(0) == b"\x00"


@given(st.integers(1, 2**64 - 1))
def test_a_varint_field_is_its_tag_then_the_value(n: int) -> None:
    framed = tag(sn.SendStreamItem.DESCRIPTOR, "opaque", VARINT) + varint(n)
    assert framed == sn.SendStreamItem(opaque=n).SerializeToString()


@given(st.binary(min_size=1, max_size=20_000))
def test_a_length_delimited_field_is_its_tag_the_length_then_the_bytes(data: bytes) -> None:
    framed = tag(pb.Records.DESCRIPTOR, "data", LENGTH_DELIMITED) + varint(len(data)) + data
    assert framed == pb.Records(data=data).SerializeToString()
    assert pb.Records.FromString(framed).data == data
