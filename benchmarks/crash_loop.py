"""Crash loop benchmark: many more ``kill -9`` cycles than the CI test, same logic.

Usage::

    python benchmarks/crash_loop.py [--cycles 200] [--seed N] [--root DIR] [--no-check]

Each cycle starts ``tests/support/crash_writer.py`` (SYNC flush, several writer
threads), kills it with SIGKILL after a seeded random while, then opens the
store in this process (abnormal recovery), checks every acknowledged message
so far, shuts down cleanly and runs ``basalt store check``. Every
``--cycles-per-root`` cycles it starts over on a fresh root, so the cost of
checking everything acknowledged so far stays bounded. Prints a table:
cycles, acknowledged messages, recovery time min/avg/max and failures; exits
1 if any cycle failed.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import Figure, Report, add_json_out, count, load_by_path, pairs_table

REPO_ROOT = Path(__file__).resolve().parents[1]
CRASH_WRITER = REPO_ROOT / "tests" / "support" / "crash_writer.py"


if TYPE_CHECKING:
    from tests.support import crash_writer
else:
    crash_writer = load_by_path("basalt_crash_writer", CRASH_WRITER)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Kill a SYNC-flush writer again and again.")
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--root", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--cycles-per-root", type=int, default=50)
    parser.add_argument("--threads", type=int, default=3, help="writer threads in the child")
    parser.add_argument("--min-run-ms", type=int, default=20)
    parser.add_argument("--max-run-ms", type=int, default=300)
    parser.add_argument("--early-kill", type=float, default=0.1, help="probability per kill")
    parser.add_argument(
        "--repeat-kill", type=float, default=0.3, help="probability of another kill in a cycle"
    )
    parser.add_argument("--no-check", action="store_true", help="skip `basalt store check`")
    parser.add_argument("--keep", action="store_true", help="keep the store roots")
    parser.add_argument("--stop-on-failure", action="store_true")
    add_json_out(parser)
    args = parser.parse_args(argv)
    report = Report.start(__file__, args, argv)

    work = args.root or Path(tempfile.mkdtemp(prefix="basalt-crash-loop-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"seed {args.seed}, work directory {work}", flush=True)

    checker = None if args.no_check else crash_writer.run_store_check_cli
    recoveries_ms: list[float] = []
    cycle_s: list[float] = []
    acked = kills = early_kills = nacks = truncations = 0
    failures: list[str] = []
    loop: crash_writer.CrashLoop | None = None
    roots = 0
    cycle_in_root = 0
    started = time.perf_counter()
    for cycle in range(args.cycles):
        if loop is None or cycle_in_root == args.cycles_per_root:
            loop = crash_writer.CrashLoop(
                work / f"store-{roots:04d}",
                seed=args.seed * 1000 + roots,
                threads=args.threads,
                min_run_ms=args.min_run_ms,
                max_run_ms=args.max_run_ms,
                early_kill_probability=args.early_kill,
                repeat_kill_probability=args.repeat_kill,
                checker=checker,
            )
            roots += 1
            cycle_in_root = 0
        t0 = time.perf_counter()
        try:
            result = loop.run_cycle(cycle_in_root)
        except crash_writer.CrashCheckFailure as e:
            failures.append(f"cycle {cycle} (root {loop.root}): {e}")
            print(f"cycle {cycle}: FAILED\n{e}", flush=True)
            if args.stop_on_failure:
                break
            loop = None  # the root is suspect: carry on with a fresh one
            continue
        cycle_in_root += 1
        acked += result.acks
        cycle_s.append(time.perf_counter() - t0)
        early_kills += result.early_kills
        kills += len(result.kills)
        nacks += result.nacks
        if result.recovery is not None:
            recoveries_ms.append(result.recovery.duration_ms)
            truncations += result.recovery.bytes_truncated > 0
        if (cycle + 1) % 10 == 0:
            print(f"  {cycle + 1} cycles, {len(failures)} failures", flush=True)
    elapsed = time.perf_counter() - started

    rows: list[tuple[str, Figure | str]] = [
        ("cycles", count(len(cycle_s) + len(failures))),
        ("kills", count(kills)),
        ("early kills (while starting)", count(early_kills)),
        ("acknowledged messages", count(acked)),
        ("nacked sends", count(nacks)),
        ("recoveries that truncated", count(truncations)),
    ]
    if recoveries_ms:
        rows += [
            ("recovery min", Figure(min(recoveries_ms), "ms", fmt=".1f")),
            ("recovery avg", Figure(statistics.fmean(recoveries_ms), "ms", fmt=".1f")),
            ("recovery max", Figure(max(recoveries_ms), "ms", fmt=".1f")),
        ]
    if cycle_s:
        rows.append(("cycle avg", Figure(statistics.fmean(cycle_s), "s", fmt=".2f")))
    rows += [
        ("elapsed", Figure(elapsed, "s", better=None, fmt=".1f")),
        ("failures", count(len(failures), lower_is_better=True)),
    ]
    print()
    report.emit(pairs_table("crash loop", rows))
    for failure in failures:
        print()
        report.note(failure)
    if not args.keep and args.root is None:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
