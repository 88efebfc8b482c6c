"""Every benchmark script writes its figures through benchmarks/report.py, and a
real one's file is what compare reads.

A script adopts the writer in a few lines (BENCHMARKS.md, "Recording and
comparing runs"): ``add_json_out(parser)``, ``Report.start(__file__, args, argv)``,
then ``report.emit(table)`` for each table it prints.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import compare
from benchmarks.report import HIGHER, LOWER, Run

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
#: The tools that read runs rather than measure.
TOOLS = {"report.py", "compare.py", "alternate.py"}
#: Scripts written on other branches before the writer: to convert when they
#: merge (then take them off this list; the test says so).
NOT_YET: set[str] = set()


def scripts() -> list[Path]:
    """Every runnable script in benchmarks/ (a module with a ``__main__`` block)."""
    found = []
    for path in sorted(BENCHMARKS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        runnable = any(
            isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in tree.body
        )
        if runnable and path.name not in TOOLS:
            found.append(path)
    return found


def run_script(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``benchmarks/<script> args`` run from the repository, as the docs run it."""
    return subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def called(path: Path) -> set[str]:
    """The names of the functions and methods ``path`` calls."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            names.add(func.attr if isinstance(func, ast.Attribute) else ast.unparse(func))
    return names


def test_every_script_writes_its_figures_through_the_report() -> None:
    paths = scripts()
    assert len(paths) >= 16
    missing = {
        p.name: sorted({"add_json_out", "start", "emit"} - called(p))
        for p in paths
        if p.name not in NOT_YET
    }
    assert {name: m for name, m in missing.items() if m} == {}, (
        "adopt benchmarks/report.py (BENCHMARKS.md, Recording and comparing runs)"
    )
    converted = [p.name for p in paths if p.name in NOT_YET and "emit" in called(p)]
    assert converted == [], "converted: take them off NOT_YET"


def test_a_quick_store_read_run_writes_figures_compare_reads(tmp_path: Path) -> None:
    """The cheapest script in its quickest mode (about a second); no timing is
    asserted, only what the file holds and that compare judges it."""
    done = run_script("store_read.py", "--quick", "--json-out", str(tmp_path))
    assert done.returncode == 0, done.stderr
    (path,) = tmp_path.glob("store_read-*.json")
    run = Run.load(path)
    assert run.command.endswith("benchmarks/store_read.py --quick --json-out " + str(tmp_path))
    assert run.parameters["quick"] is True and run.parameters["messages"] == 20_000
    assert run.tables["reads"].render() in done.stdout  # the printed table is the file's
    rates = {row: f for (_, row, column), f in run.cells.items() if column == "rate"}
    assert rates["get_message · 1 KiB, batches of 32, no filter"].better == HIGHER
    assert rates["offset by time · queue of 100,000 entries"].better == LOWER
    assert all(f.value > 0 for f in rates.values())

    text, status = compare.compare([run], [run], 0.1)
    assert status == 0
    judged = sum(1 for f in run.cells.values() if f.better)
    assert f"{judged} cells judged at ±10 % ({judged} same)" in text


@pytest.mark.parametrize("script", [p.name for p in scripts() if p.name not in NOT_YET])
def test_every_script_offers_json_out(script: str) -> None:
    done = run_script(script, "--help")
    assert done.returncode == 0, done.stderr
    assert "--json-out DIR" in done.stdout
