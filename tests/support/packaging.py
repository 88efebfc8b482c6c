"""The distribution as the tests see it: setup.py's folder table, pyproject's
requirements, a wheel built from the working tree, and venvs that hold exactly
a chosen set of requirements - offline.

No package index is reached: :func:`build_wheel` uses this environment's
setuptools (``--no-build-isolation``), and :func:`offline_venv` makes a fresh
venv (no system site-packages, no pip of its own) into which each wanted
distribution already installed here is linked file by file, as its ``RECORD``
lists them. Linking files, not top-level folders, keeps namespace packages
apart: ``opentelemetry/`` holds the API and, here, the SDK too; a venv given
``opentelemetry-api`` sees the one and not the other.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Iterable
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

#: The repository's root.
REPO = Path(__file__).resolve().parents[2]

#: What a copy of the tree for a wheel build leaves out: environments, caches, build output.
NOT_SOURCE = (
    ".git",
    ".venv",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
    ".basalt",
    "*.so",
)

#: The longest a wheel build or an install may take (the C extension compiles at -O3).
BUILD_TIMEOUT_S = 600


def _setup_constant(name: str, root: Path) -> object:
    """The literal ``name`` is bound to in setup.py (read from its AST, not run:
    running setup.py would build)."""
    for node in ast.parse((root / "setup.py").read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    raise AssertionError(f"setup.py has no {name}")


def source_folders(root: Path = REPO) -> dict[str, str]:
    """setup.py's ``SOURCE_FOLDERS``: source folder -> sub-package of ``basalt``."""
    folders = _setup_constant("SOURCE_FOLDERS", root)
    assert isinstance(folders, dict)
    return folders


def package_root(root: Path = REPO) -> str:
    """setup.py's ``PACKAGE_ROOT``: the folder that is the package ``basalt`` itself."""
    folder = _setup_constant("PACKAGE_ROOT", root)
    assert isinstance(folder, str)
    return folder


def package_folders(root: Path = REPO) -> list[str]:
    """Every folder the package is built from: :func:`package_root` and the source folders."""
    return [package_root(root), *source_folders(root)]


def build_inputs(root: Path = REPO) -> list[str]:
    """Every path (relative to the root) a build of the wheel reads: pyproject.toml,
    setup.py, the readme pyproject names and :func:`package_folders`."""
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    readme = project["readme"]
    assert isinstance(readme, str)
    return ["pyproject.toml", "setup.py", readme, *package_folders(root)]


def requirements(extra: str | None = None) -> list[Requirement]:
    """pyproject's base requirements, or those of ``extra``."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    listed = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    return [Requirement(r) for r in listed]


def closure(wanted: Iterable[Requirement]) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions ``wanted`` needs, with what they need in turn (markers
    evaluated here, no extras of theirs), by canonical name. AssertionError for one that
    is not installed here."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = list(wanted)
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        if name in found:
            continue
        try:
            found[name] = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise AssertionError(f"{requirement} is not installed in this environment") from None
        todo += [Requirement(r) for r in found[name].requires or ()]
    return found


def build_wheel(out: Path, scratch: Path) -> Path:
    """A wheel of the working tree in ``out``, built from a copy under ``scratch`` (so the
    checkout gets no ``build/`` or ``*.egg-info`` of its own, and the C extension is
    compiled, not taken from the editable install); returns its path."""
    source = scratch / "src"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation"]
    done = subprocess.run(
        [*pip_wheel, "--no-index", "-q", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        cwd=scratch,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = out.glob("basalt-*.whl")
    return wheel


def _site_packages(venv: Path) -> Path:
    purelib = sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)})
    return Path(purelib)


def offline_venv(venv: Path, wheel: Path, wanted: Iterable[Requirement]) -> Path:
    """A fresh venv at ``venv`` holding ``wheel`` (installed by this environment's pip,
    ``--no-index --no-deps``, which writes its console script) and the distributions
    :func:`closure` finds for ``wanted``, each linked from this environment file by
    file; nothing else. Returns its interpreter."""
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        timeout=120,
    )
    python = venv / "bin" / "python"
    site = _site_packages(venv)
    assert site.is_dir(), site
    for dist in closure(wanted).values():
        for file in dist.files or ():
            if file.parts[0] == ".." or file.suffix == ".pyc":  # scripts; bytecode
                continue
            target = site / file
            target.parent.mkdir(parents=True, exist_ok=True)
            source = Path(str(dist.locate_file(file)))
            if source.exists() and not target.exists():
                os.symlink(source, target)
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "-q"]
    done = subprocess.run(
        [*pip, "--no-index", "--no-deps", "--no-compile", str(wheel)],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return python


# -- the image's build context -------------------------------------------------------------


def dockerignore(root: Path = REPO) -> list[re.Pattern[str]]:
    """The root's ``.dockerignore`` as regular expressions over a path relative to the
    root, as Docker reads it (moby's patternmatcher: a pattern is anchored at the root,
    ``*`` and ``?`` stay within a path segment, ``**`` spans any number of them).
    AssertionError for a form this reading does not cover: an ``!`` exception, a
    ``[...]`` class, an escape."""
    patterns = []
    for line in (root / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        assert not line.startswith("!") and not set("[]\\") & set(line), (
            f".dockerignore: {line!r} is a form tests/support/packaging.py cannot read"
        )
        pattern = os.path.normpath(line).lstrip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        patterns.append(re.compile(regex))
    return patterns


def left_out_of_context(path: str, patterns: list[re.Pattern[str]]) -> bool:
    """Whether Docker leaves ``path`` (relative to the root, ``/``-separated) out of
    the build context: a pattern matches it or one of the folders above it."""
    parts = path.strip("/").split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    return any(p.fullmatch(prefix) for p in patterns for prefix in prefixes)
