"""benchmarks/alternate.py: one command run in two checkouts in turn, then compared.

The checkouts here are directories on ``tmp_path`` holding a small script that
writes its figure through benchmarks/report.py (what each side's benchmark
does), run as real processes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmarks import alternate
from benchmarks.report import Run

REPO = Path(__file__).resolve().parents[2]

#: A checkout's "benchmark": its rate is in rate.txt beside it; every run notes
#: its side in the shared log, so the order of the runs is seen.
SCRIPT = f"""
import argparse, sys
from pathlib import Path
sys.path.insert(0, {str(REPO)!r})
from benchmarks.report import Figure, Report, add_json_out, pairs_table

parser = argparse.ArgumentParser()
add_json_out(parser)
args = parser.parse_args()
here = Path(__file__).resolve().parent
with open(here.parent / "order.log", "a") as log:
    log.write(here.name + "\\n")
if (here / "fail").exists():
    sys.exit(3)
report = Report.start(__file__, args)
rate = float((here / "rate.txt").read_text())
report.emit(pairs_table("t", [("rate", Figure(rate, "msgs/s"))]))
"""


def checkout(root: Path, name: str, rate: float) -> Path:
    path = root / name
    path.mkdir()
    (path / "bench.py").write_text(SCRIPT)
    (path / "rate.txt").write_text(str(rate))
    return path


def test_rounds_alternate_and_a_regression_on_b_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = checkout(tmp_path, "main", 1000.0), checkout(tmp_path, "branch", 800.0)
    out = tmp_path / "runs"
    status = alternate.main(
        [str(a), str(b), "--rounds", "3", "--out", str(out), "--", sys.executable, "bench.py"]
    )
    printed = capsys.readouterr().out
    assert status == 1
    assert (tmp_path / "order.log").read_text().split() == ["main", "branch"] * 3
    assert len(list((out / "a").glob("*.json"))) == len(list((out / "b").glob("*.json"))) == 3
    assert "=== round 2/3, side B" in printed
    assert "A: 3 runs" in printed and "0.800" in printed and "REGRESSION" in printed


def test_the_same_figures_on_both_sides_exit_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = checkout(tmp_path, "main", 1000.0), checkout(tmp_path, "branch", 1000.0)
    argv = [str(a), str(b), "--rounds", "1", "--out", str(tmp_path / "runs")]
    assert alternate.main([*argv, "--", sys.executable, "bench.py"]) == 0
    assert "1 same" in capsys.readouterr().out


def test_a_side_that_writes_no_figures_ends_the_rounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = checkout(tmp_path, "main", 1000.0), checkout(tmp_path, "branch", 1000.0)
    (b / "fail").touch()
    argv = [str(a), str(b), "--rounds", "3", "--out", str(tmp_path / "runs")]
    assert alternate.main([*argv, "--", sys.executable, "bench.py"]) == 2
    assert "side B exited 3" in capsys.readouterr().out
    assert (tmp_path / "order.log").read_text().split() == ["main", "branch"]


def test_the_command_goes_after_a_double_dash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in ([str(tmp_path), str(tmp_path)], [str(tmp_path), str(tmp_path), "--"]):
        with pytest.raises(SystemExit) as exited:
            alternate.main(argv)
        assert exited.value.code == 2
        assert "give the command after --" in capsys.readouterr().err


@pytest.mark.slow
def test_a_real_benchmark_alternated_on_one_checkout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """store_read.py's quickest mode (about a second), once on each side; the
    comparison is printed whatever it finds (timings are never asserted)."""
    out = tmp_path / "runs"
    command = [sys.executable, "benchmarks/store_read.py", "--quick"]
    status = alternate.main(
        [str(REPO), str(REPO), "--rounds", "1", "--out", str(out), "--", *command]
    )
    printed = capsys.readouterr().out
    assert status in (0, 1)
    (a,), (b,) = sorted((out / "a").glob("*.json")), sorted((out / "b").glob("*.json"))
    run_a, run_b = Run.load(a), Run.load(b)
    assert run_a.script == run_b.script == "store_read.py"
    assert run_a.cells.keys() == run_b.cells.keys()
    assert ("reads", "get_message · 1 KiB, batches of 32, no filter", "rate") in run_a.cells
    assert "cells judged at ±10 %" in printed
