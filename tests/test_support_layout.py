"""What the tests share lives in :mod:`tests.support`: no test module imports another.

A helper defined in a test module and imported by others ties the two
together (running one collects the other's tests' imports, moving one breaks
the other) and hides the helper from whoever looks for it. Every module under
``tests/`` may import from ``tests.support``, and nothing else of ``tests``.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.imports import imported

TESTS = Path(__file__).resolve().parent
SUPPORT = "tests.support"


def module_name(path: Path) -> str:
    """``tests/store/test_x.py`` -> ``tests.store.test_x`` (a package is its ``__init__``)."""
    parts = path.relative_to(TESTS.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def allowed(name: str) -> bool:
    """Whether importing ``name`` keeps to the rule: outside ``tests``, or in tests.support."""
    return not (name == "tests" or name.startswith("tests.")) or (
        name == SUPPORT or name.startswith(SUPPORT + ".")
    )


def test_no_module_of_tests_imports_another_but_tests_support() -> None:
    offences = []
    for path in sorted(TESTS.rglob("*.py")):
        module = module_name(path)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for line, name in imported(tree, module, path.name == "__init__.py"):
            if not allowed(name):
                offences.append(f"{path.relative_to(TESTS.parent)}:{line} imports {name}")
    assert offences == [], "\n".join(offences)


def test_the_check_sees_absolute_relative_and_package_imports() -> None:
    source = (
        "import os, tests.store.test_flush\n"
        "from tests.support.polling import eventually\n"
        "from tests import support, conftest\n"
        "from . import test_y\n"
        "from ..services.test_meta import broker\n"
        "def f():\n"
        "    from tests.client import helpers\n"
    )
    names = [name for _, name in imported(ast.parse(source), "tests.store.test_x", False)]
    assert names == [
        "os",
        "tests.store.test_flush",
        "tests.support.polling.eventually",
        "tests.support",
        "tests.conftest",
        "tests.store.test_y",
        "tests.services.test_meta.broker",
        "tests.client.helpers",
    ]
    assert [n for n in names if not allowed(n)] == [
        "tests.store.test_flush",
        "tests.conftest",
        "tests.store.test_y",
        "tests.services.test_meta.broker",
        "tests.client.helpers",
    ]
