"""benchmarks/report.py: the one writer of a run's figures, and reading them back.

Real files on ``tmp_path``; what is written is read back with ``Run.load``, the
reader ``benchmarks/compare.py`` uses, and must be the table that was printed.
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.report import (
    HIGHER,
    LOWER,
    RESULTS,
    SCHEMA,
    Figure,
    Report,
    Row,
    Run,
    Table,
    Target,
    add_json_out,
    better_of,
    count,
    pairs_table,
    rows_table,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("unit", "better"),
    [
        ("msgs/s", HIGHER),
        ("entries/s", HIGHER),
        ("MiB/s", HIGHER),
        ("rows/s", HIGHER),
        ("us p50", LOWER),
        ("µs/msg", LOWER),
        ("ms max", LOWER),
        ("s", LOWER),
        ("s/GiB", LOWER),
        ("KiB", LOWER),
        ("MiB", LOWER),
        ("", None),
        ("x", None),
        ("%", None),
        ("msgs", None),
        ("records/poll", None),
    ],
)
def test_the_direction_of_a_figure_comes_from_its_unit(unit: str, better: str | None) -> None:
    assert better_of(unit) == better
    assert Figure(1.0, unit).better == better


def test_an_explicit_direction_wins_and_a_wrong_one_is_refused() -> None:
    assert Figure(1.0, "%", better=LOWER).better == LOWER
    assert Figure(1.0, "msgs/s", better=None).better is None
    with pytest.raises(ValueError, match="better must be"):
        Figure(1.0, "s", better="faster")


def test_a_figure_prints_its_number_alone_and_with_label_and_unit_in_a_list() -> None:
    table = Table("t", ("what", "value", "also"))
    table.add("a", Figure(1234.5, "msgs/s"), [Figure(12.25, "us", "p99", fmt=".1f"), "note"])
    assert table.render().splitlines() == [
        "what  value  also",
        "----  -----  -----------------",
        "a     1,234  p99 12.2 us, note",
    ]


def test_rows_are_known_by_their_key_columns_and_repeats_are_numbered() -> None:
    table = Table("t", ("path", "config", "rate"), key=("path", "config"))
    table.add("produce", "batch 1", Figure(1.0, "msgs/s"))
    table.add("produce", "batch 1", Figure(2.0, "msgs/s"))
    table.add("consume", "batch 1", Figure(3.0, "msgs/s"))
    table.add("produce", "batch 1", Figure(4.0, "msgs/s"))
    assert table.keys == [
        "produce · batch 1",
        "produce · batch 1 #2",
        "consume · batch 1",
        "produce · batch 1 #3",
    ]
    assert table.figures()["produce · batch 1 #3"]["rate"].value == 4.0


def test_a_table_refuses_what_would_make_its_cells_ambiguous() -> None:
    table = Table("t", ("what", "rate", "also"))
    with pytest.raises(ValueError, match="key columns"):
        table.add(Figure(1.0), Figure(1.0), "")  # a measured value cannot name a row
    with pytest.raises(ValueError, match="cells for"):
        table.add("a", Figure(1.0))
    with pytest.raises(ValueError, match="two figures named 'p99'"):
        table.add("a", Figure(1.0), [Figure(1.0, "us", "p99"), Figure(2.0, "us", "p99")])
    with pytest.raises(ValueError, match="two figures named 'rate'"):
        table.add("a", Figure(1.0), [Figure(1.0, "us", "rate")])
    with pytest.raises(ValueError, match="needs a label or a unit"):
        table.add("a", Figure(1.0), [Figure(1.0)])
    assert table.rows == [] and table.keys == []  # nothing refused was kept
    table.add("a", Figure(1.0), "")
    assert table.keys == ["a"]
    with pytest.raises(ValueError, match="key"):
        Table("t", ("a", "b"), key=("c",))


def _args(out: Path | None, **options: object) -> argparse.Namespace:
    return argparse.Namespace(json_out=out, **options)


def test_a_report_writes_the_printed_table_and_reads_back_the_same(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        Row("get", "1 KiB", 1000.0, "msgs/s", 10, 0.5, Target(900), "text"),
        Row(
            "lookup",
            "by key",
            12.5,
            "us p50",
            200,
            0.01,
            Target(100, higher_is_better=False),
            [Figure(40.0, "us", "p99"), Figure(3.0, "µs/msg", "CPU"), "and text"],
        ),
    ]
    report = Report.start("/x/benchmarks/store_read.py", _args(tmp_path, quick=True), ["--quick"])
    table = rows_table("reads", rows)
    report.emit(table)
    report.note("total 1 s")
    printed = capsys.readouterr().out
    assert printed == table.render() + "\ntotal 1 s\n"
    assert report.path is not None and report.path.parent == tmp_path
    assert re.fullmatch(r"store_read-\d{8}T\d{6}Z\.json", report.path.name)

    run = Run.load(report.path)
    assert run.script == "store_read.py"
    assert run.command.endswith("benchmarks/store_read.py --quick")
    assert run.parameters == {"quick": True}  # where it was written is not a parameter
    assert run.tables == {"reads": table}
    assert run.tables["reads"].render() == table.render()
    assert run.notes == ["total 1 s"]
    assert run.cells[("reads", "get · 1 KiB", "rate")] == Figure(1000.0, "msgs/s")
    assert run.cells[("reads", "lookup · by key", "rate")].better == LOWER
    assert run.cells[("reads", "lookup · by key", "p99")] == Figure(40.0, "us", "p99")
    assert run.cells[("reads", "lookup · by key", "CPU")].better == LOWER
    assert run.cells[("reads", "get · 1 KiB", "count")].better is None
    # Every figure of the layout is a cell, and nothing else is.
    assert len(run.cells) == 3 + 5


def test_the_file_says_where_and_on_what_it_ran(tmp_path: Path) -> None:
    report = Report.start("store_read.py", _args(tmp_path, root=tmp_path / "r"), [])
    report.emit(pairs_table("t", [("a", count(1))]), show=False)
    assert report.path is not None
    data = json.loads(report.path.read_text())
    assert data["schema"] == SCHEMA
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", data["started"])
    assert data["parameters"] == {"root": str(tmp_path / "r")}  # a path as text
    assert data["machine"]["cpus"] >= 1 and data["machine"]["cpu_model"]
    assert {"load_start", "load_end", "usable_cpus", "mem_gib", "os"} <= set(data["machine"])
    assert re.fullmatch(r"[0-9a-f]{40}", data["git"]["commit"])  # the tests run in a checkout
    assert isinstance(data["git"]["dirty"], bool)
    figure = {"value": 1, "unit": "", "better": None, "fmt": ","}
    assert data["cells"] == {"t": {"a": {"value": figure}}}


def test_runs_started_in_the_same_second_get_files_of_their_own(tmp_path: Path) -> None:
    first = Report.start("x.py", _args(tmp_path), [])
    second = Report("x.py", [], {}, tmp_path, started=first.started)
    for report in (first, second):
        report.emit(pairs_table("t", [("a", count(1))]), show=False)
    assert first.path is not None and second.path is not None
    assert first.path != second.path and second.path.name.endswith("-2.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [first.path.name, second.path.name]
    )  # nothing half-written is left beside them


def test_a_table_emitted_twice_is_refused_and_no_out_dir_writes_nothing(tmp_path: Path) -> None:
    report = Report.start("x.py", _args(None), [])
    table = pairs_table("t", [("a", count(1))])
    report.emit(table, show=False)
    assert report.path is None and report.write() is None
    with pytest.raises(ValueError, match="twice"):
        report.emit(table, show=False)


def test_a_value_that_is_not_a_number_is_written_as_null(tmp_path: Path) -> None:
    report = Report.start("x.py", _args(tmp_path), [])
    report.emit(pairs_table("t", [("nan", Figure(math.nan, "ms")), ("inf", Figure(1e999))]))
    assert report.path is not None
    data = json.loads(report.path.read_text())  # strict JSON: no NaN
    assert data["cells"]["t"]["nan"]["value"]["value"] is None
    assert math.isnan(Run.load(report.path).cells[("t", "inf", "value")].value)


def test_a_file_of_another_kind_is_refused(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"seed": 1}))
    with pytest.raises(ValueError, match="not a benchmark run"):
        Run.load(other)
    other.write_text("{")
    with pytest.raises(ValueError, match="not readable"):
        Run.load(other)


def test_json_out_defaults_to_the_ignored_results_folder() -> None:
    parser = argparse.ArgumentParser()
    add_json_out(parser)
    assert parser.parse_args([]).json_out == RESULTS == REPO / "benchmarks" / "results"
    assert "/benchmarks/results/" in (REPO / ".gitignore").read_text().splitlines()


def test_a_lone_figure_in_also_is_a_cell_as_in_a_list() -> None:
    """transactions.py passes sdk_throughput.cpu_us_per_message's figure alone."""
    table = rows_table(
        "t", [Row("p", "c", 1.0, "msgs/s", 1, 1.0, None, Figure(2.5, "µs/msg", "CPU"))]
    )
    assert table.figures()["p · c"]["CPU"] == Figure(2.5, "µs/msg", "CPU")
    assert table.render().splitlines()[-1].endswith("CPU 2.50 µs/msg")


def test_rows_cross_process_boundaries() -> None:
    """grpc_floor.py hands its rows back from a spawned process."""
    row = Row("p", "c", 1.0, "us p99", 1, 1.0, None, [Figure(2.0, "us", "p50")])
    assert pickle.loads(pickle.dumps(row)) == row


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
_figures = st.builds(
    Figure,
    st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(10**12), 10**12),
    _text,
    st.sampled_from(["", "p50", "p99", "CPU"]),
    st.sampled_from([HIGHER, LOWER, None]),
    st.sampled_from(["", ",", ".2f"]),
)
_cells = _text | _figures | st.lists(_text | _figures, max_size=3)


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(_text, _cells, _cells), max_size=6))
def test_any_table_round_trips_through_its_json(rows: list[tuple[str, object, object]]) -> None:
    table = Table("t", ("what", "a", "b"))
    for what, a, b in rows:
        try:
            table.add(what, a, b)  # type: ignore[arg-type]
        except ValueError:
            continue  # two figures of a row under one name: refused, as it must be
    again = Table.from_json("t", json.loads(json.dumps(table.to_json())))
    assert again == table
    assert again.render() == table.render()
    assert again.figures() == table.figures()
