"""scripts/run.sh: installs on a fresh checkout or after a change, not on every run.

The script runs in a copy of the tree's shape under tmp_path with a fake
``.venv`` whose ``python`` and ``basalt`` only log their arguments, so what
it would install and run is seen without pip or a cluster.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "run.sh"

FAKE = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$(dirname "$0")/../../calls.log"
"""


def _tree(root: Path) -> Path:
    (root / "scripts").mkdir()
    shutil.copy(SCRIPT, root / "scripts" / "run.sh")
    (root / "pyproject.toml").write_text("[project]\nname = 'basalt'\n")
    (root / "setup.py").write_text("setup()\n")
    for folder in ("admin", "client", "services", "store", "common"):
        (root / folder).mkdir(parents=True)
    (root / "admin" / "verbs.py").write_text("")
    (root / "common/_records.c").write_text("int x;\n")
    (root / ".venv" / "bin").mkdir(parents=True)
    for name in ("python", "basalt"):
        fake = root / ".venv" / "bin" / name
        fake.write_text(FAKE)
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    return root


def _run(root: Path, *argv: str, **env: str) -> list[str]:
    """Run the script; the fake commands it called, in order (and forget them)."""
    subprocess.run(
        ["bash", str(root / "scripts" / "run.sh"), *argv],
        check=True,
        env={**os.environ, **env},
        timeout=60,
    )
    log = root / "calls.log"
    calls = log.read_text().splitlines()
    log.unlink()
    return calls


def _installs(calls: list[str]) -> int:
    return sum("pip install" in c and " -e ." in c for c in calls)


def test_it_installs_once_then_only_after_a_change(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    first = _run(root)
    assert _installs(first) == 1 and first[-1] == "basalt cluster up"
    assert _run(root, "status") == ["basalt cluster status"]  # nothing changed: no pip
    assert _run(root, "down") == ["basalt cluster down"]

    (root / "common/_records.c").write_text("int y;\n")  # a C source changed
    assert _installs(_run(root, "status")) == 1
    (root / "admin" / "new_module.py").write_text("")  # a module added: the links change
    assert _installs(_run(root, "status")) == 1
    (root / "setup.py").write_text("setup(name='basalt')\n")
    assert _installs(_run(root, "status")) == 1
    assert _installs(_run(root, "status")) == 0
    assert _installs(_run(root, "status", BASALT_REINSTALL="1")) == 1


def test_a_venv_without_basalt_installs(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    _run(root)
    (root / ".venv" / "bin" / "basalt").unlink()  # e.g. someone pip-uninstalled it
    # The fake python does not install it back, so the script's exec fails after pip ran.
    result = subprocess.run(
        ["bash", str(root / "scripts" / "run.sh"), "status"], capture_output=True, timeout=60
    )
    assert result.returncode != 0
    assert _installs((root / "calls.log").read_text().splitlines()) == 1
