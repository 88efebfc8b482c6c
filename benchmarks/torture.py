"""Torture benchmark: every damage of the catalogue over many seeds, kill -9 cycles,
and what recovery costs with and without damage (issue 14).

Usage::

    python benchmarks/torture.py [--seeds 3] [--kills 5] [--gib 1] [--seed N] [--root DIR]

1. **Damage.** One small store is written (:func:`tests.support.damage.build_store`);
   for each seed every entry of :data:`tests.support.damage.CATALOGUE` damages a
   fresh copy of it, the rng (seeded by seed and entry) choosing the record,
   field byte, page, file or queue. The store is restarted, read back, sent to,
   stopped and checked (:func:`tests.support.damage.verify`, then
   ``store check``). Per variant: tries, starts refused, records lost (those the
   damage touched / collateral: any other), queue offsets reissued, wrong or
   stalled reads, failed ``store check``. Goals: collateral 0, reissued 0,
   wrong 0, refused 0 (but where the catalogue expects the refusal: a CommitLog
   file longer than configured), check failures 0 (but at damage a start does
   not look for, which check must report).
2. **kill -9.** ``--kills`` cycles of :class:`tests.support.crash_writer.CrashLoop`
   (SYNC flush, the writer killed at random, every acknowledged message checked
   after recovery; see ``benchmarks/crash_loop.py`` for long runs). Goal: no
   cycle fails (a failed cycle lost an acknowledged message or left an
   inconsistent store).
3. **Recovery time.** A ``--gib`` store of ~4 KiB records, stopped as after a
   crash with the checkpoint zeroed so recovery scans every file: seconds per
   GiB (goal <= 1.5). Then garbage and flipped bytes are written into it and it
   recovers again over the same bytes: the ratio of the two (goal <= 2). Where
   recovery truncates at the first damage instead of resynchronising, the
   damaged run scans less and loses the rest: the records lost are printed
   beside the ratio.

4. **CRC on read.** What checking every record's checksum costs the SDK's
   decoder (issue 28 point 1): a 256-record pull of 1 KiB records decoded with
   ``check_crc`` off and on, ``--crc-rounds`` alternating rounds, the ratio.

Exits 1 when a goal of parts 1 or 2 is missed.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    # Run as a script: the damage catalogue lives with the tests' support code.
    sys.path.insert(0, str(REPO_ROOT))

from basalt.store import Message, MessageStore, MessageStoreConfig  # noqa: E402
from basalt.store.consistency import check_store  # noqa: E402
from benchmarks.report import (  # noqa: E402
    Figure,
    Report,
    Table,
    add_json_out,
    count,
    pairs_table,
)
from tests.support import crash_writer  # noqa: E402
from tests.support.damage import (  # noqa: E402
    CATALOGUE,
    Layout,
    build_store,
    check_as_expected,
    copy_root,
    store_config,
    verify,
)
from tests.support.stores import DISK_NEVER_FULL  # noqa: E402

MIB = 1 << 20
GIB = 1 << 30


@dataclass
class VariantStats:
    """One catalogue entry's results over all seeds."""

    tries: int = 0
    refused: int = 0
    damaged: int = 0
    collateral: int = 0
    reissued: int = 0
    wrong: int = 0
    check_failed: int = 0
    first_problem: str = ""

    def note(self, problem: str) -> None:
        if not self.first_problem:
            self.first_problem = problem

    @property
    def clean(self) -> bool:
        return not (
            self.refused or self.collateral or self.reissued or self.wrong or self.check_failed
        )


def _one_try(
    base: Path, layout: Layout, work: Path, name: str, seed: int, stats: VariantStats
) -> None:
    """Damage a copy of ``base`` with catalogue entry ``name``, restart and count."""
    damage = next(d for d in CATALOGUE if d.name == name)
    root = work / f"try-{seed}-{name.replace('+', '-')}"
    copy_root(base, root)
    stats.tries += 1
    try:
        harm = damage(layout, root, random.Random(f"{seed}:{name}"))
        store = MessageStore(store_config(root))
        try:
            store.start()
        except Exception as e:
            if not harm.refused:  # a refusal the catalogue expects (a CommitLog file too long)
                stats.refused += 1
                stats.note(f"start refused: {type(e).__name__}: {e}")
            return
        if harm.refused:
            stats.wrong += 1
            stats.note("a start the catalogue expects refused went on")
        try:
            outcome = verify(store, layout, harm)
        finally:
            store.shutdown()
        stats.damaged += len(outcome.damaged)
        stats.collateral += len(outcome.collateral)
        stats.reissued += len(outcome.reissued)
        stats.wrong += len(outcome.wrong)
        if outcome.collateral:
            stats.note(f"{len(outcome.collateral)} records lost outside the damage")
        if outcome.reissued:
            stats.note(f"queue offsets reissued: {outcome.reissued[:2]}")
        if outcome.wrong:
            stats.note(outcome.wrong[0])
        report = check_store(root)
        if not check_as_expected(report, harm):
            stats.check_failed += 1
            stats.note(f"store check: {report.problems[0]}" if report.problems else "store check")
    except Exception as e:
        stats.wrong += 1
        stats.note(f"{type(e).__name__}: {e}")
        traceback.print_exc()
    finally:
        shutil.rmtree(root, ignore_errors=True)


