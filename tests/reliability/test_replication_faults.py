"""A few cycles of the replication fault loop (benchmarks/replication_faults.py
runs many): a 3-member SYNC group and a private etcd as real processes,
producers and a consumer, one seeded random fault per cycle (kill -9, SIGSTOP
then SIGCONT, SIGTERM of a member, or a restart of etcd); then every
acknowledged message is read back at its queue offset, no queue offset holds
two messages, no queue went back under its consumer, nothing consumed vanished,
and the members' CommitLogs are byte-identical.

The seed is printed: a failure is replayed with ``python
benchmarks/replication_faults.py --cycles 6 --seed N``.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.support.aio import async_test
from tests.support.groups import FAULTS, FaultLoop

pytestmark = pytest.mark.slow


@async_test(timeout_s=280)
async def test_every_acknowledged_message_survives_random_faults(tmp_path: Path) -> None:
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    loop = FaultLoop(tmp_path, cycles=6, seed=seed, log=print)
    report = await loop.run()
    print(report.table())
    assert report.cycles == 6
    assert sum(report.faults[k] for k in FAULTS) == 6
    assert report.acked > 0 and report.consumed > 0
    assert report.failures == [], f"seed {seed}: {report.failures}"
    assert report.lost == [] and report.read_back >= report.acked - report.duplicates
