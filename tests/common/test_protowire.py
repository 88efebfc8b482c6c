"""common.protowire: the hand-written framing is protobuf's own encoding, and
what protobuf serializes reads back field by field."""

from __future__ import annotations

import pytest
from google.protobuf.descriptor import Descriptor
from hypothesis import given
from hypothesis import strategies as st

from basalt.common.protowire import (
    LENGTH_DELIMITED,
    VARINT,
    WireFormatError,
    fields,
    read_varint,
    tag,
    varint,
)
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


@given(st.integers(0, 2**64 - 1), st.binary(max_size=3))
def test_read_varint_reads_back_what_varint_wrote(n: int, after: bytes) -> None:
    framed = varint(n) + after
    assert read_varint(memoryview(framed), 0) == (n, len(framed) - len(after))


def _number(message: Descriptor, field: str) -> int:
    return int(message.fields_by_name[field].number)


@given(
    status=st.sampled_from(list(pb.GetMessageStatus.values())),
    next_begin=st.integers(-(2**63), 2**63 - 1),
    data=st.binary(max_size=5_000),
)
def test_fields_reads_protobufs_own_bytes(status: int, next_begin: int, data: bytes) -> None:
    response = pb.PullResponse(
        store_status=pb.GetMessageStatus.ValueType(status),
        next_begin_offset=next_begin,
        records=pb.Records(data=data, count=3),
    )
    answer = pb.PullBatchResponse(results=[response, pb.PullResponse()]).SerializeToString()
    entries = list(fields(memoryview(answer)))
    results = _number(pb.PullBatchResponse.DESCRIPTOR, "results")
    assert [number for number, _ in entries] == [results, results]
    first = entries[0][1]
    assert isinstance(first, memoryview)
    read = dict(fields(first))
    # proto3 leaves a scalar at 0 out; an int64 below 0 reads back negative.
    assert read.get(_number(pb.PullResponse.DESCRIPTOR, "store_status"), 0) == status
    assert read.get(_number(pb.PullResponse.DESCRIPTOR, "next_begin_offset"), 0) == next_begin
    records = read[_number(pb.PullResponse.DESCRIPTOR, "records")]
    assert isinstance(records, memoryview)
    inner = dict(fields(records))
    assert bytes(inner.get(_number(pb.Records.DESCRIPTOR, "data"), b"")) == data
    assert inner[_number(pb.Records.DESCRIPTOR, "count")] == 3


def test_fields_refuses_a_wire_type_it_does_not_read() -> None:
    fixed64 = varint(1 << 3 | 1) + bytes(8)
    with pytest.raises(WireFormatError, match="wire type 1") as caught:
        list(fields(memoryview(fixed64)))
    assert caught.value.wire_type == 1
