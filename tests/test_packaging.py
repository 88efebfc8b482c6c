"""The wheel: one top-level package, ``basalt``, holding every package of the tree.

The wheel is built from a copy of the working tree (so the checkout gets no
``build/`` or ``*.egg-info`` of its own, and the C extension is compiled, not
taken from an editable install), offline: ``--no-build-isolation`` uses the
setuptools of this environment (the ``dev`` extra's), not a downloaded one.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: What a copy of the tree leaves out: environments, caches, build output.
NOT_SOURCE = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache")
NOT_SOURCE += (".hypothesis", ".basalt", "*.so")


def _source_folders() -> dict[str, str]:
    """setup.py's table of source folder -> sub-package of ``basalt`` (read, not run:
    running setup.py would build)."""
    tree = ast.parse((REPO / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "SOURCE_FOLDERS" for t in node.targets
        ):
            folders = ast.literal_eval(node.value)
            assert isinstance(folders, dict)
            return folders
    raise AssertionError("setup.py has no SOURCE_FOLDERS table")


def _build_wheel(tmp_path: Path) -> zipfile.ZipFile:
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    out = tmp_path / "wheel"
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*pip_wheel, "--no-index", "-q", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
        timeout=240,
    )
    (wheel,) = out.glob("basalt-*.whl")
    return zipfile.ZipFile(wheel)


def test_the_wheel_installs_one_package_with_every_package_of_the_tree(
    tmp_path: Path,
) -> None:
    with _build_wheel(tmp_path) as wheel:
        names = set(wheel.namelist())

    assert {n.split("/", 1)[0] for n in names} == {"basalt", "basalt-0.1.0.dist-info"}
    for path in (
        "basalt/__init__.py",
        "basalt/py.typed",
        "basalt/store/__init__.py",
        "basalt/client/__init__.py",
        "basalt/services/meta/__init__.py",
        "basalt/common/__init__.py",
        "basalt/v1/common_pb2.py",
        # The typed stubs: the C extension's and the generated modules'.
        "basalt/common/_records.pyi",
        "basalt/v1/common_pb2.pyi",
        "basalt/v1/store_node_pb2_grpc.pyi",
    ):
        assert path in names, path
    assert [n for n in names if n.startswith("basalt/common/_records.") and n.endswith(".so")]

    # Every package of the source tree, found by its __init__.py, is in the wheel.
    folders = {folder: f"basalt/{name}" for folder, name in _source_folders().items()}
    assert {"store", "services", "admin", "client"} <= set(folders)
    folders["proto/basalt"] = "basalt"
    for folder, package in folders.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.relative_to(REPO / folder).as_posix()
            assert f"{package}/{relative}" in names, f"{folder}/{relative} is not in the wheel"
