"""Compare benchmark runs cell by cell: side B against side A.

Reads the JSON files the scripts write (``benchmarks/report.py``) and matches
their figures by script, table, row and column. Each side may hold several
runs (rounds run alternately on one host: A1 B1 A2 B2 ...); a cell's figure on
a side is the median of its runs, and the spread (half the range, as a share
of the median) is shown, since this machine's speed moves by ±20 % from one
run to the next and a single run lies. For each cell: B/A, whether that is
better or worse by the figure's direction (a rate higher, a latency, CPU or
size lower), and REGRESSION when it is worse by more than ``--threshold``
(10 % by default) and every run of B is worse than every run of A. A cell
worse past the threshold whose runs overlap is ``worse*``, not flagged: its
runs' own noise spans the change. (With 3 rounds a side, B's runs all below
A's happens by chance once in 20: a rank test at 5 %; with one run a side
the threshold alone decides.) Improvements are marked the same way (BETTER,
``better*``). Figures with no direction (counts, settings) are listed with
``--all`` only, and never judged.

Exit status: 0, 1 when any cell regressed past the threshold (so the script
can guard a merge), 2 when the arguments name no runs to compare.

Usage::

    benchmarks/compare.py A.json B.json               # one run a side
    benchmarks/compare.py A1.json B1.json A2.json B2.json ...   # alternated rounds
    benchmarks/compare.py 'runs/a/*.json' runs/b/     # two globs or directories: the sides

With exactly two arguments each is a side: a file, a glob or a directory (its
``*.json``). With more, they alternate A, B, A, B and each names one file.
``benchmarks/alternate.py`` runs a command on two checkouts and calls this.
"""

from __future__ import annotations

import argparse
import glob
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.report import HIGHER, LOWER, Run, aligned, number

#: A cell across runs: (script, table, row, column).
Key = tuple[str, str, str, str]

DEFAULT_THRESHOLD_PCT = 10.0


@dataclass(frozen=True, slots=True)
class Cell:
    """One figure compared: its values on each side (one a run that has it)."""

    key: Key
    unit: str
    better: str | None
    a: tuple[float, ...]
    b: tuple[float, ...]

    @property
    def a_median(self) -> float:
        return statistics.median(self.a)

    @property
    def b_median(self) -> float:
        return statistics.median(self.b)

    @property
    def ratio(self) -> float | None:
        """B/A of the medians: 1 when equal, inf when A is 0 and B is not; None
        when a median is negative (a ratio would mean nothing)."""
        a, b = self.a_median, self.b_median
        if a == b:
            return 1.0
        if a < 0 or b < 0:
            return None
        return math.inf if a == 0 else b / a

    def apart(self, b_higher: bool) -> bool:
        """Whether every B run is above (``b_higher``) or below every A run."""
        return min(self.b) > max(self.a) if b_higher else max(self.b) < min(self.a)

    def verdict(self, threshold: float) -> str:
        """By the figure's direction: ``"better"`` / ``"worse"``; past ``threshold``
        (a fraction) ``"BETTER"`` / ``"REGRESSION"`` when the sides' runs do not
        overlap, else ``"better*"`` / ``"worse*"``; ``"same"``; ``""`` for a figure
        with no direction."""
        ratio = self.ratio
        if self.better not in (HIGHER, LOWER):
            return ""
        if ratio is None:  # signed figures: judged by the difference, never flagged
            diff = self.b_median - self.a_median
            return "better" if (diff > 0) == (self.better == HIGHER) else "worse"
        if ratio == 1:
            return "same"
        improved = ratio > 1 if self.better == HIGHER else ratio < 1
        word = "better" if improved else "worse"
        if not (ratio > 1 + threshold or ratio < 1 - threshold):
            return word
        if not self.apart(b_higher=ratio > 1):
            return word + "*"
        return "BETTER" if improved else "REGRESSION"


def spread(values: Sequence[float]) -> float | None:
    """Half the range of ``values`` as a share of their median (None for one value
    or a zero median)."""
    if len(values) < 2:
        return None
    median = statistics.median(values)
    return None if median == 0 else (max(values) - min(values)) / 2 / abs(median)


def match(a: Sequence[Run], b: Sequence[Run]) -> tuple[list[Cell], list[Key], list[Key]]:
    """The cells found on both sides (in A's order), and those found on one side only."""
    a_values: dict[Key, list[float]] = {}
    b_values: dict[Key, list[float]] = {}
    kinds: dict[Key, tuple[str, str | None]] = {}
    for runs, values in ((a, a_values), (b, b_values)):
        for run in runs:
            for (table, row, column), figure in run.cells.items():
                key = (run.script, table, row, column)
                kinds.setdefault(key, (figure.unit, figure.better))
                if math.isfinite(figure.value):
                    values.setdefault(key, []).append(figure.value)
    cells = [
        Cell(key, *kinds[key], tuple(values), tuple(b_values[key]))
        for key, values in a_values.items()
        if key in b_values
    ]
    return (
        cells,
        [k for k in a_values if k not in b_values],
        [k for k in b_values if k not in a_values],
    )


def _pct(x: float | None) -> str:
    return "" if x is None else f"±{x * 100:.0f} %"


def _ratio(x: float | None) -> str:
    if x is None:
        return "n/a"
    return "inf" if math.isinf(x) else f"{x:.3f}"