def damage_table(report: Report, work: Path, seeds: int, base_seed: int) -> bool:
    """Part 1; emits the table and returns whether every variant met its goals."""
    base = work / "built"
    t0 = time.perf_counter()
    layout = build_store(base)
    print(
        f"built {len(layout.records)} records in {layout.commitlog_files} CommitLog files "
        f"({time.perf_counter() - t0:.1f} s); {len(CATALOGUE)} variants x {seeds} seeds",
        flush=True,
    )
    stats: dict[str, VariantStats] = {d.name: VariantStats() for d in CATALOGUE}
    for s in range(seeds):
        for damage in CATALOGUE:
            _one_try(base, layout, work, damage.name, base_seed + s, stats[damage.name])
        print(f"  seed {s + 1}/{seeds} done", flush=True)
    table = Table(
        "damage",
        ("variant", "tries", "refused", "lost dmg", "lost coll", "reissued", "wrong", "check",
         "problem"),
    )  # fmt: skip
    for name, st in stats.items():
        table.add(
            name,
            count(st.tries),
            count(st.refused, lower_is_better=True),
            count(st.damaged),
            count(st.collateral, lower_is_better=True),
            count(st.reissued, lower_is_better=True),
            count(st.wrong, lower_is_better=True),
            count(st.check_failed, lower_is_better=True),
            "ok" if st.clean else st.first_problem[:90],
        )
    print()
    report.emit(table)
    clean = sum(st.clean for st in stats.values())
    print()
    report.note(f"{clean}/{len(stats)} variants met every goal")
    return clean == len(stats)


def kill_cycles(report: Report, work: Path, kills: int, seed: int) -> bool:
    """Part 2; emits a summary and returns whether no cycle failed."""
    if kills <= 0:
        return True
    loop = crash_writer.CrashLoop(
        work / "crash", seed=seed, checker=crash_writer.run_store_check_cli
    )
    acked = 0
    failures: list[str] = []
    for cycle in range(kills):
        try:
            acked += loop.run_cycle(cycle).acks
        except crash_writer.CrashCheckFailure as e:
            failures.append(f"cycle {cycle}: {str(e)[:300]}")
            break  # the root is suspect: later cycles would repeat the same loss
    print("\nkill -9 cycles (SYNC flush)")
    report.emit(
        pairs_table(
            "kill -9",
            [
                ("cycles", count(kills)),
                ("acknowledged", count(acked)),
                ("failed", count(len(failures), lower_is_better=True)),
            ],
        )
    )
    for failure in failures:
        report.note(f"  {failure}")
    return not failures


def _timing_config(root: Path) -> MessageStoreConfig:
    return MessageStoreConfig(
        store_path_root_dir=root,
        mapped_file_size_commit_log=128 * MIB,
        message_index_enable=False,  # the index is not what is measured
        **DISK_NEVER_FULL,  # type: ignore[arg-type]
    )


def _recover_from_scratch(config: MessageStoreConfig) -> tuple[float, int, str]:
    """Start as after a crash with a zeroed checkpoint (so every file is scanned):
    seconds, the CommitLog's valid end, the recovery summary. Stops cleanly."""
    config.abort_path.touch()
    with config.checkpoint_path.open("r+b") as f:
        f.write(bytes(24))
    store = MessageStore(config)
    t0 = time.perf_counter()
    report = store.start()
    elapsed = time.perf_counter() - t0
    end = report.last_valid_offset
    store.shutdown()
    return elapsed, end, report.summary()


