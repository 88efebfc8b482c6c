"""store.errors: one base for every exception class the engine defines."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest

import basalt.store
from basalt.store.errors import StoreError


def _exception_classes() -> list[type[BaseException]]:
    """Every exception class defined (not imported) by a module of basalt.store."""
    found: list[type[BaseException]] = []
    for info in pkgutil.iter_modules(basalt.store.__path__, "basalt.store."):
        module = importlib.import_module(info.name)
        found += [
            c
            for _, c in inspect.getmembers(module, inspect.isclass)
            if issubclass(c, BaseException) and c.__module__ == module.__name__
        ]
    return found


def test_the_engine_defines_exception_classes() -> None:
    names = {c.__name__ for c in _exception_classes()}
    # The walk finds them where they live, not only in store/errors.py.
    assert {"StoreClosedError", "Sql92ParseError", "InvalidOffsetRequestError"} <= names
    assert {"SemanticError", "StoreRootError", "UnknownFilterTypeError"} <= names


@pytest.mark.parametrize("cls", _exception_classes(), ids=lambda c: c.__qualname__)
def test_every_exception_class_of_the_engine_is_a_store_error(cls: type[BaseException]) -> None:
    assert issubclass(cls, StoreError)