def render(cells: Sequence[Cell], threshold: float, *, show_all: bool) -> str:
    """The comparison as a table: one line a cell (with ``show_all``, the cells with
    no direction too)."""
    scripts = {c.key[0] for c in cells}
    header = ["script"] if len(scripts) > 1 else []
    header += ["table", "row", "column", "unit", "A", "spread A", "B", "spread B", "B/A"]
    header += ["verdict"]
    lines = [header]
    for c in cells:
        verdict = c.verdict(threshold)
        if not verdict and not show_all:
            continue
        where = list(c.key) if len(scripts) > 1 else list(c.key[1:])
        lines.append(
            [
                *where,
                c.unit,
                number(c.a_median),
                _pct(spread(c.a)),
                number(c.b_median),
                _pct(spread(c.b)),
                _ratio(c.ratio),
                verdict,
            ]
        )
    first = len(header) - 7
    return aligned(lines, {first + 1, first + 2, first + 3, first + 4, first + 5})


def describe(label: str, runs: Sequence[Run]) -> str:
    """One line: a side's runs, their commits and dates."""
    commits = []
    for run in runs:
        commit = str(run.git.get("commit") or "?")[:10]
        if run.git.get("dirty"):
            commit += "+dirty"
        if commit not in commits:
            commits.append(commit)
    dates = sorted(run.started for run in runs)
    when = dates[0] if len(dates) == 1 else f"{dates[0]} .. {dates[-1]}"
    runs_text = f"{len(runs)} run{'s' if len(runs) != 1 else ''}"
    return f"{label}: {runs_text} of {', '.join(commits)}, {when}"


def warnings(a: Sequence[Run], b: Sequence[Run]) -> list[str]:
    """What makes the sides less comparable: other parameters or machines."""
    out = []
    for what, get in (
        ("parameters", lambda r: r.parameters),
        ("machines", lambda r: (r.machine.get("cpu_model"), r.machine.get("usable_cpus"))),
    ):
        seen = {repr(get(r)) for r in (*a, *b)}
        if len(seen) > 1:
            out.append(f"warning: the runs differ in their {what}: " + " | ".join(sorted(seen)))
    return out


def sides(args: Sequence[str]) -> tuple[list[Path], list[Path]]:
    """A's files and B's, from the command line (see the module docstring).
    ValueError when they do not name two non-empty sides."""

    def expand(arg: str) -> list[Path]:
        path = Path(arg)
        if path.is_dir():
            return sorted(path.glob("*.json"))
        if path.exists():
            return [path]
        return sorted(Path(p) for p in glob.glob(arg))

    if len(args) == 2:
        a, b = expand(args[0]), expand(args[1])
    elif len(args) > 2 and len(args) % 2 == 0:
        a, b = [], []
        for n, arg in enumerate(args):
            found = expand(arg)
            if len(found) != 1:
                raise ValueError(f"{arg}: names {len(found)} files; in pairs, name one each")
            (a if n % 2 == 0 else b).extend(found)
    else:
        raise ValueError("give two sides (files, globs or directories) or pairs A1 B1 A2 B2 ...")
    for label, found, arg in (("A", a, args[0]), ("B", b, args[1])):
        if not found:
            raise ValueError(f"side {label} ({arg}): no JSON files")
    return a, b


def compare(
    a: Sequence[Run], b: Sequence[Run], threshold: float, *, show_all: bool = False
) -> tuple[str, int]:
    """The report of B against A, and the exit status: 1 when a cell regressed past
    ``threshold`` (a fraction), 2 when no cell is on both sides, else 0."""
    cells, only_a, only_b = match(a, b)
    lines = [describe("A", a), describe("B", b), *warnings(a, b)]
    if not cells:
        lines.append("no cell is on both sides: nothing to compare")
        return "\n".join(lines), 2
    verdicts = [c.verdict(threshold) for c in cells]
    lines += ["", render(cells, threshold, show_all=show_all), ""]
    for label, keys in (("A", only_a), ("B", only_b)):
        if keys:
            lines.append(f"only in {label}: {len(keys)} cells, e.g. {' / '.join(keys[0])}")
    judged = sum(1 for v in verdicts if v)
    regressions = verdicts.count("REGRESSION")
    counts = ", ".join(
        f"{verdicts.count(v)} {v}"
        for v in ("BETTER", "better*", "better", "same", "worse", "worse*", "REGRESSION")
        if v in verdicts
    )
    lines.append(
        f"{judged} cells judged at ±{threshold * 100:g} % ({counts}); "
        f"{len(cells) - judged} not judged (no direction)"
    )
    if any(v.endswith("*") for v in verdicts):
        lines.append("*: past the threshold, but the runs of A and B overlap: not flagged")
    return "\n".join(lines), 1 if regressions else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="Exit status: 1 when a cell regressed past the threshold.",
    )
    parser.add_argument("runs", nargs="+", help="A B, or A1 B1 A2 B2 ... (files, globs, dirs)")
    parser.add_argument(
        "--threshold",
        type=float,
        default=DEFAULT_THRESHOLD_PCT,
        metavar="PCT",
        help=f"a cell worse by more than PCT %% regressed (default {DEFAULT_THRESHOLD_PCT:g})",
    )
    parser.add_argument("--all", action="store_true", help="list the figures with no direction too")
    args = parser.parse_args(argv)
    try:
        a_files, b_files = sides(args.runs)
        a = [Run.load(p) for p in a_files]
        b = [Run.load(p) for p in b_files]
    except ValueError as e:
        parser.error(str(e))
    text, status = compare(a, b, args.threshold / 100, show_all=args.all)
    print(text)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
