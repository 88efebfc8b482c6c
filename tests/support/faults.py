"""One fault injector: os-level file operations fail with a chosen errno, by path.

:class:`FaultInjector` replaces ``os.open``, ``os.ftruncate``,
``os.posix_fallocate``, ``os.pwrite``, ``os.write``, ``os.fsync``,
``os.fdatasync``, ``os.rename``, ``os.replace``, ``os.link`` and the builtin
``open`` (``io.open``, which ``pathlib`` uses) with wrappers that raise
``OSError(errno)`` when a rule matches the operation and the file's path, and
otherwise call through. Rules name the operation and a predicate on the path
(:func:`under` for "any file in this directory"), so a test states *what*
fails, not *how* the code under test reaches it: the same rule hits a
ConsumeQueue written through ``pwrite`` or flushed by ``fdatasync``.

Operations on a descriptor find its path in ``/proc/self/fd`` (Linux): that
covers descriptors from ``os.open``, from the builtin ``open`` and the
duplicates ``mmap`` keeps, with no table of descriptors to keep in step.
Installed through pytest's ``monkeypatch``, so everything is undone at the
end of the test; :meth:`FaultInjector.clear` drops the rules mid-test (before
a restart that must succeed).
"""

from __future__ import annotations

import builtins
import io
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: The operations a rule may name.
OPERATIONS = (
    "open",
    "ftruncate",
    "posix_fallocate",
    "pwrite",
    "write",
    "fsync",
    "fdatasync",
    "rename",
    "replace",
    "link",
)
#: Operations whose first argument is a file descriptor (the rest take paths).
_BY_FD = frozenset({"ftruncate", "posix_fallocate", "pwrite", "write", "fsync", "fdatasync"})

PathMatch = Callable[[Path], bool]


def under(directory: Path, *, name: Callable[[str], bool] | None = None) -> PathMatch:
    """A predicate: paths inside ``directory`` (at any depth) whose file name passes
    ``name`` (default: any)."""
    root = directory.resolve()

    def match(path: Path) -> bool:
        return path.is_relative_to(root) and (name is None or name(path.name))

    return match


@dataclass(slots=True)
class Rule:
    """``operation`` on a path ``match`` accepts raises ``OSError(errno_)``; ``times``
    limits how often (None: until cleared). ``hits`` lists the paths it failed."""

    operation: str
    errno_: int
    match: PathMatch
    times: int | None = None
    hits: list[Path] = field(default_factory=list)

    def fires(self, operation: str, path: Path) -> bool:
        if operation != self.operation or not self.match(path):
            return False
        if self.times is not None and len(self.hits) >= self.times:
            return False
        self.hits.append(path)
        return True


class FaultInjector:
    """Installed for one test; see the module docstring."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rules: list[Rule] = []
        self._real: dict[str, Callable[..., Any]] = {}
        for operation in OPERATIONS:
            if operation == "open":
                continue
            real = getattr(os, operation)
            self._real[operation] = real
            monkeypatch.setattr(os, operation, self._wrap(operation, real))
        self._real["open"] = os.open
        monkeypatch.setattr(os, "open", self._wrap("open", os.open))
        real_open = builtins.open
        wrapped = self._wrap_builtin_open(real_open)
        monkeypatch.setattr(builtins, "open", wrapped)
        monkeypatch.setattr(io, "open", wrapped)

    def fail(
        self, operation: str, errno_: int, match: PathMatch, *, times: int | None = None
    ) -> Rule:
        """Make ``operation`` fail with ``errno_`` on paths ``match`` accepts; returns the
        rule (its ``hits`` show what failed)."""
        if operation not in OPERATIONS:
            raise ValueError(f"{operation!r} is not one of {OPERATIONS}")
        rule = Rule(operation, errno_, match, times)
        self.rules.append(rule)
        return rule

    def clear(self) -> None:
        """Drop every rule: from now on every operation goes through."""
        self.rules.clear()

    # -- the wrappers -----------------------------------------------------------------

    def _check(self, operation: str, target: object) -> None:
        if not self.rules:
            return
        path = self._path_of(operation, target)
        if path is None:
            return
        for rule in self.rules:
            if rule.fires(operation, path):
                raise OSError(rule.errno_, f"{os.strerror(rule.errno_)} (injected)", str(path))

    def _path_of(self, operation: str, target: object) -> Path | None:
        if operation in _BY_FD:
            if not isinstance(target, int):
                return None
            try:
                return Path(os.readlink(f"/proc/self/fd/{target}"))
            except OSError:
                return None
        if isinstance(target, str | bytes | os.PathLike):
            return Path(os.fsdecode(target)).resolve()
        return None  # a descriptor passed to the builtin open

    def _wrap(self, operation: str, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(target: Any, *args: Any, **kwargs: Any) -> Any:
            self._check(operation, target)
            if operation in ("rename", "replace", "link") and args:
                self._check(operation, args[0])  # the destination counts too
            return real(target, *args, **kwargs)

        return wrapper

    def _wrap_builtin_open(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(file: Any, *args: Any, **kwargs: Any) -> Any:
            self._check("open", file)
            return real(file, *args, **kwargs)

        return wrapper
