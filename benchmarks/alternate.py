"""Run one benchmark command alternately in two checkouts, then compare them.

Usage::

    .venv/bin/python benchmarks/alternate.py A_DIR B_DIR [--rounds 3] [--out DIR]
        [--threshold 10] -- .venv/bin/python benchmarks/store_read.py --quick

``A_DIR`` and ``B_DIR`` are two checkouts of Basalt (git worktrees: e.g. main and
a branch), each with its own ``.venv`` made (``./scripts/test.sh`` or the
install command of docs/development.md). Round by round, the command runs in A,
then in B (A1 B1 A2 B2 ...: the host's drift lands on both sides), from the
checkout's own directory, so a relative ``.venv/bin/python benchmarks/...``
runs that checkout's code; ``--json-out OUT/a`` or ``OUT/b`` is appended, so
each run's figures land on its side. Then ``benchmarks/compare.py OUT/a OUT/b``
judges B against A by the median of each cell; the exit status is compare's (1:
a regression past ``--threshold``). A run that fails is reported; one that
writes no JSON ends the rounds (exit 2). The runs' output goes to this
process's stdout, each headed by its side and round.

To alternate commits rather than checkouts, make a worktree of each first::

    git worktree add ../basalt-main main
    cd ../basalt-main && python3.11 -m venv .venv && .venv/bin/pip install -qq \
        -e '.[dev,server,spark]' --config-settings editable_mode=strict
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.compare import DEFAULT_THRESHOLD_PCT, compare
from benchmarks.report import RESULTS, Run


def run_once(command: Sequence[str], checkout: Path, out: Path) -> tuple[int, list[Path]]:
    """Run ``command`` in ``checkout`` writing its JSON under ``out``: its exit
    status and the JSON files it added."""
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.json"))
    done = subprocess.run([*command, "--json-out", str(out.resolve())], cwd=checkout, check=False)
    return done.returncode, sorted(set(out.glob("*.json")) - before)


def alternate(
    checkouts: tuple[Path, Path], command: Sequence[str], rounds: int, out: Path
) -> tuple[list[Path], list[Path]]:
    """``rounds`` runs of ``command`` in each checkout, alternating; each side's
    JSON files. RuntimeError when a run writes none."""
    files: tuple[list[Path], list[Path]] = ([], [])
    for n in range(1, rounds + 1):
        for side, (label, checkout) in enumerate(zip("ab", checkouts, strict=True)):
            print(f"\n=== round {n}/{rounds}, side {label.upper()}: {checkout}", flush=True)
            status, written = run_once(command, checkout, out / label)
            if status:
                print(f"=== side {label.upper()} exited {status}", flush=True)
            if not written:
                raise RuntimeError(f"round {n}, side {label.upper()} wrote no JSON into {out}")
            files[side].extend(written)
    return files


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        usage="%(prog)s A_DIR B_DIR [options] -- COMMAND ...",
    )
    parser.add_argument("a", type=Path, help="checkout A (the reference, e.g. main)")
    parser.add_argument("b", type=Path, help="checkout B (e.g. the branch)")
    parser.add_argument("--rounds", type=int, default=3, help="runs on each side (default 3)")
    parser.add_argument(
        "--out", type=Path, help="where the runs go (default benchmarks/results/alternate-<time>)"
    )
    parser.add_argument(
        "--threshold", type=float, default=DEFAULT_THRESHOLD_PCT, metavar="PCT",
        help=f"compare's regression threshold in %% (default {DEFAULT_THRESHOLD_PCT:g})",
    )  # fmt: skip
    parser.add_argument("--all", action="store_true", help="compare: list every figure")
    args, command = _split(parser, sys.argv[1:] if argv is None else list(argv))
    for checkout in (args.a, args.b):
        if not checkout.is_dir():
            parser.error(f"{checkout}: not a directory")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or RESULTS / f"alternate-{stamp}"
    print(f"A = {args.a}\nB = {args.b}\ncommand: {' '.join(command)}\nruns: {out}", flush=True)
    try:
        a_files, b_files = alternate((args.a, args.b), command, args.rounds, out)
    except RuntimeError as e:
        print(f"alternate: {e}", file=sys.stderr)
        return 2
    text, status = compare(
        [Run.load(p) for p in a_files],
        [Run.load(p) for p in b_files],
        args.threshold / 100,
        show_all=args.all,
    )
    print(f"\n{text}")
    return status


def _split(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[argparse.Namespace, list[str]]:
    """The options before ``--`` and the command after it."""
    if "--" not in argv:
        parser.error("give the command after --")
    at = argv.index("--")
    command = argv[at + 1 :]
    if not command:
        parser.error("give the command after --")
    return parser.parse_args(argv[:at]), command


if __name__ == "__main__":
    raise SystemExit(main())
