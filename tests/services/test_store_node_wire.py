"""basalt.services.store_node.wire writes the same PullBatchResponse protobuf would build."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from basalt.services.store_node.wire import pull_batch_wire
from basalt.v1 import common_pb2 as pb

heads = st.builds(
    pb.PullResponse,
    code=st.sampled_from([pb.RESPONSE_CODE_SUCCESS, pb.RESPONSE_CODE_PULL_NOT_FOUND]),
    status=st.sampled_from([pb.PULL_STATUS_FOUND, pb.PULL_STATUS_NO_NEW_MSG]),
    next_begin_offset=st.integers(0, 2**62),
    min_offset=st.integers(0, 2**40),
    max_offset=st.integers(0, 2**40),
)
commits = st.none() | st.builds(
    pb.CommitResult,
    code=st.sampled_from([pb.RESPONSE_CODE_SUCCESS, pb.RESPONSE_CODE_STALE_RESET_EPOCH]),
    reset_epoch=st.integers(0, 1000),
)
refusals = st.builds(
    pb.Refused, grpc_code=st.integers(0, 16), code=st.just(pb.RESPONSE_CODE_TOPIC_NOT_EXIST)
)
records = st.none() | st.tuples(st.binary(max_size=300), st.integers(0, 2**31 - 1))
# Sizes around the varint boundaries (127/128, 16383/16384 bytes) as well.
big = st.sampled_from([127, 128, 16383, 16384, 70000]).map(lambda n: (b"r" * n, 3))


@given(st.lists(st.tuples(heads, commits, records | big, refusals), max_size=6))
def test_the_bytes_parse_to_what_protobuf_builds(entries: list) -> None:  # type: ignore[type-arg]
    wire_entries = []
    expected = pb.PullBatchResponse()
    for head, commit, rec, refusal in entries:
        if commit is not None:
            head.commit.CopyFrom(commit)
        if rec is None:  # a refused entry: no records
            entry = pb.PullResponse(refused=refusal)
            wire_entries.append((entry, None, 0))
            expected.results.append(entry)
            continue
        data, count = rec
        wire_entries.append((head, data, count))
        built = expected.results.add()
        built.CopyFrom(head)
        built.records.CopyFrom(pb.Records(data=data, count=count))
    parsed = pb.PullBatchResponse.FromString(pull_batch_wire(wire_entries))
    assert parsed == expected
    # Records present (even empty) exactly where they were written.
    assert [r.HasField("records") for r in parsed.results] == [
        e[1] is not None for e in wire_entries
    ]
