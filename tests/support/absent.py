"""Python processes in which some modules cannot be imported, as on an install
without an extra (``pip install basalt``: no ``server``, no ``spark``).

The child installs a meta path finder first thing, before Basalt or anything
else is imported: the real import machinery, with the named modules (and
their submodules) raising ModuleNotFoundError as a missing package does. A
dotted name blocks that part of a namespace package only
(``opentelemetry.sdk``, while the OpenTelemetry API imports).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from basalt.admin.extras import EXTRAS
from tests.support.timeouts import SUBPROCESS_TIMEOUT_S

#: The modules of each extra (basalt.admin.extras: the table the CLI reports from).
SERVER = EXTRAS["server"]
SPARK = EXTRAS["spark"]

_FINDER = """
import sys

class _NotInstalled:
    \"\"\"Finds the blocked modules, to say they are not there.\"\"\"

    def __init__(self, names):
        self.names = tuple(names)

    def blocked(self, name):
        return any(name == n or name.startswith(n + ".") for n in self.names)

    def find_spec(self, name, path=None, target=None):
        if self.blocked(name):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

_finder = _NotInstalled(BLOCKED)
_early = [m for m in sys.modules if _finder.blocked(m)]
assert not _early, f"imported before the finder: {_early}"
sys.meta_path.insert(0, _finder)
del _early
"""


def without(blocked: Iterable[str], code: str) -> str:
    """``code`` preceded by the finder that makes ``blocked`` unimportable."""
    return _FINDER.replace("BLOCKED", repr(tuple(blocked))) + code


def run_python_without(
    blocked: Iterable[str],
    code: str,
    *argv: str,
    cwd: Path,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -c CODE ARGV...`` in ``cwd`` with ``blocked`` unimportable
    (``env`` over this process's environment); the completed process."""
    return subprocess.run(
        [sys.executable, "-c", without(blocked, code), *argv],
        cwd=cwd,
        env=None if env is None else {**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )


#: ``basalt ARGV...`` as the console script runs it (argv from sys.argv).
_BASALT = "from basalt.admin.cli import main\nraise SystemExit(main())\n"


def run_basalt_without(
    blocked: Iterable[str], *argv: str, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``basalt ARGV...`` with ``blocked`` unimportable, in ``cwd``."""
    return run_python_without(blocked, _BASALT, *argv, cwd=cwd, env=env)
