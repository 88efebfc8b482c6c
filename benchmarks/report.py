"""What the benchmark scripts share to print and load: one aligned-table
formatter, and the by-path import of a ``tests/support`` module whose loop a
benchmark runs (benchmarks do not depend on the tests package)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType


def aligned(cells: Sequence[Sequence[str]], numeric: set[int]) -> str:
    """``cells`` (a header row, then the rows) as columns two spaces apart, a
    dashed line under the header; the columns in ``numeric`` right-aligned."""
    header = cells[0]
    widths = [max(len(c[i]) for c in cells) for i in range(len(header))]
    lines = []
    for n, c in enumerate(cells):
        lines.append(
            "  ".join(
                c[i].rjust(widths[i]) if i in numeric and n else c[i].ljust(widths[i])
                for i in range(len(header))
            ).rstrip()
        )
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def load_by_path(name: str, path: Path) -> ModuleType:
    """Import the module at ``path`` as ``name``."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
