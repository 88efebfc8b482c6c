"""No import circles: between ``basalt``'s sub-packages, and between the modules
of ``basalt.common``, read from the installed package's ASTs.

Every import counts wherever it is written - a function-level (lazy) import
is still a dependency, and a module that imports its importer inside a
function to dodge a circle is the circle. Imports under ``if TYPE_CHECKING:``
do not count: they never run (tests/support/imports.py).

The sub-packages form layers (docs/architecture.md#the-package)::

    basalt.admin.cli      the console script: every area's commands, imported by nothing
    basalt.pipeline       Spark jobs; the lag report reuses admin's operations
    basalt.admin          mqadmin's operations, verbs and the Admin service
    basalt.services       the services; their metadata layer
    basalt.client         the SDK
    basalt.store          the engine
    basalt.common         what all of them share
    basalt.v1, basalt.rocketmq, basalt   the contracts, generated; the package root

The console script (``basalt.admin.cli``, run by ``python -m basalt.admin``)
gathers the commands of every area - the store tools, the quickstart, the
pipeline jobs, the services - so it sits above all of them. It names each
area's module as a string (its ``GROUPS``, imported when the command runs,
so a missing extra is reported, not a crash), which an AST does not show as
an import; a test holds that nothing imports the console script, so it
closes no circle whatever it loads.

What each layer may import from outside Basalt (the engine no grpc, the SDK
no engine) is tests/common/test_isolation.py's.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path

import basalt
from tests.support.imports import Import, find_cycle, import_graph

#: The installed package's folder: the strict editable install's tree of links
#: (or a wheel's), where every sub-package sits under ``basalt/`` as it imports.
INSTALLED = Path(basalt.__file__).parent
#: The console script and ``python -m basalt.admin``: the top of every layer.
ENTRY_POINTS = frozenset({"basalt.admin.cli", "basalt.admin.__main__"})


def layer_of(module: str) -> str:
    """The sub-package ``module`` is in (``basalt.store.commitlog`` ->
    ``basalt.store``), or ``basalt`` for the package root."""
    return ".".join(module.split(".")[:2])


def layer_edges(graph: dict[str, list[Import]]) -> dict[tuple[str, str], list[Import]]:
    """(importing layer, imported layer) -> the imports that make the edge."""
    edges: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for imports in graph.values():
        for i in imports:
            pair = (layer_of(i.importer), layer_of(i.module))
            if pair[0] != pair[1]:
                edges[pair].append(i)
    return edges


def describe(cycle: list[str], edges: dict[tuple[str, str], list[Import]]) -> str:
    """The cycle, each step with the imports that make it."""
    lines = [" -> ".join(cycle)]
    for a, b in itertools.pairwise(cycle):
        imports = edges.get((a, b), [])
        lines += [f"  {a} -> {b}:", *(f"    {i}" for i in imports[:5])]
        if len(imports) > 5:
            lines.append(f"    ... and {len(imports) - 5} more")
    return "\n".join(lines)


def test_the_installed_package_holds_every_sub_package() -> None:
    # A tree that left a folder out would pass the tests below by missing it.
    layers = {layer_of(m) for m in import_graph(INSTALLED)}
    assert {
        "basalt",
        "basalt.v1",
        "basalt.rocketmq",
        "basalt.common",
        "basalt.store",
        "basalt.services",
        "basalt.admin",
        "basalt.client",
        "basalt.pipeline",
    } <= layers


def test_no_import_cycle_between_the_sub_packages() -> None:
    edges = layer_edges(import_graph(INSTALLED))
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    cycle = find_cycle(graph)
    assert cycle is None, "sub-packages import each other:\n" + describe(cycle or [], edges)


def test_nothing_imports_the_console_script() -> None:
    graph = import_graph(INSTALLED)
    importers = [
        str(i)
        for imports in graph.values()
        for i in imports
        if i.module in ENTRY_POINTS and i.importer not in ENTRY_POINTS
    ]
    assert importers == []


def test_no_import_cycle_between_the_modules_of_basalt_common() -> None:
    graph = import_graph(INSTALLED)
    common = {
        m: {i.module for i in imports if i.module.startswith("basalt.common.")}
        for m, imports in graph.items()
        if m.startswith("basalt.common.")
    }
    cycle = find_cycle(common)
    edges: dict[tuple[str, str], list[Import]] = defaultdict(list)
    for m in common:
        for i in graph[m]:
            edges[(i.importer, i.module)].append(i)
    assert cycle is None, "modules of basalt.common import each other:\n" + describe(
        cycle or [], edges
    )


# -- the reading itself ---------------------------------------------------------------


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    return root / "pkg"


def test_lazy_and_relative_imports_count_type_checking_ones_do_not(tmp_path: Path) -> None:
    package = _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/a/__init__.py": "",
            "pkg/a/low.py": (
                "from __future__ import annotations\n"
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from pkg.b.high import High\n"
                "def f():\n"
                "    from ..b import lazy\n"
            ),
            "pkg/a/other.py": "import os\nfrom . import low\nfrom pkg.a.low import f\n",
            "pkg/b/__init__.py": "",
            "pkg/b/high.py": "from pkg.a import low\nclass High: ...\n",
            "pkg/b/lazy.py": "",
        },
    )
    graph = import_graph(package)
    assert {m: sorted(i.module for i in graph[m]) for m in graph if graph[m]} == {
        "pkg.a.low": ["pkg.b.lazy"],  # the lazy one; not the TYPE_CHECKING one
        "pkg.a.other": ["pkg.a.low", "pkg.a.low"],  # two statements, two lines
        "pkg.b.high": ["pkg.a.low"],
    }


def test_a_lazy_import_back_is_a_cycle(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/a/__init__.py": "",
        "pkg/a/low.py": "X = 1\n",
        "pkg/b/__init__.py": "",
        "pkg/b/high.py": "from pkg.a.low import X\n",
    }
    graph = import_graph(_write(tmp_path, files))
    assert find_cycle({m: {i.module for i in imports} for m, imports in graph.items()}) is None
    files["pkg/a/low.py"] = "X = 1\ndef f():\n    from pkg.b import high\n"
    graph = import_graph(_write(tmp_path, files))
    modules = {m: {i.module for i in imports} for m, imports in graph.items()}
    assert find_cycle(modules) == ["pkg.a.low", "pkg.b.high", "pkg.a.low"]


def test_find_cycle() -> None:
    assert find_cycle({}) is None
    assert find_cycle({"a": ["b"], "b": ["c"], "c": []}) is None
    assert find_cycle({"a": ["b", "c"], "b": ["c"], "c": []}) is None  # a diamond is no cycle
    assert find_cycle({"a": ["a"]}) == ["a", "a"]
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["b"]}) == ["b", "c", "b"]
