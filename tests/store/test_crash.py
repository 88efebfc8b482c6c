"""Crash test with real processes: ``kill -9`` a SYNC-flush writer, then check what survived.

Each cycle starts ``tests/support/crash_writer.py`` on the same root, lets it
write for a seeded random while, kills it with SIGKILL and collects every
send it acknowledged. The parent then opens the store (abnormal recovery),
finds every acknowledged message of every cycle so far — same physical
offset, size, tags, key and body digest, reachable through its ConsumeQueue —
shuts it down cleanly and runs ``basalt store check``. The cycle logic is
shared with ``benchmarks/crash_loop.py``; see :mod:`tests.support.crash_writer`.

Set ``BASALT_CRASH_SEED`` to replay a run with another seed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from basalt.store.tools import check_store
from tests.support.crash_writer import CrashLoop

CYCLES = 24


@pytest.mark.slow
def test_acknowledged_messages_survive_kill_9(tmp_path: Path) -> None:
    seed = int(os.environ.get("BASALT_CRASH_SEED", "20240601"))
    loop = CrashLoop(tmp_path / "store", seed=seed)
    results = []
    for cycle in range(CYCLES):
        results.append(loop.run_cycle(cycle))

    kills = sum(len(r.kills) for r in results)
    print(
        f"crash test seed {seed}: {CYCLES} cycles, {kills} kills "
        f"({sum(r.early_kills for r in results)} while starting), {len(loop.acked)} acknowledged "
        f"messages, {sum(r.nacks for r in results)} nacks"
    )

    # The loop really crashed a writer mid-stream, again and again, and checked it all.
    assert sum(r.acks for r in results) == len(loop.acked)
    assert sum(1 for r in results if r.acks > 0) >= CYCLES // 2, results
    abnormal = [r for r in results if r.recovery is not None and r.recovery.abnormal]
    assert len(abnormal) >= CYCLES // 2, results
    assert results[-1].verified == len(loop.acked)
    cli_reports = [r.check_report for r in results]
    assert all(report is not None and report["ok"] for report in cli_reports)

    # The library checker agrees with the CLI on the final root.
    report = check_store(loop.root)
    assert report.ok, report.summary()
    assert report.counts.records >= len(loop.acked)
    assert report.counts.undispatched_records == 0
    last = cli_reports[-1]
    assert last is not None
    assert report.counts.records == last["counts"]["records"]
