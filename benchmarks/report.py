"""What the benchmark scripts share to print, record and load their figures.

Every script prints its tables and writes the same figures as JSON beside them,
one file a run: ``<--json-out DIR>/<script>-<UTC start>.json`` (default
``benchmarks/results/``, git-ignored). A table is built once, as a
:class:`Table` of cells, and both the printed text and the JSON are made from
it (one truth). ``benchmarks/compare.py`` reads two sets of such files and
compares them cell by cell.

Adopting it in a script is a few lines::

    from benchmarks.report import Report, add_json_out, rows_table

    add_json_out(parser)                          # --json-out DIR
    args = parser.parse_args(argv)
    report = Report.start(__file__, args, argv)   # machine, commit, date, parameters
    ...
    report.emit(rows_table("sends", rows))        # prints the table, (re)writes the JSON

A script whose rows are :class:`Row` (path, config, rate, unit, ...) uses
:func:`rows_table`; any other table is a :class:`Table` with text cells and
:class:`Figure` cells (a number with its unit and which way is better).

The file (``"schema": "basalt-benchmark/1"``)::

    {"schema", "script", "command", "argv", "started", "finished",
     "git": {"commit", "dirty", "branch"},
     "machine": {"cpu_model", "cpus", "usable_cpus", "mem_gib", "os", "python",
                 "hostname", "load_start", "load_end"},
     "parameters": {option: value},          # the parsed arguments
     "tables": {table: {"columns": [...], "key": [...],
                        "rows": [{"key": row, "cells": [cell, ...]}]}},
     "cells": {table: {row: {column: {"value", "unit", "better"}}}},
     "notes": [line, ...]}

``tables`` is the layout (a cell is a string, a figure, or a list of both: the
table prints again from it); ``cells`` holds the figures alone, keyed by table,
row (its key columns' text) and column (a figure inside a list cell is keyed by
its label, else its unit), which is what runs are matched by. ``better`` is
``"higher"`` (throughput), ``"lower"`` (latency, CPU, memory, seconds, losses)
or null (a count or a setting: shown, never judged). A value that is not a
finite number is written as null.

Also here: the machine's description (``machine()``, ``cpu_model()``,
``load_text()``) and the by-path import of a ``tests/support`` module whose loop
a benchmark runs (benchmarks do not depend on the tests package).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import json
import math
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parents[1]
#: Where a run's JSON goes unless ``--json-out`` says otherwise (git-ignored).
RESULTS: Final = REPO / "benchmarks" / "results"
SCHEMA: Final = "basalt-benchmark/1"

HIGHER: Final = "higher"
LOWER: Final = "lower"
#: ``Figure.better``'s default: take the direction from the unit (:func:`better_of`).
BY_UNIT: Final = "by unit"

_TIME_UNITS = frozenset({"ns", "us", "µs", "ms", "s", "min", "h"})
_SIZE_UNITS = frozenset({"B", "bytes", "KiB", "MiB", "GiB", "KB", "MB", "GB"})


def better_of(unit: str) -> str | None:
    """Which way is better for a figure in ``unit``: ``"higher"`` for a rate (its
    first word ends in ``/s``: msgs/s, MiB/s, rows/s), ``"lower"`` for a time or a
    size (its first word, up to a ``/``, is one: ``us p99``, ``ms``, ``s/GiB``,
    ``µs/msg``, ``KiB/queue``); None otherwise (counts, ratios, percentages: a
    figure in those units says its direction itself)."""
    words = unit.split()
    if not words:
        return None
    head = words[0]
    if head.endswith("/s"):
        return HIGHER
    if head.split("/")[0] in _TIME_UNITS | _SIZE_UNITS:
        return LOWER
    return None


def number(x: float) -> str:
    """A figure as the tables print it: 3 significant-ish digits, thousands
    separated (1,234,567 / 45.6 / 0.12)."""
    if x >= 100:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:,.1f}"
    return f"{x:,.2f}"


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured number: ``value`` in ``unit``; ``better`` says which way is an
    improvement (``"higher"``, ``"lower"``, None: not judged; by default from the
    unit). ``fmt`` is a format spec for the printed value (default: :func:`number`);
    ``label`` names it inside a list cell (``p99 1,234 us``) and in the JSON."""

    value: float
    unit: str = ""
    label: str = ""
    better: str | None = BY_UNIT
    fmt: str = ""

    def __post_init__(self) -> None:
        if self.better == BY_UNIT:
            object.__setattr__(self, "better", better_of(self.unit))
        if self.better not in (HIGHER, LOWER, None):
            raise ValueError(f"better must be {HIGHER!r}, {LOWER!r} or None: {self.better!r}")

    @property
    def name(self) -> str:
        """What the figure is called inside a list cell and in the JSON."""
        return self.label or self.unit

    def number_text(self) -> str:
        if not math.isfinite(self.value):
            return str(self.value)
        return format(self.value, self.fmt) if self.fmt else number(self.value)

    def text(self) -> str:
        """With its label and unit: ``p99 1,234 us``."""
        return " ".join(p for p in (self.label, self.number_text(), self.unit) if p)

    def __str__(self) -> str:
        return self.text()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "value": self.value if math.isfinite(self.value) else None,
            "unit": self.unit,
            "better": self.better,
        }
        if self.label:
            out["label"] = self.label
        if self.fmt:
            out["fmt"] = self.fmt
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Figure:
        value = data["value"]
        return cls(
            math.nan if value is None else value,
            data.get("unit", ""),
            data.get("label", ""),
            data.get("better"),
            data.get("fmt", ""),
        )


