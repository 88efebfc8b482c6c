"""scripts/run.sh: installs on a fresh checkout or after a change, not on every run.

The script runs in a copy of the tree's shape under tmp_path - the real
setup.py (so its PACKAGE_ROOT and SOURCE_FOLDERS, the one list of source
folders), pyproject.toml and .gitignore, a module in each folder - with a fake
``.venv`` whose ``python`` and ``basalt`` only log their arguments, so what it
would install and run is seen without pip or a cluster. Each test runs twice:
in a git checkout (the script hashes ``git ls-files``) and in a plain copy
(it walks the folders).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from tests.support.packaging import REPO, package_folders

SCRIPT = REPO / "scripts" / "run.sh"

FAKE = """#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$(dirname "$0")/../../calls.log"
"""

#: The one install command the script runs: the editable install with the server extra.
INSTALL = "python -m pip install -qq -e .[server] --config-settings editable_mode=strict"


def _git(root: Path, *argv: str) -> None:
    subprocess.run(["git", *argv], cwd=root, check=True, capture_output=True, timeout=60)


def _tree(root: Path, kind: str) -> Path:
    (root / "scripts").mkdir()
    shutil.copy(SCRIPT, root / "scripts" / "run.sh")
    for name in ("pyproject.toml", "setup.py", ".gitignore"):
        shutil.copy(REPO / name, root / name)
    for folder in package_folders():
        (root / folder).mkdir(parents=True)
        (root / folder / "__init__.py").write_text("")
    (root / "common" / "_records.c").write_text("int x;\n")
    (root / "docs").mkdir()
    (root / ".venv" / "bin").mkdir(parents=True)
    for name in ("python", "basalt"):
        fake = root / ".venv" / "bin" / name
        fake.write_text(FAKE)
        fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    if kind == "git":
        _git(root, "init", "-q")
        _git(root, "add", "-A")
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


@pytest.fixture(params=["git", "plain"])
def tree(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    return _tree(tmp_path, request.param)


def test_it_installs_the_server_extra_once_then_only_after_a_change(tree: Path) -> None:
    first = _run(tree)
    assert _installs(first) == 1 and first[-1] == "basalt cluster up"
    assert INSTALL in first
    assert _run(tree, "status") == ["basalt cluster status"]  # nothing changed: no pip
    assert _run(tree, "down") == ["basalt cluster down"]

    (tree / "common" / "_records.c").write_text("int y;\n")  # a C source changed
    assert _installs(_run(tree, "status")) == 1
    (tree / "setup.py").write_text((tree / "setup.py").read_text() + "# changed\n")
    assert _installs(_run(tree, "status")) == 1
    assert _installs(_run(tree, "status")) == 0
    assert _installs(_run(tree, "status", BASALT_REINSTALL="1")) == 1


def test_a_module_added_to_any_source_folder_reinstalls(tree: Path) -> None:
    """A new module under each folder setup.py maps (pipeline/ and common/ among them)
    changes the tree of links the strict editable install is."""
    _run(tree)
    assert {"pipeline", "common"} <= set(package_folders())
    for folder in package_folders():
        (tree / folder / "sub").mkdir()
        (tree / folder / "sub" / "new_module.py").write_text("")
        assert _installs(_run(tree, "status")) == 1, folder
    (tree / "store" / "sub" / "new_module.py").unlink()  # a module removed
    assert _installs(_run(tree, "status")) == 1


def test_what_the_package_is_not_built_from_does_not_reinstall(tree: Path) -> None:
    _run(tree)
    (tree / "docs" / "notes.md").write_text("")  # not a source folder
    (tree / "README.md").write_text("")
    (tree / "admin" / "__pycache__").mkdir()  # bytecode and a built extension
    (tree / "admin" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"")
    (tree / "common" / "_records.cpython-311-x86_64-linux-gnu.so").write_bytes(b"")
    assert _installs(_run(tree, "status")) == 0


def test_a_venv_without_basalt_installs(tmp_path: Path) -> None:
    root = _tree(tmp_path, "plain")
    _run(root)
    (root / ".venv" / "bin" / "basalt").unlink()  # e.g. someone pip-uninstalled it
    # The fake python does not install it back, so the script's exec fails after pip ran.
    result = subprocess.run(
        ["bash", str(root / "scripts" / "run.sh"), "status"], capture_output=True, timeout=60
    )
    assert result.returncode != 0
    assert _installs((root / "calls.log").read_text().splitlines()) == 1
