"""The ``basalt`` command line: group wiring, exit statuses, and a real
``python -m basalt.admin``.

What ``store check``/``store dump`` find is tested in ``tests/store/test_tools.py``;
here only that the commands are reachable and behave as a CLI should.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from basalt.admin.cli import GROUPS, main
from basalt.store import ManualClock, MessageStore
from tests.support.processes import run_basalt_sync
from tests.support.stores import ConfigFactory, fill_store


@pytest.fixture
def root(make_config: ConfigFactory, clock: ManualClock) -> Path:
    config = make_config()
    with MessageStore.open(config, clock=clock) as store:
        fill_store(store, clock, rounds=4)
    return config.store_path_root_dir


def test_help_lists_the_groups(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: basalt")
    assert all(group.name in out for group in GROUPS)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "required: GROUP"),
        (["store"], "required: COMMAND"),
        (["store", "check"], "required: ROOT"),
        (["nosuchgroup"], "invalid choice"),
        (["store", "dump", "ROOT", "--queue", "-1"], "must not be negative"),
        (["store", "dump", "ROOT", "--from-offset", "ten"], "not an integer"),
    ],
)
def test_usage_errors_exit_2_with_a_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_store_commands_in_process(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["store", "check", str(root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True

    assert main(["store", "dump", str(root), "--topic", "TopicA", "--queue", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Dumping ") and lines[-1] == "records: 4"


def test_python_m_admin_runs_the_same_cli(root: Path, tmp_path: Path) -> None:
    ok = run_basalt_sync("store", "check", str(root))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.rstrip().endswith("result: OK")

    missing = run_basalt_sync("store", "check", str(tmp_path / "missing"))
    assert missing.returncode == 2
    assert "no such store root" in missing.stderr and "Traceback" not in missing.stderr
