"""benchmarks/compare.py: B against A, cell by cell, by the median of each side.

Every run is a real file written by benchmarks/report.py's writer on
``tmp_path``; compare's own command line reads them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks import compare
from benchmarks.report import LOWER, Figure, Report, Run, Table, pairs_table

# A run's figures: name -> (value, unit, better); better "" takes it from the unit.
Figures = dict[str, tuple[float, str, str | None]]


def write_run(directory: Path, figures: Figures, *, script: str = "bench.py") -> Path:
    """One run's JSON in ``directory`` with one table, ``t``, a row a figure."""
    report = Report(script, [], {"quick": True}, directory)
    pairs: list[tuple[str, Figure | str]] = []
    for name, (value, unit, better) in figures.items():
        pairs.append(
            (name, Figure(value, unit) if better == "" else Figure(value, unit, "", better))
        )
    report.emit(pairs_table("t", pairs), show=False)
    assert report.path is not None
    return report.path


def run_compare(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = compare.main(args)
    return status, capsys.readouterr().out


def verdicts(out: str) -> dict[str, str]:
    """Row -> verdict, from compare's printed table (row names are one word here)."""
    found = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[0] == "t":
            found[parts[1]] = parts[-1] if not parts[-1][0].isdigit() else ""
    return found


def test_each_cell_is_judged_by_its_direction_and_the_threshold(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_run(
        tmp_path / "a",
        {
            "rate_down_20": (1000.0, "msgs/s", ""),
            "rate_down_5": (1000.0, "msgs/s", ""),
            "rate_up_20": (1000.0, "msgs/s", ""),
            "latency_up_20": (100.0, "us p99", ""),
            "latency_up_5": (100.0, "us p99", ""),
            "latency_down_20": (100.0, "us p99", ""),
            "cpu_same": (8.0, "µs/msg", ""),
            "count_tripled": (10.0, "", None),
        },
    )
    b = write_run(
        tmp_path / "b",
        {
            "rate_down_20": (800.0, "msgs/s", ""),
            "rate_down_5": (950.0, "msgs/s", ""),
            "rate_up_20": (1200.0, "msgs/s", ""),
            "latency_up_20": (120.0, "us p99", ""),
            "latency_up_5": (105.0, "us p99", ""),
            "latency_down_20": (80.0, "us p99", ""),
            "cpu_same": (8.0, "µs/msg", ""),
            "count_tripled": (30.0, "", None),
        },
    )
    status, out = run_compare([str(a), str(b)], capsys)
    assert status == 1
    assert verdicts(out) == {
        "rate_down_20": "REGRESSION",
        "rate_down_5": "worse",
        "rate_up_20": "BETTER",
        "latency_up_20": "REGRESSION",
        "latency_up_5": "worse",
        "latency_down_20": "BETTER",
        "cpu_same": "same",
    }  # the count has no direction: listed only with --all, never judged
    assert "0.800" in out and "1.200" in out
    assert "7 cells judged at ±10 % (2 BETTER, 1 same, 2 worse, 2 REGRESSION)" in out

    status, out = run_compare([str(a), str(b), "--threshold", "25"], capsys)
    assert status == 0
    assert "REGRESSION" not in out and verdicts(out)["rate_down_20"] == "worse"

    status, out = run_compare([str(a), str(b), "--all"], capsys)
    assert verdicts(out)["count_tripled"] == "" and "3.000" in out


def test_nothing_worse_past_the_threshold_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_run(tmp_path / "a", {"rate": (1000.0, "msgs/s", ""), "p99": (100.0, "ms", "")})
    b = write_run(tmp_path / "b", {"rate": (1050.0, "msgs/s", ""), "p99": (91.0, "ms", "")})
    status, out = run_compare([str(a), str(b)], capsys)
    assert status == 0
    assert verdicts(out) == {"rate": "better", "p99": "better"}


def test_zero_and_signed_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Losses are counts judged lower-is-better: 0 -> 1 is a regression (an infinite
    ratio); an overhead in % may be negative: judged by the difference, not flagged."""
    a = write_run(
        tmp_path / "a",
        {"lost": (0.0, "", LOWER), "kept": (0.0, "", LOWER), "cost": (-2.0, "%", LOWER)},
    )
    b = write_run(
        tmp_path / "b",
        {"lost": (1.0, "", LOWER), "kept": (0.0, "", LOWER), "cost": (3.0, "%", LOWER)},
    )
    status, out = run_compare([str(a), str(b)], capsys)
    assert status == 1
    assert verdicts(out) == {"lost": "REGRESSION", "kept": "same", "cost": "worse"}
    assert " inf " in out and " n/a " in out


def test_alternated_rounds_are_compared_by_their_medians_with_the_spread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A1 B1 A2 B2 A3 B3: one slow A round and one fast B round (the machine's
    drift) do not decide; the medians do."""
    a_rates, b_rates = (1000.0, 500.0, 1100.0), (950.0, 2000.0, 900.0)
    files = []
    for n, (x, y) in enumerate(zip(a_rates, b_rates, strict=True)):
        files += [
            write_run(tmp_path / f"a{n}", {"rate": (x, "msgs/s", "")}),
            write_run(tmp_path / f"b{n}", {"rate": (y, "msgs/s", "")}),
        ]
    status, out = run_compare([str(p) for p in files], capsys)
    assert status == 0
    assert "A: 3 runs of" in out and "B: 3 runs of" in out
    line = next(line for line in out.splitlines() if line.startswith("t "))
    # medians 1,000 and 950: 0.950, worse but within 10 %; spreads ±30 % and ±58 %
    assert line.split() == [
        "t", "rate", "value", "msgs/s", "1,000", "±30", "%", "950", "±58", "%", "0.950", "worse"
    ]  # fmt: skip

    cells, only_a, only_b = compare.match(
        [Run.load(p) for p in files[0::2]], [Run.load(p) for p in files[1::2]]
    )
    assert only_a == only_b == []
    (cell,) = cells
    assert cell.a == a_rates and cell.b == b_rates
    assert cell.a_median == 1000.0 and cell.b_median == 950.0
    assert cell.ratio == pytest.approx(0.95)
    assert compare.spread(cell.a) == pytest.approx(0.3)
    assert compare.spread([5.0]) is None


def test_a_change_past_the_threshold_within_the_runs_noise_is_not_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Medians 20 % apart, but one B run as fast as an A run: ``worse*``, exit 0;
    every B run slower than every A run: REGRESSION, exit 1."""
    for name, b_rates in (("overlap", (800.0, 790.0, 1000.0)), ("apart", (800.0, 790.0, 950.0))):
        files = []
        for n, (x, y) in enumerate(zip((1000.0, 990.0, 1010.0), b_rates, strict=True)):
            files += [
                write_run(tmp_path / name / f"a{n}", {"rate": (x, "msgs/s", "")}),
                write_run(tmp_path / name / f"b{n}", {"rate": (y, "msgs/s", "")}),
            ]
        status, out = run_compare([str(p) for p in files], capsys)
        if name == "overlap":
            assert (status, verdicts(out)) == (0, {"rate": "worse*"})
            assert "runs of A and B overlap: not flagged" in out
        else:
            assert (status, verdicts(out)) == (1, {"rate": "REGRESSION"})


def test_two_globs_or_directories_are_the_two_sides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for n in range(3):
        write_run(tmp_path / "a", {"rate": (1000.0 + n, "msgs/s", "")})
        write_run(tmp_path / "b", {"rate": (700.0 + n, "msgs/s", "")})
    status, out = run_compare([str(tmp_path / "a"), str(tmp_path / "b")], capsys)
    assert status == 1 and "A: 3 runs" in out and "REGRESSION" in out
    status, out = run_compare([str(tmp_path / "a" / "*.json"), str(tmp_path / "b" / "*")], capsys)
    assert status == 1 and "B: 3 runs" in out


def test_cells_are_matched_by_script_table_row_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Several scripts' runs on each side: a cell meets only its own script's."""
    for side, rate in (("a", 100.0), ("b", 100.0)):
        write_run(tmp_path / side, {"rate": (rate, "msgs/s", "")}, script="one.py")
        write_run(tmp_path / side, {"rate": (rate * 2, "msgs/s", "")}, script="two.py")
    write_run(tmp_path / "b", {"new": (1.0, "s", "")}, script="three.py")
    status, out = run_compare([str(tmp_path / "a"), str(tmp_path / "b")], capsys)
    assert status == 0
    rows = [line.split()[:2] for line in out.splitlines() if line.endswith(" same")]
    assert rows == [["one.py", "t"], ["two.py", "t"]]
    assert "only in B: 1 cells, e.g. three.py / t / new / value" in out


def test_runs_that_differ_in_parameters_are_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = write_run(tmp_path / "a", {"rate": (1.0, "msgs/s", "")})
    report = Report("bench.py", [], {"quick": False}, tmp_path / "b")
    report.emit(pairs_table("t", [("rate", Figure(1.0, "msgs/s"))]), show=False)
    assert report.path is not None
    status, out = run_compare([str(a), str(report.path)], capsys)
    assert status == 0 and "warning: the runs differ in their parameters" in out


def test_no_common_cell_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write_run(tmp_path / "a", {"x": (1.0, "s", "")})
    b = write_run(tmp_path / "b", {"y": (1.0, "s", "")})
    status, out = run_compare([str(a), str(b)], capsys)
    assert status == 2 and "nothing to compare" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["one"], "give two sides"),
        (["a", "b", "c"], "give two sides"),
        (["{missing}", "{a}"], "side A"),
        (["{a}", "{a}", "{a}", "{missing}"], "names 0 files"),
        (["{dir}", "{a}", "{a}", "{a}"], "names 2 files"),
        (["{other}", "{a}"], "not a benchmark run"),
    ],
)
def test_arguments_that_name_no_runs_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    a = write_run(tmp_path / "a", {"x": (1.0, "s", "")})
    write_run(tmp_path / "dir", {"x": (1.0, "s", "")})
    write_run(tmp_path / "dir", {"x": (1.0, "s", "")})
    (tmp_path / "other.json").write_text("{}")
    names = {
        "a": a,
        "dir": tmp_path / "dir",
        "missing": tmp_path / "none.json",
        "other": tmp_path / "other.json",
    }
    with pytest.raises(SystemExit) as exited:
        compare.main([arg.format(**names) for arg in args])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_table_of_the_scripts_compares_like_any_other(tmp_path: Path) -> None:
    """Figures inside list cells ("also") are cells too."""
    runs = []
    for side, p99 in (("a", 100.0), ("b", 150.0)):
        table = Table("reads", ("path", "rate", "also"))
        table.add("get", Figure(10.0, "msgs/s"), [Figure(p99, "us", "p99"), "text"])
        report = Report("x.py", [], {}, tmp_path / side)
        report.emit(table, show=False)
        assert report.path is not None
        runs.append(Run.load(report.path))
    text, status = compare.compare([runs[0]], [runs[1]], 0.1)
    assert status == 1
    line = next(line for line in text.splitlines() if " p99 " in line)
    assert line.split() == ["reads", "get", "p99", "us", "100", "150", "1.500", "REGRESSION"]
    cells, _, _ = compare.match([runs[0]], [runs[1]])
    assert [c.key for c in cells] == [
        ("x.py", "reads", "get", "rate"),
        ("x.py", "reads", "get", "p99"),
    ]
    assert math.isclose(cells[1].ratio or 0, 1.5)
