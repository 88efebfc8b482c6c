"""client.rebalance: RocketMQ's AllocateMessageQueueAveragely."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from basalt.client.rebalance import allocate_averagely


def test_rocketmqs_own_examples() -> None:
    queues = list(range(8))
    ids = ["a", "b", "c"]
    assert [allocate_averagely(queues, ids, c) for c in ids] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7],
    ]
    # More consumers than queues: one each, the rest idle.
    assert [allocate_averagely([0, 1], ids, c) for c in ids] == [[0], [1], []]
    assert allocate_averagely(queues, ids, "stranger") == []
    assert allocate_averagely([], ids, "a") == []


@given(st.integers(0, 64), st.integers(1, 20))
def test_shares_partition_the_queues_and_differ_by_at_most_one(n: int, k: int) -> None:
    queues = list(range(n))
    ids = [f"c{i:02d}" for i in range(k)]
    shares = [allocate_averagely(queues, ids, c) for c in ids]
    flat = [q for share in shares for q in share]
    assert sorted(flat) == queues  # every queue once, none twice
    sizes = [len(s) for s in shares]
    assert max(sizes) - min(sizes) <= 1
    assert all(s == sorted(s) for s in shares)  # contiguous runs, in order