def recovery_timings(report: Report, work: Path, gib: float, seed: int) -> None:
    """Part 3: emits s/GiB of an undamaged recovery and the damaged/undamaged ratio."""
    root = work / "timing"
    config = _timing_config(root)
    rng = random.Random(seed)
    target = int(gib * GIB)
    body = rng.randbytes(4000)
    t0 = time.perf_counter()
    records = 0
    with MessageStore(config) as store:
        while store.max_physical_offset < target:
            batch = [Message("Timing", body, queue_id=i % 8) for i in range(64)]
            assert store.put_messages(batch).ok
            records += len(batch)
        assert store.wait_dispatched()
        size = store.max_physical_offset
    print(f"\nwrote {size / GIB:.2f} GiB ({records} records) in {time.perf_counter() - t0:.1f} s")
    clean_s, clean_end, summary = _recover_from_scratch(config)
    report.note(f"undamaged recovery: {summary}")
    # A 64 KiB run of garbage in the first file and a flipped byte every 64 MiB:
    # recovery must search past each for the next valid record.
    files = sorted(config.commitlog_dir.iterdir())
    with files[0].open("r+b") as f:
        f.seek(32 * MIB)
        f.write(rng.randbytes(64 * 1024))
    for at in range(64 * MIB, size, 64 * MIB):
        path = files[at // config.mapped_file_size_commit_log]
        with path.open("r+b") as f:
            f.seek(at % config.mapped_file_size_commit_log)
            (b,) = f.read(1)
            f.seek(-1, 1)
            f.write(bytes([b ^ 0xFF]))
    damaged_s, damaged_end, summary = _recover_from_scratch(config)
    report.note(f"recovery past damage: valid end {damaged_end} of {clean_end}; {summary}")
    report.emit(
        pairs_table(
            "recovery",
            [
                ("undamaged", Figure(clean_s, "s", fmt=".2f")),
                ("undamaged per GiB (goal <= 1.5)", Figure(clean_s / (size / GIB), "s/GiB")),
                ("past damage", Figure(damaged_s, "s", fmt=".2f")),
                ("past damage / undamaged (goal <= 2)", ratio(damaged_s / clean_s)),
                ("lost to the damage", Figure((clean_end - damaged_end) / MIB, "MiB", fmt=",.0f")),
            ],
        )
    )
    shutil.rmtree(root, ignore_errors=True)


def ratio(x: float) -> Figure:
    """A cost as a ratio to its reference (lower is better)."""
    return Figure(x, "x", better="lower", fmt=".3f")


def crc_on_read_cost(
    report: Report, rounds: int, records: int = 256, body_bytes: int = 1024
) -> None:
    """What verify-on-read costs the SDK's decoder (issue 28 point 1): a pull's
    answer of ``records`` stored records of ``body_bytes`` (the batched consume
    benchmark's 256 x 1 KiB), decoded with ``check_crc`` off and on in
    alternating order, ``rounds`` times; prints µs per record each way, the
    per-round ratio on/off and its median."""
    from basalt.common.message import encode_host
    from basalt.common.record import EncodedMessage, decode_records

    parts, pos = [], 0
    for i in range(records):
        message = Message("CrcTopic", bytes([i % 251]) * body_bytes, tags="t", keys=[f"k{i}"])
        encoded = EncodedMessage(
            message, store_host=encode_host("127.0.0.1:10911"), append_crc=True
        )
        parts.append(encoded.encode(i, pos, 1_700_000_000_000 + i))
        pos += encoded.size
    data = b"".join(parts)
    loops = 200

    def timed(check: bool) -> float:
        started = time.perf_counter()
        for _ in range(loops):
            decode_records(data, check_crc=check)
        return (time.perf_counter() - started) / (loops * records) * 1e6

    ratios, offs, ons = [], [], []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {check: timed(check) for check in order}
        offs.append(got[False])
        ons.append(got[True])
        ratios.append(got[True] / got[False])
    ratios.sort()
    each = ", ".join(f"{x:.3f}" for x in ratios)
    print(
        f"\nCRC on read (decode_records, {records} x {body_bytes} B records, {rounds} rounds "
        "alternating; best of the rounds, the ratio's median)"
    )
    report.emit(
        pairs_table(
            "crc on read",
            [
                ("check_crc off", Figure(min(offs), "µs/record", fmt=".3f")),
                ("check_crc on", Figure(min(ons), "µs/record", fmt=".3f")),
                ("on / off", ratio(ratios[len(ratios) // 2])),
            ],
        )
    )
    report.note(f"on/off per round: {each}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Damage, kill and time recovery (issue 14).")
    parser.add_argument("--seeds", type=int, default=3, help="passes over the damage catalogue")
    parser.add_argument("--kills", type=int, default=5, help="kill -9 cycles under SYNC flush")
    parser.add_argument("--gib", type=float, default=1.0, help="log size for the timings (0: none)")
    parser.add_argument("--seed", type=int, default=int(time.time()))
    parser.add_argument("--root", type=Path, help="work directory (default: a temporary one)")
    parser.add_argument("--crc-rounds", type=int, default=9, help="CRC-on-read rounds (0: none)")
    add_json_out(parser)
    args = parser.parse_args(argv)
    report = Report.start(__file__, args, argv)
    work = args.root or Path(tempfile.mkdtemp(prefix="basalt-torture-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"seed {args.seed}, work directory {work}", flush=True)
    try:
        ok = damage_table(report, work, args.seeds, args.seed)
        ok = kill_cycles(report, work, args.kills, args.seed) and ok
        if args.gib > 0:
            recovery_timings(report, work, args.gib, args.seed)
        if args.crc_rounds > 0:
            crc_on_read_cost(report, args.crc_rounds)
    finally:
        if args.root is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
