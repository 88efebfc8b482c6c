"""Queue allocation within a consumer group: RocketMQ's AllocateMessageQueueAveragely.

Every consumer of a group computes its own share from the same inputs - the
group's live client ids and the topic's read queues, both sorted - so that
the shares partition the queues without any coordination: each queue goes to
exactly one consumer, and shares differ in size by at most one. With more
consumers than queues, the last consumers get none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

Q = TypeVar("Q")


def allocate_averagely(queues: Sequence[Q], client_ids: Sequence[str], client_id: str) -> list[Q]:
    """``client_id``'s share of ``queues`` among ``client_ids``.

    ``queues`` and ``client_ids`` must be in the same (sorted) order on every
    consumer. RocketMQ's rule: the first ``len(queues) % len(client_ids)``
    consumers take one queue more, and each takes a contiguous run. A
    ``client_id`` not among ``client_ids`` (not registered yet) gets nothing.
    """
    if client_id not in client_ids or not queues:
        return []
    index = list(client_ids).index(client_id)
    n, k = len(queues), len(client_ids)
    mod = n % k
    if n <= k:
        size = 1
    elif mod > 0 and index < mod:
        size = n // k + 1
    else:
        size = n // k
    start = index * size if mod > 0 and index < mod else index * size + mod
    return [queues[(start + i) % n] for i in range(min(size, n - start))]