#: A table's cell: text, a figure, or several of both printed ", "-separated.
Cell = str | Figure | Sequence[str | Figure]


def _cell_text(cell: Cell, alone: bool) -> str:
    if isinstance(cell, str):
        return cell
    if isinstance(cell, Figure):
        return cell.number_text() if alone else cell.text()
    return ", ".join(_cell_text(part, False) for part in cell)


def _cell_json(cell: Cell) -> Any:
    if isinstance(cell, str):
        return cell
    if isinstance(cell, Figure):
        return cell.to_json()
    return [_cell_json(part) for part in cell]


def _cell_from_json(data: Any) -> Cell:
    if isinstance(data, str):
        return data
    if isinstance(data, dict):
        return Figure.from_json(data)
    return [part if isinstance(part, str) else Figure.from_json(part) for part in data]


class Table:
    """A named table of rows, each a cell per column. A row is known by its key
    columns' text (``" · "``-joined; a repeated key gets ``" #2"``, ``" #3"`` in
    the order added), so that a key names the same measurement in every run:
    key columns hold text, never a measured value. A figure alone in a cell
    prints as its number (say the unit in the header or a unit column); in a
    list cell it prints with its label and unit. Columns holding lone figures
    are right-aligned."""

    def __init__(self, name: str, columns: Sequence[str], *, key: Sequence[str] = ()) -> None:
        self.name = name
        self.columns = tuple(columns)
        self.key = tuple(key) or self.columns[:1]
        missing = [k for k in self.key if k not in self.columns]
        if missing or len(set(self.columns)) != len(self.columns):
            raise ValueError(f"table {name!r}: key {self.key} or columns {self.columns} wrong")
        self._key_at = [self.columns.index(k) for k in self.key]
        self.rows: list[tuple[Cell, ...]] = []
        self.keys: list[str] = []
        self._seen: dict[str, int] = {}

    def add(self, *cells: Cell) -> None:
        """Append a row: one cell per column. ValueError (and no row added) on a
        wrong count, a figure in a key column, a figure in a list cell with
        neither label nor unit, or two figures of the row under one name."""
        if len(cells) != len(self.columns):
            raise ValueError(f"table {self.name!r}: {len(cells)} cells for {self.columns}")
        if any(not isinstance(cells[i], str) for i in self._key_at):
            raise ValueError(f"table {self.name!r}: key columns {self.key} hold text only")
        base = " · ".join(str(cells[i]) for i in self._key_at)
        seen = self._seen.get(base, 0) + 1
        key = base if seen == 1 else f"{base} #{seen}"
        self._named(key, cells)
        self._seen[base] = seen
        self.rows.append(tuple(cells))
        self.keys.append(key)

    def _named(self, key: str, cells: Sequence[Cell]) -> dict[str, Figure]:
        """The row's figures by name: a lone figure's is its column's; one in a
        list cell goes by its label, else its unit."""
        out: dict[str, Figure] = {}
        for column, cell in zip(self.columns, cells, strict=True):
            named: list[tuple[str, Figure]] = []
            if isinstance(cell, Figure):
                named = [(column, cell)]
            elif not isinstance(cell, str):
                named = [(p.name, p) for p in cell if isinstance(p, Figure)]
            for name, figure in named:
                where = f"table {self.name!r} row {key!r}"
                if not name:
                    raise ValueError(f"{where}: a figure in a list needs a label or a unit")
                if name in out or (name != column and name in self.columns):
                    raise ValueError(f"{where}: two figures named {name!r}")
                out[name] = figure
        return out

    def figures(self) -> dict[str, dict[str, Figure]]:
        """Every figure: {row key: {column or figure name: figure}}."""
        return {key: self._named(key, row) for key, row in zip(self.keys, self.rows, strict=True)}

    def render(self) -> str:
        """The table as aligned text (see :func:`aligned`)."""
        numeric = {
            i
            for i in range(len(self.columns))
            if any(isinstance(row[i], Figure) for row in self.rows)
        }
        cells = [list(self.columns)]
        cells += [[_cell_text(c, True) for c in row] for row in self.rows]
        return aligned(cells, numeric)

    def to_json(self) -> dict[str, Any]:
        return {
            "columns": list(self.columns),
            "key": list(self.key),
            "rows": [
                {"key": k, "cells": [_cell_json(c) for c in row]}
                for k, row in zip(self.keys, self.rows, strict=True)
            ],
        }

    @classmethod
    def from_json(cls, name: str, data: Mapping[str, Any]) -> Table:
        table = cls(name, data["columns"], key=data["key"])
        for row in data["rows"]:
            table.add(*(_cell_from_json(c) for c in row["cells"]))
        return table

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Table):
            return NotImplemented
        same = (self.name, self.columns, self.key, self.keys)
        return same == (other.name, other.columns, other.key, other.keys) and all(
            _cell_json(a) == _cell_json(b)
            for x, y in zip(self.rows, other.rows, strict=True)
            for a, b in zip(x, y, strict=True)
        )


