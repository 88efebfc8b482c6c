"""Who imports whom: import statements read from modules' ASTs, never by importing.

:func:`imported` lists the names one module's source imports (at the top, in a
function, in a class: every ``import`` and ``from … import`` statement
wherever it is, since a lazy import is a dependency too). :func:`import_graph`
builds, for a package tree on disk, each module's imports of the package's own
modules, resolved to modules (``from basalt.common import tls`` is
``basalt.common.tls``; ``from basalt.common.tls import TlsConfig`` is
``basalt.common.tls`` as well). :func:`find_cycle` finds a cycle in a graph.

Imports under ``if TYPE_CHECKING:`` are left out of the graph: they never
run (only a type checker reads them), so they cannot make an import circle,
and they are how a module names a type of a module above it in an annotation
without depending on it.
"""

from __future__ import annotations

import ast
import importlib.machinery
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _statements(node: ast.AST, *, type_checking: bool) -> Iterator[ast.AST]:
    """Every node under ``node``; without the bodies of ``if TYPE_CHECKING:``
    when ``type_checking`` is False (their ``else`` is kept: it runs)."""
    for child in ast.iter_child_nodes(node):
        if not type_checking and isinstance(child, ast.If) and _is_type_checking(child):
            for other in child.orelse:
                yield other
                yield from _statements(other, type_checking=type_checking)
            continue
        yield child
        yield from _statements(child, type_checking=type_checking)


def imported(
    tree: ast.Module, module: str, is_package: bool, *, type_checking: bool = True
) -> Iterator[tuple[int, str]]:
    """(line, absolute name) of every import in ``tree``, the source of ``module``
    (``is_package``: its ``__init__``); ``from a import b`` names ``a.b``, which
    is ``b`` itself when ``b`` is a module of the package ``a``, else a name
    defined in ``a``. ``type_checking=False`` leaves out what ``if
    TYPE_CHECKING:`` imports."""
    package = module if is_package else module.rpartition(".")[0]
    for node in _statements(tree, type_checking=type_checking):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: up from the importing module's package
                parent = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parent, base] if base else parent)
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}"


@dataclass(frozen=True, slots=True)
class Import:
    """One import of a module of the package: ``importer`` line ``line`` imports ``module``."""

    importer: str
    line: int
    module: str

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.module}"


#: The suffixes of a module's file: source, and a compiled extension (no source to read).
_EXTENSION_SUFFIXES = tuple(importlib.machinery.EXTENSION_SUFFIXES)


def package_modules(package_dir: Path) -> dict[str, Path | None]:
    """Every module of the package in ``package_dir`` (its sub-packages' too)
    by dotted name, with its source file; None for a compiled extension."""
    top = package_dir.parent
    modules: dict[str, Path | None] = {}
    for path in sorted(package_dir.rglob("*")):
        if path.suffix == ".py":
            parts = path.relative_to(top).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
        elif path.name.endswith(_EXTENSION_SUFFIXES):
            stem = next(path.name[: -len(s)] for s in _EXTENSION_SUFFIXES if path.name.endswith(s))
            parts = (*path.parent.relative_to(top).parts, stem)
            modules[".".join(parts)] = None
    return modules


def _resolve(name: str, modules: Mapping[str, object]) -> str | None:
    """The module ``name`` is, or is a name defined in: the longest known
    prefix; None when it is outside the package."""
    while name not in modules:
        if "." not in name:
            return None
        name = name.rpartition(".")[0]
    return name


def import_graph(package_dir: Path) -> dict[str, list[Import]]:
    """Each module of the package in ``package_dir`` -> its imports of the
    package's modules (lazy ones included; ``if TYPE_CHECKING:`` ones, and a
    module importing itself or the package it is in, left out)."""
    modules = package_modules(package_dir)
    graph: dict[str, list[Import]] = {}
    for name, path in modules.items():
        graph[name] = []
        if path is None:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        is_package = path.name == "__init__.py"
        for line, target in imported(tree, name, is_package, type_checking=False):
            module = _resolve(target, modules)
            if module is not None and module != name and not name.startswith(module + "."):
                graph[name].append(Import(name, line, module))
        graph[name] = list(dict.fromkeys(graph[name]))  # ``from m import a, b``: one
    return graph


def third_party(package_dir: Path, module: str, source: Path) -> set[str]:
    """The top-level names of what ``module`` (source ``source``) imports from
    outside the package in ``package_dir`` (``grpc``, ``google``, ``os``…),
    lazy imports included, ``if TYPE_CHECKING:`` ones left out."""
    own = package_dir.name
    tree = ast.parse(source.read_text(encoding="utf-8"), str(source))
    names = imported(tree, module, source.name == "__init__.py", type_checking=False)
    return {name.split(".")[0] for _, name in names} - {own, "__future__"}


def find_cycle(edges: Mapping[str, Iterable[str]]) -> list[str] | None:
    """A cycle of the directed graph ``edges`` as the nodes along it, the first
    repeated at the end (``[a, b, a]``); None when the graph has none."""
    done: set[str] = set()
    for start in sorted(edges):
        if start in done:
            continue
        path: list[str] = [start]
        on_path = {start}
        stack = [iter(sorted(edges.get(start, ())))]
        while stack:
            node = next(stack[-1], None)
            if node is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif node in on_path:
                return [*path[path.index(node) :], node]
            elif node not in done:
                path.append(node)
                on_path.add(node)
                stack.append(iter(sorted(edges.get(node, ()))))
    return None
