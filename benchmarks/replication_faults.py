"""Replication fault loop: a broker group under random faults, its history checked.

Usage::

    python benchmarks/replication_faults.py [--cycles 30] [--seed N] [--root DIR]
        [--producers 2] [--json-out DIR]

Runs a private etcd and a 3-member SYNC group (min_in_sync_replicas 2, a 2 s
lease) as real processes, producers sending each message until SEND_OK
(following NOT_MASTER to the master) and a consumer reading every queue. Every
1-2.5 s it injects one seeded random fault - kill -9, SIGSTOP+SIGCONT or
SIGTERM of a random member, or kill -9 and restart of etcd - repairs it and
waits for the group to be whole (all three in sync). Then it checks the
history: every acknowledged message is read back at its queue offset, no queue
offset was given to two messages, no consumer found its queue shorter than
its position, nothing consumed vanished, and the CommitLogs are
byte-identical. Prints a table (faults by kind, acknowledged, read back, lost,
duplicates, how long after each kind of fault sends were answered SEND_OK
again), writes the figures as JSON (``--json-out``, benchmarks/report.py);
exits 1 if a check failed.

The loop is ``tests/support/groups.py``'s :class:`FaultLoop` (the CI test
``tests/reliability/test_replication_faults.py`` runs a few cycles of it),
loaded by path: benchmarks do not depend on the tests package.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import (
    Figure,
    Report,
    Table,
    add_json_out,
    count,
    load_by_path,
    pairs_table,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
GROUPS = REPO_ROOT / "tests" / "support" / "groups.py"


if TYPE_CHECKING:
    from tests.support import groups
else:
    groups = load_by_path("basalt_replica_groups", GROUPS)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Random faults on a replicated broker group.")
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--root", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--min-gap-s", type=float, default=1.0, help="least time between faults")
    parser.add_argument("--max-gap-s", type=float, default=2.5, help="most time between faults")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    add_json_out(parser)
    args = parser.parse_args(argv)
    report = Report.start(__file__, args, argv)

    work = args.root or Path(tempfile.mkdtemp(prefix="basalt-replication-faults-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"seed {args.seed}, work directory {work}", flush=True)
    loop = groups.FaultLoop(
        work,
        cycles=args.cycles,
        seed=args.seed,
        producers=args.producers,
        fault_every_s=(args.min_gap_s, args.max_gap_s),
        log=lambda line: print(line, flush=True),
    )
    history = asyncio.run(loop.run())
    print()
    report.emit(history_table(history))
    for failure in history.failures:
        report.note(f"FAILED: {failure}")
    if not history.failures and not args.keep and args.root is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if history.failures else 0


def history_table(history: groups.FaultReport) -> Table:
    """The loop's history: faults injected, what was sent and read, what went
    wrong (judged: lower is better), how long sends were refused after each kind
    of fault."""
    h = history
    rows: list[tuple[str, Figure | str]] = [
        ("cycles", count(h.cycles)),
        *((f"faults: {kind}", count(n)) for kind, n in h.faults.items()),
        ("acked", count(h.acked)),
        ("send attempts", count(h.attempts)),
        ("send attempts failed", count(h.failed_attempts)),
        ("read back", count(h.read_back)),
        ("consumed", count(h.consumed)),
        ("lost", count(len(h.lost), lower_is_better=True)),
        ("duplicates", count(h.duplicates)),
        ("queue offsets reissued", count(len(h.reissued), lower_is_better=True)),
        ("queues gone back", count(len(h.went_back), lower_is_better=True)),
        ("reads behind a consumer (transient)", count(h.behind_reads)),
        ("consumed then vanished", count(len(h.vanished), lower_is_better=True)),
        ("CommitLogs differing", count(len(h.not_identical), lower_is_better=True)),
    ]
    for kind, values in h.unavailable_s.items():
        if values:
            avg = sum(values) / len(values)
            for what, seconds in (("min", min(values)), ("avg", avg), ("max", max(values))):
                rows.append((f"no SEND_OK after {kind}: {what}", Figure(seconds, "s", fmt=".2f")))
    rows.append(("elapsed", Figure(h.elapsed_s, "s", better=None, fmt=".1f")))
    return pairs_table("history", rows)


if __name__ == "__main__":
    sys.exit(main())