def aligned(cells: Sequence[Sequence[str]], numeric: set[int]) -> str:
    """``cells`` (a header row, then the rows) as columns two spaces apart, a
    dashed line under the header; the columns in ``numeric`` right-aligned."""
    header = cells[0]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = []
    for n, c in enumerate(cells):
        lines.append(
            "  ".join(
                c[i].rjust(widths[i]) if i in numeric and n else c[i].ljust(widths[i])
                for i in range(len(header))
            ).rstrip()
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# -- the rate table most scripts print ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    value: float
    higher_is_better: bool = True

    def met(self, measured: float) -> bool:
        return measured >= self.value if self.higher_is_better else measured <= self.value

    def __str__(self) -> str:
        return f"{'>=' if self.higher_is_better else '<='} {number(self.value)}"


@dataclass(slots=True)
class Row:
    """One measured cell: ``rate`` in ``unit`` (its direction from the unit), over
    ``count`` things in ``seconds``; ``extra`` is the "also" column: text, or
    figures (compared too) and text."""

    path: str
    config: str
    rate: float
    unit: str
    count: int
    seconds: float
    target: Target | None = None
    extra: str | Figure | Sequence[str | Figure] = ""

    @property
    def status(self) -> str:
        if self.target is None:
            return ""
        return "met" if self.target.met(self.rate) else "NOT MET"


ROW_COLUMNS: Final = ("path", "config", "rate", "unit", "count", "secs", "target", "status", "also")


def rows_table(name: str, rows: Sequence[Row]) -> Table:
    """``rows`` as a table known by path and config: the rate (judged by its unit),
    count and seconds (not judged), target, status, and "also"."""
    table = Table(name, ROW_COLUMNS, key=("path", "config"))
    for r in rows:
        extra: Cell = [r.extra] if isinstance(r.extra, Figure) else r.extra
        table.add(
            r.path,
            r.config,
            Figure(r.rate, r.unit),
            r.unit,
            Figure(r.count, better=None, fmt=","),
            Figure(r.seconds, "s", better=None, fmt=".2f"),
            "" if r.target is None else str(r.target),
            r.status,
            extra,
        )
    return table


def pairs_table(name: str, pairs: Sequence[tuple[str, Figure | str]]) -> Table:
    """A table of named figures, one a row: what, value, unit (the figure's)."""
    table = Table(name, ("what", "value", "unit"))
    for what, value in pairs:
        table.add(what, value, value.unit if isinstance(value, Figure) else "")
    return table


def count(n: float, *, lower_is_better: bool = False) -> Figure:
    """A count: not judged, or judged lower-is-better (failures, losses)."""
    return Figure(n, better=LOWER if lower_is_better else None, fmt=",")


def format_table(rows: Sequence[Row]) -> str:
    """``rows`` printed as :func:`rows_table` prints them."""
    return rows_table("rows", rows).render()


# -- the machine and the code ------------------------------------------------------------


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def mem_total_gib() -> float:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / (1 << 20)
    return 0.0


def load_text() -> str:
    """The load averages, ``"1.02 0.80 0.66"`` (1, 5, 15 min)."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def machine() -> dict[str, Any]:
    """What this machine is: CPU model and count, memory, OS, Python, host name."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count() or 0
    return {
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "usable_cpus": usable,
        "mem_gib": round(mem_total_gib(), 1),
        "os": f"{platform.system()} {platform.release()}",
        "python": f"{platform.python_implementation()} {platform.python_version()}",
        "hostname": platform.node(),
    }


def _git(*argv: str, cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", *argv], cwd=cwd, capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def git_state(repo: Path = REPO) -> dict[str, Any]:
    """The checkout's commit, whether tracked files differ from it, its branch
    (None each where ``repo`` is not a git checkout)."""
    commit = _git("rev-parse", "HEAD", cwd=repo)
    status = _git("status", "--porcelain", "--untracked-files=no", cwd=repo)
    return {
        "commit": commit,
        "dirty": None if status is None else bool(status),
        "branch": _git("rev-parse", "--abbrev-ref", "HEAD", cwd=repo),
    }


def _utc(at: datetime.datetime) -> str:
    return at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it (paths and other objects as text)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return str(value)


# -- a run's report ----------------------------------------------------------------------


def add_json_out(parser: argparse.ArgumentParser) -> None:
    """The ``--json-out DIR`` option every script has."""
    parser.add_argument(
        "--json-out",
        type=Path,
        default=RESULTS,
        metavar="DIR",
        help="write the run's figures to DIR/<script>-<UTC time>.json "
        "(default: benchmarks/results/)",
    )


@dataclass
class Report:
    """One run of a script: its tables and notes, printed as they come and
    written to ``out_dir`` (None: not written) each time one is added, so a run
    that dies half-way leaves what it measured. Single-threaded."""

    script: str
    argv: list[str]
    parameters: dict[str, Any]
    out_dir: Path | None
    started: datetime.datetime = field(default_factory=lambda: datetime.datetime.now(datetime.UTC))
    tables: dict[str, Table] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    machine: dict[str, Any] = field(default_factory=machine)
    git: dict[str, Any] = field(default_factory=git_state)
    load_start: str = field(default_factory=load_text)
    path: Path | None = None

    @classmethod
    def start(
        cls, script_file: str, args: argparse.Namespace, argv: Sequence[str] | None = None
    ) -> Report:
        """The report of a run of the script at ``script_file`` (pass ``__file__``)
        with the parsed ``args`` (its ``json_out`` is where it goes) and ``argv``
        (default ``sys.argv[1:]``)."""
        params = {k: v for k, v in vars(args).items() if k != "json_out"}
        return cls(
            Path(script_file).name,
            list(sys.argv[1:] if argv is None else argv),
            _plain(params),
            getattr(args, "json_out", RESULTS),
        )

    @property
    def command(self) -> str:
        python = Path(sys.executable)
        with contextlib.suppress(ValueError):
            python = python.relative_to(Path.cwd())
        return shlex.join([str(python), f"benchmarks/{self.script}", *self.argv])

    def emit(self, table: Table, *, show: bool = True) -> None:
        """Print ``table`` (unless ``show`` is false) and write the run's JSON with
        it. ValueError if a table of that name was emitted already."""
        if table.name in self.tables:
            raise ValueError(f"table {table.name!r} emitted twice")
        self.tables[table.name] = table
        if show:
            print(table.render(), flush=True)
        self.write()

    def note(self, line: str) -> None:
        """Print ``line`` and keep it in the JSON."""
        print(line, flush=True)
        self.notes.append(line)
        self.write()

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "script": self.script,
            "command": self.command,
            "argv": self.argv,
            "started": _utc(self.started),
            "finished": _utc(datetime.datetime.now(datetime.UTC)),
            "git": self.git,
            "machine": {**self.machine, "load_start": self.load_start, "load_end": load_text()},
            "parameters": self.parameters,
            "tables": {name: t.to_json() for name, t in self.tables.items()},
            "cells": {
                name: {
                    row: {column: f.to_json() for column, f in figures.items()}
                    for row, figures in t.figures().items()
                }
                for name, t in self.tables.items()
            },
            "notes": self.notes,
        }

    def write(self) -> Path | None:
        """(Re)write the run's file; its path (None when ``out_dir`` is None)."""
        if self.out_dir is None:
            return None
        if self.path is None:
            self.path = self._reserve()
        text = json.dumps(self.to_json(), indent=1, ensure_ascii=False, allow_nan=False)
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(text + "\n", encoding="utf-8")
        partial.replace(self.path)
        return self.path

    def _reserve(self) -> Path:
        """A new file named after the script and the start time."""
        assert self.out_dir is not None
        self.out_dir.mkdir(parents=True, exist_ok=True)
        stem = f"{Path(self.script).stem}-{self.started:%Y%m%dT%H%M%SZ}"
        for n in range(1, 1000):
            path = self.out_dir / (f"{stem}.json" if n == 1 else f"{stem}-{n}.json")
            with contextlib.suppress(FileExistsError):
                path.open("x").close()
                return path
        raise FileExistsError(f"{self.out_dir}/{stem}*.json: too many")


# -- reading runs back -------------------------------------------------------------------

#: A figure's place in a run: (table, row, column).
CellKey = tuple[str, str, str]


@dataclass(frozen=True, slots=True)
class Run:
    """A run as read back from its JSON file."""

    path: Path
    script: str
    command: str
    started: str
    git: dict[str, Any]
    machine: dict[str, Any]
    parameters: dict[str, Any]
    tables: dict[str, Table]
    cells: dict[CellKey, Figure]
    notes: list[str]

    @classmethod
    def load(cls, path: Path) -> Run:
        """ValueError if ``path`` is not a run's JSON of this schema."""
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise ValueError(f"{path}: not readable as JSON: {e}") from e
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"{path}: not a benchmark run ({SCHEMA})")
        return cls(
            path,
            data["script"],
            data.get("command", ""),
            data.get("started", ""),
            data.get("git") or {},
            data.get("machine") or {},
            data.get("parameters") or {},
            {name: Table.from_json(name, t) for name, t in data.get("tables", {}).items()},
            {
                (table, row, column): Figure.from_json(figure)
                for table, rows in data.get("cells", {}).items()
                for row, columns in rows.items()
                for column, figure in columns.items()
            },
            list(data.get("notes", [])),
        )


def load_by_path(name: str, path: Path) -> ModuleType:
    """Import the module at ``path`` as ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
